# -*- test-case-name: iop.test.edge.quota.test_memory -*-
"""
What crosses the accounting's seam: the request's worst case (:class:`Demand`), what it
actually used (:class:`Charge`), the limits of one subject (:class:`SubjectLimits`), the two
ways a reservation is refused (:class:`Refused`: a limit or budget says no;
:class:`QuotaUnavailable`: the cluster's counters cannot be reached) and a subject's counters
(:class:`Snapshot`).

Subjects are ``key:<name>`` and ``team:<name>``; tokens are input + output; costs are integer
micro-units of the usage currency (:data:`~iop.config.model.MICROS_PER_UNIT`), so the Redis
counters add them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from iop.config.model import MICROS_PER_UNIT, Budget, Limits

__all__ = [
    "KINDS",
    "WINDOW_SEC",
    "BudgetUse",
    "Charge",
    "Demand",
    "QuotaUnavailable",
    "Refused",
    "Snapshot",
    "SubjectLimits",
    "describe_subject",
    "format_cost",
]

# The sliding window of requests_per_minute and tokens_per_minute.
WINDOW_SEC = 60.0
# What a refusal names, in the order they are checked (see iop.edge.quota).
KINDS = ("budget", "requests_per_minute", "tokens_per_minute", "concurrent_requests")
# How long a client refused for concurrency is told to wait: a slot comes back whenever a
# request ends, which nobody can predict.
CONCURRENCY_RETRY_SEC = 1.0


@dataclass(frozen=True)
class Demand:
    """
    The worst case of one request, reserved before it is placed: ``tokens`` (its counted prompt
    plus its max output tokens) and ``cost_micros`` (that at the model's price; ``None`` when the
    model has no price).
    """

    tokens: int
    cost_micros: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0 or (self.cost_micros is not None and self.cost_micros < 0):
            raise ValueError(f"a demand is never negative: {self!r}")


@dataclass(frozen=True)
class Charge:
    """What one request used, as its provider reported: ``tokens`` (input + output) and
    ``cost_micros`` (``None``: unknown, no price)."""

    tokens: int
    cost_micros: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0 or (self.cost_micros is not None and self.cost_micros < 0):
            raise ValueError(f"a charge is never negative: {self!r}")


@dataclass(frozen=True)
class SubjectLimits:
    """One subject (``key:<name>`` / ``team:<name>``) with its limits and budgets now."""

    subject: str
    limits: Limits = field(default_factory=Limits)
    budgets: tuple[Budget, ...] = ()

    @property
    def unlimited(self) -> bool:
        return self.limits.unlimited and not self.budgets


class Refused(Exception):
    """
    A reservation refused by one subject's limit or budget (the first that says no, in the
    order of :data:`KINDS`). Everything a client's 429 needs:

    - ``subject`` (``key:<name>`` / ``team:<name>``) and ``kind`` (one of :data:`KINDS`);
    - ``limit`` and ``remaining`` in the kind's unit (requests, tokens, concurrent requests;
      for a budget: tokens, or micro-units when ``unit`` is ``"cost"``);
    - ``retry_after_sec``: when a request like this one could be admitted (``None``: never as
      it is — it alone exceeds the limit, or a ``total`` budget is spent);
    - ``reset_after_sec``: when the limit is whole again (window: the newest entry leaves it;
      budget: the period's end; ``None``: never or not applicable);
    - ``period`` (budgets) and ``message``, safe to show a client (it names the key or team,
      which the client's own key already tells it, never a token).
    """

    def __init__(
        self,
        subject: str,
        kind: str,
        *,
        limit: int,
        remaining: int,
        retry_after_sec: float | None,
        reset_after_sec: float | None = None,
        period: str | None = None,
        unit: str = "",
        message: str = "",
    ) -> None:
        self.subject = subject
        self.kind = kind
        self.limit = limit
        self.remaining = remaining
        self.retry_after_sec = retry_after_sec
        self.reset_after_sec = reset_after_sec
        self.period = period
        self.unit = unit or _UNITS.get(kind, "")
        self.message = message or refusal_message(self)
        super().__init__(self.message)

    @property
    def budget(self) -> bool:
        """A spent budget (OpenAI's ``insufficient_quota``): retrying soon does not help."""
        return self.kind == "budget"

    def __repr__(self) -> str:
        return (
            f"Refused({self.subject!r}, {self.kind!r}, limit={self.limit}, "
            f"remaining={self.remaining}, retry_after_sec={self.retry_after_sec!r}, "
            f"period={self.period!r})"
        )


_UNITS = {
    "requests_per_minute": "requests",
    "tokens_per_minute": "tokens",
    "concurrent_requests": "requests",
}


def refusal_message(refused: Refused) -> str:
    """A client-facing sentence for ``refused``."""
    kind, who = refused.kind, describe_subject(refused.subject)
    if kind == "budget":

        def amount(value: int) -> str:
            return f"{format_cost(value)} in cost" if refused.unit == "cost" else f"{value} tokens"

        span = "total" if refused.period == "total" else f"per {refused.period}"
        budget = f"the {span} budget of {who} ({amount(refused.limit)})"
        # Nothing of it used, or a request no period could admit: the request is too large.
        whole = refused.remaining >= refused.limit
        if whole or (refused.retry_after_sec is None and refused.period != "total"):
            return f"this request alone exceeds {budget}: lower max_tokens"
        if refused.remaining <= 0:
            return f"{budget} is spent"
        # Some left, but less than this request's worst case: say so, lest "spent" read wrong.
        return (
            f"{budget} is nearly spent: {amount(refused.remaining)} left, less than this "
            f"request may use (its prompt and max_tokens)"
        )
    if kind == "requests_per_minute":
        return f"{who} is limited to {refused.limit} requests per minute"
    if kind == "tokens_per_minute":
        if refused.retry_after_sec is None:
            return (
                f"this request's worst case exceeds the {refused.limit} tokens per minute of "
                f"{who}: lower max_tokens"
            )
        return f"{who} is limited to {refused.limit} tokens per minute"
    return f"{who} is limited to {refused.limit} concurrent requests"


def format_cost(micros: int) -> str:
    """Micro-units as the decimal amount of the currency they are: 20000000 → ``20``."""
    return format((Decimal(micros) / MICROS_PER_UNIT).normalize(), "f")


def describe_subject(subject: str) -> str:
    """``key:alice`` → ``key 'alice'`` (how messages name a subject)."""
    kind, _, name = subject.partition(":")
    return f"{'team' if kind == 'team' else 'key'} {name!r}"


class QuotaUnavailable(Exception):
    """
    The cluster's counters (Redis) cannot be reached, so nothing can be admitted (fail closed):
    the client gets 503 ``cluster_unavailable``, never an unlimited request.
    """

    code = "cluster_unavailable"

    def __init__(self, message: str = "") -> None:
        self.message = message or (
            "the request cannot be admitted right now: the gateway's cluster state is unreachable"
        )
        super().__init__(self.message)


@dataclass(frozen=True)
class BudgetUse:
    """One budget's period now: ``[start, end)`` (``end`` None: ``total``) and what is used in
    it (reserved worst cases of requests still running + charges of finished ones)."""

    budget: Budget
    start: float
    end: float | None
    tokens: int
    cost_micros: int


@dataclass(frozen=True)
class Snapshot:
    """A subject's counters now: requests running, requests and tokens in the last minute,
    and each budget's use."""

    subject: str
    concurrent: int
    requests: int
    tokens: int
    budgets: tuple[BudgetUse, ...] = ()
