"""
The local token estimate: deterministic, monotone in content, and counting every part of a
request (system, messages, tool calls and results, tool definitions, images).
"""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    TOOL_OVERHEAD,
    count_tokens,
    estimate_prompt_tokens_messages,
    estimate_prompt_tokens_openai,
    text_tokens,
)

TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def messages_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hello, world"}],
    }
    body.update(fields)
    return body


class TextTokensTests(SynchronousTestCase):
    def test_ascii(self) -> None:
        self.assertEqual(text_tokens(""), 0)
        self.assertEqual(text_tokens("a"), 1)
        self.assertEqual(text_tokens("abcd"), 1)
        self.assertEqual(text_tokens("abcde"), 2)
        self.assertEqual(text_tokens("x" * 400), 100)

    def test_nonAscii(self) -> None:
        self.assertEqual(text_tokens("안녕하세요"), 5)
        self.assertEqual(text_tokens("hi 世界"), 1 + 2)


class MessagesEstimateTests(SynchronousTestCase):
    def test_exact(self) -> None:
        """The documented rule, worked by hand."""
        body = messages_body(system="Be brief.")
        # "Be brief." 9 chars → 3; "Hello, world" 12 chars → 3.
        self.assertEqual(count_tokens(body), REQUEST_OVERHEAD + 3 + MESSAGE_OVERHEAD + 3)

    def test_deterministic(self) -> None:
        body = messages_body(tools=[TOOL], system=[{"type": "text", "text": "x" * 100}])
        self.assertEqual(count_tokens(body), count_tokens(copy.deepcopy(body)))
        self.assertEqual(count_tokens(body), estimate_prompt_tokens_messages(body))

    def test_everyPartCounts(self) -> None:
        base = count_tokens(messages_body())
        self.assertGreater(count_tokens(messages_body(system="some system prompt")), base)
        self.assertEqual(
            count_tokens(messages_body(tools=[TOOL])) - base,
            TOOL_OVERHEAD
            + text_tokens("get_weather")
            + text_tokens("Weather for a city")
            + text_tokens('{"properties":{"city":{"type":"string"}},"type":"object"}'),
        )
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}
        with_image = messages_body(
            messages=[
                {"role": "user", "content": [image, {"type": "text", "text": "Hello, world"}]}
            ]
        )
        self.assertEqual(count_tokens(with_image) - base, IMAGE_TOKENS)

    def test_toolUseAndResult(self) -> None:
        small = messages_body(
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
                },
            ]
        )
        big = copy.deepcopy(small)
        big["messages"][1]["content"][0]["input"] = {"a": "x" * 400}
        self.assertGreaterEqual(count_tokens(big) - count_tokens(small), 99)
        bigger = copy.deepcopy(small)
        bigger["messages"][2]["content"][0]["content"] = [{"type": "text", "text": "y" * 400}]
        self.assertGreaterEqual(count_tokens(bigger) - count_tokens(small), 99)

    def test_thinkingAndDocuments(self) -> None:
        body = messages_body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "text",
                                "media_type": "text/plain",
                                "data": "z" * 40,
                            },
                        }
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "w" * 40, "signature": "s"}],
                },
            ]
        )
        self.assertEqual(count_tokens(body), REQUEST_OVERHEAD + 2 * MESSAGE_OVERHEAD + 10 + 10)

    def test_lenient(self) -> None:
        bodies: list[dict[str, Any]] = [
            {},
            {"messages": "x"},
            {"messages": [5, {"role": "user"}, {"content": [7, {"type": "weird", "v": 1}]}]},
            {"tools": [5, {"type": "web_search_20250305", "name": "web_search"}]},
            {"system": 5},
        ]
        for body in bodies:
            self.assertGreaterEqual(count_tokens(body), REQUEST_OVERHEAD, body)

    def test_longerIsMore(self) -> None:
        short = count_tokens(messages_body(messages=[{"role": "user", "content": "x" * 100}]))
        long = count_tokens(messages_body(messages=[{"role": "user", "content": "x" * 10000}]))
        self.assertEqual(long - short, 2500 - 25)


class OpenAIEstimateTests(SynchronousTestCase):
    def test_chat(self) -> None:
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello, world"},
            ],
        }
        self.assertEqual(
            estimate_prompt_tokens_openai(body), REQUEST_OVERHEAD + 2 * MESSAGE_OVERHEAD + 3 + 3
        )

    def test_chatPartsToolsAndCalls(self) -> None:
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "abcd"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "result"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
                }
            ],
        }
        estimate = estimate_prompt_tokens_openai(body)
        self.assertEqual(estimate, estimate_prompt_tokens_openai(copy.deepcopy(body)))
        self.assertGreater(estimate, IMAGE_TOKENS + 3 * MESSAGE_OVERHEAD + TOOL_OVERHEAD)

    def test_responses(self) -> None:
        as_string = estimate_prompt_tokens_openai({"instructions": "abcd", "input": "abcdefgh"})
        self.assertEqual(as_string, REQUEST_OVERHEAD + 1 + MESSAGE_OVERHEAD + 2)
        items = estimate_prompt_tokens_openai(
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "abcdefgh"}]},
                    {"type": "function_call", "name": "f", "arguments": '{"a":1}'},
                    {"type": "function_call_output", "call_id": "c", "output": "done"},
                ],
                "tools": [{"type": "function", "name": "f", "parameters": {}}],
            }
        )
        self.assertGreater(items, REQUEST_OVERHEAD + 3 * MESSAGE_OVERHEAD + TOOL_OVERHEAD)

    def test_sameTextSameEstimateAcrossSurfaces(self) -> None:
        text = "The quick brown fox " * 50
        anthropic = count_tokens({"messages": [{"role": "user", "content": text}]})
        openai = estimate_prompt_tokens_openai({"messages": [{"role": "user", "content": text}]})
        self.assertEqual(anthropic, openai)
