"""
The Messages surface's encoder: canonical answer events to Anthropic messages and stream
events — a Chat provider's answer (whole and streamed) through the Chat decoder, and normalized
run events through the run decoder — and a real SDK client reading them.

Every message and stream event produced is validated against the official ``anthropic`` SDK's
types when the SDK is importable (those checks are skipped cleanly otherwise), and every stream
is replayed through the SDK's own stream accumulator and compared with the encoder's message.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from iop.edge.ingress.bridge import messages_to_chat
from iop.edge.ingress.chat_decode import ChatDecoder
from iop.edge.ingress.messages_encode import (
    PING,
    Event,
    MessagesEncoder,
    RunEventsToMessages,
    UpstreamError,
    anthropic_error,
    format_sse,
    run_events_to_message,
    stop_reason_for,
)
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.test_bridge import WEATHER_TOOL

try:
    from anthropic.types import Message, RawMessageStreamEvent
    from anthropic.types.shared import ErrorResponse
    from pydantic import TypeAdapter
except ImportError:  # pragma: no cover - depends on the environment
    SDK = False
else:
    SDK = True

try:
    import anthropic
    import anthropic._base_client as _sdk_base
except ImportError:  # pragma: no cover - depends on the environment
    HTTP: Any = None
else:
    # The HTTP library the SDK is built on (httpx, or httpx2 in newer releases), for a mock
    # transport that serves converted events to a real SDK client.
    HTTP = getattr(_sdk_base, "httpx2", None) or getattr(_sdk_base, "httpx", None)

try:
    from anthropic.lib.streaming._messages import accumulate_event
except ImportError:  # pragma: no cover - a private SDK helper that may move
    ACCUMULATE = False
else:
    ACCUMULATE = SDK


# -- shape checks ------------------------------------------------------------------------------


def validate_message(message: dict[str, Any]) -> None:
    """``message`` is a valid ``anthropic.types.Message`` (when the SDK is importable)."""
    if SDK:
        Message.model_validate(message)


def validate_events(events: list[Event]) -> None:
    """Every event validates against the SDK's stream event types (when importable)."""
    if not SDK:
        return
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        if name == "error":
            ErrorResponse.model_validate(data)
        elif name != "ping":
            adapter.validate_python(data)


def sdk_accumulate(events: list[Event]) -> dict[str, Any] | None:
    """The final message the SDK's own stream accumulator builds from ``events``."""
    if not ACCUMULATE:
        return None
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    snapshot: Any = None
    buffers: dict[int, bytes] = {}
    for name, data in events:
        if name in ("ping", "error"):
            continue
        event = adapter.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    if snapshot is None:
        return None
    return dict(snapshot.model_dump(mode="json", exclude_none=True))


def without_none(value: Any) -> Any:
    """``value`` without None-valued keys (the form ``model_dump(exclude_none=True)`` gives)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


def check_order(test: SynchronousTestCase, events: list[Event]) -> None:
    """
    The Messages streaming order: ``message_start`` first; blocks opened with consecutive
    indices, each closed before the next opens, deltas only to the open block and of its kind;
    ``message_delta`` then ``message_stop`` last; or an ``error`` as the very last event.
    """
    names = [name for name, _ in events]
    for name, data in events:
        test.assertEqual(name, data["type"])
    failed = bool(names) and names[-1] == "error"
    if failed:
        test.assertNotIn("error", names[:-1])
        test.assertNotIn("message_stop", names)
        events = events[:-1]
        if not events:
            return
    else:
        test.assertEqual(names[-2:], ["message_delta", "message_stop"])
        test.assertEqual(names.count("message_delta"), 1)
        test.assertEqual(names.count("message_stop"), 1)
    test.assertEqual(names[0], "message_start")
    test.assertEqual(names.count("message_start"), 1)
    open_index: int | None = None
    open_kind = ""
    next_index = 0
    kinds = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
    for name, data in events[1:]:
        if name == "content_block_start":
            test.assertIsNone(open_index, "a block opened while another was open")
            test.assertEqual(data["index"], next_index)
            open_index, open_kind = data["index"], data["content_block"]["type"]
            next_index += 1
        elif name == "content_block_delta":
            test.assertEqual(data["index"], open_index)
            test.assertEqual(data["delta"]["type"], kinds[open_kind])
        elif name == "content_block_stop":
            test.assertEqual(data["index"], open_index)
            open_index = None
        elif name in ("message_delta", "message_stop"):
            test.assertIsNone(open_index, "the message ended with a block open")
    if not failed:
        test.assertIsNone(open_index)


class StreamChecks(SynchronousTestCase):
    def check_stream(
        self, events: list[Event], message: dict[str, Any] | None = None
    ) -> list[Event]:
        """Order, SDK types, and (when finished) the SDK's accumulation equals ``message``."""
        check_order(self, events)
        validate_events(events)
        if message is not None:
            validate_message(message)
            rebuilt = sdk_accumulate(events)
            if rebuilt is not None:
                self.assertEqual(rebuilt, without_none(json.loads(json.dumps(message))))
        return events


def names(events: list[Event]) -> list[str]:
    return [name for name, _ in events]


def blocks(events: list[Event]) -> list[dict[str, Any]]:
    return [data["content_block"] for name, data in events if name == "content_block_start"]


def deltas(events: list[Event]) -> list[dict[str, Any]]:
    return [data["delta"] for name, data in events if name == "content_block_delta"]


def final_delta(events: list[Event]) -> dict[str, Any]:
    [data] = [data for name, data in events if name == "message_delta"]
    return data


# -- whole answers -----------------------------------------------------------------------------


def completion(
    message: dict[str, Any], finish: str | None = "stop", **extra: Any
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    choice.update(extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "served-7b",
        "choices": [choice],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def chat_message(
    data: Any, *, thinking: bool = False, model: str = "claude-x"
) -> tuple[dict[str, Any], str | None]:
    """A whole ``chat.completion`` decoded and encoded as a ``message`` (and the decoder's
    failure), as the Messages surface answers one from a Chat tunnel."""
    decoder = ChatDecoder(fragments=False)
    encoder = MessagesEncoder(model=model, thinking_allowed=thinking)
    encoder.encode(decoder.completion(data))
    return encoder.message(), decoder.failed


class ChatCompletionToMessageTests(SynchronousTestCase):
    """A whole Chat answer (:class:`ChatDecoder`) as a Messages ``message``."""

    def convert(self, data: dict[str, Any], thinking: bool = False) -> dict[str, Any]:
        message, failed = chat_message(data, thinking=thinking)
        self.assertIsNone(failed)
        validate_message(message)
        return message

    def test_text(self) -> None:
        message = self.convert(completion({"role": "assistant", "content": "Hi there"}))
        self.assertTrue(message["id"].startswith("msg_"))
        self.assertEqual(message["type"], "message")
        self.assertEqual(message["role"], "assistant")
        self.assertEqual(message["model"], "claude-x")
        self.assertEqual(message["content"], [{"type": "text", "text": "Hi there"}])
        self.assertEqual(message["stop_reason"], "end_turn")
        self.assertIsNone(message["stop_sequence"])
        self.assertEqual(message["usage"], {"input_tokens": 12, "output_tokens": 7})

    def test_thinking(self) -> None:
        data = completion({"role": "assistant", "content": "42", "reasoning_content": "think"})
        message = self.convert(data, thinking=True)
        self.assertEqual(
            message["content"],
            [
                {"type": "thinking", "thinking": "think", "signature": ""},
                {"type": "text", "text": "42"},
            ],
        )
        newer = completion({"role": "assistant", "content": "42", "reasoning": "think"})
        self.assertEqual(self.convert(newer, thinking=True)["content"][0]["thinking"], "think")

    def test_thinkingNotAllowed(self) -> None:
        data = completion({"role": "assistant", "content": "42", "reasoning_content": "think"})
        self.assertEqual(self.convert(data)["content"], [{"type": "text", "text": "42"}])

    def test_toolUse(self) -> None:
        data = completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {"id": "call_b", "type": "function", "function": {"name": "now"}},
                    {
                        "id": "call_c",
                        "type": "function",
                        "function": {"name": "bad", "arguments": "{oops"},
                    },
                ],
            },
            finish="tool_calls",
        )
        message = self.convert(data)
        self.assertEqual(
            message["content"],
            [
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {"type": "tool_use", "id": "call_b", "name": "now", "input": {}},
                {
                    "type": "tool_use",
                    "id": "call_c",
                    "name": "bad",
                    "input": {"raw_arguments": "{oops"},
                },
            ],
        )
        self.assertEqual(message["stop_reason"], "tool_use")

    def test_textThenToolUse(self) -> None:
        data = completion(
            {
                "role": "assistant",
                "content": "Let me check.",
                "reasoning_content": "hm",
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
            finish="stop",
        )
        message = self.convert(data, thinking=True)
        self.assertEqual([b["type"] for b in message["content"]], ["thinking", "text", "tool_use"])
        self.assertTrue(message["content"][2]["id"].startswith("toolu_"))
        self.assertEqual(message["stop_reason"], "tool_use")

    def test_stopReasons(self) -> None:
        for finish, expected in [
            ("stop", "end_turn"),
            ("length", "max_tokens"),
            ("content_filter", "refusal"),
            ("tool_calls", "end_turn"),
            (None, "end_turn"),
            ("weird", "end_turn"),
        ]:
            data = completion({"role": "assistant", "content": "x"}, finish=finish)
            self.assertEqual(self.convert(data)["stop_reason"], expected, finish)

    def test_stopSequence(self) -> None:
        data = completion({"role": "assistant", "content": "x"}, stop_reason="END")
        message = self.convert(data)
        self.assertEqual(message["stop_reason"], "stop_sequence")
        self.assertEqual(message["stop_sequence"], "END")
        eos = completion({"role": "assistant", "content": "x"}, stop_reason=None)
        self.assertEqual(self.convert(eos)["stop_reason"], "end_turn")

    def test_cachedUsage(self) -> None:
        data = completion({"role": "assistant", "content": "x"})
        data["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
        self.assertEqual(
            self.convert(data)["usage"],
            {"input_tokens": 4, "output_tokens": 7, "cache_read_input_tokens": 8},
        )

    def test_missingUsage(self) -> None:
        data = completion({"role": "assistant", "content": "x"})
        del data["usage"]
        self.assertEqual(self.convert(data)["usage"], {"input_tokens": 0, "output_tokens": 0})

    def test_refusal(self) -> None:
        data = completion({"role": "assistant", "content": None, "refusal": "I can't."})
        message = self.convert(data)
        self.assertEqual(message["content"], [{"type": "text", "text": "I can't."}])
        self.assertEqual(message["stop_reason"], "refusal")

    def test_toolCallsOutrankARefusal(self) -> None:
        """As streamed: a refusal beside tool calls is text, the stop reason ``tool_use``."""
        call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        data = completion({"role": "assistant", "refusal": "no", "tool_calls": [call]})
        message = self.convert(data)
        self.assertEqual([b["type"] for b in message["content"]], ["text", "tool_use"])
        self.assertEqual(message["stop_reason"], "tool_use")

    def test_namelessCallLeftOut(self) -> None:
        call = {"id": "a", "type": "function", "function": {"arguments": "{}"}}
        message = self.convert(completion({"role": "assistant", "tool_calls": [call]}))
        self.assertEqual((message["content"], message["stop_reason"]), ([], "end_turn"))

    def test_contentParts(self) -> None:
        parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        message = self.convert(completion({"role": "assistant", "content": parts}))
        self.assertEqual(message["content"], [{"type": "text", "text": "ab"}])

    def test_empty(self) -> None:
        message = self.convert(completion({"role": "assistant", "content": ""}))
        self.assertEqual(message["content"], [])

    def test_malformed(self) -> None:
        for data in [[], {}, {"choices": []}, {"choices": [{"index": 0}]}, {"choices": ["x"]}]:
            _, failed = chat_message(data)
            self.assertTrue(failed, data)


# -- streamed Chat answers ---------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "served-7b",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "served-7b",
        "choices": [],
        "usage": usage,
    }


def tool_delta(
    index: int, *, id: str | None = None, name: str | None = None, arguments: str | None = None
) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        call["function"] = function
    return {"tool_calls": [call]}


class ChatStreamTests(StreamChecks):
    """A streamed Chat answer (:class:`ChatDecoder`) as Messages stream events."""

    def convert(
        self, chunks: list[dict[str, Any]], thinking: bool = False
    ) -> tuple[list[Event], dict[str, Any]]:
        decoder = ChatDecoder()
        encoder = MessagesEncoder(model="claude-x", thinking_allowed=thinking)
        events: list[Event] = []
        for item in chunks:
            events.extend(encoder.encode(decoder.feed(item)))
        events.extend(encoder.encode(decoder.end()))
        self.assertTrue(decoder.done)
        self.assertTrue(encoder.done)
        self.assertEqual(decoder.end(), [])
        self.assertEqual(decoder.feed(chunk({"content": "late"})), [])
        message = encoder.message()
        self.check_stream(events, message)
        return events, message

    def test_plainText(self) -> None:
        events, message = self.convert(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": "lo"}),
                chunk({}, finish="stop"),
                usage_chunk(10, 2),
            ]
        )
        self.assertEqual(
            names(events),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ],
        )
        start = events[0][1]["message"]
        self.assertEqual(start["content"], [])
        self.assertEqual(start["usage"], {"input_tokens": 0, "output_tokens": 0})
        self.assertEqual(start["model"], "claude-x")
        self.assertEqual(blocks(events), [{"type": "text", "text": ""}])
        self.assertEqual(
            deltas(events),
            [{"type": "text_delta", "text": "Hel"}, {"type": "text_delta", "text": "lo"}],
        )
        self.assertEqual(
            final_delta(events),
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2, "input_tokens": 10},
            },
        )
        self.assertEqual(message["content"], [{"type": "text", "text": "Hello"}])
        self.assertEqual(message["usage"], {"input_tokens": 10, "output_tokens": 2})

    def test_reasoningThenText(self) -> None:
        chunks = [
            chunk({"role": "assistant", "reasoning_content": "Let me "}),
            chunk({"reasoning_content": "think."}),
            chunk({"content": "Answer."}),
            chunk({}, finish="stop"),
            usage_chunk(5, 9),
        ]
        events, message = self.convert(chunks, thinking=True)
        self.assertEqual(
            blocks(events),
            [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""}],
        )
        self.assertEqual(
            [d["type"] for d in deltas(events)], ["thinking_delta", "thinking_delta", "text_delta"]
        )
        self.assertEqual(message["content"][0]["thinking"], "Let me think.")
        self.assertEqual(message["content"][1], {"type": "text", "text": "Answer."})

    def test_reasoningDroppedWhenNotAllowed(self) -> None:
        chunks = [
            chunk({"reasoning": "secret"}),
            chunk({"content": "Answer."}),
            chunk({}, finish="stop"),
        ]
        events, message = self.convert(chunks, thinking=False)
        self.assertEqual(blocks(events), [{"type": "text", "text": ""}])
        self.assertEqual(message["content"], [{"type": "text", "text": "Answer."}])

    def test_toolCallSplitArguments(self) -> None:
        chunks = [
            chunk({"role": "assistant", "content": "Checking."}),
            chunk(tool_delta(0, id="call_1", name="get_weather", arguments="")),
            chunk(tool_delta(0, arguments='{"ci')),
            chunk(tool_delta(0, arguments='ty": "Par')),
            chunk(tool_delta(0, arguments='is"}')),
            chunk({}, finish="tool_calls"),
            usage_chunk(20, 15, cached=16),
        ]
        events, message = self.convert(chunks)
        self.assertEqual(
            blocks(events),
            [
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
            ],
        )
        self.assertEqual(
            [d.get("partial_json") for d in deltas(events)[1:]],
            ['{"ci', 'ty": "Par', 'is"}'],
        )
        self.assertEqual(message["content"][1]["input"], {"city": "Paris"})
        self.assertEqual(
            final_delta(events)["delta"], {"stop_reason": "tool_use", "stop_sequence": None}
        )
        self.assertEqual(
            final_delta(events)["usage"],
            {"output_tokens": 15, "input_tokens": 4, "cache_read_input_tokens": 16},
        )
        self.assertEqual(
            message["usage"],
            {"input_tokens": 4, "output_tokens": 15, "cache_read_input_tokens": 16},
        )

    def test_twoToolCalls(self) -> None:
        chunks = [
            chunk(tool_delta(0, id="call_a", name="get_weather", arguments='{"city":')),
            chunk(tool_delta(0, arguments='"Paris"}')),
            chunk(tool_delta(1, id="call_b", name="get_weather", arguments='{"city":"Oslo"}')),
            chunk({}, finish="tool_calls"),
        ]
        events, message = self.convert(chunks)
        self.assertEqual(
            [(b["id"], b["type"]) for b in blocks(events)],
            [("call_a", "tool_use"), ("call_b", "tool_use")],
        )
        self.assertEqual(
            [b["input"] for b in message["content"]], [{"city": "Paris"}, {"city": "Oslo"}]
        )
        self.assertEqual(message["stop_reason"], "tool_use")

    def test_toolNameArrivesLate(self) -> None:
        """Arguments before the name are held, then sent with the block's start."""
        chunks = [
            chunk(tool_delta(0, id="call_a")),
            chunk(tool_delta(0, arguments='{"x":')),
            chunk(tool_delta(0, name="f", arguments="1}")),
            chunk({}, finish="tool_calls"),
        ]
        events, message = self.convert(chunks)
        self.assertEqual(
            blocks(events), [{"type": "tool_use", "id": "call_a", "name": "f", "input": {}}]
        )
        self.assertEqual([d["partial_json"] for d in deltas(events)], ['{"x":1}'])
        self.assertEqual(message["content"][0]["input"], {"x": 1})

    def test_toolCallWithoutNameLeftOut(self) -> None:
        """A call that never gets a name cannot be run: left out (ChatDecoder's docstring)."""
        events, message = self.convert(
            [
                chunk({"content": "x"}),
                chunk(tool_delta(0, arguments="{}")),
                chunk({}, "tool_calls"),
            ]
        )
        self.assertEqual(blocks(events), [{"type": "text", "text": ""}])
        self.assertEqual(message["content"], [{"type": "text", "text": "x"}])
        self.assertEqual(message["stop_reason"], "end_turn")

    def test_toolCallWithoutIdOrArguments(self) -> None:
        """A fresh ``toolu_`` id, and ``{}`` for arguments that never came."""
        events, message = self.convert([chunk(tool_delta(0, name="now")), chunk({}, "tool_calls")])
        [block] = message["content"]
        self.assertTrue(block["id"].startswith("toolu_"))
        self.assertEqual((block["name"], block["input"]), ("now", {}))
        self.assertEqual([d["partial_json"] for d in deltas(events)], ["{}"])

    def test_argumentsAsAnObject(self) -> None:
        fragment = {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}
        more = {"tool_calls": [{"index": 0, "function": {"arguments": {"k": 1}}}]}
        _events, message = self.convert([chunk(fragment), chunk(more), chunk({}, "tool_calls")])
        self.assertEqual(message["content"][0]["input"], {"k": 1})

    def test_fragmentForClosedCallDropped(self) -> None:
        chunks = [
            chunk(tool_delta(0, id="a", name="f", arguments='{"k":1}')),
            chunk(tool_delta(1, id="b", name="g", arguments="{}")),
            chunk(tool_delta(0, arguments="junk")),
            chunk({}, finish="tool_calls"),
        ]
        _events, message = self.convert(chunks)
        self.assertEqual([b["input"] for b in message["content"]], [{"k": 1}, {}])

    def test_usageOnlyFinalChunk(self) -> None:
        events, message = self.convert(
            [chunk({"content": "x"}, finish="length"), usage_chunk(3, 100)]
        )
        self.assertEqual(final_delta(events)["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(message["usage"], {"input_tokens": 3, "output_tokens": 100})

    def test_usageChunkWithNullChoices(self) -> None:
        final = usage_chunk(3, 1)
        final["choices"] = None
        _events, message = self.convert([chunk({"content": "x"}, finish="stop"), final])
        self.assertEqual(message["usage"], {"input_tokens": 3, "output_tokens": 1})

    def test_emptyStream(self) -> None:
        events, message = self.convert([])
        self.assertEqual(names(events), ["message_start", "message_delta", "message_stop"])
        self.assertEqual(message["content"], [])
        self.assertEqual(message["stop_reason"], "end_turn")

    def test_stopSequenceFromVLLM(self) -> None:
        last = chunk({}, finish="stop")
        last["choices"][0]["stop_reason"] = "END"
        events, _message = self.convert([chunk({"content": "x"}), last])
        self.assertEqual(
            final_delta(events)["delta"], {"stop_reason": "stop_sequence", "stop_sequence": "END"}
        )

    def test_reasoningNewerName(self) -> None:
        chunks = [chunk({"reasoning": "hm"}), chunk({"content": "x"}), chunk({}, finish="stop")]
        _events, message = self.convert(chunks, thinking=True)
        self.assertEqual(message["content"][0], {"type": "thinking", "thinking": "hm",
                                                 "signature": ""})  # fmt: skip

    def test_refusal(self) -> None:
        events, message = self.convert([chunk({"refusal": "I can't."}), chunk({}, "stop")])
        self.assertEqual(message["content"], [{"type": "text", "text": "I can't."}])
        self.assertEqual(final_delta(events)["delta"]["stop_reason"], "refusal")

    def test_textAfterToolCall(self) -> None:
        chunks = [
            chunk(tool_delta(0, id="a", name="f", arguments="{}")),
            chunk({"content": "done"}),
            chunk({}, finish="tool_calls"),
        ]
        _events, message = self.convert(chunks)
        self.assertEqual([b["type"] for b in message["content"]], ["tool_use", "text"])

    def test_upstreamErrorChunk(self) -> None:
        decoder = ChatDecoder()
        encoder = MessagesEncoder(model="claude-x", thinking_allowed=False)
        events = encoder.encode(decoder.feed(chunk({"content": "par"})))
        error = {"error": {"message": "overloaded", "type": "server_error"}}
        events += encoder.encode(decoder.feed(error))
        self.assertEqual(decoder.end(), [])
        self.check_stream(events)
        self.assertEqual(
            events[-1],
            ("error", {"type": "error", "error": {"type": "api_error", "message": "overloaded"}}),
        )

    def test_fail(self) -> None:
        decoder = ChatDecoder()
        encoder = MessagesEncoder(
            model="claude-x", thinking_allowed=False, message_id="msg_fixed", input_tokens=42
        )
        events = encoder.start()
        self.assertEqual(events[0][1]["message"]["id"], "msg_fixed")
        self.assertEqual(events[0][1]["message"]["usage"]["input_tokens"], 42)
        events += encoder.encode(decoder.feed(chunk({"content": "x"})))
        events += encoder.fail("the upstream went away")
        self.assertEqual(encoder.fail("again"), [])
        self.check_stream(events)
        self.assertEqual(events[-1][1]["error"]["message"], "the upstream went away")


# -- normalized runs ---------------------------------------------------------------------------

TOOL_CALLS = json.dumps(
    [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
)


class RunEventsTests(StreamChecks):
    def stream(
        self, run_events: list[RuntimeEvent], thinking: bool = False
    ) -> tuple[list[Event], dict[str, Any]]:
        converter = RunEventsToMessages(model="claude-x", thinking_allowed=thinking)
        events: list[Event] = []
        for item in run_events:
            events.extend(converter.feed(item))
        message = converter.message()
        self.check_stream(events, message if converter.failed is None else None)
        return events, message

    def test_text(self) -> None:
        run = [
            RuntimeEvent.start(),
            RuntimeEvent.text("Hello "),
            RuntimeEvent.text("world"),
            RuntimeEvent.complete(
                usage=Usage(input_tokens=9, output_tokens=2), metadata={"finish_reason": "stop"}
            ),
        ]
        _events, message = self.stream(run)
        self.assertEqual(message["content"], [{"type": "text", "text": "Hello world"}])
        self.assertEqual(message["stop_reason"], "end_turn")
        self.assertEqual(message["usage"], {"input_tokens": 9, "output_tokens": 2})
        whole = run_events_to_message(run, model="claude-x", thinking_allowed=False)
        validate_message(whole)
        self.assertEqual(whole["content"], message["content"])
        self.assertEqual(whole["usage"], message["usage"])

    def test_reasoning(self) -> None:
        run = [
            RuntimeEvent.start(),
            RuntimeEvent.reasoning("hmm"),
            RuntimeEvent.text("42"),
            RuntimeEvent.complete(),
        ]
        _, allowed = self.stream(run, thinking=True)
        self.assertEqual(
            allowed["content"],
            [
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "text", "text": "42"},
            ],
        )
        _, dropped = self.stream(run, thinking=False)
        self.assertEqual(dropped["content"], [{"type": "text", "text": "42"}])
        self.assertEqual(dropped["usage"], {"input_tokens": 0, "output_tokens": 0})

    def test_nativeToolCalls(self) -> None:
        run = [
            RuntimeEvent.start(),
            RuntimeEvent.text("Checking."),
            RuntimeEvent.complete(
                usage=Usage(input_tokens=30, output_tokens=10, cached_input_tokens=20),
                metadata={"finish_reason": "tool_calls", "openai_tool_calls": TOOL_CALLS},
            ),
        ]
        _events, message = self.stream(run)
        self.assertEqual(
            message["content"],
            [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "call_0",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        )
        self.assertEqual(message["stop_reason"], "tool_use")
        self.assertEqual(
            message["usage"],
            {"input_tokens": 10, "output_tokens": 10, "cache_read_input_tokens": 20},
        )
        whole = run_events_to_message(run, model="claude-x", thinking_allowed=False)
        validate_message(whole)
        self.assertEqual(whole["content"], message["content"])

    def test_textToolFallback(self) -> None:
        reply = (
            "Sure.\n```json\n"
            '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}\n```'
        )
        pieces = [reply[i : i + 5] for i in range(0, len(reply), 5)]
        run = [RuntimeEvent.start()]
        run += [RuntimeEvent.text(piece) for piece in pieces]
        run.append(
            RuntimeEvent.complete(
                metadata={"finish_reason": "stop", "openai_text_tool_fallback": "true"}
            )
        )
        events, message = self.stream(run)
        # Text before the fence was sent as it came (its newline included).
        self.assertEqual(message["content"][0], {"type": "text", "text": "Sure.\n"})
        self.assertEqual(message["content"][1]["type"], "tool_use")
        self.assertEqual(message["content"][1]["name"], "get_weather")
        self.assertEqual(message["content"][1]["input"], {"city": "Oslo"})
        self.assertEqual(len(message["content"]), 2)
        self.assertEqual(message["stop_reason"], "tool_use")
        # The JSON never went out as text.
        sent = "".join(d["text"] for d in deltas(events) if d["type"] == "text_delta")
        self.assertEqual(sent, "Sure.\n")
        whole = run_events_to_message(run, model="claude-x", thinking_allowed=False)
        self.assertEqual(whole["content"][1]["input"], {"city": "Oslo"})

    def test_toolCallTextWithoutFlagIsText(self) -> None:
        reply = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
        run = [
            RuntimeEvent.start(),
            RuntimeEvent.text(reply[:10]),
            RuntimeEvent.text(reply[10:]),
            RuntimeEvent.complete(metadata={"finish_reason": "stop"}),
        ]
        _events, message = self.stream(run)
        self.assertEqual(message["content"], [{"type": "text", "text": reply}])
        self.assertEqual(message["stop_reason"], "end_turn")

    def test_bracesStreamWhenNotToolCalls(self) -> None:
        """Text with braces that cannot open a tool call is not held back."""
        converter = RunEventsToMessages(model="claude-x", thinking_allowed=False)
        events = converter.feed(RuntimeEvent.text('int f() { return 1; } and {"a": 1} `x` '))
        sent = "".join(d["text"] for d in deltas(events))
        self.assertEqual(sent, 'int f() { return 1; } and {"a": 1} `x` ')
        held = converter.feed(RuntimeEvent.text('then {"tool'))
        self.assertEqual("".join(d["text"] for d in deltas(held)), "then ")
        released = converter.feed(RuntimeEvent.text('s": 1}'))
        self.assertEqual("".join(d["text"] for d in deltas(released)), '{"tools": 1}')

    def test_fallbackWithoutToolJson(self) -> None:
        run = [
            RuntimeEvent.text("Plain answer {"),
            RuntimeEvent.complete(metadata={"openai_text_tool_fallback": "true"}),
        ]
        _events, message = self.stream(run)
        self.assertEqual(message["content"], [{"type": "text", "text": "Plain answer {"}])
        self.assertEqual(message["stop_reason"], "end_turn")

    def test_maxTokens(self) -> None:
        run = [RuntimeEvent.text("x"), RuntimeEvent.complete(metadata={"finish_reason": "length"})]
        _, message = self.stream(run)
        self.assertEqual(message["stop_reason"], "max_tokens")

    def test_error(self) -> None:
        run = [RuntimeEvent.start(), RuntimeEvent.text("par"), RuntimeEvent.failed("upstream 500")]
        events, _ = self.stream(run)
        self.assertEqual(
            events[-1],
            ("error", {"type": "error", "error": {"type": "api_error", "message": "upstream 500"}}),
        )
        error = self.assertRaises(
            UpstreamError, run_events_to_message, run, model="m", thinking_allowed=False
        )
        self.assertEqual(error.message, "upstream 500")

    def test_cancelled(self) -> None:
        run = [RuntimeEvent.start(), RuntimeEvent.cancelled("node lost")]
        events, _ = self.stream(run)
        self.assertEqual(events[-1][0], "error")
        self.assertIn("node lost", events[-1][1]["error"]["message"])
        self.assertRaises(
            UpstreamError, run_events_to_message, run, model="m", thinking_allowed=False
        )

    def test_noTerminal(self) -> None:
        error = self.assertRaises(
            UpstreamError,
            run_events_to_message,
            [RuntimeEvent.start(), RuntimeEvent.text("x")],
            model="m",
            thinking_allowed=False,
        )
        self.assertIn("without a result", error.message)

    def test_nothingAfterTerminal(self) -> None:
        converter = RunEventsToMessages(model="m", thinking_allowed=False)
        converter.feed(RuntimeEvent.complete())
        self.assertEqual(converter.feed(RuntimeEvent.text("late")), [])
        self.assertEqual(converter.fail("late"), [])


# -- helpers -----------------------------------------------------------------------------------


class HelperTests(SynchronousTestCase):
    def test_formatSSE(self) -> None:
        self.assertEqual(
            format_sse("message_stop", {"type": "message_stop"}),
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        )
        encoded = format_sse("x", {"text": "a\nb ü"})
        self.assertEqual(encoded, 'event: x\ndata: {"text":"a\\nb ü"}\n\n'.encode())

    def test_ping(self) -> None:
        self.assertEqual(PING, ("ping", {"type": "ping"}))

    def test_anthropicError(self) -> None:
        body = anthropic_error("bad", "invalid_request_error")
        self.assertEqual(
            body, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
        )
        if SDK:
            ErrorResponse.model_validate(body)

    def test_stopReasonFor(self) -> None:
        self.assertEqual(stop_reason_for("stop", tool_calls=True), "tool_use")
        self.assertEqual(stop_reason_for("length", tool_calls=True), "max_tokens")
        self.assertEqual(stop_reason_for(None, tool_calls=False), "end_turn")


# -- the real SDK client -----------------------------------------------------------------------


class SDKClientTests(SynchronousTestCase):
    """
    The official SDK client, over a mock HTTP transport, consumes what the bridge produces:
    SSE bytes from :func:`format_sse` (with a ping), whole messages, and a stream error.
    """

    def setUp(self) -> None:
        if HTTP is None or not hasattr(HTTP, "MockTransport"):
            raise SkipTest("the anthropic SDK (with its HTTP library) is not importable")
        self.requests: list[dict[str, Any]] = []

    def client(self, respond: Any) -> Any:
        def handler(request: Any) -> Any:
            body = json.loads(request.content)
            self.requests.append(body)
            return respond(body)

        transport = HTTP.MockTransport(handler)
        return anthropic.Anthropic(
            api_key="test",
            base_url="http://edge.test",
            http_client=HTTP.Client(transport=transport),
        )

    def sse(self, events: list[Event]) -> Any:
        data = b"".join(format_sse(name, payload) for name, payload in events)
        return HTTP.Response(200, content=data, headers={"content-type": "text/event-stream"})

    def test_streamFromChat(self) -> None:
        def respond(body: dict[str, Any]) -> Any:
            chat = messages_to_chat(body, target="served", thinking_allowed=True)
            self.assertEqual(chat["reasoning_effort"], "low")
            decoder = ChatDecoder()
            encoder = MessagesEncoder(model=body["model"], thinking_allowed=True)
            events = [*encoder.start(), PING]
            for item in [
                chunk({"reasoning_content": "think"}),
                chunk({"content": "Checking."}),
                chunk(tool_delta(0, id="call_1", name="get_weather", arguments='{"city":')),
                chunk(tool_delta(0, arguments='"Paris"}'), finish="tool_calls"),
                usage_chunk(10, 5),
            ]:
                events += encoder.encode(decoder.feed(item))
            return self.sse(events + encoder.encode(decoder.end()))

        client = self.client(respond)
        with client.messages.stream(
            model="claude-x",
            max_tokens=4000,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER_TOOL],
            thinking={"type": "enabled", "budget_tokens": 2000},
        ) as stream:
            texts = list(stream.text_stream)
            final = stream.get_final_message()
        self.assertEqual(texts, ["Checking."])
        self.assertEqual([b.type for b in final.content], ["thinking", "text", "tool_use"])
        self.assertEqual(final.content[2].input, {"city": "Paris"})
        self.assertEqual(final.stop_reason, "tool_use")
        self.assertEqual((final.usage.input_tokens, final.usage.output_tokens), (10, 5))

    def test_streamFromRun(self) -> None:
        def respond(body: dict[str, Any]) -> Any:
            converter = RunEventsToMessages(model=body["model"], thinking_allowed=False)
            events: list[Event] = []
            for item in [
                RuntimeEvent.start(),
                RuntimeEvent.text("Hello"),
                RuntimeEvent.complete(usage=Usage(input_tokens=4, output_tokens=1)),
            ]:
                events += converter.feed(item)
            return self.sse(events)

        stream = self.client(respond).messages.create(
            model="claude-x",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        types = [event.type for event in stream]
        self.assertEqual(types[0], "message_start")
        self.assertEqual(types[-1], "message_stop")

    def test_whole(self) -> None:
        def respond(body: dict[str, Any]) -> Any:
            answer = completion({"role": "assistant", "content": "ok"})
            message, _ = chat_message(answer, model=body["model"])
            return HTTP.Response(200, json=message)

        message = self.client(respond).messages.create(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        self.assertEqual(message.content[0].text, "ok")
        self.assertEqual(message.stop_reason, "end_turn")

    def test_streamError(self) -> None:
        def respond(body: dict[str, Any]) -> Any:
            converter = RunEventsToMessages(model=body["model"], thinking_allowed=False)
            events = converter.start() + converter.feed(RuntimeEvent.failed("node lost"))
            return self.sse(events)

        stream = self.client(respond).messages.create(
            model="claude-x",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        error = self.assertRaises(anthropic.APIError, list, stream)
        self.assertIn("node lost", str(error))
