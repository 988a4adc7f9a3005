# -*- test-case-name: iop.test.edge.quota.test_memory -*-
"""
The seam between the client pipeline and the counters it reserves against: :class:`IQuotaTable`
and the :class:`Reservation` every table returns.

A reservation is ended exactly once, by :meth:`Reservation.settle` (the work reached a provider:
its charge replaces the worst case reserved) or :meth:`Reservation.release` (it never did: only
the request itself stays counted). A second end is a bug in the caller: it changes nothing and
is logged. Whatever ends it, its concurrency slot comes back at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import Interface

from iop.edge.quota.model import Charge, Demand, Snapshot, SubjectLimits

__all__ = ["IQuotaTable", "Reservation"]

_log = Logger()

# How a table ends a reservation: (reservation, the charge to keep). ``None``: settled with
# usage unknown (the worst case stays); a release keeps Charge(0, 0).
Ender = Callable[["Reservation", Charge], None]


class Reservation:
    """
    One admitted request's hold on its subjects: a concurrency slot, an entry in each
    per-minute window (the request, and ``demand.tokens`` until settled) and ``demand`` in each
    budget's current period. ``id`` is unique in its table (in a cluster: across every Edge).
    """

    def __init__(
        self,
        reservation_id: str,
        subjects: Sequence[str],
        demand: Demand,
        end: Ender,
    ) -> None:
        self.id = reservation_id
        self.subjects = tuple(subjects)
        self.demand = demand
        self._end = end
        self._ended = False
        self._lost = False
        self._on_lost: list[Callable[[], object]] = []
        #: The charge the reservation ended with (``None`` until it ends).
        self.charged: Charge | None = None

    @property
    def ended(self) -> bool:
        return self._ended

    def settle(self, charge: Charge | None) -> None:
        """
        The work reached a provider and ended: ``charge`` replaces the worst case reserved, in
        the window entry and the budget periods the reservation was admitted in. ``None``
        (usage unknown) keeps the worst case: a request is never counted as less than it may
        have used. A charge without a cost (``cost_micros`` None) keeps the reserved cost.
        """
        if charge is None:
            kept = Charge(self.demand.tokens, self.demand.cost_micros)
        elif charge.cost_micros is None and self.demand.cost_micros is not None:
            kept = Charge(charge.tokens, self.demand.cost_micros)
        else:
            kept = charge
        self._finish(kept, "settle")

    def release(self) -> None:
        """The work never reached a provider: nothing is charged but the request itself (it
        stays in the requests-per-minute window)."""
        self._finish(Charge(0, 0 if self.demand.cost_micros is not None else None), "release")

    def end(self, charge: Charge | None, *, dispatched: bool) -> None:
        """:meth:`settle` with ``charge`` when the work was ``dispatched`` to a provider, else
        :meth:`release`: what one ``finally`` calls."""
        if dispatched:
            self.settle(charge)
        else:
            self.release()

    def _finish(self, charge: Charge, how: str) -> None:
        if self._ended:
            _log.error(
                "quota: reservation {id} ended twice (a second {how}): a bug in its caller; "
                "ignored",
                id=self.id,
                how=how,
            )
            return
        self._ended = True
        self.charged = charge
        self._on_lost.clear()
        self._end(self, charge)

    # -- lost slots (a cluster's) ---------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """The table could no longer vouch for this reservation's concurrency slot."""
        return self._lost

    def when_lost(self, callback: Callable[[], object]) -> None:
        """
        Call ``callback`` if the table loses the reservation's concurrency slot while it is
        held — in a cluster, when its renewal could not be confirmed in time (another Edge may
        now admit in its place, so its holder should end the work). At once if already lost;
        never in process.
        """
        if self._lost:
            callback()
        elif not self._ended:
            self._on_lost.append(callback)

    def lose(self) -> None:
        """The table's side of :meth:`when_lost`: run the callbacks once."""
        if self._lost or self._ended:
            return
        self._lost = True
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _log.failure("quota: a lost reservation's callback failed")

    def __repr__(self) -> str:
        return f"Reservation({self.id!r}, {self.subjects!r}, {self.demand!r})"


class IQuotaTable(Interface):
    """Where reservations are counted: in process, or on the cluster's Redis."""

    def reserve(subjects: Sequence[SubjectLimits], demand: Demand) -> Deferred[Reservation]:
        """
        Reserve ``demand`` against every subject at once, all or nothing: a
        :class:`Reservation`, or a failure with :class:`~iop.edge.quota.model.Refused` (the
        first limit or budget that says no) or
        :class:`~iop.edge.quota.model.QuotaUnavailable` (fail closed). ``subjects`` carry the
        limits as configured now: a lowered limit applies to the next reservation, never to
        those already held.
        """

    def snapshot(subject: SubjectLimits) -> Deferred[Snapshot]:
        """The subject's counters now (for /status, /usage and rate-limit headers)."""
