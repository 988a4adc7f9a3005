# -*- test-case-name: iop.test.edge.ingress.test_record -*-
"""
Each client request is recorded once, with what it did: the placement, how it ended, its
status and error code, its timings — on success, refusal, queueing, a stream, a departed
client, and for arbitrary sequences of requests and disconnects.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from iop.edge.ingress.record import bounded_code
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.harness import (
    CHAT,
    END,
    MESSAGES,
    IngressCase,
    body,
    error,
    sse,
    start,
    usage,
)


class RecordTests(IngressCase):
    def test_a_collected_chat_through_a_tunnel(self) -> None:
        self.edge.clock.advance(100)
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.clock.advance(0.25)
        self.edge.frames(run_id, start(), body(b'{"choices":[]}'), usage(3, 4), END)
        self.assertEqual(self.answer(d)[0], 200)
        [record] = self.edge.records
        self.assertEqual(
            (record.surface, record.operation, record.model, record.provider_id, record.node_id),
            ("openai", "chat", "chat", "p-chat", "node-a"),
        )
        self.assertEqual((record.status, record.outcome, record.error_code), (200, "complete", ""))
        self.assertEqual((record.usage, record.stream), (Usage(3, 4), False))
        self.assertEqual((record.duration, record.queue_wait, record.at), (0.25, 0.0, 100.25))
        self.assertIsNone(record.time_to_first_token)

    def test_a_stream_has_its_first_token_time(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.clock.advance(0.5)
        self.edge.frames(run_id, start(200, "text/event-stream"))
        self.edge.clock.advance(0.25)
        self.edge.frames(run_id, body(sse([{"choices": []}])))
        self.edge.clock.advance(1)
        self.edge.frames(run_id, body(sse(["[DONE]"])), usage(2, 9), END)
        self.assertEqual(self.answer(d)[0], 200)
        [record] = self.edge.records
        self.assertTrue(record.stream)
        self.assertEqual((record.time_to_first_token, record.duration), (0.75, 1.75))
        self.assertEqual((record.outcome, record.usage), ("complete", Usage(2, 9)))

    def test_a_run_on_the_anthropic_surface(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "model": "llama"})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.events(
            run_id,
            RuntimeEvent.start(),
            RuntimeEvent.text("hi"),
            RuntimeEvent.complete(Usage(1, 2)),
        )
        self.assertEqual(self.answer(d)[0], 200)
        [record] = self.edge.records
        self.assertEqual((record.surface, record.operation), ("anthropic", "messages"))
        self.assertEqual((record.model, record.provider_id), ("llama", "p-llama"))
        self.assertEqual((record.outcome, record.usage), ("complete", Usage(1, 2)))

    def test_refusals_carry_their_code_and_no_placement(self) -> None:
        self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT, key="sk-wrong"), 401)
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "nope"}), 404
        )
        self.assertOpenAIError(self.edge.get("/v1/nothing"), 404)
        self.assertOpenAIError(self.edge.post("/v1/chat/completions", {"model": "chat"}), 400)
        unauthorized, unknown, unrouted, invalid = self.edge.records
        self.assertEqual(
            (unauthorized.status, unauthorized.outcome, unauthorized.error_code),
            (401, "refused", "invalid_api_key"),
        )
        # A model the config does not know is never recorded (it could be any text).
        self.assertEqual(
            (unknown.status, unknown.model, unknown.error_code), (404, "", "model_not_found")
        )
        self.assertEqual((unrouted.operation, unrouted.status), ("unrouted", 404))
        self.assertEqual((invalid.status, invalid.outcome), (400, "refused"))
        for record in self.edge.records:
            self.assertEqual((record.provider_id, record.node_id, record.usage), ("", "", None))
            self.assertIsNone(record.queue_wait)

    def test_queue_wait_is_the_time_until_a_provider_was_free(self) -> None:
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        second = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.clock.advance(2)
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(first)[0], 200)
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(second)[0], 200)
        waits = [r.queue_wait for r in self.edge.records]
        self.assertEqual(waits, [0.0, 2.0])

    def test_a_client_gone_while_queued_is_recorded_once_cancelled(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.disconnect()
        [record] = self.edge.records
        self.assertEqual((record.status, record.outcome, record.model), (0, "cancelled", "chat"))
        self.assertIsNone(record.queue_wait)

    def test_a_client_gone_mid_stream_is_recorded_when_the_work_ended(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(200, "text/event-stream"), body(sse([{"choices": []}])))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        # The response has ended, the work has not: nothing yet.
        self.assertEqual(self.edge.records, [])
        self.edge.frames(run_id, error("cancelled"))
        [record] = self.edge.records
        self.assertEqual((record.status, record.outcome, record.stream), (200, "cancelled", True))

    def test_codes_are_bounded(self) -> None:
        self.assertEqual(bounded_code("queue_timeout"), "queue_timeout")
        for code in ("", "Bearer sk-1", "a" * 49, "x-y", "naïve", "1abc"):
            self.assertEqual(bounded_code(code), "other", code)


class ArbitraryTrafficTests(IngressCase):
    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(
            st.sampled_from(["ok", "stream", "refused", "unknown", "leave", "leave-queued"]),
            max_size=12,
        )
    )
    def test_every_request_is_recorded_exactly_once(self, script: list[str]) -> None:
        self.setUp()
        for step in script:
            if step == "refused":
                self.edge.post("/v1/chat/completions", CHAT, key="sk-wrong")
                self.edge.flush()
                continue
            if step == "unknown":
                self.edge.post("/v1/chat/completions", {**CHAT, "model": "nope"})
                self.edge.flush()
                continue
            stream = step == "stream"
            self.edge.post("/v1/chat/completions", {**CHAT, "stream": stream})
            self.edge.flush()
            if step == "leave-queued" and self.edge.in_flight() == 1:
                self.edge.post("/v1/chat/completions", CHAT)
                self.edge.flush()
                self.edge.disconnect()
            tunnels = self.edge.requests("provider_tunnel_request")
            run_id = tunnels[-1].run_id
            content_type = "text/event-stream" if stream else "application/json"
            self.edge.frames(run_id, start(200, content_type), body(b"{}"))
            if step == "leave":
                self.edge.disconnect()
                self.edge.frames(run_id, error("cancelled"))
            else:
                self.edge.frames(run_id, END)
            self.edge.flush()
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(len(self.edge.records), len(self.edge.resource.requests))
        outcomes = [r.outcome for r in self.edge.records]
        self.assertEqual(
            outcomes.count("refused"), script.count("refused") + script.count("unknown")
        )
