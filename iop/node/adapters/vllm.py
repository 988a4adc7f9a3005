# -*- test-case-name: iop.test.node.adapters.test_vllm -*-
"""
The ``vllm`` adapter: the ``openai_compat`` adapter plus vLLM's own usage dialect.

What vLLM's OpenAI-compatible server reports (``vllm/entrypoints/openai``):

- cached prompt tokens in ``usage.prompt_tokens_details.cached_tokens``, only when the server runs
  with ``--enable-prompt-tokens-details``; the field can be ``null``, which means "not reported".
- reasoning tokens, on recent versions with a ``--reasoning-parser``, in
  ``usage.completion_tokens_details.reasoning_tokens`` (the OpenAI location). Parsers that cannot
  count report ``0`` even when the answer had reasoning: a ``0`` next to streamed reasoning text
  is treated as "not reported", because usage is never estimated and a false 0 is worse than none.
  Some patched builds put ``reasoning_tokens`` at the top level of ``usage``; that is read too.
- reasoning text as ``delta.reasoning`` (newer) or ``delta.reasoning_content`` (older), and, with
  ``stream_options.continuous_usage_stats``, a running usage on every chunk: both are handled by
  the base adapter (the last usage wins).
- errors as ``{"error": {...}}`` or, on older versions, a top-level ``{"object": "error",
  "message": ...}``; a request with ``tools`` to a server started without
  ``--enable-auto-tool-choice`` is a 400 whose message names the tool choice, which triggers the
  base adapter's text-tool fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from iop.formats.usage import token_count
from iop.node.adapters.openai_compat import OpenAICompatProvider
from iop.runtime.events import Usage
from iop.runtime.interfaces import AdapterContext, IProvider
from iop.runtime.spec import AdapterSpec


def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
    """The ``vllm`` adapter factory."""
    return VLLMProvider(spec, ctx)


class VLLMProvider(OpenAICompatProvider):
    type = "vllm"

    def usage_from(self, raw: Mapping[str, Any], saw_reasoning: bool) -> Usage:
        usage = super().usage_from(raw, saw_reasoning)
        reasoning = usage.reasoning_tokens
        if reasoning is None:
            reasoning = token_count(raw.get("reasoning_tokens"))
        if reasoning == 0 and saw_reasoning:
            reasoning = None
        return replace(usage, reasoning_tokens=reasoning)
