# -*- test-case-name: iop.test.node.test_edges -*-
"""
A node dialling several Edges (:mod:`iop.node.edges`): each Edge's session is supervised alone,
losing one leaves the others serving, and the process's exit code follows every supervisor.
Connections are in memory (iosim) to fake Edges; time is a :class:`Clock`.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ReconnectPolicy, Secret
from iop.node.edges import EdgeLogger, EdgeSupervisors, SupervisedEdge
from iop.node.supervisor import EXIT_FAILURE, EXIT_OK, NodeSupervisor
from iop.node.transport import EdgeConnectionFactory
from iop.test.node.fakes import (
    TOKEN,
    FakeEndpoint,
    accepting_edge,
    capture_events,
    rejecting_edge,
)
from iop.wire import runtime_pb2 as pb

# Shorter than the fake Edges' silence the heartbeat tolerates (5 s).
INTERVAL = 1.0
EDGE_A = "edge-a.example.net:7443"
EDGE_B = "edge-b.example.net:7443"


class EdgeSupervisorsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.events = capture_events(self)
        self.addCleanup(self.assertClean)

    def assertClean(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])
        for event in self.events:
            self.assertNotIn(TOKEN, formatEvent(event))

    def edge(self, name: str, endpoint: FakeEndpoint, max_attempts: int = 0) -> SupervisedEdge:
        factory = EdgeConnectionFactory(
            self.clock,
            hostname="node-host",
            log=EdgeLogger(name, "iop.node.transport.EdgeConnectionProtocol", prefix=True),
        )
        supervisor = NodeSupervisor(
            endpoint,
            factory,
            Secret(TOKEN),
            ReconnectPolicy(max_attempts=max_attempts, interval_sec=INTERVAL),
            self.clock,
            log=EdgeLogger(name, "iop.node.supervisor.NodeSupervisor", prefix=True),
        )
        return SupervisedEdge(name, True, supervisor)

    def flush(self, *endpoints: FakeEndpoint) -> None:
        for endpoint in endpoints:
            endpoint.flush()

    def errors_about(self, edge: str) -> list[str]:
        return [
            formatEvent(e)
            for e in self.events
            if e["log_level"] is LogLevel.error and e.get("edge") == edge
        ]

    # -- serving -----------------------------------------------------------------------------

    def test_one_session_per_edge(self) -> None:
        a = FakeEndpoint(self.clock, default=accepting_edge)
        b = FakeEndpoint(self.clock, default=accepting_edge)
        group = EdgeSupervisors([self.edge(EDGE_A, a), self.edge(EDGE_B, b)])
        finished = group.when_finished()
        group.startService()
        self.flush(a, b)
        self.assertEqual((a.attempts, b.attempts), (1, 1))
        for endpoint in (a, b):
            self.assertEqual(endpoint.edges[0].kinds(), ["register_request", "node_ready_request"])
        first, second = (edge.supervisor.session for edge in group.edges)
        assert first is not None and second is not None
        self.assertIsNot(first, second)
        self.assertIsNot(first.registry, second.registry)
        self.assertEqual(
            [(d["edge"], d["supervisor_state"], d["dials"]) for d in group.describe()],
            [(EDGE_A, "ready", 1), (EDGE_B, "ready", 1)],
        )
        self.assertNoResult(finished)
        stopped = group.stopService()
        self.flush(a, b)
        self.successResultOf(stopped)
        self.assertEqual(self.successResultOf(finished), EXIT_OK)

    def test_losing_one_edge_leaves_the_other_serving(self) -> None:
        """A's connection drops: B's session is untouched, A alone redials after its interval."""
        a = FakeEndpoint(self.clock, default=accepting_edge)
        b = FakeEndpoint(self.clock, default=accepting_edge)
        group = EdgeSupervisors([self.edge(EDGE_A, a), self.edge(EDGE_B, b)])
        group.startService()
        self.flush(a, b)
        serving = group.edges[1].supervisor.session
        a.edges[0].transport.loseConnection()  # type: ignore[union-attr]
        self.flush(a, b)
        self.assertEqual([d["supervisor_state"] for d in group.describe()], ["waiting", "ready"])
        self.assertIs(group.edges[1].supervisor.session, serving)
        self.clock.advance(INTERVAL)
        self.flush(a, b)
        self.assertEqual((a.attempts, b.attempts), (2, 1))
        self.assertEqual([d["supervisor_state"] for d in group.describe()], ["ready", "ready"])
        self.assertTrue(
            any(
                e.get("edge") == EDGE_A and "session of node" in formatEvent(e) for e in self.events
            )
        )
        # ClientService's own retry line is silent: the supervisor's line says it, naming the Edge.
        self.assertFalse(any("Scheduling retry" in formatEvent(e) for e in self.events))
        stopped = group.stopService()
        self.flush(a, b)
        self.successResultOf(stopped)

    # -- the exit policy ---------------------------------------------------------------------

    def test_fatal_answer_from_one_edge_is_not_the_end(self) -> None:
        """B does not know our token: B's supervisor gives up, A keeps serving, no exit."""
        a = FakeEndpoint(self.clock, default=accepting_edge)
        b = FakeEndpoint(self.clock, default=rejecting_edge(pb.REGISTER_REJECT_UNKNOWN_TOKEN))
        group = EdgeSupervisors([self.edge(EDGE_A, a), self.edge(EDGE_B, b)])
        finished = group.when_finished()
        group.startService()
        self.flush(a, b)
        self.clock.advance(0)  # B's supervisor stops on the next tick
        self.assertEqual(
            [(d["supervisor_state"], d["exit_code"]) for d in group.describe()],
            [("ready", None), ("finished", EXIT_FAILURE)],
        )
        self.assertNoResult(finished)
        [gave_up] = [m for m in self.errors_about(EDGE_B) if "still serving" in m]
        self.assertIn(EDGE_A, gave_up)
        self.assertTrue(any("giving up" in m for m in self.errors_about(EDGE_B)))
        self.assertEqual(self.errors_about(EDGE_A), [])
        # A local shutdown now is still a normal end.
        stopped = group.stopService()
        self.flush(a, b)
        self.successResultOf(stopped)
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
        self.assertEqual(self.successResultOf(group.when_finished()), EXIT_OK)

    def test_exit_1_only_when_every_edge_is_lost(self) -> None:
        a = FakeEndpoint(self.clock)  # refuses every dial
        b = FakeEndpoint(self.clock)
        group = EdgeSupervisors(
            [self.edge(EDGE_A, a, max_attempts=2), self.edge(EDGE_B, b, max_attempts=4)]
        )
        finished = group.when_finished()
        group.startService()
        self.clock.advance(INTERVAL)
        self.assertEqual([d["supervisor_state"] for d in group.describe()], ["finished", "waiting"])
        self.assertNoResult(finished)
        self.clock.advance(INTERVAL)
        self.assertEqual((a.attempts, b.attempts), (2, 3))
        self.assertNoResult(finished)
        self.clock.advance(INTERVAL)
        self.assertEqual((a.attempts, b.attempts), (2, 4))
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.assertEqual(self.successResultOf(group.when_finished()), EXIT_FAILURE)
        # The last one to give up has nobody left to mention.
        self.assertFalse(any("still serving" in m for m in self.errors_about(EDGE_B)))
        self.successResultOf(group.stopService())
        self.assertEqual(self.successResultOf(group.when_finished()), EXIT_FAILURE)

    def test_one_edge_is_its_supervisor(self) -> None:
        """With one Edge the node's exit code is that supervisor's, as it always was."""
        a = FakeEndpoint(self.clock, default=rejecting_edge(pb.REGISTER_REJECT_UNKNOWN_TOKEN))
        group = EdgeSupervisors([self.edge(EDGE_A, a)])
        finished = group.when_finished()
        group.startService()
        self.flush(a)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.assertFalse(any("still serving" in m for m in self.errors_about(EDGE_A)))

    def test_shutdown_before_start(self) -> None:
        a = FakeEndpoint(self.clock)
        b = FakeEndpoint(self.clock)
        group = EdgeSupervisors([self.edge(EDGE_A, a), self.edge(EDGE_B, b)])
        self.successResultOf(group.stopService())
        self.assertEqual(self.successResultOf(group.when_finished()), EXIT_OK)
        self.assertEqual((a.attempts, b.attempts), (0, 0))

    def test_needs_an_edge(self) -> None:
        self.assertRaises(ValueError, EdgeSupervisors, [])


class EdgeLoggerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events = capture_events(self)

    def test_every_event_names_its_edge(self) -> None:
        EdgeLogger(EDGE_A, "iop.test").info("dialing edge (attempt {attempt})", attempt=1)
        [event] = self.events
        self.assertEqual(event["edge"], EDGE_A)
        self.assertEqual(event["log_namespace"], "iop.test")
        self.assertEqual(formatEvent(event), "dialing edge (attempt 1)")

    def test_prefix_for_several_edges(self) -> None:
        EdgeLogger(EDGE_B, "iop.test", prefix=True).warn("attempt {n} failed", n=2)
        [event] = self.events
        self.assertEqual(formatEvent(event), f"edge {EDGE_B}: attempt 2 failed")

    def test_failures_too(self) -> None:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            EdgeLogger(EDGE_A, "iop.test", prefix=True).failure("handshake failed")
        [event] = self.events
        self.assertEqual(event["edge"], EDGE_A)
        self.assertEqual(formatEvent(event), f"edge {EDGE_A}: handshake failed")
        self.flushLoggedErrors(RuntimeError)
