# -*- test-case-name: iop.test.edge.ingress.test_trace -*-
"""
One client request's spans on the Edge (``telemetry:``): the server span and its children.

A :class:`RequestTrace` exists only when the Edge traces (:class:`~iop.telemetry.tracing.Tracing`
on): :meth:`~.pipeline.Pipeline.generate` checks that once per request and, off, makes nothing
at all — no trace, no span, no context, no dict.

The tree, for a generation route (``POST /v1/chat/completions``, ``/v1/responses``,
``/v1/messages``)::

    {gen_ai.operation.name} {gen_ai.request.model}   SERVER  the request, arrival to its end
    ├── iop.edge.admit                               INTERNAL the key's limits and budgets
    ├── iop.edge.place                               INTERNAL the pool's lease (the queue wait)
    └── iop.edge.dispatch                            CLIENT   the Edge→node leg: the node's
                                                              ``iop.node.run``/``iop.node.tunnel``
                                                              joins it (request metadata)

The server span is the child of the client's W3C ``traceparent``/``tracestate`` when the
request carries a valid one (a malformed one is ignored: the span is a root), and it starts
before anything can refuse the request, so a 401, a 400 or a 404 is traced too; until the body
names a model its name is the operation alone (the conventions' rule when the model is
unknown). ``iop.edge.admit`` exists only when a key's limits are counted; ``iop.edge.place``
covers the wait for a provider (0 when one was free) with ``iop.queue.wait_seconds`` and
``iop.queue.outcome`` (``placed``, ``refused``, ``cancelled``) and, placed, the provider, node
and adapter; ``iop.edge.dispatch`` covers dispatch to the end of the work on the node, which is
also what ``gen_ai.client.operation.duration`` measures. Its context is what the run's or
tunnel's metadata carries to the node (:func:`~iop.telemetry.propagation.inject`: the
``traceparent`` and ``tracestate`` keys beside ``request_id``).

``count_tokens`` (answered locally, or a cheap provider call) gets the same server span; the
catalog routes (``GET /v1/models``) get none: they do no work worth a trace.

Ended exactly once each: the server span by the pipeline's one ``finally``
(:meth:`RequestTrace.end`), a child by whoever ends its step, every one of them in a
``finally`` or a source's one ending callback; :meth:`RequestTrace.end` also ends a child still
open (a client gone mid-wait), so no span is left unended.

Attributes: ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.request.stream``,
``gen_ai.provider.name`` (from the placed provider's kind), ``gen_ai.response.model`` (the model
name the provider was asked for: the placement's target), ``gen_ai.usage.*`` (as the provider
reported them), ``server.address``/``server.port`` (the listener as the client addressed it),
``http.request.method``, ``http.response.status_code``, ``error.type`` (the error's machine
code, e.g. ``rate_limit_exceeded``; ``cancelled`` is an outcome, not an error),
``iop.request_id`` (the request's id, :mod:`.requestid`), ``iop.client_key`` and
``iop.client_team`` (the key's configured **name** and team, never the key), ``iop.outcome``.
``gen_ai.response.finish_reasons`` is the node's run span's (the Edge passes a tunnel's body
through unparsed, and a run's ending reaches the record as an outcome and usage only).

Message contents: with ``telemetry.capture_content`` the server span carries the client's
input as ``gen_ai.input.messages`` (the surface's ``messages`` or ``input`` as JSON, and the
``system``/``instructions`` as ``gen_ai.system_instructions``), the conventions' opt-in
attributes; without it, never. No header value is ever recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from iop.edge.ingress.requestid import request_id_of
from iop.edge.placement import Placement
from iop.runtime.events import Usage
from iop.telemetry import semconv
from iop.telemetry.propagation import TRACE_KEYS, inject, log_ids, trace_id_of
from iop.telemetry.tracing import Span, SpanKind, Tracing, end_span

__all__ = ["ADMIT", "DISPATCH", "PLACE", "RequestTrace"]

ADMIT = "iop.edge.admit"
PLACE = "iop.edge.place"
DISPATCH = "iop.edge.dispatch"

IOP_REQUEST_ID = semconv.IOP_REQUEST_ID
IOP_CLIENT_KEY = "iop.client_key"
IOP_CLIENT_TEAM = "iop.client_team"
IOP_PROVIDER_ID = "iop.provider.id"
IOP_QUEUE_WAIT = "iop.queue.wait_seconds"
IOP_QUEUE_OUTCOME = "iop.queue.outcome"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

# Where a request's trace rides on it (read by the app's log lines).
_ATTRIBUTE = "_iop_trace"


def _carrier(request: IRequest) -> dict[str, str]:
    """The client's W3C trace context headers (first value of each), as a string map."""
    carrier: dict[str, str] = {}
    headers = request.requestHeaders
    for key in TRACE_KEYS:
        values = headers.getRawHeaders(key.encode("ascii"))
        if values:
            carrier[key] = values[0].decode("latin-1")
    return carrier


class RequestTrace:
    """One request's server span and its children (module docstring)."""

    def __init__(
        self, tracing: Tracing, request: IRequest, operation: str, clock: IReactorTime
    ) -> None:
        self._tracing = tracing
        self.clock = clock
        self.operation = operation
        self.gen_ai_operation = semconv.operation_name(operation)
        attributes: dict[str, Any] = {
            semconv.GEN_AI_OPERATION_NAME: self.gen_ai_operation,
            semconv.HTTP_REQUEST_METHOD: request.method.decode("latin-1"),
        }
        host = request.getHost()
        hostname = request.getRequestHostname()
        if hostname:
            attributes[semconv.SERVER_ADDRESS] = hostname.decode("latin-1")
        port = getattr(host, "port", None)
        if isinstance(port, int):
            attributes[semconv.SERVER_PORT] = port
        request_id = request_id_of(request)
        if request_id:
            attributes[IOP_REQUEST_ID] = request_id
        span = tracing.start_remote(
            self.gen_ai_operation, _carrier(request), SpanKind.SERVER, attributes
        )
        assert span is not None  # tracing is on: a RequestTrace is made only then
        self.span: Span = span
        self.trace_id = trace_id_of(span)
        # The open children (ended by their step, or by end()).
        self._children: list[Span] = []
        self._ended = False
        # How the placed work ended ("" while it has not, or none was placed).
        self.outcome = ""
        setattr(request, _ATTRIBUTE, self)

    @staticmethod
    def of(request: IRequest) -> RequestTrace | None:
        """The trace riding on ``request``, if it is traced."""
        trace = getattr(request, _ATTRIBUTE, None)
        return trace if isinstance(trace, RequestTrace) else None

    # -- the server span's facts ------------------------------------------------------------------

    def log_ids(self) -> dict[str, str]:
        """``trace_id`` and ``span_id`` of the server span, for a log line about the request."""
        return log_ids(self.span)

    def authenticated(self, key: str, team: str) -> None:
        if key:
            self.span.set_attribute(IOP_CLIENT_KEY, key)
        if team:
            self.span.set_attribute(IOP_CLIENT_TEAM, team)

    def decoded(self, model: str, stream: bool, body: Mapping[str, Any]) -> None:
        """The body named ``model``: the span's name and request attributes (and, opted in, the
        client's input)."""
        self.span.update_name(f"{self.gen_ai_operation} {model}")
        self.span.set_attribute(semconv.GEN_AI_REQUEST_MODEL, model)
        self.span.set_attribute(semconv.GEN_AI_REQUEST_STREAM, stream)
        if self._tracing.capture_content:
            messages = body.get("messages", body.get("input"))
            if messages is not None:
                self.span.set_attribute(semconv.GEN_AI_INPUT_MESSAGES, _json(messages))
            system = body.get("system", body.get("instructions"))
            if system is not None:
                self.span.set_attribute(GEN_AI_SYSTEM_INSTRUCTIONS, _json(system))

    def placed(self, placement: Placement) -> None:
        """Where the request runs: the provider's identity on the server span."""
        self.span.set_attributes(_placement_attributes(placement))

    def work_ended(self, outcome: str, usage: Usage | None, finish_reason: str = "") -> None:
        """The placed work ended: its outcome and what it used (the first report wins)."""
        if self.outcome or self._ended:
            # (A run that failed before its answer started may tell after the refusal ended
            # the span: the refusal's error.type says it.)
            return
        self.outcome = outcome
        span = self.span
        span.set_attribute(semconv.IOP_OUTCOME, outcome)
        if usage is not None:
            span.set_attributes(semconv.usage_attributes(usage))
        if finish_reason:
            span.set_attribute(semconv.GEN_AI_RESPONSE_FINISH_REASONS, (finish_reason,))

    # -- children ---------------------------------------------------------------------------------

    def child(
        self, name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] = {}
    ) -> Span:
        """A started child of the server span, ended by :meth:`end_child` (or :meth:`end`)."""
        span = self._tracing.start(name, kind, self.span, attributes)
        assert span is not None
        self._children.append(span)
        return span

    def end_child(self, span: Span, error_type: str | None = None, description: str = "") -> None:
        """End ``span`` (once: a second call, or one after :meth:`end`, does nothing)."""
        if span in self._children:
            self._children.remove(span)
            end_span(span, error_type, description)

    def place_ended(
        self,
        span: Span,
        waited: float,
        placement: Placement | None,
        outcome: str,
        error_type: str | None = None,
    ) -> None:
        """The pool's answer after ``waited`` seconds: ``placement`` (``outcome`` ``placed``),
        or none (``refused`` with the refusal's ``error_type``, or ``cancelled``)."""
        span.set_attribute(IOP_QUEUE_WAIT, waited)
        span.set_attribute(IOP_QUEUE_OUTCOME, outcome)
        if placement is not None:
            span.set_attributes(_placement_attributes(placement))
            self.placed(placement)
        self.end_child(span, error_type)

    def dispatch_ended(self, span: Span, outcome: str, usage: Usage | None) -> None:
        """The Edge→node leg ended: how, and what the provider reported (nothing when the
        request's end already ended it)."""
        if span not in self._children:
            return
        span.set_attribute(semconv.IOP_OUTCOME, outcome)
        if usage is not None:
            span.set_attributes(semconv.usage_attributes(usage))
        self.end_child(span, "error" if outcome == "error" else None)

    def dispatch(self, placement: Placement, metadata: MutableMapping[str, str]) -> Span:
        """The Edge→node leg's span, its context written into ``metadata`` for the node."""
        span = self.child(DISPATCH, SpanKind.CLIENT, _placement_attributes(placement))
        inject(span, metadata)
        return span

    # -- the end ----------------------------------------------------------------------------------

    def end(self, status: int | None, error_type: str | None, description: str = "") -> None:
        """End the server span (once), and any child its step left open."""
        if self._ended:
            return
        self._ended = True
        for child in list(self._children):
            # A step the request left (a client gone, a failure): it ended with the request.
            self.end_child(child, None if error_type == "cancelled" else error_type)
        if status is not None:
            self.span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, status)
        if error_type == "cancelled":
            # The client went away: an outcome, not an error of the gateway's.
            self.span.set_attribute(semconv.IOP_OUTCOME, "cancelled")
            error_type = None
        elif error_type is None and self.outcome == "error":
            # The answer had started when the work failed: the client saw a cut stream.
            error_type = "error"
        end_span(self.span, error_type, description)


def _placement_attributes(placement: Placement) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        semconv.GEN_AI_PROVIDER_NAME: semconv.provider_name(placement.provider_type),
        semconv.GEN_AI_RESPONSE_MODEL: placement.target,
        semconv.IOP_NODE_ID: placement.node_id,
        semconv.IOP_ADAPTER: placement.adapter,
    }
    if placement.provider_id:
        attributes[IOP_PROVIDER_ID] = placement.provider_id
    return attributes


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
