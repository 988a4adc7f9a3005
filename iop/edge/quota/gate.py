# -*- test-case-name: iop.test.edge.quota.test_gate -*-
"""
:class:`QuotaGate`: what the client pipeline reserves through. It knows the running config's
keys and teams (switched by :meth:`QuotaGate.use_config`, a refresh listener) and turns a client
key into its subjects — ``key:<name>`` with the key's limits and budgets, and ``team:<name>``
when the key has a team — then asks its table (:class:`~iop.edge.quota.table.IQuotaTable`).

A subject with no limit and no budget is not counted at all, and a request none of whose
subjects is limited (or made with auth off) gets a reservation that counts nothing at once,
without asking the table: keys without limits cost nothing, not even a Redis round trip.
Consequence, by design: a limit added by a refresh counts only the requests admitted after it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, FirstError, gatherResults, succeed
from twisted.python.failure import Failure

from iop.config.model import ClientAPIConfig, ClientKey, EdgeConfig
from iop.edge.quota.model import Charge, Demand, Snapshot, SubjectLimits
from iop.edge.quota.table import IQuotaTable, Reservation

__all__ = ["QuotaGate", "subjects_of"]


def subjects_of(key: ClientKey, config: ClientAPIConfig) -> tuple[SubjectLimits, ...]:
    """``key``'s subjects under ``config``: its own, then its team's; unlimited ones left out."""
    subjects = [SubjectLimits(f"key:{key.name}", key.limits, key.budgets)]
    team = config.team(key.team) if key.team else None
    if team is not None:
        subjects.append(SubjectLimits(f"team:{team.name}", team.limits, team.budgets))
    return tuple(s for s in subjects if not s.unlimited)


def _uncounted(reservation: Reservation, charge: Charge) -> None:
    pass


class QuotaGate:
    """The running config's keys and teams over one table; see the module docstring."""

    def __init__(self, config: ClientAPIConfig, table: IQuotaTable) -> None:
        self.table = table
        self._by_name: dict[str, tuple[SubjectLimits, ...]] = {}
        self._config = config
        self._switch(config)

    def use_config(self, config: EdgeConfig) -> None:
        """The refresh's listener: new reservations see ``config``'s keys, teams, limits and
        budgets; those already held end as they were admitted."""
        self._switch(config.client_api)

    def _switch(self, config: ClientAPIConfig) -> None:
        self._config = config
        self._by_name = {key.name: subjects_of(key, config) for key in config.keys}

    def subjects(self, key: ClientKey | None) -> tuple[SubjectLimits, ...]:
        """The subjects a request made with ``key`` counts against now (none with auth off).
        By name in the running config; a key it no longer has keeps its own limits."""
        if key is None:
            return ()
        found = self._by_name.get(key.name)
        return found if found is not None else subjects_of(key, self._config)

    def reserve(self, key: ClientKey | None, demand: Demand) -> Deferred[Reservation]:
        """Reserve ``demand`` for a request made with ``key`` (see
        :meth:`~iop.edge.quota.table.IQuotaTable.reserve`)."""
        subjects = self.subjects(key)
        if not subjects:
            return succeed(Reservation("", (), demand, _uncounted))
        return self.table.reserve(subjects, demand)

    def standing(self) -> Deferred[list[dict[str, Any]]]:
        """
        Every limited key of the running config with its subjects' limits and counters now —
        what ``GET /limits`` answers: how close each key (and its team) is to each limit and
        budget. Keys without limits are left out.
        """
        keys = [key for key in self._config.keys if self.subjects(key)]
        asked = [self.snapshot(key) for key in keys]

        def shape(results: list[list[Snapshot]]) -> list[dict[str, Any]]:
            return [
                {
                    "key": key.name,
                    "team": key.team,
                    "subjects": [
                        _subject_json(limits, snapshot)
                        for limits, snapshot in zip(self.subjects(key), snapshots, strict=True)
                    ],
                }
                for key, snapshots in zip(keys, results, strict=True)
            ]

        return gatherResults(asked, consumeErrors=True).addCallbacks(shape, _first)

    def snapshot(self, key: ClientKey) -> Deferred[list[Snapshot]]:
        """The counters of ``key``'s subjects (key first, then team), for headers and /usage."""
        asked = [self.table.snapshot(s) for s in self.subjects(key)]
        return gatherResults(asked, consumeErrors=True).addErrback(_first)


def _first(failure: Failure) -> Failure:
    """The failure of the first snapshot that failed (say, QuotaUnavailable), not its wrappers."""
    while isinstance(failure.value, FirstError):
        failure = failure.value.subFailure
    return failure


def _amount(limit: int | None, used: int) -> dict[str, Any] | None:
    if limit is None:
        return None
    return {"limit": limit, "used": used, "remaining": max(limit - used, 0)}


def _subject_json(limits: SubjectLimits, snapshot: Snapshot) -> dict[str, Any]:
    """One subject's limits beside its counters (costs in micro-units of usage.currency)."""
    rates = limits.limits
    return {
        "subject": limits.subject,
        "concurrent_requests": _amount(rates.concurrent_requests, snapshot.concurrent),
        "requests_per_minute": _amount(rates.requests_per_minute, snapshot.requests),
        "tokens_per_minute": _amount(rates.tokens_per_minute, snapshot.tokens),
        "budgets": [
            {
                "period": use.budget.period,
                "start": use.start,
                "end": use.end,
                "tokens": _amount(use.budget.tokens, use.tokens),
                "cost_micros": _amount(use.budget.cost_micros, use.cost_micros),
            }
            for use in snapshot.budgets
        ],
    }
