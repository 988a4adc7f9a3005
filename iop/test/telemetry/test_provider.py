"""build(): nothing without telemetry:, a provider with it; drops counted; the flush on stop."""

from __future__ import annotations

import threading
from typing import cast

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import Secret, TelemetryConfig
from iop.telemetry.provider import DROP_WARNING_INTERVAL_SEC, build
from iop.telemetry.tracing import TRACING_OFF, end_span


class BlockedExporter(InMemorySpanExporter):
    """An exporter whose export waits until the test lets it go (a receiver that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.entered.set()
        self.release.wait(10)
        return SpanExportResult.SUCCESS


def config(**kwargs: object) -> TelemetryConfig:
    return TelemetryConfig("http://collector:4318/v1/traces", **kwargs)  # type: ignore[arg-type]


class BuildTests(SynchronousTestCase):
    def test_off(self) -> None:
        """No section: no provider, no processor, no service, no thread."""
        before = threading.active_count()
        telemetry = build(None, "iop-node", Clock())
        self.assertIs(telemetry.tracing, TRACING_OFF)
        self.assertIsNone(telemetry.provider)
        self.assertIsNone(telemetry.service)
        self.assertEqual(telemetry.dropped, 0)
        self.assertEqual(threading.active_count(), before)

    def test_on(self) -> None:
        exporter = InMemorySpanExporter()
        telemetry = build(config(service_name="edge-a"), "iop-edge", Clock(), exporter)
        assert telemetry.processor is not None
        self.addCleanup(telemetry.processor.shutdown)
        self.assertTrue(telemetry.tracing.enabled)
        self.assertFalse(telemetry.tracing.capture_content)
        end_span(telemetry.tracing.start("one"))
        telemetry.processor.force_flush()
        (span,) = exporter.get_finished_spans()
        self.assertEqual(span.resource.attributes["service.name"], "edge-a")
        self.assertIn("service.version", span.resource.attributes)

    def test_default_service_name(self) -> None:
        exporter = InMemorySpanExporter()
        telemetry = build(config(), "iop-node", Clock(), exporter)
        assert telemetry.processor is not None
        self.addCleanup(telemetry.processor.shutdown)
        end_span(telemetry.tracing.start("one"))
        telemetry.processor.force_flush()
        (span,) = exporter.get_finished_spans()
        self.assertEqual(span.resource.attributes["service.name"], "iop-node")

    def test_sampling_ratio_zero(self) -> None:
        exporter = InMemorySpanExporter()
        telemetry = build(config(sampling_ratio=0.0), "iop-node", Clock(), exporter)
        assert telemetry.processor is not None
        self.addCleanup(telemetry.processor.shutdown)
        span = telemetry.tracing.start("one")
        assert span is not None
        self.assertFalse(span.is_recording())

    def test_otlp_exporter_headers_not_in_repr(self) -> None:
        """The real exporter is built with the headers; the config's repr hides them."""
        secret = "otlp-token-value-123"
        cfg = config(headers=(("authorization", Secret(secret)),))
        self.assertNotIn(secret, repr(cfg))
        telemetry = build(cfg, "iop-node", Clock())
        assert telemetry.processor is not None
        telemetry.processor.shutdown()


class DropTests(SynchronousTestCase):
    def test_full_queue_drops_and_counts(self) -> None:
        """A receiver that hangs: the queue fills, further spans are dropped and counted;
        ending a span never waits."""
        exporter = BlockedExporter()
        clock = Clock()
        telemetry = build(config(queue_size=4), "iop-edge", clock, exporter)
        processor = telemetry.processor
        assert processor is not None and telemetry.service is not None
        self.addCleanup(exporter.release.set)
        # The first batch goes to the exporter and hangs there.
        for _ in range(4):
            end_span(telemetry.tracing.start("s"))
        self.assertTrue(exporter.entered.wait(5))
        for _ in range(10):
            end_span(telemetry.tracing.start("s"))
        self.assertEqual(telemetry.dropped, 6)
        logged: list[dict[str, object]] = []
        observer = cast(ILogObserver, logged.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        telemetry.service.startService()
        clock.advance(DROP_WARNING_INTERVAL_SEC)
        warnings = [e for e in logged if "dropped" in str(e.get("log_format", ""))]
        self.assertEqual(len(warnings), 1)
        self.assertEqual(warnings[0]["count"], 6)
        clock.advance(DROP_WARNING_INTERVAL_SEC)
        self.assertEqual(len([e for e in logged if "dropped" in str(e.get("log_format", ""))]), 1)
        exporter.release.set()
        # A reactor without threads: the flush runs inline, bounded.
        self.successResultOf(telemetry.service.stopService())
