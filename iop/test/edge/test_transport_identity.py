"""
Workload identity at registration, over in-memory connections (iosim): a managed Edge admits a
node only when its client certificate names exactly that node's workload, before
``RegisterResponse(accepted=true)``; a legacy Edge records what a certificate named.

Most tests hand the transport a real certificate (from :mod:`iop.testing.pki`) through the
factory's ``peer_certificate`` seam; :class:`MutualTLSRegistrationTests` runs the real TLS layer
in memory, so the default seam (the handshake's peer certificate) is covered too.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from cryptography import x509
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver, MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import (
    ClientTLS,
    EdgeConfig,
    EdgeSecurity,
    ModelConfig,
    ModelProviderRef,
    ServerTLS,
)
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.gateway import Placement
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.tap import EdgeService, check_managed_transport
from iop.edge.transport import NodeConnection, NodeConnectionFactory
from iop.security.keys import generate_issuer, generate_recipient, write_issuer, write_recipient
from iop.security.tls import client_connection_creator, server_context_factory
from iop.test.edge.fixtures import TOKENS, edge_config, provider
from iop.test.edge.test_transport import ScriptedNode as _ScriptedNode
from iop.testing import pki
from iop.wire import runtime_pb2 as pb

WORKLOAD_A = "node-a.node.iop.internal"
WORKLOAD_B = "node-b.node.iop.internal"


@functools.cache
def _certificates() -> dict[str, x509.Certificate]:
    """One CA's client certificates, by what they carry (key generation is the slow part)."""
    ca = pki.make_ca("identity test CA")

    def client(*dns: str, **kw: Any) -> x509.Certificate:
        return pki.issue(ca, dns_names=dns, client=True, server=False, **kw)[1]

    return {
        "node-a": client(WORKLOAD_A),
        "node-b": client(WORKLOAD_B),
        "both": client(WORKLOAD_B, WORKLOAD_A),
        "cn-only": client(ip_addresses=["127.0.0.1"], common_name=WORKLOAD_A),
        "wildcard": client("*.node.iop.internal"),
        "wildcard-and-a": client("*.node.iop.internal", WORKLOAD_A),
        "with-host": client(WORKLOAD_A, "gpu-box.example.org"),
        "other-domain": client("node-a.node.example.org"),
    }


def _cert(name: str) -> x509.Certificate:
    return _certificates()[name]


class ManagedNode(_ScriptedNode):
    """A scripted node announcing lease keys, as a managed node does (no key check here)."""

    lease_support: pb.LeaseSupport | None = pb.LeaseSupport(
        recipient_key_id="r1", kem="x25519", issuer_key_id="i1"
    )


def _managed(config: EdgeConfig | None = None, **security: Any) -> EdgeConfig:
    return dataclasses.replace(
        config or edge_config(), security=EdgeSecurity(mode="managed", **security)
    )


class _Connections:
    """Connect scripted nodes to ``factory``, each presenting a chosen certificate."""

    def __init__(self, factory: NodeConnectionFactory, clock: Clock) -> None:
        self.factory = factory
        self.clock = clock
        self._presented: dict[int, x509.Certificate | None] = {}
        factory.peer_certificate = lambda transport: self._presented.get(id(transport))

    def connect(
        self, certificate: x509.Certificate | None
    ) -> tuple[ManagedNode, NodeConnection, iosim.IOPump]:
        node, edge, pump = iosim.connectedServerAndClient(
            lambda: self.factory.buildProtocol(None),  # type: ignore[arg-type]
            ManagedNode,
            clock=self.clock,
        )
        self._presented[id(edge.transport)] = certificate
        return node, edge, pump


def _response(node: ManagedNode) -> pb.RegisterResponse:
    [response] = [e.register_response for e in node.received if e.HasField("register_response")]
    return response


class ManagedRegistrationTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = _managed()
        self.bus = EventBus(self.clock)
        self.events: list[NodeEvent] = []
        self.bus.subscribe(self.events.append)
        self.registry = NodeRegistry(
            self.config, lambda node: build_node_payload(self.config, node), self.bus, self.clock
        )
        self.factory = NodeConnectionFactory(self.registry, self.clock)
        self.connections = _Connections(self.factory, self.clock)

    def register(
        self, certificate: x509.Certificate | None, node_id: str = "node-a"
    ) -> tuple[ManagedNode, iosim.IOPump]:
        node, _edge, pump = self.connections.connect(certificate)
        node.register(node_id)
        pump.flush()
        return node, pump

    def assertRefused(self, node: ManagedNode, *in_reason: str) -> pb.RegisterResponse:
        """Refused for identity, before anything was accepted or claimed; the socket closed."""
        self.assertEqual(node.kinds(), ["register_response"])
        response = _response(node)
        self.assertFalse(response.accepted)
        self.assertEqual(response.reject_code, pb.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertEqual(response.node_id, "node-a")
        self.assertFalse(response.HasField("config"))
        for text in in_reason:
            self.assertIn(text, response.reason)
        for token in TOKENS.values():
            self.assertNotIn(token, response.reason)
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        return response

    def test_right_name_accepted(self) -> None:
        node, pump = self.register(_cert("node-a"))
        self.assertTrue(_response(node).accepted)
        self.assertEqual(self.registry.state("node-a"), "pending")
        node.ready("node-a")
        pump.flush()
        self.assertTrue(self.registry.is_ready("node-a"))
        identity = self.registry.identity("node-a")
        self.assertEqual(
            (identity["checked"], identity["ok"], identity["expected"], identity["presented"]),
            (True, True, WORKLOAD_A, [WORKLOAD_A]),
        )
        self.assertEqual((identity["reason"], identity["refusals"]), ("", 0))

    def test_a_host_name_beside_the_workload_is_fine(self) -> None:
        node, _ = self.register(_cert("with-host"))
        self.assertTrue(_response(node).accepted)

    def test_a_certificate_for_two_nodes_refused(self) -> None:
        node, _ = self.register(_cert("both"))
        self.assertRefused(node, "exactly one node workload", WORKLOAD_B)

    def test_wildcard_beside_the_workload_refused(self) -> None:
        node, _ = self.register(_cert("wildcard-and-a"))
        self.assertRefused(node, "exactly one node workload", "*.node.iop.internal")

    def test_another_nodes_name_refused_before_accepted(self) -> None:
        node, _ = self.register(_cert("node-b"))
        response = self.assertRefused(node, WORKLOAD_A, WORKLOAD_B)
        self.assertIn("does not name this node's workload", response.reason)

    def test_no_certificate_refused(self) -> None:
        node, _ = self.register(None)
        self.assertRefused(node, "no client certificate", WORKLOAD_A)

    def test_name_in_common_name_only_refused(self) -> None:
        node, _ = self.register(_cert("cn-only"))
        response = self.assertRefused(node, "no DNS subjectAltName", WORKLOAD_A)
        self.assertIn("CN", response.reason)

    def test_wildcard_refused(self) -> None:
        node, _ = self.register(_cert("wildcard"))
        self.assertRefused(node, "wildcard", "*.node.iop.internal")

    def test_trust_domain_is_part_of_the_name(self) -> None:
        node, _ = self.register(_cert("other-domain"))
        self.assertRefused(node, WORKLOAD_A, "node-a.node.example.org")

    def test_configured_trust_domain(self) -> None:
        self.config = _managed(trust_domain="example.org")
        self.registry = NodeRegistry(
            self.config, lambda node: build_node_payload(self.config, node), self.bus, self.clock
        )
        self.factory = NodeConnectionFactory(self.registry, self.clock)
        self.connections = _Connections(self.factory, self.clock)
        accepted, _ = self.register(_cert("other-domain"))
        self.assertTrue(_response(accepted).accepted)
        self.assertEqual(self.registry.identity("node-a")["expected"], "node-a.node.example.org")

    def test_ready_in_the_same_breath_changes_nothing(self) -> None:
        node, _edge, pump = self.connections.connect(_cert("node-b"))
        node.register("node-a")
        node.ready("node-a")
        pump.flush()
        self.assertRefused(node)
        self.assertFalse(self.registry.is_ready("node-a"))

    def test_refusal_published_as_a_lifecycle_event(self) -> None:
        self.register(_cert("node-b"))
        self.clock.advance(0)
        [event] = self.events
        self.assertEqual(event.kind, NodeEventKind.IDENTITY_REJECTED)
        self.assertEqual(event.kind.value, "node.identity_rejected")
        self.assertEqual(
            (event.node_id, event.expected, event.presented), ("node-a", WORKLOAD_A, (WORKLOAD_B,))
        )
        self.assertIn(WORKLOAD_B, event.reason)

    def test_accepted_registration_publishes_no_refusal(self) -> None:
        self.register(_cert("node-a"))
        self.clock.advance(0)
        self.assertEqual([e.kind for e in self.events], [NodeEventKind.REGISTERED])

    def test_unknown_token_is_still_unknown_token(self) -> None:
        """The token is looked up first: a certificate cannot turn a bad token into a node."""
        node, _edge, pump = self.connections.connect(_cert("node-a"))
        node.send_envelope(pb.Envelope(register_request=pb.RegisterRequest(token="wrong")))
        pump.flush()
        response = _response(node)
        self.assertEqual(response.reject_code, pb.REGISTER_REJECT_UNKNOWN_TOKEN)
        self.assertNotIn(WORKLOAD_A, response.reason)

    def test_impostor_does_not_disturb_the_connected_node(self) -> None:
        """
        node-b's certificate with node-a's token while node-a is connected: refused for its
        identity (fatal for it), not as a duplicate (which a node retries); node-a stays.
        """
        owner, owner_pump = self.register(_cert("node-a"))
        owner.ready("node-a")
        owner_pump.flush()
        impostor, _ = self.register(_cert("node-b"))
        self.assertEqual(_response(impostor).reject_code, pb.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertTrue(impostor.lost)
        self.assertFalse(owner.lost)
        self.assertTrue(self.registry.is_ready("node-a"))
        identity = self.registry.identity("node-a")
        self.assertEqual((identity["ok"], identity["presented"]), (True, [WORKLOAD_A]))
        self.assertEqual(identity["refusals"], 1)

    def test_status_keeps_the_last_refusal_once_disconnected(self) -> None:
        self.register(_cert("node-b"))
        identity = self.registry.identity("node-a")
        self.assertEqual(
            (identity["checked"], identity["ok"], identity["presented"], identity["refusals"]),
            (True, False, [WORKLOAD_B], 1),
        )
        self.assertIn(WORKLOAD_B, identity["reason"])
        accepted, _ = self.register(_cert("node-a"))
        self.assertTrue(_response(accepted).accepted)
        self.assertEqual(self.registry.identity("node-a")["ok"], True)
        self.assertEqual(self.registry.identity("node-a")["refusals"], 1)

    def test_refusal_logged_without_the_token(self) -> None:
        logged = EventLoggingObserver()
        globalLogPublisher.addObserver(logged)
        self.addCleanup(globalLogPublisher.removeObserver, logged)
        self.register(_cert("node-b"))
        texts = [formatEvent(e) + repr(e) for e in logged]
        self.assertTrue(any(WORKLOAD_B in t and "refused node node-a" in t for t in texts), texts)
        for token in TOKENS.values():
            self.assertFalse(any(token in t for t in texts))


class LegacyRegistrationTests(SynchronousTestCase):
    """A legacy Edge checks nothing, but remembers what a client certificate named."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.registry = NodeRegistry(
            self.config,
            lambda node: build_node_payload(self.config, node),
            EventBus(self.clock),
            self.clock,
        )
        self.connections = _Connections(
            NodeConnectionFactory(self.registry, self.clock), self.clock
        )

    def test_any_certificate_accepted_and_recorded(self) -> None:
        node, _edge, pump = self.connections.connect(_cert("node-b"))
        node.register("node-a")
        pump.flush()
        self.assertTrue(_response(node).accepted)
        identity = self.registry.identity("node-a")
        self.assertEqual(
            (identity["checked"], identity["ok"], identity["presented"], identity["certificate"]),
            (False, None, [WORKLOAD_B], True),
        )
        self.assertEqual(identity["expected"], WORKLOAD_A)

    def test_no_certificate_accepted(self) -> None:
        node, _edge, pump = self.connections.connect(None)
        node.register("node-a")
        pump.flush()
        self.assertTrue(_response(node).accepted)
        identity = self.registry.identity("node-a")
        self.assertEqual(
            (identity["checked"], identity["ok"], identity["presented"], identity["certificate"]),
            (False, None, [], False),
        )


def _with_lease_keys(config: EdgeConfig, directory: str) -> EdgeConfig:
    """``config`` with a lease-signing key and each node's recipient key written to files."""
    os.makedirs(directory, exist_ok=True)
    write_issuer(generate_issuer(), f"{directory}/issuer.key", f"{directory}/issuer.pub")
    nodes = []
    for node in config.nodes:
        public = f"{directory}/{node.id}.pub"
        write_recipient(generate_recipient(), f"{directory}/{node.id}.key", public)
        nodes.append(dataclasses.replace(node, recipient_key_file=public))
    security = dataclasses.replace(config.security, signing_key_file=f"{directory}/issuer.key")
    return dataclasses.replace(config, nodes=tuple(nodes), security=security)


def _pool_config() -> EdgeConfig:
    """Managed; model ``m`` over ``a-chat`` and ``b-chat``, capacity 1 each, a queue of 4."""
    base = edge_config()
    nodes = tuple(
        dataclasses.replace(
            n,
            providers=(dataclasses.replace(provider(f"{n.id[-1]}-chat", capacity=1), max_queue=4),),
        )
        for n in base.nodes
    )
    model = ModelConfig(
        id="m", providers=tuple(ModelProviderRef(f"{n.id[-1]}-chat", "demo") for n in nodes)
    )
    return _managed(dataclasses.replace(base, nodes=nodes, models=(model,)))


class NothingDispatchedTests(SynchronousTestCase):
    """A waiting request is not dispatched to a refused connection, only to the real node."""

    def test_waiter_served_only_by_the_right_node(self) -> None:
        clock = MemoryReactorClock()
        edge = EdgeService(_with_lease_keys(_pool_config(), self.mktemp()), clock)
        connections = _Connections(edge.node_factory, clock)
        assert edge.credentials is not None
        announced = edge.credentials.lease_support_for
        busy, _edge, busy_pump = connections.connect(_cert("node-b"))
        busy.lease_support = announced("node-b")
        busy.register("node-b")
        busy_pump.flush()
        busy.ready("node-b")
        busy_pump.flush()
        placed: list[Placement] = []
        edge.gateway.place("m").addCallback(placed.append)  # takes node-b's only slot
        edge.gateway.place("m").addCallback(placed.append)  # waits
        self.assertEqual([p.node_id for p in placed], ["node-b"])

        impostor, _edge, pump = connections.connect(_cert("node-b"))
        impostor.lease_support = announced("node-a")
        impostor.register("node-a")
        impostor.ready("node-a")
        pump.flush()
        self.assertEqual(impostor.kinds(), ["register_response"])
        self.assertTrue(impostor.lost)
        self.assertEqual([p.node_id for p in placed], ["node-b"])
        self.assertEqual(len(edge.pool.snapshot()["waiters"]), 1)
        self.assertEqual(edge.snapshot()["nodes"][0]["identity"]["ok"], False)

        node, _edge, pump = connections.connect(_cert("node-a"))
        node.lease_support = announced("node-a")
        node.register("node-a")
        pump.flush()
        node.ready("node-a")
        pump.flush()
        self.assertEqual([p.node_id for p in placed], ["node-b", "node-a"])
        for placement in placed:
            placement.release()


# ---------------------------------------------------------------------------------------------
# The real TLS layer, in memory


@functools.cache
def _dev_pki() -> dict[str, str]:
    import atexit
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="iop-identity-pki-")
    atexit.register(shutil.rmtree, directory, True)
    return pki.create_dev_pki(os.path.join(directory, "pki"), node_names=["node-a", "node-b"])


class MutualTLSRegistrationTests(SynchronousTestCase):
    """The factory's default seam reads the certificate the TLS handshake verified."""

    def connect(self, cert_of: str) -> tuple[ManagedNode, NodeRegistry, iosim.IOPump]:
        files = _dev_pki()
        clock = Clock()
        config = _managed()
        registry = NodeRegistry(
            config, lambda node: build_node_payload(config, node), EventBus(clock), clock
        )
        server = TLSMemoryBIOFactory(
            server_context_factory(
                ServerTLS(files["edge.crt"], files["edge.key"], client_ca_file=files["ca.crt"])
            ),
            False,
            NodeConnectionFactory(registry, clock),
            clock=clock,
        )
        node = ManagedNode()
        nodes = TLSMemoryBIOFactory(
            client_connection_creator(
                ClientTLS(
                    ca_file=files["ca.crt"],
                    server_name="edge.iop.internal",
                    cert_file=files[f"node-{cert_of}.crt"],
                    key_file=files[f"node-{cert_of}.key"],
                )
            ),
            True,
            _one_protocol(node),
            clock=clock,
        )
        _, _, pump = iosim.connectedServerAndClient(
            lambda: server.buildProtocol(None),
            lambda: nodes.buildProtocol(None),
            clock=clock,
        )
        node.register("node-a")
        pump.flush()
        return node, registry, pump

    def test_own_certificate_accepted(self) -> None:
        node, registry, _ = self.connect("node-a")
        self.assertTrue(_response(node).accepted)
        self.assertEqual(registry.identity("node-a")["presented"], [WORKLOAD_A])

    def test_another_nodes_certificate_refused(self) -> None:
        node, registry, _ = self.connect("node-b")
        response = _response(node)
        self.assertFalse(response.accepted)
        self.assertEqual(response.reject_code, pb.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertIn(WORKLOAD_B, response.reason)
        self.assertTrue(node.lost)
        self.assertEqual(registry.state("node-a"), "disconnected")


def _one_protocol(protocol: ManagedNode) -> Factory:
    """A client factory handing out one given protocol."""
    factory = Factory()
    factory.protocol = lambda: protocol  # type: ignore[assignment]
    return factory


# ---------------------------------------------------------------------------------------------
# The service's own guard


class ManagedTransportGuardTests(SynchronousTestCase):
    def test_legacy_needs_nothing(self) -> None:
        check_managed_transport(edge_config())

    def test_managed_refuses_plaintext(self) -> None:
        error = self.assertRaises(usage.UsageError, check_managed_transport, _managed())
        self.assertIn("node_transport.tls is required", str(error))

    def test_managed_refuses_tls_without_client_ca(self) -> None:
        config = dataclasses.replace(
            _managed(), tls=ServerTLS("edge.crt", "edge.key"), plaintext_nodes=False
        )
        error = self.assertRaises(usage.UsageError, check_managed_transport, config)
        self.assertIn("node_transport.tls.client_ca_file is required", str(error))

    def test_managed_with_client_ca(self) -> None:
        config = dataclasses.replace(
            _managed(),
            tls=ServerTLS("edge.crt", "edge.key", client_ca_file="ca.crt"),
            plaintext_nodes=False,
        )
        check_managed_transport(config)
