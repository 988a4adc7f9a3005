"""The CLI agent's span: ``invoke_agent {agent}`` under the run's span, spawn to exit."""

from __future__ import annotations

import signal
from typing import Any

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters.cli.provider import CLIProvider
from iop.runtime import ExecutionSpec
from iop.telemetry import semconv
from iop.test.node.adapters.test_cli_parsing import (
    ENVIRON,
    INIT,
    RESULT,
    Harness,
    config,
    delta,
    fake_which,
    ndjson,
)
from iop.test.telemetry.support import (
    PARENT_ID,
    TRACE_ID,
    TRACEPARENT,
    hex_trace,
    memory_tracing,
    parent_hex,
)


class CLISpanTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness(self)
        self.tracing, self.exporter = memory_tracing()
        self.h.provider = CLIProvider(
            config(workspace=self.h.workspace),
            self.h.clock,
            signal_group=self.h.signal_group,
            which=fake_which,
            environ=ENVIRON,
            tracing=self.tracing,
        )

    def execute(self) -> Any:
        metadata = {"traceparent": TRACEPARENT}
        spec = ExecutionSpec(
            run_id="r1", target="claude-x", input="secret prompt", metadata=metadata
        )
        return self.h.provider.execute(spec, self.h.events.append)

    def span(self) -> tuple[Any, dict[str, Any]]:
        (span,) = self.exporter.get_finished_spans()
        self.assertEqual(hex_trace(span), TRACE_ID)
        self.assertEqual(parent_hex(span), PARENT_ID)
        return span, dict(span.attributes or {})

    def test_completed(self) -> None:
        d = self.execute()
        pid = self.h.last["transport"].pid
        self.h.out(ndjson(INIT, delta(0, "Hello"), RESULT))
        self.assertEqual(self.exporter.get_finished_spans(), ())
        self.h.exit(0)
        self.successResultOf(d)
        span, attributes = self.span()
        self.assertEqual(span.name, "invoke_agent claude")
        self.assertEqual(attributes[semconv.GEN_AI_OPERATION_NAME], "invoke_agent")
        self.assertEqual(attributes[semconv.GEN_AI_AGENT_NAME], "claude")
        self.assertEqual(attributes[semconv.GEN_AI_REQUEST_MODEL], "claude-x")
        self.assertEqual(attributes[semconv.PROCESS_PID], pid)
        self.assertNotIn("secret prompt", repr(attributes))
        self.assertNotIn("Hello", repr(attributes))
        # The agent's environment carries the span's context.
        env = self.h.last["env"]
        self.assertEqual(env["TRACEPARENT"], f"00-{TRACE_ID}-{span.context.span_id:016x}-01")

    def test_cancelled(self) -> None:
        d = self.execute()
        d.cancel()
        self.h.exit(None, signal.SIGTERM)
        self.failureResultOf(d, CancelledError)
        _, attributes = self.span()
        self.assertEqual(attributes[semconv.IOP_OUTCOME], "cancelled")
        self.assertNotIn(semconv.ERROR_TYPE, attributes)


class CLIUntracedTests(SynchronousTestCase):
    def test_environment_untouched(self) -> None:
        """Tracing off: no TRACEPARENT is added, whatever the run's metadata carries."""
        h = Harness(self)
        h.execute(metadata={"traceparent": TRACEPARENT})
        self.assertNotIn("TRACEPARENT", h.last["env"])
