# -*- test-case-name: iop.test.edge.quota.test_memory -*-
"""
The counters of an Edge alone (:class:`InProcessQuotaTable`): exact, synchronous (every answer
is an already-fired Deferred), on the reactor's clock. The rules are the package's
(:mod:`iop.edge.quota`); the cluster's scripts (:mod:`iop.edge.cluster.quota_scripts`) apply the
same ones on Redis, and a test holds the two to each other.

Per subject it keeps the reservations holding a concurrency slot, the two sliding-window logs
(requests; tokens per reservation, so a settle can replace the worst case by the charge) and a
running total per budget period; an entry leaves a window 60 s after its admission, a period's
total is dropped once the period is over and no reservation admitted in it is still running.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from iop.config.model import Budget
from iop.edge.quota.model import (
    CONCURRENCY_RETRY_SEC,
    WINDOW_SEC,
    BudgetUse,
    Charge,
    Demand,
    Refused,
    Snapshot,
    SubjectLimits,
    describe_subject,
)
from iop.edge.quota.periods import period_bounds
from iop.edge.quota.table import IQuotaTable, Reservation

__all__ = ["InProcessQuotaTable"]


@dataclass
class _Entry:
    """A reservation's place in a window: admitted at ``at``, counting ``tokens``."""

    at: float
    id: str
    tokens: int


@dataclass
class _Bucket:
    """One budget period's running totals, and how many reservations admitted in it run."""

    end: float | None
    tokens: int = 0
    cost: int = 0
    running: int = 0


@dataclass
class _Subject:
    active: set[str] = field(default_factory=set)
    requests: deque[_Entry] = field(default_factory=deque)
    tokens: deque[_Entry] = field(default_factory=deque)
    token_entries: dict[str, _Entry] = field(default_factory=dict)
    token_sum: int = 0
    # (period, start) → totals
    buckets: dict[tuple[str, float], _Bucket] = field(default_factory=dict)

    def prune(self, now: float, window: float) -> None:
        cutoff = now - window
        while self.requests and self.requests[0].at <= cutoff:
            self.requests.popleft()
        while self.tokens and self.tokens[0].at <= cutoff:
            entry = self.tokens.popleft()
            self.token_sum -= entry.tokens
            del self.token_entries[entry.id]
        for key, bucket in list(self.buckets.items()):
            if bucket.running == 0 and bucket.end is not None and bucket.end <= now:
                del self.buckets[key]

    def empty(self) -> bool:
        return not (self.active or self.requests or self.tokens or self.buckets)


@dataclass
class _Held:
    """What a reservation holds, to undo it at its end."""

    reservation: Reservation
    # per subject: the budget buckets it was admitted in
    buckets: list[tuple[str, tuple[str, float]]]


@implementer(IQuotaTable)
class InProcessQuotaTable:
    """The counters of an Edge alone; see the module docstring."""

    def __init__(self, clock: IReactorTime, *, window_sec: float = WINDOW_SEC) -> None:
        self._clock = clock
        self._window = window_sec
        self._subjects: dict[str, _Subject] = {}
        self._held: dict[str, _Held] = {}
        self._ids = itertools.count(1)

    # -- IQuotaTable ---------------------------------------------------------------------------

    def reserve(self, subjects: Sequence[SubjectLimits], demand: Demand) -> Deferred[Reservation]:
        try:
            return succeed(self.reserve_now(subjects, demand))
        except Refused:
            return fail()

    def reserve_now(self, subjects: Sequence[SubjectLimits], demand: Demand) -> Reservation:
        """:meth:`reserve`, answered directly: the reservation, or raises :class:`Refused`."""
        now = self._clock.seconds()
        states = [self._state(s.subject) for s in subjects]
        for state in states:
            state.prune(now, self._window)
        refused = self._check(subjects, states, demand, now)
        if refused is not None:
            self._forget_empty(subjects)
            raise refused
        reservation = Reservation(
            f"local:{next(self._ids)}", [s.subject for s in subjects], demand, self._ended
        )
        held = _Held(reservation, [])
        for limits, state in zip(subjects, states, strict=True):
            state.active.add(reservation.id)
            state.requests.append(_Entry(now, reservation.id, 1))
            entry = _Entry(now, reservation.id, demand.tokens)
            state.tokens.append(entry)
            state.token_entries[reservation.id] = entry
            state.token_sum += demand.tokens
            for budget in limits.budgets:
                start, end = period_bounds(budget.period, now)
                bucket = state.buckets.setdefault((budget.period, start), _Bucket(end))
                bucket.tokens += demand.tokens
                bucket.cost += demand.cost_micros or 0
                bucket.running += 1
                held.buckets.append((limits.subject, (budget.period, start)))
        self._held[reservation.id] = held
        return reservation

    def snapshot(self, subject: SubjectLimits) -> Deferred[Snapshot]:
        return succeed(self.snapshot_now(subject))

    def snapshot_now(self, subject: SubjectLimits) -> Snapshot:
        now = self._clock.seconds()
        state = self._subjects.get(subject.subject) or _Subject()
        state.prune(now, self._window)
        uses = []
        for budget in subject.budgets:
            start, end = period_bounds(budget.period, now)
            bucket = state.buckets.get((budget.period, start)) or _Bucket(end)
            uses.append(BudgetUse(budget, start, end, bucket.tokens, bucket.cost))
        return Snapshot(
            subject=subject.subject,
            concurrent=len(state.active),
            requests=len(state.requests),
            tokens=state.token_sum,
            budgets=tuple(uses),
        )

    # -- what tests and /status read ------------------------------------------------------------

    @property
    def running(self) -> int:
        """Reservations not yet ended."""
        return len(self._held)

    def subjects(self) -> frozenset[str]:
        """The subjects with anything counted (the rest hold no memory)."""
        return frozenset(self._subjects)

    # -- rules ---------------------------------------------------------------------------------

    def _state(self, subject: str) -> _Subject:
        state = self._subjects.get(subject)
        if state is None:
            state = self._subjects[subject] = _Subject()
        return state

    def _check(
        self,
        subjects: Sequence[SubjectLimits],
        states: Sequence[_Subject],
        demand: Demand,
        now: float,
    ) -> Refused | None:
        pairs = list(zip(subjects, states, strict=True))
        for limits, state in pairs:
            for budget in limits.budgets:
                refused = self._budget(limits.subject, state, budget, demand, now)
                if refused is not None:
                    return refused
        for limits, state in pairs:
            rpm = limits.limits.requests_per_minute
            if rpm is not None and len(state.requests) + 1 > rpm:
                # The entry that must leave before one more fits (none: never, rpm < 1).
                count = len(state.requests)
                leaving = state.requests[count - rpm] if count else None
                return Refused(
                    limits.subject,
                    "requests_per_minute",
                    limit=rpm,
                    remaining=max(0, rpm - count),
                    retry_after_sec=None if leaving is None else leaving.at + self._window - now,
                    reset_after_sec=state.requests[-1].at + self._window - now if count else None,
                )
        for limits, state in pairs:
            tpm = limits.limits.tokens_per_minute
            if tpm is not None and state.token_sum + demand.tokens > tpm:
                return Refused(
                    limits.subject,
                    "tokens_per_minute",
                    limit=tpm,
                    remaining=max(0, tpm - state.token_sum),
                    retry_after_sec=self._tokens_fit(state, demand.tokens, tpm, now),
                    reset_after_sec=(
                        state.tokens[-1].at + self._window - now if state.tokens else None
                    ),
                )
        for limits, state in pairs:
            cap = limits.limits.concurrent_requests
            if cap is not None and len(state.active) + 1 > cap:
                return Refused(
                    limits.subject,
                    "concurrent_requests",
                    limit=cap,
                    remaining=max(0, cap - len(state.active)),
                    retry_after_sec=CONCURRENCY_RETRY_SEC,
                )
        return None

    def _tokens_fit(self, state: _Subject, tokens: int, tpm: int, now: float) -> float | None:
        """When enough of the window's tokens have left for ``tokens`` more; None: never."""
        if tokens > tpm:
            return None
        total = state.token_sum
        for entry in state.tokens:
            total -= entry.tokens
            if total + tokens <= tpm:
                return entry.at + self._window - now
        return None  # not reached: the window empties in the end

    def _budget(
        self, subject: str, state: _Subject, budget: Budget, demand: Demand, now: float
    ) -> Refused | None:
        start, end = period_bounds(budget.period, now)
        bucket = state.buckets.get((budget.period, start))
        used_tokens = bucket.tokens if bucket is not None else 0
        used_cost = bucket.cost if bucket is not None else 0
        checks: list[tuple[str, int, int, int | None]] = []
        if budget.tokens is not None:
            checks.append(("tokens", budget.tokens, used_tokens, demand.tokens))
        if budget.cost_micros is not None:
            checks.append(("cost", budget.cost_micros, used_cost, demand.cost_micros))
        for unit, limit, used, wanted in checks:
            if wanted is not None and used + wanted <= limit:
                continue
            # Unknown cost against a cost budget is never admitted; nor is a request that
            # alone exceeds the budget (whenever it came, it would not fit).
            never = wanted is None or wanted > limit
            retry = None if never or end is None else end - now
            return Refused(
                subject,
                "budget",
                limit=limit,
                remaining=max(0, limit - used),
                retry_after_sec=retry,
                reset_after_sec=None if end is None else end - now,
                period=budget.period,
                unit=unit,
                message=(
                    f"the cost of this request is unknown (its model has no price): the "
                    f"{budget.period} cost budget of {describe_subject(subject)} cannot admit it"
                    if wanted is None
                    else ""
                ),
            )
        return None

    # -- ends ----------------------------------------------------------------------------------

    def _ended(self, reservation: Reservation, charge: Charge) -> None:
        held = self._held.pop(reservation.id)
        demand = reservation.demand
        now = self._clock.seconds()
        for subject in reservation.subjects:
            state = self._subjects[subject]
            state.active.discard(reservation.id)
            entry = state.token_entries.get(reservation.id)
            if entry is not None:
                state.token_sum += charge.tokens - entry.tokens
                entry.tokens = charge.tokens
        for subject, key in held.buckets:
            state = self._subjects[subject]
            bucket = state.buckets[key]
            bucket.tokens += charge.tokens - demand.tokens
            bucket.cost += (charge.cost_micros or 0) - (demand.cost_micros or 0)
            bucket.running -= 1
        for subject in reservation.subjects:
            self._subjects[subject].prune(now, self._window)
        self._forget_empty_names(reservation.subjects)

    def _forget_empty(self, subjects: Sequence[SubjectLimits]) -> None:
        self._forget_empty_names([s.subject for s in subjects])

    def _forget_empty_names(self, names: Sequence[str]) -> None:
        for name in names:
            state = self._subjects.get(name)
            if state is not None and state.empty():
                del self._subjects[name]
