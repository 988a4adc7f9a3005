# -*- test-case-name: iop.test.node.test_session_termination -*-
"""
``TERMINATE_SESSION`` (:mod:`iop.node.session_termination`): on its own, and as it arrives — a
``CancelRequest`` to the session's run manager, answered with one ``CancelResponse``.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.session_termination import TERMINATE_SESSION_TIMEOUT, SessionTermination
from iop.node.store import RunStatus
from iop.runtime import RuntimeEvent
from iop.test.node.test_runs import (
    RunManagerTestCase,
    ScriptedProvider,
    SessionProvider,
    registry_of,
)
from iop.wire import runtime_pb2 as pb


class SessionTerminationTests(SynchronousTestCase):
    """The requests refused before any adapter is asked."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.agent = SessionProvider("agent", "cli", max_concurrency=1)
        registry = registry_of(ScriptedProvider("gpu", "vllm"), self.agent, disabled=["gpu"])
        self.sessions = SessionTermination(registry, self.clock, "n1")

    def terminate(self, **kwargs: str) -> pb.CancelResponse:
        request = pb.CancelRequest(kind=pb.TERMINATE_SESSION, **kwargs)  # type: ignore[arg-type]
        return self.successResultOf(self.sessions.terminate(request))

    def test_withoutSessionId(self) -> None:
        response = self.terminate(adapter="agent", target="repo")
        self.assertEqual((response.ok, response.reason), (False, "terminate without a session_id"))
        self.assertEqual(self.agent.terminated, [])

    def test_disabledAdapter(self) -> None:
        response = self.terminate(adapter="gpu", session_id="s1")
        self.assertEqual((response.ok, response.reason), (False, "adapter 'gpu' is disabled"))

    def test_answersTheRequest(self) -> None:
        self.agent.sessions[("repo", "s1")] = True
        response = self.terminate(adapter="agent", target="repo", session_id="s1")
        self.assertEqual(
            (response.kind, response.run_id, response.session_id, response.ok),
            (pb.TERMINATE_SESSION, "", "s1", True),
        )

    def test_boundedByTheTimeout(self) -> None:
        self.agent.terminate_result = lambda: Deferred()
        d = self.sessions.terminate(
            pb.CancelRequest(kind=pb.TERMINATE_SESSION, adapter="agent", session_id="s1")
        )
        self.clock.advance(TERMINATE_SESSION_TIMEOUT - 1)
        self.assertNoResult(d)
        self.clock.advance(1)
        self.assertEqual(self.successResultOf(d).ok, False)


class TerminateSessionTests(RunManagerTestCase):
    def test_withTerminator(self) -> None:
        self.agent.sessions[("repo", "s1")] = True
        response = self.cancel(
            kind=pb.TERMINATE_SESSION, adapter="agent", target="repo", session_id="s1"
        )
        self.assertEqual(
            (response.kind, response.session_id, response.ok, response.reason),
            (pb.TERMINATE_SESSION, "s1", True, ""),
        )
        self.assertEqual(self.agent.terminated, [("repo", "s1")])

    def test_unknownSession(self) -> None:
        response = self.cancel(
            kind=pb.TERMINATE_SESSION, adapter="agent", target="repo", session_id="nope"
        )
        self.assertFalse(response.ok)
        self.assertEqual(response.reason, "adapter 'agent' has no session 'nope'")

    def test_withoutTerminator(self) -> None:
        response = self.cancel(kind=pb.TERMINATE_SESSION, adapter="gpu", session_id="s1")
        self.assertFalse(response.ok)
        self.assertEqual(response.reason, "adapter 'gpu' does not support sessions")

    def test_unknownAdapter(self) -> None:
        response = self.cancel(kind=pb.TERMINATE_SESSION, adapter="x", session_id="s1")
        self.assertEqual((response.ok, response.reason), (False, "unknown adapter 'x'"))

    def test_terminatorFails(self) -> None:
        self.agent.terminate_result = lambda: fail(OSError("kill failed"))
        response = self.cancel(kind=pb.TERMINATE_SESSION, adapter="agent", session_id="s1")
        self.assertFalse(response.ok)
        self.assertEqual(response.reason, "terminating the session failed: kill failed")

    def test_terminatorHangs(self) -> None:
        self.agent.terminate_result = lambda: Deferred()
        d = self.manager.cancel(
            pb.CancelRequest(kind=pb.TERMINATE_SESSION, adapter="agent", session_id="s1")
        )
        self.assertNoResult(d)
        self.clock.advance(30)
        self.assertFalse(self.successResultOf(d).ok)

    def test_sessionRunEndsWithAdapterCancelled(self) -> None:
        """A terminator that ends the session's run makes the adapter emit its terminal."""
        self.agent.sessions[("repo", "s1")] = True
        self.submit(adapter="agent", target="repo", session_id="s1")
        execution = self.agent.last

        def terminate() -> Deferred[bool]:
            execution.emit(RuntimeEvent.cancelled("session terminated"))
            return succeed(True)

        self.agent.terminate_result = terminate
        self.assertTrue(
            self.cancel(
                kind=pb.TERMINATE_SESSION, adapter="agent", target="repo", session_id="s1"
            ).ok
        )
        events = self.events("r1")
        self.assertEqual(self.shape(events), [(1, "start"), (2, "cancelled")])
        self.assertEqual(self.record("r1").status, RunStatus.CANCELLED)
        self.assertGateFree("agent")
