"""Status snapshot rules and the admin HTTP surface."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import EdgeConfig, EdgeSecurity
from iop.edge.admin import AdminApp
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.status import snapshot
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.testing import pki
from iop.wire.runtime_pb2 import LeaseSupport

# What a managed node announces of its lease keys (these registries check none).
ANNOUNCED = LeaseSupport(recipient_key_id="rk", kem="x25519", issuer_key_id="ik")

COUNTERS = ("in_flight", "long_in_flight", "queued", "long_queued")


class FixedCounters:
    def counters(self, node_id: str, provider_id: str) -> dict[str, int]:
        return {"in_flight": 1, "long_in_flight": 1, "queued": 3, "long_queued": 2}


class SnapshotTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
        )

    def providers(self, snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {p["id"]: p for p in snap["providers"]}

    def assertOffline(self, entry: dict[str, Any]) -> None:
        self.assertEqual(
            (entry["status"], entry["health"], entry["capacity"]), ("unavailable", "offline", 0)
        )
        self.assertEqual([entry[c] for c in COUNTERS], [0, 0, 0, 0])

    def test_disconnected_nodes_stay_in_catalog(self) -> None:
        snap = snapshot(self.config, self.registry, FixedCounters())
        self.assertEqual(
            [(n["id"], n["connected"], n["state"]) for n in snap["nodes"]],
            [("node-a", False, "disconnected"), ("node-b", False, "disconnected")],
        )
        providers = self.providers(snap)
        self.assertEqual(set(providers), {"a-chat", "a-off", "b-chat"})
        self.assertOffline(providers["a-chat"])
        self.assertOffline(providers["b-chat"])

    def test_pending_node_is_not_connected(self) -> None:
        self.registry.register(TOKENS["node-a"], FakeConnection())
        snap = snapshot(self.config, self.registry, FixedCounters())
        self.assertEqual(snap["nodes"][0]["connected"], False)
        self.assertEqual(snap["nodes"][0]["state"], "pending")
        self.assertOffline(self.providers(snap)["a-chat"])

    def test_ready_node_shows_capacity_and_live_counters(self) -> None:
        conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], conn)
        self.registry.ready("node-a", conn)
        snap = snapshot(self.config, self.registry, FixedCounters())
        self.assertTrue(snap["nodes"][0]["connected"])
        entry = self.providers(snap)["a-chat"]
        self.assertEqual(
            (entry["status"], entry["health"], entry["capacity"]), ("available", "healthy", 2)
        )
        self.assertEqual([entry[c] for c in COUNTERS], [1, 1, 3, 2])
        self.assertOffline(self.providers(snap)["b-chat"])

    def test_disabled_provider_everywhere(self) -> None:
        for connect in (False, True):
            if connect:
                conn = FakeConnection()
                self.registry.register(TOKENS["node-a"], conn)
                self.registry.ready("node-a", conn)
            entry = self.providers(snapshot(self.config, self.registry, FixedCounters()))["a-off"]
            self.assertEqual(
                (entry["status"], entry["health"], entry["capacity"]), ("disabled", "disabled", 0)
            )
            self.assertEqual([entry[c] for c in COUNTERS], [0, 0, 0, 0])

    def test_counters_zero_without_dispatch(self) -> None:
        conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], conn)
        self.registry.ready("node-a", conn)
        entry = self.providers(snapshot(self.config, self.registry))["a-chat"]
        self.assertEqual([entry[c] for c in COUNTERS], [0, 0, 0, 0])

    def test_disconnect_returns_to_offline(self) -> None:
        conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], conn)
        self.registry.ready("node-a", conn)
        self.registry.disconnected(conn)
        self.assertOffline(
            self.providers(snapshot(self.config, self.registry, FixedCounters()))["a-chat"]
        )

    def test_no_secrets(self) -> None:
        text = json.dumps(snapshot(self.config, self.registry))
        for token in TOKENS.values():
            self.assertNotIn(token, text)


class IdentityStatusTests(SynchronousTestCase):
    """The security mode once, and each node's identity check; names only, no key material."""

    def build(self, config: EdgeConfig) -> NodeRegistry:
        clock = Clock()
        return NodeRegistry(config, lambda n: build_node_payload(config, n), EventBus(clock), clock)

    def nodes(self, config: EdgeConfig, registry: NodeRegistry) -> dict[str, dict[str, Any]]:
        return {n["id"]: n for n in snapshot(config, registry)["nodes"]}

    def test_legacy_before_any_connection(self) -> None:
        config = edge_config()
        registry = self.build(config)
        self.assertEqual(
            snapshot(config, registry)["edge"],
            {
                "id": "edge-test",
                "mode": "legacy",
                "draining": False,
                "draining_since_unix_ms": None,
            },
        )
        self.assertEqual(
            self.nodes(config, registry)["node-b"]["identity"],
            {
                "checked": False,
                "ok": None,
                "expected": "node-b.node.iop.internal",
                "presented": [],
                "certificate": False,
                "reason": "",
                "refusals": 0,
            },
        )

    def test_a_node_that_cannot_verify_leases(self) -> None:
        """Managed: a legacy node is refused at registration, and /status says why."""
        ca = pki.make_ca("status test CA")
        cert_a = pki.issue(ca, dns_names=["node-a.node.iop.internal"], client=True)[1]
        config = dataclasses.replace(edge_config(), security=EdgeSecurity(mode="managed"))
        registry = self.build(config)
        registry.register(TOKENS["node-a"], FakeConnection(), cert_a)
        node = self.nodes(config, registry)["node-a"]
        self.assertEqual((node["connected"], node["state"]), (False, "disconnected"))
        self.assertEqual(node["last_refusal"]["code"], "lease_support")
        self.assertIn("no credential lease support", node["last_refusal"]["reason"])
        # The identity itself was fine.
        self.assertEqual((node["identity"]["ok"], node["identity"]["refusals"]), (True, 0))

    def test_managed_accepted_and_refused(self) -> None:
        ca = pki.make_ca("status test CA")
        cert_a = pki.issue(ca, dns_names=["node-a.node.iop.internal"], client=True)[1]
        config = dataclasses.replace(edge_config(), security=EdgeSecurity(mode="managed"))
        registry = self.build(config)
        conn = FakeConnection()
        registry.register(TOKENS["node-a"], conn, cert_a, ANNOUNCED)
        registry.ready("node-a", conn)
        registry.register(TOKENS["node-b"], FakeConnection(), cert_a, ANNOUNCED)
        snap = snapshot(config, registry)
        self.assertEqual(snap["edge"]["mode"], "managed")
        nodes = {n["id"]: n for n in snap["nodes"]}
        a, b = nodes["node-a"]["identity"], nodes["node-b"]["identity"]
        self.assertEqual(
            (a["checked"], a["ok"], a["presented"], a["reason"], nodes["node-a"]["connected"]),
            (True, True, ["node-a.node.iop.internal"], "", True),
        )
        self.assertEqual(
            (b["checked"], b["ok"], b["expected"], b["presented"], b["refusals"]),
            (True, False, "node-b.node.iop.internal", ["node-a.node.iop.internal"], 1),
        )
        self.assertEqual(nodes["node-b"]["state"], "disconnected")
        self.assertIsNone(nodes["node-a"]["last_refusal"])
        self.assertEqual(nodes["node-b"]["last_refusal"]["code"], "workload_identity")
        self.assertEqual(nodes["node-b"]["last_refusal"]["reason"], b["reason"])
        text = json.dumps(snap)
        for marker in ("BEGIN", "PRIVATE", "KEY-----"):
            self.assertNotIn(marker, text)
        for token in TOKENS.values():
            self.assertNotIn(token, text)


class AdminTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.body: dict[str, Any] = {"nodes": [], "providers": []}
        self.treq: Any = StubTreq(AdminApp(lambda: self.body).resource())

    def get(self, path: str) -> tuple[int, Any]:
        response = self.successResultOf(self.treq.get("http://admin" + path))
        body = self.successResultOf(response.json())
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        return response.code, body

    def test_healthz(self) -> None:
        self.assertEqual(self.get("/healthz"), (200, {"status": "ok"}))

    def test_status(self) -> None:
        self.assertEqual(self.get("/status"), (200, self.body))

    def test_unknown_path_is_json_404(self) -> None:
        code, body = self.get("/nope")
        self.assertEqual(code, 404)
        self.assertEqual(body["error"]["code"], 404)

    def test_wrong_method_is_405(self) -> None:
        response = self.successResultOf(self.treq.post("http://admin/status"))
        self.assertEqual(response.code, 405)
