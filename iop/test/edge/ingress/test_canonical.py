# -*- test-case-name: iop.test.edge.ingress.test_canonical -*-
"""The canonical answer stream: a run's events read once (hold-back, tool calls, the finish), and
each surface's encoder fed from it."""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.canonical import Event, Kind, RunDecoder, finish_reason, tool_call
from iop.edge.ingress.messages_encode import MessagesEncoder
from iop.edge.ingress.openai import ChatEncoder
from iop.edge.ingress.responses import ResponsesEncoder
from iop.runtime.events import RuntimeEvent, Usage

CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
FALLBACK = {"openai_text_tool_fallback": "true"}


def kinds(events: list[Event]) -> list[str]:
    return [e.kind.value for e in events]


def text(events: list[Event]) -> str:
    return "".join(e.text for e in events if e.kind == Kind.TEXT)


class RunDecoderTests(SynchronousTestCase):
    def test_a_plain_answer(self) -> None:
        decoder = RunDecoder(hold_back=False)
        events = decoder.feed(RuntimeEvent.start())
        events += decoder.feed(RuntimeEvent.text("hel"))
        events += decoder.feed(RuntimeEvent.reasoning("hmm"))
        events += decoder.feed(RuntimeEvent.text("lo"))
        events += decoder.feed(RuntimeEvent.complete(Usage(3, 4), {"finish_reason": "length"}))
        # One START however many events could start the answer (every encoder's is idempotent).
        self.assertEqual(kinds(events), ["start", "text", "reasoning", "text", "finish"])
        self.assertEqual(text(events), "hello")
        self.assertEqual((events[-1].reason, events[-1].usage), ("length", Usage(3, 4)))
        self.assertTrue(decoder.done)
        self.assertEqual(decoder.feed(RuntimeEvent.text("late")), [])

    def test_held_back_text_tool_call_never_reaches_the_text(self) -> None:
        decoder = RunDecoder(hold_back=True)
        events = decoder.feed(RuntimeEvent.text("Sure. "))
        for piece in (CALL[:5], CALL[5:20], CALL[20:]):
            events += decoder.feed(RuntimeEvent.text(piece))
        self.assertEqual(text(events), "Sure. ")
        events += decoder.feed(RuntimeEvent.complete(metadata=FALLBACK))
        self.assertEqual(text(events), "Sure. ")
        [call] = [e.call for e in events if e.kind == Kind.TOOL_CALL]
        self.assertEqual(call["function"]["name"], "get_weather")

    def test_held_text_that_is_no_call_is_released_at_the_end(self) -> None:
        decoder = RunDecoder(hold_back=True)
        events = decoder.feed(RuntimeEvent.text('a {"tool'))
        self.assertEqual(text(events), "a ")
        events += decoder.feed(RuntimeEvent.complete())
        self.assertEqual(text(events), 'a {"tool')

    def test_held_text_goes_out_before_reasoning_when_the_order_matters(self) -> None:
        for release, expected in ((True, ["text", "reasoning"]), (False, ["reasoning"])):
            decoder = RunDecoder(hold_back=True, release_on_reasoning=release)
            decoder.feed(RuntimeEvent.text("{"))
            self.assertEqual(kinds(decoder.feed(RuntimeEvent.reasoning("r"))), expected)

    def test_an_answer_not_held_back_is_revised_when_it_was_a_call(self) -> None:
        decoder = RunDecoder(hold_back=False)
        events = decoder.feed(RuntimeEvent.text("ok " + CALL))
        events += decoder.feed(RuntimeEvent.complete(metadata=FALLBACK))
        [revised] = [e for e in events if e.kind == Kind.REVISED]
        self.assertEqual(revised.text, "ok")
        self.assertEqual(kinds(events)[-2:], ["tool_call", "finish"])

    def test_native_tool_calls_and_failures(self) -> None:
        decoder = RunDecoder(hold_back=False)
        calls = json.dumps([{"id": "c1", "function": {"name": "f", "arguments": "{}"}}])
        events = decoder.feed(RuntimeEvent.complete(metadata={"openai_tool_calls": calls}))
        self.assertEqual(kinds(events), ["start", "tool_call", "finish"])
        failed = RunDecoder(hold_back=True)
        [event] = failed.feed(RuntimeEvent.failed("boom"))
        self.assertEqual((event.kind, event.terminal), (Kind.FAILED, RuntimeEvent.failed("boom")))

    def test_finish_reason_and_tool_call_shape(self) -> None:
        self.assertEqual(finish_reason("length", tool_calls=False), "length")
        self.assertEqual(finish_reason("length", tool_calls=True), "tool_calls")
        self.assertEqual(finish_reason("weird", tool_calls=False), "stop")
        self.assertIsNone(tool_call({"function": {"arguments": "{}"}}))
        call = tool_call({"name": "f", "arguments": {"a": 1}})
        assert call is not None
        self.assertEqual(call["function"], {"name": "f", "arguments": '{"a": 1}'})
        self.assertTrue(call["id"].startswith("call_"))


class EncoderTests(SynchronousTestCase):
    """One canonical stream, three surfaces: the same answer in each shape."""

    def events(self) -> list[Event]:
        decoder = RunDecoder(hold_back=True)
        out: list[Event] = []
        for event in (
            RuntimeEvent.start(),
            RuntimeEvent.text("Hi. "),
            RuntimeEvent.text(CALL),
            RuntimeEvent.complete(Usage(5, 6), FALLBACK),
        ):
            out += decoder.feed(event)
        return out

    def test_chat(self) -> None:
        encoder = ChatEncoder(model="m", created=1)
        encoder.encode(self.events())
        completion = encoder.completion()
        choice = completion["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        self.assertEqual(choice["message"]["content"], "Hi. ")
        self.assertEqual(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather")
        self.assertEqual(completion["usage"]["total_tokens"], 11)

    def test_messages(self) -> None:
        encoder = MessagesEncoder(model="m", thinking_allowed=False)
        names = [name for name, _ in encoder.encode(self.events())]
        self.assertEqual(names[0], "message_start")
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        message = encoder.message()
        self.assertEqual(message["stop_reason"], "tool_use")
        self.assertEqual(
            [b["type"] for b in message["content"]], ["text", "tool_use"], message["content"]
        )
        self.assertEqual(message["content"][1]["input"], {"city": "Paris"})

    def test_responses(self) -> None:
        encoder = ResponsesEncoder(model="m", request={}, created=1)
        kinds = [e["type"] for e in encoder.encode(self.events())]
        self.assertEqual(kinds[0], "response.created")
        self.assertEqual(kinds[-1], "response.completed")
        response = encoder.response()
        self.assertEqual([i["type"] for i in response["output"]], ["message", "function_call"])
        self.assertEqual(response["usage"]["total_tokens"], 11)
