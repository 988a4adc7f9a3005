"""
The Node's tunnel spans: ``iop.node.tunnel`` (the child of the Edge's context in the request
metadata) and its upstream HTTP client span, whose ``traceparent`` the upstream receives;
streamed and not, upstream errors, connection failures, cancellation and refusals.
"""

from __future__ import annotations

from typing import Any, cast

from opentelemetry.trace import SpanKind, StatusCode
from treq.testing import StubTreq
from twisted.web.resource import IResource

from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.tunnel import TunnelManager
from iop.runtime import AdapterContext, TreqClient
from iop.telemetry import semconv
from iop.test.node.test_tunnel import SECRET, Hanging, Scripted, TunnelCase, chat
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
from iop.wire.convert import adapter_spec

EDGE = {"traceparent": TRACEPARENT}


class TracedTunnelCase(TunnelCase):
    def use_resource(self, resource: IResource, http: Any = None, **config_fields: Any) -> None:
        self.tracing, self.exporter = memory_tracing()
        self.http = StubTreq(resource)
        fields: dict[str, Any] = {
            "name": "up",
            "type": "vllm",
            "enabled": True,
            "base_url": "http://upstream.test:8000/v1/",
            "headers": {"Authorization": SECRET},
            "max_concurrency": 1,
        }
        fields.update(config_fields)
        self.config = pb.AdapterConfig(**fields)
        ctx = AdapterContext(self.clock, cast(TreqClient, self.http), tracing=self.tracing)
        self.instance = AdapterInstance.from_spec(adapter_spec(self.config), ctx)
        self.registry = AdapterRegistry([self.instance])
        self.tunnels = TunnelManager(
            self.registry, self.sent.append, self.clock, node_id="n1", tracing=self.tracing
        )

    def spans(self) -> Any:
        return self.exporter.get_finished_spans()

    def tree(self) -> tuple[Any, Any]:
        """The tunnel span and its client span: one trace, the Edge's; parent → child."""
        spans = self.spans()
        tunnel, client = by_name(spans, "iop.node.tunnel"), by_name(spans, "POST")
        self.assertEqual({hex_trace(s) for s in spans}, {TRACE_ID})
        self.assertEqual(parent_hex(tunnel), PARENT_ID)
        self.assertEqual(parent_hex(client), hex_span(tunnel))
        self.assertEqual((tunnel.kind, client.kind), (SpanKind.SERVER, SpanKind.CLIENT))
        return dict(tunnel.attributes or {}), dict(client.attributes or {})


class TunnelSpanTests(TracedTunnelCase):
    def test_streamed(self) -> None:
        fake = self.use_fake(tokens=3)
        self.open(chat(), metadata=EDGE)
        self.assertValid()
        tunnel, client = self.tree()
        self.assertEqual(
            {k: tunnel[k] for k in (
                semconv.GEN_AI_OPERATION_NAME,
                semconv.GEN_AI_PROVIDER_NAME,
                semconv.GEN_AI_REQUEST_MODEL,
                semconv.GEN_AI_REQUEST_STREAM,
                semconv.IOP_RUN_ID,
                semconv.IOP_ADAPTER,
                semconv.IOP_NODE_ID,
                semconv.IOP_OUTCOME,
                semconv.HTTP_RESPONSE_STATUS_CODE,
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
            )},
            {
                semconv.GEN_AI_OPERATION_NAME: "chat",
                semconv.GEN_AI_PROVIDER_NAME: "vllm",
                semconv.GEN_AI_REQUEST_MODEL: "demo-model",
                semconv.GEN_AI_REQUEST_STREAM: True,
                semconv.IOP_RUN_ID: "t1",
                semconv.IOP_ADAPTER: "up",
                semconv.IOP_NODE_ID: "n1",
                semconv.IOP_OUTCOME: "completed",
                semconv.HTTP_RESPONSE_STATUS_CODE: 200,
                "gen_ai.usage.input_tokens": 2,
                "gen_ai.usage.output_tokens": 3,
            },
        )  # fmt: skip
        self.assertEqual(
            client,
            {
                semconv.HTTP_REQUEST_METHOD: "POST",
                semconv.SERVER_ADDRESS: "upstream.test",
                semconv.SERVER_PORT: 8000,
                semconv.URL_FULL: "http://upstream.test:8000/v1/chat/completions",
                semconv.HTTP_RESPONSE_STATUS_CODE: 200,
            },
        )
        # The upstream joined the trace under the client span.
        received = fake.requests[0].headers["traceparent"]
        client_span = by_name(self.spans(), "POST")
        self.assertEqual(received, f"00-{TRACE_ID}-{hex_span(client_span)}-01")
        # Never a secret, never the body.
        text = repr([dict(s.attributes or {}) for s in self.spans()])
        self.assertNotIn(SECRET, text)
        self.assertNotIn("hello world", text)

    def test_log_line_carries_the_span(self) -> None:
        self.use_fake(tokens=1)
        self.open(chat(), metadata=EDGE)
        tunnel = by_name(self.spans(), "iop.node.tunnel")
        ended = [e for e in self.events if "ended" in e.get("log_format", "")]
        self.assertEqual(len(ended), 1)
        self.assertEqual((ended[0]["trace_id"], ended[0]["span_id"]), (TRACE_ID, hex_span(tunnel)))

    def test_request_id_attribute(self) -> None:
        """The client request's id the metadata carries is on the tunnel span; a hostile one
        is not."""
        self.use_fake(tokens=1)
        self.open(chat(), metadata={**EDGE, "request_id": "req_abc"})
        self.open(chat(), run_id="t2", metadata={**EDGE, "request_id": "bad id\n"})
        attributes = [dict(s.attributes or {}) for s in self.spans() if s.name == "iop.node.tunnel"]
        self.assertEqual([a.get(semconv.IOP_REQUEST_ID) for a in attributes], ["req_abc", None])

    def test_not_streamed(self) -> None:
        self.use_fake(tokens=2)
        self.open(chat(stream=False), metadata=EDGE)
        self.assertValid()
        tunnel, _ = self.tree()
        self.assertIs(tunnel[semconv.GEN_AI_REQUEST_STREAM], False)
        self.assertEqual(tunnel["gen_ai.usage.output_tokens"], 2)

    def test_no_context_is_a_root(self) -> None:
        """A request without the Edge's context: the tunnel span roots a trace of its own."""
        fake = self.use_fake(tokens=1)
        self.open(chat())
        tunnel = by_name(self.spans(), "iop.node.tunnel")
        self.assertIsNone(tunnel.parent)
        self.assertIn(hex_trace(tunnel), fake.requests[0].headers["traceparent"])

    def test_upstream_error_status(self) -> None:
        """A 4xx/5xx is relayed (not an IOP error) and both spans say it failed."""
        self.use_resource(Scripted([b'{"error": {"message": "no"}}'], 503, b"application/json"))
        self.open(chat(stream=False), metadata=EDGE)
        tunnel, client = self.tree()
        self.assertEqual((tunnel[semconv.ERROR_TYPE], client[semconv.ERROR_TYPE]), ("503", "503"))
        self.assertEqual(tunnel[semconv.IOP_OUTCOME], "completed")
        for span in self.spans():
            self.assertEqual(span.status.status_code, StatusCode.ERROR)

    def test_connection_failure(self) -> None:
        from twisted.internet.defer import fail
        from twisted.internet.error import ConnectionRefusedError

        class Refusing:
            def request(self, *args: Any, **kwargs: Any) -> Any:
                return fail(ConnectionRefusedError())

        self.use_resource(Hanging())
        self.instance.provider.http = Refusing()  # type: ignore[union-attr]
        self.open(chat(), metadata=EDGE)
        tunnel, client = self.tree()
        self.assertEqual(tunnel[semconv.IOP_OUTCOME], "error")
        self.assertEqual(tunnel[semconv.ERROR_TYPE], "_OTHER")
        self.assertEqual(client[semconv.ERROR_TYPE], "_Failed")
        self.assertNotIn(semconv.HTTP_RESPONSE_STATUS_CODE, client)

    def test_cancelled(self) -> None:
        self.use_resource(Hanging())
        self.open(chat(), metadata=EDGE)
        self.assertTrue(self.tunnels.cancel("t1", "client went away"))
        self.end_turn()
        tunnel, _ = self.tree()
        self.assertEqual(tunnel[semconv.IOP_OUTCOME], "cancelled")
        self.assertNotIn(semconv.ERROR_TYPE, tunnel)

    def test_timeout(self) -> None:
        self.use_resource(Hanging())
        self.open(chat(), metadata=EDGE, timeout_sec=5)
        self.advance(5)
        tunnel, _ = self.tree()
        self.assertEqual(tunnel[semconv.ERROR_TYPE], "upstream_timeout")
        self.assertEqual(tunnel[semconv.IOP_ERROR_CODE], "upstream_timeout")

    def test_refused(self) -> None:
        """Refused before it ran (at capacity): one span, ended at once with the code."""
        self.use_resource(Hanging())
        self.open(chat(), metadata=EDGE)
        self.open(chat(), run_id="t2", metadata=EDGE)
        refused = [s for s in self.spans() if dict(s.attributes or {})[semconv.IOP_RUN_ID] == "t2"]
        (span,) = refused
        self.assertEqual(dict(span.attributes or {})[semconv.ERROR_TYPE], "provider_at_capacity")
        self.assertEqual(parent_hex(span), PARENT_ID)
        self.tunnels.cancel("t1")
        self.end_turn()


class OffTests(TunnelCase):
    def test_off_sends_no_traceparent(self) -> None:
        """Tracing off: the upstream gets no trace context of IOP's."""
        fake = self.use_fake(tokens=1)
        self.open(chat(), metadata=EDGE)
        self.assertNotIn("traceparent", fake.requests[0].headers)
