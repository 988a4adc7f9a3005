# -*- test-case-name: iop.test.usage.test_query -*-
"""
What a usage question is and what its answer looks like, on both ends: the Edge's
``GET /usage`` (:mod:`iop.edge.admin`) and ``iop usage`` (:mod:`iop.cli.usage`), which asks one
or several Edges and merges their answers. Pure: no SQLite, no Twisted.

A question (:class:`UsageQuery`) filters by ``key``, ``team``, ``model`` and a time window
(``since`` inclusive, ``until`` exclusive, both UTC) and groups by ``key``, ``team``, ``model``
or ``day`` (the UTC calendar day), or not at all (one total). An answer is a list of
:class:`Totals`, one per group and currency (a ledger written under two ``usage.currency``
labels never adds them up).

Times on the wire are ISO 8601 (:func:`parse_time`): a date (``2026-05-01``: its midnight UTC)
or a date and time, UTC unless it carries an offset. The CLI also takes a duration back from
now (``30m``, ``24h``, ``7d``, ``2w``) and turns it into a time before it asks, so that every
Edge answers for the same window.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from iop.usage.price import format_micros

__all__ = [
    "GROUPINGS",
    "Totals",
    "UsageQuery",
    "format_time",
    "merge",
    "parse_time",
    "parse_when",
    "totals_from_json",
]

#: How an answer may be grouped (None: one total).
GROUPINGS = ("key", "team", "model", "day")

_RELATIVE = re.compile(r"(\d+)([mhdw])\Z")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class UsageQuery:
    """A usage question. Times are Unix seconds (UTC); None = unbounded / not filtered."""

    key: str | None = None
    team: str | None = None
    model: str | None = None
    since: float | None = None
    until: float | None = None
    by: str | None = None

    def __post_init__(self) -> None:
        if self.by is not None and self.by not in GROUPINGS:
            raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, got {self.by!r}")

    def params(self) -> dict[str, str]:
        """The query string ``GET /usage`` takes for this question."""
        out: dict[str, str] = {}
        for name in ("key", "team", "model", "by"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.since is not None:
            out["since"] = format_time(self.since)
        if self.until is not None:
            out["until"] = format_time(self.until)
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "team": self.team,
            "model": self.model,
            "since": None if self.since is None else format_time(self.since),
            "until": None if self.until is None else format_time(self.until),
            "by": self.by,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> UsageQuery:
        """The question of a ``GET /usage`` query string; ValueError naming what is wrong."""
        unknown = sorted(set(params) - {"key", "team", "model", "since", "until", "by"})
        if unknown:
            raise ValueError(f"unknown query parameter {unknown[0]!r}")
        by = params.get("by") or None
        since = _time_param(params, "since")
        until = _time_param(params, "until")
        if since is not None and until is not None and until < since:
            raise ValueError("until must not be before since")
        return cls(
            key=params.get("key") or None,
            team=params.get("team") or None,
            model=params.get("model") or None,
            since=since,
            until=until,
            by=by,
        )


def _time_param(params: Mapping[str, str], name: str) -> float | None:
    text = params.get(name)
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


@dataclass(frozen=True)
class Totals:
    """
    One group's usage: ``group`` (the key, team, model or day; "" for the total, and for
    requests without a key or team), in ``currency``. Token sums count the requests whose usage
    was reported; ``unreported`` counts those whose was not (their tokens are unknown, not
    zero). ``cost_micros`` sums the priced requests; ``unpriced`` counts the others.
    """

    group: str
    currency: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_micros: int = 0
    unpriced: int = 0
    unreported: int = 0

    def __add__(self, other: Totals) -> Totals:
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("group", "currency")
        }
        return replace(self, **summed)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["cost"] = format_micros(self.cost_micros)
        return out


def totals_from_json(item: Mapping[str, Any]) -> Totals:
    """A :class:`Totals` from its JSON (an Edge's answer); ValueError when malformed."""
    values: dict[str, Any] = {}
    for f in fields(Totals):
        value = item.get(f.name, "" if f.name in ("group", "currency") else 0)
        expected = str if f.name in ("group", "currency") else int
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"{f.name} must be {'a string' if expected is str else 'an integer'}")
        values[f.name] = value
    return Totals(**values)


def merge(answers: Iterable[Iterable[Totals]]) -> list[Totals]:
    """Several Edges' totals as one: summed per (group, currency), sorted by group."""
    merged: dict[tuple[str, str], Totals] = {}
    for rows in answers:
        for row in rows:
            at = (row.group, row.currency)
            merged[at] = merged[at] + row if at in merged else row
    return [merged[at] for at in sorted(merged)]


def parse_time(text: str) -> float:
    """ISO 8601 date or date-time (UTC unless it has an offset) → Unix seconds."""
    value = text.strip()
    if not value:
        raise ValueError("empty time")
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not an ISO 8601 date or time: {value!r} (2026-05-01 or 2026-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_when(text: str, now: float) -> float:
    """:func:`parse_time`, or a duration back from ``now`` (``30m``, ``24h``, ``7d``, ``2w``)."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - int(relative.group(1)) * _UNITS[relative.group(2)]
    return parse_time(text)


def format_time(seconds: float) -> str:
    """Unix seconds as ISO 8601 UTC (``2026-05-01T00:00:00Z``; milliseconds when not whole)."""
    moment = datetime.fromtimestamp(0, UTC) + timedelta(seconds=seconds)
    spec = "seconds" if moment.microsecond == 0 else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")
