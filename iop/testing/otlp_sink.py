"""
A tiny OTLP/HTTP trace receiver for tests and the benchmark: a real HTTP server that decodes
each ``POST /v1/traces`` body with the official ``opentelemetry-proto`` messages
(``ExportTraceServiceRequest``, protobuf, gzip or not) and records every span.

- ``GET /_sink/spans``: every span received so far, as JSON: ``name``, ``kind`` (the OTLP enum
  name without its prefix, e.g. ``SERVER``), ``trace_id``/``span_id``/``parent_span_id`` (hex),
  ``service`` (the resource's ``service.name``), ``attributes`` (plain values), ``status``
  (``OK``/``ERROR``/``UNSET``).
- ``GET /_sink/stats``: ``requests`` and ``spans`` received.
- ``--delay-ms N``: answer each export only after N ms (a slow receiver).

CLI: ``python -m iop.testing.otlp_sink --port 4318 [--host 127.0.0.1] [--delay-ms N]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

__all__ = ["OTLPSink", "decode", "main"]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind is None:
        return None
    return getattr(value, kind)


def decode(body: bytes) -> list[dict[str, Any]]:
    """The spans of one ``ExportTraceServiceRequest`` body, as plain dicts."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[dict[str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    {
                        "name": span.name,
                        "kind": Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "service": resource.get("service.name", ""),
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "status": Status.StatusCode.Name(span.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                    }
                )
    return out


class OTLPSink(Resource):
    """The receiver: ``/v1/traces`` and its ``/_sink/*`` views."""

    isLeaf = True

    def __init__(self, clock: IReactorTime, delay_ms: int = 0) -> None:
        super().__init__()
        self.clock = clock
        self.delay_ms = delay_ms
        self.spans: list[dict[str, Any]] = []
        self.requests = 0

    def render_POST(self, request: Request) -> bytes | int:
        if request.path != b"/v1/traces":
            request.setResponseCode(404)
            return b""
        assert request.content is not None
        body = request.content.read()
        if (request.getHeader(b"content-encoding") or b"") == b"gzip":
            body = gzip.decompress(body)
        self.requests += 1
        self.spans.extend(decode(body))
        answer = ExportTraceServiceResponse().SerializeToString()
        request.setHeader(b"content-type", b"application/x-protobuf")
        if not self.delay_ms:
            return answer

        def later() -> None:
            if not request.finished and not request._disconnected:
                request.write(answer)
                request.finish()

        self.clock.callLater(self.delay_ms / 1000, later)
        return NOT_DONE_YET

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        if request.path == b"/_sink/spans":
            return json.dumps(self.spans).encode()
        if request.path == b"/_sink/stats":
            return json.dumps({"requests": self.requests, "spans": len(self.spans)}).encode()
        request.setResponseCode(404)
        return b"{}"


def main(argv: Sequence[str] | None = None) -> int:
    from twisted.internet import reactor as _reactor

    reactor: Any = _reactor
    parser = argparse.ArgumentParser(prog="iop-otlp-sink")
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--delay-ms", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sink = OTLPSink(reactor, args.delay_ms)
    port = reactor.listenTCP(args.port, Site(sink), interface=args.host)
    print(f"otlp-sink listening on {args.host}:{port.getHost().port}", flush=True)
    reactor.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
