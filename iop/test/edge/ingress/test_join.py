"""
A reuse_port Edge joins the shared client port once its nodes are ready (iop.edge.ingress.join):
the gate, and the endpoint that binds at once and listens when the gate opens.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress import listen
from iop.edge.ingress.join import JOIN_WAIT_SEC, JoinGate
from iop.edge.ingress.listen import ReusePortEndpoint
from iop.test.edge.ingress.test_listen import OPTION, Sockets


class GateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.gate = JoinGate(["a", "b"], self.reactor)

    def fired(self) -> list[Any]:
        fired: list[Any] = []
        self.gate.wait().addCallback(fired.append)
        return fired

    def test_opens_when_every_node_is_ready(self) -> None:
        fired = self.fired()
        self.gate.node_ready("a", 1)
        self.assertEqual(fired, [])
        self.gate.node_ready("b", 1)
        self.assertEqual(fired, [None])
        self.assertTrue(self.gate.open)
        self.assertEqual(self.fired(), [None])  # at once, once open

    def test_a_node_lost_meanwhile_counts_again(self) -> None:
        fired = self.fired()
        self.gate.node_ready("a", 1)
        self.gate.node_fenced("a", 1)
        self.gate.node_ready("b", 1)
        self.assertEqual(fired, [])
        self.gate.node_ready("a", 2)
        self.assertEqual(fired, [None])

    def test_opens_at_the_bound(self) -> None:
        fired = self.fired()
        self.gate.node_ready("a", 1)
        self.reactor.advance(JOIN_WAIT_SEC - 0.1)
        self.assertEqual(fired, [])
        self.reactor.advance(0.1)
        self.assertEqual(fired, [None])

    def test_nodes_ready_before_anyone_waits(self) -> None:
        self.gate.node_ready("a", 1)
        self.gate.node_ready("b", 1)
        self.assertEqual(self.fired(), [None])

    def test_no_nodes(self) -> None:
        gate = JoinGate([], self.reactor)
        fired: list[Any] = []
        gate.wait().addCallback(fired.append)
        self.assertEqual(fired, [None])


class JoiningEndpointTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.gate = JoinGate(["a"], self.reactor)
        self.patch(listen, "check_reuse_port", lambda: OPTION)

    def endpoint(self, sockets: Sockets) -> ReusePortEndpoint:
        return ReusePortEndpoint(
            self.reactor, 8080, "127.0.0.1", socket_factory=sockets, join=self.gate.wait
        )

    def test_binds_now_listens_once_joined(self) -> None:
        sockets = Sockets()
        ports: list[Any] = []
        self.endpoint(sockets).listen(Factory.forProtocol(Protocol)).addCallback(ports.append)
        [sock] = sockets.made
        self.assertIn(("bind", ("127.0.0.1", 8080)), sock.calls)
        self.assertNotIn("listen", [call[0] for call in sock.calls])
        self.assertEqual((ports, self.reactor.adoptedPorts), ([], []))
        self.gate.node_ready("a", 1)
        self.assertIn(("listen", 1024), sock.calls)
        self.assertEqual(len(ports), 1)
        self.assertEqual(len(self.reactor.adoptedPorts), 1)
        self.assertTrue(sock.closed)  # the reactor has its own copy

    def test_a_port_taken_fails_at_once(self) -> None:
        sockets = Sockets(fail="bind")
        d = self.endpoint(sockets).listen(Factory.forProtocol(Protocol))
        self.failureResultOf(d, CannotListenError)
        self.assertTrue(sockets.made[0].closed)

    def test_stopped_before_joining(self) -> None:
        sockets = Sockets()
        d = self.endpoint(sockets).listen(Factory.forProtocol(Protocol))
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertTrue(sockets.made[0].closed)
        self.gate.node_ready("a", 1)
        self.assertEqual(self.reactor.adoptedPorts, [])
