"""
W3C trace context (``traceparent``, ``tracestate``) into and out of a string map.

The same two keys travel everywhere a trace crosses a process: a client's HTTP headers (the
Edge extracts them), the Edge-Node wire's request metadata (``RunRequest.metadata``,
``ProviderTunnelRequest.metadata``: no proto field of their own) and the upstream request's
headers (a vLLM server's own traces join). Only trace context crosses: no baggage (a client's
baggage would otherwise reach every upstream).

The propagator is the W3C one, called with an explicit context: nothing here reads or sets
the process's "current" context (a Twisted reactor interleaves requests on one thread, so an
ambient context would leak between them).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_KEYS",
    "extract",
    "inject",
    "log_ids",
    "trace_id_of",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_KEYS = (TRACEPARENT, TRACESTATE)

_PROPAGATOR = TraceContextTextMapPropagator()


class _Getter(Getter[Mapping[str, str]]):
    """Reads a key from a str map whose keys may be any case (HTTP headers)."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            for name, text in carrier.items():
                if name.lower() == key:
                    value = text
                    break
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _Getter()


def extract(carrier: Mapping[str, str]) -> Context | None:
    """
    The remote parent ``carrier`` names (its ``traceparent``, with ``tracestate``), or None
    when it carries no valid one (a malformed ``traceparent`` is ignored, as the W3C spec asks:
    the span becomes a root).
    """
    if TRACEPARENT not in carrier and not any(k.lower() == TRACEPARENT for k in carrier):
        return None
    context = _PROPAGATOR.extract(carrier, getter=_GETTER)
    if not get_current_span(context).get_span_context().is_valid:
        return None
    return context


def inject(span: Span, carrier: MutableMapping[str, str]) -> None:
    """Write ``span``'s context into ``carrier`` as ``traceparent`` (and ``tracestate``)."""
    for key in TRACE_KEYS:
        carrier.pop(key, None)
    _PROPAGATOR.inject(carrier, context=set_span_in_context(span))


def trace_id_of(span: Span) -> str:
    """``span``'s trace id as 32 hex digits ('' for an invalid span): logs, exemplars."""
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def log_ids(span: Span | None) -> dict[str, str]:
    """``trace_id`` and ``span_id`` (hex) of ``span`` for a log line; {} for None or invalid."""
    if span is None:
        return {}
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    return {
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
    }
