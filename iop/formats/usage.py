# -*- test-case-name: iop.test.formats.test_usage -*-
"""
Token usage as providers report it, read into :class:`~iop.runtime.events.Usage`.

One rule for every count (:func:`token_count`): a non-negative integer, or a float with an
integral value (some servers serialise counts as ``12.0``); anything else (absent, negative,
fractional, a boolean, a string) is "not reported". A count that is not reported is 0 for
``input_tokens``/``output_tokens`` and None for the optional details, which are never estimated.

``input_tokens`` is always the whole prompt, ``cached_input_tokens`` the part read from a cache
and ``cache_write_tokens`` the part written to one (OpenAI's way of counting; OpenAI reports no
cache writes): Anthropic's ``input_tokens`` leaves cache reads and writes out, so
:func:`anthropic_usage` adds them in. ``output_tokens`` always includes ``reasoning_tokens``
(OpenAI's ``completion_tokens`` does; Anthropic counts thinking in ``output_tokens`` and reports
no split). A price (:mod:`iop.usage.price`) relies on both rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iop.runtime.events import Usage

__all__ = [
    "anthropic_usage",
    "openai_chat_usage",
    "openai_responses_usage",
    "token_count",
    "token_detail",
]


def token_count(value: Any) -> int | None:
    """A reported token count, or None when absent or not a non-negative integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    return None


def token_detail(raw: Mapping[str, Any], section: str, name: str) -> int | None:
    """``raw[section][name]`` as a token count (``prompt_tokens_details.cached_tokens``…)."""
    details = raw.get(section)
    return token_count(details.get(name)) if isinstance(details, Mapping) else None


def openai_chat_usage(raw: Mapping[str, Any]) -> Usage:
    """
    Chat Completions ``usage``: ``prompt_tokens``/``completion_tokens``, and reasoning and cached
    tokens only where reported (``completion_tokens_details.reasoning_tokens``,
    ``prompt_tokens_details.cached_tokens``).
    """
    return Usage(
        input_tokens=token_count(raw.get("prompt_tokens")) or 0,
        output_tokens=token_count(raw.get("completion_tokens")) or 0,
        reasoning_tokens=token_detail(raw, "completion_tokens_details", "reasoning_tokens"),
        cached_input_tokens=token_detail(raw, "prompt_tokens_details", "cached_tokens"),
    )


def openai_responses_usage(raw: Mapping[str, Any]) -> Usage:
    """Responses API ``response.usage``: input/output tokens and the reported details."""
    return Usage(
        input_tokens=token_count(raw.get("input_tokens")) or 0,
        output_tokens=token_count(raw.get("output_tokens")) or 0,
        reasoning_tokens=token_detail(raw, "output_tokens_details", "reasoning_tokens"),
        cached_input_tokens=token_detail(raw, "input_tokens_details", "cached_tokens"),
    )


def anthropic_usage(raw: Mapping[str, Any]) -> Usage:
    """
    Anthropic Messages ``usage`` (also Claude Code's ``result.usage``). Anthropic's
    ``input_tokens`` leaves out cache reads and writes; ``input_tokens`` here is the whole prompt
    (as OpenAI's ``prompt_tokens`` is), ``cached_input_tokens`` the cache reads and
    ``cache_write_tokens`` the cache writes (``cache_creation_input_tokens``), when reported.
    """
    cache_read = token_count(raw.get("cache_read_input_tokens"))
    cache_write = token_count(raw.get("cache_creation_input_tokens"))
    prompt = (token_count(raw.get("input_tokens")) or 0) + (cache_read or 0) + (cache_write or 0)
    return Usage(
        input_tokens=prompt,
        output_tokens=token_count(raw.get("output_tokens")) or 0,
        cached_input_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
