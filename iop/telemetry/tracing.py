"""
:class:`Tracing`: what a daemon's parts are handed to make spans — on (a tracer) or off.

Off (:data:`TRACING_OFF`, the default everywhere, and all a daemon has without
``telemetry:``): :meth:`Tracing.start` returns None after one attribute test, and every helper
here takes ``None`` and returns at once. No span object, no context, no dict is made, so the
cost of tracing off is one comparison per call site (``bench/``: the measured pair).

On: spans are started with an explicit parent (a remote one read from a request's metadata,
or a span of this process) and ended explicitly; nothing uses the SDK's ambient "current span"
(see :mod:`.propagation`). The parts own their spans' life: a span is ended exactly once, by
the code that ends the work (a run's one ``_finish``, a tunnel's one ``_end``).

Privacy: attributes are identities, sizes, counts, codes and times. Message contents go on a
span only through :meth:`Tracing.content`, which answers None unless the operator opted in
(``telemetry.capture_content``, the GenAI conventions' opt-in); secrets never do (URLs are
recorded without their query, header values never).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from iop.telemetry.propagation import extract
from iop.telemetry.semconv import ERROR_TYPE

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

__all__ = ["TRACING_OFF", "Span", "SpanKind", "Tracing", "end_span", "set_attributes"]


class Tracing:
    """
    A daemon's tracing: ``tracer`` (None: off) and whether message contents may be recorded.
    """

    __slots__ = ("capture_content", "tracer")

    def __init__(self, tracer: Tracer | None = None, capture_content: bool = False) -> None:
        self.tracer = tracer
        self.capture_content = capture_content and tracer is not None

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def start(
        self,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        parent: Span | Context | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Span | None:
        """
        A started span named ``name`` (None when off): a child of ``parent`` (a span of this
        process or a remote context), else a root; the sampler decides whether it records.
        """
        tracer = self.tracer
        if tracer is None:
            return None
        context = set_span_in_context(parent) if isinstance(parent, Span) else parent
        return tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    def start_remote(
        self,
        name: str,
        carrier: Mapping[str, str],
        kind: SpanKind = SpanKind.SERVER,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Span | None:
        """
        A started span whose parent is the trace context in ``carrier`` (request metadata, a
        client's headers); a root when it carries none. None when off.
        """
        if self.tracer is None:
            return None
        return self.start(name, kind, extract(carrier), attributes)

    def content(self, text: str) -> str | None:
        """``text`` when message contents may be recorded (the operator's opt-in), else None."""
        return text if self.capture_content else None


#: No telemetry: every call returns at once.
TRACING_OFF = Tracing()


def set_attributes(span: Span | None, attributes: Mapping[str, AttributeValue]) -> None:
    """Set ``attributes`` on ``span`` (nothing when None or not recording)."""
    if span is not None and span.is_recording():
        span.set_attributes(attributes)


def end_span(span: Span | None, error_type: str | None = None, description: str = "") -> None:
    """
    End ``span`` (None: nothing). With ``error_type`` the span's status is ERROR with
    ``description`` (already redacted by the caller) and ``error.type`` is set, as the
    conventions ask of a failed operation.
    """
    if span is None:
        return
    if error_type is not None:
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR, description or None))
    span.end()
