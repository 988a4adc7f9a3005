"""
Tests for :mod:`iop.node.drain`: a stopping node's drain on a :class:`~twisted.internet.task.Clock`
— new work refused once the Edge knows (at once when it cannot be told), work in flight let
finish, the end at the last of it or at the bound — and the supervisors waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters.capacity import Slot
from iop.node.admission import Admission, Nouns, Refusal
from iop.node.drain import DRAINING_REASON, NodeDrain
from iop.node.edges import EdgeSupervisors, SupervisedEdge
from iop.node.session import NodeSession
from iop.node.supervisor import NodeSupervisor
from iop.runtime.codes import ErrorCode
from iop.test.node.test_runs import ScriptedProvider, registry_of
from iop.wire import runtime_pb2 as pb

NOUNS = Nouns(work="job", request="job request", active="job")


@dataclass(eq=False)
class Job:
    run_id: str
    adapter: str
    slot: Slot


class Edge:
    """One Edge's session as the node holds it: what it sent, its admission."""

    def __init__(self, drain: NodeDrain, clock: Clock, supported: bool = True) -> None:
        self.sent: list[pb.Envelope] = []
        self.refused: list[tuple[str, Refusal]] = []
        registry = registry_of(ScriptedProvider("gpu", max_concurrency=8))
        self.session = NodeSession(
            "node-1",
            pb.NodeConfigPayload(node_id="node-1"),
            registry,
            self.sent.append,
            clock,
            draining_supported=supported,
        )
        self.gate = drain.gate(self.session)
        self.admission: Admission[Job] = Admission(
            registry, self.session.send, NOUNS, "node-1", self.gate
        )

    def submit(self, run_id: str) -> Job | None:
        admitted = self.admission.admit(
            pb.RunRequest(run_id=run_id, adapter="gpu", target="t"),
            lambda request, instance: None,
            lambda request, refusal: self.refused.append((request.run_id, refusal)),
        )
        if admitted is None:
            return None
        job = Job(run_id, "gpu", admitted.slot)
        self.admission.enter(job)
        return job

    def finish(self, job: Job) -> None:
        job.slot.release()
        self.admission.leave(job)

    def acknowledge(self) -> None:
        self.session.envelope_received(pb.Envelope(node_draining=pb.NodeDraining()))

    def drainings(self) -> list[pb.NodeDraining]:
        return [e.node_draining for e in self.sent if e.WhichOneof("message") == "node_draining"]


class NodeDrainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.drain = NodeDrain(self.clock, 30, wall=lambda: 5000.0)
        self.edge = Edge(self.drain, self.clock)
        self.edge.session.install("node_draining", self.edge.gate.edge_acknowledged)

    def test_serving_admits(self) -> None:
        self.assertIsNotNone(self.edge.submit("r1"))
        self.assertEqual(self.drain.in_flight, 1)
        self.assertFalse(self.drain.draining)

    def test_announces_then_refuses_after_the_edges_answer(self) -> None:
        """The Edge is told with the deadline; what it placed before its answer is admitted
        (it drains with the rest), what arrives after is refused with node_draining."""
        running = self.edge.submit("r1")
        assert running is not None
        ended = self.drain.begin()
        self.assertEqual(
            [d.deadline_unix_ms for d in self.edge.drainings()], [((5000 + 30) * 1000)]
        )
        self.assertTrue(self.drain.draining)
        self.assertEqual(self.drain.since, 1000)
        # Dispatched by the Edge before it heard: admitted.
        early = self.edge.submit("r2")
        self.assertIsNotNone(early)
        self.edge.acknowledge()
        self.assertIsNone(self.edge.submit("r3"))
        [(run_id, refusal)] = self.edge.refused
        self.assertEqual(run_id, "r3")
        self.assertEqual(refusal.code, ErrorCode.NODE_DRAINING)
        self.assertEqual(refusal.reason, DRAINING_REASON)
        self.assertEqual(refusal.metadata, {"error_code": "node_draining"})
        # The drain ends with the last work in flight, not before.
        self.edge.finish(running)
        self.assertNoResult(ended)
        assert early is not None
        self.edge.finish(early)
        # On the next turn: after the last work's own last message.
        self.assertNoResult(ended)
        self.clock.advance(0)
        self.successResultOf(ended)
        self.assertEqual(self.drain.in_flight, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_nothing_in_flight_ends_at_once(self) -> None:
        self.successResultOf(self.drain.begin())
        self.assertTrue(self.drain.drained)

    def test_work_entering_in_the_same_turn_keeps_it_draining(self) -> None:
        running = self.edge.submit("r1")
        assert running is not None
        ended = self.drain.begin()
        self.edge.finish(running)
        late = self.edge.submit("r2")  # before the Edge's answer: admitted
        self.clock.advance(0)
        self.assertNoResult(ended)
        assert late is not None
        self.edge.finish(late)
        self.clock.advance(0)
        self.successResultOf(ended)

    def test_bound_cuts(self) -> None:
        """At the bound the drain ends whatever still runs (the sessions then close)."""
        running = self.edge.submit("r1")
        assert running is not None
        ended = self.drain.begin()
        self.clock.advance(29.9)
        self.assertNoResult(ended)
        self.clock.advance(0.1)
        self.successResultOf(ended)
        self.assertEqual(self.drain.in_flight, 1)
        # Its end later changes nothing.
        self.edge.finish(running)
        self.assertEqual(self.drain.in_flight, 0)

    def test_zero_timeout_is_no_drain(self) -> None:
        drain = NodeDrain(self.clock, 0)
        edge = Edge(drain, self.clock)
        self.assertIsNotNone(edge.submit("r1"))
        self.successResultOf(drain.begin())
        self.assertEqual(edge.drainings(), [])

    def test_begin_twice_shares_the_end(self) -> None:
        running = self.edge.submit("r1")
        assert running is not None
        first, second = self.drain.begin(), self.drain.begin()
        self.assertEqual(len(self.edge.drainings()), 1)
        self.edge.finish(running)
        self.clock.advance(0)
        self.successResultOf(first)
        self.successResultOf(second)
        self.successResultOf(self.drain.begin())

    def test_an_edge_that_cannot_be_told(self) -> None:
        """An older Edge (no node_draining_supported) is sent nothing it would not understand,
        and the session refuses new work at once."""
        old = Edge(self.drain, self.clock, supported=False)
        self.drain.begin()
        self.assertEqual(old.drainings(), [])
        self.assertIsNone(old.submit("r1"))
        self.assertEqual(old.refused[0][1].code, ErrorCode.NODE_DRAINING)

    def test_session_registered_while_draining_refuses_at_once(self) -> None:
        running = self.edge.submit("r1")
        self.drain.begin()
        late = Edge(self.drain, self.clock)
        self.assertEqual(late.drainings(), [])
        self.assertIsNone(late.submit("r1"))
        assert running is not None
        self.edge.finish(running)

    def test_closed_session_is_forgotten_and_its_work_ends(self) -> None:
        """A session lost while draining: its work leaves as it ends; the drain then ends."""
        running = self.edge.submit("r1")
        ended = self.drain.begin()
        self.edge.session.connection_lost(Failure(Exception("gone")))
        for job in self.edge.admission.close():
            self.edge.finish(job)
        self.clock.advance(0)
        self.successResultOf(ended)
        assert running is not None

    def test_answer_without_drain_is_ignored(self) -> None:
        edge = Edge(NodeDrain(self.clock, 30), self.clock)
        edge.session.envelope_received(pb.Envelope(node_draining=pb.NodeDraining()))
        self.assertIsNotNone(edge.submit("r1"))

    def test_negative_timeout(self) -> None:
        self.assertRaises(ValueError, NodeDrain, self.clock, -1)


class FakeSupervisor:
    """What EdgeSupervisors uses of a NodeSupervisor."""

    def __init__(self) -> None:
        self.stopped = False
        self._finished: Deferred[int] = Deferred()

    def when_finished(self) -> Deferred[int]:
        return self._finished

    def startService(self) -> None:
        pass

    def stopService(self) -> Deferred[None]:
        self.stopped = True
        self._finished.callback(0)
        return succeed(None)

    def describe(self) -> dict[str, object]:
        return {}


class SupervisorsDrainTests(SynchronousTestCase):
    def test_supervisors_stop_after_the_drain(self) -> None:
        clock = Clock()
        drain = NodeDrain(clock, 30)
        edge = Edge(drain, clock)
        supervisor = FakeSupervisor()
        supervisors = EdgeSupervisors(
            [SupervisedEdge("edge:7443", True, cast(NodeSupervisor, supervisor))], drain
        )
        finished = supervisors.when_finished()
        supervisors.startService()
        running = edge.submit("r1")
        assert running is not None
        stopped = supervisors.stopService()
        self.assertFalse(supervisor.stopped)
        self.assertNoResult(stopped)
        edge.finish(running)
        self.assertFalse(supervisor.stopped)
        clock.advance(0)
        self.assertTrue(supervisor.stopped)
        self.successResultOf(stopped)
        self.assertEqual(self.successResultOf(finished), 0)
