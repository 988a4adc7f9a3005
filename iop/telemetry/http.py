"""
The HTTP client span of an upstream call, per OpenTelemetry's HTTP semantic conventions, and
the trace context it hands the upstream.

The span is named after the method (``POST``), kind CLIENT, with ``http.request.method``,
``server.address``, ``server.port``, ``url.full`` (scheme, host, port and path: never the query,
where some upstreams take a key, nor user info), ``http.response.status_code`` and, for a status
of 400 or more or a failure, ``error.type`` (the status code, or the failure's class name). The
upstream request gets the span's ``traceparent`` (and ``tracestate``), so an upstream that
traces (vLLM with its OpenTelemetry option) continues the same trace.

The span covers the whole exchange, the body read to its end: for a streamed answer that is
the time the node spent on the upstream, which is what an operator reading the trace asks.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from twisted.web.http_headers import Headers

from iop.telemetry.propagation import TRACE_KEYS, inject
from iop.telemetry.semconv import (
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    SERVER_ADDRESS,
    SERVER_PORT,
    URL_FULL,
)
from iop.telemetry.tracing import Tracing, end_span, set_attributes

__all__ = [
    "ClientCall",
    "client_span",
    "end_client_span",
    "traced_header_object",
    "traced_headers",
    "url_attributes",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def url_attributes(url: str) -> dict[str, str | int]:
    """``server.address``, ``server.port`` and ``url.full`` (without query, fragment, user)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        port = 0
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    attributes: dict[str, str | int] = {
        SERVER_ADDRESS: host,
        URL_FULL: urlunsplit((parts.scheme, netloc, parts.path, "", "")),
    }
    if port:
        attributes[SERVER_PORT] = port
    return attributes


def client_span(
    tracing: Tracing, parent: Span | Context | Mapping[str, str] | None, method: str, url: str
) -> Span | None:
    """
    A started HTTP client span for ``method url``, child of ``parent`` (a span, a context, or a
    map carrying ``traceparent``: a run's metadata); None when tracing is off.
    """
    if tracing.tracer is None:
        return None
    attributes: dict[str, str | int] = {HTTP_REQUEST_METHOD: method, **url_attributes(url)}
    if isinstance(parent, Span | Context) or parent is None:
        return tracing.start(method, SpanKind.CLIENT, parent, attributes)
    return tracing.start_remote(method, parent, SpanKind.CLIENT, attributes)


def traced_headers(
    span: Span | None, headers: MutableMapping[str, list[str]]
) -> MutableMapping[str, list[str]]:
    """
    ``headers`` (a treq header dict: name → values) with ``span``'s trace context in place of
    any the caller had; ``headers`` itself when ``span`` is None.
    """
    if span is None:
        return headers
    for name in list(headers):
        if name.lower() in TRACE_KEYS:
            del headers[name]
    carrier: dict[str, str] = {}
    inject(span, carrier)
    for name, value in carrier.items():
        headers[name] = [value]
    return headers


def traced_header_object(span: Span | None, headers: Headers) -> Headers:
    """A copy of Twisted ``headers`` with ``span``'s trace context (``headers`` when None)."""
    if span is None:
        return headers
    out = headers.copy()
    for key in TRACE_KEYS:
        out.removeHeader(key)
    carrier: dict[str, str] = {}
    inject(span, carrier)
    for name, value in carrier.items():
        out.setRawHeaders(name, [value])
    return out


def end_client_span(
    span: Span | None, status: int | None = None, failure: BaseException | None = None
) -> None:
    """
    End the client span: with the response's ``status`` (400+ is an error, ``error.type`` its
    code) or the ``failure`` that ended the exchange (``error.type`` its class name).
    """
    if span is None:
        return
    if status is not None:
        set_attributes(span, {HTTP_RESPONSE_STATUS_CODE: status})
    if failure is not None:
        end_span(span, type(failure).__name__, "upstream request failed")
    elif status is not None and status >= 400:
        end_span(span, str(status), f"upstream answered {status}")
    else:
        end_span(span)


class ClientCall:
    """
    An upstream call being traced: its client span, the status it got (set by the caller once
    the response is in) and its one end.
    """

    __slots__ = ("span", "status")

    def __init__(self, span: Span | None) -> None:
        self.span = span
        self.status: int | None = None

    def end(self, failure: BaseException | None = None) -> None:
        """
        End the span (once): a 4xx/5xx is told by its status; a failure before a response, or
        after a 2xx (a broken stream), by the failure's class.
        """
        span, self.span = self.span, None
        status = self.status
        end_client_span(span, status, failure if status is None or status < 400 else None)
