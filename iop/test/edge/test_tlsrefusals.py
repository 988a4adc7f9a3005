# -*- test-case-name: iop.test.edge.test_tlsrefusals -*-
"""
Tests for :mod:`iop.edge.tlsrefusals` through the Edge's real node protocol behind the real TLS
layer, in memory (iosim, ``task.Clock``): a refused handshake is counted by reason and logged
once per peer host and reason per interval, with a summary of the rest; a node that completed
its handshake, a peer that left without a TLS error and a plaintext listener count nothing.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ClientTLS, ServerTLS
from iop.edge.events import EventBus
from iop.edge.metrics import EdgeMetrics
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.tlsrefusals import TLSRefusals
from iop.edge.transport import NodeConnectionFactory
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol
from iop.security.tls import REFUSAL_REASONS, client_connection_creator, server_context_factory
from iop.test.edge.fixtures import TOKENS, edge_config
from iop.test.edge.test_metrics import parse
from iop.testing.pki import create_dev_pki

LINE = "refused node TLS handshake from"


@functools.cache
def _pki() -> dict[str, str]:
    directory = tempfile.mkdtemp(prefix="iop-test-pki-")
    atexit.register(shutil.rmtree, directory, True)
    return create_dev_pki(directory, node_names=["node-a"])


class _Plain(Protocol):
    """A peer that speaks the node protocol without TLS."""

    def connectionMade(self) -> None:
        self.transport.write(b"\x00\x00\x00\x10hello plaintext!")  # type: ignore[union-attr]


class TLSRefusalTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        # trial's TestCase is a unittest.TestCase at run time; its stubs do not say so.
        self.events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)  # type: ignore[arg-type]
        config = edge_config()
        self.registry = NodeRegistry(
            config, lambda node: build_node_payload(config, node), EventBus(self.clock), self.clock
        )
        self.refusals = TLSRefusals(self.clock, interval=60.0, burst=10)
        self.factory = NodeConnectionFactory(self.registry, self.clock, tls_refusals=self.refusals)
        files = _pki()
        self.server = TLSMemoryBIOFactory(
            server_context_factory(
                ServerTLS(files["edge.crt"], files["edge.key"], client_ca_file=files["ca.crt"])
            ),
            False,
            self.factory,
            clock=self.clock,
        )

    def tearDown(self) -> None:
        self.refusals.flush()

    def connect(
        self, client: Protocol | None = None, host: str = "10.1.2.3", port: int = 40000
    ) -> iosim.IOPump:
        """A connection from ``host:port``: by default a node without a client certificate."""
        if client is None:
            files = _pki()
            creator = client_connection_creator(ClientTLS(files["ca.crt"], "edge.iop.internal"))
            client = TLSMemoryBIOFactory(
                creator, True, Factory.forProtocol(Protocol), clock=self.clock
            ).buildProtocol(None)
        server = self.server.buildProtocol(None)
        server_transport = iosim.FakeTransport(
            server, isServer=True, peerAddress=IPv4Address("TCP", host, port)
        )
        client_transport = iosim.FakeTransport(client, isServer=False)
        pump: iosim.IOPump = iosim.connect(
            server, server_transport, client, client_transport, clock=self.clock
        )
        return pump

    def lines(self) -> list[str]:
        return [formatEvent(e) for e in self.events if LINE in formatEvent(e)]

    def counts(self, **expected: int) -> dict[str, int]:
        return {reason: expected.get(reason, 0) for reason in REFUSAL_REASONS}

    def test_a_refused_node_is_counted_and_logged_at_warn(self) -> None:
        self.connect()
        self.assertEqual(self.refusals.stats(), self.counts(no_certificate=1))
        [event] = [e for e in self.events if LINE in formatEvent(e)]
        self.assertEqual(
            formatEvent(event),
            f"{LINE} 10.1.2.3:40000: peer did not return a certificate",
        )
        self.assertEqual(event["log_level"], LogLevel.warn)
        self.assertEqual(event["reason"], "no_certificate")
        self.assertEqual(event["peer"], "10.1.2.3:40000")
        # Nothing reached the registry.
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertEqual(sum(self.registry.stats().rejections.values()), 0)

    def test_the_same_peer_again_is_counted_and_summed_up_later(self) -> None:
        for port in range(40000, 40005):
            self.connect(port=port)
        self.assertEqual(self.refusals.stats(), self.counts(no_certificate=5))
        self.assertEqual(
            self.lines(), [f"{LINE} 10.1.2.3:40000: peer did not return a certificate"]
        )
        self.clock.advance(60)
        summaries = [formatEvent(e) for e in self.events if "more node TLS" in formatEvent(e)]
        self.assertEqual(
            summaries,
            [
                "refused 4 more node TLS handshakes in the last 60 s, not logged one by one "
                "(no_certificate: 4)"
            ],
        )
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # A minute on, the peer gets a line of its own again.
        self.connect(port=40010)
        self.assertEqual(len(self.lines()), 2)

    def test_other_peers_and_reasons_get_their_own_line(self) -> None:
        self.connect(host="10.0.0.1")
        self.connect(host="10.0.0.2")
        self.connect(_Plain(), host="10.0.0.1")
        self.assertEqual(self.refusals.stats(), self.counts(no_certificate=2, protocol=1))
        self.assertEqual(
            self.lines(),
            [
                f"{LINE} 10.0.0.1:40000: peer did not return a certificate",
                f"{LINE} 10.0.0.2:40000: peer did not return a certificate",
                f"{LINE} 10.0.0.1:40000: not TLS: wrong version number",
            ],
        )

    def test_a_flood_is_counted_in_full(self) -> None:
        for i in range(200):
            self.connect(host=f"10.9.{i // 250}.{i % 250}", port=50000 + i)
        self.assertEqual(self.refusals.stats(), self.counts(no_certificate=200))
        self.assertEqual(len(self.lines()), 10)
        self.clock.advance(60)
        summaries = [formatEvent(e) for e in self.events if "more node TLS" in formatEvent(e)]
        self.assertEqual(len(summaries), 1)
        self.assertIn("refused 190 more", summaries[0])

    def test_a_node_that_completed_its_handshake_is_not_a_refusal(self) -> None:
        files = _pki()
        nodes: list[EdgeConnectionProtocol] = []
        node_factory = EdgeConnectionFactory(self.clock)

        def build() -> EdgeConnectionProtocol:
            nodes.append(node_factory.buildProtocol(None))
            return nodes[-1]

        creator = client_connection_creator(
            ClientTLS(
                files["ca.crt"],
                "edge.iop.internal",
                files["node-node-a.crt"],
                files["node-node-a.key"],
            )
        )
        client = TLSMemoryBIOFactory(
            creator, True, Factory.forProtocol(build), clock=self.clock
        ).buildProtocol(None)
        pump = self.connect(client)
        d = nodes[0].handshake(TOKENS["node-a"], self.clock, timeout=10)
        pump.flush()
        self.successResultOf(d)
        nodes[0].transport.abortConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertEqual(self.refusals.stats(), self.counts())
        self.assertEqual(self.lines(), [])

    def test_a_peer_that_leaves_or_stalls_is_not_a_refusal(self) -> None:
        class Leaver(Protocol):
            def connectionMade(self) -> None:
                self.transport.loseConnection()  # type: ignore[union-attr]

        self.connect(Leaver())
        # Says nothing at all: dropped by the register timer, not by TLS.
        pump = self.connect(Protocol())
        self.clock.advance(self.factory.register_timeout)
        pump.flush()
        self.assertEqual(self.refusals.stats(), self.counts())
        self.assertEqual(self.lines(), [])

    def test_a_plaintext_listener_counts_nothing(self) -> None:
        server = self.factory.buildProtocol(None)
        client = _Plain()
        pump = iosim.connect(
            server,
            iosim.FakeTransport(server, isServer=True),
            client,
            iosim.FakeTransport(client, isServer=False),
            clock=self.clock,
        )
        client.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertEqual(self.refusals.stats(), self.counts())


class MetricsTests(SynchronousTestCase):
    def test_every_reason_is_exposed_from_the_start(self) -> None:
        refusals = TLSRefusals(Clock())
        metrics = EdgeMetrics(lambda: {}, tls_refusal_stats=refusals.stats)
        types, samples = parse(metrics.render().decode())
        self.assertEqual(types["iop_node_tls_refused"], "counter")
        exposed: dict[str, Any] = {
            dict(labels)["reason"]: value
            for (name, labels), value in samples.items()
            if name == "iop_node_tls_refused_total"
        }
        self.assertEqual(exposed, dict.fromkeys(REFUSAL_REASONS, 0.0))
