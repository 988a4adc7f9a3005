"""One token-count rule and the three usage shapes (OpenAI Chat, OpenAI Responses, Anthropic)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.formats.usage import (
    anthropic_usage,
    openai_chat_usage,
    openai_responses_usage,
    token_count,
    token_detail,
)
from iop.runtime.events import Usage


class TokenCountTests(SynchronousTestCase):
    def test_counts(self) -> None:
        for value, expected in [(0, 0), (7, 7), (12.0, 12)]:
            self.assertEqual(token_count(value), expected)

    def test_notCounts(self) -> None:
        for value in (None, -1, -2.0, 1.5, True, False, "3", [3], {"n": 3}, float("inf")):
            self.assertIsNone(token_count(value), repr(value))

    def test_detail(self) -> None:
        raw = {"prompt_tokens_details": {"cached_tokens": 4}, "other": 3}
        self.assertEqual(token_detail(raw, "prompt_tokens_details", "cached_tokens"), 4)
        self.assertIsNone(token_detail(raw, "prompt_tokens_details", "audio_tokens"))
        self.assertIsNone(token_detail(raw, "other", "cached_tokens"))
        self.assertIsNone(token_detail(raw, "missing", "cached_tokens"))


class UsageTests(SynchronousTestCase):
    def test_chat(self) -> None:
        raw = {
            "prompt_tokens": 10,
            "completion_tokens": 5.0,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "prompt_tokens_details": {"cached_tokens": 3},
        }
        self.assertEqual(openai_chat_usage(raw), Usage(10, 5, 2, 3))
        self.assertEqual(openai_chat_usage({"prompt_tokens": -1}), Usage(0, 0, None, None))

    def test_responses(self) -> None:
        raw = {
            "input_tokens": 8,
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 1},
            "input_tokens_details": {"cached_tokens": 2},
        }
        self.assertEqual(openai_responses_usage(raw), Usage(8, 4, 1, 2))

    def test_anthropicCountsTheCacheAsInput(self) -> None:
        raw = {
            "input_tokens": 12,
            "output_tokens": 310,
            "cache_creation_input_tokens": 2087,
            "cache_read_input_tokens": 14016,
        }
        self.assertEqual(
            anthropic_usage(raw),
            Usage(12 + 2087 + 14016, 310, cached_input_tokens=14016, cache_write_tokens=2087),
        )
        self.assertEqual(anthropic_usage({"input_tokens": 3}), Usage(3, 0))
