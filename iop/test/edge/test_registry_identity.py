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
from iop.wire.runtime_pb2 import LeaseSupport, NodeConfigPayload, RegisterRejectCode

WORKLOAD_A = "node-a.node.iop.internal"
# What a managed node announces of its lease keys (the registry here has no key check).
ANNOUNCED = LeaseSupport(recipient_key_id="rk-a", kem="x25519", issuer_key_id="ik")


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
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_b, ANNOUNCED)
        assert isinstance(outcome, RegisterRejected), outcome
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertEqual(outcome.node_id, "node-a")
        self.assertIsNone(self.registry.ownership_of(conn))
        self.assertEqual(self.built, [])
        # Nothing of the refused attempt was kept: (the transport closes that connection; here)
        # the same connection object registers afresh.
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_a, ANNOUNCED)
        self.assertIsInstance(outcome, RegisterAccepted)
        self.registry.ready("node-a", conn)
        # The refused attempt took no generation.
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])

    def test_events(self) -> None:
        self.registry.register(TOKENS["node-a"], FakeConnection(), None, ANNOUNCED)
        self.registry.register(TOKENS["node-a"], FakeConnection(), self.cert_a, ANNOUNCED)
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
        self.registry.register(TOKENS["node-a"], owner, self.cert_a, ANNOUNCED)
        self.registry.register(TOKENS["node-a"], FakeConnection(), self.cert_b, ANNOUNCED)
        identity = self.registry.identity("node-a")
        self.assertEqual((identity["ok"], identity["refusals"]), (True, 1))
        self.registry.disconnected(owner)
        # Once the owner is gone, the last recorded check is the refusal.
        self.assertEqual(self.registry.identity("node-a")["ok"], False)

    def test_mode(self) -> None:
        self.assertEqual(self.registry.mode, "managed")


class LeaseSupportTests(SynchronousTestCase):
    """A managed Edge accepts only a node that can verify its leases (after the identity)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.config = dataclasses.replace(edge_config(), security=EdgeSecurity(mode="managed"))
        self.bus = EventBus(self.clock)
        self.events: list[NodeEvent] = []
        self.bus.subscribe(self.events.append)
        self.checked: list[tuple[str, LeaseSupport]] = []
        self.built: list[str] = []

        def check(node_id: str, support: LeaseSupport) -> str:
            self.checked.append((node_id, support))
            return "" if support == ANNOUNCED else "the node trusts issuer key 'other'"

        def build(node: NodeConfig) -> NodeConfigPayload:
            self.built.append(node.id)
            return build_node_payload(self.config, node)

        self.registry = NodeRegistry(self.config, build, self.bus, self.clock, lease_check=check)
        ca = pki.make_ca("lease support CA")
        self.cert_a = pki.issue(ca, dns_names=[WORKLOAD_A], client=True)[1]
        self.cert_b = pki.issue(ca, dns_names=["node-b.node.iop.internal"], client=True)[1]

    def refused(self, support: LeaseSupport | None) -> RegisterRejected:
        conn = FakeConnection()
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_a, support)
        assert isinstance(outcome, RegisterRejected), outcome
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_LEASE_SUPPORT)
        self.assertEqual(outcome.node_id, "node-a")
        self.assertIsNone(self.registry.ownership_of(conn))
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertEqual(self.built, [], "no payload is built for a refused node")
        return outcome

    def test_a_legacy_node_is_refused(self) -> None:
        outcome = self.refused(None)
        self.assertIn("no credential lease support", outcome.reason)
        self.assertIn("security.mode", outcome.reason)
        self.assertEqual(self.checked, [], "nothing to check without an announcement")
        self.assertEqual(
            self.registry.last_refusal("node-a"),
            {"code": "lease_support", "reason": outcome.reason, "at_unix_ms": 1_800_000_000_000},
        )
        self.assertEqual(self.registry.stats().rejections["lease_support"], 1)
        self.clock.advance(0)
        self.assertEqual(
            [(e.kind, e.node_id, e.reason) for e in self.events],
            [(NodeEventKind.REJECTED, "node-a", outcome.reason)],
        )

    def test_other_keys_are_refused(self) -> None:
        other = LeaseSupport(recipient_key_id="rk-a", kem="x25519", issuer_key_id="other")
        outcome = self.refused(other)
        self.assertEqual(self.checked, [("node-a", other)])
        self.assertIn("issuer key 'other'", outcome.reason)

    def test_identity_is_checked_first(self) -> None:
        outcome = self.registry.register(TOKENS["node-a"], FakeConnection(), self.cert_b, None)
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY)
        self.assertEqual(self.registry.last_refusal("node-a")["code"], "workload_identity")  # type: ignore[index]

    def test_the_announced_keys_register_and_the_last_refusal_stays(self) -> None:
        reason = self.refused(None).reason
        self.clock.advance(5)
        conn = FakeConnection()
        outcome = self.registry.register(TOKENS["node-a"], conn, self.cert_a, ANNOUNCED)
        self.assertIsInstance(outcome, RegisterAccepted)
        self.assertEqual(self.checked, [("node-a", ANNOUNCED)])
        # The last refusal is history: it stays, with its time, beside the live state.
        self.assertEqual(self.registry.last_refusal("node-a")["reason"], reason)  # type: ignore[index]
        self.assertIsNone(self.registry.last_refusal("node-b"))

    def test_a_legacy_edge_neither_asks_nor_checks(self) -> None:
        registry = NodeRegistry(
            edge_config(),
            lambda n: build_node_payload(edge_config(), n),
            self.bus,
            self.clock,
            lease_check=lambda node_id, support: "never consulted",
        )
        for support in (None, ANNOUNCED):
            conn = FakeConnection()
            outcome = registry.register(TOKENS["node-a"], conn, None, support)
            self.assertIsInstance(outcome, RegisterAccepted)
            registry.disconnected(conn)

    def test_an_unknown_token_names_no_node(self) -> None:
        self.registry.register("wrong", FakeConnection(), self.cert_a, None)
        self.assertIsNone(self.registry.last_refusal("node-a"))


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
