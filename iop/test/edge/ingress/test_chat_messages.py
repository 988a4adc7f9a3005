"""
Chat Completions over a native Anthropic Messages provider: the request translated to Messages,
the answer (stream events or one message) decoded into canonical events and encoded as Chat
chunks / one ``chat.completion`` — the pure conversion, and the route through the ingress with
the lease released once. Every chunk and completion is validated against the ``openai`` SDK's
types.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.bridge import BridgeError
from iop.edge.ingress.canonical import Kind
from iop.edge.ingress.chat_messages import DEFAULT_MAX_TOKENS, MessagesDecoder, chat_to_messages
from iop.edge.ingress.openai import ChatEncoder
from iop.runtime.events import Usage
from iop.test.edge.ingress.harness import END, IngressCase, body, error, start, usage

NATIVE = {"model": "native", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CHUNK = TypeAdapter(ChatCompletionChunk)


def named(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def message_start(input_tokens: int = 5) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-target",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        },
    }


def text_events(*texts: str, stop: str = "end_turn") -> list[dict[str, Any]]:
    events = [
        message_start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    for text in texts:
        events.append(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            }
        )
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 7},
        },
        {"type": "message_stop"},
    ]
    return events


TOOL_EVENTS = [
    message_start(),
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"ci'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": 'ty": "Seoul"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 12},
    },
    {"type": "message_stop"},
]


class RequestTests(SynchronousTestCase):
    def test_roles_tools_and_parameters(self) -> None:
        chat = {
            "model": "native",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "weather?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Seoul"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0.2,
            "top_p": 0.9,
            "stop": "END",
            "user": "u-1",
            "stream": True,
            "stream_options": {"include_usage": True},
            "seed": 3,
        }
        out = chat_to_messages(chat, target="claude-target", max_tokens=99)
        self.assertEqual(
            out,
            {
                "model": "claude-target",
                "max_tokens": 99,
                "system": "be brief\n\nand kind",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "weather?"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AAAA",
                                },
                            },
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "https://x.test/a.png"},
                            },
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "get_weather",
                                "input": {"city": "Seoul"},
                            }
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                            {"type": "text", "text": "thanks"},
                        ],
                    },
                ],
                "temperature": 0.2,
                "top_p": 0.9,
                "stop_sequences": ["END"],
                "tools": [
                    {
                        "name": "get_weather",
                        "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
                        "description": "Weather for a city",
                    }
                ],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "metadata": {"user_id": "u-1"},
                "stream": True,
            },
        )

    def test_tool_choices(self) -> None:
        def choice(value: Any) -> Any:
            body = {**NATIVE, "tools": [TOOL], "tool_choice": value}
            return chat_to_messages(body, target="t", max_tokens=1).get("tool_choice")

        self.assertEqual(choice("auto"), {"type": "auto"})
        self.assertEqual(choice("none"), {"type": "none"})
        self.assertEqual(
            choice({"type": "function", "function": {"name": "get_weather"}}),
            {"type": "tool", "name": "get_weather"},
        )
        self.assertIsNone(choice(None))

    def test_refusals_name_what(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"messages": [{"role": "function", "content": "x"}]}, "role"),
            ({"messages": [{"role": "system", "content": "only"}]}, "user or assistant"),
            (
                {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
                "input_audio",
            ),
            (
                {
                    "messages": [
                        {
                            "role": "assistant",
                            "tool_calls": [
                                {"id": "a", "function": {"name": "f", "arguments": "[1]"}}
                            ],
                        }
                    ]
                },
                "JSON object",
            ),
            ({**NATIVE, "tools": [{"type": "web_search"}]}, "function"),
            ({**NATIVE, "n": 2}, "n:"),
            ({**NATIVE, "response_format": {"type": "json_object"}}, "response_format"),
        ]
        for chat, fragment in cases:
            with self.assertRaises(BridgeError) as raised:
                chat_to_messages(chat, target="t", max_tokens=1)
            self.assertIn(fragment, raised.exception.message)


def encode_stream(events: list[dict[str, Any]], *, include_usage: bool = True) -> list[Any]:
    decoder = MessagesDecoder()
    encoder = ChatEncoder(model="native", created=1, include_usage=include_usage)
    chunks = []
    for event in events:
        chunks += encoder.encode(decoder.feed(event))
    chunks += encoder.encode(decoder.end())
    return chunks


class AnswerTests(SynchronousTestCase):
    def test_text_stream_with_usage(self) -> None:
        chunks = encode_stream(text_events("he", "llo"))
        for chunk in chunks:
            CHUNK.validate_python(chunk)
        texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        self.assertEqual("".join(t for t in texts if t), "hello")
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "stop")
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(
            chunks[-1]["usage"], {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        )

    def test_stop_reasons(self) -> None:
        for stop, finish in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("refusal", "content_filter"),
            ("something_new", "stop"),
        ]:
            chunks = encode_stream(text_events("x", stop=stop), include_usage=False)
            self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], finish, stop)

    def test_tool_call_arguments_stream_as_fragments(self) -> None:
        chunks = encode_stream(TOOL_EVENTS, include_usage=False)
        for chunk in chunks:
            CHUNK.validate_python(chunk)
        calls = [
            c["choices"][0]["delta"]["tool_calls"][0]
            for c in chunks
            if "tool_calls" in c["choices"][0]["delta"]
        ]
        self.assertEqual(
            calls,
            [
                {
                    "index": 0,
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                },
                {"index": 0, "function": {"arguments": '{"ci'}},
                {"index": 0, "function": {"arguments": 'ty": "Seoul"}'}},
            ],
        )
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "tool_calls")

    def test_a_tool_call_without_arguments_gets_an_empty_object(self) -> None:
        events = [
            message_start(),
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "now", "input": {}},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}},
            {"type": "message_stop"},
        ]
        decoder = MessagesDecoder()
        encoder = ChatEncoder(model="native", created=1)
        for event in events:
            encoder.encode(decoder.feed(event))
        self.assertEqual(encoder.tool_calls[0]["function"]["arguments"], "{}")

    def test_whole_message_with_tools_and_cache_usage(self) -> None:
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"a": 1}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 10, "output_tokens": 4},
        }
        decoder = MessagesDecoder()
        encoder = ChatEncoder(model="native", created=1)
        encoder.encode(decoder.message(message))
        completion = encoder.completion()
        TypeAdapter(ChatCompletion).validate_python(completion)
        choice = completion["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        self.assertEqual(choice["message"]["content"], "Let me look.")
        self.assertEqual(choice["message"]["reasoning_content"], "hmm")
        self.assertEqual(
            choice["message"]["tool_calls"],
            [
                {
                    "id": "toolu_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"a": 1}'},
                }
            ],
        )
        self.assertEqual(
            completion["usage"],
            {
                "prompt_tokens": 13,
                "completion_tokens": 4,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 10},
            },
        )

    def test_whole_tool_calls_for_other_encoders(self) -> None:
        decoder = MessagesDecoder(fragments=False)
        kinds = []
        for event in TOOL_EVENTS:
            kinds += [e.kind for e in decoder.feed(event)]
        self.assertNotIn(Kind.TOOL_CALL_START, kinds)
        self.assertEqual(kinds.count(Kind.TOOL_CALL), 1)

    def test_error_event_and_cut_stream_fail(self) -> None:
        overloaded = {"type": "overloaded_error", "message": "Overloaded"}
        events = [*text_events("he")[:3], {"type": "error", "error": overloaded}]
        chunks = encode_stream(events)
        self.assertEqual(chunks[-1]["error"]["message"], "Overloaded")
        cut = encode_stream(text_events("he")[:3])
        self.assertIn("ended before", cut[-1]["error"]["message"])
        self.assertNotIn("choices", cut[-1])

    def test_not_a_message(self) -> None:
        decoder = MessagesDecoder()
        [event] = decoder.message({"type": "error"})
        self.assertEqual(event.kind, Kind.FAILED)
        self.assertIsNotNone(decoder.failed)


def chunks_and_done(raw: bytes) -> tuple[list[Any], bool]:
    datas = [
        line[len(b"data: ") :].decode() for line in raw.split(b"\n") if line.startswith(b"data: ")
    ]
    done = bool(datas) and datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas if d != "[DONE]"], done


class IngressTests(IngressCase):
    """Through the Edge's ingress: the tunnel request, the answer, the lease released once."""

    def test_whole_answer(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**NATIVE, "max_completion_tokens": 50})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(
            (sent.operation, sent.stream, sent.profile), ("messages", False, "anthropic-native")
        )
        headers = {h.name: h.value for h in sent.headers}
        self.assertEqual(headers["anthropic-version"], "2023-06-01")
        self.assertEqual(
            json.loads(sent.body),
            {
                "model": "claude-target",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            },
        )
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "hello"}],
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 2, "output_tokens": 50},
        }
        data = json.dumps(message).encode()
        self.edge.frames(sent.run_id, start(), body(data[:9]), body(data[9:]), usage(2, 50), END)
        code, completion = self.json_answer(d)
        self.assertEqual(code, 200)
        TypeAdapter(ChatCompletion).validate_python(completion)
        self.assertEqual(completion["model"], "native")
        self.assertEqual(completion["choices"][0]["message"]["content"], "hello")
        self.assertEqual(completion["choices"][0]["finish_reason"], "length")
        self.assertEqual(completion["usage"]["total_tokens"], 52)
        [(_, reported, outcome)] = self.edge.finished
        self.assertEqual((reported, outcome), (Usage(2, 50), "complete"))
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_default_limit(self) -> None:
        self.edge.post("/v1/chat/completions", NATIVE)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(json.loads(sent.body)["max_tokens"], DEFAULT_MAX_TOKENS)

    def test_streamed_with_tools_and_usage(self) -> None:
        d = self.edge.post(
            "/v1/chat/completions",
            {**NATIVE, "stream": True, "stream_options": {"include_usage": True}, "tools": [TOOL]},
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertTrue(sent.stream)
        payload = json.loads(sent.body)
        self.assertEqual((payload["stream"], payload["tools"][0]["name"]), (True, "get_weather"))
        self.assertNotIn("stream_options", payload)
        raw = named(TOOL_EVENTS)
        self.edge.frames(sent.run_id, start(200, "text/event-stream"))
        for i in range(0, len(raw), 40):
            self.edge.frames(sent.run_id, body(raw[i : i + 40]))
        self.edge.frames(sent.run_id, END)
        code, headers, data = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])
        chunks, done = chunks_and_done(data)
        self.assertTrue(done)
        for chunk in chunks:
            CHUNK.validate_python(chunk)
        arguments = "".join(
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
            for c in chunks
            if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
        )
        self.assertEqual(json.loads(arguments), {"city": "Seoul"})
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "tool_calls")
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 12)
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_upstream_error_keeps_its_status_in_the_openai_shape(self) -> None:
        for stream in (False, True):
            d = self.edge.post("/v1/chat/completions", {**NATIVE, "stream": stream})
            self.edge.flush()
            sent = self.edge.tunnel_request()
            answer = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
            self.edge.frames(sent.run_id, start(429), body(json.dumps(answer).encode()), END)
            found = self.assertOpenAIError(d, 429, "slow")
            self.assertEqual(found["code"], "upstream_error")
            self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_a_stream_cut_mid_way_ends_with_an_error_chunk(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**NATIVE, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        raw = named(text_events("he", "llo")[:4])
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(raw))
        self.edge.frames(sent.run_id, error("upstream reset"))
        code, _, data = self.answer(d)
        self.assertEqual(code, 200)
        chunks, done = chunks_and_done(data)
        self.assertFalse(done)
        self.assertIn("upstream reset", chunks[-1]["error"]["message"])
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_unconvertible_request_is_400_before_any_tunnel(self) -> None:
        bad = {**NATIVE, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}
        self.assertOpenAIError(self.edge.post("/v1/chat/completions", bad), 400)
        self.assertEqual(self.edge.requests("tunnel"), [])
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_a_garbage_body_is_a_502(self) -> None:
        d = self.edge.post("/v1/chat/completions", NATIVE)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(b"not json"), END)
        self.assertOpenAIError(d, 502, "could not be converted")
        self.assertEqual(self.edge.in_flight("p-native"), 0)
