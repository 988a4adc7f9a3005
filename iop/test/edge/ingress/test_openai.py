"""
The OpenAI-compatible surface: chat completions through a tunnel (passthrough, policy,
backpressure) and through normalized runs (exact chunk/completion shapes, reasoning, tool calls,
the text-tool fallback, errors), the Responses API and capability refusals.

Every chunk and completion produced from run events is validated against the official
``openai`` SDK's types.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ProfileConfig
from iop.edge.ingress.openai import RunEventsToChunks, check_chat, check_responses
from iop.edge.ingress.profiles import Route, Unsupported
from iop.formats.sse import SSEParser
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.harness import (
    AT_CAPACITY,
    CHAT,
    END,
    IngressCase,
    body,
    error,
    profiles,
    sse,
    start,
    usage,
)
from iop.testing.fake_openai import FAIL_500_MODEL, FakeOpenAI, fake_text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
}
LLAMA = {**CHAT, "model": "llama"}


def data_events(raw: bytes) -> list[str]:
    parser = SSEParser()
    return [e.data for e in parser.feed(raw) + parser.finish()]


def chunks_of(raw: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The JSON chunks of an SSE body and whether it ended with ``[DONE]``."""
    datas = data_events(raw)
    done = bool(datas) and datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas if d != "[DONE]"], done


class TunnelChatTests(IngressCase):
    def test_passthrough_with_target_and_policy(self) -> None:
        d = self.edge.post(
            "/v1/chat/completions",
            {**CHAT, "temperature": 0.5, "stream_options": {"include_usage": False}},
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual((sent.adapter, sent.target), ("chat", "chat-target"))
        self.assertEqual(
            (sent.operation, sent.stream, sent.profile), ("chat_completions", False, "openai-chat")
        )
        # The request's id goes on to an OpenAI-protocol upstream (test_request_ids has more).
        request_id = sent.metadata["request_id"]
        self.assertEqual(
            {h.name: h.value for h in sent.headers},
            {
                "content-type": "application/json",
                "accept": "application/json",
                "x-request-id": request_id,
            },
        )
        payload = json.loads(sent.body)
        self.assertEqual(
            payload,
            {
                "model": "chat-target",
                "messages": CHAT["messages"],
                "temperature": 0.5,
                "stream_options": {"include_usage": False},
                "max_tokens": 256,
            },
        )
        upstream = b'{"id":"x","object":"chat.completion","model":"chat-target","choices":[]}'
        self.edge.frames(
            sent.run_id, start(), body(upstream[:10]), body(upstream[10:]), usage(3, 4), END
        )
        code, headers, data = self.answer(d)
        self.assertEqual((code, data), (200, upstream))
        self.assertEqual(headers.getRawHeaders("content-type"), ["application/json"])
        self.assertIsNone(headers.getRawHeaders("x-upstream-secret-header"))
        [(dispatch, reported, outcome)] = self.edge.finished
        self.assertEqual(
            (dispatch.provider_id, dispatch.usage_attribution), ("p-chat", "team-p-chat")
        )
        self.assertEqual((reported, outcome), (Usage(3, 4), "complete"))
        self.assertEqual(self.edge.in_flight(), 0)

    def test_floor_applies_to_each_limit_given(self) -> None:
        self.edge.post(
            "/v1/chat/completions", {**CHAT, "max_tokens": 4, "max_completion_tokens": 40}
        )
        self.edge.flush()
        payload = json.loads(self.edge.tunnel_request().body)
        self.assertEqual((payload["max_tokens"], payload["max_completion_tokens"]), (16, 40))
        self.edge.frames(self.edge.tunnel_request().run_id, error("x"))
        self.edge.post("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2})
        self.edge.flush()
        payload = json.loads(self.edge.tunnel_request().body)
        self.assertEqual(payload["max_completion_tokens"], 16)
        self.assertNotIn("max_tokens", payload)

    def test_stream_passthrough_as_it_arrives(self) -> None:
        d = self.edge.post(
            "/v1/chat/completions",
            {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertTrue(sent.stream)
        self.assertEqual(json.loads(sent.body)["stream_options"], {"include_usage": True})
        self.assertIn(("accept", "text/event-stream"), [(h.name, h.value) for h in sent.headers])
        first = b'data: {"choices":[{"delta":{"content":"he"}}]}\n\n'
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(first))
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        received: list[bytes] = []
        done = response.collect(received.append)
        self.edge.flush()
        self.assertEqual(b"".join(received), first)
        self.assertNoResult(done)
        rest = b"data: [DONE]\n\n"
        self.edge.frames(sent.run_id, body(rest), END)
        self.successResultOf(done)
        self.assertEqual(b"".join(received), first + rest)

    def test_backpressure_pauses_the_tunnel(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(200, "text/event-stream"))
        self.successResultOf(d)
        stream = self.edge.tunnels.get(sent.run_id)
        assert stream is not None
        channel = self.edge.resource.requests[-1].channel
        channel.pauseProducing()
        self.edge.frames(sent.run_id, body(b"data: 1\n\n"))
        self.assertEqual(stream.buffered_bytes, 9)
        channel.resumeProducing()
        self.assertEqual(stream.buffered_bytes, 0)

    def test_failure_after_start_cuts_the_connection(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(b"data: 1\n\n"))
        response = self.successResultOf(d)
        done = response.content()
        self.edge.frames(sent.run_id, error("upstream reset"))
        self.edge.flush()
        self.failureResultOf(done)
        self.assertEqual(self.edge.in_flight(), 0)

    def test_bare_openai_compat_provider_is_a_chat_backend(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "bare", "tools": TOOLS})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual((sent.target, sent.profile), ("bare-target", ""))
        self.edge.frames(sent.run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(d)[0], 200)


class CapabilityTests(IngressCase):
    def test_streaming_needs_the_capability(self) -> None:
        error_ = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "plain", "stream": True}),
            400,
            "streaming",
        )
        self.assertEqual(error_["code"], "unsupported")
        self.assertEqual(self.edge.sent, [])

    def test_tools_need_the_capability(self) -> None:
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "plain", "tools": TOOLS}),
            400,
            "tools",
        )

    def test_check_functions(self) -> None:
        chat, plain, native, responses = profiles()
        check_chat(None, stream=True, tools=True)
        check_chat(chat, stream=True, tools=True)
        self.assertRaises(Unsupported, check_chat, plain, stream=True, tools=False)
        self.assertEqual(check_chat(chat, stream=True, tools=True), Route.NATIVE)
        self.assertEqual(check_chat(native, stream=True, tools=True), Route.BRIDGE)
        # Every driver serves chat: Messages and Responses through their bridges
        # (iop.test.edge.ingress.test_chat_messages, test_chat_responses).
        self.assertEqual(check_chat(responses, stream=True, tools=True), Route.BRIDGE)
        bare = ProfileConfig(name="bare", driver="openai_responses")
        self.assertEqual(check_chat(bare, stream=False, tools=False), Route.BRIDGE)
        self.assertRaises(Unsupported, check_chat, bare, stream=False, tools=True)
        self.assertEqual(check_responses(responses, stream=True), Route.NATIVE)
        self.assertEqual(check_responses(None, stream=True, tools=True), Route.BRIDGE)
        self.assertEqual(check_responses(chat, stream=True, tools=True), Route.BRIDGE)
        self.assertRaises(Unsupported, check_responses, plain, stream=True)
        self.assertEqual(check_responses(native, stream=False), Route.BRIDGE)

    def test_n_over_one_on_a_run_releases_the_lease(self) -> None:
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**LLAMA, "n": 2}), 400, "'n'"
        )
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.assertEqual(self.edge.requests("run_request"), [])


class RunChatTests(IngressCase):
    def post_run(self, request: dict[str, Any]) -> tuple[Deferred[Any], str]:
        d = self.edge.post("/v1/chat/completions", request)
        self.edge.flush()
        return d, self.edge.run_request().run_id

    def test_run_request_carries_the_chat_and_policy(self) -> None:
        self.post_run({**LLAMA, "max_tokens": 2, "tools": TOOLS})
        sent = self.edge.run_request()
        self.assertEqual((sent.adapter, sent.target), ("llama", "llama3.2"))
        self.assertEqual((sent.max_tokens, sent.thinking_token_budget), (8, 512))
        chat = json.loads(sent.input)
        self.assertEqual(
            (chat["model"], chat["messages"], chat["tools"]), ("llama3.2", CHAT["messages"], TOOLS)
        )
        self.edge.events(sent.run_id, RuntimeEvent.complete())
        self.post_run({**LLAMA, "reasoning_effort": "none"})
        sent = self.edge.run_request()
        self.assertEqual((sent.max_tokens, sent.thinking_token_budget), (128, 0))

    def test_only_a_non_streaming_client_collects(self) -> None:
        self.post_run(LLAMA)
        sent = self.edge.run_request()
        self.assertTrue(sent.collect)
        self.edge.events(sent.run_id, RuntimeEvent.complete())
        self.post_run({**LLAMA, "stream": True})
        self.assertFalse(self.edge.run_request().collect)

    def test_non_stream_completion(self) -> None:
        d, run_id = self.post_run(LLAMA)
        self.edge.events(
            run_id,
            RuntimeEvent.start(),
            RuntimeEvent.reasoning("let me think"),
            RuntimeEvent.text("hel"),
            RuntimeEvent.text("lo"),
            RuntimeEvent.complete(
                Usage(5, 7, reasoning_tokens=3, cached_input_tokens=1), {"finish_reason": "length"}
            ),
        )
        code, completion = self.json_answer(d)
        self.assertEqual(code, 200)
        ChatCompletion.model_validate(completion)
        self.assertTrue(completion["id"].startswith("chatcmpl-"))
        self.assertEqual((completion["object"], completion["model"]), ("chat.completion", "llama"))
        [choice] = completion["choices"]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(
            choice["message"],
            {
                "role": "assistant",
                "content": "hello",
                "refusal": None,
                "reasoning_content": "let me think",
            },
        )
        self.assertEqual(
            completion["usage"],
            {
                "prompt_tokens": 5,
                "completion_tokens": 7,
                "total_tokens": 12,
                "prompt_tokens_details": {"cached_tokens": 1},
                "completion_tokens_details": {"reasoning_tokens": 3},
            },
        )
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.assertEqual(
            self.edge.finished[-1][1], Usage(5, 7, reasoning_tokens=3, cached_input_tokens=1)
        )

    def test_stream_chunks(self) -> None:
        d, run_id = self.post_run(
            {**LLAMA, "stream": True, "stream_options": {"include_usage": True}}
        )
        self.edge.events(run_id, RuntimeEvent.start())
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        content = response.content()
        self.edge.events(
            run_id,
            RuntimeEvent.reasoning("hmm"),
            RuntimeEvent.text("hi"),
            RuntimeEvent.text(" there"),
            RuntimeEvent.complete(Usage(2, 3)),
        )
        chunks, done = chunks_of(self.successResultOf(content))
        self.assertTrue(done)
        for chunk in chunks:
            ChatCompletionChunk.model_validate(chunk)
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        self.assertEqual(
            deltas,
            [
                {"role": "assistant", "content": ""},
                {"reasoning_content": "hmm"},
                {"content": "hi"},
                {"content": " there"},
                {},
            ],
        )
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "stop")
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(
            chunks[-1]["usage"], {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
        )
        self.assertTrue(all(c["usage"] is None for c in chunks[:-1]))

    def test_stream_without_usage_chunk(self) -> None:
        d, run_id = self.post_run({**LLAMA, "stream": True})
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.text("x"), RuntimeEvent.complete(Usage(1, 1))
        )
        chunks, done = chunks_of(self.answer(d)[2])
        self.assertTrue(done)
        self.assertTrue(all(c["choices"] for c in chunks))
        self.assertTrue(all("usage" not in c for c in chunks))

    def test_native_tool_calls(self) -> None:
        metadata = {"openai_tool_calls": json.dumps([CALL])}
        d, run_id = self.post_run({**LLAMA, "stream": True, "tools": TOOLS})
        self.edge.events(run_id, RuntimeEvent.start(), RuntimeEvent.complete(Usage(1, 1), metadata))
        chunks, _ = chunks_of(self.answer(d)[2])
        calls = [
            c["choices"][0]["delta"]["tool_calls"]
            for c in chunks
            if "tool_calls" in c["choices"][0]["delta"]
        ]
        self.assertEqual(calls, [[{"index": 0, **CALL}]])
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "tool_calls")
        d, run_id = self.post_run({**LLAMA, "tools": TOOLS})
        self.edge.events(run_id, RuntimeEvent.complete(Usage(1, 1), metadata))
        code, completion = self.json_answer(d)
        self.assertEqual(code, 200)
        ChatCompletion.model_validate(completion)
        message = completion["choices"][0]["message"]
        self.assertEqual((message["content"], message["tool_calls"]), (None, [CALL]))
        self.assertEqual(completion["choices"][0]["finish_reason"], "tool_calls")

    def text_reply(self, stream: bool, fallback: bool) -> tuple[str, list[Any], str]:
        text = 'Checking. {"tool_calls":[{"name":"get_weather","arguments":{"city":"Seoul"}}]}'
        metadata = {"openai_text_tool_fallback": "true"} if fallback else {}
        d, run_id = self.post_run({**LLAMA, "stream": stream, "tools": TOOLS})
        self.edge.events(run_id, RuntimeEvent.start())
        for i in range(0, len(text), 7):
            self.edge.events(run_id, RuntimeEvent.text(text[i : i + 7]))
        self.edge.events(run_id, RuntimeEvent.complete(Usage(1, 1), metadata))
        code, _, data = self.answer(d)
        self.assertEqual(code, 200)
        if stream:
            chunks, _ = chunks_of(data)
            deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
            content = "".join(x.get("content") or "" for x in deltas)
            calls = [call for x in deltas for call in x.get("tool_calls", [])]
            return content, calls, chunks[-1]["choices"][0]["finish_reason"]
        choice = json.loads(data)["choices"][0]
        return (
            choice["message"]["content"] or "",
            choice["message"].get("tool_calls", []),
            choice["finish_reason"],
        )

    def test_text_tool_fallback_parsed_only_when_flagged(self) -> None:
        for stream in (True, False):
            content, calls, finish = self.text_reply(stream, fallback=True)
            # Streamed text before the candidate went out as it came (trailing space included).
            self.assertEqual(content.strip(), "Checking.")
            self.assertEqual(len(calls), 1)
            self.assertEqual(
                calls[0]["function"], {"name": "get_weather", "arguments": '{"city": "Seoul"}'}
            )
            self.assertEqual(finish, "tool_calls")
            content, calls, finish = self.text_reply(stream, fallback=False)
            self.assertIn('"tool_calls"', content)
            self.assertEqual((calls, finish), ([], "stop"))

    def test_text_is_not_held_without_tools(self) -> None:
        d, run_id = self.post_run({**LLAMA, "stream": True})
        self.edge.events(run_id, RuntimeEvent.start())
        response = self.successResultOf(d)
        received: list[bytes] = []
        response.collect(received.append)
        self.edge.events(run_id, RuntimeEvent.text('{"tool_calls": '))
        self.assertIn(b"tool_calls", b"".join(received))

    def test_error_before_output_is_an_http_error(self) -> None:
        d, run_id = self.post_run({**LLAMA, "stream": True})
        self.edge.events(run_id, RuntimeEvent.failed("model not found"))
        error_ = self.assertOpenAIError(d, 502, "model not found")
        self.assertEqual(error_["type"], "server_error")
        d, run_id = self.post_run(LLAMA)
        self.edge.events(run_id, RuntimeEvent.failed("adapter 'llama' is at capacity", AT_CAPACITY))
        self.assertOpenAIError(d, 503, "at capacity")
        # The code decides, not the wording.
        d, run_id = self.post_run(LLAMA)
        self.edge.events(run_id, RuntimeEvent.failed("adapter 'llama' is at capacity"))
        self.assertOpenAIError(d, 502, "at capacity")
        d, run_id = self.post_run(LLAMA)
        self.edge.events(run_id, RuntimeEvent.failed("the node is full", AT_CAPACITY))
        self.assertOpenAIError(d, 503, "the node is full")
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_error_mid_stream_is_an_error_chunk(self) -> None:
        d, run_id = self.post_run({**LLAMA, "stream": True})
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.text("par"), RuntimeEvent.failed("node gone")
        )
        datas = data_events(self.answer(d)[2])
        self.assertNotIn("[DONE]", datas)
        last = json.loads(datas[-1])
        self.assertEqual(set(last), {"error"})
        self.assertIn("node gone", last["error"]["message"])

    def test_direct_route_to_a_cli_agent(self) -> None:
        d, run_id = self.post_run({**CHAT, "model": "cli"})
        sent = self.edge.run_request()
        self.assertEqual((sent.adapter, sent.target, sent.max_tokens), ("agent", "agent-model", 0))
        self.edge.events(
            run_id, RuntimeEvent.start(), RuntimeEvent.text("done"), RuntimeEvent.complete()
        )
        code, completion = self.json_answer(d)
        self.assertEqual((code, completion["model"]), (200, "cli"))
        self.assertNotIn("usage", completion)
        ChatCompletion.model_validate(completion)


class ConverterTests(IngressCase):
    def test_fields(self) -> None:
        converter = RunEventsToChunks(model="m", completion_id="chatcmpl-1", created=7)
        [chunk] = converter.feed(RuntimeEvent.start())
        self.assertEqual(
            chunk,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 7,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            },
        )
        converter.feed(RuntimeEvent.complete())
        self.assertTrue(converter.done)
        self.assertEqual(converter.feed(RuntimeEvent.text("late")), [])

    def test_cancelled_is_an_error(self) -> None:
        converter = RunEventsToChunks(model="m", created=7)
        [chunk] = converter.feed(RuntimeEvent.cancelled("timeout"))
        self.assertIn("cancelled", chunk["error"]["message"])


class ResponsesTests(IngressCase):
    REQUEST = {"model": "resp", "input": "hello"}

    def test_passthrough(self) -> None:
        d = self.edge.post("/v1/responses", {**self.REQUEST, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(
            (sent.operation, sent.target, sent.stream), ("responses", "resp-target", True)
        )
        self.assertEqual(
            json.loads(sent.body),
            {"model": "resp-target", "input": "hello", "stream": True, "max_output_tokens": 300},
        )
        stream = b'event: response.created\ndata: {"type":"response.created"}\n\n'
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(stream), END)
        code, headers, data = self.answer(d)
        self.assertEqual((code, data), (200, stream))
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])

    def test_providers_that_serve_neither_responses_nor_chat_are_refused(self) -> None:
        # Chat providers and runs are bridged (test_responses), a native Messages provider too
        # (test_responses_messages); a chat provider without streaming asked to stream cannot
        # serve the request.
        for name, extra in (("plain", {"stream": True}),):
            error_ = self.assertOpenAIError(
                self.edge.post("/v1/responses", {**self.REQUEST, "model": name, **extra}),
                400,
                "Responses",
            )
            self.assertEqual(error_["code"], "unsupported")
        self.assertEqual(self.edge.sent, [])

    def test_bad_input(self) -> None:
        self.assertOpenAIError(self.edge.post("/v1/responses", {**self.REQUEST, "input": 3}), 400)


def test_sse_helper_roundtrip() -> None:
    assert chunks_of(sse([{"a": 1}, "[DONE]"])) == ([{"a": 1}], True)


class FakeResponsesUpstreamTests(SynchronousTestCase):
    """
    The fake upstream's minimal ``/v1/responses`` (what the system tests tunnel to) answers in
    shapes the ``openai`` SDK accepts.
    """

    def post(self, request: dict[str, Any]) -> tuple[int, bytes]:
        clock = Clock()
        http: Any = StubTreq(FakeOpenAI(clock, tokens=5, responses_api=True).resource())
        d = http.post("http://fake.test/v1/responses", data=json.dumps(request).encode())
        http.flush()
        response = self.successResultOf(d)
        content = response.content()
        http.flush()
        return response.code, self.successResultOf(content)

    def test_whole_response(self) -> None:
        code, data = self.post({"model": "m", "input": "two words", "max_output_tokens": 3})
        self.assertEqual(code, 200)
        response = Response.model_validate(json.loads(data))
        self.assertEqual(response.output_text, "tok0 tok1 tok2")
        self.assertEqual(response.status, "incomplete")
        assert response.usage is not None
        self.assertEqual((response.usage.input_tokens, response.usage.output_tokens), (2, 3))

    def test_stream(self) -> None:
        code, data = self.post(
            {"model": "m", "input": [{"role": "user", "content": "hi"}], "stream": True}
        )
        self.assertEqual(code, 200)
        parser = SSEParser()
        events = parser.feed(data) + parser.finish()
        adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        parsed = [adapter.validate_python(json.loads(e.data)) for e in events]
        self.assertEqual([e.event for e in events], [p.type for p in parsed])
        self.assertEqual(parsed[-1].type, "response.completed")
        self.assertEqual(
            "".join(p.delta for p in parsed if p.type == "response.output_text.delta"),
            "tok0 tok1 tok2 tok3 tok4",
        )
        self.assertEqual([p.sequence_number for p in parsed], list(range(len(parsed))))

    def stream(self, request: dict[str, Any]) -> list[Any]:
        code, data = self.post({**request, "stream": True})
        self.assertEqual(code, 200)
        parser = SSEParser()
        adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        parsed = [adapter.validate_python(json.loads(e.data)) for e in parser.feed(data)]
        self.assertEqual([p.sequence_number for p in parsed], list(range(len(parsed))))
        return parsed

    def test_instructions_are_cached_prompt_tokens(self) -> None:
        code, data = self.post({"model": "m", "instructions": "be brief", "input": "say hello"})
        self.assertEqual(code, 200)
        usage = Response.model_validate(json.loads(data)).usage
        assert usage is not None
        self.assertEqual((usage.input_tokens, usage.input_tokens_details.cached_tokens), (4, 2))

    def test_function_call_then_text(self) -> None:
        tool = {
            "type": "function",
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": False,
        }
        hosted = {"type": "web_search"}
        ask: dict[str, Any] = {"model": "m", "input": "weather?", "tools": [hosted, tool]}
        code, data = self.post(ask)
        self.assertEqual(code, 200)
        whole = Response.model_validate(json.loads(data))
        [call] = whole.output
        assert call.type == "function_call"
        self.assertEqual((call.name, json.loads(call.arguments)), ("get_weather", {"city": "fake"}))
        self.assertEqual(whole.status, "completed")
        parsed = self.stream(ask)
        self.assertEqual(
            [p.type for p in parsed],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ],
        )
        pieces = [p.delta for p in parsed if p.type == "response.function_call_arguments.delta"]
        self.assertEqual(json.loads("".join(pieces)), {"city": "fake"})
        # Once the call's output is in the conversation, or with tool_choice none: the text.
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        answered = {**ask, "input": [{"role": "user", "content": "weather?"}, output]}
        for request in (answered, {**ask, "tool_choice": "none"}):
            code, data = self.post(request)
            self.assertEqual(Response.model_validate(json.loads(data)).output_text, fake_text(5))

    def test_injected_failure(self) -> None:
        code, data = self.post({"model": FAIL_500_MODEL, "input": "hi"})
        self.assertEqual(code, 500)
        self.assertIn("injected", json.loads(data)["error"]["message"])

    def test_off_by_default(self) -> None:
        http: Any = StubTreq(FakeOpenAI(Clock()).resource())
        d = http.post("http://fake.test/v1/responses", data=b"{}")
        http.flush()
        self.assertEqual(self.successResultOf(d).code, 404)

    def test_bad_input(self) -> None:
        code, data = self.post({"model": "m"})
        self.assertEqual(code, 400)
        self.assertIn("input", json.loads(data)["error"]["message"])
