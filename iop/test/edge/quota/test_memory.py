"""
The in-process quota table (:mod:`iop.edge.quota.memory`) on a ``task.Clock``: examples of each
rule, and hypothesis-generated interleavings of reservations, settles with any usage, releases,
clock advances (across budget periods) and limits lowered mid-flight, held to a plain oracle —
every admission within every limit, every refusal the first rule the oracle finds broken, the
counters equal to the oracle's, and after everything ends every counter back to zero.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from iop.config.model import Budget, Limits
from iop.edge.quota import (
    Charge,
    Demand,
    InProcessQuotaTable,
    IQuotaTable,
    Refused,
    Reservation,
    SubjectLimits,
)
from iop.edge.quota.periods import period_bounds

# 2026-01-31 23:58:00 UTC: two minutes before a day, a month (and no week) ends.
START = datetime.datetime(2026, 1, 31, 23, 58, tzinfo=datetime.UTC).timestamp()


def table_at(when: float = START) -> tuple[Clock, InProcessQuotaTable]:
    clock = Clock()
    clock.advance(when)
    return clock, InProcessQuotaTable(clock)


def reserve(
    table: InProcessQuotaTable, *subjects: SubjectLimits, tokens: int = 10, cost: int | None = None
) -> Reservation:
    return table.reserve_now(subjects, Demand(tokens, cost))


def refused(
    table: InProcessQuotaTable, *subjects: SubjectLimits, tokens: int = 10, cost: int | None = None
) -> Refused:
    try:
        table.reserve_now(subjects, Demand(tokens, cost))
    except Refused as e:
        return e
    raise AssertionError("admitted")


class ExampleTests(SynchronousTestCase):
    def test_interface(self) -> None:
        verifyObject(IQuotaTable, table_at()[1])

    def test_concurrency(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", Limits(concurrent_requests=2))
        one, two = reserve(table, key), reserve(table, key)
        e = refused(table, key)
        self.assertEqual(
            (e.kind, e.subject, e.limit, e.remaining, e.retry_after_sec),
            ("concurrent_requests", "key:a", 2, 0, 1.0),
        )
        self.assertIn("2 concurrent requests", e.message)
        one.release()
        three = reserve(table, key)
        for r in (two, three):
            r.settle(Charge(5))
        self.assertEqual(table.snapshot_now(key).concurrent, 0)

    def test_requests_per_minute_slides(self) -> None:
        clock, table = table_at()
        key = SubjectLimits("key:a", Limits(requests_per_minute=2))
        reserve(table, key).release()
        clock.advance(20)
        reserve(table, key).release()
        e = refused(table, key)
        # The first entry leaves the window 60 s after it came: 40 s from now.
        self.assertEqual(
            (e.kind, e.remaining, e.retry_after_sec, e.reset_after_sec),
            ("requests_per_minute", 0, 40.0, 60.0),
        )
        clock.advance(39.5)
        refused(table, key)
        clock.advance(0.5)
        reserve(table, key)

    def test_tokens_per_minute_settled_to_the_charge(self) -> None:
        clock, table = table_at()
        key = SubjectLimits("key:a", Limits(tokens_per_minute=100))
        first = reserve(table, key, tokens=80)
        e = refused(table, key, tokens=30)
        self.assertEqual(
            (e.kind, e.limit, e.remaining, e.retry_after_sec), ("tokens_per_minute", 100, 20, 60.0)
        )
        first.settle(Charge(50))
        reserve(table, key, tokens=30).settle(None)
        self.assertEqual(table.snapshot_now(key).tokens, 80)
        # A request that alone exceeds the limit is never admitted: no retry-after.
        e = refused(table, key, tokens=101)
        self.assertIsNone(e.retry_after_sec)
        self.assertIn("lower max_tokens", e.message)
        clock.advance(60)
        self.assertEqual(table.snapshot_now(key).tokens, 0)

    def test_unknown_usage_keeps_the_worst_case(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", budgets=(Budget("day", tokens=1000, cost_micros=10**6),))
        reserve(table, key, tokens=300, cost=1000).settle(None)
        reserve(table, key, tokens=300, cost=1000).settle(Charge(100))
        (use,) = table.snapshot_now(key).budgets
        self.assertEqual((use.tokens, use.cost_micros), (400, 2000))

    def test_budget_periods(self) -> None:
        clock, table = table_at()
        key = SubjectLimits(
            "key:a", budgets=(Budget("day", tokens=100), Budget("month", cost_micros=50))
        )
        held = reserve(table, key, tokens=60, cost=10)
        e = refused(table, key, tokens=60, cost=10)
        self.assertEqual(
            (e.kind, e.period, e.unit, e.limit, e.remaining), ("budget", "day", "tokens", 100, 40)
        )
        self.assertEqual(e.retry_after_sec, 120.0)  # the day ends at midnight UTC
        self.assertTrue(e.budget)
        self.assertEqual(
            e.message,
            "the per day budget of key 'a' (100 tokens) is nearly spent: 40 tokens left, less "
            "than this request may use (its prompt and max_tokens)",
        )
        clock.advance(120)  # a new day and a new month
        reserve(table, key, tokens=60, cost=40)
        # Settled after the period changed: into the day it was admitted in, which is over.
        held.settle(Charge(10, 5))
        (day, month) = table.snapshot_now(key).budgets
        self.assertEqual((day.tokens, month.cost_micros), (60, 40))
        e = refused(table, key, tokens=1, cost=11)
        self.assertEqual((e.period, e.unit, e.remaining), ("month", "cost", 10))
        self.assertIn("0.00005 in cost", e.message)

    def test_total_budget_never_resets(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", budgets=(Budget("total", tokens=10),))
        reserve(table, key, tokens=10).settle(Charge(10))
        e = refused(table, key, tokens=1)
        self.assertEqual((e.retry_after_sec, e.reset_after_sec), (None, None))
        self.assertEqual(e.message, "the total budget of key 'a' (10 tokens) is spent")

    def test_budget_messages_say_spent_only_when_it_is(self) -> None:
        """A client reads the refusal's sentence (Claude Code shows it as it is): a request too
        large for the whole budget is told to lower max_tokens, whatever the period."""
        _, table = table_at()
        key = SubjectLimits("key:a", budgets=(Budget("total", tokens=100),))
        e = refused(table, key, tokens=101)
        self.assertEqual(
            e.message, "this request alone exceeds the total budget of key 'a' (100 tokens): "
            "lower max_tokens",
        )  # fmt: skip
        reserve(table, key, tokens=30).settle(Charge(30))
        self.assertIn("nearly spent: 70 tokens left", refused(table, key, tokens=71).message)
        daily = SubjectLimits("key:b", budgets=(Budget("day", tokens=100),))
        self.assertIn("alone exceeds", refused(table, daily, tokens=101).message)

    def test_unknown_cost_against_a_cost_budget(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", budgets=(Budget("day", cost_micros=100),))
        e = refused(table, key, cost=None)
        self.assertEqual((e.kind, e.retry_after_sec), ("budget", None))
        self.assertIn("no price", e.message)

    def test_all_or_nothing_across_subjects(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:b", Limits(concurrent_requests=5))
        team = SubjectLimits("team:t", Limits(concurrent_requests=1))
        reserve(table, key, team)
        e = refused(table, key, team)
        self.assertEqual((e.subject, e.kind), ("team:t", "concurrent_requests"))
        self.assertIn("team 't'", e.message)
        self.assertEqual(table.snapshot_now(key).concurrent, 1)

    def test_budget_is_checked_before_rates(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", Limits(requests_per_minute=1), (Budget("week", tokens=10),))
        reserve(table, key, tokens=10)
        self.assertEqual(refused(table, key, tokens=10).kind, "budget")

    def test_lowered_limit_keeps_what_is_held(self) -> None:
        _, table = table_at()
        wide = SubjectLimits("key:a", Limits(concurrent_requests=3))
        held = [reserve(table, wide) for _ in range(3)]
        narrow = SubjectLimits("key:a", Limits(concurrent_requests=1))
        refused(table, narrow)
        held[0].settle(Charge(1))
        held[1].settle(Charge(1))
        refused(table, narrow)
        held[2].settle(Charge(1))
        reserve(table, narrow)

    def test_ended_once(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", Limits(concurrent_requests=1), (Budget("day", tokens=100),))
        r = reserve(table, key, tokens=50)
        r.settle(Charge(20))
        r.settle(Charge(40))
        r.release()
        self.assertEqual(r.charged, Charge(20))
        self.assertEqual(table.snapshot_now(key).budgets[0].tokens, 20)
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.assertEqual(table.running, 0)

    def test_end_chooses(self) -> None:
        _, table = table_at()
        key = SubjectLimits("key:a", budgets=(Budget("day", tokens=100),))
        reserve(table, key, tokens=50).end(Charge(30), dispatched=True)
        reserve(table, key, tokens=50).end(Charge(30), dispatched=False)
        self.assertEqual(table.snapshot_now(key).budgets[0].tokens, 30)

    def test_overshoot_is_counted(self) -> None:
        """A provider that used more than the worst case is charged all of it."""
        _, table = table_at()
        key = SubjectLimits("key:a", Limits(tokens_per_minute=100), (Budget("day", tokens=100),))
        reserve(table, key, tokens=50).settle(Charge(120))
        snap = table.snapshot_now(key)
        self.assertEqual((snap.tokens, snap.budgets[0].tokens), (120, 120))
        self.assertEqual(refused(table, key, tokens=1).kind, "budget")

    def test_idle_subjects_hold_no_memory(self) -> None:
        clock, table = table_at()
        key = SubjectLimits("key:a", Limits(requests_per_minute=5))
        reserve(table, key).settle(Charge(1))
        clock.advance(61)
        reserve(table, SubjectLimits("key:b", Limits(requests_per_minute=5))).release()
        table.snapshot_now(key)
        clock.advance(61)
        reserve(table, key).release()
        clock.advance(61)
        refused(table, SubjectLimits("key:a", Limits(requests_per_minute=0)))
        self.assertLessEqual(table.subjects(), {"key:a", "key:b"})


# ---------------------------------------------------------------------------------------------
# Properties


@dataclass
class _Admitted:
    at: float
    subjects: tuple[str, ...]
    demand: Demand
    reservation: Reservation
    periods: dict[tuple[str, str], float]  # (subject, period) → start
    charged: Charge | None = None
    ended: bool = False

    def tokens(self) -> int:
        return self.charged.tokens if self.charged is not None else self.demand.tokens

    def cost(self) -> int:
        if self.charged is not None:
            return self.charged.cost_micros or 0
        return self.demand.cost_micros or 0


@dataclass
class Oracle:
    """What the rules say, from the plain list of admissions."""

    admitted: list[_Admitted] = field(default_factory=list)

    def mine(self, subject: str) -> list[_Admitted]:
        return [a for a in self.admitted if subject in a.subjects]

    def window(self, subject: str, now: float) -> list[_Admitted]:
        return [a for a in self.mine(subject) if a.at > now - 60]

    def running(self, subject: str) -> int:
        return sum(1 for a in self.mine(subject) if not a.ended)

    def used(self, subject: str, period: str, start: float) -> tuple[int, int]:
        inside = [a for a in self.mine(subject) if a.periods.get((subject, period)) == start]
        return sum(a.tokens() for a in inside), sum(a.cost() for a in inside)

    def first_broken(
        self, subjects: list[SubjectLimits], demand: Demand, now: float
    ) -> tuple[str, str] | None:
        for s in subjects:
            for b in s.budgets:
                start, _ = period_bounds(b.period, now)
                tokens, cost = self.used(s.subject, b.period, start)
                if b.tokens is not None and tokens + demand.tokens > b.tokens:
                    return s.subject, "budget"
                if b.cost_micros is not None and (
                    demand.cost_micros is None or cost + demand.cost_micros > b.cost_micros
                ):
                    return s.subject, "budget"
        for s in subjects:
            rpm = s.limits.requests_per_minute
            if rpm is not None and len(self.window(s.subject, now)) + 1 > rpm:
                return s.subject, "requests_per_minute"
        for s in subjects:
            tpm = s.limits.tokens_per_minute
            if (
                tpm is not None
                and sum(a.tokens() for a in self.window(s.subject, now)) + demand.tokens > tpm
            ):
                return s.subject, "tokens_per_minute"
        for s in subjects:
            cap = s.limits.concurrent_requests
            if cap is not None and self.running(s.subject) + 1 > cap:
                return s.subject, "concurrent_requests"
        return None


def limits_st() -> st.SearchStrategy[Limits]:
    small = st.one_of(st.none(), st.integers(1, 4))
    return st.builds(Limits, small, st.one_of(st.none(), st.integers(20, 300)), small)


def budgets_st() -> st.SearchStrategy[tuple[Budget, ...]]:
    budget = st.builds(
        Budget,
        st.sampled_from(("day", "week", "month", "total")),
        st.one_of(st.none(), st.integers(50, 800)),
        st.one_of(st.none(), st.integers(100, 2000)),
    ).filter(lambda b: b.tokens is not None or b.cost_micros is not None)
    return st.lists(budget, max_size=2, unique_by=lambda b: b.period).map(tuple)


# The keys: a alone; b and c share team t.
KEYS = {"a": ("key:a",), "b": ("key:b", "team:t"), "c": ("key:c", "team:t")}
SUBJECTS = ("key:a", "key:b", "key:c", "team:t")

op_st = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.sampled_from(sorted(KEYS)),
        st.integers(0, 120),
        st.one_of(st.none(), st.integers(0, 600)),
    ),
    st.tuples(st.just("settle"), st.integers(0, 50), st.one_of(st.none(), st.floats(0, 1))),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from((0.5, 1, 7, 30, 59, 60, 61, 3600, 86400))),
    st.tuples(st.just("limits"), st.sampled_from(SUBJECTS), limits_st(), budgets_st()),
)


class PropertyTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.fixed_dictionaries({s: st.tuples(limits_st(), budgets_st()) for s in SUBJECTS}),
        st.lists(op_st, max_size=60),
    )
    def test_interleavings(self, initial: dict[str, Any], ops: list[Any]) -> None:
        clock, table = table_at()
        limits = {s: SubjectLimits(s, *initial[s]) for s in SUBJECTS}
        oracle = Oracle()
        # The highest limit each subject had since the start (a lowered limit keeps what is held).
        ceilings: dict[str, Limits] = {s: limits[s].limits for s in SUBJECTS}
        for op in ops:
            now = clock.seconds()
            if op[0] == "reserve":
                _, name, tokens, cost = op
                subjects = [limits[s] for s in KEYS[name]]
                demand = Demand(tokens, cost)
                expected = oracle.first_broken(subjects, demand, now)
                try:
                    r = table.reserve_now(subjects, demand)
                except Refused as e:
                    self.assertEqual((e.subject, e.kind), expected)
                    self.assertTrue(e.retry_after_sec is None or e.retry_after_sec > 0, e)
                    self.assertGreaterEqual(e.remaining, 0)
                    continue
                self.assertIsNone(expected)
                periods = {
                    (s.subject, b.period): period_bounds(b.period, now)[0]
                    for s in subjects
                    for b in s.budgets
                }
                oracle.admitted.append(_Admitted(now, r.subjects, demand, r, periods))
            elif op[0] in ("settle", "release"):
                running = [a for a in oracle.admitted if not a.ended]
                if not running:
                    continue
                a = running[op[1] % len(running)]
                a.ended = True
                if op[0] == "release":
                    a.reservation.release()
                    a.charged = Charge(0, 0)
                elif op[2] is None:
                    a.reservation.settle(None)
                else:
                    charge = Charge(
                        int(a.demand.tokens * op[2]),
                        None if a.demand.cost_micros is None else int(a.demand.cost_micros * op[2]),
                    )
                    a.reservation.settle(charge)
                    a.charged = charge
            elif op[0] == "advance":
                clock.advance(op[1])
            else:
                _, subject, new_limits, new_budgets = op
                limits[subject] = SubjectLimits(subject, new_limits, new_budgets)
                old = ceilings[subject]
                ceilings[subject] = Limits(
                    *(
                        None if o is None or n is None else max(o, n)
                        for o, n in zip(
                            (
                                old.requests_per_minute,
                                old.tokens_per_minute,
                                old.concurrent_requests,
                            ),
                            (
                                new_limits.requests_per_minute,
                                new_limits.tokens_per_minute,
                                new_limits.concurrent_requests,
                            ),
                            strict=True,
                        )
                    )
                )
            self.check_counters(table, oracle, limits, clock.seconds(), ceilings)
        # Everything ends; a minute later every counter is back to zero.
        for a in oracle.admitted:
            if not a.ended:
                a.reservation.release()
                a.ended, a.charged = True, Charge(0, 0)
        self.assertEqual(table.running, 0)
        clock.advance(60)
        for s in SUBJECTS:
            snap = table.snapshot_now(limits[s])
            self.assertEqual((snap.concurrent, snap.requests, snap.tokens), (0, 0, 0), s)
            for use in snap.budgets:
                self.assertEqual(
                    (use.tokens, use.cost_micros),
                    oracle.used(s, use.budget.period, use.start),
                )

    def check_counters(
        self,
        table: InProcessQuotaTable,
        oracle: Oracle,
        limits: dict[str, SubjectLimits],
        now: float,
        ceilings: dict[str, Limits],
    ) -> None:
        for s in SUBJECTS:
            snap = table.snapshot_now(limits[s])
            window = oracle.window(s, now)
            tokens = sum(a.tokens() for a in window)
            self.assertEqual(snap.concurrent, oracle.running(s), s)
            self.assertEqual(snap.requests, len(window), s)
            self.assertEqual(snap.tokens, tokens, s)
            for use in snap.budgets:
                self.assertEqual(
                    (use.tokens, use.cost_micros), oracle.used(s, use.budget.period, use.start), s
                )
            # Never above a limit in any window (charges never exceed their worst case here).
            ceiling = ceilings[s]
            if ceiling.requests_per_minute is not None:
                self.assertLessEqual(len(window), ceiling.requests_per_minute, s)
            if ceiling.tokens_per_minute is not None:
                self.assertLessEqual(tokens, ceiling.tokens_per_minute, s)
            if ceiling.concurrent_requests is not None:
                self.assertLessEqual(oracle.running(s), ceiling.concurrent_requests, s)
