"""
The Node's one reconnect loop: attempt budget, fatal errors, shutdown, re-dial after a session
drops. Every dial is counted by a fake endpoint; connections are in-memory (iosim).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ReconnectPolicy, Secret
from iop.node.supervisor import EXIT_FAILURE, EXIT_OK, NodeSupervisor, SupervisorState
from iop.node.transport import EdgeConnectionFactory
from iop.test.node.fakes import (
    NODE_ID,
    TOKEN,
    FakeEdge,
    FakeEndpoint,
    accepted,
    accepting_edge,
    adapter,
    capture_events,
    payload,
    ready_response,
    rejecting_edge,
    silent_edge,
)
from iop.wire import runtime_pb2 as pb

INTERVAL = 10.0


class SupervisorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.events = capture_events(self)
        self.addCleanup(self.assertClean)

    def assertClean(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])
        for event in self.events:
            self.assertNotIn(TOKEN, formatEvent(event))
            self.assertNotIn(TOKEN, repr(event))

    def supervise(
        self,
        endpoint: FakeEndpoint,
        max_attempts: int,
        interval: float = INTERVAL,
        handshake_timeout: float = 30.0,
    ) -> tuple[NodeSupervisor, Deferred[int]]:
        supervisor = NodeSupervisor(
            endpoint,
            EdgeConnectionFactory(self.clock, hostname="node-host"),
            Secret(TOKEN),
            ReconnectPolicy(max_attempts=max_attempts, interval_sec=interval),
            self.clock,
            handshake_timeout=handshake_timeout,
        )
        return supervisor, supervisor.when_finished()

    def assertNoTokenIn(self, supervisor: NodeSupervisor) -> None:
        self.assertNotIn(TOKEN, repr(supervisor.describe()))

    # -- policy ------------------------------------------------------------------------------

    def test_unlimitedRetriesUntilShutdown(self) -> None:
        endpoint = FakeEndpoint(self.clock)
        supervisor, finished = self.supervise(endpoint, max_attempts=0)
        supervisor.startService()
        self.assertEqual(endpoint.attempts, 1)
        for _ in range(14):
            self.clock.advance(INTERVAL)
        self.assertEqual(endpoint.attempts, 15)
        self.assertNoResult(finished)
        status = supervisor.describe()
        self.assertEqual(status["state"], "waiting")
        self.assertEqual(status["attempts"], 15)
        self.assertIn("refused", str(status["last_error"]))
        self.assertNoTokenIn(supervisor)

        stopped = supervisor.stopService()
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
        self.clock.advance(INTERVAL * 10)
        self.assertEqual(endpoint.attempts, 15)
        self.assertIs(supervisor.state, SupervisorState.FINISHED)

    def test_finiteGivesUpAfterExactlyN(self) -> None:
        endpoint = FakeEndpoint(self.clock)
        supervisor, finished = self.supervise(endpoint, max_attempts=3)
        supervisor.startService()
        self.clock.advance(INTERVAL)
        self.assertEqual(endpoint.attempts, 2)
        self.assertNoResult(finished)
        self.clock.advance(INTERVAL)
        self.assertEqual(endpoint.attempts, 3)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.clock.advance(INTERVAL * 10)
        self.assertEqual(endpoint.attempts, 3)
        status = supervisor.describe()
        self.assertEqual((status["state"], status["exit_code"]), ("finished", 1))
        self.assertTrue(
            any(
                e["log_level"] is LogLevel.error and "giving up after 3" in formatEvent(e)
                for e in self.events
            )
        )
        # The tap stops every service at exit; that changes nothing.
        self.successResultOf(supervisor.stopService())
        self.assertEqual(self.successResultOf(supervisor.when_finished()), EXIT_FAILURE)

    def test_retryableRejectCountsAsAttempt(self) -> None:
        endpoint = FakeEndpoint(
            self.clock, default=rejecting_edge(pb.REGISTER_REJECT_DUPLICATE_CONNECTION)
        )
        supervisor, finished = self.supervise(endpoint, max_attempts=2)
        supervisor.startService()
        endpoint.flush()
        self.assertEqual(endpoint.attempts, 1)
        self.assertNoResult(finished)
        self.assertIn("DUPLICATE_CONNECTION", str(supervisor.describe()["last_error"]))
        self.clock.advance(INTERVAL)
        endpoint.flush()
        self.assertEqual(endpoint.attempts, 2)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.assertTrue(all(edge.lost for edge in endpoint.edges))

    def test_applyErrorCountsAsAttempt(self) -> None:
        """A payload that does not apply is the Edge's to fix: retry, don't die."""

        def bad_payload_edge() -> FakeEdge:
            return FakeEdge(accepted(payload(adapter("x", "y"))), ready_response())

        endpoint = FakeEndpoint(self.clock, [bad_payload_edge], default=accepting_edge)
        supervisor, finished = self.supervise(endpoint, max_attempts=2)
        supervisor.startService()
        endpoint.flush()
        self.assertIn("unknown type 'y'", str(supervisor.describe()["last_error"]))
        self.clock.advance(INTERVAL)
        endpoint.flush()
        self.assertIsNotNone(supervisor.session)
        self.assertEqual(supervisor.describe()["attempts"], 0)
        stopped = supervisor.stopService()
        endpoint.flush()
        self.successResultOf(stopped)
        self.assertEqual(self.successResultOf(finished), EXIT_OK)

    def test_handshake_timeoutCountsAsAttempt(self) -> None:
        endpoint = FakeEndpoint(self.clock, default=silent_edge)
        supervisor, finished = self.supervise(endpoint, max_attempts=2, handshake_timeout=3)
        supervisor.startService()
        endpoint.flush()
        self.clock.advance(3)
        endpoint.flush()
        self.assertIn("timed out", str(supervisor.describe()["last_error"]))
        self.assertNoResult(finished)
        self.clock.advance(INTERVAL)
        endpoint.flush()
        self.assertEqual(endpoint.attempts, 2)
        self.clock.advance(3)
        endpoint.flush()
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.assertEqual(endpoint.attempts, 2)

    def test_fatalStopsAtOnce(self) -> None:
        """An unknown token ends even an unlimited policy, after exactly one attempt."""
        endpoint = FakeEndpoint(
            self.clock, default=rejecting_edge(pb.REGISTER_REJECT_UNKNOWN_TOKEN)
        )
        supervisor, finished = self.supervise(endpoint, max_attempts=0)
        supervisor.startService()
        endpoint.flush()
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        self.assertEqual(endpoint.attempts, 1)
        self.clock.advance(INTERVAL * 10)
        self.assertEqual(endpoint.attempts, 1)
        [edge] = endpoint.edges
        self.assertEqual(edge.kinds(), ["register_request"])
        self.assertTrue(edge.lost)
        status = supervisor.describe()
        self.assertEqual((status["state"], status["exit_code"]), ("finished", 1))
        self.assertIn("UNKNOWN_TOKEN", str(status["last_error"]))
        self.assertNoTokenIn(supervisor)
        self.assertTrue(
            any(
                e["log_level"] is LogLevel.error and "giving up" in formatEvent(e)
                for e in self.events
            )
        )

    # -- shutdown ----------------------------------------------------------------------------

    def test_shutdownWhileReady(self) -> None:
        endpoint = FakeEndpoint(self.clock, default=accepting_edge)
        supervisor, finished = self.supervise(endpoint, max_attempts=10)
        supervisor.startService()
        endpoint.flush()
        session = supervisor.session
        assert session is not None
        self.assertEqual(session.node_id, NODE_ID)
        status = supervisor.describe()
        self.assertEqual(status["state"], "ready")
        self.assertEqual(status["session"], session.describe())
        self.assertNoTokenIn(supervisor)

        stopped = supervisor.stopService()
        self.assertNoResult(stopped)  # the connection is still closing
        endpoint.flush()
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
        self.assertTrue(endpoint.edges[0].lost)
        self.assertIsNone(supervisor.session)
        self.clock.advance(INTERVAL * 10)
        self.assertEqual(endpoint.attempts, 1)

    def test_shutdownDuringHandshake(self) -> None:
        endpoint = FakeEndpoint(self.clock, default=silent_edge)
        supervisor, finished = self.supervise(endpoint, max_attempts=1)
        supervisor.startService()
        endpoint.flush()
        supervisor.stopService()
        endpoint.flush()
        # Losing the connection failed the handshake; that is not the attempt failing.
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
        self.assertEqual(supervisor.describe()["attempts"], 0)
        self.assertEqual(endpoint.attempts, 1)

    def test_shutdownBeforeStart(self) -> None:
        endpoint = FakeEndpoint(self.clock)
        supervisor, finished = self.supervise(endpoint, max_attempts=1)
        self.successResultOf(supervisor.stopService())
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
        self.assertEqual(endpoint.attempts, 0)

    def test_whenFinishedPerCaller(self) -> None:
        endpoint = FakeEndpoint(self.clock)
        supervisor, first = self.supervise(endpoint, max_attempts=0)
        second = supervisor.when_finished()
        self.assertIsNot(first, second)
        supervisor.startService()
        supervisor.stopService()
        self.assertEqual(self.successResultOf(first), EXIT_OK)
        self.assertEqual(self.successResultOf(second), EXIT_OK)
        self.assertEqual(self.successResultOf(supervisor.when_finished()), EXIT_OK)

    # -- reconnect ---------------------------------------------------------------------------

    def test_reconnectAfterSessionDrops(self) -> None:
        """
        A ready session resets the count: after it drops, the next dial comes one interval
        later and the budget of N starts afresh.
        """
        endpoint = FakeEndpoint(self.clock, [None, accepting_edge, None, None])
        supervisor, finished = self.supervise(endpoint, max_attempts=2)
        supervisor.startService()
        self.assertEqual(supervisor.describe()["attempts"], 1)
        self.clock.advance(INTERVAL)
        endpoint.flush()
        self.assertEqual(endpoint.attempts, 2)
        self.assertIsNotNone(supervisor.session)
        self.assertEqual(supervisor.describe()["attempts"], 0)

        endpoint.edges[0].transport.loseConnection()  # type: ignore[union-attr]
        endpoint.flush()
        self.assertIsNone(supervisor.session)
        self.assertEqual(supervisor.describe()["state"], "waiting")
        self.clock.advance(INTERVAL - 0.1)
        self.assertEqual(endpoint.attempts, 2)
        self.clock.advance(0.1)
        self.assertEqual(endpoint.attempts, 3)
        self.assertNoResult(finished)  # one failure since the reset, not two
        self.clock.advance(INTERVAL)
        self.assertEqual(endpoint.attempts, 4)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)

    def test_reconnectToNewSession(self) -> None:
        endpoint = FakeEndpoint(self.clock, default=accepting_edge)
        supervisor, finished = self.supervise(endpoint, max_attempts=0)
        supervisor.startService()
        endpoint.flush()
        first = supervisor.session
        endpoint.edges[0].transport.loseConnection()  # type: ignore[union-attr]
        endpoint.flush()
        self.clock.advance(INTERVAL)
        endpoint.flush()
        second = supervisor.session
        self.assertIsNotNone(second)
        self.assertIsNot(first, second)
        self.assertEqual(endpoint.attempts, 2)
        self.assertEqual(endpoint.edges[1].kinds(), ["register_request", "node_ready_request"])
        supervisor.stopService()
        endpoint.flush()
        self.assertEqual(self.successResultOf(finished), EXIT_OK)

    def test_heartbeatTimeoutOfReadySessionRedials(self) -> None:
        """A silent Edge (power loss) is dropped after 5 s and re-dialled one interval later."""

        endpoint = FakeEndpoint(self.clock, [accepting_edge], default=None)
        supervisor, finished = self.supervise(endpoint, max_attempts=1)
        supervisor.startService()
        endpoint.flush()
        self.assertIsNotNone(supervisor.session)
        # The fake Edge never heartbeats; pumping delivers only the node's beats.
        for _ in range(5):
            self.clock.advance(1)
            endpoint.flush()
        self.assertIsNone(supervisor.session)
        self.clock.advance(INTERVAL)
        self.assertEqual(endpoint.attempts, 2)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)

    # -- construction ------------------------------------------------------------------------

    def test_invalidPolicy(self) -> None:
        factory = EdgeConnectionFactory(self.clock, hostname="h")
        endpoint = FakeEndpoint(self.clock)
        for policy in (ReconnectPolicy(-1, 10), ReconnectPolicy(0, 0), ReconnectPolicy(3, -1)):
            self.assertRaises(
                ValueError, NodeSupervisor, endpoint, factory, Secret(TOKEN), policy, self.clock
            )

    def test_runsOnce(self) -> None:
        endpoint = FakeEndpoint(self.clock)
        supervisor, finished = self.supervise(endpoint, max_attempts=0)
        supervisor.startService()
        supervisor.stopService()
        self.assertRaises(RuntimeError, supervisor.startService)
        self.assertEqual(self.successResultOf(finished), EXIT_OK)
