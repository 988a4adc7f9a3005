"""
The cluster's lease table (:mod:`iop.edge.cluster`) against a real ``redis-server`` on a private
unix socket, driven from the real reactor: selection order (in_flight, priority, round-robin),
capacity across two Edges' stores under concurrency, long context, release exactly once,
renewal and TTL expiry on the server's clock, a flushed script loaded again, and Redis gone or
hung → ClusterUnavailable within the store's timeout (fail closed), then recovery.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
import txredisapi
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred

from iop.config.model import (
    ClusterConfig,
    EdgeConfig,
    HeartbeatConfig,
    ModelConfig,
    ModelProviderRef,
    NodeConfig,
    NodeToken,
    ProviderConfig,
    Secret,
)
from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.leases import Candidate, Grant, RedisLeaseStore
from iop.edge.cluster.redis import RedisConnection, connect
from iop.edge.pool import Lease, ProviderPool, is_long
from tests.conftest import RedisServer

TTL_MS = 10_000


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


Connect = Callable[..., "Deferred[RedisConnection]"]


@pytest.fixture
def edges(redis_server: RedisServer) -> Iterator[Connect]:
    """``await edges("edge-a")``: a connected store of that Edge; all closed at teardown."""
    opened: list[RedisConnection] = []

    async def open_one(
        edge_id: str = "edge-a", *, timeout: float = 2.0, fresh: bool = False, **fields: Any
    ) -> RedisConnection:
        db = fields.pop("db", 0)
        config = ClusterConfig(
            redis=f"unix://{redis_server.socket}?db={db}",
            edge_id=edge_id,
            password=Secret(redis_server.password),
        )
        config = dataclasses.replace(config, **fields)
        conn = connect(config, reactor, timeout=timeout)
        opened.append(conn)
        await conn.when_connected(5)
        if not fresh:
            await establish(redis_server, config.key_prefix, db)
        return conn

    yield lambda *a, **kw: ensureDeferred(open_one(*a, **kw))
    for conn in opened:
        pytest_twisted.blockon(conn.close())


async def raw(server: RedisServer, db: int = 0) -> Any:
    """A plain txredisapi client, for what the store does not do (SCRIPT FLUSH, KEYS)."""
    return await txredisapi.UnixConnection(
        server.socket, dbid=db, password=server.password, reconnect=False
    )


async def establish(server: RedisServer, prefix: str = "iop", db: int = 0) -> None:
    """Mark the table established (an epoch whose recovery is over), as a running cluster's is:
    a test's Redis starts empty, which the scripts treat as a lost table (see test_lost_table_*)."""
    admin = await raw(server, db)
    try:
        await admin.set(f"{{{prefix}}}:epoch", "0")
    finally:
        await admin.disconnect()


def cands(*specs: tuple[str, int, int]) -> list[Candidate]:
    """Candidates from (provider_id, capacity, priority), positioned in the order given."""
    return [Candidate(pid, capacity=cap, priority=pri) for pid, cap, pri in specs]


async def take(store: RedisLeaseStore, model: str, candidates: list[Candidate], **kw: Any) -> Grant:
    grant = await store.acquire(model, candidates, kw.pop("edge_id", "edge-a"), TTL_MS, **kw)
    assert grant is not None
    return grant


@pytest_twisted.ensureDeferred
async def test_selection_order(edges: Connect) -> None:
    """Lowest in_flight, then the lower priority number, then round-robin in config order."""
    store = (await edges()).leases
    candidates = cands(("a", 2, 1), ("b", 2, 0), ("c", 2, 0))
    chosen = [(await take(store, "m", candidates)).provider_id for _ in range(6)]
    # b,c tie on priority 0 (b first: the rotation starts at 0); then c (in_flight 0); then a
    # (the only one at 0); all at 1: priority → b or c, rotation after a (position 0) → b; ...
    assert chosen == ["b", "c", "a", "b", "c", "a"]
    assert await store.acquire("m", candidates, "edge-a", TTL_MS) is None
    assert await store.in_flight(["a", "b", "c"]) == {"a": (2, 0), "b": (2, 0), "c": (2, 0)}


def pool_and_candidates(
    rng: random.Random,
) -> tuple[ProviderPool, list[Candidate], dict[str, ProviderConfig]]:
    """
    An in-process pool over five random providers of one model key (one node, ready) and the
    same providers as store candidates.
    """
    providers = tuple(
        ProviderConfig(
            id=f"p{i}",
            adapter="fake",
            category="api",
            adapter_instance="fake",
            type="openai_compat",
            models=("t",),
            capacity=rng.randint(1, 3),
            priority=rng.randint(0, 1),
            long_context_threshold=rng.choice((0, 100)),
            long_capacity=rng.randint(0, 1),
        )
        for i in range(5)
    )
    config = EdgeConfig(
        id="edge-a",
        node_listen="tcp:0:interface=127.0.0.1",
        admin_listen="tcp:0:interface=127.0.0.1",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(2.0, 5.0),
        max_frame_bytes=1024 * 1024,
        register_timeout_sec=10.0,
        nodes=(NodeConfig(id="n", token=NodeToken.from_plaintext("t"), providers=providers),),
        models=(
            ModelConfig(id="m", providers=tuple(ModelProviderRef(p.id, "t") for p in providers)),
        ),
    )
    pool = ProviderPool(config, task.Clock())
    pool.node_ready("n", 1)
    by_id = {p.id: p for p in providers}
    candidates = [
        Candidate(p.id, capacity=p.capacity, priority=p.priority, long_capacity=p.long_capacity)
        for p in providers
    ]
    return pool, candidates, by_id


@pytest_twisted.ensureDeferred
async def test_same_choices_as_the_in_process_pool(edges: Connect) -> None:
    """
    Random acquires (long and not) and releases: the store picks exactly the provider the
    in-process pool picks (or, like it, none), step by step.
    """
    store = (await edges()).leases
    rng = random.Random(1616)
    pool, candidates, by_id = pool_and_candidates(rng)
    held: list[tuple[Lease, str]] = []
    grants = longs = full = 0
    for _ in range(300):
        if held and rng.random() < 0.4:
            lease, lease_id = held.pop(rng.randrange(len(held)))
            lease.release()
            assert await store.release(lease_id)
            continue
        tokens = rng.choice((0, 150))
        outcome: list[object] = []
        d = pool.acquire("m", prompt_tokens=tokens)
        d.addBoth(outcome.append)
        if not outcome:
            d.cancel()  # queued: withdraw it (the store does not queue)
        expected = outcome[0] if isinstance(outcome[0], Lease) else None
        each = [
            dataclasses.replace(c, long=is_long(by_id[c.provider_id], tokens)) for c in candidates
        ]
        grant = await store.acquire("m", each, "edge-a", TTL_MS)
        assert (grant and grant.provider_id) == (expected and expected.provider_id)
        if grant is None:
            full += 1
        elif isinstance(expected, Lease):
            assert grant.long == expected.long
            held.append((expected, grant.lease_id))
            grants += 1
            longs += grant.long
    # Every branch was taken: grants, long grants, all full.
    assert grants > 100 and longs > 10 and full > 10, (grants, longs, full)


@pytest_twisted.ensureDeferred
async def test_round_robin_alternates(edges: Connect) -> None:
    """Equal candidates: repeated acquire/release cycles rotate through them, per model key."""
    store = (await edges()).leases
    candidates = cands(("x", 1, 0), ("y", 1, 0), ("z", 1, 0))
    order = []
    for _ in range(6):
        grant = await take(store, "m", candidates)
        order.append(grant.provider_id)
        assert await store.release(grant.lease_id)
    assert order == ["x", "y", "z", "x", "y", "z"]
    # Another model key has its own rotation; positions are the configured ones.
    other = [
        dataclasses.replace(c, position=p) for c, p in zip(candidates[1:], (1, 2), strict=True)
    ]
    first = await take(store, "other", other, ring_size=3)
    assert first.provider_id == "y"


@pytest_twisted.ensureDeferred
async def test_capacity_never_exceeded_across_two_edges(edges: Connect) -> None:
    """
    100 concurrent acquires from two Edges' stores grant exactly the capacity; then workers on
    both churn acquire/hold/release and never hold more than the capacity at once.
    """
    a, b = (await edges("edge-a")).leases, (await edges("edge-b")).leases
    candidates = cands(("p", 4, 0), ("q", 3, 1))
    burst = [
        (a if i % 2 else b).acquire("m", candidates, "edge-a" if i % 2 else "edge-b", TTL_MS)
        for i in range(100)
    ]
    results = await DeferredList(burst, fireOnOneErrback=True, consumeErrors=True)
    grants = [g for ok, g in results if g is not None]
    assert sorted(g.provider_id for g in grants).count("p") == 4
    assert sorted(g.provider_id for g in grants).count("q") == 3
    assert len({g.lease_id for g in grants}) == 7
    assert {g.lease_id.split(":")[0] for g in grants} <= {"edge-a", "edge-b"}
    assert await a.in_flight(["p", "q"]) == {"p": (4, 0), "q": (3, 0)}
    released = await DeferredList([(a, b)[i % 2].release(g.lease_id) for i, g in enumerate(grants)])
    assert all(ok and value for ok, value in released)
    assert await b.in_flight(["p", "q"]) == {"p": (0, 0), "q": (0, 0)}

    # Churn. A holder's observed interval (grant seen → release sent) lies inside its real one,
    # so if observed intervals overlap more than the capacity, real ones did too.
    rng = random.Random(16)
    intervals: dict[str, list[tuple[float, float]]] = {"p": [], "q": []}
    served = {"edge-a": 0, "edge-b": 0}

    async def worker(store: RedisLeaseStore, edge_id: str) -> None:
        for _ in range(8):
            grant = await store.acquire("m", candidates, edge_id, TTL_MS)
            if grant is None:
                await sleep(rng.uniform(0.001, 0.005))
                continue
            start = time.monotonic()
            await sleep(rng.uniform(0.001, 0.01))
            intervals[grant.provider_id].append((start, time.monotonic()))
            served[edge_id] += 1
            assert await store.release(grant.lease_id)

    await DeferredList(
        [ensureDeferred(worker((a, b)[i % 2], f"edge-{'ab'[i % 2]}")) for i in range(24)],
        fireOnOneErrback=True,
        consumeErrors=True,
    )
    for provider, capacity in (("p", 4), ("q", 3)):
        events = sorted(
            [(s, 1) for s, _ in intervals[provider]] + [(e, -1) for _, e in intervals[provider]]
        )
        held = peak = 0
        for _, step in events:
            held += step
            peak = max(peak, held)
        assert 0 < peak <= capacity, (provider, peak)
    assert served["edge-a"] > 0 and served["edge-b"] > 0, served
    assert await a.in_flight(["p", "q"]) == {"p": (0, 0), "q": (0, 0)}


@pytest_twisted.ensureDeferred
async def test_long_context(edges: Connect) -> None:
    """A long request holds a normal and a long slot; the long cap applies only to long ones."""
    store = (await edges()).leases
    wide = [Candidate("p", capacity=3, long_capacity=1)]
    first = await take(store, "m", wide, long_context=True)
    assert first.long
    assert await store.acquire("m", wide, "edge-a", TTL_MS, long_context=True) is None
    short = await take(store, "m", wide)
    assert not short.long
    assert await store.in_flight(["p"]) == {"p": (2, 1)}
    assert await store.release(first.lease_id)
    assert (await take(store, "m", wide, long_context=True)).long
    # long_capacity 0: no separate cap, the lease still counts as long.
    uncapped = [Candidate("u", capacity=2)]
    assert (await take(store, "m", uncapped, long_context=True)).long
    assert (await take(store, "m", uncapped, long_context=True)).long
    assert await store.in_flight(["u"]) == {"u": (2, 2)}
    # Per candidate: long on one (whose long slot is full), not on the other.
    mixed = [Candidate("p", capacity=9, long_capacity=1, long=True), Candidate("s", capacity=1)]
    grant = await take(store, "mixed", mixed)
    assert (grant.provider_id, grant.long) == ("s", False)


@pytest_twisted.ensureDeferred
async def test_release_exactly_once(edges: Connect) -> None:
    a, b = (await edges("edge-a")).leases, (await edges("edge-b")).leases
    candidates = [Candidate("p", capacity=1, long_capacity=1)]
    grant = await take(a, "m", candidates, long_context=True)
    # Only the lease id is needed, from any Edge; the second release changes nothing.
    assert await b.release(grant.lease_id) is True
    assert await a.release(grant.lease_id) is False
    assert await a.release("edge-a:999999") is False
    assert await a.in_flight(["p"]) == {"p": (0, 0)}
    again = await take(b, "m", candidates, long_context=True, edge_id="edge-b")
    assert await a.release(grant.lease_id) is False
    assert await a.in_flight(["p"]) == {"p": (1, 1)}
    assert await a.release(again.lease_id) is True


@pytest_twisted.ensureDeferred
async def test_renew_keeps_a_lease_and_ttl_expiry_frees_capacity(edges: Connect) -> None:
    store = (await edges()).leases
    candidates = [Candidate("p", capacity=1, long_capacity=1)]
    grant = await store.acquire("m", candidates, "edge-a", 500, long_context=True)
    assert grant is not None
    for _ in range(10):  # 1 s: twice the TTL, renewed every 100 ms
        await sleep(0.1)
        assert await store.renew([grant.lease_id, "edge-a:0"], 500) == {grant.lease_id}
    assert await store.in_flight(["p"]) == {"p": (1, 1)}
    assert await store.acquire("m", candidates, "edge-a", 500) is None
    # No more renewals (the Edge died): within the TTL the slot is free again.
    await sleep(0.7)
    assert await store.in_flight(["p"]) == {"p": (0, 0)}
    assert await store.renew([grant.lease_id], 500) == frozenset()
    assert await store.release(grant.lease_id) is False
    short = await store.acquire("m", candidates, "edge-a", 200)
    assert short is not None
    assert await store.acquire("m", candidates, "edge-a", 200) is None
    await sleep(0.3)
    assert await store.acquire("m", candidates, "edge-a", 200) is not None
    assert await store.release(short.lease_id) is False


@pytest_twisted.ensureDeferred
async def test_flushed_scripts_are_loaded_again(edges: Connect, redis_server: RedisServer) -> None:
    store = (await edges()).leases
    candidates = [Candidate("p", capacity=2)]
    grant = await take(store, "m", candidates)
    admin = await raw(redis_server)
    try:
        await admin.script_flush()
        second = await take(store, "m", candidates)
        await admin.script_flush()
        assert await store.release(grant.lease_id)
        await admin.script_flush()
        assert await store.renew([second.lease_id], TTL_MS) == {second.lease_id}
        await admin.script_flush()
        assert await store.in_flight(["p"]) == {"p": (1, 0)}
    finally:
        await admin.disconnect()


@pytest_twisted.ensureDeferred
async def test_keys_namespaced_in_the_configured_db(
    edges: Connect, redis_server: RedisServer
) -> None:
    store = (await edges(db=3, key_prefix="prod")).leases
    grant = await take(store, "m", [Candidate("p", capacity=1)], long_context=True)
    admin = await raw(redis_server, db=3)
    try:
        keys = sorted(await admin.keys("*"))
        assert keys == sorted(
            [
                "{prod}:held:p",
                "{prod}:long:p",
                f"{{prod}}:lease:{grant.lease_id}",
                "{prod}:rr:m",
                "{prod}:seq",
                "{prod}:epoch",
            ]
        )
        await admin.select(0)
        assert await admin.keys("*") == []
    finally:
        await admin.disconnect()


async def within(seconds: float, d: Deferred[Any]) -> BaseException:
    """The exception ``d`` fails with, which must come within ``seconds`` (not a hang)."""
    started = time.monotonic()
    try:
        await d
    except Exception as e:
        assert time.monotonic() - started < seconds
        return e
    raise AssertionError("expected a failure")


async def served_again(store: RedisLeaseStore, ttl_ms: int = TTL_MS) -> float:
    """Seconds until an acquire succeeds again (retried every 50 ms, as new requests would; a
    table lost with its Redis grants nothing for one TTL)."""
    started = time.monotonic()
    while time.monotonic() - started < 10:
        try:
            grant = await store.acquire("again", [Candidate("r", 1)], "edge-a", ttl_ms)
        except ClusterUnavailable:
            await sleep(0.05)
            continue
        if grant is None:
            await sleep(0.05)
            continue
        assert await store.release(grant.lease_id)
        return time.monotonic() - started
    raise AssertionError("Redis is back but the store does not serve")


@pytest_twisted.ensureDeferred
async def test_redis_stopped_then_back(edges: Connect, redis_server: RedisServer) -> None:
    """Stopped: ClusterUnavailable at once, not a hang; back: served again within seconds."""
    conn = await edges()
    candidates = [Candidate("p", capacity=1)]
    redis_server.stop()
    await sleep(0.1)
    error = await within(1.0, conn.leases.acquire("m", candidates, "edge-a", TTL_MS))
    assert isinstance(error, ClusterUnavailable)
    assert redis_server.password not in str(error)
    error = await within(1.0, conn.leases.release("edge-a:1"))
    assert isinstance(error, ClusterUnavailable)
    redis_server.start()
    # Back empty: the table recovers for one TTL (500 ms here) before it grants.
    assert await served_again(conn.leases, ttl_ms=500) < 3.5


@pytest_twisted.ensureDeferred
async def test_lost_table_recovers_held_leases_first(
    edges: Connect, redis_server: RedisServer
) -> None:
    """Redis restarted empty: nothing is granted for one TTL while renewals re-assert the
    leases Edges still hold; then grants resume, counting those leases."""
    conn = await edges()
    store = conn.leases
    candidates = [Candidate("p", capacity=1)]
    owners = {}
    grant = await store.acquire("m", candidates, "edge-a", 1000)
    assert grant is not None
    owners[grant.lease_id] = ("p", False)
    redis_server.stop()
    redis_server.start()
    await conn.when_connected(5)
    while True:  # the connection may need a moment to notice it was lost and come back
        try:
            renewed = await store.renew([grant.lease_id], 1000, owners=owners, edge_id="edge-a")
            break
        except ClusterUnavailable:
            await sleep(0.05)
    assert renewed == {grant.lease_id}
    assert await store.in_flight(["p"]) == {"p": (1, 0)}
    assert await store.acquire("m", candidates, "edge-b", 1000) is None
    assert store.recovering
    await sleep(0.6)
    assert await store.renew([grant.lease_id], 1000, owners=owners, edge_id="edge-a") == {
        grant.lease_id
    }
    await sleep(0.5)
    # Recovered: an ordinary full table (the re-asserted lease holds the one slot).
    assert await store.acquire("m", candidates, "edge-b", 1000) is None
    assert not store.recovering
    # After the recovery a lost lease is not re-asserted any more.
    assert await store.renew(["edge-a:404"], 1000, owners={"edge-a:404": ("p", False)}) == set()
    assert await store.release(grant.lease_id) is True
    assert await store.acquire("m", candidates, "edge-b", 1000) is not None


@pytest_twisted.ensureDeferred
async def test_fresh_table_waits_one_ttl(edges: Connect) -> None:
    store = (await edges(fresh=True)).leases
    started = time.monotonic()
    assert await store.acquire("m", [Candidate("p", 1)], "edge-a", 300) is None
    assert await served_again(store, ttl_ms=300) >= 0.2
    assert time.monotonic() - started < 2


@pytest_twisted.ensureDeferred
async def test_redis_hung_times_out(edges: Connect, redis_server: RedisServer) -> None:
    """A server that answers nothing: ClusterUnavailable after the store's timeout."""
    conn = await edges(timeout=0.5)
    redis_server.pause()
    try:
        error = await within(2.0, conn.leases.acquire("m", [Candidate("p", 1)], "e", TTL_MS))
        assert isinstance(error, ClusterUnavailable)
        assert "0.5s" in str(error)
    finally:
        redis_server.resume()
    # The hung connection was dropped; a new one serves within a few reconnect delays.
    assert await served_again(conn.leases) < 3.0


@pytest_twisted.ensureDeferred
async def test_calls_run_after_their_edge_gave_up_change_nothing(
    edges: Connect, redis_server: RedisServer
) -> None:
    """
    A hung Redis runs what it was sent once it answers again. An acquire and a renewal its Edge
    gave up on (timed out) then grant and extend nothing: they carry a deadline in Redis's
    time. (Before, the acquire granted a lease no Edge held, its slot blocked for a TTL.)
    """
    conn = await edges(timeout=0.5)
    store = conn.leases
    await store.view("edge-a", {}, ["p"], 5000)  # the clocks' offset, measured
    assert store.offset_ms is not None and abs(store.offset_ms) < 1000
    held = await store.acquire("m", cands(("p", 2, 0)), "edge-a", 5000)
    assert held is not None
    taken = time.monotonic()
    redis_server.pause()
    try:
        for call in (
            store.acquire("m", cands(("p", 2, 0)), "edge-a", 60_000),
            store.renew([held.lease_id], 60_000),
        ):
            assert isinstance(await within(2.0, call), ClusterUnavailable)
        await sleep(0.5)  # past the calls' deadline
    finally:
        redis_server.resume()
    assert await served_again(store) < 3.0
    # Only the lease taken before the hang (no grant from the late acquire)...
    assert await store.in_flight(["p"]) == {"p": (1, 0)}
    # ...expiring at its own TTL (the late renewal did not extend it to 60 s).
    await sleep(max(0.0, 5.3 - (time.monotonic() - taken)))
    assert await store.in_flight(["p"]) == {"p": (0, 0)}


@pytest_twisted.ensureDeferred
async def test_wrong_password_is_unavailable(redis_server: RedisServer) -> None:
    config = ClusterConfig(
        redis=f"unix://{redis_server.socket}", edge_id="edge-a", password=Secret("wrong")
    )
    conn = connect(config, reactor, timeout=0.5)
    try:
        error = await within(3.0, conn.when_connected(1))
        assert isinstance(error, ClusterUnavailable)
        assert "refused this Edge" in str(error) and "WRONGPASS" in str(error)
        assert "wrong" not in str(error).replace("WRONGPASS", "")
        assert conn.refused is not None
        error = await within(1.0, conn.leases.acquire("m", [Candidate("p", 1)], "x", TTL_MS))
        assert isinstance(error, ClusterUnavailable)
    finally:
        await conn.close()
