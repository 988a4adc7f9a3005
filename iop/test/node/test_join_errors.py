# -*- test-case-name: iop.test.node.test_join_errors -*-
"""
How a node that cannot join says so: which failures end it at once and with what line
(:func:`iop.node.errors.connection_lost_error`), a peer that is not an Edge node listener (fatal
until the node has once been ready with that Edge), one rate-limited line per failed attempt,
and ``twistd iop-node``'s ``--join`` / ``--join-file`` / ``--reconnect`` options.
"""

from __future__ import annotations

import os
import tempfile

from OpenSSL import SSL
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, formatEvent
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.config.join import JoinString, encode
from iop.config.model import ReconnectPolicy, Secret
from iop.node.errors import (
    FatalError,
    NotAnEdgeError,
    RetryableError,
    connection_lost_error,
    not_an_edge,
)
from iop.node.supervisor import EXIT_FAILURE, NodeSupervisor, SupervisorState
from iop.node.tap import Options
from iop.node.transport import EdgeConnectionFactory
from iop.security.tls import CAPinMismatch, EdgeCertificateRefused
from iop.test.node.fakes import TOKEN, FakeEndpoint, accepting_edge, capture_events

PIN = "sha256:" + "1e" * 32
INTERVAL = 10.0


class ConnectionLostErrorTests(SynchronousTestCase):
    def test_refusals(self) -> None:
        fatal = connection_lost_error(None, Failure(CAPinMismatch("CA pin mismatch: x")), "e:1")
        self.assertIsInstance(fatal, FatalError)
        self.assertEqual(str(fatal), "CA pin mismatch: x")
        expired = EdgeCertificateRefused("the certificate of e:1 expired", retryable=True)
        self.assertIsInstance(connection_lost_error(None, Failure(expired), "e:1"), RetryableError)

    def test_not_tls(self) -> None:
        error = SSL.Error([("SSL routines", "", "wrong version number")])
        lost = connection_lost_error(None, Failure(error), "gw:8081")
        self.assertIsInstance(lost, NotAnEdgeError)
        self.assertEqual(
            str(lost),
            "gw:8081 is not an IOP Edge node listener (it did not answer TLS): is it "
            "listen.admin or the client port? Dial the Edge's listen.nodes address",
        )

    def test_anything_else_retries(self) -> None:
        lost = connection_lost_error(None, Failure(ConnectionResetError("reset")), "e:1")
        self.assertIsInstance(lost, RetryableError)
        self.assertEqual(str(lost), "connection lost during the handshake: reset")


@implementer(IStreamClientEndpoint)
class Scripted:
    """Dials fail with the scripted errors in turn; ``None`` goes to the fake Edge."""

    def __init__(self, clock: Clock, script: list[Exception | None]) -> None:
        self.script = script
        self.edge = FakeEndpoint(clock, default=accepting_edge)

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        step = self.script.pop(0) if self.script else None
        if step is not None:
            return fail(step)
        return self.edge.connect(protocolFactory)


class SupervisorPolicyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.events = capture_events(self)

    def supervise(self, endpoint: Scripted, max_attempts: int = 0) -> NodeSupervisor:
        supervisor = NodeSupervisor(
            endpoint,
            EdgeConnectionFactory(self.clock),
            Secret(TOKEN),
            ReconnectPolicy(max_attempts=max_attempts, interval_sec=INTERVAL),
            self.clock,
        )
        supervisor.startService()

        def stop() -> None:
            supervisor.stopService()
            endpoint.edge.flush()

        self.addCleanup(stop)
        return supervisor

    def lines(self, text: str) -> list[str]:
        return [formatEvent(e) for e in self.events if text in formatEvent(e)]

    def test_not_an_edge_is_fatal_before_ready(self) -> None:
        endpoint = Scripted(self.clock, [not_an_edge("gw:8081", "it did not answer TLS")])
        supervisor = self.supervise(endpoint)
        finished = supervisor.when_finished()
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(finished), EXIT_FAILURE)
        [line] = self.lines("giving up: ")
        self.assertTrue(line.startswith("giving up: gw:8081 is not an IOP Edge node listener"))

    def test_not_an_edge_retries_once_ready(self) -> None:
        """After a ready session the Edge was there: a silent port is it restarting."""
        endpoint = Scripted(self.clock, [None, not_an_edge("gw:8081", "no TLS answer")])
        supervisor = self.supervise(endpoint)
        endpoint.edge.flush()
        self.assertEqual(supervisor.state, SupervisorState.READY)
        endpoint.edge.edges[0].transport.loseConnection()  # type: ignore[union-attr]
        endpoint.edge.flush()
        self.clock.advance(INTERVAL)
        endpoint.edge.flush()
        self.assertEqual(supervisor.state, SupervisorState.WAITING)
        self.assertEqual(len(self.lines("attempt 1 failed: gw:8081 is not an IOP Edge")), 1)
        self.clock.advance(INTERVAL)
        endpoint.edge.flush()
        self.assertEqual(supervisor.state, SupervisorState.READY)

    def test_one_line_per_error_a_minute(self) -> None:
        refused = [ConnectionRefusedError("refused") for _ in range(12)]
        endpoint = Scripted(self.clock, list(refused))
        supervisor = self.supervise(endpoint)
        for _ in range(12):
            self.clock.advance(INTERVAL)
        endpoint.edge.flush()
        self.assertEqual(supervisor.state, SupervisorState.READY)
        # 12 failures over 120 s: a line at 0 s and at 60 s, the rest summed up.
        self.assertEqual(len(self.lines("failed: ConnectionRefusedError")), 2)
        self.assertTrue(self.lines("more failed attempt(s) in the last"))
        self.assertEqual(self.lines("Scheduling retry"), [])
        dials = [e for e in self.events if "dialing edge" in formatEvent(e)]
        self.assertEqual({e["log_level"] for e in dials}, {LogLevel.debug})


class JoinOptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.join = encode(JoinString(("gw.example.net:7443",), TOKEN, PIN))

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_join(self) -> None:
        config = self.parse("--join", self.join).node_config
        [edge] = config.edges
        self.assertEqual(edge.name, "gw.example.net:7443")
        assert edge.tls is not None
        self.assertEqual((edge.tls.ca_pin, edge.tls.ca_file), (PIN, ""))
        self.assertTrue(config.token.matches(TOKEN))

    def test_join_file(self) -> None:
        fd, path = tempfile.mkstemp()
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, "w") as f:
            f.write(self.join + "\n")
        self.assertEqual(
            self.parse("--join-file", path).node_config, self.parse("--join", self.join).node_config
        )

    def test_refusals_name_the_flag(self) -> None:
        cases = {
            ("--join", "nonsense"): "--join: not a join string",
            ("--join", self.join, "--edge", "a:1"): "--edge: give either --join",
            ("--join", self.join, "--config", "x.yaml"): "give either --config (node.yaml) or",
            ("--join-file", "/nonexistent/j"): "--join-file /nonexistent/j: cannot read",
            ("--join", self.join, "--reconnect", "never"): "--reconnect 'never': must be forever",
            ("--join", self.join, "--reconnect-interval", "0"): "--reconnect-interval '0'",
        }
        for argv, message in cases.items():
            error = self.assertRaises(usage.UsageError, self.parse, *argv)
            self.assertIn(message, str(error))
            self.assertNotIn(TOKEN, str(error))

    def test_reconnect(self) -> None:
        policy = self.parse(
            "--join", self.join, "--reconnect", "forever", "--reconnect-interval", "2.5"
        ).node_config.reconnect
        self.assertEqual((policy.max_attempts, policy.interval_sec), (0, 2.5))
        self.assertEqual(
            self.parse(
                "--join", self.join, "--reconnect", "off"
            ).node_config.reconnect.max_attempts,
            1,
        )


class HTTPAnswerTests(SynchronousTestCase):
    def test_http_answer_to_a_frame(self) -> None:
        """A plaintext node pointed at an HTTP listener: its 400 answer is no frame."""
        clock = Clock()
        protocol = EdgeConnectionFactory(clock).buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 8081))
        protocol.makeConnection(transport)
        d = protocol.handshake(TOKEN, clock, 10)
        protocol.dataReceived(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        failure = self.failureResultOf(d, NotAnEdgeError)
        self.assertEqual(
            failure.getErrorMessage(),
            "127.0.0.1:8081 is not an IOP Edge node listener (it answered HTTP): is it "
            "listen.admin or the client port? Dial the Edge's listen.nodes address",
        )
        self.assertTrue(transport.disconnecting)
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(clock.getDelayedCalls(), [])
