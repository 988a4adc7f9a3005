# -*- test-case-name: tests.test_bench -*-
"""
The cost of the client pipeline's admit stage for per-key limits and budgets
(:mod:`iop.edge.quota`), per request: what an Edge spends reserving a request's worst case and
settling its usage, in process and on a cluster's Redis.

Each request is the pipeline's own sequence (:meth:`~iop.edge.ingress.pipeline.Pipeline.generate`):
its worst case (:func:`~iop.edge.ingress.limits.demand_of`: 500 prompt tokens + 1000 max output
tokens at a priced model), ``QuotaGate.reserve``, then ``Reservation.end`` with the charge of the
usage it reported (:func:`~iop.edge.ingress.limits.charge_of`: 500 in, of which 200 cached,
300 out), dispatched. The limited key has every kind of limit (requests and tokens per minute,
concurrent requests, a daily token budget and a monthly cost budget) and a team with its own
(the same three limits, a monthly cost budget and a total token budget): two subjects per
request. The limits are high enough that nothing is refused, and nothing is: a refusal fails
the measurement; every key's concurrency is back to zero at the end.

In process (:class:`~iop.edge.quota.InProcessQuotaTable` on the wall clock, as the reactor's,
no reactor running: its answers are already-fired Deferreds): µs of process CPU per admit +
settle, the median of five passes of N each (the variants interleaved), for the key with its
team, the same key without a team, and a key without limits (the gate's fast path: nothing is
counted, the table is not asked).

On Redis (:class:`~iop.edge.cluster.quota.ClusterQuotaTable`, as ``cluster:`` builds it, over a
private ``redis-server`` on a unix socket, :func:`bench.multiedge.start_redis`): a worker process
(``python -m bench.quota --redis-worker``, the "Edge": its own reactor, so its process CPU is
the Edge side's alone) runs, after a warm-up that loads the scripts,

- a bare round trip (a no-op script on the same connection): the transport's floor;
- the key without limits: must make no Redis call at all;
- the limited key at each concurrency level (1, then ``--levels``, default 10 and 50): c
  requests in flight, each reserve → end → its settle answered, then the next. Per request:
  wall-clock latency of the admission (reserve sent → reservation in hand) and of the whole
  request (→ settle answered), p50 and p99; requests per second; the Edge's process CPU and
  redis-server's (``/proc``, clock ticks: coarse for a few hundred requests); and the store's
  script calls, counted in the store the table runs on: exactly one ``quota_reserve`` and one
  ``quota_settle`` per request, which the run asserts (one round trip added at admission, one
  at the end). The slots' periodic renewal (one call every third of the TTL for every slot held)
  is counted apart: it is not per request.

M requests per phase, split over ``--rounds`` (3) passes over every phase, so that the load of
a shared machine hits all alike: latencies pooled over the rounds, requests per second and CPU
per request the median of the rounds'.

Decided here: a request's settle is awaited before that request's "worker" admits the next (an
Edge does not wait for it; here it makes c the number of requests whose round trips are in
flight, and the throughput the conservative one). The key's concurrency limit is the highest
level, so the last level runs at its limit without crossing it. The windows hold every admission
of the run (all within a minute): the Redis logs grow to a few thousand entries, as a busy key's
do.

``python -m bench.quota [--iterations N] [--redis-iterations M] [--rounds R] [--levels 10,50]``
prints the JSON; :func:`measure` is what :mod:`bench.run` records as ``quota_cost`` (the Redis
half skipped, with the reason, when ``redis-server`` is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from twisted.internet.defer import Deferred, FirstError, ensureDeferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from bench.loadgen import percentile
from bench.procs import BenchError, Children, cpu_seconds
from iop.config.model import (
    Budget,
    ClientAPIConfig,
    ClientKey,
    ClusterConfig,
    Limits,
    ModelConfig,
    NodeToken,
    Price,
    Secret,
    Team,
)
from iop.edge.cluster.scripts import Script
from iop.edge.ingress.limits import charge_of, demand_of
from iop.edge.quota import QuotaGate
from iop.runtime.events import Usage

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LEVELS = (10, 50)
PASSWORD_ENV = "BENCH_REDIS_PASSWORD"

# One request: its counted prompt and max_tokens (the worst case reserved), and the usage its
# provider reported (the charge settled). At 3 / 15 per million in and out (cached 0.3).
PROMPT_TOKENS = 500
MAX_OUTPUT_TOKENS = 1000
USAGE = Usage(input_tokens=500, output_tokens=300, cached_input_tokens=200)
MODEL = ModelConfig(
    "bench-model",
    providers=(),
    price=Price(
        input=3_000_000,
        output=15_000_000,
        cached_input=300_000,
        cache_write=3_750_000,
        reasoning=15_000_000,
    ),
)
# High enough that a run admits everything (the windows keep a minute of admissions).
RPM = 1_000_000
TPM = 10_000_000_000
BIG = 10**15

TEAM = "bench-team"
KEYS = {
    # variant → key name
    "key + team": "bench-limited",
    "key alone": "bench-solo",
    "no limits": "bench-free",
}
LIMITED = "key + team"
UNLIMITED = "no limits"
NOOP = Script("bench_noop", "return 1")


def client_config(concurrency: int) -> ClientAPIConfig:
    """The keys of the run: limited with a team, limited alone, unlimited (module docstring)."""
    limits = Limits(RPM, TPM, concurrency)
    budgets = (Budget("day", tokens=BIG), Budget("month", cost_micros=BIG))
    team = Team(
        TEAM,
        limits,
        (Budget("month", cost_micros=BIG), Budget("total", tokens=BIG)),
    )

    def key(name: str, **kwargs: Any) -> ClientKey:
        return ClientKey(name, NodeToken.from_plaintext(f"sk-{name}"), **kwargs)

    return ClientAPIConfig(
        keys=(
            key(KEYS[LIMITED], team=TEAM, limits=limits, budgets=budgets),
            key(KEYS["key alone"], limits=limits, budgets=budgets),
            key(KEYS[UNLIMITED]),
        ),
        teams=(team,),
    )


def key_of(config: ClientAPIConfig, variant: str) -> ClientKey:
    name = KEYS[variant]
    return next(k for k in config.keys if k.name == name)


def _ms(values: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of ``values`` (seconds) in milliseconds."""
    return {f"p{q}": round(percentile(values, q) * 1000, 3) for q in (50, 99)}


# -- in process ---------------------------------------------------------------------------------


class WallClock:
    """The reactor's clock without a reactor (all the in-process table asks of it): the harness
    process never installs one."""

    def seconds(self) -> float:
        return time.time()


async def _pairs(gate: QuotaGate, key: ClientKey, count: int) -> None:
    """``count`` requests' admit + settle, one after the other, as the pipeline runs them."""
    for _ in range(count):
        demand = demand_of(PROMPT_TOKENS, MAX_OUTPUT_TOKENS, MODEL)
        reservation = await gate.reserve(key, demand)
        reservation.end(charge_of(USAGE, MODEL), dispatched=True)


def _run_now(d: Deferred[Any]) -> None:
    """Wait for an in-process run: it never waits on anything, so it has ended (or failed)."""
    failures: list[Failure] = []
    d.addErrback(failures.append)
    if failures:
        raise BenchError(f"quota (in process): {failures[0].getErrorMessage()}")
    if not d.called:
        raise BenchError("quota (in process): the run waited on something")


def in_process(iterations: int, passes: int = 5) -> list[dict[str, Any]]:
    """Per variant: µs of process CPU per admit + settle, the median of ``passes`` (the
    variants interleaved in each pass, so that drift hits all alike)."""
    from iop.edge.quota import InProcessQuotaTable

    config = client_config(max(DEFAULT_LEVELS))
    runs = []
    for variant in KEYS:
        table = InProcessQuotaTable(cast(IReactorTime, WallClock()))
        gate = QuotaGate(config, table)
        key = key_of(config, variant)
        _run_now(ensureDeferred(_pairs(gate, key, min(iterations, 200))))  # warm-up
        runs.append((variant, table, gate, key, list[float]()))
    for _ in range(passes):
        for _, _, gate, key, spent in runs:
            started = time.process_time()
            _run_now(ensureDeferred(_pairs(gate, key, iterations)))
            spent.append(time.process_time() - started)
    rows: list[dict[str, Any]] = []
    for variant, table, gate, key, spent in runs:
        if table.running:
            raise BenchError(f"quota (in process): {table.running} reservations never ended")
        rows.append(
            {
                "variant": variant,
                "subjects": len(gate.subjects(key)),
                "iterations": iterations,
                "passes": passes,
                "cpu_us": round(statistics.median(spent) / iterations * 1e6, 2),
                "cpu_us_min": round(min(spent) / iterations * 1e6, 2),
            }
        )
    return rows


# -- on Redis: the worker (the "Edge") ----------------------------------------------------------


class CountingStore:
    """
    The cluster's store as the quota table sees it
    (:class:`~iop.edge.cluster.quota.ScriptRunner`), counting its script calls by name and
    telling when each one is answered (:attr:`last`: the call just made).
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: dict[str, int] = {}
        self.last: Deferred[None] = Deferred()

    def key(self, *parts: str) -> str:
        return str(self._store.key(*parts))

    def deadline(self) -> int:
        return int(self._store.deadline())

    def run(self, script: Script, keys: list[str], args: list[Any]) -> Deferred[Any]:
        self.calls[script.name] = self.calls.get(script.name, 0) + 1
        answered: Deferred[None] = Deferred()
        self.last = answered

        def seen(result: Any) -> Any:
            answered.callback(None)
            return result

        d: Deferred[Any] = self._store.run(script, keys, args)
        return d.addBoth(seen)


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


@dataclass
class _Sample:
    """One round of one phase: its requests' latencies and what it cost."""

    admits: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0
    redis_cpu: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)


def _summary(concurrency: int, samples: list[_Sample], redis_measured: bool) -> dict[str, Any]:
    """A phase's rounds together: latencies pooled, the rest per round then the median."""
    count = sum(len(s.totals) for s in samples)
    calls: dict[str, int] = {}
    for sample in samples:
        for name, n in sample.calls.items():
            calls[name] = calls.get(name, 0) + n
    per_request = calls.get("quota_reserve", 0) + calls.get("quota_settle", 0)

    def median_us(value: Callable[[_Sample], float]) -> float:
        return round(statistics.median(value(s) / len(s.totals) for s in samples) * 1e6, 1)

    return {
        "concurrency": concurrency,
        "requests": count,
        "rounds": len(samples),
        "rps": round(statistics.median(len(s.totals) / max(s.wall, 1e-9) for s in samples), 1),
        "admit_ms": _ms([t for s in samples for t in s.admits]),
        "request_ms": _ms([t for s in samples for t in s.totals]),
        "edge_cpu_us": median_us(lambda s: s.cpu),
        "redis_cpu_us": median_us(lambda s: s.redis_cpu) if redis_measured else None,
        "calls": calls,
        "calls_per_request": round(per_request / max(count, 1), 3),
    }


def shares(total: int, rounds: int) -> list[int]:
    """``total`` requests split over ``rounds`` (at least one each)."""
    rounds = max(1, min(rounds, total))
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


async def _redis_run(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    from iop.edge.cluster.quota import ClusterQuotaTable
    from iop.edge.cluster.redis import connect

    levels: list[int] = args.levels
    config = ClusterConfig(
        redis=f"unix://{args.redis_worker}",
        edge_id="bench-edge",
        password=Secret(os.environ[PASSWORD_ENV]),
        key_prefix="bench-quota",
    )
    conn = connect(config, reactor)
    await conn.when_connected(10)
    store = CountingStore(conn.leases)
    table = ClusterQuotaTable(store, reactor, edge_id=config.edge_id, ttl_sec=config.lease_ttl_sec)
    conn.when_each_connected(table.reconnected)
    table.start()
    clients = client_config(max(levels))
    gate = QuotaGate(clients, table)
    limited, free = key_of(clients, LIMITED), key_of(clients, UNLIMITED)
    iterations: int = args.iterations
    out: dict[str, Any] = {"ttl_sec": config.lease_ttl_sec, "subjects": len(gate.subjects(limited))}
    redis_pid: int = args.redis_pid

    def redis_cpu() -> float:
        return cpu_seconds(redis_pid) if redis_pid else 0.0

    async def request(key: ClientKey, sample: _Sample) -> None:
        sent = time.perf_counter()
        reservation = await gate.reserve(key, demand_of(PROMPT_TOKENS, MAX_OUTPUT_TOKENS, MODEL))
        admitted = time.perf_counter()
        reservation.end(charge_of(USAGE, MODEL), dispatched=True)
        if reservation.subjects:
            await store.last  # its settle, answered
        sample.admits.append(admitted - sent)
        sample.totals.append(time.perf_counter() - sent)

    async def round_trip(sample: _Sample) -> None:
        sent = time.perf_counter()
        await store.run(NOOP, [store.key("bench")], [])
        sample.admits.append(time.perf_counter() - sent)
        sample.totals.append(sample.admits[-1])

    async def phase(one: Callable[[_Sample], Awaitable[None]], c: int, count: int) -> _Sample:
        """``count`` of ``one``, ``c`` at a time."""
        left = [count]
        sample = _Sample()

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await one(sample)

        calls = dict(store.calls)
        cpu, redis, wall = time.process_time(), redis_cpu(), time.perf_counter()
        await gatherResults([ensureDeferred(worker()) for _ in range(c)], consumeErrors=True)
        sample.wall = time.perf_counter() - wall
        sample.cpu, sample.redis_cpu = time.process_time() - cpu, redis_cpu() - redis
        sample.calls = _delta(store.calls, calls)
        return sample

    def limited_request(sample: _Sample) -> Awaitable[None]:
        return request(limited, sample)

    def free_request(sample: _Sample) -> Awaitable[None]:
        return request(free, sample)

    try:
        # Warm-up: the scripts loaded, the connection and the interpreter warm.
        await phase(limited_request, max(levels), max(4 * max(levels), 100))
        await phase(round_trip, 1, 100)
        # The rounds: every phase in each (so that drift hits all alike), its share of requests.
        samples: dict[str, list[_Sample]] = {}
        for share in shares(iterations, args.rounds):
            samples.setdefault("round_trip", []).append(await phase(round_trip, 1, share))
            samples.setdefault("unlimited", []).append(await phase(free_request, 1, share))
            for c in [1, *levels]:
                samples.setdefault(str(c), []).append(await phase(limited_request, c, share))
        trip = _summary(1, samples["round_trip"], bool(redis_pid))
        out["round_trip"] = {
            k: trip[k] for k in ("requests", "rounds", "edge_cpu_us", "redis_cpu_us")
        } | {"ms": trip["admit_ms"]}
        out["unlimited"] = _summary(1, samples["unlimited"], bool(redis_pid))
        if out["unlimited"]["calls"]:
            raise BenchError(f"a key without limits made Redis calls: {out['unlimited']['calls']}")
        rows = []
        for c in [1, *levels]:
            row = _summary(c, samples[str(c)], bool(redis_pid))
            calls = row["calls"]
            if calls.get("quota_reserve") != iterations or calls.get("quota_settle") != iterations:
                raise BenchError(
                    f"quota on Redis at c={c}: {iterations} requests made {calls} script calls, "
                    "not one quota_reserve and one quota_settle each"
                )
            row["renewals"] = calls.get("quota_renew", 0)
            rows.append(row)
        out["levels"] = rows
        standing = await table.snapshot(gate.subjects(limited)[0])
        if standing.concurrent or table.running or table.unsettled or table.lost:
            raise BenchError(
                f"quota on Redis: after the run {standing.concurrent} slots are held, "
                f"{table.running} running, {table.unsettled} unsettled, {table.lost} lost"
            )
        out["window_requests"] = standing.requests
    finally:
        table.stop()
        await conn.close()
    return out


def redis_worker(args: argparse.Namespace) -> int:
    """The worker's process: run :func:`_redis_run` on the reactor, print its JSON, exit."""
    from twisted.internet import task

    async def main(reactor: Any) -> None:
        try:
            out = await _redis_run(reactor, args)
        except FirstError as e:
            out = {"error": f"quota on Redis: {e.subFailure.getErrorMessage()}"}
        except Exception as e:
            out = {"error": f"quota on Redis: {type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)

    task.react(lambda reactor: ensureDeferred(main(reactor)))  # exits the process
    return 0  # pragma: no cover


# -- the harness ---------------------------------------------------------------------------------


def on_redis(iterations: int, levels: Sequence[int], rounds: int = 3) -> dict[str, Any]:
    """The Redis half: a private redis-server and the worker against it (module docstring)."""
    from bench import multiedge
    from bench.systems import base_env

    children = Children()
    # A short directory: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="iop-bq-"))
    try:
        redis = multiedge.start_redis(children, root)
        argv = [
            *(sys.executable, "-m", "bench.quota", "--redis-worker", str(redis.socket)),
            *("--iterations", str(iterations), "--redis-pid", str(redis.child.pid)),
            *("--levels", ",".join(str(c) for c in levels), "--rounds", str(rounds)),
        ]
        env = {**base_env(), PASSWORD_ENV: redis.password}
        try:
            done = subprocess.run(
                argv,
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300 + iterations / 20,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"quota on Redis: the worker did not finish in {e.timeout:g} s") from e
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise BenchError(
                f"quota on Redis: the worker failed ({done.returncode}): {done.stderr[-1500:]}"
            )
        out: dict[str, Any] = json.loads(lines[-1])
        if "error" in out:
            raise BenchError(str(out["error"]))
        version = subprocess.run(
            [str(shutil.which("redis-server")), "--version"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        out["redis_version"] = next(
            (w[2:] for w in version if w.startswith("v=")), " ".join(version[:3])
        )
        return out
    finally:
        children.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def measure(
    iterations: int = 5000,
    redis_iterations: int = 2000,
    levels: Sequence[int] = DEFAULT_LEVELS,
    rounds: int = 3,
) -> dict[str, Any]:
    """
    ``in_process``: rows per variant; ``redis``: the worker's figures, or ``None`` with
    ``redis_skipped`` saying why (no ``redis-server``). Raises :class:`BenchError` when a
    request is refused or the Redis calls per request are not one reserve and one settle.
    """
    out: dict[str, Any] = {
        "request": {
            "prompt_tokens": PROMPT_TOKENS,
            "max_output_tokens": MAX_OUTPUT_TOKENS,
            "usage": USAGE.as_dict(),
        },
        "in_process": in_process(iterations),
        "redis": None,
        "redis_skipped": None,
    }
    if shutil.which("redis-server") is None:
        out["redis_skipped"] = (
            "redis-server is not installed (Debian: apt-get install redis-server)"
        )
    else:
        out["redis"] = on_redis(redis_iterations, levels, rounds)
    return out


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("expected positive integers, comma-separated")
    return list(dict.fromkeys(levels))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quota",
        description="The admit stage's cost per request for per-key limits and budgets, in "
        "process and on Redis (prints JSON).",
    )
    parser.add_argument(
        "--iterations", type=int, default=5000, help="in-process requests per pass (5000)"
    )
    parser.add_argument(
        "--redis-iterations", type=int, default=2000, help="Redis: requests per level (2000)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="Redis: rounds over the phases, requests split (3)"
    )
    parser.add_argument(
        "--levels",
        type=parse_levels,
        default=list(DEFAULT_LEVELS),
        help="Redis: concurrency levels after the sequential one (10,50)",
    )
    parser.add_argument("--redis-worker", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("--redis-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.iterations, args.redis_iterations, args.rounds) < 1:
        parser.error("iterations and rounds must be >= 1")
    if args.redis_worker:
        return redis_worker(args)
    try:
        results = measure(args.iterations, args.redis_iterations, args.levels, args.rounds)
    except BenchError as e:
        print(f"bench.quota: {e}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
