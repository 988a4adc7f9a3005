# -*- test-case-name: iop.test.edge.test_metrics -*-
"""
``GET /metrics`` on the admin app of a real Edge service: the text parses, gauges equal
``/status`` and counters equal the known traffic and node events exactly.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.admin import AdminApp
from iop.edge.events import EventBus, NodeEvent, NodeEventKind, UsageEvent
from iop.edge.gateway import Placement
from iop.edge.metrics import NODE_STATES, PROVIDER_GAUGES, EdgeMetrics
from iop.edge.tap import EdgeService
from iop.runtime.events import Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Metric family types by name, and every sample by (name, sorted labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return types, samples


def placement(model: str = "pool", provider: str = "a-chat", node: str = "node-a") -> Placement:
    return Placement(
        model=model,
        node_id=node,
        adapter="fake",
        target="demo-model",
        provider_type="openai_compat",
        provider_id=provider,
        principal="secret-principal-name",
    )


class EdgeMetricsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.edge = EdgeService(edge_config(), self.clock)
        self.http: Any = StubTreq(self.edge.admin.resource())

    def get(self, path: str) -> tuple[int, list[str], bytes]:
        response = self.successResultOf(self.http.get("http://admin" + path))
        body = self.successResultOf(response.content())
        return response.code, response.headers.getRawHeaders("content-type"), body

    def scrape(self) -> tuple[dict[str, str], Samples]:
        self.clock.advance(0)  # the bus delivers on a later reactor turn
        code, content_type, body = self.get("/metrics")
        self.assertEqual(code, 200)
        self.assertEqual(content_type, [CONTENT_TYPE_LATEST])
        return parse(body.decode())

    def status(self) -> dict[str, Any]:
        code, _, body = self.get("/status")
        self.assertEqual(code, 200)
        return json.loads(body)  # type: ignore[no-any-return]

    def connect(self, node_id: str) -> None:
        conn = FakeConnection()
        self.edge.registry.register(TOKENS[node_id], conn)
        self.edge.registry.ready(node_id, conn)

    def assertGaugesMatchStatus(self, samples: Samples) -> None:
        status = self.status()
        fields = [suffix for suffix, _, _ in PROVIDER_GAUGES]
        for entry in status["providers"]:
            labels = (("node", entry["node_id"]), ("provider", entry["id"]))
            for field in fields:
                self.assertEqual(
                    samples[(f"iop_provider_{field}", labels)], entry[field], (entry["id"], field)
                )
        for state in NODE_STATES:
            expected = sum(1 for n in status["nodes"] if n["state"] == state)
            self.assertEqual(samples[("iop_node_connections", (("state", state),))], expected)

    def test_gauges_equal_status_with_leases_held_and_queued(self) -> None:
        self.connect("node-a")
        self.edge.registry.register(TOKENS["node-b"], FakeConnection())  # pending
        leases = [self.edge.pool.acquire("pool") for _ in range(3)]  # a-chat has capacity 2
        types, samples = self.scrape()
        self.assertEqual(types["iop_provider_in_flight"], "gauge")
        self.assertEqual(types["iop_node_connections"], "gauge")
        self.assertEqual(
            samples[("iop_provider_in_flight", (("node", "node-a"), ("provider", "a-chat")))], 2
        )
        self.assertEqual(
            samples[("iop_provider_queued", (("node", "node-a"), ("provider", "a-chat")))], 1
        )
        self.assertEqual(samples[("iop_node_connections", (("state", "ready"),))], 1)
        self.assertEqual(samples[("iop_node_connections", (("state", "pending"),))], 1)
        self.assertGaugesMatchStatus(samples)
        self.successResultOf(leases[0]).release()
        self.assertGaugesMatchStatus(self.scrape()[1])

    def test_gauges_before_any_node(self) -> None:
        _, samples = self.scrape()
        self.assertEqual(samples[("iop_node_connections", (("state", "disconnected"),))], 2)
        self.assertGaugesMatchStatus(samples)

    def test_requests_and_tokens_count_known_traffic(self) -> None:
        n = 7
        for i in range(n):
            self.edge.request_finished(placement(), Usage(10 + i, 5), "complete")
        self.edge.request_finished(placement(), Usage(3, 1, 2, 1), "error")
        self.edge.request_finished(placement(provider="b-chat", node="node-b"), None, "cancelled")
        types, samples = self.scrape()
        self.assertEqual(types["iop_requests"], "counter")
        self.assertEqual(types["gen_ai_client_token_usage"], "histogram")
        base = (("model", "pool"), ("node", "node-a"))

        def requests(outcome: str, node: str = "node-a", provider: str = "a-chat") -> float:
            labels = (("model", "pool"), ("node", node), ("outcome", outcome))
            return samples[("iop_requests_total", (*labels, ("provider", provider)))]

        def tokens(suffix: str, token_type: str) -> float:
            labels = (*base, ("provider", "a-chat"), ("type", token_type))
            return samples[(f"gen_ai_client_token_usage_{suffix}", labels)]

        self.assertEqual(requests("complete"), n)
        self.assertEqual(requests("error"), 1)
        self.assertEqual(requests("cancelled", "node-b", "b-chat"), 1)
        self.assertEqual(tokens("count", "input"), n + 1)
        self.assertEqual(tokens("sum", "input"), sum(10 + i for i in range(n)) + 3)
        self.assertEqual(tokens("count", "output"), n + 1)
        self.assertEqual(tokens("sum", "output"), 5 * n + 1)
        # Reported only by one request: only it is observed (never estimated as 0).
        self.assertEqual((tokens("count", "reasoning"), tokens("sum", "reasoning")), (1, 2))
        self.assertEqual((tokens("count", "cached_input"), tokens("sum", "cached_input")), (1, 1))
        # A request without reported usage observes no tokens.
        b_tokens = [k for k in samples if k[0].startswith("gen_ai") and ("node", "node-b") in k[1]]
        self.assertEqual(b_tokens, [])
        self.assertEqual(samples[("iop_event_bus_dropped_events_total", ())], 0)

    def test_node_events_by_kind(self) -> None:
        _, samples = self.scrape()
        for kind in ("registered", "connected", "disconnected", "rejected"):
            self.assertEqual(samples[("iop_node_events_total", (("kind", kind),))], 0)
        self.connect("node-a")
        self.edge.registry.register("no-such-token", FakeConnection())
        _, samples = self.scrape()
        self.assertEqual(samples[("iop_node_events_total", (("kind", "registered"),))], 1)
        self.assertEqual(samples[("iop_node_events_total", (("kind", "connected"),))], 1)
        self.assertEqual(samples[("iop_node_events_total", (("kind", "rejected"),))], 1)

    def test_no_secret_or_principal_in_labels(self) -> None:
        self.connect("node-a")
        self.edge.request_finished(placement(), Usage(1, 1), "complete")
        self.clock.advance(0)
        _, _, body = self.get("/metrics")
        for secret in (*TOKENS.values(), "secret-principal-name"):
            self.assertNotIn(secret.encode(), body)

    def test_own_registry_not_the_global_one(self) -> None:
        self.assertIsInstance(self.edge.metrics.registry, CollectorRegistry)
        self.assertIsNot(self.edge.metrics.registry, REGISTRY)
        # Two Edges in one process do not collide on metric names.
        other = EdgeService(edge_config(), self.clock)
        self.assertIsNot(other.metrics.registry, self.edge.metrics.registry)
        self.assertNotIn(b"iop_requests", generate_latest())


class StandaloneTests(SynchronousTestCase):
    def test_metrics_on_a_plain_bus(self) -> None:
        clock = MemoryReactorClock()
        bus = EventBus(clock)
        metrics = EdgeMetrics(lambda: {"nodes": [], "providers": []}, bus.dropped)
        bus.subscribe(metrics.observe)
        bus.publish(NodeEvent(NodeEventKind.CONFIG_REFRESHED, "node-a", outcome="applied"))
        bus.publish(UsageEvent("m", "p", "n", "t", "", "complete"))
        clock.advance(0)
        _, samples = parse(metrics.render().decode())
        self.assertEqual(samples[("iop_node_events_total", (("kind", "config_refreshed"),))], 1)
        labels = (("model", "m"), ("node", "n"), ("outcome", "complete"), ("provider", "p"))
        self.assertEqual(samples[("iop_requests_total", labels)], 1)

    def test_without_metrics_503(self) -> None:
        http: Any = StubTreq(AdminApp(lambda: {}).resource())
        response = self.successResultOf(http.get("http://admin/metrics"))
        self.assertEqual(response.code, 503)
