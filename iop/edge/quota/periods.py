# -*- test-case-name: iop.test.edge.quota.test_periods -*-
"""
Budget periods: calendar periods in UTC (``day``, ``week`` — the ISO week, from Monday 00:00 —
``month``, and ``total``, which never ends). UTC on purpose: a period is the same on every
Edge whatever its local zone, and daylight saving time never makes a day 23 or 25 hours long.

Times are seconds since the epoch (what ``IReactorTime.seconds()`` gives); the cluster's Lua
scripts compute the same bounds in milliseconds of Redis's clock
(:mod:`iop.edge.cluster.quota_scripts`), and a unit test holds the two to each other.
"""

from __future__ import annotations

import datetime

__all__ = ["period_bounds"]

_DAY = 86400


def period_bounds(period: str, now: float) -> tuple[float, float | None]:
    """
    The period ``now`` falls in: its start and its end (the next period's start; ``None`` for
    ``total``), in seconds since the epoch.
    """
    if period == "total":
        return 0.0, None
    days = int(now // _DAY)
    if period == "day":
        return float(days * _DAY), float((days + 1) * _DAY)
    if period == "week":
        # 1970-01-01 was a Thursday: three days after a Monday.
        monday = days - (days + 3) % 7
        return float(monday * _DAY), float((monday + 7) * _DAY)
    if period == "month":
        date = datetime.datetime.fromtimestamp(days * _DAY, datetime.UTC)
        first = date.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = (first + datetime.timedelta(days=32)).replace(day=1)
        return first.timestamp(), following.timestamp()
    raise ValueError(f"unknown budget period {period!r}")
