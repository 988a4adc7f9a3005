"""
An in-memory stand-in for the cluster's shared lease store (the Redis scripts' rules, on a
``task.Clock``), for the unit tests of the cluster's lease table and the pool over it. Answers
at once, or — while ``held`` — only when the test calls :meth:`MemoryTable.answer`, so tests
can act between a call and its reply.
``down`` makes every call fail with ClusterUnavailable. The scripts themselves are tested
against a real redis-server (tests/test_cluster_leases.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.leases import Candidate, ClusterView, EdgeReport, Grant


@dataclass
class _Held:
    provider_id: str
    edge_id: str
    long: bool
    expires: float


@dataclass
class MemoryTable:
    clock: Clock
    held: bool = False
    down: bool = False
    leases: dict[str, _Held] = field(default_factory=dict)
    rr: dict[str, int] = field(default_factory=dict)
    reports: dict[str, tuple[float, dict[str, int]]] = field(default_factory=dict)
    pending: list[Callable[[], None]] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    # When the recovery period ends (seconds); None: the table was lost (see restart()).
    epoch: float | None = 0.0
    # Called with the provider id of every returned slot (the wake-up channel).
    published: list[Callable[[str], None]] = field(default_factory=list)
    _seq: Any = field(default_factory=lambda: itertools.count(1))

    # -- test control --------------------------------------------------------------------------

    def answer(self, count: int | None = None) -> None:
        """Run the held calls in order — ``count`` of them, or until none is left (a call
        answered may make more)."""
        while self.pending and (count is None or count > 0):
            self.pending.pop(0)()
            if count is not None:
                count -= 1

    def restart(self) -> None:
        """Redis restarted empty: every lease, rotation and the epoch are gone."""
        self.leases.clear()
        self.rr.clear()
        self.epoch = None

    def _recovering(self, ttl_ms: int) -> bool:
        now = self.clock.seconds()
        if self.epoch is None:
            self.epoch = now + ttl_ms / 1000
            return True
        return now < self.epoch

    def in_flight(self, provider_id: str) -> int:
        self._expire()
        return sum(1 for h in self.leases.values() if h.provider_id == provider_id)

    def long_in_flight(self, provider_id: str) -> int:
        self._expire()
        return sum(1 for h in self.leases.values() if h.provider_id == provider_id and h.long)

    # -- the table -----------------------------------------------------------------------------

    def _call(self, work: Callable[[], Any]) -> Deferred[Any]:
        if self.down:
            return fail(ClusterUnavailable("the cluster's Redis is down (test)"))
        if not self.held:
            return succeed(work())
        d: Deferred[Any] = Deferred()

        def run() -> None:
            if self.down:
                d.errback(ClusterUnavailable("the cluster's Redis went away (test)"))
            else:
                d.callback(work())

        self.pending.append(run)
        return d

    def _expire(self) -> None:
        now = self.clock.seconds()
        for lease_id in [i for i, h in self.leases.items() if h.expires <= now]:
            del self.leases[lease_id]

    def acquire(
        self,
        model_key: str,
        candidates: Sequence[Candidate],
        edge_id: str,
        ttl_ms: int,
        long_context: bool = False,
        *,
        ring_size: int | None = None,
    ) -> Deferred[Grant | None]:
        def work() -> Grant | None:
            self._expire()
            if self._recovering(ttl_ms):
                return None
            positions = [
                c.position if c.position is not None else i for i, c in enumerate(candidates)
            ]
            ring = max(ring_size or 0, max(positions, default=0) + 1)
            start = self.rr.get(model_key, 0) % ring
            best: tuple[tuple[int, int, int], Candidate, int, bool] | None = None
            for c, position in zip(candidates, positions, strict=True):
                long = long_context if c.long is None else c.long
                used = self.in_flight(c.provider_id)
                room = used < c.capacity
                if room and long and c.long_capacity > 0:
                    room = self.long_in_flight(c.provider_id) < c.long_capacity
                if not room:
                    continue
                key = (used, c.priority, (position - start) % ring)
                if best is None or key < best[0]:
                    best = (key, c, position, long)
            if best is None:
                return None
            _, chosen, position, long = best
            lease_id = f"{edge_id}:{next(self._seq)}"
            expires = self.clock.seconds() + ttl_ms / 1000
            self.leases[lease_id] = _Held(chosen.provider_id, edge_id, long, expires)
            self.rr[model_key] = (position + 1) % ring
            return Grant(chosen.provider_id, lease_id, long, int(expires * 1000))

        return self._call(work)

    def renew(
        self,
        lease_ids: Sequence[str],
        ttl_ms: int,
        *,
        owners: Mapping[str, tuple[str, bool]] | None = None,
        edge_id: str = "",
    ) -> Deferred[frozenset[str]]:
        def work() -> frozenset[str]:
            self._expire()
            reassert = owners is not None and self._recovering(ttl_ms)
            expires = self.clock.seconds() + ttl_ms / 1000
            renewed = set()
            for lease_id in lease_ids:
                held = self.leases.get(lease_id)
                if held is not None:
                    held.expires = expires
                    renewed.add(lease_id)
                elif reassert and owners is not None and lease_id in owners:
                    provider, long = owners[lease_id]
                    self.leases[lease_id] = _Held(provider, edge_id, long, expires)
                    renewed.add(lease_id)
            return frozenset(renewed)

        return self._call(work)

    def release(self, lease_id: str) -> Deferred[bool]:
        def work() -> bool:
            self._expire()
            held = self.leases.pop(lease_id, None)
            if held is None:
                return False
            self.releases.append(lease_id)
            for subscriber in list(self.published):
                subscriber(held.provider_id)
            return True

        return self._call(work)

    def view(
        self,
        edge_id: str,
        queued: Mapping[str, int],
        provider_ids: Sequence[str],
        lifetime_ms: int,
    ) -> Deferred[ClusterView]:
        def work() -> ClusterView:
            now = self.clock.seconds()
            self.reports[edge_id] = (now, dict(queued))
            self.reports = {
                e: r for e, r in self.reports.items() if r[0] > now - lifetime_ms / 1000
            }
            return ClusterView(
                now_ms=int(now * 1000),
                edges=tuple(
                    EdgeReport(e, q, int((now - seen) * 1000))
                    for e, (seen, q) in sorted(self.reports.items())
                ),
                held={p: (self.in_flight(p), self.long_in_flight(p)) for p in provider_ids},
            )

        return self._call(work)
