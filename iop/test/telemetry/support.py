"""Tracing for tests: the SDK's in-memory exporter behind a synchronous processor."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from iop.telemetry.tracing import Tracing

# A client's W3C trace context: trace 0af7…, parent span b7ad…, sampled.
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def memory_tracing(capture_content: bool = False) -> tuple[Tracing, InMemorySpanExporter]:
    """A :class:`Tracing` whose ended spans are in the returned exporter at once."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), capture_content), exporter


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> ReadableSpan:
    """The one span named ``name``."""
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {[s.name for s in spans]}"
    return found[0]


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


def parent_hex(span: ReadableSpan) -> str:
    return format(span.parent.span_id, "016x") if span.parent is not None else ""
