"""
The Node's run spans: ``iop.node.run`` (the child of the Edge's context in the run request's
metadata, handed on to the adapter), the upstream HTTP client span of an HTTP adapter with the
``traceparent`` the upstream receives; completion with usage, errors, cancellation, timeouts,
refusals, and nothing at all with tracing off.
"""

from __future__ import annotations

from typing import Any, cast

from opentelemetry.trace import SpanKind, StatusCode
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.runs import RunManager
from iop.runtime import AdapterContext, RuntimeEvent, TreqClient, Usage
from iop.telemetry import semconv
from iop.test.node.fakes import capture_events
from iop.test.node.test_runs import RunManagerTestCase, open_store, run_request
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
from iop.testing.fake_openai import FakeOpenAI
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_spec

EDGE = {"traceparent": TRACEPARENT}
SECRET = "Bearer sk-run-secret-0123456789"


class TracedRunCase(RunManagerTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tracing, self.exporter = memory_tracing()
        self.manager = RunManager(
            self.registry, self.sent.append, self.store, self.clock, "n1", tracing=self.tracing
        )

    def run_span(self, run_id: str = "r1") -> tuple[Any, dict[str, Any]]:
        spans = [
            s
            for s in self.exporter.get_finished_spans()
            if s.name == "iop.node.run" and dict(s.attributes or {})[semconv.IOP_RUN_ID] == run_id
        ]
        (span,) = spans
        self.assertEqual(hex_trace(span), TRACE_ID)
        self.assertEqual(parent_hex(span), PARENT_ID)
        self.assertEqual(span.kind, SpanKind.SERVER)
        return span, dict(span.attributes or {})


class RunSpanTests(TracedRunCase):
    def test_completed(self) -> None:
        self.submit(run_request(metadata=EDGE, session_id="s-1"))
        execution = self.gpu.last
        # The adapter is handed the run span's context, not the Edge's.
        handed = execution.spec.metadata["traceparent"]
        self.assertTrue(handed.startswith(f"00-{TRACE_ID}-"))
        self.assertNotIn(PARENT_ID, handed)
        self.assertEqual(self.exporter.get_finished_spans(), ())  # still running
        usage = Usage(11, 7, reasoning_tokens=3, cached_input_tokens=5)
        execution.emit(RuntimeEvent.text("hi"))
        execution.emit(RuntimeEvent.complete(usage, {"finish_reason": "stop"}))
        span, attributes = self.run_span()
        self.assertIn(hex_span(span), handed)
        self.assertEqual(
            {k: v for k, v in attributes.items() if k != semconv.GEN_AI_RESPONSE_FINISH_REASONS},
            {
                semconv.GEN_AI_OPERATION_NAME: "chat",
                semconv.GEN_AI_PROVIDER_NAME: "vllm",
                semconv.GEN_AI_REQUEST_MODEL: "llama-70b",
                semconv.GEN_AI_REQUEST_STREAM: True,
                semconv.GEN_AI_CONVERSATION_ID: "s-1",
                semconv.IOP_RUN_ID: "r1",
                semconv.IOP_ADAPTER: "gpu",
                semconv.IOP_NODE_ID: "n1",
                semconv.IOP_OUTCOME: "completed",
                "gen_ai.usage.input_tokens": 11,
                "gen_ai.usage.output_tokens": 7,
                "gen_ai.usage.reasoning.output_tokens": 3,
                "gen_ai.usage.cache_read.input_tokens": 5,
            },
        )
        self.assertEqual(list(attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]), ["stop"])
        self.assertEqual(span.status.status_code, StatusCode.UNSET)
        # Never the input.
        self.assertNotIn("hello", repr(attributes))

    def test_log_lines_carry_the_span(self) -> None:
        """The run's log lines carry its trace and span ids beside the request id."""
        events = capture_events(self)
        self.submit(run_request(metadata={**EDGE, "request_id": "req_abc"}))
        self.gpu.last.emit(RuntimeEvent.complete())
        span, _ = self.run_span()
        ended = [e for e in events if "ended" in e.get("log_format", "")]
        self.assertEqual(len(ended), 1)
        self.assertEqual(ended[0]["trace_id"], TRACE_ID)
        self.assertEqual(ended[0]["span_id"], hex_span(span))
        self.assertEqual(ended[0]["request_id"], "req_abc")
        self.assertEqual((span.attributes or {})[semconv.IOP_REQUEST_ID], "req_abc")

    def test_collected_is_not_a_stream(self) -> None:
        self.submit(run_request(metadata=EDGE, collect=True))
        self.gpu.last.emit(RuntimeEvent.complete())
        _, attributes = self.run_span()
        self.assertIs(attributes[semconv.GEN_AI_REQUEST_STREAM], False)

    def test_cli_run_is_an_agent_invocation(self) -> None:
        self.submit(run_request(adapter="agent", metadata=EDGE))
        self.agent.last.emit(RuntimeEvent.complete())
        _, attributes = self.run_span()
        self.assertEqual(attributes[semconv.GEN_AI_OPERATION_NAME], "invoke_agent")
        self.assertEqual(attributes[semconv.GEN_AI_PROVIDER_NAME], "cli")

    def test_error(self) -> None:
        self.submit(run_request(metadata=EDGE))
        self.gpu.last.emit(RuntimeEvent.failed("upstream HTTP 500: boom"))
        span, attributes = self.run_span()
        self.assertEqual(attributes[semconv.IOP_OUTCOME], "error")
        self.assertEqual(attributes[semconv.ERROR_TYPE], "_OTHER")
        self.assertEqual(span.status.status_code, StatusCode.ERROR)

    def test_failed_deferred(self) -> None:
        self.submit(run_request(metadata=EDGE))
        self.gpu.last.deferred.errback(RuntimeError("process crashed"))
        span, attributes = self.run_span()
        self.assertEqual(attributes[semconv.IOP_OUTCOME], "error")
        self.assertEqual(span.status.status_code, StatusCode.ERROR)

    def test_cancelled(self) -> None:
        self.submit(run_request(metadata=EDGE))
        self.cancel(kind=pb.CANCEL_RUN, run_id="r1", reason="client went away")
        span, attributes = self.run_span()
        self.assertEqual(attributes[semconv.IOP_OUTCOME], "cancelled")
        self.assertNotIn(semconv.ERROR_TYPE, attributes)
        self.assertEqual(span.status.status_code, StatusCode.UNSET)

    def test_timeout(self) -> None:
        self.submit(run_request(metadata=EDGE, timeout_sec=3))
        self.clock.advance(3)
        _, attributes = self.run_span()
        self.assertEqual(attributes[semconv.ERROR_TYPE], "upstream_timeout")

    def test_connection_lost(self) -> None:
        self.submit(run_request(metadata=EDGE))
        self.manager.connection_lost()
        _, attributes = self.run_span()
        self.assertEqual(attributes[semconv.IOP_OUTCOME], "cancelled")

    def test_refused(self) -> None:
        self.submit(run_request(metadata=EDGE, adapter="nope"))
        _, attributes = self.run_span()
        self.assertEqual(attributes[semconv.IOP_ADAPTER], "nope")
        self.assertIn(semconv.ERROR_TYPE, attributes)

    def test_at_capacity(self) -> None:
        for run_id in ("r1", "r2", "r3"):
            self.submit(run_request(run_id=run_id, metadata=EDGE))
        _, attributes = self.run_span("r3")
        self.assertEqual(attributes[semconv.ERROR_TYPE], "provider_at_capacity")
        for execution in self.gpu.executions:
            execution.emit(RuntimeEvent.complete())


class OffTests(RunManagerTestCase):
    def test_metadata_untouched(self) -> None:
        """Tracing off: the adapter gets the request's metadata as it came."""
        self.submit(run_request(metadata={"traceparent": TRACEPARENT, "think": "high"}))
        self.assertEqual(
            dict(self.gpu.last.spec.metadata), {"traceparent": TRACEPARENT, "think": "high"}
        )
        self.gpu.last.emit(RuntimeEvent.complete())


class UpstreamTests(SynchronousTestCase):
    """A run on a real HTTP adapter (openai_compat against the fake upstream, in memory)."""

    def test_tree_and_upstream_traceparent(self) -> None:
        clock = Clock()
        tracing, exporter = memory_tracing()
        fake = FakeOpenAI(clock, tokens=2)
        http = StubTreq(fake.resource())
        config = pb.AdapterConfig(
            name="up",
            type="openai_compat",
            enabled=True,
            base_url="http://upstream.test/v1/",
            headers={"Authorization": SECRET},
            max_concurrency=1,
        )
        ctx = AdapterContext(clock, cast(TreqClient, http), tracing=tracing)
        registry = AdapterRegistry([AdapterInstance.from_spec(adapter_spec(config), ctx)])
        sent: list[pb.Envelope] = []
        store = open_store(self, clock)
        manager = RunManager(registry, sent.append, store, clock, "n1", tracing=tracing)
        manager.submit(run_request(adapter="up", target="demo-model", metadata=EDGE))
        http.flush()
        clock.advance(0)
        http.flush()
        spans = exporter.get_finished_spans()
        run, client = by_name(spans, "iop.node.run"), by_name(spans, "POST")
        self.assertEqual({hex_trace(s) for s in spans}, {TRACE_ID})
        self.assertEqual(parent_hex(client), hex_span(run))
        self.assertEqual(parent_hex(run), PARENT_ID)
        attributes = dict(client.attributes or {})
        self.assertEqual(attributes[semconv.URL_FULL], "http://upstream.test/v1/chat/completions")
        self.assertEqual(attributes[semconv.HTTP_RESPONSE_STATUS_CODE], 200)
        self.assertEqual(
            fake.requests[0].headers["traceparent"], f"00-{TRACE_ID}-{hex_span(client)}-01"
        )
        self.assertEqual(dict(run.attributes or {})[semconv.GEN_AI_PROVIDER_NAME], "openai")
        self.assertNotIn(SECRET, repr([dict(s.attributes or {}) for s in spans]))
