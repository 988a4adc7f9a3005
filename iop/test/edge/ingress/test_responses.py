"""
The Responses bridge: the request mapping table, streamed event order and shapes over a Chat
tunnel and over normalized runs, whole answers, a tool round trip, failures. Every event and
``response`` is validated against the official ``openai`` SDK's types.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.chat_decode import ChatDecoder
from iop.edge.ingress.errors import ApiError
from iop.edge.ingress.responses import ResponsesEncoder, responses_to_chat
from iop.formats.sse import SSEParser
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.harness import END, IngressCase, body, error, sse, start

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


FUNCTION_F = {"name": "f", "arguments": "{}"}
FUNCTION_G = {"name": "g", "arguments": "{}"}


def chat_of(request: dict[str, Any], **options: Any) -> dict[str, Any]:
    options.setdefault("reasoning_allowed", False)
    options.setdefault("max_tokens", None)
    return responses_to_chat({"model": "m", **request}, target="t", **options).chat


def events_of(raw: bytes) -> list[Any]:
    """The SSE events of a body, each parsed with the SDK (its name must be its type)."""
    parser = SSEParser()
    out = []
    for event in parser.feed(raw) + parser.finish():
        parsed = EVENTS.validate_python(json.loads(event.data))
        assert event.event == parsed.type, (event.event, parsed.type)
        out.append(parsed)
    assert [e.sequence_number for e in out] == list(range(len(out)))
    return out


def types_of(events: list[Any]) -> list[str]:
    return [e.type for e in events]


TEXT_SEQUENCE = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


class RequestMappingTests(SynchronousTestCase):
    def test_string_input_and_instructions(self) -> None:
        self.assertEqual(
            chat_of({"input": "hi", "instructions": "be brief"}),
            {
                "model": "t",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                ],
            },
        )

    def test_items(self) -> None:
        chat = chat_of(
            {
                "input": [
                    {"type": "message", "role": "developer", "content": "rules"},
                    {"role": "system", "content": [{"type": "input_text", "text": "sys"}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "look"},
                            {"type": "input_image", "image_url": "data:x", "detail": "low"},
                        ],
                    },
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "checking"}],
                    },
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "one"},
                    {
                        "type": "function_call_output",
                        "call_id": "c2",
                        "output": [{"type": "input_text", "text": "two"}],
                    },
                    "thanks",
                ]
            }
        )
        self.assertEqual(
            chat["messages"],
            [
                {"role": "system", "content": "rules"},
                {"role": "system", "content": [{"type": "text", "text": "sys"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": "checking",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": FUNCTION_F},
                        {"id": "c2", "type": "function", "function": FUNCTION_G},
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
                {"role": "user", "content": "thanks"},
            ],
        )  # fmt: skip

    def test_tools_and_options(self) -> None:
        namespace = {
            "type": "namespace",
            "name": "agents",
            "description": "sub-agents",
            "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
        }
        bridged = responses_to_chat(
            {
                "model": "m",
                "input": "hi",
                "tools": [WEATHER, namespace, {"type": "web_search"}],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": False,
                "temperature": 0.5,
                "top_p": 0.9,
                "reasoning": {"effort": "high", "summary": "auto"},
                "text": {"format": {"type": "json_schema", "name": "s", "schema": {}}},
                "stream": True,
                "store": False,
                "include": ["reasoning.encrypted_content"],
                "prompt_cache_key": "k",
                "metadata": {"a": "b"},
            },
            target="t",
            reasoning_allowed=True,
            max_tokens=42,
        )
        chat = bridged.chat
        schema = {"name": "s", "schema": {}}
        self.assertEqual(
            chat["tools"],
            [
                CHAT_WEATHER,
                {
                    "type": "function",
                    "function": {"name": "agents__spawn", "parameters": {"type": "object"}},
                },
            ],
        )
        self.assertEqual(bridged.names, {"agents__spawn": ("agents", "spawn")})
        self.assertEqual(
            chat["tool_choice"], {"type": "function", "function": {"name": "get_weather"}}
        )
        self.assertEqual(
            {k: v for k, v in chat.items() if k not in ("messages", "tools", "tool_choice")},
            {
                "model": "t",
                "parallel_tool_calls": False,
                "temperature": 0.5,
                "top_p": 0.9,
                "max_tokens": 42,
                "response_format": {"type": "json_schema", "json_schema": schema},
                "reasoning_effort": "high",
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )  # fmt: skip
        # A provider that cannot reason: the effort is dropped.
        self.assertNotIn(
            "reasoning_effort", chat_of({"input": "hi", "reasoning": {"effort": "high"}})
        )

    def test_refused(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"previous_response_id": "resp_1"}, "previous_response_id"),
            ({"conversation": "conv_1"}, "conversation"),
            ({"background": True}, "background"),
            ({"tools": [{"type": "custom", "name": "patch"}]}, "tools[0]"),
            ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
            ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
            ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0]"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
             "input[0]"),
            ({"reasoning": {"effort": "max"}}, "reasoning"),
        ]  # fmt: skip
        for extra, param in cases:
            request = {"input": "hi", **extra}
            with self.assertRaises(ApiError) as raised:
                chat_of(request)
            self.assertEqual(raised.exception.status, 400)
            self.assertTrue((raised.exception.param or "").startswith(param), (extra, param))


def decoded(
    encoder: ResponsesEncoder, chunks: list[dict[str, Any]], fragments: bool = True
) -> list[dict[str, Any]]:
    """Chat chunks through the Chat decoder into ``encoder``, as over a Chat tunnel."""
    decoder = ChatDecoder(fragments=fragments)
    out = []
    for item in chunks:
        out += encoder.encode(decoder.feed(item))
    return out + encoder.encode(decoder.end())


class ConverterTests(SynchronousTestCase):
    def test_whole_answer_items_usage_and_status(self) -> None:
        converter = ResponsesEncoder(model="m", request={"input": "x"}, created=5)
        decoded(
            converter,
            [{
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "reasoning_content": "hmm",
                            "content": "hi",
                            "tool_calls": [
                                {"index": 0, "id": "call_1", "function": {"name": "f"}},
                                {"index": 0, "function": {"arguments": '{"a":'}},
                                {"index": 0, "function": {"arguments": "1}"}},
                            ],
                        },
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 1},
                    "completion_tokens_details": {"reasoning_tokens": 2},
                },
            }],
        )  # fmt: skip
        response = converter.response()
        parsed = Response.model_validate(response)
        self.assertEqual([o.type for o in parsed.output], ["reasoning", "message", "function_call"])
        self.assertEqual(parsed.output_text, "hi")
        self.assertEqual(response["output"][2]["call_id"], "call_1")
        self.assertEqual(response["output"][2]["arguments"], '{"a":1}')
        self.assertEqual(
            response["output"][0]["content"], [{"type": "reasoning_text", "text": "hmm"}]
        )
        self.assertEqual((parsed.status, response["incomplete_details"]),
                         ("incomplete", {"reason": "max_output_tokens"}))  # fmt: skip
        self.assertEqual(
            response["usage"],
            {
                "input_tokens": 3,
                "input_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 0},
                "output_tokens": 4,
                "output_tokens_details": {"reasoning_tokens": 2},
                "total_tokens": 7,
            },
        )

    def test_namespace_calls_map_back(self) -> None:
        converter = ResponsesEncoder(
            model="m", request={}, created=5, names={"agents__spawn": ("agents", "spawn")}
        )
        fragment = {"index": 0, "id": "c", "function": {"name": "agents__spawn", "arguments": "{}"}}
        for fragments in (True, False):
            chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}]
            decoded(converter, chunks, fragments)
            [item] = converter.response()["output"]
            self.assertEqual((item["namespace"], item["name"]), ("agents", "spawn"))
            converter = ResponsesEncoder(
                model="m", request={}, created=5, names={"agents__spawn": ("agents", "spawn")}
            )


TUNNEL_TEXT = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}},
    "[DONE]",
]
TUNNEL_TOOL = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_9", "type": "function",
         "function": {"name": "get_weather", "arguments": ""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"city":'}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '"Seoul"}'}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    "[DONE]",
]  # fmt: skip
TOOL_SEQUENCE = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


class TunnelBridgeTests(IngressCase):
    def post(self, request: dict[str, Any]) -> tuple[Deferred[Any], Any]:
        d = self.edge.post("/v1/responses", {"model": "chat", **request})
        self.edge.flush()
        return d, self.edge.tunnel_request()

    def test_stream_text(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True, "max_output_tokens": 4})
        self.assertEqual((sent.operation, sent.target, sent.stream),
                         ("chat_completions", "chat-target", True))  # fmt: skip
        self.assertEqual(
            json.loads(sent.body),
            {
                "model": "chat-target",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 16,  # the model's floor
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(sse(TUNNEL_TEXT)), END)
        code, headers, data = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])
        events = events_of(data)
        self.assertEqual(types_of(events), TEXT_SEQUENCE)
        final = events[-1].response
        self.assertEqual(
            (final.output_text, final.status, final.model), ("hello", "completed", "chat")
        )
        assert final.usage is not None
        self.assertEqual((final.usage.input_tokens, final.usage.output_tokens), (2, 2))
        self.assertEqual(len({e.response.id for e in events if hasattr(e, "response")}), 1)
        self.assertEqual(self.edge.in_flight(), 0)

    def test_tool_round_trip(self) -> None:
        d, sent = self.post({"input": "weather?", "tools": [WEATHER], "stream": True})
        self.assertEqual(json.loads(sent.body)["tools"], [CHAT_WEATHER])
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(sse(TUNNEL_TOOL)), END)
        events = events_of(self.answer(d)[2])
        self.assertEqual(types_of(events), TOOL_SEQUENCE)
        [call] = events[-1].response.output
        self.assertEqual(
            (call.type, call.call_id, call.name, call.arguments),
            ("function_call", "call_9", "get_weather", '{"city":"Seoul"}'),
        )
        # The next turn carries the call and its output.
        d, sent = self.post(
            {
                "input": [
                    {"role": "user", "content": "weather?"},
                    call.model_dump(exclude_none=True),
                    {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
                ],
                "tools": [WEATHER],
            }
        )
        messages = json.loads(sent.body)["messages"]
        self.assertEqual(messages[1]["tool_calls"][0]["id"], "call_9")
        self.assertEqual(
            messages[2], {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}
        )
        completion = {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "sunny it is"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }  # fmt: skip
        self.edge.frames(sent.run_id, start(200), body(json.dumps(completion).encode()), END)
        code, response = self.json_answer(d)
        self.assertEqual(code, 200)
        parsed = Response.model_validate(response)
        self.assertEqual((parsed.output_text, parsed.status), ("sunny it is", "completed"))
        self.assertTrue(parsed.id.startswith("resp_"))
        self.assertEqual(self.edge.in_flight(), 0)

    def test_upstream_error_status_keeps_its_status(self) -> None:
        for stream in (True, False):
            d, sent = self.post({"input": "hi", "stream": stream})
            refusal = b'{"error": {"message": "bad thing", "type": "invalid_request_error"}}'
            self.edge.frames(sent.run_id, start(400), body(refusal), END)
            self.assertOpenAIError(d, 400, "bad thing")
        self.assertEqual(self.edge.in_flight(), 0)

    def test_failure_after_start_is_response_failed(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.frames(
            sent.run_id,
            start(200, "text/event-stream"),
            body(sse(TUNNEL_TEXT[:2])),
            error("upstream reset"),
        )
        events = events_of(self.answer(d)[2])
        self.assertEqual(events[-1].type, "response.failed")
        self.assertIn("upstream reset", events[-1].response.error.message)
        self.assertEqual(events[-1].response.error.code, "server_error")
        self.assertEqual(self.edge.in_flight(), 0)

    def test_malformed_chunk_stops_the_provider(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(b"data: {nope\n\n"))
        self.edge.frames(sent.run_id, END)
        events = events_of(self.answer(d)[2])
        self.assertEqual(types_of(events)[-1], "response.failed")
        self.assertIn(sent.run_id, self.edge.cancels())

    def test_an_error_chunk_fails_the_response_and_stops_the_provider(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        failing = [*TUNNEL_TEXT[:2], {"error": {"message": "overloaded", "type": "server_error"}}]
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(sse(failing)))
        self.assertIn(sent.run_id, self.edge.cancels())
        self.edge.frames(sent.run_id, END)
        events = events_of(self.answer(d)[2])
        self.assertEqual(types_of(events)[-1], "response.failed")
        self.assertEqual(events[-1].response.error.message, "overloaded")
        self.assertEqual(self.edge.in_flight(), 0)

    def test_a_clean_end_without_done_completes(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.frames(
            sent.run_id, start(200, "text/event-stream"), body(sse(TUNNEL_TEXT[:-1])), END
        )
        events = events_of(self.answer(d)[2])
        self.assertEqual(types_of(events), TEXT_SEQUENCE)

    def test_refusals_send_nothing(self) -> None:
        d = self.edge.post(
            "/v1/responses", {"model": "chat", "input": "hi", "previous_response_id": "resp_1"}
        )
        error_ = self.assertOpenAIError(d, 400, "whole conversation")
        self.assertEqual(error_["param"], "previous_response_id")
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])
        self.assertEqual(self.edge.in_flight(), 0)


class RunBridgeTests(IngressCase):
    def post(self, request: dict[str, Any], model: str = "llama") -> tuple[Deferred[Any], Any]:
        d = self.edge.post("/v1/responses", {"model": model, **request})
        self.edge.flush()
        return d, self.edge.run_request()

    def test_run_input_and_policy(self) -> None:
        _, sent = self.post({"input": "hi", "instructions": "sys", "reasoning": {"effort": "none"}})
        self.assertEqual((sent.adapter, sent.target), ("llama", "llama3.2"))
        self.assertEqual((sent.max_tokens, sent.thinking_token_budget), (128, 0))
        self.assertEqual(
            json.loads(sent.input),
            {
                "model": "llama3.2",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "hi"},
                ],
                "max_tokens": 128,
            },
        )
        self.edge.events(sent.run_id, RuntimeEvent.complete())
        _, sent = self.post({"input": "hi"})
        self.assertEqual(sent.thinking_token_budget, 512)

    def test_stream_reasoning_and_text(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.events(
            sent.run_id,
            RuntimeEvent.start(),
            RuntimeEvent.reasoning("hmm"),
            RuntimeEvent.text("hel"),
            RuntimeEvent.text("lo"),
            RuntimeEvent.complete(Usage(3, 4, reasoning_tokens=1, cached_input_tokens=2)),
        )
        events = events_of(self.answer(d)[2])
        self.assertEqual(
            types_of(events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                *TEXT_SEQUENCE[2:],
            ],
        )
        final = events[-1].response
        self.assertEqual([o.type for o in final.output], ["reasoning", "message"])
        self.assertEqual(final.output_text, "hello")
        assert final.usage is not None
        self.assertEqual(final.usage.input_tokens_details.cached_tokens, 2)
        self.assertEqual(final.usage.output_tokens_details.reasoning_tokens, 1)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_tool_calls_stream_and_whole(self) -> None:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}  # fmt: skip
        metadata = {"openai_tool_calls": json.dumps([call])}
        d, sent = self.post({"input": "weather?", "tools": [WEATHER], "stream": True})
        self.assertEqual(json.loads(sent.input)["tools"], [CHAT_WEATHER])
        self.edge.events(
            sent.run_id, RuntimeEvent.start(), RuntimeEvent.complete(Usage(1, 1), metadata)
        )
        events = events_of(self.answer(d)[2])
        # A run's calls come whole: one arguments delta each.
        self.assertEqual(types_of(events), [*TOOL_SEQUENCE[:4], *TOOL_SEQUENCE[5:]])
        [item] = events[-1].response.output
        self.assertEqual((item.call_id, item.arguments), ("call_1", '{"city": "Seoul"}'))
        d, sent = self.post({"input": "weather?", "tools": [WEATHER]})
        self.edge.events(sent.run_id, RuntimeEvent.complete(Usage(1, 1), metadata))
        code, response = self.json_answer(d)
        self.assertEqual(code, 200)
        [whole] = Response.model_validate(response).output
        self.assertEqual(whole.type, "function_call")
        self.assertEqual(response["output"][0]["name"], "get_weather")

    def test_errors(self) -> None:
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.events(sent.run_id, RuntimeEvent.failed("model not found"))
        self.assertOpenAIError(d, 502, "model not found")
        d, sent = self.post({"input": "hi"})
        self.edge.events(sent.run_id, RuntimeEvent.failed("boom"))
        self.assertOpenAIError(d, 502, "boom")
        d, sent = self.post({"input": "hi", "stream": True})
        self.edge.events(
            sent.run_id,
            RuntimeEvent.start(),
            RuntimeEvent.text("par"),
            RuntimeEvent.failed("node gone"),
        )
        events = events_of(self.answer(d)[2])
        self.assertEqual(types_of(events)[-1], "response.failed")
        self.assertIn("node gone", events[-1].response.error.message)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_cli_agent_whole(self) -> None:
        d, sent = self.post({"input": "hi"}, model="cli")
        self.assertEqual((sent.adapter, sent.max_tokens), ("agent", 0))
        self.edge.events(
            sent.run_id, RuntimeEvent.start(), RuntimeEvent.text("done"), RuntimeEvent.complete()
        )
        code, response = self.json_answer(d)
        self.assertEqual(code, 200)
        parsed = Response.model_validate(response)
        self.assertEqual((parsed.output_text, parsed.model, parsed.usage), ("done", "cli", None))
