"""
The Responses API over a native Anthropic Messages provider: the Responses request bridged to
Chat, translated to Messages and sent on the tunnel's ``messages`` operation; the answer
(stream events or one message) decoded into canonical events and encoded as Responses events /
one ``response`` — through the ingress, with the lease released once. Every event and response
is validated against the ``openai`` SDK's types.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import Response
from pydantic import TypeAdapter

from iop.edge.ingress.chat_messages import DEFAULT_MAX_TOKENS
from iop.runtime.events import Usage
from iop.test.edge.ingress.harness import END, IngressCase, body, error, start, usage
from iop.test.edge.ingress.test_chat_messages import TOOL_EVENTS, named, text_events
from iop.test.edge.ingress.test_responses import WEATHER, events_of, types_of

NATIVE = {"model": "native", "input": "hi"}
RESPONSE: TypeAdapter[Any] = TypeAdapter(Response)


def message(content: list[dict[str, Any]], stop: str = "end_turn") -> bytes:
    return json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": content,
            "stop_reason": stop,
            "usage": {"input_tokens": 3, "output_tokens": 9},
        }
    ).encode()


class ResponsesOverMessagesTests(IngressCase):
    """``POST /v1/responses`` for the ``native`` model (an ``anthropic_messages`` profile)."""

    def sent(self, request: dict[str, Any]) -> tuple[Any, Any]:
        d = self.edge.post("/v1/responses", request)
        self.edge.flush()
        return d, self.edge.tunnel_request()

    def stream(self, events: list[dict[str, Any]], **request: Any) -> list[Any]:
        d, sent = self.sent({**NATIVE, "stream": True, **request})
        self.assertTrue(sent.stream)
        raw = named(events)
        self.edge.frames(sent.run_id, start(200, "text/event-stream"))
        for i in range(0, len(raw), 37):
            self.edge.frames(sent.run_id, body(raw[i : i + 37]))
        self.edge.frames(sent.run_id, END)
        code, headers, data = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])
        self.assertEqual(self.edge.in_flight("p-native"), 0)
        return events_of(data)

    def whole(self, data: bytes, **request: Any) -> dict[str, Any]:
        d, sent = self.sent({**NATIVE, **request})
        self.edge.frames(sent.run_id, start(), body(data), usage(3, 9), END)
        code, response = self.json_answer(d)
        self.assertEqual(code, 200)
        RESPONSE.validate_python(response)
        self.assertEqual(self.edge.in_flight("p-native"), 0)
        return response  # type: ignore[no-any-return]

    def test_request_composition(self) -> None:
        request = {
            "model": "native",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "weather?"},
                {
                    "type": "function_call",
                    "call_id": "toolu_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Seoul"}',
                },
                {"type": "function_call_output", "call_id": "toolu_1", "output": "sunny"},
            ],
            "tools": [WEATHER],
            "tool_choice": "required",
            "max_output_tokens": 50,
            "temperature": 0.5,
        }
        _, sent = self.sent(request)
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
                "system": "be brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "get_weather",
                                "input": {"city": "Seoul"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
                        ],
                    },
                ],
                "temperature": 0.5,
                "tools": [
                    {
                        "name": "get_weather",
                        "description": "Weather",
                        "input_schema": WEATHER["parameters"],
                    }
                ],
                "tool_choice": {"type": "any"},
            },
        )

    def test_default_limit(self) -> None:
        _, sent = self.sent(NATIVE)
        self.assertEqual(json.loads(sent.body)["max_tokens"], DEFAULT_MAX_TOKENS)

    def test_stream_flag(self) -> None:
        _, sent = self.sent({**NATIVE, "stream": True})
        payload = json.loads(sent.body)
        self.assertEqual(payload["stream"], True)
        self.assertNotIn("stream_options", payload)

    def test_text_stream_with_usage(self) -> None:
        events = self.stream(text_events("he", "llo"))
        self.assertEqual(
            types_of(events),
            [
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
            ],
        )
        final = events[-1].response
        self.assertEqual(final.model, "native")
        self.assertEqual(final.status, "completed")
        self.assertEqual(final.output_text, "hello")
        assert final.usage is not None
        self.assertEqual(
            (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens),
            (5, 7, 12),
        )

    def test_tool_call_streams_its_arguments(self) -> None:
        events = self.stream(TOOL_EVENTS, tools=[WEATHER])
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        self.assertEqual(deltas, ['{"ci', 'ty": "Seoul"}'])
        final = events[-1].response
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual([item.type for item in final.output], ["message", "function_call"])
        call = final.output[1]
        self.assertEqual((call.call_id, call.name), ("toolu_1", "get_weather"))
        self.assertEqual(json.loads(call.arguments), {"city": "Seoul"})
        self.assertEqual(final.output[0].content[0].text, "Let")

    def test_tool_call_whole(self) -> None:
        data = message(
            [
                {"type": "text", "text": "Let me look"},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
            stop="tool_use",
        )
        response = self.whole(data, tools=[WEATHER])
        self.assertEqual(response["status"], "completed")
        text, call = response["output"]
        self.assertEqual(text["content"][0]["text"], "Let me look")
        self.assertEqual(
            (call["type"], call["call_id"], call["name"]),
            ("function_call", "toolu_2", "get_weather"),
        )
        self.assertEqual(json.loads(call["arguments"]), {"city": "Paris"})
        self.assertEqual(response["usage"]["total_tokens"], 12)
        [(_, reported, outcome)] = self.edge.finished
        self.assertEqual((reported, outcome), (Usage(3, 9), "complete"))

    def test_stop_reasons(self) -> None:
        cases = {
            "end_turn": ("completed", None),
            "stop_sequence": ("completed", None),
            "max_tokens": ("incomplete", {"reason": "max_output_tokens"}),
            "refusal": ("incomplete", {"reason": "content_filter"}),
        }
        for stop, (status, details) in cases.items():
            response = self.whole(message([{"type": "text", "text": "x"}], stop=stop))
            self.assertEqual(
                (response["status"], response["incomplete_details"]), (status, details)
            )
            final = self.stream(text_events("x", stop=stop))[-1]
            self.assertEqual(final.type, f"response.{status}")
            found = final.response.incomplete_details
            self.assertEqual(found.model_dump() if found else None, details)

    def test_upstream_error_keeps_its_status_in_the_openai_shape(self) -> None:
        for stream in (False, True):
            d, sent = self.sent({**NATIVE, "stream": stream})
            answer = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
            self.edge.frames(sent.run_id, start(429), body(json.dumps(answer).encode()), END)
            found = self.assertOpenAIError(d, 429, "slow")
            self.assertEqual(found["code"], "upstream_error")
            self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_a_stream_cut_mid_way_ends_with_response_failed(self) -> None:
        d, sent = self.sent({**NATIVE, "stream": True})
        raw = named(text_events("he", "llo")[:4])
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(raw))
        self.edge.frames(sent.run_id, error("upstream reset"))
        code, _, data = self.answer(d)
        self.assertEqual(code, 200)
        events = events_of(data)
        self.assertEqual(events[-1].type, "response.failed")
        self.assertEqual(types_of(events).count("response.failed"), 1)
        assert events[-1].response.error is not None
        self.assertIn("upstream reset", events[-1].response.error.message)
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_an_error_event_in_the_stream_fails_the_response(self) -> None:
        broken = [*text_events("he")[:3], {"type": "error", "error": {"message": "overloaded"}}]
        events = self.stream(broken)
        self.assertEqual(events[-1].type, "response.failed")
        assert events[-1].response.error is not None
        self.assertIn("overloaded", events[-1].response.error.message)

    def test_a_garbage_body_is_a_502(self) -> None:
        d, sent = self.sent(NATIVE)
        self.edge.frames(sent.run_id, start(), body(b"not json"), END)
        self.assertOpenAIError(d, 502, "could not be converted")
        self.assertEqual(self.edge.in_flight("p-native"), 0)

    def test_unconvertible_request_is_400_before_any_tunnel(self) -> None:
        bad = {
            **NATIVE,
            "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
        }
        self.assertOpenAIError(self.edge.post("/v1/responses", bad), 400, "arguments")
        self.assertEqual(self.edge.requests("tunnel"), [])
        self.assertEqual(self.edge.in_flight("p-native"), 0)
