# -*- test-case-name: iop.test.node.test_refresh -*-
"""
The node's answer to a config refresh push (L{iop.node.refresh}): applied live (runtime
concurrency metadata, config revision), restart required (adapter set, adapter settings, alias,
agent kind) or failed, atomic, with no secret in the reason or the logs; and the session set-up
installs the handler.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.node import refresh as node_refresh
from iop.node.adapters.registry import AdapterRegistry
from iop.node.handlers import make_session_setup
from iop.node.refresh import ConfigRefreshHandler, decide
from iop.node.session import NodeSession
from iop.node.store import RunStore, SynchronousExecutor
from iop.test.node.fakes import NODE_ID, adapter, capture_events, payload
from iop.wire import runtime_pb2 as pb


def with_runtime(base: pb.NodeConfigPayload, **changes: object) -> pb.NodeConfigPayload:
    copy = pb.NodeConfigPayload()
    copy.CopyFrom(base)
    for name, value in changes.items():
        if name in ("concurrency", "agent_kind"):
            setattr(copy.runtime, name, value)
        else:
            setattr(copy, name, value)
    return copy


def profiled(name: str, profile: str) -> pb.AdapterConfig:
    message = adapter(name, "openai_compat")
    if profile:
        message.profile.CopyFrom(pb.RuntimeProfile(name=profile, driver="openai"))
    return message


class DecideTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.current = payload(adapter("gpu", "vllm"), adapter("cpu", "ollama"))
        self.current.runtime.concurrency = 1

    def test_concurrencyAndRevisionApplyLive(self) -> None:
        candidate = with_runtime(self.current, concurrency=4, config_revision=8)
        outcome, reason, applied = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_APPLIED)
        self.assertEqual(reason, "concurrency 1 → 4, config revision 7 → 8")
        assert applied is not None
        self.assertEqual((applied.runtime.concurrency, applied.config_revision), (4, 8))

    def test_noChange(self) -> None:
        outcome, reason, applied = decide(self.current, self.current, NODE_ID)
        self.assertEqual((outcome, reason), (pb.REFRESH_APPLIED, "no change"))
        self.assertEqual(applied, self.current)

    def test_adapterSettingChangedRestart(self) -> None:
        candidate = with_runtime(self.current, concurrency=4)
        candidate.adapters[1].headers["Authorization"] = "Bearer rotated-secret"
        outcome, reason, applied = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertEqual(reason, "restart the node to apply: adapter settings changed ('cpu')")
        self.assertIsNone(applied)
        self.assertNotIn("secret", reason)

    def test_adapterSetChangedRestart(self) -> None:
        added = with_runtime(self.current)
        added.adapters.append(adapter("extra", "vllm"))
        outcome, reason, _ = decide(self.current, added, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertIn("adapter set changed (added 'extra')", reason)

        removed = payload(adapter("gpu", "vllm"))
        outcome, reason, _ = decide(self.current, removed, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertIn("adapter set changed (removed 'cpu')", reason)

        reordered = payload(adapter("cpu", "ollama"), adapter("gpu", "vllm"))
        outcome, reason, _ = decide(self.current, reordered, NODE_ID)
        self.assertIn("adapter set changed (reordered)", reason)

    def test_aliasAndAgentKindRestart(self) -> None:
        candidate = with_runtime(self.current, alias="other", agent_kind="claude")
        outcome, reason, _ = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertEqual(reason, "restart the node to apply: alias changed; agent kind changed")

    def test_otherNodeFails(self) -> None:
        candidate = with_runtime(self.current, node_id="node-2")
        outcome, reason, applied = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_FAILED)
        self.assertIn("'node-2'", reason)
        self.assertIsNone(applied)

    def test_emptiedProfileKept(self) -> None:
        """The last enabled provider of an adapter disabled: its profile stays, no restart."""
        current = payload(profiled("api", "openai"))
        candidate = payload(profiled("api", ""))
        outcome, _, applied = decide(current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_APPLIED)
        assert applied is not None
        self.assertEqual(applied.adapters[0].profile.name, "openai")
        # Re-enabled: the same profile again is no change either.
        outcome, reason, _ = decide(applied, current, NODE_ID)
        self.assertEqual((outcome, reason), (pb.REFRESH_APPLIED, "no change"))

    def test_otherProfileRestart(self) -> None:
        current = payload(profiled("api", "openai"))
        candidate = payload(profiled("api", "anthropic"))
        outcome, reason, _ = decide(current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertIn("adapter settings changed ('api')", reason)


class HandlerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[pb.Envelope] = []
        config = payload(adapter("gpu", "vllm"))
        self.session = NodeSession(NODE_ID, config, AdapterRegistry(), self.sent.append, self.clock)
        self.events = capture_events(self)

    def push(
        self, config: pb.NodeConfigPayload, request_id: str = "f1"
    ) -> pb.NodeConfigRefreshResponse:
        ConfigRefreshHandler(self.session).request_received(
            pb.Envelope(
                node_config_refresh_request=pb.NodeConfigRefreshRequest(
                    request_id=request_id, config=config
                )
            )
        )
        envelope = self.sent.pop()
        return envelope.node_config_refresh_response

    def test_appliedReplacesSessionConfig(self) -> None:
        candidate = with_runtime(self.session.config, concurrency=3, config_revision=9)
        response = self.push(candidate)
        self.assertEqual((response.request_id, response.outcome), ("f1", pb.REFRESH_APPLIED))
        self.assertEqual(self.session.config.runtime.concurrency, 3)
        self.assertEqual(self.session.describe()["config_revision"], 9)

    def test_restartRequiredChangesNothing(self) -> None:
        before = pb.NodeConfigPayload()
        before.CopyFrom(self.session.config)
        candidate = with_runtime(self.session.config, concurrency=3)
        candidate.adapters[0].base_url = "http://10.0.0.9:8000/v1"
        response = self.push(candidate)
        self.assertEqual(response.outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertEqual(self.session.config, before)

    def test_failureAnswersFailed(self) -> None:
        def boom(*args: object) -> None:
            raise RuntimeError("boom")

        self.patch(node_refresh, "decide", boom)
        response = self.push(self.session.config)
        self.assertEqual(response.outcome, pb.REFRESH_FAILED)
        self.assertIn("RuntimeError", response.reason)
        self.flushLoggedErrors(RuntimeError)

    def test_noSecretLogged(self) -> None:
        candidate = with_runtime(self.session.config)
        candidate.adapters[0].headers["Authorization"] = "Bearer rotated-secret"
        self.push(candidate)
        text = " ".join(formatEvent(e) + repr(e) for e in self.events)
        self.assertIn("RESTART_REQUIRED", text)
        self.assertNotIn("secret", text)


class SetupTests(SynchronousTestCase):
    def test_setupInstallsRefreshHandler(self) -> None:
        clock = Clock()
        sent: list[pb.Envelope] = []
        session = NodeSession(NODE_ID, payload(), AdapterRegistry(), sent.append, clock)
        store = RunStore(":memory:", clock, SynchronousExecutor())
        make_session_setup(store, clock)(session)
        candidate = with_runtime(session.config, concurrency=2)
        session.envelope_received(
            pb.Envelope(
                node_config_refresh_request=pb.NodeConfigRefreshRequest(
                    request_id="f2", config=candidate
                )
            )
        )
        [envelope] = sent
        response = envelope.node_config_refresh_response
        self.assertEqual((response.request_id, response.outcome), ("f2", pb.REFRESH_APPLIED))
        self.assertEqual(session.config.runtime.concurrency, 2)
