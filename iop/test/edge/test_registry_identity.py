"""The registry's workload identity check (managed mode), without sockets."""

from __future__ import annotations

import dataclasses

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import EdgeSecurity, NodeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry, RegisterAccepted, RegisterRejected, check_identity
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.test.edge.test_registry import Observer
from iop.testing import pki
from iop.wire.runtime_pb2 import NodeConfigPayload, RegisterRejectCode

WORKLOAD_A = "node-a.node.iop.internal"


class RegistryIdentityTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = dataclasses.replace(edge_config(), security=EdgeSecurity(mode="managed"))
        self.bus = EventBus(self.clock)
        self.events: list[NodeEvent] = []
        self.bus.subscribe(self.events.append)
        self.observer = Observer()
        self.built: list[str] = []

        def build(node: NodeConfig) -> NodeConfigPayload:
            self.built.append(node.id)
            return build_node_payload(self.config, node)

        self.registry = NodeRegistry(
            self.config,
            build,
            self.bus,
            self.clock,
            [self.observer],
        )
        ca = pki.make_ca("registry identity CA")
        self.cert_a = pki.issue(ca, dns_names=[WORKLOAD_A], client=True)[1]
        self.cert_b = pki.issue(ca, dns_names=["node-b.node.iop.internal"], client=True)[1]

    def test_refusal_claims_and_builds_nothing(self) -> None:
        conn = FakeConnection()
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_b)
        assert isinstance(outcome, RegisterRejected), outcome
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertEqual(outcome.node_id, "node-a")
        self.assertIsNone(self.registry.ownership_of(conn))
        self.assertEqual(self.built, [])
        # Nothing of the refused attempt was kept: (the transport closes that connection; here)
        # the same connection object registers afresh.
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_a)
        self.assertIsInstance(outcome, RegisterAccepted)
        self.registry.ready("node-a", conn)
        # The refused attempt took no generation.
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])

    def test_events(self) -> None:
        self.registry.register(TOKENS["node-a"], FakeConnection(), None)
        self.registry.register(TOKENS["node-a"], FakeConnection(), self.cert_a)
        self.clock.advance(0)
        self.assertEqual(
            [(e.kind, e.node_id, e.expected) for e in self.events],
            [
                (NodeEventKind.IDENTITY_REJECTED, "node-a", WORKLOAD_A),
                (NodeEventKind.REGISTERED, "node-a", ""),
            ],
        )
        self.assertEqual(self.events[0].presented, ())
        self.assertIn("no client certificate", self.events[0].reason)

    def test_identity_of_an_owner_survives_a_refusal_for_it(self) -> None:
        owner = FakeConnection()
        self.registry.register(TOKENS["node-a"], owner, self.cert_a)
        self.registry.register(TOKENS["node-a"], FakeConnection(), self.cert_b)
        identity = self.registry.identity("node-a")
        self.assertEqual((identity["ok"], identity["refusals"]), (True, 1))
        self.registry.disconnected(owner)
        # Once the owner is gone, the last recorded check is the refusal.
        self.assertEqual(self.registry.identity("node-a")["ok"], False)

    def test_mode(self) -> None:
        self.assertEqual(self.registry.mode, "managed")


class CheckIdentityTests(SynchronousTestCase):
    def test_legacy_records_without_judging(self) -> None:
        ca = pki.make_ca("check CA")
        cert = pki.issue(ca, dns_names=["anything.example.org"], client=True)[1]
        check = check_identity(WORKLOAD_A, cert, enforce=False)
        self.assertEqual(
            (check.checked, check.ok, check.presented, check.certificate, check.reason),
            (False, None, ("anything.example.org",), True, ""),
        )

    def test_case_does_not_matter(self) -> None:
        ca = pki.make_ca("check CA")
        cert = pki.issue(ca, dns_names=["Node-A.Node.IOP.Internal"], client=True)[1]
        self.assertTrue(check_identity(WORKLOAD_A, cert, enforce=True).ok)
