"""
The Edge's spans (iop.edge.ingress.trace): the server span of each generation request and its
children (admission, placement and queue wait, the Edge→node leg), for each surface over a
tunnel and a run, streamed and not, errors, refusals, cancellation and queue wait; a client's
``traceparent`` continued; the context carried to the node in the request metadata; the trace
id on the record (exemplars, the access log); nothing at all when tracing is off.
"""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

from iop.edge.accesslog import AccessLog
from iop.edge.ingress.trace import ADMIT, DISPATCH, PLACE
from iop.edge.metrics import EdgeMetrics
from iop.runtime.events import RuntimeEvent, Usage
from iop.telemetry import semconv
from iop.test.edge.fixtures import edge_config
from iop.test.edge.ingress.harness import (
    CHAT,
    END,
    KEY,
    MESSAGES,
    Ingress,
    IngressCase,
    body,
    sse,
    start,
    usage,
)
from iop.test.telemetry.support import (
    PARENT_ID,
    TRACE_ID,
    TRACEPARENT,
    by_name,
    hex_span,
    hex_trace,
    memory_tracing,
    parent_hex,
)
from iop.wire import runtime_pb2 as pb

LLAMA = {**CHAT, "model": "llama"}
NATIVE = {**MESSAGES, "model": "native"}
CLIENT = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}


class TracedCase(IngressCase):
    capture_content = False

    def setUp(self) -> None:
        self.tracing, self.exporter = memory_tracing(self.capture_content)
        self.edge = Ingress(self.auth, self.cors, self.tracing)

    def spans(self) -> Any:
        return self.exporter.get_finished_spans()

    def server(self) -> Any:
        """The one server span; every span ended, in its trace, children under it."""
        spans = self.spans()
        servers = [s for s in spans if s.kind == SpanKind.SERVER]
        self.assertEqual(len(servers), 1, [s.name for s in spans])
        server = servers[0]
        for span in spans:
            self.assertEqual(hex_trace(span), hex_trace(server))
            if span is not server:
                self.assertEqual(parent_hex(span), hex_span(server), span.name)
        return server

    def attributes(self, span: Any) -> dict[str, Any]:
        return dict(span.attributes or {})

    def assertJoined(self, metadata: Any) -> None:
        """The metadata sent to the node names the dispatch span as the parent."""
        dispatch = by_name(self.spans(), DISPATCH)
        self.assertEqual(dispatch.kind, SpanKind.CLIENT)
        # (The flags: sampled, and the SDK's "random trace id" on a trace it began.)
        self.assertEqual(
            metadata["traceparent"][:-3], f"00-{hex_trace(dispatch)}-{hex_span(dispatch)}"
        )


class TunnelTests(TracedCase):
    def test_chat_continues_the_clients_trace_to_the_node(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        # The node's span will join the Edge's: the context is in the metadata beside the id.
        self.assertIn("request_id", sent.metadata)
        self.assertEqual(sent.metadata["tracestate"], "vendor=1")
        self.edge.frames(sent.run_id, start(), body(b'{"id":"x"}'), usage(7, 3), END)
        code, _, _ = self.answer(d)
        self.assertEqual(code, 200)
        server = self.server()
        self.assertEqual((hex_trace(server), parent_hex(server)), (TRACE_ID, PARENT_ID))
        self.assertEqual(server.name, "chat chat")
        self.assertEqual(server.status.status_code, StatusCode.UNSET)
        attributes = self.attributes(server)
        record = self.edge.records[-1]
        self.assertEqual(
            {k: attributes.get(k) for k in (
                semconv.GEN_AI_OPERATION_NAME,
                semconv.GEN_AI_REQUEST_MODEL,
                semconv.GEN_AI_REQUEST_STREAM,
                semconv.GEN_AI_PROVIDER_NAME,
                semconv.GEN_AI_RESPONSE_MODEL,
                semconv.GEN_AI_USAGE_INPUT_TOKENS,
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
                semconv.SERVER_ADDRESS,
                semconv.HTTP_RESPONSE_STATUS_CODE,
                semconv.IOP_NODE_ID,
                semconv.IOP_ADAPTER,
                semconv.IOP_OUTCOME,
                "iop.provider.id",
                "iop.request_id",
                "iop.client_key",
                semconv.ERROR_TYPE,
            )},
            {
                semconv.GEN_AI_OPERATION_NAME: "chat",
                semconv.GEN_AI_REQUEST_MODEL: "chat",
                semconv.GEN_AI_REQUEST_STREAM: False,
                semconv.GEN_AI_PROVIDER_NAME: "openai",
                semconv.GEN_AI_RESPONSE_MODEL: "chat-target",
                semconv.GEN_AI_USAGE_INPUT_TOKENS: 7,
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
                semconv.SERVER_ADDRESS: "edge.test",
                semconv.HTTP_RESPONSE_STATUS_CODE: 200,
                semconv.IOP_NODE_ID: "node-a",
                semconv.IOP_ADAPTER: "chat",
                semconv.IOP_OUTCOME: "complete",
                "iop.provider.id": "p-chat",
                "iop.request_id": record.request_id,
                "iop.client_key": "all",
                semconv.ERROR_TYPE: None,
            },
        )  # fmt: skip
        self.assertEqual(
            sorted(s.name for s in self.spans()), sorted([ADMIT, PLACE, DISPATCH, "chat chat"])
        )
        self.assertJoined(sent.metadata)
        place = self.attributes(by_name(self.spans(), PLACE))
        self.assertEqual(
            (place["iop.queue.outcome"], place["iop.queue.wait_seconds"]), ("placed", 0.0)
        )
        # The record carries the trace (exemplars, the access log) and the provider leg.
        self.assertEqual((record.trace_id, record.span_id), (TRACE_ID, hex_span(server)))
        self.assertEqual(record.provider_duration, 0.0)
        fields = AccessLog.fields(record)
        self.assertEqual((fields["trace_id"], fields["span_id"]), (TRACE_ID, hex_span(server)))
        # Never the key, never the prompt.
        text = repr([self.attributes(s) for s in self.spans()])
        self.assertNotIn(KEY, text)
        self.assertNotIn('"hi"', text)

    def test_a_stream_and_its_provider_leg(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(content_type="text/event-stream"))
        self.edge.clock.advance(1.5)
        self.edge.frames(sent.run_id, body(sse([{"choices": []}, "[DONE]"])), usage(2, 4), END)
        code, _, _ = self.answer(d)
        self.assertEqual(code, 200)
        server = self.server()
        # No client context: the Edge's span is the root of a new trace.
        self.assertEqual(server.parent, None)
        self.assertEqual(self.attributes(server)[semconv.GEN_AI_REQUEST_STREAM], True)
        self.assertEqual(self.attributes(server)[semconv.GEN_AI_USAGE_OUTPUT_TOKENS], 4)
        self.assertJoined(sent.metadata)
        self.assertEqual(self.edge.records[-1].provider_duration, 1.5)
        self.assertEqual(self.edge.records[-1].trace_id, hex_trace(server))

    def test_messages_native_upstream_error(self) -> None:
        d = self.edge.post("/v1/messages", NATIVE, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, {"kind": pb.ERROR, "end": True, "error": "upstream down"})
        code, _, _ = self.answer(d)
        self.assertEqual(code, 502)
        server = self.server()
        self.assertEqual(server.name, "chat native")
        self.assertEqual(server.status.status_code, StatusCode.ERROR)
        attributes = self.attributes(server)
        self.assertEqual(attributes[semconv.HTTP_RESPONSE_STATUS_CODE], 502)
        self.assertTrue(attributes[semconv.ERROR_TYPE])
        dispatch = by_name(self.spans(), DISPATCH)
        self.assertEqual(self.attributes(dispatch)[semconv.ERROR_TYPE], "error")

    def test_an_upstream_error_status_passed_through(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(429), body(b'{"error":{}}'), END)
        code, _, _ = self.answer(d)
        self.assertEqual(code, 429)
        self.assertEqual(self.attributes(self.server())[semconv.ERROR_TYPE], "429")

    def test_cancelled_when_the_client_goes(self) -> None:
        self.edge.post("/v1/chat/completions", {**CHAT, "stream": True}, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(content_type="text/event-stream"))
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [sent.run_id])
        self.edge.frames(sent.run_id, {"kind": pb.ERROR, "end": True, "error": "cancelled"})
        server = self.server()
        self.assertEqual(self.attributes(server)[semconv.IOP_OUTCOME], "cancelled")
        self.assertNotIn(semconv.ERROR_TYPE, self.attributes(server))
        self.assertEqual(len(self.spans()), 4)


class RunTests(TracedCase):
    def test_chat_over_a_run(self) -> None:
        d = self.edge.post("/v1/chat/completions", LLAMA, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.run_request()
        self.edge.events(
            sent.run_id,
            RuntimeEvent.start(),
            RuntimeEvent.text("hi"),
            RuntimeEvent.complete(Usage(5, 1)),
        )
        code, _, _ = self.answer(d)
        self.assertEqual(code, 200)
        server = self.server()
        self.assertEqual(hex_trace(server), TRACE_ID)
        attributes = self.attributes(server)
        self.assertEqual(attributes[semconv.GEN_AI_PROVIDER_NAME], "ollama")
        self.assertEqual(attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS], 5)
        self.assertJoined(sent.metadata)

    def test_responses_streamed_over_a_run(self) -> None:
        d = self.edge.post("/v1/responses", {"model": "llama", "input": "hi", "stream": True})
        self.edge.flush()
        sent = self.edge.run_request()
        self.edge.events(
            sent.run_id, RuntimeEvent.start(), RuntimeEvent.text("hi"), RuntimeEvent.complete()
        )
        code, _, _ = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(self.server().name, "chat llama")
        self.assertJoined(sent.metadata)

    def test_messages_over_a_run_failing(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "model": "llama"})
        self.edge.flush()
        sent = self.edge.run_request()
        self.edge.events(sent.run_id, RuntimeEvent.failed("model not loaded"))
        code, _, _ = self.answer(d)
        self.assertEqual(code, 502)
        server = self.server()
        self.assertEqual(server.status.status_code, StatusCode.ERROR)
        self.assertEqual(self.attributes(server)[semconv.ERROR_TYPE], "upstream_error")
        dispatch = by_name(self.spans(), DISPATCH)
        self.assertEqual(self.attributes(dispatch)[semconv.ERROR_TYPE], "upstream_error")


class RefusalTests(TracedCase):
    def test_refused_before_a_model_is_known(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, key="sk-wrong", headers=CLIENT)
        code, _, _ = self.answer(d)
        self.assertEqual(code, 401)
        server = self.server()
        self.assertEqual((server.name, len(self.spans())), ("chat", 1))
        attributes = self.attributes(server)
        self.assertEqual(attributes[semconv.HTTP_RESPONSE_STATUS_CODE], 401)
        self.assertTrue(attributes[semconv.ERROR_TYPE])
        self.assertNotIn(semconv.GEN_AI_REQUEST_MODEL, attributes)
        self.assertEqual(self.edge.records[-1].trace_id, TRACE_ID)

    def test_an_unknown_model(self) -> None:
        code, _, _ = self.answer(self.edge.post("/v1/chat/completions", {**CHAT, "model": "x"}))
        self.assertEqual(code, 404)
        server = self.server()
        self.assertEqual(self.attributes(server)[semconv.ERROR_TYPE], "model_not_found")

    def test_a_malformed_traceparent_makes_a_root(self) -> None:
        headers = {"traceparent": "00-zz-yy-01"}
        self.answer(self.edge.post("/v1/chat/completions", CHAT, key="sk-wrong", headers=headers))
        self.assertIsNone(self.server().parent)

    def test_count_tokens_is_traced_the_catalog_is_not(self) -> None:
        counted = {**MESSAGES, "model": "counted"}
        code, _, _ = self.answer(self.edge.post("/v1/messages/count_tokens", counted))
        self.assertEqual(code, 200)
        self.assertEqual(self.server().name, "count_tokens counted")
        self.exporter.clear()
        code, _, _ = self.answer(self.edge.get("/v1/models"))
        self.assertEqual((code, self.spans()), (200, ()))


class QueueTests(TracedCase):
    def test_the_wait_for_a_provider(self) -> None:
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        running = self.edge.tunnel_request()
        second = self.edge.post("/v1/chat/completions", CHAT, headers=CLIENT)
        self.edge.flush()
        self.edge.clock.advance(2.0)
        self.edge.frames(running.run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(first)[0], 200)
        queued = self.edge.tunnel_request()
        self.assertNotEqual(queued.run_id, running.run_id)
        self.edge.frames(queued.run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(second)[0], 200)
        traced = [s for s in self.spans() if hex_trace(s) == TRACE_ID]
        place = self.attributes(by_name(traced, PLACE))
        self.assertEqual(place["iop.queue.wait_seconds"], 2.0)
        self.assertEqual(place["iop.queue.outcome"], "placed")
        self.assertEqual(place[semconv.IOP_NODE_ID], "node-a")

    def test_a_client_gone_while_queued(self) -> None:
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        running = self.edge.tunnel_request()
        self.edge.post("/v1/chat/completions", CHAT, headers=CLIENT)
        self.edge.flush()
        self.edge.disconnect()
        traced = [s for s in self.spans() if hex_trace(s) == TRACE_ID]
        place = by_name(traced, PLACE)
        self.assertEqual(self.attributes(place)["iop.queue.outcome"], "cancelled")
        self.assertEqual(
            self.attributes(by_name(traced, "chat chat"))[semconv.IOP_OUTCOME], "cancelled"
        )
        self.assertEqual([s.name for s in traced if s.name == DISPATCH], [])
        self.edge.frames(running.run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(first)[0], 200)


class ContentTests(TracedCase):
    capture_content = True

    def test_opted_in_the_input_is_recorded(self) -> None:
        self.answer(self.edge.post("/v1/chat/completions", CHAT, key="sk-wrong"))
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(b"{}"), END)
        self.answer(d)
        spans = [s for s in self.spans() if s.kind == SpanKind.SERVER]
        recorded = self.attributes(spans[-1])[semconv.GEN_AI_INPUT_MESSAGES]
        self.assertEqual(json.loads(str(recorded)), CHAT["messages"])


class OffTests(IngressCase):
    def test_nothing_when_tracing_is_off(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertNotIn("traceparent", sent.metadata)
        self.edge.frames(sent.run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(d)[0], 200)
        record = self.edge.records[-1]
        self.assertEqual((record.trace_id, record.span_id), ("", ""))
        self.assertNotIn("trace_id", AccessLog.fields(record))
        # The provider leg is measured all the same (it is a metric, not a span).
        self.assertEqual(record.provider_duration, 0.0)


class ExemplarTests(TracedCase):
    def test_openmetrics_shows_the_trace_id(self) -> None:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families

        d = self.edge.post("/v1/chat/completions", CHAT, headers=CLIENT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(b"{}"), END)
        self.answer(d)
        metrics = EdgeMetrics(lambda: {"nodes": [], "providers": []})
        metrics.use_config(edge_config())
        metrics.observe(self.edge.records[-1])
        data, _ = metrics.render_for("application/openmetrics-text; version=1.0.0")
        exemplars = {
            s.name: s.exemplar.labels["trace_id"]
            for family in text_string_to_metric_families(data.decode())
            for s in family.samples
            if s.exemplar is not None
        }
        self.assertEqual(exemplars.get("gen_ai_server_request_duration_seconds_bucket"), TRACE_ID)
        self.assertEqual(exemplars.get("gen_ai_client_operation_duration_seconds_bucket"), TRACE_ID)
