"""
The real Edge and Node protocols talking through a real TLS handshake, in memory (iosim): the
node verifies the Edge's workload name, registers, applies its payload and becomes ready.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Any

from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ClientTLS, ServerTLS
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.transport import NodeConnectionFactory
from iop.node.errors import RetryableError
from iop.node.session import NodeSession
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol
from iop.security.tls import client_connection_creator, server_context_factory
from iop.test.edge.fixtures import TOKENS, edge_config
from iop.testing.pki import create_dev_pki

_PKI: dict[str, str] = {}


def pki() -> dict[str, str]:
    if not _PKI:
        directory = tempfile.mkdtemp(prefix="iop-test-pki-")
        atexit.register(shutil.rmtree, directory, True)
        _PKI.update(create_dev_pki(directory))
    return _PKI


class EdgeNodeOverTLSTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.files = pki()
        self.clock = Clock()
        self.config = edge_config()
        self.registry = NodeRegistry(
            self.config,
            lambda node: build_node_payload(self.config, node),
            EventBus(self.clock),
            self.clock,
        )
        self.edge_factory = NodeConnectionFactory(self.registry, self.clock)
        self.node_factory = EdgeConnectionFactory(self.clock)

    def connect(self, server_name: str) -> tuple[EdgeConnectionProtocol, Any, iosim.IOPump]:
        server = TLSMemoryBIOFactory(
            server_context_factory(ServerTLS(self.files["edge.crt"], self.files["edge.key"])),
            False,
            self.edge_factory,
            clock=self.clock,
        )
        nodes: list[EdgeConnectionProtocol] = []

        def build_node() -> EdgeConnectionProtocol:
            nodes.append(self.node_factory.buildProtocol(None))
            return nodes[-1]

        client = TLSMemoryBIOFactory(
            client_connection_creator(ClientTLS(self.files["ca.crt"], server_name)),
            True,
            Factory.forProtocol(build_node),
            clock=self.clock,
        )
        _, server_tls, pump = iosim.connectedServerAndClient(
            lambda: server.buildProtocol(None),
            lambda: client.buildProtocol(None),
            clock=self.clock,
        )
        return nodes[0], server_tls.wrappedProtocol, pump

    def test_register_and_ready_over_tls(self) -> None:
        node, edge, pump = self.connect("edge.iop.internal")
        d = node.handshake(TOKENS["node-a"], self.clock, timeout=10)
        pump.flush()
        session = self.successResultOf(d)
        self.assertIsInstance(session, NodeSession)
        self.assertEqual(session.node_id, "node-a")
        self.assertTrue(self.registry.is_ready("node-a"))
        self.assertIs(self.registry.ready_connection("node-a"), edge)
        node.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_wrong_edge_name_never_registers(self) -> None:
        node, _, pump = self.connect("some-other-edge.iop.internal")
        d = node.handshake(TOKENS["node-a"], self.clock, timeout=10)
        pump.flush()
        self.failureResultOf(d)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_unknown_token_over_tls(self) -> None:
        node, _, pump = self.connect("edge.iop.internal")
        d = node.handshake("wrong-token", self.clock, timeout=10)
        pump.flush()
        failure = self.failureResultOf(d)
        self.assertFalse(failure.check(RetryableError))
        self.assertEqual(self.registry.state("node-a"), "disconnected")
