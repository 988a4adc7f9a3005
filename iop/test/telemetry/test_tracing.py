"""Tracing on and off, W3C propagation into and out of string maps, HTTP client attributes."""

from __future__ import annotations

from opentelemetry.trace import SpanKind, StatusCode
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from iop.telemetry import semconv
from iop.telemetry.http import (
    ClientCall,
    client_span,
    traced_header_object,
    traced_headers,
    url_attributes,
)
from iop.telemetry.propagation import extract, inject, trace_id_of
from iop.telemetry.tracing import TRACING_OFF, end_span, set_attributes
from iop.test.telemetry.support import (
    PARENT_ID,
    TRACE_ID,
    TRACEPARENT,
    hex_trace,
    memory_tracing,
    parent_hex,
)


class OffTests(SynchronousTestCase):
    def test_off_makes_nothing(self) -> None:
        """Without telemetry every call answers None and the helpers accept it."""
        self.assertFalse(TRACING_OFF.enabled)
        self.assertIsNone(TRACING_OFF.start("x"))
        self.assertIsNone(TRACING_OFF.start_remote("x", {"traceparent": TRACEPARENT}))
        self.assertIsNone(client_span(TRACING_OFF, {}, "POST", "http://h/v1"))
        self.assertIsNone(TRACING_OFF.content("secret prompt"))
        set_attributes(None, {"a": 1})
        end_span(None, "boom")
        headers = {"a": ["b"]}
        self.assertIs(traced_headers(None, headers), headers)
        ClientCall(None).end(ValueError())


class PropagationTests(SynchronousTestCase):
    def test_remote_parent(self) -> None:
        """A span started from a map with a traceparent is in that trace, its child."""
        tracing, exporter = memory_tracing()
        span = tracing.start_remote("s", {"traceparent": TRACEPARENT, "tracestate": "k=v"})
        assert span is not None
        self.assertEqual(trace_id_of(span), TRACE_ID)
        end_span(span)
        (finished,) = exporter.get_finished_spans()
        self.assertEqual(hex_trace(finished), TRACE_ID)
        self.assertEqual(parent_hex(finished), PARENT_ID)
        self.assertEqual(finished.kind, SpanKind.SERVER)
        assert finished.context is not None
        self.assertEqual(finished.context.trace_state.get("k"), "v")

    def test_header_case(self) -> None:
        """HTTP headers may come in any case."""
        self.assertIsNotNone(extract({"TraceParent": TRACEPARENT}))

    def test_no_or_bad_traceparent_is_a_root(self) -> None:
        tracing, exporter = memory_tracing()
        for carrier in ({}, {"traceparent": "00-nothex-1-01"}, {"traceparent": ""}):
            self.assertIsNone(extract(carrier))
            end_span(tracing.start_remote("root", carrier))
        for span in exporter.get_finished_spans():
            self.assertIsNone(span.parent)
            self.assertNotEqual(hex_trace(span), TRACE_ID)

    def test_inject_replaces(self) -> None:
        """inject writes the span's own context over what the map carried."""
        tracing, _ = memory_tracing()
        span = tracing.start_remote("s", {"traceparent": TRACEPARENT})
        assert span is not None
        carrier = {"traceparent": TRACEPARENT, "other": "kept"}
        inject(span, carrier)
        self.assertEqual(carrier["other"], "kept")
        version, trace, parent, flags = carrier["traceparent"].split("-")
        self.assertEqual((version, trace, flags), ("00", TRACE_ID, "01"))
        self.assertNotEqual(parent, PARENT_ID)

    def test_unsampled_parent_is_followed(self) -> None:
        """A caller's unsampled trace is not recorded (parent-based sampling)."""
        tracing, exporter = memory_tracing()
        end_span(tracing.start_remote("s", {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}))
        self.assertEqual(exporter.get_finished_spans(), ())


class HttpTests(SynchronousTestCase):
    def test_url_attributes_without_query_or_user(self) -> None:
        attributes = url_attributes("https://user:pw@api.example.com/v1/chat?key=sk-secret#x")
        self.assertEqual(
            attributes,
            {
                semconv.SERVER_ADDRESS: "api.example.com",
                semconv.SERVER_PORT: 443,
                semconv.URL_FULL: "https://api.example.com/v1/chat",
            },
        )
        self.assertEqual(
            url_attributes("http://[::1]:8000/v1")[semconv.URL_FULL], "http://[::1]:8000/v1"
        )

    def test_client_span_and_headers(self) -> None:
        """A client span under a remote parent; its traceparent replaces the caller's."""
        tracing, exporter = memory_tracing()
        span = client_span(tracing, {"traceparent": TRACEPARENT}, "POST", "http://h:8000/v1/chat")
        headers = traced_headers(span, {"Traceparent": ["00-x"], "Accept": ["a"]})
        self.assertNotIn("Traceparent", headers)
        self.assertIn(TRACE_ID, headers["traceparent"][0])
        twisted = traced_header_object(span, Headers({"traceparent": ["old"], "x": ["1"]}))
        self.assertIn(TRACE_ID, (twisted.getRawHeaders("traceparent") or [""])[0])
        self.assertEqual(twisted.getRawHeaders("x"), ["1"])
        call = ClientCall(span)
        call.status = 200
        call.end()
        call.end()  # once
        (finished,) = exporter.get_finished_spans()
        self.assertEqual(finished.name, "POST")
        self.assertEqual(finished.kind, SpanKind.CLIENT)
        attributes = dict(finished.attributes or {})
        self.assertEqual(attributes[semconv.HTTP_REQUEST_METHOD], "POST")
        self.assertEqual(attributes[semconv.SERVER_PORT], 8000)
        self.assertEqual(attributes[semconv.HTTP_RESPONSE_STATUS_CODE], 200)
        self.assertNotIn(semconv.ERROR_TYPE, attributes)

    def test_client_errors(self) -> None:
        tracing, exporter = memory_tracing()
        failed = ClientCall(client_span(tracing, None, "POST", "http://h/v1"))
        failed.end(ConnectionRefusedError())
        answered = ClientCall(client_span(tracing, None, "POST", "http://h/v1"))
        answered.status = 503
        answered.end(ValueError("ignored: the status tells"))
        broken = ClientCall(client_span(tracing, None, "POST", "http://h/v1"))
        broken.status = 200
        broken.end(ConnectionResetError())
        spans = exporter.get_finished_spans()
        types = [dict(s.attributes or {})[semconv.ERROR_TYPE] for s in spans]
        self.assertEqual(types, ["ConnectionRefusedError", "503", "ConnectionResetError"])
        for span in spans:
            self.assertEqual(span.status.status_code, StatusCode.ERROR)

    def test_content_only_when_opted_in(self) -> None:
        off, _ = memory_tracing()
        on, _ = memory_tracing(capture_content=True)
        self.assertIsNone(off.content("hello"))
        self.assertEqual(on.content("hello"), "hello")
