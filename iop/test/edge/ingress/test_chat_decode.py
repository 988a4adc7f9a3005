"""
A Chat Completions answer read once (:class:`ChatDecoder`): the canonical events of a chunk
stream and of a whole completion, and each edge case the decoder's docstring decides, checked on
both surfaces that read it (Messages and Responses) so they cannot drift apart again.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.canonical import REFUSAL, Event, Kind
from iop.edge.ingress.chat_decode import ChatDecoder
from iop.edge.ingress.messages_encode import MessagesEncoder
from iop.edge.ingress.responses import ResponsesEncoder
from iop.runtime.events import Usage


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def call(index: int, **fields: Any) -> dict[str, Any]:
    """A ``delta`` with one tool-call fragment (``id``, ``name``, ``arguments``)."""
    fragment: dict[str, Any] = {"index": index}
    if "id" in fields:
        fragment["id"] = fields.pop("id")
    if fields:
        fragment["function"] = fields
    return {"tool_calls": [fragment]}


def decode(chunks: list[Any], fragments: bool = True) -> list[Event]:
    decoder = ChatDecoder(fragments=fragments)
    out: list[Event] = []
    for item in chunks:
        out += decoder.feed(item)
    return out + decoder.end()


def kinds(events: list[Event]) -> list[str]:
    return [event.kind.value for event in events]


def surfaces(chunks: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same streamed answer as a Messages ``message`` and a Responses ``response``."""
    events = decode(chunks)
    messages = MessagesEncoder(model="m", thinking_allowed=True)
    messages.encode(events)
    responses = ResponsesEncoder(model="m", request={}, created=1)
    responses.encode(events)
    return messages.message(), responses.response()


def message_tools(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(b["name"], b["input"]) for b in message["content"] if b["type"] == "tool_use"]


def response_tools(response: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["name"], i["arguments"]) for i in response["output"] if i["type"] == "function_call"]


class StreamTests(SynchronousTestCase):
    def test_text_reasoning_usage_and_finish(self) -> None:
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 2},
        }
        events = decode(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"reasoning_content": "hm", "reasoning": "ignored"}),
                chunk({"content": [{"type": "text", "text": "he"}, {"type": "text", "text": "y"}]}),
                chunk({}, "stop"),
                {"choices": [], "usage": usage},
            ]
        )
        self.assertEqual(kinds(events), ["start", "reasoning", "text", "finish"])
        self.assertEqual((events[1].text, events[2].text), ("hm", "hey"))
        finish = events[-1]
        self.assertEqual((finish.reason, finish.stop), ("stop", None))
        self.assertEqual(finish.usage, Usage(7, 3, cached_input_tokens=2))

    def test_the_last_usage_wins_and_a_missing_one_is_none(self) -> None:
        first = {**chunk({"content": "x"}), "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        last = {**chunk({}, "stop"), "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
        self.assertEqual(decode([first, last])[-1].usage, Usage(1, 2))
        self.assertIsNone(decode([chunk({"content": "x"}, "stop")])[-1].usage)
        nulls = {**chunk({"content": "x"}), "usage": None}
        self.assertIsNone(decode([nulls])[-1].usage)

    def test_vllm_stop_string(self) -> None:
        last = chunk({}, "stop")
        last["choices"][0]["stop_reason"] = "END"
        self.assertEqual(decode([chunk({"content": "x"}), last])[-1].stop, "END")
        token = chunk({}, "stop")
        token["choices"][0]["stop_reason"] = 128001
        self.assertIsNone(decode([token])[-1].stop)

    def test_only_the_first_choice(self) -> None:
        other = {"choices": [{"index": 1, "delta": {"content": "other"}}]}
        events = decode([other, chunk({"content": "mine"})])
        self.assertEqual([e.text for e in events if e.kind == Kind.TEXT], ["mine"])

    def test_empty_and_null_choices_only_start(self) -> None:
        self.assertEqual(
            kinds(decode([{"choices": []}, {"choices": None}, {}])), ["start", "finish"]
        )
        self.assertEqual(kinds(decode([])), ["start", "finish"])

    def test_tool_calls_stream_by_index(self) -> None:
        events = decode(
            [
                chunk(call(0, id="a", name="f", arguments="")),
                chunk(call(0, arguments='{"x":')),
                chunk(call(0, arguments="1}")),
                chunk(call(1, id="b", name="g")),
                chunk({}, "tool_calls"),
            ]
        )
        self.assertEqual(
            [(e.kind.value, e.call or e.text) for e in events[1:-1]],
            [
                ("tool_call_start", {"id": "a", "name": "f"}),
                ("tool_call_delta", '{"x":'),
                ("tool_call_delta", "1}"),
                ("tool_call_start", {"id": "b", "name": "g"}),
                ("tool_call_delta", "{}"),
            ],
        )
        self.assertEqual(events[-1].reason, "tool_calls")

    def test_arguments_before_the_name_go_with_the_start(self) -> None:
        events = decode(
            [
                chunk(call(0, id="a")),
                chunk(call(0, arguments='{"x":')),
                chunk(call(0, name="f", arguments="1}")),
            ]
        )
        self.assertEqual(
            [(e.kind.value, e.call or e.text) for e in events[1:-1]],
            [("tool_call_start", {"id": "a", "name": "f"}), ("tool_call_delta", '{"x":1}')],
        )

    def test_whole_calls_without_fragments(self) -> None:
        events = decode(
            [
                chunk(call(0, id="a", name="f", arguments='{"x":')),
                chunk(call(0, arguments="1}")),
                chunk({"content": "after"}),
                chunk(call(1, name="g")),
            ],
            fragments=False,
        )
        self.assertEqual(kinds(events), ["start", "tool_call", "text", "tool_call", "finish"])
        self.assertEqual(
            events[1].call,
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
        )
        self.assertEqual(events[3].call["function"], {"name": "g", "arguments": "{}"})

    def test_failures(self) -> None:
        decoder = ChatDecoder()
        decoder.feed(chunk({"content": "x"}))
        secret = "sk-upstream-0123456789abcdefXYZ"
        [failed] = decoder.feed({"error": {"message": f"overloaded: Bearer {secret}"}})
        self.assertEqual(failed.kind, Kind.FAILED)
        assert failed.terminal is not None and decoder.failed is not None
        self.assertNotIn(secret, decoder.failed)
        self.assertEqual(failed.terminal.error, decoder.failed)
        self.assertEqual((decoder.feed(chunk({"content": "late"})), decoder.end()), ([], []))
        bad: Any
        for bad in (None, [], "text"):
            self.assertEqual(kinds(ChatDecoder().feed(bad)), ["failed"])
        self.assertEqual(kinds(ChatDecoder().feed({"error": "x"})), ["failed"])
        # An error object beside choices is not the provider's failure.
        beside = {**chunk({"content": "x"}), "error": {"message": "?"}}
        self.assertEqual(kinds(ChatDecoder().feed(beside)), ["start", "text"])


class CompletionTests(SynchronousTestCase):
    def test_a_whole_answer(self) -> None:
        completion = {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "reasoning": "hm",
                        "content": "hi",
                        "refusal": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": {"a": 1}},
                            },
                            {"type": "function", "function": {"name": "g"}},
                        ],
                    },
                    "finish_reason": "tool_calls",
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 5},
        }
        decoder = ChatDecoder(fragments=False)
        events = decoder.completion(completion)
        self.assertIsNone(decoder.failed)
        self.assertEqual(
            kinds(events), ["start", "reasoning", "text", "tool_call", "tool_call", "finish"]
        )
        self.assertEqual(events[3].call["function"], {"name": "f", "arguments": '{"a": 1}'})
        self.assertEqual(
            events[4].call,
            {"id": "", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        )
        self.assertEqual((events[-1].reason, events[-1].usage), ("tool_calls", Usage(2, 5)))
        self.assertEqual(decoder.completion(completion), [])

    def test_not_a_completion(self) -> None:
        cases = [
            (None, "not a JSON object"),
            ({}, "has no choices"),
            ({"choices": ["x"]}, "has no choices"),
            ({"choices": [{"index": 0}]}, "has no message"),
            ({"error": {"message": "quota exceeded"}}, "quota exceeded"),
        ]
        for data, why in cases:
            decoder = ChatDecoder(fragments=False)
            self.assertEqual(kinds(decoder.completion(data)), ["failed"])
            self.assertIn(why, decoder.failed or "", data)


class BothSurfacesTests(SynchronousTestCase):
    """Each decision of the decoder's docstring, as the Messages and Responses clients see it."""

    def test_a_call_without_a_name_is_left_out(self) -> None:
        message, response = surfaces(
            [chunk(call(0, arguments="{}")), chunk(call(1, id="b", name="g")), chunk({}, "stop")]
        )
        self.assertEqual(message_tools(message), [("g", {})])
        self.assertEqual(response_tools(response), [("g", "{}")])

    def test_a_fragment_for_an_ended_call_is_dropped(self) -> None:
        for between in (call(1, id="b", name="g", arguments="{}"), {"content": "text"}):
            message, response = surfaces(
                [
                    chunk(call(0, id="a", name="f", arguments='{"k":1}')),
                    chunk(between),
                    chunk(call(0, arguments="junk")),
                    chunk({}, "tool_calls"),
                ]
            )
            self.assertEqual(message_tools(message)[0], ("f", {"k": 1}))
            self.assertEqual(response_tools(response)[0], ("f", '{"k":1}'))

    def test_text_after_a_tool_call_follows_it(self) -> None:
        message, response = surfaces(
            [chunk(call(0, id="a", name="f")), chunk({"content": "done"}), chunk({}, "tool_calls")]
        )
        self.assertEqual([b["type"] for b in message["content"]], ["tool_use", "text"])
        self.assertEqual(message["stop_reason"], "tool_use")
        self.assertEqual([i["type"] for i in response["output"]], ["function_call", "message"])
        self.assertEqual(response["status"], "completed")

    def test_reasoning_under_either_name(self) -> None:
        for key in ("reasoning_content", "reasoning"):
            message, response = surfaces([chunk({key: "hm"}), chunk({"content": "x"})])
            self.assertEqual(message["content"][0]["thinking"], "hm")
            self.assertEqual(response["output"][0]["content"][0]["text"], "hm")

    def test_usage_only_in_the_final_chunk(self) -> None:
        final = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
        message, response = surfaces([chunk({"content": "x"}, "stop"), final])
        self.assertEqual(message["usage"], {"input_tokens": 9, "output_tokens": 4})
        self.assertEqual(
            (response["usage"]["input_tokens"], response["usage"]["output_tokens"]), (9, 4)
        )

    def test_a_refusal(self) -> None:
        events = decode([chunk({"refusal": "I can't."}), chunk({}, "stop")])
        self.assertEqual(
            [(e.text, e.reason) for e in events if e.kind == Kind.TEXT], [("I can't.", REFUSAL)]
        )
        message, response = surfaces([chunk({"refusal": "I can't."}), chunk({}, "stop")])
        self.assertEqual(message["stop_reason"], "refusal")
        self.assertEqual(response["output"][0]["content"][0]["text"], "I can't.")
        self.assertEqual(response["status"], "completed")

    def test_a_cut_answer_with_a_call_is_cut(self) -> None:
        message, response = surfaces(
            [chunk(call(0, id="a", name="f", arguments='{"k":')), chunk({}, "length")]
        )
        self.assertEqual(message["stop_reason"], "max_tokens")
        self.assertEqual(
            (response["status"], response["incomplete_details"]),
            ("incomplete", {"reason": "max_output_tokens"}),
        )
