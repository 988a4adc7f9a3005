"""
The cluster's quota table (:mod:`iop.edge.cluster.quota`) against a real ``redis-server`` on a
private unix socket: the same answers and counters as the in-process table over random
interleavings (reserve with any subjects, settle with any usage, release, lowered limits); the
scripts' UTC periods equal the Python ones; windows sliding on Redis's clock; one key's
concurrency exact across two Edges under a burst; a dead Edge's slots freed within the TTL (its
worst case still charged) while a live Edge's are renewed; settle exactly once; Redis gone →
QuotaUnavailable (fail closed), then served again.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred

from iop.config.model import Budget, ClusterConfig, Limits, Secret
from iop.edge.cluster.quota import ClusterQuotaTable
from iop.edge.cluster.quota_scripts import _NOW, _PERIODS, SETTLE
from iop.edge.cluster.redis import RedisConnection, connect
from iop.edge.cluster.scripts import Script
from iop.edge.quota import (
    Charge,
    Demand,
    InProcessQuotaTable,
    QuotaUnavailable,
    Refused,
    Reservation,
    SubjectLimits,
)
from iop.edge.quota.periods import period_bounds
from tests.conftest import RedisServer


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


Open = Callable[..., "Deferred[ClusterQuotaTable]"]


@pytest.fixture
def tables(redis_server: RedisServer) -> Iterator[Open]:
    """``await tables("edge-a", prefix=...)``: a quota table on its own connection."""
    opened: list[tuple[RedisConnection, ClusterQuotaTable]] = []

    async def open_one(
        edge_id: str = "edge-a",
        *,
        prefix: str = "q",
        ttl: float = 10.0,
        window: float = 60.0,
        timeout: float = 2.0,
        start: bool = False,
    ) -> ClusterQuotaTable:
        config = ClusterConfig(
            redis=f"unix://{redis_server.socket}",
            edge_id=edge_id,
            password=Secret(redis_server.password),
            key_prefix=prefix,
        )
        conn = connect(config, reactor, timeout=timeout)
        await conn.when_connected(5)
        table = ClusterQuotaTable(
            conn.leases, reactor, edge_id=edge_id, ttl_sec=ttl, window_sec=window
        )
        conn.when_each_connected(table.reconnected)
        if start:
            table.start()
        opened.append((conn, table))
        return table

    yield lambda *a, **kw: ensureDeferred(open_one(*a, **kw))
    for conn, table in opened:
        table.stop()
        pytest_twisted.blockon(conn.close())


async def outcome(d: Deferred[Reservation]) -> Reservation | Refused:
    try:
        return await d
    except Refused as e:
        return e


# -- equivalence with the in-process table ------------------------------------------------------


def random_subject(rng: random.Random, name: str) -> SubjectLimits:
    def maybe(low: int, high: int) -> int | None:
        return rng.choice((None, rng.randint(low, high)))

    budgets = []
    for period in rng.sample(("day", "week", "month", "total"), rng.randint(0, 2)):
        tokens, cost = maybe(50, 600), maybe(100, 2000)
        if tokens is None and cost is None:
            tokens = 400
        budgets.append(Budget(period, tokens, cost))
    return SubjectLimits(name, Limits(maybe(1, 6), maybe(30, 400), maybe(1, 4)), tuple(budgets))


KEYS = {"a": ("key:a",), "b": ("key:b", "team:t"), "c": ("key:c", "team:t")}


@pytest_twisted.ensureDeferred
async def test_same_answers_as_in_process(tables: Open) -> None:
    """Random interleavings without time passing: every answer (admitted, or which subject,
    rule, limit and remaining said no) and every counter equal the in-process table's."""
    for seed in range(25):
        rng = random.Random(seed)
        redis_table = await tables(f"edge-{seed}", prefix=f"eq{seed}")
        clock = task.Clock()
        clock.advance(datetime.datetime.now(datetime.UTC).timestamp())
        local = InProcessQuotaTable(clock)
        limits = {s: random_subject(rng, s) for s in ("key:a", "key:b", "key:c", "team:t")}
        running: list[tuple[Reservation, Reservation]] = []
        for _ in range(40):
            roll = rng.random()
            if roll < 0.55:
                subjects = [limits[s] for s in KEYS[rng.choice("abc")]]
                demand = Demand(rng.randint(0, 150), rng.choice((None, rng.randint(0, 700))))
                theirs = await outcome(redis_table.reserve(subjects, demand))
                ours = await outcome(local.reserve(subjects, demand))
                if isinstance(ours, Refused):
                    assert isinstance(theirs, Refused), (seed, ours)
                    assert (theirs.subject, theirs.kind, theirs.limit, theirs.remaining) == (
                        ours.subject, ours.kind, ours.limit, ours.remaining,
                    ), seed  # fmt: skip
                    assert (theirs.period, theirs.unit) == (ours.period, ours.unit)
                    assert (theirs.retry_after_sec is None) == (ours.retry_after_sec is None)
                else:
                    assert isinstance(theirs, Reservation), (seed, theirs)
                    running.append((theirs, ours))
            elif roll < 0.85 and running:
                pair = running.pop(rng.randrange(len(running)))
                choice = rng.random()
                for r in pair:
                    if choice < 0.3:
                        r.release()
                    elif choice < 0.5:
                        r.settle(None)
                    else:
                        share = choice - 0.5
                        cost = r.demand.cost_micros
                        r.settle(
                            Charge(
                                int(r.demand.tokens * share),
                                None if cost is None else int(cost * share),
                            )
                        )
            else:
                s = rng.choice(sorted(limits))
                limits[s] = random_subject(rng, s)
            await sleep(0)  # let the settles reach Redis before the next comparison
            await compare(redis_table, local, limits)
        for pair in running:
            for r in pair:
                r.release()
        await sleep(0.05)
        await compare(redis_table, local, limits)
        assert redis_table.running == 0 and local.running == 0


async def compare(
    redis_table: ClusterQuotaTable,
    local: InProcessQuotaTable,
    limits: dict[str, SubjectLimits],
) -> None:
    for subject in limits.values():
        theirs = await redis_table.snapshot(subject)
        ours = local.snapshot_now(subject)
        assert (theirs.concurrent, theirs.requests, theirs.tokens) == (
            ours.concurrent, ours.requests, ours.tokens,
        ), subject  # fmt: skip
        assert [(u.budget, u.start, u.end, u.tokens, u.cost_micros) for u in theirs.budgets] == [
            (u.budget, u.start, u.end, u.tokens, u.cost_micros) for u in ours.budgets
        ], subject


BOUNDS = Script(
    "bounds",
    _NOW
    + _PERIODS
    + """
local out = {}
for i = 2, #ARGV do
  local s, e = bounds(ARGV[1], tonumber(ARGV[i]))
  out[#out + 1] = fmt(s) .. ' ' .. fmt(e)
end
return table.concat(out, ',')
""",
)


@pytest_twisted.ensureDeferred
async def test_periods_match_python(tables: Open, redis_server: RedisServer) -> None:
    """The scripts' UTC periods are the Python ones: random instants, month and year ends,
    leap days, week starts."""
    table = await tables()
    store = table._store
    rng = random.Random(7)
    edges = [
        datetime.datetime(y, m, 1, tzinfo=datetime.UTC).timestamp() * 1000
        for y in (1999, 2000, 2024, 2026, 2100)
        for m in range(1, 13)
    ]
    instants = [int(rng.uniform(0, 4102444800000)) for _ in range(300)]
    instants += [int(e + d) for e in edges for d in (-1, 0, 1)]
    for period in ("day", "week", "month", "total"):
        reply = await store.run(BOUNDS, [store.key("x")], [period, *instants])
        got = [tuple(int(x) for x in pair.split(" ")) for pair in str(reply).split(",")]
        for ms, (start, end) in zip(instants, got, strict=True):
            want_start, want_end = period_bounds(period, ms / 1000)
            assert start == int(want_start * 1000), (period, ms)
            assert end == (-1 if want_end is None else int(want_end * 1000)), (period, ms)


# -- time on Redis's clock ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_window_slides(tables: Open) -> None:
    table = await tables(window=0.4)
    key = SubjectLimits("key:a", Limits(requests_per_minute=1, tokens_per_minute=100))
    (await table.reserve([key], Demand(90))).settle(Charge(90))
    refused = await outcome(table.reserve([key], Demand(5)))
    assert isinstance(refused, Refused) and refused.kind == "requests_per_minute"
    assert refused.retry_after_sec is not None and 0 < refused.retry_after_sec <= 0.4
    await sleep(0.45)
    assert (await table.snapshot(key)).tokens == 0
    (await table.reserve([key], Demand(100))).release()


@pytest_twisted.ensureDeferred
async def test_concurrency_exact_across_two_edges(tables: Open) -> None:
    """60 reservations at once, split over two Edges: exactly the limit admitted."""
    a, b = await tables("edge-a"), await tables("edge-b")
    key = SubjectLimits(
        "key:shared", Limits(concurrent_requests=3), (Budget("day", tokens=10_000),)
    )
    results: list[tuple[bool, Any]] = await DeferredList(
        [(a if i % 2 else b).reserve([key], Demand(10)) for i in range(60)], consumeErrors=True
    )
    admitted: list[Reservation] = [r for ok, r in results if ok]
    refusals = [f.value for ok, f in results if not ok]
    assert len(admitted) == 3
    assert all(isinstance(e, Refused) and e.kind == "concurrent_requests" for e in refusals)
    for r in admitted:
        r.settle(Charge(7))
    await sleep(0.05)
    snap = await a.snapshot(key)
    assert (snap.concurrent, snap.requests, snap.budgets[0].tokens) == (0, 3, 21)


@pytest_twisted.ensureDeferred
async def test_dead_edge_frees_its_slots(tables: Open) -> None:
    """An Edge that stops renewing (dead) frees its slot within the TTL; its reservation's
    worst case stays charged, and a late settle changes nothing. A live Edge's slot stays."""
    dead = await tables("edge-dead", ttl=0.5)
    live = await tables("edge-live", ttl=0.5, start=True)
    key = SubjectLimits("key:a", Limits(concurrent_requests=1), (Budget("total", tokens=1000),))
    team = SubjectLimits("team:t", Limits(concurrent_requests=1))
    held = await dead.reserve([key], Demand(100))
    assert isinstance(await outcome(live.reserve([key], Demand(1))), Refused)
    await sleep(0.6)
    mine = await live.reserve([key, team], Demand(1))
    held.settle(Charge(1))  # too late: its record expired with the slot
    await sleep(1.2)  # renewed every third of the TTL
    assert not mine.lost
    refused = await outcome(dead.reserve([team], Demand(1)))
    assert isinstance(refused, Refused) and refused.subject == "team:t"
    mine.settle(Charge(1))
    await sleep(0.05)
    assert (await live.snapshot(key)).budgets[0].tokens == 101


@pytest_twisted.ensureDeferred
async def test_settle_exactly_once(tables: Open) -> None:
    table = await tables()
    key = SubjectLimits("key:a", budgets=(Budget("month", tokens=1000, cost_micros=10_000),))
    r = await table.reserve([key], Demand(100, 500))
    store, q = table._store, table._q
    args = [q, r.id, 40, 200]
    assert int(await store.run(SETTLE, [q + "res:" + r.id], args)) == 1
    assert int(await store.run(SETTLE, [q + "res:" + r.id], args)) == 0
    use = (await table.snapshot(key)).budgets[0]
    assert (use.tokens, use.cost_micros) == (40, 200)


@pytest_twisted.ensureDeferred
async def test_redis_gone_fails_closed(tables: Open, redis_server: RedisServer) -> None:
    table = await tables(timeout=0.5)
    key = SubjectLimits("key:a", Limits(concurrent_requests=5))
    (await table.reserve([key], Demand(1))).release()
    redis_server.stop()
    await sleep(0.1)
    error = await outcome_or_error(table.reserve([key], Demand(1)))
    assert isinstance(error, QuotaUnavailable) and error.code == "cluster_unavailable"
    assert redis_server.password not in str(error)
    redis_server.start()
    for _ in range(100):
        got = await outcome_or_error(table.reserve([key], Demand(1)))
        if isinstance(got, Reservation):
            got.release()
            return
        await sleep(0.05)
    raise AssertionError("not served again after Redis came back")


async def outcome_or_error(d: Deferred[Reservation]) -> Any:
    try:
        return await d
    except Exception as e:
        return e
