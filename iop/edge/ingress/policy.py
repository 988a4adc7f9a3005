# -*- test-case-name: iop.test.edge.ingress.test_policy -*-
"""
The generation policy a model's configuration puts on every request.

``models[].default_max_tokens`` fills a request that sets no output limit; ``min_max_tokens``
raises any smaller limit to itself (a floor, not a rejection) (:func:`max_tokens_for`);
``default_thinking_token_budget`` is the thinking budget of a normalized run whose request does
not turn thinking off (:func:`thinking_budget_for`).
"""

from __future__ import annotations

from iop.config.model import ModelConfig

__all__ = ["max_tokens_for", "thinking_budget_for"]


def max_tokens_for(requested: int | None, policy: ModelConfig | None) -> int | None:
    """
    The output limit to use: ``requested``, or the model's ``default_max_tokens`` when the request
    set none; raised to ``min_max_tokens`` when below it. None: no limit anywhere.
    """
    value = requested
    if value is None and policy is not None:
        value = policy.default_max_tokens
    if value is not None and policy is not None and policy.min_max_tokens:
        value = max(value, policy.min_max_tokens)
    return value


def thinking_budget_for(policy: ModelConfig | None) -> int:
    """The model's default thinking budget for a normalized run (0: none)."""
    if policy is None or not policy.default_thinking_token_budget:
        return 0
    return policy.default_thinking_token_budget
