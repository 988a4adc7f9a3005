# -*- test-case-name: iop.test.edge.ingress.test_limits -*-
"""
The per-key admission of a generation request, as the client pipeline's admit stage runs it
(:meth:`~iop.edge.ingress.pipeline.Pipeline.generate`): what a call may use at most, what it did
use, and how a refusal reads on each surface. The accounting itself is :mod:`iop.edge.quota`.

Worst case (:func:`demand_of`)
    The call's prompt tokens (the surface's estimate, :mod:`.tokens`) plus its output limit: the
    request's own (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``) under the
    model's policy (``default_max_tokens``, ``min_max_tokens``), else
    :data:`FALLBACK_OUTPUT_TOKENS` — a request and a model with no output limit at all cannot be
    bounded, so set ``default_max_tokens`` on models whose keys have token budgets. Its cost is
    that at the model's dearest prices (:func:`iop.usage.price.worst_case`; ``None`` without a
    price). The settle replaces this by what the provider reported.

Charge (:func:`charge_of`)
    Input plus output tokens as reported, and their exact cost at the model's price; ``None``
    when the provider reported no usage (the worst case then stays charged).

Refusals (:func:`refusal`, :func:`unavailable`)
    A limit or budget that says no is a ``429`` on both surfaces, with ``retry-after`` when a
    retry can succeed (``x-should-retry: false`` when it cannot soon: a spent budget, or a
    request that alone exceeds a limit). The official SDKs and Claude Code obey that header
    before ``retry-after`` — without it Claude Code retries a 429 for minutes, and the Anthropic
    SDK sleeps for any ``retry-after``, a budget's being the end of its period — so a spent
    budget fails at once; Codex takes ``insufficient_quota`` as final by itself. A spent budget
    is OpenAI's ``insufficient_quota`` (type and code) on the OpenAI surface and a
    ``rate_limit_error`` whose message says the budget is spent on the Anthropic one; rate
    limits are ``rate_limit_exceeded``, concurrency ``concurrency_limit_exceeded``. The refused
    limit is described in the surface's headers: OpenAI's
    ``x-ratelimit-limit-/remaining-/reset-{requests,tokens}`` and Anthropic's
    ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` (reset as RFC 3339).
    The accounting's counters unreachable (a cluster's Redis) is ``503 cluster_unavailable``:
    never unlimited.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from iop.config.model import ModelConfig
from iop.edge.ingress.errors import ANTHROPIC, OPENAI, ApiError
from iop.edge.ingress.policy import max_tokens_for
from iop.edge.quota import Charge, Demand, QuotaUnavailable, Refused
from iop.runtime.events import Usage
from iop.usage.price import cost_micros, worst_case

__all__ = ["FALLBACK_OUTPUT_TOKENS", "charge_of", "demand_of", "refusal", "unavailable"]

# The output a request reserves when neither it nor its model sets a limit (the Messages
# bridge's default max_tokens too).
FALLBACK_OUTPUT_TOKENS = 4096

# Refusal kind → (OpenAI header unit, Anthropic header unit); None: no standard header.
_HEADER_UNITS = {
    "requests_per_minute": ("requests", "requests"),
    "tokens_per_minute": ("tokens", "tokens"),
}
_CODES = {
    "budget": "insufficient_quota",
    "requests_per_minute": "rate_limit_exceeded",
    "tokens_per_minute": "rate_limit_exceeded",
    "concurrent_requests": "concurrency_limit_exceeded",
}


def demand_of(
    prompt_tokens: int, max_output_tokens: int | None, policy: ModelConfig | None
) -> Demand:
    """The most a call with ``prompt_tokens`` asking ``max_output_tokens`` may use (above)."""
    limit = max_tokens_for(max_output_tokens, policy)
    output = limit if limit is not None else FALLBACK_OUTPUT_TOKENS
    worst = worst_case(prompt_tokens, output, policy.price if policy is not None else None)
    return Demand(worst.tokens, worst.cost_micros)


def charge_of(usage: Usage | None, policy: ModelConfig | None) -> Charge | None:
    """What a finished call used (None: its provider reported nothing)."""
    if usage is None:
        return None
    price = policy.price if policy is not None else None
    return Charge(usage.input_tokens + usage.output_tokens, cost_micros(usage, price))


def _seconds(value: float) -> int:
    return max(1, math.ceil(value))


def refusal(refused: Refused, now: float) -> ApiError:
    """The 429 a client reads for ``refused`` at time ``now`` (module docstring)."""
    headers: list[tuple[str, str]] = []
    if refused.retry_after_sec is not None:
        headers.append(("retry-after", str(_seconds(refused.retry_after_sec))))
    if refused.budget or refused.retry_after_sec is None:
        headers.append(("x-should-retry", "false"))
    surface_headers: dict[str, list[tuple[str, str]]] = {OPENAI: [], ANTHROPIC: []}
    units = _HEADER_UNITS.get(refused.kind)
    if units is not None:
        openai_unit, anthropic_unit = units
        surface_headers[OPENAI] += [
            (f"x-ratelimit-limit-{openai_unit}", str(refused.limit)),
            (f"x-ratelimit-remaining-{openai_unit}", str(max(refused.remaining, 0))),
        ]
        surface_headers[ANTHROPIC] += [
            (f"anthropic-ratelimit-{anthropic_unit}-limit", str(refused.limit)),
            (f"anthropic-ratelimit-{anthropic_unit}-remaining", str(max(refused.remaining, 0))),
        ]
        if refused.reset_after_sec is not None:
            reset = refused.reset_after_sec
            surface_headers[OPENAI].append((f"x-ratelimit-reset-{openai_unit}", f"{reset:g}s"))
            at = datetime.fromtimestamp(now + reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            surface_headers[ANTHROPIC].append((f"anthropic-ratelimit-{anthropic_unit}-reset", at))
    return ApiError(
        429,
        refused.message,
        code=_CODES.get(refused.kind, "rate_limit_exceeded"),
        openai_type="insufficient_quota" if refused.budget else None,
        headers=headers,
        surface_headers={name: tuple(value) for name, value in surface_headers.items()},
    )


def unavailable(error: QuotaUnavailable) -> ApiError:
    """The accounting cannot be asked (a cluster's Redis): fail closed."""
    return ApiError(
        503, str(error) or "the cluster's limits cannot be checked", code="cluster_unavailable"
    )
