"""The Node end of the Edge socket: lifecycle, handshake, heartbeat and post-ready replies."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from iop import __version__
from iop.node.errors import FatalError, RetryableError
from iop.node.session import (
    COMMAND_UNAVAILABLE,
    RUN_UNAVAILABLE,
    NodeSession,
    SessionBuilder,
    default_adapter_context,
)
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol, IllegalTransition
from iop.test.node.fakes import (
    NODE_ID,
    TOKEN,
    FakeEdge,
    accepted,
    adapter,
    capture_events,
    drain,
    frame,
    kinds,
    payload,
    ready_response,
    rejected,
)
from iop.wire import runtime_pb2 as pb


class TransportTestCase(SynchronousTestCase):
    """One protocol on a StringTransport; the cleanup asserts that no timer outlives it."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.connections: list[tuple[EdgeConnectionProtocol, Deferred[None]]] = []
        self.addCleanup(self.close_all)
        self.transport, self.protocol, self.lost = self.connect()

    def close_all(self) -> None:
        for protocol, lost in self.connections:
            if not lost.called:
                protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def connect(
        self,
        heartbeat_interval: float = 2.0,
        heartbeat_timeout: float = 5.0,
        sessions: SessionBuilder | None = None,
    ) -> tuple[StringTransport, EdgeConnectionProtocol, Deferred[None]]:
        factory = EdgeConnectionFactory(
            self.clock,
            sessions,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            hostname="node-host",
        )
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        lost = protocol.when_disconnected()
        self.connections.append((protocol, lost))
        return transport, protocol, lost

    def deliver(
        self, envelope: pb.Envelope, protocol: EdgeConnectionProtocol | None = None
    ) -> None:
        (protocol or self.protocol).dataReceived(frame(envelope))

    def sent(self, transport: StringTransport | None = None) -> list[pb.Envelope]:
        return drain(transport or self.transport)

    def loseConnection(self, protocol: EdgeConnectionProtocol | None = None) -> None:
        (protocol or self.protocol).connectionLost(Failure(ConnectionDone()))

    def handshake_to_ready(self) -> NodeSession:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.deliver(ready_response())
        self.sent()
        return self.successResultOf(d)


class HandshakeTests(TransportTestCase):
    def test_happyPath(self) -> None:
        """register → apply → ready, in that order on the wire, then a ready session."""
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        [register] = self.sent()
        self.assertEqual(register.WhichOneof("message"), "register_request")
        self.assertEqual(register.register_request.token, TOKEN)
        self.assertEqual(register.register_request.node_version, __version__)
        self.assertEqual(register.register_request.hostname, "node-host")
        # A legacy node announces no lease support.
        self.assertFalse(register.register_request.HasField("lease_support"))
        self.assertNoResult(d)

        config = payload(adapter("gpu", "vllm", max_concurrency=3), adapter("", "ollama"))
        self.deliver(accepted(config))
        [ready] = self.sent()
        self.assertEqual(ready.WhichOneof("message"), "node_ready_request")
        self.assertEqual(ready.node_ready_request.node_id, NODE_ID)
        self.assertNoResult(d)

        self.deliver(ready_response())
        session = self.successResultOf(d)
        self.assertEqual(session.node_id, NODE_ID)
        self.assertEqual(session.config.config_revision, 7)
        self.assertEqual(session.registry.get("gpu").max_concurrency, 3)
        self.assertEqual(session.registry.get("ollama").type, "ollama")
        self.assertEqual(
            session.describe(),
            {
                "node_id": NODE_ID,
                "alias": "lab",
                "config_revision": 7,
                "adapters": session.registry.describe(),
            },
        )
        self.assertFalse(self.transport.disconnecting)
        self.assertEqual(self.sent(), [])

    def test_overInMemoryConnection(self) -> None:
        """The same handshake against a fake Edge over an iosim connection."""
        protocol = EdgeConnectionFactory(self.clock, hostname="h").buildProtocol(None)
        edge = FakeEdge(accepted(), ready_response())
        pump = iosim.connect(
            edge,
            iosim.makeFakeServer(edge),
            protocol,
            iosim.makeFakeClient(protocol),
            greet=False,
            clock=self.clock,
        )
        d = protocol.handshake(TOKEN, self.clock, 10)
        pump.flush()
        session = self.successResultOf(d)
        self.assertEqual(session.node_id, NODE_ID)
        self.assertEqual(edge.kinds(), ["register_request", "node_ready_request"])
        edge.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertTrue(session.closed)
        self.assertTrue(edge.lost)

    def test_rejectCodes(self) -> None:
        """
        Unknown token, a refused client certificate and refused lease support are fatal; every
        other rejection is retryable. Both abort first.
        """
        cases = [
            (pb.REGISTER_REJECT_UNKNOWN_TOKEN, FatalError),
            (pb.REGISTER_REJECT_WORKLOAD_IDENTITY, FatalError),
            (pb.REGISTER_REJECT_LEASE_SUPPORT, FatalError),
            (pb.REGISTER_REJECT_DUPLICATE_CONNECTION, RetryableError),
            (pb.REGISTER_REJECT_CONFIG_PAYLOAD, RetryableError),
            (pb.REGISTER_REJECT_OTHER, RetryableError),
            (pb.REGISTER_REJECT_UNSPECIFIED, RetryableError),
        ]
        for code, error_class in cases:
            transport, protocol, lost = self.connect()
            seen: list[bool] = []

            def note(
                f: Failure, t: StringTransport = transport, seen: list[bool] = seen
            ) -> Failure:
                seen.append(t.disconnecting)
                return f

            d = protocol.handshake(TOKEN, self.clock, 10)
            d.addErrback(note)
            self.deliver(rejected(code, "nope"), protocol)
            failure = self.failureResultOf(d, error_class)
            self.assertEqual(seen, [True], "transport aborted before the errback")
            self.assertIn("nope", failure.getErrorMessage())
            self.assertIn(pb.RegisterRejectCode.Name(code), failure.getErrorMessage())
            self.assertTrue(transport.disconnecting)
            self.assertEqual(kinds(self.sent(transport)), ["register_request"])
            self.loseConnection(protocol)
            self.assertIsNone(self.successResultOf(lost))

    def test_a_managed_node_announces_its_lease_keys(self) -> None:
        support = pb.LeaseSupport(recipient_key_id="rk", kem="x25519", issuer_key_id="ik")
        factory = EdgeConnectionFactory(self.clock, hostname="node-host", lease_support=support)
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        d = protocol.handshake(TOKEN, self.clock, 10)
        [register] = self.sent(transport)
        self.assertEqual(register.register_request.lease_support, support)
        self.deliver(rejected(pb.REGISTER_REJECT_LEASE_SUPPORT, "other issuer"), protocol)
        failure = self.failureResultOf(d, FatalError)
        self.assertIn("credential lease support", failure.getErrorMessage())
        protocol.connectionLost(Failure(ConnectionDone()))

    def test_readyFalse(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.deliver(ready_response(False, "superseded by a newer connection"))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("superseded by a newer connection", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)

    def test_unknownAdapterType(self) -> None:
        """A payload that does not apply: no ready request, aborted, retryable."""
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.sent()
        self.deliver(accepted(payload(adapter("x", "y"))))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("adapter 'x': unknown type 'y'", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.sent(), [])

    def test_duplicateAdapterNames(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted(payload(adapter("x", "vllm"), adapter("x", "cli"))))
        self.failureResultOf(d, RetryableError)
        self.assertTrue(self.transport.disconnecting)

    def test_acceptedWithoutNodeId(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted(node_id=""))
        self.failureResultOf(d, RetryableError)
        self.assertTrue(self.transport.disconnecting)

    def test_timeout(self) -> None:
        """The whole handshake is bounded, even while the Edge keeps heartbeating."""
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        for _ in range(4):
            self.clock.advance(2)
            self.deliver(pb.Envelope(heartbeat=pb.Heartbeat(sequence=1)))
        self.assertNoResult(d)
        self.clock.advance(2)
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("timed out after 10 s", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)

    def test_timeoutWhileApplying(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 3)
        self.deliver(accepted())
        self.clock.advance(3)
        self.failureResultOf(d, RetryableError)
        self.assertTrue(self.transport.disconnecting)

    def test_connectionLostWhileRegistering(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.protocol.connectionLost(Failure(ConnectionLost("cable cut")))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("connection lost", failure.getErrorMessage())
        self.assertIsNone(self.successResultOf(self.lost))
        self.failureResultOf(self.protocol.handshake(TOKEN, self.clock, 10), RetryableError)

    def test_connectionLostWhileApplying(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.loseConnection()
        self.failureResultOf(d, RetryableError)

    def test_connectionLostBeforeHandshake(self) -> None:
        self.loseConnection()
        self.failureResultOf(self.protocol.handshake(TOKEN, self.clock, 10), RetryableError)

    def test_unexpectedEnvelopeWhileRegistering(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(pb.Envelope(run_request=pb.RunRequest(run_id="r1")))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("unexpected run_request while registering", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(kinds(self.sent()), ["register_request"])

    def test_unexpectedEnvelopeWhileApplying(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.deliver(accepted())
        self.failureResultOf(d, RetryableError)
        self.assertTrue(self.transport.disconnecting)

    def test_unexpectedEnvelopeBeforeHandshake(self) -> None:
        self.deliver(ready_response())
        self.assertTrue(self.transport.disconnecting)
        self.failureResultOf(self.protocol.handshake(TOKEN, self.clock, 10), RetryableError)

    def test_secondHandshakeRefused(self) -> None:
        first = self.protocol.handshake(TOKEN, self.clock, 10)
        self.failureResultOf(self.protocol.handshake(TOKEN, self.clock, 10), IllegalTransition)
        self.assertTrue(self.transport.disconnecting)
        self.loseConnection()
        self.failureResultOf(first, RetryableError)

    def test_tokenNeverLogged(self) -> None:
        events = capture_events(self)
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(rejected(pb.REGISTER_REJECT_UNKNOWN_TOKEN))
        self.failureResultOf(d, FatalError)
        self.loseConnection()
        self.assertTrue(len(events) > 0)
        for event in events:
            self.assertNotIn(TOKEN, formatEvent(event))
            self.assertNotIn(TOKEN, repr(event))


class HeartbeatTests(TransportTestCase):
    def test_sendsOnTheClock(self) -> None:
        self.clock.advance(2)
        [beat] = self.sent()
        self.assertEqual(beat.heartbeat.sequence, 1)
        self.assertEqual(beat.heartbeat.sent_unix_ms, 2000)
        self.clock.advance(2)
        [beat] = self.sent()
        self.assertEqual(beat.heartbeat.sequence, 2)

    def test_silenceAborts(self) -> None:
        events = capture_events(self)
        self.clock.advance(4.9)
        self.assertFalse(self.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(self.transport.disconnecting)
        self.assertTrue(any("heartbeat timeout" in formatEvent(e) for e in events))
        self.loseConnection()

    def test_anyFramePushesTheDeadline(self) -> None:
        self.clock.advance(4)
        self.deliver(pb.Envelope(heartbeat=pb.Heartbeat(sequence=9)))
        self.clock.advance(4.9)
        self.assertFalse(self.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(self.transport.disconnecting)

    def test_silenceDuringHandshakeFailsIt(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 30)
        self.clock.advance(5)
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("heartbeat", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)

    def test_adoptsEdgeCadence(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted(interval_ms=1000, timeout_ms=3000))
        self.deliver(ready_response())
        self.successResultOf(d)
        self.sent()
        self.clock.advance(1)
        [beat] = self.sent()
        self.assertEqual(beat.WhichOneof("message"), "heartbeat")
        self.clock.advance(1.9)
        self.assertFalse(self.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(self.transport.disconnecting)

    def test_zeroCadenceKeepsDefaults(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted(interval_ms=0, timeout_ms=0))
        self.deliver(ready_response())
        self.successResultOf(d)
        self.sent()
        self.clock.advance(2)
        self.assertEqual(kinds(self.sent(), heartbeats=True), ["heartbeat"])
        self.clock.advance(2.9)
        self.assertFalse(self.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(self.transport.disconnecting)

    def test_stopsOnConnectionLost(self) -> None:
        self.loseConnection()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class ReadySessionTests(TransportTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.session = self.handshake_to_ready()

    def reply(self, envelope: pb.Envelope) -> pb.Envelope:
        self.deliver(envelope)
        [response] = self.sent()
        self.assertFalse(self.transport.disconnecting)
        return response

    def test_runRequest(self) -> None:
        response = self.reply(
            pb.Envelope(run_request=pb.RunRequest(run_id="r1", adapter="gpu", session_id="s1"))
        )
        self.assertEqual(response.WhichOneof("message"), "run_event")
        event = response.run_event
        self.assertEqual((event.run_id, event.type, event.session_id), ("r1", "error", "s1"))
        self.assertEqual(event.error, RUN_UNAVAILABLE)

    def test_cancelRequest(self) -> None:
        response = self.reply(
            pb.Envelope(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="r1"))
        )
        cancel = response.cancel_response
        self.assertEqual((cancel.kind, cancel.run_id, cancel.ok), (pb.CANCEL_RUN, "r1", False))
        self.assertTrue(cancel.reason)

    def test_providerTunnelRequest(self) -> None:
        response = self.reply(
            pb.Envelope(provider_tunnel_request=pb.ProviderTunnelRequest(run_id="t1"))
        )
        tunnel = response.provider_tunnel_frame
        self.assertEqual((tunnel.run_id, tunnel.kind), ("t1", pb.ERROR))
        self.assertTrue(tunnel.error)

    def test_nodeCommandRequest(self) -> None:
        response = self.reply(
            pb.Envelope(
                node_command_request=pb.NodeCommandRequest(
                    request_id="c1", type=pb.NODE_COMMAND_CAPABILITIES
                )
            )
        )
        command = response.node_command_response
        self.assertEqual(
            (command.request_id, command.type, command.ok, command.error),
            ("c1", pb.NODE_COMMAND_CAPABILITIES, False, COMMAND_UNAVAILABLE),
        )

    def test_configRefreshRequest(self) -> None:
        response = self.reply(
            pb.Envelope(
                node_config_refresh_request=pb.NodeConfigRefreshRequest(
                    request_id="f1", config=payload()
                )
            )
        )
        refresh = response.node_config_refresh_response
        self.assertEqual((refresh.request_id, refresh.outcome), ("f1", pb.REFRESH_RESTART_REQUIRED))
        self.assertTrue(refresh.reason)

    def test_installedHandlerReplacesDefault(self) -> None:
        seen: list[str] = []
        self.session.install("run_request", lambda e: seen.append(e.run_request.run_id))
        self.deliver(pb.Envelope(run_request=pb.RunRequest(run_id="r9")))
        self.assertEqual(seen, ["r9"])
        self.assertEqual(self.sent(), [])
        self.assertRaises(ValueError, self.session.install, "register_response", seen.append)

    def test_messageEdgeMayNotSend(self) -> None:
        events = capture_events(self)
        self.deliver(accepted())
        self.assertTrue(self.transport.disconnecting)
        self.assertTrue(
            any("message the edge may not send to a ready node" in formatEvent(e) for e in events)
        )
        # Closed: nothing more is read or answered.
        self.protocol.paused = False
        self.deliver(pb.Envelope(run_request=pb.RunRequest(run_id="r1")))
        self.assertEqual(self.sent(), [])

    def test_disconnectNotifiesEachCaller(self) -> None:
        first, second = self.protocol.when_disconnected(), self.protocol.when_disconnected()
        self.assertIsNot(first, second)
        self.assertNoResult(first)
        self.loseConnection()
        self.assertIsNone(self.successResultOf(first))
        self.assertIsNone(self.successResultOf(second))
        self.assertIsNone(self.successResultOf(self.protocol.when_disconnected()))
        self.assertTrue(self.session.closed)

    def test_noSendAfterClose(self) -> None:
        self.loseConnection()
        self.session.send(pb.Envelope(run_event=pb.RunEvent(run_id="late")))
        self.assertEqual(self.sent(), [])


class SessionOrderTests(TransportTestCase):
    """
    The ready response moves the connection to ready before any later envelope is read; a
    request before it is the Edge dispatching too early.
    """

    def setUp(self) -> None:
        super().setUp()
        self.served: list[tuple[str, str]] = []
        self.sessions: list[NodeSession] = []

        def setup(session: NodeSession) -> None:
            self.sessions.append(session)
            session.install(
                "provider_tunnel_request",
                lambda e: self.served.append(("tunnel", e.provider_tunnel_request.run_id)),
            )
            session.install(
                "run_request", lambda e: self.served.append(("run", e.run_request.run_id))
            )

        builder = SessionBuilder(default_adapter_context(self.clock), setup=setup)
        self.transport, self.protocol, self.lost = self.connect(sessions=builder)

    def requests(self) -> bytes:
        return frame(
            pb.Envelope(provider_tunnel_request=pb.ProviderTunnelRequest(run_id="t1"))
        ) + frame(pb.Envelope(run_request=pb.RunRequest(run_id="r1")))

    def test_readyAndRequestsInOneRead(self) -> None:
        """Ready, a tunnel request and a run request in one chunk: both are served, in order."""
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.sent()
        ready: list[list[tuple[str, str]]] = []

        def fired(session: NodeSession) -> NodeSession:
            ready.append(list(self.served))
            return session

        d.addCallback(fired)
        self.protocol.dataReceived(frame(ready_response()) + self.requests())
        session = self.successResultOf(d)
        self.assertEqual(ready, [[]], "the handshake fired before the requests were served")
        self.assertEqual(self.served, [("tunnel", "t1"), ("run", "r1")])
        self.assertEqual(self.sessions, [session])
        self.assertFalse(self.transport.disconnecting)
        self.assertIsNotNone(session.ready_at)

    def test_readyAndRequestsByteByByte(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        for byte in frame(ready_response()) + self.requests():
            self.protocol.dataReceived(bytes([byte]))
        self.successResultOf(d)
        self.assertEqual(self.served, [("tunnel", "t1"), ("run", "r1")])
        self.assertFalse(self.transport.disconnecting)

    def test_requestBeforeReadyAborts(self) -> None:
        """The Edge must acknowledge ready before it dispatches: an early request aborts."""
        events = capture_events(self)
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.sent()
        self.protocol.dataReceived(self.requests() + frame(ready_response()))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn(
            "unexpected provider_tunnel_request while applying, before acknowledging ready",
            failure.getErrorMessage(),
        )
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(
            self.protocol.close_reason,
            "unexpected provider_tunnel_request while applying: a request before the ready "
            "response",
        )
        self.assertTrue(any("before the ready response" in formatEvent(e) for e in events))
        self.assertEqual(self.served, [])
        self.assertEqual(self.sent(), [])
        # The session built for this connection learns that it is gone.
        [session] = self.sessions
        self.assertFalse(session.closed)
        self.loseConnection()
        self.assertTrue(session.closed)

    def test_runRequestBeforeReadyAborts(self) -> None:
        d = self.protocol.handshake(TOKEN, self.clock, 10)
        self.deliver(accepted())
        self.deliver(pb.Envelope(run_request=pb.RunRequest(run_id="r1")))
        failure = self.failureResultOf(d, RetryableError)
        self.assertIn("unexpected run_request while applying", failure.getErrorMessage())
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.served, [])


class SessionBuilderTests(TransportTestCase):
    def test_appliesACopyOfThePayload(self) -> None:
        config = payload(adapter("gpu", "vllm"))
        session = SessionBuilder(default_adapter_context(self.clock)).apply(
            NODE_ID, config, lambda e: None, self.clock, 1.0, 3.0
        )
        config.alias = "changed"
        self.assertEqual(session.config.alias, "lab")
        self.assertEqual((session.heartbeat_interval, session.heartbeat_timeout), (1.0, 3.0))
        self.assertEqual(session.registry.get("gpu").type, "vllm")

    def test_payloadThatDoesNotApply(self) -> None:
        builder = SessionBuilder(default_adapter_context(self.clock))
        error = self.assertRaises(
            RetryableError,
            builder.apply,
            NODE_ID,
            payload(adapter("x", "y")),
            lambda e: None,
            self.clock,
        )
        self.assertIn("config payload does not apply", str(error))
