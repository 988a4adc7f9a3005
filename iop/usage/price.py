# -*- test-case-name: iop.test.usage.test_price -*-
"""
What a request cost: a model's :class:`~iop.config.model.Price` applied to the
:class:`~iop.runtime.events.Usage` its provider reported, in integer micro-units of
``usage.currency`` (1 USD = 1_000_000), exactly.

How the tokens are split (the convention of :mod:`iop.formats.usage`, OpenAI's way of
counting, which every provider's report is read into):

- ``input_tokens`` is the whole prompt. Of it, ``cached_input_tokens`` were read from a prompt
  cache (priced ``cached_input``) and ``cache_write_tokens`` written to one (priced
  ``cache_write``); the rest, ``input - cached - cache_write``, is priced ``input``. Pricing
  the whole prompt at ``input`` is the error that makes cost reports of cache-heavy agents
  (Claude Code reads most of its prompt from cache) wrong by several times.
- ``output_tokens`` is the whole answer. Of it, ``reasoning_tokens`` are priced ``reasoning``
  (which defaults to ``output``), the rest ``output``. OpenAI's ``completion_tokens`` and
  Codex's ``output_tokens`` include their reasoning tokens; Anthropic counts thinking in
  ``output_tokens`` and reports no split, so there all output is priced ``output`` (which is
  what Anthropic bills).
- A detail that was not reported is zero: nothing is estimated. A report whose parts exceed
  its whole (cached + written > prompt, reasoning > output) is priced part by part as
  reported, the remainder never below zero.

Arithmetic: a price is held per million tokens in micro-units, so ``tokens * price`` is the
cost in millionths of a micro-unit; the kinds are summed exactly and rounded half up once, at
the end. No price (``None``) or no usage: the cost is unknown, ``None``, never invented.

:func:`worst_case` is what an admission reserves before the answer is known: the prompt at the
dearest input price and every possible output token at the dearer output price, rounded up, so
that the reported cost can never exceed what was reserved.
"""

from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple

from iop.config.model import MICROS_PER_UNIT, Price
from iop.runtime.events import Usage

__all__ = ["WorstCase", "cost_micros", "format_micros", "worst_case"]

#: A price is per million tokens.
_TOKENS_PER_PRICE = 1_000_000


class WorstCase(NamedTuple):
    """The most one request may use: ``tokens`` (prompt + max output) and what they may cost
    (None without a price)."""

    tokens: int
    cost_micros: int | None


def cost_micros(usage: Usage | None, price: Price | None) -> int | None:
    """The exact cost of ``usage`` at ``price`` in micro-units; None when either is unknown."""
    if usage is None or price is None:
        return None
    cached = usage.cached_input_tokens or 0
    written = usage.cache_write_tokens or 0
    uncached = max(usage.input_tokens - cached - written, 0)
    reasoning = usage.reasoning_tokens or 0
    answer = max(usage.output_tokens - reasoning, 0)
    scaled = (
        uncached * price.input
        + cached * price.cached_input
        + written * price.cache_write
        + answer * price.output
        + reasoning * price.reasoning
    )
    # Round half up, once.
    return (scaled + _TOKENS_PER_PRICE // 2) // _TOKENS_PER_PRICE


def worst_case(prompt_tokens: int, max_output_tokens: int, price: Price | None) -> WorstCase:
    """
    The reservation of a request with ``prompt_tokens`` (counted) that may answer up to
    ``max_output_tokens``: every prompt token at the dearest of the input prices (it may all be
    written to a cache) and every output token at the dearer of output and reasoning, rounded
    up. :func:`cost_micros` of any usage within those counts is never more.
    """
    prompt = max(prompt_tokens, 0)
    output = max(max_output_tokens, 0)
    if price is None:
        return WorstCase(prompt + output, None)
    scaled = prompt * max(price.input, price.cached_input, price.cache_write) + output * max(
        price.output, price.reasoning
    )
    return WorstCase(prompt + output, -(-scaled // _TOKENS_PER_PRICE))


def format_micros(micros: int) -> str:
    """Micro-units as a decimal amount of the currency, exactly (``1234567`` → ``1.234567``)."""
    return str(Decimal(micros).scaleb(-6).quantize(Decimal(1) / MICROS_PER_UNIT))
