# -*- test-case-name: iop.test.edge.test_metrics -*-
"""
``GET /metrics`` on the admin app of a real Edge service: the text parses, gauges equal
``/status`` and counters equal the known traffic and node events exactly.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import (
    Budget,
    ClientAPIConfig,
    ClientKey,
    ClusterConfig,
    NodeToken,
    TelemetryConfig,
)
from iop.edge.admin import AdminApp
from iop.edge.events import EventBus, NodeEvent, NodeEventKind, RequestFinished
from iop.edge.metrics import NODE_STATES, PROVIDER_GAUGES, EdgeMetrics
from iop.edge.quota import Charge, Demand, InProcessQuotaTable, QuotaGate
from iop.edge.tap import EdgeService
from iop.runtime.events import Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# The GenAI conventions' labels beside IOP's own (each a function of IOP's labels): these tests
# read IOP's; iop.test.edge.test_metrics_genai reads the conventions'.
CONVENTION_LABELS = frozenset(
    {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"}
    | {"gen_ai_token_type"}
)


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Metric family types by name, and every sample by (name, sorted labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in CONVENTION_LABELS}
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return types, samples


def finished(
    model: str = "pool",
    provider: str = "a-chat",
    node: str = "node-a",
    usage: Usage | None = None,
    outcome: str = "complete",
    **fields: Any,
) -> RequestFinished:
    """A finished chat request on the OpenAI surface, as the ingress records it."""
    values: dict[str, Any] = {
        "surface": "openai",
        "operation": "chat",
        "status": 200,
        "duration": 0.5,
        "target": "demo-model",
        **fields,
    }
    return RequestFinished(
        model=model, provider_id=provider, node_id=node, usage=usage, outcome=outcome, **values
    )


def where(
    model: str = "pool", provider: str = "a-chat", node: str = "node-a", **extra: str
) -> tuple[tuple[str, str], ...]:
    """The sorted labels of a chat request on the OpenAI surface, plus ``extra``."""
    labels = {
        "model": model,
        "provider": provider,
        "node": node,
        "operation": "chat",
        "surface": "openai",
        **extra,
    }
    return tuple(sorted(labels.items()))


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

    def publish(self, *events: RequestFinished) -> None:
        for event in events:
            self.edge.bus.publish(event)

    def test_requests_and_tokens_count_known_traffic(self) -> None:
        n = 7
        self.publish(*(finished(usage=Usage(10 + i, 5)) for i in range(n)))
        self.publish(finished(usage=Usage(3, 1, 2, 1), outcome="error", status=502))
        self.publish(finished(provider="b-chat", node="node-b", outcome="cancelled", status=0))
        types, samples = self.scrape()
        self.assertEqual(types["iop_requests"], "counter")
        self.assertEqual(types["gen_ai_client_token_usage"], "histogram")
        base = (("model", "pool"), ("node", "node-a"))

        def requests(outcome: str, status: str, **labels: str) -> float:
            return samples[("iop_requests_total", where(outcome=outcome, status=status, **labels))]

        def tokens(suffix: str, token_type: str) -> float:
            labels = (*base, ("provider", "a-chat"), ("type", token_type))
            return samples[(f"gen_ai_client_token_usage_{suffix}", labels)]

        self.assertEqual(requests("complete", "200"), n)
        self.assertEqual(requests("error", "502"), 1)
        self.assertEqual(requests("cancelled", "0", node="node-b", provider="b-chat"), 1)
        self.assertEqual(tokens("count", "input"), n + 1)
        self.assertEqual(tokens("sum", "input"), sum(10 + i for i in range(n)) + 3)
        self.assertEqual(tokens("count", "output"), n + 1)
        self.assertEqual(tokens("sum", "output"), 5 * n + 1)
        # Reported only by one request: only it is observed (never estimated as 0).
        self.assertEqual((tokens("count", "reasoning"), tokens("sum", "reasoning")), (1, 2))
        self.assertEqual((tokens("count", "cached_input"), tokens("sum", "cached_input")), (1, 1))
        # A request without reported usage observes no tokens.
        b_tokens = [
            k for k in samples if k[0].startswith("gen_ai_client") and ("node", "node-b") in k[1]
        ]
        self.assertEqual(b_tokens, [])
        self.assertEqual(samples[("iop_event_bus_dropped_events_total", ())], 0)
        # Every generation request is one duration observation, whatever its end.
        self.assertEqual(
            samples[("gen_ai_server_request_duration_seconds_count", where(status="200"))], n
        )
        self.assertEqual(
            samples[("gen_ai_server_request_duration_seconds_sum", where(status="200"))], 0.5 * n
        )
        self.assertEqual(
            samples[("gen_ai_server_request_duration_seconds_count", where(status="502"))], 1
        )

    def test_stream_timings(self) -> None:
        # A successful stream: 100 ms to the first token, then 9 more tokens in 0.9 s.
        self.publish(
            finished(usage=Usage(4, 10), stream=True, duration=1.0, time_to_first_token=0.1)
        )
        # Not observed: a failed stream, a stream without usage (no per-token time), a
        # collected answer (no first-token time), a 4xx answer.
        self.publish(
            finished(outcome="error", stream=True, time_to_first_token=0.2, usage=Usage(1, 5)),
            finished(stream=True, time_to_first_token=0.3),
            finished(usage=Usage(1, 5)),
            finished(status=429, stream=True, time_to_first_token=0.4, outcome="refused"),
        )
        types, samples = self.scrape()
        self.assertEqual(types["gen_ai_server_time_to_first_token_seconds"], "histogram")
        ttft = samples[("gen_ai_server_time_to_first_token_seconds_count", where())]
        self.assertEqual(ttft, 2)
        self.assertAlmostEqual(
            samples[("gen_ai_server_time_to_first_token_seconds_sum", where())], 0.4
        )
        self.assertEqual(samples[("gen_ai_server_time_per_output_token_seconds_count", where())], 1)
        self.assertAlmostEqual(
            samples[("gen_ai_server_time_per_output_token_seconds_sum", where())], 0.1
        )
        self.assertEqual(
            samples[("gen_ai_server_time_per_output_token_seconds_bucket", where(le="0.1"))],
            1,
        )

    def test_queue_wait_and_client_errors(self) -> None:
        self.publish(
            finished(queue_wait=0.0),
            finished(queue_wait=2.0),
            finished(model="direct", provider="", node="node-a"),  # a direct route: no pool
            RequestFinished(
                "openai", "chat", 429, "refused", 30.0, model="pool", error_code="queue_timeout"
            ),
            RequestFinished(
                "anthropic", "messages", 401, "refused", 0.0, error_code="authentication_error"
            ),
            RequestFinished(
                "openai", "unrouted", 404, "refused", 0.0, error_code="invalid_request_error"
            ),
        )
        _, samples = self.scrape()
        self.assertEqual(samples[("iop_queue_wait_seconds_count", (("model", "pool"),))], 2)
        self.assertEqual(samples[("iop_queue_wait_seconds_sum", (("model", "pool"),))], 2.0)
        self.assertNotIn(("iop_queue_wait_seconds_count", (("model", "direct"),)), samples)

        def errors(surface: str, operation: str, status: str, code: str) -> float:
            labels = {"surface": surface, "operation": operation, "status": status, "code": code}
            return samples[("iop_client_errors_total", tuple(sorted(labels.items())))]

        self.assertEqual(errors("openai", "chat", "429", "queue_timeout"), 1)
        self.assertEqual(errors("anthropic", "messages", "401", "authentication_error"), 1)
        self.assertEqual(errors("openai", "unrouted", "404", "invalid_request_error"), 1)
        self.assertEqual(
            sum(v for (name, _), v in samples.items() if name == "iop_client_errors_total"), 3
        )
        # Not a generation: counted, but no gen_ai_server_* observation.
        unrouted = [
            k
            for k in samples
            if k[0].startswith("gen_ai_server") and ("operation", "unrouted") in k[1]
        ]
        self.assertEqual(unrouted, [])

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

    def test_per_key_requests_tokens_and_cost(self) -> None:
        usage = Usage(100, 20, cached_input_tokens=80, reasoning_tokens=5)
        self.publish(finished(usage=usage, key="alice", team="backend", cost_micros=1_500_000))
        self.publish(finished(usage=Usage(1, 1), key="alice", team="backend", cost_micros=500_000))
        self.publish(finished(key="alice", team="backend", outcome="refused", status=429))
        self.publish(finished(usage=Usage(7, 7), key="bob"))
        self.publish(finished(usage=Usage(9, 9)))  # auth off: no key, not counted per key
        types, samples = self.scrape()
        self.assertEqual(types["iop_key_tokens"], "counter")

        def sample(name: str, **labels: str) -> float:
            return samples[(name, tuple(sorted(labels.items())))]

        alice = {"key": "alice", "team": "backend"}
        self.assertEqual(sample("iop_key_requests_total", **alice, outcome="complete"), 2)
        self.assertEqual(sample("iop_key_requests_total", **alice, outcome="refused"), 1)
        for token_type, count in (("input", 101), ("output", 21), ("cached_input", 80)):
            self.assertEqual(sample("iop_key_tokens_total", **alice, type=token_type), count)
        self.assertEqual(sample("iop_key_tokens_total", **alice, type="reasoning"), 5)
        self.assertEqual(sample("iop_key_cost_total", **alice), 2.0)
        self.assertEqual(sample("iop_key_tokens_total", key="bob", team="", type="input"), 7)
        self.assertNotIn(("iop_key_cost_total", (("key", "bob"), ("team", ""))), samples)
        keys = {dict(labels).get("key") for name, labels in samples if name.startswith("iop_key")}
        self.assertEqual(keys, {"alice", "bob"})

    def test_no_secret_or_principal_in_labels(self) -> None:
        self.connect("node-a")
        self.publish(finished(usage=Usage(1, 1)))
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
        bus.publish(finished("m", "p", "n"))
        clock.advance(0)
        _, samples = parse(metrics.render().decode())
        self.assertEqual(samples[("iop_node_events_total", (("kind", "config_refreshed"),))], 1)
        labels = where("m", "p", "n", outcome="complete", status="200")
        self.assertEqual(samples[("iop_requests_total", labels)], 1)

    def test_budget_gauges_read_at_scrape_time(self) -> None:
        clock = MemoryReactorClock()
        clock.advance(1_700_000_000)
        key = ClientKey(
            "alice",
            NodeToken.from_plaintext("sk-a"),
            budgets=(Budget("month", tokens=1_000, cost_micros=5_000_000),),
        )
        gate = QuotaGate(ClientAPIConfig(listen=None, keys=(key,)), InProcessQuotaTable(clock))
        metrics = EdgeMetrics(lambda: {"nodes": [], "providers": []}, budgets=gate.standing)
        held = self.successResultOf(gate.reserve(key, Demand(300, 1_000_000)))

        def gauge(name: str, unit: str) -> float:
            _, samples = parse(metrics.render().decode())
            labels = (("period", "month"), ("subject", "key:alice"), ("unit", unit))
            return samples[(f"iop_key_budget_{name}", labels)]

        self.assertEqual(gauge("limit", "tokens"), 1_000)
        self.assertEqual(gauge("used", "tokens"), 300)
        self.assertEqual(gauge("remaining", "tokens"), 700)
        self.assertEqual(gauge("remaining", "cost"), 4.0)
        held.settle(Charge(120, 250_000))
        self.assertEqual(gauge("remaining", "tokens"), 880)
        self.assertEqual(gauge("used", "cost"), 0.25)

    def test_without_metrics_503(self) -> None:
        http: Any = StubTreq(AdminApp(lambda: {}).resource())
        response = self.successResultOf(http.get("http://admin/metrics"))
        self.assertEqual(response.code, 503)


class DocumentedTests(SynchronousTestCase):
    def test_every_metric_is_in_the_readme_table_and_no_other(self) -> None:
        root = Path(__file__).resolve().parents[3]
        readme = (root / "README.md").read_text()
        section = readme[readme.index("### `/metrics`") :]
        section = section[: section.index("\n### ", 1)]
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))
        exposed = set()
        # An Edge alone, one in a cluster (its cluster families only there) and one tracing.
        cluster = ClusterConfig(redis="unix:///nonexistent/redis.sock", edge_id="e1")
        telemetry = TelemetryConfig("http://127.0.0.1:9/v1/traces")
        for config in (
            edge_config(),
            dataclasses.replace(edge_config(), cluster=cluster),
            dataclasses.replace(edge_config(), telemetry=telemetry),
        ):
            edge = EdgeService(config, MemoryReactorClock())
            for family in edge.metrics.registry.collect():
                exposed.add(family.name + "_total" if family.type == "counter" else family.name)
            if edge.telemetry.processor is not None:
                edge.telemetry.processor.shutdown()
        self.assertEqual(exposed - documented, set(), "exposed but not in the README")
        self.assertEqual(documented - exposed, set(), "in the README but not exposed")


class ClusterMetricsTests(SynchronousTestCase):
    def test_the_cluster_view_is_exposed(self) -> None:
        view = {
            "redis": "up",
            "leases_lost": 2,
            "edges": [{"id": "e1", "queued": 3}, {"id": "e2", "queued": 0}],
            "providers": {"p": {"in_flight": 4, "long_in_flight": 1}},
        }
        metrics = EdgeMetrics(lambda: {"cluster": view}, lambda: 0)
        _, samples = parse(metrics.render().decode())
        self.assertEqual(samples[("iop_cluster_redis_up", ())], 1)
        self.assertEqual(samples[("iop_cluster_provider_in_flight", (("provider", "p"),))], 4)
        self.assertEqual(samples[("iop_cluster_edge_queued", (("edge", "e1"),))], 3)
        self.assertEqual(samples[("iop_cluster_leases_lost_total", ())], 2)
        view["redis"] = "unreachable"
        _, samples = parse(metrics.render().decode())
        self.assertEqual(samples[("iop_cluster_redis_up", ())], 0)
        alone = EdgeMetrics(lambda: {}, lambda: 0).render().decode()
        self.assertNotIn("iop_cluster_", alone)
