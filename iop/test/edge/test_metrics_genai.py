"""
/metrics against the OpenTelemetry GenAI semantic conventions (v1.41): the conventions'
attributes as Prometheus labels on the gen_ai_* histograms, the Edge→provider leg, trace-id
exemplars in the OpenMetrics format, and the spans the trace exporter dropped.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.admin import AdminApp
from iop.edge.metrics import EdgeMetrics
from iop.runtime.events import Usage
from iop.test.edge.fixtures import edge_config
from iop.test.edge.test_metrics import finished
from iop.test.telemetry.support import TRACE_ID


def metrics(**kwargs: Any) -> EdgeMetrics:
    m = EdgeMetrics(lambda: {"nodes": [], "providers": []}, **kwargs)
    m.use_config(edge_config())
    return m


def samples(m: EdgeMetrics) -> list[Any]:
    body, content_type = m.render_for("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    return [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]


class ConventionTests(SynchronousTestCase):
    def test_attributes(self) -> None:
        m = metrics()
        m.observe(finished(usage=Usage(10, 5)))
        m.observe(finished(status=502, outcome="error"))
        found = {
            s.name: s.labels
            for s in samples(m)
            if s.name.startswith("gen_ai_server_request_duration_seconds_count")
            and s.labels["status"] == "200"
        }
        labels = found["gen_ai_server_request_duration_seconds_count"]
        self.assertEqual(labels["gen_ai_operation_name"], "chat")
        self.assertEqual(labels["gen_ai_request_model"], "pool")
        self.assertEqual(labels["error_type"], "")
        self.assertIn("gen_ai_provider_name", labels)
        self.assertNotIn("gen_ai_system", labels)
        failed = [
            s
            for s in samples(m)
            if s.name == "gen_ai_server_request_duration_seconds_count"
            and s.labels["status"] == "502"
        ]
        self.assertEqual(failed[0].labels["error_type"], "502")
        tokens = {
            s.labels["gen_ai_token_type"]: s.value
            for s in samples(m)
            if s.name == "gen_ai_client_token_usage_sum"
        }
        self.assertEqual(tokens, {"input": 10, "output": 5})

    def test_provider_name_is_the_kind(self) -> None:
        """gen_ai_provider_name is the provider's adapter kind, from the running config."""
        config = edge_config()
        m = metrics()
        provider = config.nodes[0].providers[0]
        kinds = {a.name: a.type for a in config.nodes[0].adapters}
        m.observe(finished(provider=provider.id, node=config.nodes[0].id))
        (sample,) = [
            s for s in samples(m) if s.name == "gen_ai_server_request_duration_seconds_count"
        ]
        expected = {"openai_compat": "openai"}.get(
            kinds[provider.adapter_instance], kinds[provider.adapter_instance]
        )
        self.assertEqual(sample.labels["gen_ai_provider_name"], expected)

    def test_provider_leg(self) -> None:
        m = metrics()
        m.observe(finished(provider_duration=0.3))
        m.observe(finished())  # not measured: not observed
        (count,) = [
            s.value
            for s in samples(m)
            if s.name == "gen_ai_client_operation_duration_seconds_count"
        ]
        self.assertEqual(count, 1)


class ExemplarTests(SynchronousTestCase):
    def test_trace_id_exemplar(self) -> None:
        m = metrics()
        m.observe(finished(trace_id=TRACE_ID, stream=True, time_to_first_token=0.1))
        exemplars = [
            (s.name, s.exemplar.labels["trace_id"]) for s in samples(m) if s.exemplar is not None
        ]
        names = {name for name, _ in exemplars}
        self.assertIn("gen_ai_server_request_duration_seconds_bucket", names)
        self.assertIn("gen_ai_server_time_to_first_token_seconds_bucket", names)
        self.assertEqual({trace for _, trace in exemplars}, {TRACE_ID})

    def test_no_trace_no_exemplar(self) -> None:
        m = metrics()
        m.observe(finished())
        self.assertEqual([s for s in samples(m) if s.exemplar is not None], [])

    def test_negotiation(self) -> None:
        """The admin route answers OpenMetrics to a scraper that asks, else the text format."""
        m = metrics()
        http: Any = StubTreq(AdminApp(lambda: {}, metrics=m).resource())
        asked = self.successResultOf(
            http.get("http://admin/metrics", headers={"Accept": "application/openmetrics-text"})
        )
        self.assertTrue(
            asked.headers.getRawHeaders("content-type")[0].startswith("application/openmetrics")
        )
        plain = self.successResultOf(http.get("http://admin/metrics"))
        self.assertTrue(plain.headers.getRawHeaders("content-type")[0].startswith("text/plain"))


class DroppedSpansTests(SynchronousTestCase):
    def test_counter(self) -> None:
        dropped = [0]
        m = metrics(spans_dropped=lambda: dropped[0])
        dropped[0] = 7
        (value,) = [s.value for s in samples(m) if s.name == "iop_telemetry_spans_dropped_total"]
        self.assertEqual(value, 7)

    def test_absent_without_telemetry(self) -> None:
        self.assertNotIn(b"iop_telemetry_spans_dropped", metrics().render())
