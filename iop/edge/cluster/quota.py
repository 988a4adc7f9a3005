# -*- test-case-name: iop.test.edge.cluster.test_quota,tests.test_cluster_quota -*-
"""
The quota table of an Edge in a cluster (:class:`ClusterQuotaTable`, an
:class:`~iop.edge.quota.table.IQuotaTable`): every key's and team's counters live on the
cluster's Redis, so a limit or budget is exact across every Edge — the in-process table's rules
(:mod:`iop.edge.quota`) applied by one server-side script per operation
(:mod:`~iop.edge.cluster.quota_scripts`, whose docstring is the data model).

Round trips
    One per admission (every subject of the request in one script call), one per end (settle
    or release), and, for the reservations running, one renewal call every third of the TTL
    for all of them together.

Concurrency slots and their TTL
    A reservation's slot lives ``cluster.lease_ttl_sec`` from its admission or renewal; this
    Edge renews every slot it holds every third of that (the lease table's rule, with its
    deadline check every tenth of the TTL and a failed renewal tried again as soon as Redis is
    back). An Edge that dies frees its slots within the TTL. Its reservations' budget and
    window entries stay charged at their worst case: the record a settle needs expires with the
    slot, so nothing is ever counted as less than it may have used. A slot not confirmed renewed
    in time (Redis unreachable for most of a TTL) or no longer in the table is *lost*: counted
    (:attr:`ClusterQuotaTable.lost`) and its holder told
    (:meth:`~iop.edge.quota.table.Reservation.when_lost`), since another Edge may now admit in
    its place.

Failure (fail closed)
    Redis unreachable: every reservation fails at once with
    :class:`~iop.edge.quota.model.QuotaUnavailable` (503 ``cluster_unavailable``), never an
    unlimited request. A settle Redis cannot take is not retried: its record expires with the
    slot, so the worst case stays charged.

Redis must keep the counters: a Redis that loses them (restarted without persistence, an
empty replica, a flush) starts every window, concurrency count and budget total from zero.
The windows and concurrency refill within a minute and a TTL; a budget's period does not — the
ledger (the per-Edge record of what was used) is the account to check it against.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.quota_scripts import RENEW, RESERVE, SETTLE, SNAPSHOT
from iop.edge.cluster.scripts import Script
from iop.edge.quota.model import (
    WINDOW_SEC,
    BudgetUse,
    Charge,
    Demand,
    QuotaUnavailable,
    Refused,
    Snapshot,
    SubjectLimits,
)
from iop.edge.quota.table import IQuotaTable, Reservation

__all__ = ["ClusterQuotaTable", "ScriptRunner"]

# A slot not confirmed renewed until this share of the TTL before it would expire is lost.
DEADLINE_MARGIN = 0.1


class ScriptRunner(Protocol):
    """What the table needs of the cluster's store
    (:class:`~iop.edge.cluster.leases.RedisLeaseStore`): its keys, deadlines and script calls."""

    def key(self, *parts: str) -> str: ...

    def deadline(self) -> int: ...

    def run(self, script: Script, keys: list[str], args: list[Any]) -> Deferred[Any]: ...


@implementer(IQuotaTable)
class ClusterQuotaTable:
    """The quota table of one Edge of a cluster; see the module docstring."""

    log = Logger()

    def __init__(
        self,
        store: ScriptRunner,
        clock: IReactorTime,
        *,
        edge_id: str,
        ttl_sec: float,
        window_sec: float = WINDOW_SEC,
    ) -> None:
        self._store = store
        self._clock = clock
        self._edge_id = edge_id
        self._ttl_ms = max(1, int(ttl_sec * 1000))
        self._window_ms = max(1, int(window_sec * 1000))
        self._q = store.key("quota", "")
        # Reservations running here, by id, and the local time until which each one's slot is
        # known held (asked at + TTL).
        self._held: dict[str, Reservation] = {}
        self._confirmed: dict[str, float] = {}
        self._renewing = False
        self._renew_failed = False
        self._loops: list[LoopingCall] = []
        #: Concurrency slots lost: not confirmed renewed in time, or gone from the table.
        self.lost = 0
        #: Settles Redis did not take (their worst case stays charged).
        self.unsettled = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start renewing the slots held here and checking their deadlines."""
        ttl = self._ttl_ms / 1000
        for call, interval in (
            (self._renew, ttl / 3),
            (self._check_deadlines, ttl * DEADLINE_MARGIN),
        ):
            loop = LoopingCall(call)
            loop.clock = self._clock
            loop.start(interval, now=False).addErrback(
                lambda f: self.log.failure("quota: a periodic task failed", f)
            )
            self._loops.append(loop)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()

    def reconnected(self) -> None:
        """A connection to Redis is up again: renew now if the last renewal failed."""
        if self._renew_failed:
            self._renew()

    @property
    def running(self) -> int:
        """Reservations held here, not yet ended."""
        return len(self._held)

    # -- IQuotaTable ---------------------------------------------------------------------------

    def reserve(self, subjects: Sequence[SubjectLimits], demand: Demand) -> Deferred[Reservation]:
        asked_at = self._clock.seconds()
        packed = [
            [
                s.subject,
                s.limits.requests_per_minute or 0,
                s.limits.tokens_per_minute or 0,
                s.limits.concurrent_requests or 0,
                [[b.period, b.tokens or 0, b.cost_micros or 0] for b in s.budgets],
            ]
            for s in subjects
        ]
        args = [
            self._q,
            self._edge_id,
            self._ttl_ms,
            self._window_ms,
            demand.tokens,
            -1 if demand.cost_micros is None else demand.cost_micros,
            json.dumps(packed, separators=(",", ":")),
            self._store.deadline(),
        ]
        try:
            d = self._store.run(RESERVE, [self._q + "seq"], args)
        except Exception:
            d = fail()
        return d.addCallbacks(
            self._reserved,
            _unavailable,
            callbackArgs=(subjects, demand, asked_at),
        )

    def _reserved(
        self, reply: Any, subjects: Sequence[SubjectLimits], demand: Demand, asked_at: float
    ) -> Reservation:
        if reply == -2:
            raise QuotaUnavailable()
        words = _text(reply).split(" ")
        if words[0] == "NO":
            raise _refused(words, subjects)
        reservation = Reservation(words[1], [s.subject for s in subjects], demand, self._ended)
        self._held[reservation.id] = reservation
        self._confirmed[reservation.id] = asked_at + self._ttl_ms / 1000
        return reservation

    def snapshot(self, subject: SubjectLimits) -> Deferred[Snapshot]:
        args: list[Any] = [self._q, subject.subject, self._window_ms]
        args += [b.period for b in subject.budgets]
        d = self._store.run(SNAPSHOT, [self._q + "seq"], args)
        return d.addCallbacks(_snapshot, _unavailable, callbackArgs=(subject,))

    # -- ends ----------------------------------------------------------------------------------

    def _ended(self, reservation: Reservation, charge: Charge) -> None:
        self._held.pop(reservation.id, None)
        self._confirmed.pop(reservation.id, None)
        cost = -1 if charge.cost_micros is None else charge.cost_micros
        args = [self._q, reservation.id, charge.tokens, cost]
        try:
            d = self._store.run(SETTLE, [self._q + "res:" + reservation.id], args)
        except Exception:
            d = fail()
        d.addCallbacks(self._settled, self._not_settled, errbackArgs=(reservation,))

    def _settled(self, done: Any) -> None:
        pass

    def _not_settled(self, failure: Failure, reservation: Reservation) -> None:
        self.unsettled += 1
        if not failure.check(ClusterUnavailable):
            self.log.failure("quota: settling {id} failed", failure, id=reservation.id)

    # -- renewal -------------------------------------------------------------------------------

    def _renew(self) -> Deferred[None] | None:
        ids = list(self._held)
        if not ids or self._renewing:
            return None
        self._renewing = True
        sent = self._clock.seconds()
        keys = [self._q + "res:" + i for i in ids]
        args = [self._q, self._ttl_ms, "\n".join(ids), self._store.deadline()]
        try:
            d = self._store.run(RENEW, keys, args)
        except Exception:
            d = fail()
        return d.addCallbacks(self._renewed, self._renewal_failed, callbackArgs=(ids, sent))

    def _renewal_failed(self, failure: Failure) -> None:
        self._renewing = False
        self._renew_failed = True
        if not failure.check(ClusterUnavailable):
            self.log.failure("quota: renewal failed", failure)

    def _renewed(self, flags: Any, ids: list[str], sent: float) -> None:
        self._renewing = False
        if flags == -2:
            self._renew_failed = True
            return
        self._renew_failed = False
        until = sent + self._ttl_ms / 1000
        for reservation_id, ok in zip(ids, flags, strict=True):
            if reservation_id not in self._held:
                continue  # ended meanwhile
            if int(ok):
                self._confirmed[reservation_id] = until
            else:
                self._lose(reservation_id, "the table no longer had it")

    def _check_deadlines(self) -> Deferred[None] | None:
        margin = self._ttl_ms / 1000 * DEADLINE_MARGIN
        now = self._clock.seconds()
        for reservation_id, until in list(self._confirmed.items()):
            if now >= until - margin:
                self._lose(reservation_id, "its renewal could not be confirmed in time")
        if self._renew_failed:
            return self._renew()
        return None

    def _lose(self, reservation_id: str, why: str) -> None:
        reservation = self._held.get(reservation_id)
        self._confirmed.pop(reservation_id, None)
        if reservation is None or reservation.lost:
            return
        self.lost += 1
        self.log.warn(
            "quota: reservation {id} lost its concurrency slot ({why}): its request is ended, "
            "since another may be admitted in its place",
            id=reservation_id,
            why=why,
        )
        reservation.lose()


def _unavailable(failure: Failure) -> Failure:
    if failure.check(ClusterUnavailable):
        return Failure(QuotaUnavailable())
    return failure


def _refused(words: list[str], subjects: Sequence[SubjectLimits]) -> Refused:
    _, kind, index, limit, remaining, retry, reset, period, unit = words
    return Refused(
        subjects[int(index) - 1].subject,
        kind,
        limit=int(limit),
        remaining=int(remaining),
        retry_after_sec=None if retry == "-1" else int(retry) / 1000,
        reset_after_sec=None if reset == "-1" else int(reset) / 1000,
        period=None if period == "-" else period,
        unit="" if unit == "-" else unit,
    )


def _snapshot(reply: Any, subject: SubjectLimits) -> Snapshot:
    words = _text(reply).split(" ")
    _, concurrent, requests, tokens = (int(w) for w in words[:4])
    uses = []
    for i, budget in enumerate(subject.budgets):
        start, end, used_tokens, used_cost = words[4 + 4 * i : 8 + 4 * i]
        uses.append(
            BudgetUse(
                budget,
                int(start) / 1000,
                None if end == "-1" else int(end) / 1000,
                int(used_tokens),
                int(used_cost),
            )
        )
    return Snapshot(subject.subject, concurrent, requests, tokens, tuple(uses))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
