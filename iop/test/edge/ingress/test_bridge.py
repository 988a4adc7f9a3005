"""
The Messages bridge's request: a ``/v1/messages`` body as a ``/chat/completions`` body
(:func:`~iop.edge.ingress.bridge.messages_to_chat`): system, content blocks, tools and their
round trip, images, thinking, sampling and streaming options, and what is refused. The answer's
way back is :mod:`iop.test.edge.ingress.test_messages_encode`; the README's field table,
:mod:`iop.test.edge.ingress.test_bridge_fields`.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.bridge import BridgeError, messages_to_chat, thinking_requested

# -- requests ----------------------------------------------------------------------------------


def request(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    body.update(fields)
    return body


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


class MessagesToChatTests(SynchronousTestCase):
    def convert(self, body: dict[str, Any], thinking: bool = False) -> dict[str, Any]:
        return messages_to_chat(body, target="served-7b", thinking_allowed=thinking)

    def test_minimal(self) -> None:
        self.assertEqual(
            self.convert(request()),
            {
                "model": "served-7b",
                "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 256,
            },
        )

    def test_systemString(self) -> None:
        chat = self.convert(request(system="Be brief."))
        self.assertEqual(chat["messages"][0], {"role": "system", "content": "Be brief."})
        self.assertEqual(chat["messages"][1]["role"], "user")

    def test_systemBlocks(self) -> None:
        system = [
            {"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Two."},
        ]
        chat = self.convert(request(system=system))
        self.assertEqual(chat["messages"][0], {"role": "system", "content": "One.\n\nTwo."})

    def test_emptySystemLeftOut(self) -> None:
        chat = self.convert(request(system=""))
        self.assertEqual([m["role"] for m in chat["messages"]], ["user"])

    def test_textBlocksJoined(self) -> None:
        content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        chat = self.convert(request(messages=[{"role": "user", "content": content}]))
        self.assertEqual(chat["messages"], [{"role": "user", "content": "a\n\nb"}])

    def test_images(self) -> None:
        content = [
            {"type": "text", "text": "What is this?"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        ]
        chat = self.convert(request(messages=[{"role": "user", "content": content}]))
        self.assertEqual(
            chat["messages"],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                        },
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://example.com/cat.jpg"},
                        },
                    ],
                }
            ],
        )

    def test_textDocument(self) -> None:
        content = [
            {
                "type": "document",
                "title": "Notes",
                "source": {"type": "text", "media_type": "text/plain", "data": "body"},
            }
        ]
        chat = self.convert(request(messages=[{"role": "user", "content": content}]))
        self.assertEqual(chat["messages"], [{"role": "user", "content": "Notes\n\nbody"}])

    def test_tools(self) -> None:
        chat = self.convert(request(tools=[WEATHER_TOOL]))
        self.assertEqual(
            chat["tools"],
            [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": WEATHER_TOOL["input_schema"],
                        "description": "Weather for a city",
                    },
                }
            ],
        )
        self.assertNotIn("tool_choice", chat)

    def test_toolChoiceVariants(self) -> None:
        cases: list[tuple[dict[str, Any], Any]] = [
            ({"type": "auto"}, "auto"),
            ({"type": "any"}, "required"),
            ({"type": "none"}, "none"),
            (
                {"type": "tool", "name": "get_weather"},
                {"type": "function", "function": {"name": "get_weather"}},
            ),
        ]
        for choice, expected in cases:
            chat = self.convert(request(tools=[WEATHER_TOOL], tool_choice=choice))
            self.assertEqual(chat["tool_choice"], expected, choice)
            self.assertNotIn("parallel_tool_calls", chat)

    def test_disableParallelToolUse(self) -> None:
        choice = {"type": "auto", "disable_parallel_tool_use": True}
        chat = self.convert(request(tools=[WEATHER_TOOL], tool_choice=choice))
        self.assertEqual(chat["tool_choice"], "auto")
        self.assertIs(chat["parallel_tool_calls"], False)

    def test_toolChoiceWithoutTools(self) -> None:
        self.assertNotIn("tool_choice", self.convert(request(tool_choice={"type": "auto"})))
        with self.assertRaises(BridgeError):
            self.convert(request(tool_choice={"type": "any"}))

    def test_toolRoundTrip(self) -> None:
        """tool_use → assistant tool_calls; tool_result → tool messages in order, then text."""
        messages = [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no data"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ]
        chat = self.convert(request(messages=messages, tools=[WEATHER_TOOL]))
        self.assertEqual(
            chat["messages"],
            [
                {"role": "user", "content": "Weather in Paris and Oslo?"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {
                            "id": "toolu_2",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
                {"role": "user", "content": "Thanks"},
            ],
        )

    def test_assistantToolUseOnly(self) -> None:
        messages = [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ]
        chat = self.convert(request(messages=messages))
        self.assertIsNone(chat["messages"][1]["content"])
        self.assertEqual(chat["messages"][1]["tool_calls"][0]["function"]["arguments"], "{}")
        self.assertEqual(chat["messages"][2], {"role": "tool", "tool_call_id": "t", "content": ""})
        self.assertEqual(len(chat["messages"]), 3)

    def test_toolResultImageMovesToUserMessage(self) -> None:
        image = {"type": "image", "source": {"type": "url", "url": "https://example.com/s.png"}}
        messages = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "shot"}, image],
                    }
                ],
            }
        ]
        chat = self.convert(request(messages=messages))
        self.assertEqual(
            chat["messages"][0], {"role": "tool", "tool_call_id": "t", "content": "shot\n[image]"}
        )
        self.assertEqual(
            chat["messages"][1],
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/s.png"}}
                ],
            },
        )

    def test_thinkingOnlyAssistantDropped(self) -> None:
        messages = [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xx"}]},
            {"role": "user", "content": "b"},
        ]
        chat = self.convert(request(messages=messages))
        self.assertEqual([m["role"] for m in chat["messages"]], ["user", "user"])

    def test_samplingAndStream(self) -> None:
        chat = self.convert(
            request(
                temperature=0.2,
                top_p=0.9,
                top_k=40,
                stop_sequences=["END"],
                stream=True,
                metadata={"user_id": "u"},
            )
        )
        self.assertEqual(chat["temperature"], 0.2)
        self.assertEqual(chat["top_p"], 0.9)
        self.assertEqual(chat["stop"], ["END"])
        self.assertIs(chat["stream"], True)
        self.assertEqual(chat["stream_options"], {"include_usage": True})
        self.assertNotIn("top_k", chat)
        self.assertNotIn("metadata", chat)

    def test_notStreaming(self) -> None:
        chat = self.convert(request(stream=False))
        self.assertNotIn("stream", chat)
        self.assertNotIn("stream_options", chat)

    def test_thinkingAllowed(self) -> None:
        for budget, effort in [(1024, "low"), (8000, "medium"), (32000, "high")]:
            body = request(max_tokens=64000, thinking={"type": "enabled", "budget_tokens": budget})
            self.assertEqual(self.convert(body, thinking=True)["reasoning_effort"], effort)

    def test_thinkingNotAllowed(self) -> None:
        body = request(thinking={"type": "enabled", "budget_tokens": 2048})
        error = self.assertRaises(BridgeError, self.convert, body, False)
        self.assertIn("extensions.thinking", error.message)
        self.assertIn("extensions.reasoning", error.message)
        self.assertEqual(error.error_type, "invalid_request_error")

    def test_thinkingDisabledOrAdaptive(self) -> None:
        for thinking in ({"type": "disabled"}, {"type": "adaptive"}):
            chat = self.convert(request(thinking=thinking), thinking=False)
            self.assertNotIn("reasoning_effort", chat)

    def test_thinkingRequested(self) -> None:
        self.assertTrue(thinking_requested(request(thinking={"type": "enabled"})))
        self.assertTrue(thinking_requested(request(thinking={"type": "adaptive"})))
        self.assertFalse(thinking_requested(request(thinking={"type": "disabled"})))
        self.assertFalse(thinking_requested(request()))

    def test_malformed(self) -> None:
        bad: list[Any] = [
            [],
            {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            request(model=""),
            request(max_tokens=None),
            request(max_tokens=0),
            request(max_tokens=True),
            request(messages=[]),
            request(messages="hi"),
            request(messages=[{"role": "moderator", "content": "x"}]),
            request(messages=[{"role": "user"}]),
            request(messages=[{"role": "user", "content": 5}]),
            request(messages=[{"role": "user", "content": [{"type": "video"}]}]),
            request(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            request(messages=[{"role": "user", "content": ["text"]}]),
            request(messages=[{"role": "assistant", "content": [{"type": "image"}]}]),
            request(
                messages=[
                    {"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]},
                ]
            ),
            request(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "file", "file_id": "file_1"},
                            }
                        ],
                    }
                ]
            ),
            request(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {
                                    "type": "base64",
                                    "media_type": "application/pdf",
                                    "data": "JVBER",
                                },
                            }
                        ],
                    }
                ]
            ),
            request(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
            request(system=5),
            request(system=[{"type": "image"}]),
            request(tools={"name": "x"}),
            request(tools=[{"name": "x"}]),
            request(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
            request(tools=[WEATHER_TOOL], tool_choice={"type": "sometimes"}),
            request(tools=[WEATHER_TOOL], tool_choice={"type": "tool"}),
            request(temperature="hot"),
            request(stop_sequences="END"),
            request(stream="yes"),
            request(thinking={"type": "enabled"}),
            request(thinking={"type": "sideways"}),
        ]
        for body in bad:
            error = self.assertRaises(BridgeError, self.convert, body, True)
            self.assertTrue(error.message, body)
            self.assertEqual(error.error_type, "invalid_request_error")
