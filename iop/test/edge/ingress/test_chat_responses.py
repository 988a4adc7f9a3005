"""
Chat Completions and Anthropic Messages over a native OpenAI Responses provider: the Chat
request translated to Responses (row by row, and back through the Responses bridge's
``responses_to_chat``), the provider's answer (recorded stream events or one response) decoded
into canonical events and encoded as Chat chunks / one ``chat.completion`` and as Anthropic
events / one ``message`` — the pure conversion, and both routes through the ingress (the
``resp`` model, an ``openai_responses`` profile) with the lease released once. Chunks,
completions, stream events and messages are validated against the ``openai`` and ``anthropic``
SDKs' types.
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.bridge import BridgeError
from iop.edge.ingress.canonical import Event, Kind
from iop.edge.ingress.chat_responses import ResponsesDecoder, chat_to_responses
from iop.edge.ingress.messages_encode import MessagesEncoder
from iop.edge.ingress.openai import ChatEncoder
from iop.edge.ingress.responses import responses_to_chat
from iop.formats.sse import SSEParser
from iop.runtime.events import Usage
from iop.test.edge.ingress.harness import END, IngressCase, body, error, start, usage

HI = {"role": "user", "content": "hi"}
CHAT: dict[str, Any] = {"model": "resp", "messages": [HI]}
MESSAGES: dict[str, Any] = {"model": "resp", "max_tokens": 100, "messages": [HI]}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHUNK: TypeAdapter[Any] = TypeAdapter(ChatCompletionChunk)
ANTHROPIC_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 8},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 2},
    "total_tokens": 19,
}


# -- recorded answers --------------------------------------------------------------------------


def response(
    output: list[dict[str, Any]],
    status: str = "completed",
    reason: str | None = None,
    usage: dict[str, Any] | None = USAGE,
) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "resp-target",
        "output": output,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
        "usage": usage,
    }


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_1",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
        "status": "completed",
    }


def opening() -> list[dict[str, Any]]:
    created = response([], status="in_progress", usage=None)
    return [
        {"type": "response.created", "response": created},
        {"type": "response.in_progress", "response": created},
    ]


def text_events(
    *texts: str, terminal: str = "response.completed", reason: str | None = None
) -> list[dict[str, Any]]:
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    status = "incomplete" if terminal == "response.incomplete" else "completed"
    item = message_item("".join(texts), status)
    events = [
        *opening(),
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **at, "part": {"type": "output_text", "text": ""}},
    ]
    events += [{"type": "response.output_text.delta", **at, "delta": t} for t in texts]
    events += [
        {"type": "response.output_text.done", **at, "text": "".join(texts)},
        {"type": "response.content_part.done", **at, "part": item["content"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": terminal, "response": response([item], status, reason)},
    ]
    return events


REASONING_EVENTS: list[dict[str, Any]] = [
    *opening(),
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {"type": "reasoning", "id": "rs_1", "summary": []},
    },
    {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "summary_index": 0},
    {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "delta": "think"},
    {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "summary_index": 1},
    {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "delta": "more"},
    {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [
                {"type": "summary_text", "text": "think"},
                {"type": "summary_text", "text": "more"},
            ],
        },
    },
    *text_events("ok")[2:],
]


def tool_events(*pieces: str, text: str = "Let me look.") -> list[dict[str, Any]]:
    arguments = "".join(pieces)
    events = text_events(text)[:-1] if text else opening()
    index = 1 if text else 0
    events += [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**call_item(""), "status": "in_progress"},
        },
    ]
    events += [
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": index,
            "delta": piece,
        }
        for piece in pieces
    ]
    events += [
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": index,
            "arguments": arguments,
        },
        {"type": "response.output_item.done", "output_index": index, "item": call_item(arguments)},
        {"type": "response.completed", "response": response([call_item(arguments)])},
    ]
    return events


def named(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n".encode()
        for i, e in enumerate(events)
    )


def decode(events: list[Any], *, fragments: bool = True) -> list[Event]:
    decoder = ResponsesDecoder(fragments=fragments)
    out: list[Event] = []
    for event in events:
        out += decoder.feed(event)
    return out + decoder.end()


def chat_chunks(events: list[Any], *, include_usage: bool = True) -> list[Any]:
    encoder = ChatEncoder(model="resp", created=1, include_usage=include_usage)
    chunks = encoder.encode(decode(events))
    for chunk in chunks:
        if "error" not in chunk:
            CHUNK.validate_python(chunk)
    return chunks


def anthropic_events(events: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    encoder = MessagesEncoder(model="resp", thinking_allowed=True)
    out = encoder.encode(decode(events, fragments=False))
    for name, data in out:
        if name != "error":
            assert ANTHROPIC_EVENT.validate_python(data).type == name
    return out


# -- request -----------------------------------------------------------------------------------


class RequestTests(SynchronousTestCase):
    def test_rows(self) -> None:
        chat = {
            "model": "resp",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "weather?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://x.test/a.png", "detail": "low"},
                        },
                        {"type": "file", "file": {"file_data": "JVBE", "filename": "a.pdf"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": "Looking.",
                    "reasoning_content": "dropped",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Seoul"}'},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {
                    "role": "tool",
                    "tool_call_id": "call_2",
                    "content": [{"type": "text", "text": "rainy"}],
                },
                {"role": "system", "content": "answer in Korean"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [TOOL, {**TOOL, "function": {**TOOL["function"], "strict": True}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "temperature": 0.2,
            "top_p": 0.9,
            "user": "u-1",
            "prompt_cache_key": "k",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
            },
            "verbosity": "low",
            "reasoning_effort": "high",
            "stream": True,
            "stream_options": {"include_usage": True},
            "seed": 3,
            "logprobs": True,
            "n": 1,
            "stop": [],
        }
        parameters = TOOL["function"]["parameters"]
        self.assertEqual(
            chat_to_responses(chat, target="resp-target", max_output_tokens=99),
            {
                "model": "resp-target",
                "instructions": "be brief\n\nand kind",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "weather?"},
                            {
                                "type": "input_image",
                                "image_url": "data:image/png;base64,AA",
                                "detail": "auto",
                            },
                            {
                                "type": "input_image",
                                "image_url": "https://x.test/a.png",
                                "detail": "low",
                            },
                            {"type": "input_file", "file_data": "JVBE", "filename": "a.pdf"},
                        ],
                    },
                    {"type": "message", "role": "assistant", "content": "Looking."},
                    {
                        "type": "function_call",
                        "call_id": "call_1",
                        "name": "get_weather",
                        "arguments": '{"city":"Seoul"}',
                    },
                    {
                        "type": "function_call",
                        "call_id": "call_2",
                        "name": "get_weather",
                        "arguments": "{}",
                    },
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "rainy"},
                    {"type": "message", "role": "system", "content": "answer in Korean"},
                    {"type": "message", "role": "assistant", "content": "no"},
                    {"type": "message", "role": "user", "content": "thanks"},
                ],
                "store": False,
                "max_output_tokens": 99,
                "temperature": 0.2,
                "top_p": 0.9,
                "user": "u-1",
                "prompt_cache_key": "k",
                "tools": [
                    {
                        "type": "function",
                        "name": "get_weather",
                        "parameters": parameters,
                        "strict": False,
                        "description": "Weather for a city",
                    },
                    {
                        "type": "function",
                        "name": "get_weather",
                        "parameters": parameters,
                        "strict": True,
                        "description": "Weather for a city",
                    },
                ],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": False,
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "w",
                        "schema": {"type": "object"},
                        "strict": True,
                    },
                    "verbosity": "low",
                },
                "reasoning": {"effort": "high"},
                "stream": True,
            },
        )

    def test_small_rows(self) -> None:
        def sent(**fields: Any) -> dict[str, Any]:
            return chat_to_responses({**CHAT, **fields}, target="t", max_output_tokens=None)

        self.assertEqual(
            sent(),
            {
                "model": "t",
                "input": [{"type": "message", "role": "user", "content": "hi"}],
                "store": False,
            },
        )
        for choice in ("auto", "none", "required"):
            self.assertEqual(sent(tools=[TOOL], tool_choice=choice)["tool_choice"], choice)
        # Without tools there is nothing to choose from: neither is sent.
        self.assertNotIn("tool_choice", sent(tool_choice="auto"))
        self.assertNotIn("tools", sent(tools=[]))
        self.assertEqual(
            sent(response_format={"type": "json_object"})["text"],
            {"format": {"type": "json_object"}},
        )
        self.assertNotIn("text", sent(response_format={"type": "text"}))
        schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
        self.assertEqual(sent(response_format=schema)["text"]["format"]["name"], "response")
        self.assertNotIn("stream", sent(stream=False))
        self.assertEqual(sent(store=True)["store"], False)

    def test_refusals_name_what(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({**CHAT, "stop": "END"}, "stop"),
            ({**CHAT, "stop": ["a", "b"]}, "stop"),
            ({**CHAT, "n": 2}, "n:"),
            ({"messages": [{"role": "function", "content": "x"}]}, "role"),
            ({"messages": [{"role": "system", "content": "only"}]}, "user or assistant"),
            ({"messages": []}, "messages"),
            (
                {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
                "input_audio",
            ),
            ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "file"),
            ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
            (
                {"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]}]},
                "name",
            ),
            ({**CHAT, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "function"),
            ({**CHAT, "tools": [TOOL], "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
            ({**CHAT, "response_format": {"type": "grammar"}}, "response_format"),
            ({**CHAT, "temperature": "hot"}, "temperature"),
        ]
        for chat, fragment in cases:
            with self.assertRaises(BridgeError, msg=fragment) as raised:
                chat_to_responses(chat, target="t", max_output_tokens=None)
            self.assertIn(fragment, raised.exception.message)

    def test_inverse_of_the_responses_bridge(self) -> None:
        """A Responses request → Chat (``responses_to_chat``) → Responses is the request again
        (in the forms both directions keep: typed message items, string assistant text)."""
        original = {
            "model": "resp-target",
            "instructions": "be brief",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "weather?"},
                        {"type": "input_image", "image_url": "https://x.test/a", "detail": "high"},
                    ],
                },
                {"type": "message", "role": "assistant", "content": "Looking."},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Seoul"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "message", "role": "system", "content": "in Korean"},
                {"type": "message", "role": "user", "content": "thanks"},
            ],
            "store": False,
            "max_output_tokens": 50,
            "temperature": 0.5,
            "top_p": 0.8,
            "user": "u",
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,
                    "description": "Weather",
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": True,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {}, "strict": True}},
            "reasoning": {"effort": "low"},
            "stream": True,
        }
        bridged = responses_to_chat(
            original, target="resp-target", reasoning_allowed=True, max_tokens=50
        )
        back = chat_to_responses(bridged.chat, target="resp-target", max_output_tokens=50)
        self.assertEqual(back, original)


# -- answers -----------------------------------------------------------------------------------


def kinds(events: list[Event]) -> list[Kind]:
    return [e.kind for e in events]


class DecoderTests(SynchronousTestCase):
    def test_text_stream_with_usage(self) -> None:
        chunks = chat_chunks(text_events("he", "llo"))
        texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        self.assertEqual("".join(t for t in texts if t), "hello")
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "stop")
        self.assertEqual(
            chunks[-1]["usage"],
            {
                "prompt_tokens": 12,
                "completion_tokens": 7,
                "total_tokens": 19,
                "prompt_tokens_details": {"cached_tokens": 8},
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
        )
        # The text came as deltas: the done events repeat it, and nothing doubles.
        self.assertEqual(kinds(decode(text_events("a"))).count(Kind.TEXT), 1)

    def test_reasoning_summary_and_text(self) -> None:
        events = decode(REASONING_EVENTS)
        reasoning = "".join(e.text for e in events if e.kind == Kind.REASONING)
        self.assertEqual(reasoning, "think\n\nmore")
        self.assertEqual("".join(e.text for e in events if e.kind == Kind.TEXT), "ok")
        raw = [
            *opening(),
            {"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": "hm"},
            *text_events("ok")[2:],
        ]
        self.assertEqual([e.text for e in decode(raw) if e.kind == Kind.REASONING], ["hm"])

    def test_tool_call_fragments_for_chat(self) -> None:
        chunks = chat_chunks(tool_events('{"ci', 'ty": "Seoul"}'), include_usage=False)
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
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                },
                {"index": 0, "function": {"arguments": '{"ci'}},
                {"index": 0, "function": {"arguments": 'ty": "Seoul"}'}},
            ],
        )
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "tool_calls")

    def test_whole_tool_calls_for_other_encoders(self) -> None:
        events = decode(tool_events('{"ci', 'ty": "Seoul"}'), fragments=False)
        self.assertNotIn(Kind.TOOL_CALL_START, kinds(events))
        [call] = [e.call for e in events if e.kind == Kind.TOOL_CALL]
        self.assertEqual(
            call,
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
            },
        )
        self.assertEqual(events[-1].reason, "tool_calls")

    def test_arguments_given_only_when_done(self) -> None:
        """A server that sends no argument deltas: the ``done`` events carry them."""
        for drop in ("response.function_call_arguments.delta", "response.output_item.added"):
            for fragments in (True, False):
                events = [e for e in tool_events('{"a": 1}') if e["type"] != drop]
                decoded = decode(events, fragments=fragments)
                if fragments:
                    text = "".join(e.text for e in decoded if e.kind == Kind.TOOL_CALL_DELTA)
                    self.assertEqual(text, '{"a": 1}', drop)
                    self.assertEqual(kinds(decoded).count(Kind.TOOL_CALL_START), 1)
                else:
                    [call] = [e.call for e in decoded if e.kind == Kind.TOOL_CALL]
                    self.assertEqual(call["function"]["arguments"], '{"a": 1}', drop)
        # No arguments at all: an empty object.
        decoded = decode(tool_events(text=""), fragments=False)
        [call] = [e.call for e in decoded if e.kind == Kind.TOOL_CALL]
        self.assertEqual(call["function"]["arguments"], "{}")

    def test_incomplete(self) -> None:
        for reason, finish in [
            ("max_output_tokens", "length"),
            ("content_filter", "content_filter"),
            ("something_new", "length"),
        ]:
            events = decode(text_events("x", terminal="response.incomplete", reason=reason))
            self.assertEqual(events[-1].kind, Kind.FINISH)
            self.assertEqual(events[-1].reason, finish, reason)
            chunks = chat_chunks(text_events("x", terminal="response.incomplete", reason=reason))
            self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], finish)

    def test_failures(self) -> None:
        failed = response([], status="failed", usage=None)
        failed["error"] = {
            "code": "server_error",
            "message": "model crashed sk-ant-abcdefghijklmnopqrstuvwxyz0123",
        }
        cases: list[tuple[list[Any], str]] = [
            ([*opening(), {"type": "response.failed", "response": failed}], "model crashed"),
            (
                [*opening(), {"type": "error", "code": "rate_limit", "message": "slow down"}],
                "slow down",
            ),
            (text_events("he", "llo")[:5], "ended before"),
            ([*opening(), "garbage"], "malformed"),
            ([*opening(), None], "malformed"),
            ([], "ended before"),
        ]
        for events, fragment in cases:
            decoded = decode(events)
            self.assertEqual(decoded[-1].kind, Kind.FAILED, fragment)
            terminal = decoded[-1].terminal
            assert terminal is not None
            self.assertIn(fragment, terminal.error)
            self.assertNotIn("sk-ant-abcdefghijklmnopqrstuvwxyz0123", terminal.error)
            self.assertEqual(kinds(decoded).count(Kind.FAILED), 1)
        chunks = chat_chunks(text_events("he", "llo")[:5])
        self.assertIn("ended before", chunks[-1]["error"]["message"])

    def test_unknown_events_are_skipped_and_nothing_follows_the_end(self) -> None:
        decoder = ResponsesDecoder()
        for event in text_events("a")[:-1]:
            decoder.feed(event)
        self.assertEqual(decoder.feed({"type": "response.web_search_call.searching"}), [])
        self.assertEqual(decoder.feed({"no": "type"}), [])
        [finish] = decoder.feed(text_events("a")[-1])
        self.assertEqual(finish.kind, Kind.FINISH)
        self.assertTrue(decoder.done)
        self.assertEqual(decoder.feed(text_events("b")[4]), [])
        self.assertEqual(decoder.end(), [])

    def test_whole_response(self) -> None:
        whole = response(
            [
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "hmm"}],
                },
                message_item("Let me look."),
                call_item('{"city": "Seoul"}'),
            ]
        )
        decoder = ResponsesDecoder()
        encoder = ChatEncoder(model="resp", created=1)
        encoder.encode(decoder.response(whole))
        self.assertIsNone(decoder.failed)
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
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
                }
            ],
        )
        self.assertEqual(completion["usage"]["prompt_tokens_details"], {"cached_tokens": 8})
        cut = ResponsesDecoder().response(
            response([message_item("x", "incomplete")], "incomplete", "max_output_tokens")
        )
        self.assertEqual(cut[-1].reason, "length")

    def test_whole_failures(self) -> None:
        failed = response([], status="failed")
        failed["error"] = {"code": "server_error", "message": "boom"}
        for whole, fragment in [
            (failed, "boom"),
            (response([], status="in_progress"), "in_progress"),
            ({"type": "error"}, "not a response"),
            (None, "not a response"),
        ]:
            decoder = ResponsesDecoder()
            [event] = decoder.response(whole)
            self.assertEqual(event.kind, Kind.FAILED)
            assert decoder.failed is not None
            self.assertIn(fragment, decoder.failed)

    def test_messages_encoder(self) -> None:
        """The Messages surface's encoder over the decoded answer: whole tool calls become a
        ``tool_use`` block, reasoning a thinking block, the usage Anthropic's counting."""
        events = anthropic_events(REASONING_EVENTS)
        names = [name for name, _ in events]
        self.assertEqual(names[0], "message_start")
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        blocks = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
        self.assertEqual(blocks, ["thinking", "text"])
        delta = events[-2][1]
        self.assertEqual(delta["delta"]["stop_reason"], "end_turn")
        self.assertEqual(
            delta["usage"], {"output_tokens": 7, "input_tokens": 4, "cache_read_input_tokens": 8}
        )
        tools = anthropic_events(tool_events('{"ci', 'ty": "Seoul"}'))
        [tool] = [d["content_block"] for n, d in tools if n == "content_block_start"][1:]
        self.assertEqual(
            (tool["type"], tool["id"], tool["name"]), ("tool_use", "call_1", "get_weather")
        )
        partial = [
            d["delta"]["partial_json"]
            for n, d in tools
            if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
        ]
        self.assertEqual(json.loads("".join(partial)), {"city": "Seoul"})
        self.assertEqual(tools[-2][1]["delta"]["stop_reason"], "tool_use")
        cut = anthropic_events(
            text_events("x", terminal="response.incomplete", reason="max_output_tokens")
        )
        self.assertEqual(cut[-2][1]["delta"]["stop_reason"], "max_tokens")
        failed = anthropic_events(text_events("he", "llo")[:5])
        self.assertEqual(failed[-1][0], "error")
        # Whole: one message.
        encoder = MessagesEncoder(model="resp", thinking_allowed=False)
        encoder.encode(ResponsesDecoder(fragments=False).response(response([call_item("{}")])))
        message = Message.model_validate(encoder.message())
        self.assertEqual(message.stop_reason, "tool_use")
        self.assertEqual(message.content[0].type, "tool_use")


# -- through the ingress -----------------------------------------------------------------------


def chunks_and_done(raw: bytes) -> tuple[list[Any], bool]:
    datas = [
        line[len(b"data: ") :].decode() for line in raw.split(b"\n") if line.startswith(b"data: ")
    ]
    done = bool(datas) and datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas if d != "[DONE]"], done


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    parser = SSEParser()
    return [(e.event, json.loads(e.data)) for e in parser.feed(raw) + parser.finish()]


class IngressCaseOverResponses(IngressCase):
    def sent(self, path: str, request: dict[str, Any]) -> tuple[Any, Any]:
        d = self.edge.post(path, request)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual((sent.operation, sent.profile), ("responses", "openai-responses"))
        return d, sent

    def streamed(self, path: str, request: dict[str, Any], events: list[Any]) -> bytes:
        d, sent = self.sent(path, {**request, "stream": True})
        self.assertTrue(sent.stream)
        self.assertIs(json.loads(sent.body)["stream"], True)
        raw = named(events)
        self.edge.frames(sent.run_id, start(200, "text/event-stream"))
        for i in range(0, len(raw), 41):
            self.edge.frames(sent.run_id, body(raw[i : i + 41]))
        self.edge.frames(sent.run_id, END)
        code, headers, data = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])
        self.assertEqual(self.edge.in_flight("p-resp"), 0)
        return data

    def whole(self, path: str, request: dict[str, Any], answer: Any) -> tuple[int, Any]:
        d, sent = self.sent(path, request)
        self.assertFalse(sent.stream)
        data = json.dumps(answer).encode()
        self.edge.frames(sent.run_id, start(), body(data[:11]), body(data[11:]), usage(12, 7), END)
        result = self.json_answer(d)
        self.assertEqual(self.edge.in_flight("p-resp"), 0)
        return result


class ChatIngressTests(IngressCaseOverResponses):
    """``POST /v1/chat/completions`` for the ``resp`` model (an ``openai_responses`` profile)."""

    def test_whole_answer(self) -> None:
        d, sent = self.sent("/v1/chat/completions", {**CHAT, "max_completion_tokens": 50})
        self.assertEqual(
            json.loads(sent.body),
            {
                "model": "resp-target",
                "input": [{"type": "message", "role": "user", "content": "hi"}],
                "store": False,
                "max_output_tokens": 50,
            },
        )
        data = json.dumps(response([message_item("hello")], "incomplete", "max_output_tokens"))
        self.edge.frames(sent.run_id, start(), body(data.encode()), usage(12, 7), END)
        code, completion = self.json_answer(d)
        self.assertEqual(code, 200)
        TypeAdapter(ChatCompletion).validate_python(completion)
        self.assertEqual(completion["model"], "resp")
        self.assertEqual(completion["choices"][0]["message"]["content"], "hello")
        self.assertEqual(completion["choices"][0]["finish_reason"], "length")
        self.assertEqual(completion["usage"]["total_tokens"], 19)
        [(_, reported, outcome)] = self.edge.finished
        self.assertEqual((reported, outcome), (Usage(12, 7), "complete"))
        self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_the_model_default_limit(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertEqual(json.loads(self.edge.tunnel_request().body)["max_output_tokens"], 300)

    def test_streamed_with_tools_and_usage(self) -> None:
        data = self.streamed(
            "/v1/chat/completions",
            {**CHAT, "stream_options": {"include_usage": True}, "tools": [TOOL]},
            tool_events('{"ci', 'ty": "Seoul"}'),
        )
        chunks, done = chunks_and_done(data)
        self.assertTrue(done)
        for chunk in chunks:
            CHUNK.validate_python(chunk)
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        self.assertEqual(text, "Let me look.")
        arguments = "".join(
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
            for c in chunks
            if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
        )
        self.assertEqual(json.loads(arguments), {"city": "Seoul"})
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "tool_calls")
        self.assertEqual(chunks[-1]["usage"]["prompt_tokens_details"], {"cached_tokens": 8})

    def test_upstream_error_keeps_its_status_in_the_openai_shape(self) -> None:
        for stream in (False, True):
            d, sent = self.sent("/v1/chat/completions", {**CHAT, "stream": stream})
            answer = {"error": {"message": "slow", "type": "rate_limit_error"}}
            self.edge.frames(sent.run_id, start(429), body(json.dumps(answer).encode()), END)
            found = self.assertOpenAIError(d, 429, "slow")
            self.assertEqual(found["code"], "upstream_error")
            self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_a_stream_cut_mid_way_ends_with_an_error_chunk(self) -> None:
        d, sent = self.sent("/v1/chat/completions", {**CHAT, "stream": True})
        raw = named(text_events("he", "llo")[:5])
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(raw))
        self.edge.frames(sent.run_id, error("upstream reset"))
        code, _, data = self.answer(d)
        self.assertEqual(code, 200)
        chunks, done = chunks_and_done(data)
        self.assertFalse(done)
        self.assertIn("upstream reset", chunks[-1]["error"]["message"])
        self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_a_failed_response_ends_with_an_error_chunk(self) -> None:
        failed = response([], status="failed", usage=None)
        failed["error"] = {"code": "server_error", "message": "model crashed"}
        events = [*text_events("he")[:5], {"type": "response.failed", "response": failed}]
        chunks, done = chunks_and_done(self.streamed("/v1/chat/completions", CHAT, events))
        self.assertFalse(done)
        self.assertIn("model crashed", chunks[-1]["error"]["message"])

    def test_unconvertible_request_is_400_before_any_tunnel(self) -> None:
        for bad in (
            {**CHAT, "stop": "END"},
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        ):
            self.assertOpenAIError(self.edge.post("/v1/chat/completions", bad), 400)
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])
        self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_a_garbage_body_is_a_502(self) -> None:
        for garbage in ("not json", {"object": "response", "status": "failed", "output": []}):
            code, answer = self.whole("/v1/chat/completions", CHAT, garbage)
            self.assertEqual(code, 502)
            self.assertIn("could not be converted", answer["error"]["message"])


class MessagesIngressTests(IngressCaseOverResponses):
    """``POST /v1/messages`` for the ``resp`` model: Messages → Chat → Responses and back."""

    def test_whole_answer(self) -> None:
        request = {
            **MESSAGES,
            "system": "be brief",
            "metadata": {"user_id": "u-1"},
            "temperature": 0.3,
        }
        code, message = self.whole("/v1/messages", request, response([message_item("hello")]))
        self.assertEqual(code, 200, message)
        sent = self.edge.tunnel_request()
        self.assertEqual(
            json.loads(sent.body),
            {
                "model": "resp-target",
                "instructions": "be brief",
                "input": [{"type": "message", "role": "user", "content": "hi"}],
                "store": False,
                "max_output_tokens": 100,
                "temperature": 0.3,
                "user": "u-1",
            },
        )
        Message.model_validate(message)
        self.assertEqual(message["model"], "resp")
        self.assertEqual(message["content"], [{"type": "text", "text": "hello"}])
        self.assertEqual(message["stop_reason"], "end_turn")
        self.assertEqual(
            message["usage"],
            {"input_tokens": 4, "output_tokens": 7, "cache_read_input_tokens": 8},
        )

    def test_whole_tool_use_and_the_result_back(self) -> None:
        request = {**MESSAGES, "tools": [ANTHROPIC_TOOL]}
        code, message = self.whole(
            "/v1/messages", request, response([call_item('{"city": "Seoul"}')])
        )
        self.assertEqual(code, 200, message)
        self.assertEqual(message["stop_reason"], "tool_use")
        [block] = message["content"]
        self.assertEqual(
            block,
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Seoul"}},
        )
        answered = {
            **request,
            "messages": [
                HI,
                {"role": "assistant", "content": [block]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}
                    ],
                },
            ],
        }
        self.whole("/v1/messages", answered, response([message_item("It is sunny.")]))
        sent = json.loads(self.edge.tunnel_request().body)
        self.assertEqual(
            sent["input"][1:],
            [
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Seoul"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
        )
        self.assertEqual(sent["tools"][0]["name"], "get_weather")

    def test_streamed_tool_use(self) -> None:
        data = self.streamed(
            "/v1/messages",
            {**MESSAGES, "tools": [ANTHROPIC_TOOL]},
            tool_events('{"ci', 'ty": "Seoul"}'),
        )
        events = sse_events(data)
        for name, event in events:
            self.assertEqual(ANTHROPIC_EVENT.validate_python(event).type, name)
        blocks = [e["content_block"]["type"] for n, e in events if n == "content_block_start"]
        self.assertEqual(blocks, ["text", "tool_use"])
        partial = "".join(
            e["delta"]["partial_json"]
            for n, e in events
            if n == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
        )
        self.assertEqual(json.loads(partial), {"city": "Seoul"})
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "tool_use")
        self.assertEqual(events[-2][1]["usage"]["cache_read_input_tokens"], 8)
        self.assertEqual(events[-1][0], "message_stop")

    def test_max_tokens_cut(self) -> None:
        events = text_events("he", terminal="response.incomplete", reason="max_output_tokens")
        streamed = sse_events(self.streamed("/v1/messages", MESSAGES, events))
        self.assertEqual(streamed[-2][1]["delta"]["stop_reason"], "max_tokens")
        cut = response([message_item("he", "incomplete")], "incomplete", "max_output_tokens")
        _, message = self.whole("/v1/messages", MESSAGES, cut)
        self.assertEqual(message["stop_reason"], "max_tokens")

    def test_thinking_only_when_allowed(self) -> None:
        """The profile has no thinking extension: the reasoning is not shown."""
        events = sse_events(self.streamed("/v1/messages", MESSAGES, REASONING_EVENTS))
        blocks = [e["content_block"]["type"] for n, e in events if n == "content_block_start"]
        self.assertEqual(blocks, ["text"])

    def test_upstream_error_keeps_its_status_in_the_anthropic_shape(self) -> None:
        for stream in (False, True):
            d, sent = self.sent("/v1/messages", {**MESSAGES, "stream": stream})
            answer = {"error": {"message": "boom", "type": "server_error"}}
            self.edge.frames(sent.run_id, start(500), body(json.dumps(answer).encode()), END)
            self.assertAnthropicError(d, 500, "api_error", "boom")
            self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_a_stream_cut_mid_way_ends_with_an_error_event(self) -> None:
        d, sent = self.sent("/v1/messages", {**MESSAGES, "stream": True})
        raw = named(text_events("he", "llo")[:5])
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(raw))
        self.edge.frames(sent.run_id, error("upstream reset"))
        code, _, data = self.answer(d)
        self.assertEqual(code, 200)
        events = sse_events(data)
        self.assertEqual(events[-1][0], "error")
        self.assertIn("upstream reset", events[-1][1]["error"]["message"])
        self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_stop_sequences_are_refused_before_any_tunnel(self) -> None:
        refused = {**MESSAGES, "stop_sequences": ["END"]}
        self.assertAnthropicError(
            self.edge.post("/v1/messages", refused), 400, "invalid_request_error", "stop"
        )
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])
        self.assertEqual(self.edge.in_flight("p-resp"), 0)

    def test_a_garbage_body_is_a_502(self) -> None:
        code, answer = self.whole("/v1/messages", MESSAGES, "not json")
        self.assertEqual(code, 502)
        self.assertIn("could not be converted", answer["error"]["message"])
