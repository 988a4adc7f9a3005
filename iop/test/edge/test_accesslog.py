# -*- test-case-name: iop.test.edge.test_accesslog -*-
"""The access log: one event per finished request, its text and its structured keys."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.accesslog import FLOOD_BURST, FLOOD_INTERVAL_SEC, NAMESPACE, AccessLog
from iop.edge.events import NodeEvent, NodeEventKind, RequestFinished
from iop.runtime.events import Usage


class AccessLogTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        observer: Any = self.events.append
        self.access = AccessLog(Logger(namespace=NAMESPACE, observer=observer))

    def test_a_streamed_chat(self) -> None:
        self.access.observe(
            RequestFinished(
                "openai",
                "chat",
                200,
                "complete",
                0.8124,
                model="chat",
                provider_id="p-chat",
                node_id="node-a",
                stream=True,
                usage=Usage(12, 64, reasoning_tokens=3),
                time_to_first_token=0.0401,
                queue_wait=0.0,
            )
        )
        [event] = self.events
        self.assertEqual(
            formatEvent(event),
            "openai chat chat \N{RIGHTWARDS ARROW} 200 complete in 812.4 ms (first token 40.1 ms, "
            "queue 0.0 ms, tokens 12/64, p-chat@node-a)",
        )
        self.assertEqual(event["log_namespace"], "iop.edge.access")
        expected = {
            "surface": "openai",
            "operation": "chat",
            "model": "chat",
            "provider_id": "p-chat",
            "node_id": "node-a",
            "status": 200,
            "outcome": "complete",
            "stream": True,
            "duration_ms": 812.4,
            "ttft_ms": 40.1,
            "queue_ms": 0.0,
            "input_tokens": 12,
            "output_tokens": 64,
            "reasoning_tokens": 3,
            "cached_input_tokens": None,
        }
        self.assertEqual({k: event[k] for k in expected}, expected)

    def test_a_refusal(self) -> None:
        self.access.observe(
            RequestFinished(
                "anthropic", "messages", 401, "refused", 0.0, error_code="invalid_api_key"
            )
        )
        [event] = self.events
        self.assertEqual(
            formatEvent(event),
            "anthropic messages - \N{RIGHTWARDS ARROW} 401 refused in 0.0 ms (invalid_api_key)",
        )
        self.assertIsNone(event["input_tokens"])

    def test_the_default_logger_is_in_its_own_namespace(self) -> None:
        self.assertEqual(AccessLog().log.namespace, "iop.edge.access")

    def test_other_events_are_not_logged(self) -> None:
        self.access.observe(NodeEvent(NodeEventKind.CONNECTED, "node-a"))
        self.assertEqual(self.events, [])


class FloodTests(SynchronousTestCase):
    """The listener's own refusals, by the thousand, are summed up; requests never are."""

    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        observer: Any = self.events.append
        self.clock = Clock()
        self.access = AccessLog(Logger(namespace=NAMESPACE, observer=observer), self.clock)

    def refuse(self, code: str) -> None:
        self.access.observe(RequestFinished("openai", "", 503, "refused", 0.0, error_code=code))

    def test_a_flood_of_refusals_is_one_line_per_code_and_a_summary(self) -> None:
        for _ in range(800):
            self.refuse("too_many_connections")
        for _ in range(300):
            self.refuse("request_timeout")
        self.assertEqual(len(self.events), 2)
        self.clock.advance(FLOOD_INTERVAL_SEC)
        summary = self.events[-1]
        self.assertEqual(summary["log_level"].name, "warn")
        self.assertEqual(summary["count"], 1098)
        self.assertEqual(summary["refused"], {"too_many_connections": 799, "request_timeout": 299})
        self.assertIn("1098 more client connections refused", formatEvent(summary))
        # A new interval: each code has its line again.
        self.refuse("too_many_connections")
        self.assertEqual(len(self.events), 4)
        self.clock.advance(FLOOD_INTERVAL_SEC)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_requests_and_other_refusals_always_have_their_line(self) -> None:
        for _ in range(FLOOD_BURST * 3):
            self.access.observe(
                RequestFinished("openai", "chat", 401, "refused", 0.0, error_code="invalid_api_key")
            )
            self.access.observe(RequestFinished("openai", "chat", 200, "complete", 0.1))
        self.assertEqual(len(self.events), FLOOD_BURST * 6)
