"""
The Anthropic-compatible surface: native passthrough, the Chat bridge over a tunnel (whole and
streamed, upstream errors, failures mid-stream) and over normalized runs, thinking, the
``max_tokens`` policy, capability refusals and ``count_tokens`` (local and native).

Messages and stream events are checked against the official ``anthropic`` SDK's types and the
Messages streaming order (helpers shared with the bridge tests).
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.tokens import count_tokens
from iop.formats.sse import SSEParser
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.harness import (
    END,
    MESSAGES,
    IngressCase,
    body,
    error,
    sse,
    start,
    usage,
)
from iop.test.edge.ingress.test_messages_encode import (
    check_order,
    validate_events,
    validate_message,
)
from iop.testing.fake_openai import FakeOpenAI
from iop.wire import runtime_pb2 as pb

TOOLS = [
    {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    parser = SSEParser()
    return [(e.event, json.loads(e.data)) for e in parser.feed(raw) + parser.finish()]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bare-target",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "bare-target",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello", "reasoning_content": "hmm"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


class NativeTests(IngressCase):
    REQUEST = {**MESSAGES, "model": "native", "max_tokens": 50, "top_k": 3}

    def test_passthrough(self) -> None:
        d = self.edge.post("/v1/messages", self.REQUEST, headers={"anthropic-beta": "b1"})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(
            (sent.operation, sent.target, sent.stream), ("messages", "claude-target", False)
        )
        self.assertEqual(json.loads(sent.body), {**self.REQUEST, "model": "claude-target"})
        headers = {h.name: h.value for h in sent.headers}
        self.assertEqual(headers["anthropic-version"], "2023-06-01")
        self.assertEqual(headers["anthropic-beta"], "b1")
        upstream = b'{"type":"message","content":[]}'
        self.edge.frames(sent.run_id, start(), body(upstream), usage(1, 2), END)
        code, _, data = self.answer(d)
        self.assertEqual((code, data), (200, upstream))
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_passthrough_keeps_the_providers_retry_advice(self) -> None:
        d = self.edge.post("/v1/messages", self.REQUEST)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        error = b'{"type":"error","error":{"type":"authentication_error","message":"no"}}'
        answer = start(401)
        answer["headers"].append(pb.Header(name="x-should-retry", value="false"))
        self.edge.frames(sent.run_id, answer, body(error), END)
        code, headers, data = self.answer(d)
        self.assertEqual((code, data), (401, error))
        self.assertEqual(headers.getRawHeaders("x-should-retry"), ["false"])

    def test_stream_passthrough_keeps_the_client_version(self) -> None:
        d = self.edge.post(
            "/v1/messages",
            {**self.REQUEST, "stream": True},
            headers={"anthropic-version": "2099-01-01"},
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertTrue(sent.stream)
        self.assertIn(
            ("anthropic-version", "2099-01-01"), [(h.name, h.value) for h in sent.headers]
        )
        raw = b'event: message_start\ndata: {"type":"message_start"}\n\n'
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(raw), END)
        code, headers, data = self.answer(d)
        self.assertEqual((code, data), (200, raw))
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])

    def test_upstream_error_passes_through(self) -> None:
        d = self.edge.post("/v1/messages", self.REQUEST)
        self.edge.flush()
        upstream = b'{"type":"error","error":{"type":"overloaded_error","message":"busy"}}'
        self.edge.frames(self.edge.tunnel_request().run_id, start(529), body(upstream), END)
        code, _, data = self.answer(d)
        self.assertEqual((code, data), (529, upstream))


class BridgeTunnelTests(IngressCase):
    def test_request_is_converted(self) -> None:
        self.edge.post("/v1/messages", {**MESSAGES, "system": "be brief", "tools": TOOLS})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual((sent.operation, sent.target), ("chat_completions", "bare-target"))
        chat = json.loads(sent.body)
        self.assertEqual(chat["model"], "bare-target")
        self.assertEqual(chat["max_tokens"], 100)
        self.assertEqual(chat["messages"][0], {"role": "system", "content": "be brief"})
        self.assertEqual(chat["tools"][0]["function"]["name"], "get_weather")

    def test_whole_answer(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        self.edge.frames(
            self.edge.tunnel_request().run_id,
            start(),
            body(json.dumps(COMPLETION).encode()),
            END,
        )
        code, message = self.json_answer(d)
        self.assertEqual(code, 200)
        validate_message(message)
        self.assertEqual(message["model"], "bare")
        # No thinking: the profile-less provider may not pass it (and it was not asked for).
        self.assertEqual(message["content"], [{"type": "text", "text": "hello"}])
        self.assertEqual(message["stop_reason"], "end_turn")
        self.assertEqual(message["usage"]["input_tokens"], 5)

    def test_stream(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(json.loads(sent.body)["stream_options"], {"include_usage": True})
        upstream = sse(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "hel"}),
                chunk({"content": "lo"}),
                chunk({}, "stop"),
                {**chunk({}), "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
                "[DONE]",
            ]
        )
        self.edge.frames(sent.run_id, start(200, "text/event-stream"))
        response = self.successResultOf(d)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        content = response.content()
        # Split anywhere: the SSE parser reassembles.
        for i in range(0, len(upstream), 13):
            self.edge.frames(sent.run_id, body(upstream[i : i + 13]))
        self.edge.frames(sent.run_id, END)
        events = events_of(self.successResultOf(content))
        validate_events(events)
        check_order(self, events)
        text = "".join(e["delta"]["text"] for name, e in events if name == "content_block_delta")
        self.assertEqual(text, "hello")
        self.assertEqual(events[-2][1]["usage"]["output_tokens"], 2)
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "end_turn")

    def test_upstream_error_status_in_anthropic_shape(self) -> None:
        for stream in (False, True):
            d = self.edge.post("/v1/messages", {**MESSAGES, "stream": stream})
            self.edge.flush()
            upstream = b'{"error":{"message":"context too long","type":"invalid_request_error"}}'
            self.edge.frames(self.edge.tunnel_request().run_id, start(400), body(upstream), END)
            self.assertAnthropicError(d, 400, "invalid_request_error", "context too long")

    def test_upstream_error_echoing_a_credential_is_redacted(self) -> None:
        # An upstream 401 that echoes the credential it got: IOP's own Anthropic error (whole
        # and streamed) carries the upstream's message, never the credential.
        secret = "sk-upstream-0123456789abcdefXYZ"
        echoes = [
            json.dumps(
                {"error": {"message": f"bad header Authorization: Bearer {secret}", "type": "x"}}
            ).encode(),
            f"unauthorized: x-api-key: {secret}".encode(),
            json.dumps({"detail": {"api_key": secret}}).encode(),
        ]
        for stream in (False, True):
            for upstream in echoes:
                d = self.edge.post("/v1/messages", {**MESSAGES, "stream": stream})
                self.edge.flush()
                run_id = self.edge.tunnel_request().run_id
                self.edge.frames(run_id, start(401), body(upstream), END)
                code, _, data = self.answer(d)
                self.assertEqual(code, 401)
                self.assertNotIn(secret.encode(), data)
                answer = json.loads(data)
                self.assertEqual(answer["error"]["type"], "authentication_error")
                self.assertIn("[redacted]", answer["error"]["message"])
        self.assertEqual(self.edge.in_flight("p-bare"), 0)

    def test_failure_mid_stream_echoing_a_credential_is_redacted(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(
            run_id,
            start(200, "text/event-stream"),
            body(sse([chunk({"content": "par"})])),
            error("upstream said: Authorization: Bearer abcdefghijklmnop"),
        )
        events = events_of(self.answer(d)[2])
        self.assertEqual(events[-1][0], "error")
        self.assertEqual(
            events[-1][1]["error"]["message"],
            "the provider's stream failed: upstream said: Authorization: Bearer [redacted]",
        )

    def test_run_error_echoing_a_credential_is_redacted(self) -> None:
        for stream in (False, True):
            d = self.edge.post("/v1/messages", {**MESSAGES, "model": "llama", "stream": stream})
            self.edge.flush()
            self.edge.events(
                self.edge.run_request().run_id,
                RuntimeEvent.failed('upstream HTTP 401: {"api_key": "key-0123456789"}'),
            )
            _, _, data = self.answer(d)
            self.assertNotIn(b"key-0123456789", data)
            self.assertIn(b"[redacted]", data)

    def test_failure_mid_stream_is_an_error_event(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(
            run_id,
            start(200, "text/event-stream"),
            body(sse([chunk({"content": "par"})])),
            error("upstream reset"),
        )
        events = events_of(self.answer(d)[2])
        validate_events(events)
        check_order(self, events)
        self.assertEqual(events[-1][0], "error")
        self.assertIn("upstream reset", events[-1][1]["error"]["message"])
        self.assertEqual(self.edge.in_flight("p-bare"), 0)

    def test_malformed_chunk_stops_the_provider(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(200, "text/event-stream"), body(b"data: {nope\n\n"))
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.frames(run_id, error("cancelled"))
        events = events_of(self.answer(d)[2])
        self.assertEqual([name for name, _ in events], ["error"])

    def test_an_error_chunk_is_an_error_event_and_stops_the_provider(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        failing = [chunk({"content": "par"}), {"error": {"message": "overloaded"}}]
        self.edge.frames(run_id, start(200, "text/event-stream"), body(sse(failing)))
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.frames(run_id, END)
        events = events_of(self.answer(d)[2])
        check_order(self, events)
        self.assertEqual(events[-1][1]["error"]["message"], "overloaded")

    def test_bad_answer_is_502(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        self.edge.frames(self.edge.tunnel_request().run_id, start(), body(b"[]"), END)
        self.assertAnthropicError(d, 502, "api_error")

    def test_unconvertible_request_is_400_and_releases(self) -> None:
        bad = {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "video"}]}]}
        self.assertAnthropicError(self.edge.post("/v1/messages", bad), 400, "invalid_request_error")
        self.assertEqual(self.edge.in_flight("p-bare"), 0)
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])


class ThinkingTests(IngressCase):
    THINK = {**MESSAGES, "model": "chat", "thinking": {"type": "enabled", "budget_tokens": 5000}}

    def answer_with_reasoning(
        self, request: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self.edge.post("/v1/messages", request)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(json.dumps(COMPLETION).encode()), END)
        code, message = self.json_answer(d)
        self.assertEqual(code, 200, message)
        return json.loads(sent.body), message

    def test_thinking_when_allowed_and_asked(self) -> None:
        chat, message = self.answer_with_reasoning(self.THINK)
        self.assertEqual(chat["reasoning_effort"], "medium")
        validate_message(message)
        self.assertEqual(
            message["content"][0], {"type": "thinking", "thinking": "hmm", "signature": ""}
        )

    def test_no_thinking_block_when_not_asked(self) -> None:
        request = {k: v for k, v in self.THINK.items() if k != "thinking"}
        chat, message = self.answer_with_reasoning(request)
        self.assertNotIn("reasoning_effort", chat)
        self.assertEqual([b["type"] for b in message["content"]], ["text"])

    def test_thinking_refused_without_the_extension(self) -> None:
        for name in ("bare", "llama"):
            self.assertAnthropicError(
                self.edge.post("/v1/messages", {**self.THINK, "model": name}),
                400,
                "invalid_request_error",
                "thinking",
            )
        self.assertEqual(self.edge.in_flight("p-bare") + self.edge.in_flight("p-llama"), 0)


class PolicyTests(IngressCase):
    def test_default_and_floor(self) -> None:
        request = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
        self.edge.post("/v1/messages", request)
        self.edge.flush()
        self.assertEqual(json.loads(self.edge.tunnel_request().body)["max_tokens"], 64)
        self.edge.post("/v1/messages", {**request, "model": "llama", "max_tokens": 1})
        self.edge.flush()
        self.assertEqual(self.edge.run_request().max_tokens, 8)

    def test_max_tokens_required_without_a_default(self) -> None:
        request = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**request, "model": "native"}),
            400,
            "invalid_request_error",
            "max_tokens",
        )

    def test_schema(self) -> None:
        for bad in (
            {**MESSAGES, "messages": []},
            {**MESSAGES, "tools": {}},
            {**MESSAGES, "stream": 1},
            {**MESSAGES, "max_tokens": -1},
            {k: v for k, v in MESSAGES.items() if k != "model"},
        ):
            self.assertAnthropicError(
                self.edge.post("/v1/messages", bad), 400, "invalid_request_error"
            )
        self.assertEqual(self.edge.sent, [])

    def test_unsupported_profile(self) -> None:
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**MESSAGES, "model": "plain", "stream": True}),
            400,
            "invalid_request_error",
            "streaming",
        )
        self.assertEqual(self.edge.sent, [])


class BridgeRunTests(IngressCase):
    LLAMA = {**MESSAGES, "model": "llama"}

    def post_run(self, request: dict[str, Any]) -> tuple[Deferred[Any], str]:
        d = self.edge.post("/v1/messages", request)
        self.edge.flush()
        return d, self.edge.run_request().run_id

    def test_run_input_and_budget(self) -> None:
        _, run_id = self.post_run(self.LLAMA)
        sent = self.edge.run_request()
        chat = json.loads(sent.input)
        self.assertEqual(chat["model"], "llama3.2")
        self.assertEqual(chat["messages"], [{"role": "user", "content": "hi"}])
        self.assertEqual((sent.max_tokens, sent.thinking_token_budget), (100, 512))
        self.edge.events(run_id, RuntimeEvent.complete())
        self.post_run({**self.LLAMA, "thinking": {"type": "disabled"}})
        self.assertEqual(self.edge.run_request().thinking_token_budget, 0)

    def test_only_a_non_streaming_client_collects(self) -> None:
        _, run_id = self.post_run(self.LLAMA)
        self.assertTrue(self.edge.run_request().collect)
        self.edge.events(run_id, RuntimeEvent.complete())
        self.post_run({**self.LLAMA, "stream": True})
        self.assertFalse(self.edge.run_request().collect)

    def test_whole_message(self) -> None:
        d, run_id = self.post_run({**self.LLAMA, "tools": TOOLS})
        call = {
            "id": "call_9",
            "function": {"name": "get_weather", "arguments": '{"city":"Seoul"}'},
        }
        self.edge.events(
            run_id,
            RuntimeEvent.start(),
            RuntimeEvent.text("ok"),
            RuntimeEvent.complete(Usage(3, 4), {"openai_tool_calls": json.dumps([call])}),
        )
        code, message = self.json_answer(d)
        self.assertEqual(code, 200)
        validate_message(message)
        self.assertEqual(message["model"], "llama")
        self.assertEqual(message["stop_reason"], "tool_use")
        self.assertEqual(
            message["content"][1],
            {"type": "tool_use", "id": "call_9", "name": "get_weather", "input": {"city": "Seoul"}},
        )
        self.assertEqual(message["usage"]["output_tokens"], 4)

    def test_stream(self) -> None:
        d, run_id = self.post_run({**self.LLAMA, "stream": True})
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.reasoning("hidden"), RuntimeEvent.text("hi")
        )
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        content = response.content()
        self.edge.events(run_id, RuntimeEvent.complete(Usage(2, 1)))
        events = events_of(self.successResultOf(content))
        validate_events(events)
        check_order(self, events)
        self.assertNotIn("thinking", json.dumps(events))
        self.assertEqual(events[-1][0], "message_stop")

    def test_failure_before_output_is_an_http_error(self) -> None:
        d, run_id = self.post_run({**self.LLAMA, "stream": True})
        self.edge.events(run_id, RuntimeEvent.failed("ollama: model not found"))
        self.assertAnthropicError(d, 502, "api_error", "model not found")
        d, run_id = self.post_run(self.LLAMA)
        self.edge.events(run_id, RuntimeEvent.failed("ollama: model not found"))
        self.assertAnthropicError(d, 502, "api_error", "model not found")

    def test_failure_mid_stream_is_an_error_event(self) -> None:
        d, run_id = self.post_run({**self.LLAMA, "stream": True})
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.text("x"), RuntimeEvent.failed("node gone")
        )
        events = events_of(self.answer(d)[2])
        check_order(self, events)
        self.assertEqual(events[-1][0], "error")

    def test_cli_direct_route(self) -> None:
        d, run_id = self.post_run({**MESSAGES, "model": "cli"})
        self.assertEqual(self.edge.run_request().adapter, "agent")
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.text("done"), RuntimeEvent.complete()
        )
        code, message = self.json_answer(d)
        self.assertEqual((code, message["content"]), (200, [{"type": "text", "text": "done"}]))


class CountTokensTests(IngressCase):
    REQUEST = {"model": "counted", "messages": [{"role": "user", "content": "hello there"}]}

    def test_local_counter_needs_no_provider(self) -> None:
        code, answer = self.json_answer(self.edge.post("/v1/messages/count_tokens", self.REQUEST))
        self.assertEqual((code, answer), (200, {"input_tokens": count_tokens(self.REQUEST)}))
        self.assertEqual(self.edge.sent, [])
        self.assertEqual(self.edge.in_flight(), 0)

    def test_local_counter_while_the_provider_is_busy(self) -> None:
        self.edge.post("/v1/chat/completions", {**self.REQUEST, "model": "chat"})
        self.edge.flush()
        code, _ = self.json_answer(self.edge.post("/v1/messages/count_tokens", self.REQUEST))
        self.assertEqual(code, 200)

    def test_native_fallback(self) -> None:
        d = self.edge.post("/v1/messages/count_tokens", {**self.REQUEST, "model": "native"})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual((sent.operation, sent.stream), ("count_tokens", False))
        self.assertEqual(json.loads(sent.body)["model"], "claude-target")
        self.edge.frames(sent.run_id, start(), body(b'{"input_tokens":9}'), END)
        self.assertEqual(self.json_answer(d), (200, {"input_tokens": 9}))
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_unsupported_elsewhere(self) -> None:
        for name in ("bare", "chat", "llama", "cli"):
            error_ = self.assertAnthropicError(
                self.edge.post("/v1/messages/count_tokens", {**self.REQUEST, "model": name}),
                400,
                "invalid_request_error",
                "count",
            )
            self.assertTrue(error_["message"])
        self.assertEqual(self.edge.sent, [])

    def test_bad_requests(self) -> None:
        self.assertAnthropicError(
            self.edge.post("/v1/messages/count_tokens", {"model": "counted"}),
            400,
            "invalid_request_error",
        )
        self.assertAnthropicError(
            self.edge.post("/v1/messages/count_tokens", {**self.REQUEST, "model": "nope"}),
            404,
            "not_found_error",
        )


class FakeMessagesUpstreamTests(SynchronousTestCase):
    """
    The fake upstream's minimal Anthropic-shaped ``/v1/messages`` and ``count_tokens`` (the
    native path of the system tests) answer in shapes the ``anthropic`` SDK accepts.
    """

    def post(self, path: str, request: dict[str, Any], version: bool = True) -> tuple[int, bytes]:
        http: Any = StubTreq(FakeOpenAI(Clock(), tokens=4, anthropic_api=True).resource())
        headers = {"anthropic-version": "2023-06-01"} if version else {}
        d = http.post(f"http://fake.test{path}", data=json.dumps(request).encode(), headers=headers)
        http.flush()
        response = self.successResultOf(d)
        content = response.content()
        http.flush()
        return response.code, self.successResultOf(content)

    REQUEST = {
        "model": "m",
        "max_tokens": 2,
        "system": "be",
        "messages": [{"role": "user", "content": "hi you"}],
    }

    def test_whole_message(self) -> None:
        code, data = self.post("/v1/messages", self.REQUEST)
        self.assertEqual(code, 200)
        message = json.loads(data)
        validate_message(message)
        self.assertEqual(message["content"], [{"type": "text", "text": "tok0 tok1"}])
        self.assertEqual(message["stop_reason"], "max_tokens")
        self.assertEqual(message["usage"], {"input_tokens": 3, "output_tokens": 2})

    def test_stream(self) -> None:
        code, data = self.post("/v1/messages", {**self.REQUEST, "max_tokens": 10, "stream": True})
        self.assertEqual(code, 200)
        events = events_of(data)
        validate_events(events)
        check_order(self, events)
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "end_turn")

    def test_count_tokens(self) -> None:
        self.assertEqual(
            self.post("/v1/messages/count_tokens", self.REQUEST), (200, b'{"input_tokens": 3}')
        )

    def test_off_by_default(self) -> None:
        http: Any = StubTreq(FakeOpenAI(Clock()).resource())
        d = http.post("http://fake.test/v1/messages", data=b"{}")
        http.flush()
        self.assertEqual(self.successResultOf(d).code, 404)

    def test_refusals(self) -> None:
        code, data = self.post("/v1/messages", self.REQUEST, version=False)
        self.assertEqual(code, 400)
        self.assertEqual(json.loads(data)["type"], "error")
        code, _ = self.post("/v1/messages", {**self.REQUEST, "max_tokens": None})
        self.assertEqual(code, 400)


class ClaudeCodeShapeTests(IngressCase):
    """What Claude Code sends: ``?beta=true``, a long ``anthropic-beta``, a mid-conversation
    system message, ``cache_control``, adaptive thinking, ``context_management``."""

    BETA = "claude-code-20250219,interleaved-thinking-2025-05-14,some-future-beta-2099-01-01"

    def request(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "max_tokens": 100,
            "stream": True,
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "env"}]},
            ],
            "tools": TOOLS,
            "metadata": {"user_id": "device-1"},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "output_config": {"effort": "high"},
        }

    def post(self, model: str, body: dict[str, Any] | None = None) -> Deferred[Any]:
        d = self.edge.post(
            "/v1/messages?beta=true",
            body or self.request(model),
            headers={"anthropic-beta": self.BETA},
        )
        self.edge.flush()
        return d

    def expected_messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "env"},
        ]

    def test_over_the_chat_bridge(self) -> None:
        self.post("bare")
        chat = json.loads(self.edge.tunnel_request().body)
        self.assertEqual(chat["messages"], self.expected_messages())
        self.assertEqual(chat["user"], "device-1")
        self.assertNotIn("context_management", chat)

    def test_over_runs(self) -> None:
        for model in ("llama", "cli"):
            self.post(model)
            chat = json.loads(self.edge.run_request().input)
            self.assertEqual(chat["messages"], self.expected_messages(), model)

    def test_images_on_a_cli_agent_are_refused_naming_the_block(self) -> None:
        image = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "x"},
        }
        body = {**self.request("cli"), "messages": [{"role": "user", "content": [image]}]}
        self.assertAnthropicError(
            self.post("cli", body), 400, "invalid_request_error", "messages[0].content[0]:"
        )
        self.assertEqual(self.edge.requests("run_request"), [])
