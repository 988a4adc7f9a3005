"""Budget periods (:mod:`iop.edge.quota.periods`): calendar periods in UTC."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.quota.periods import period_bounds

UTC = datetime.UTC


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime.datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


class PeriodTests(SynchronousTestCase):
    def test_examples(self) -> None:
        now = at(2028, 2, 29, 13, 5)  # a leap day, a Tuesday
        self.assertEqual(period_bounds("day", now), (at(2028, 2, 29), at(2028, 3, 1)))
        self.assertEqual(period_bounds("week", now), (at(2028, 2, 28), at(2028, 3, 6)))
        self.assertEqual(period_bounds("month", now), (at(2028, 2, 1), at(2028, 3, 1)))
        self.assertEqual(period_bounds("total", now), (0.0, None))
        self.assertEqual(
            period_bounds("month", at(2026, 12, 31, 23, 59, 59)), (at(2026, 12, 1), at(2027, 1, 1))
        )
        # A period starts at its first instant.
        self.assertEqual(period_bounds("day", at(2026, 3, 29))[0], at(2026, 3, 29))
        self.assertRaises(ValueError, period_bounds, "year", now)

    @given(st.integers(0, 4102444800 * 1000))
    def test_bounds(self, ms: int) -> None:
        now = ms / 1000
        when = datetime.datetime.fromtimestamp(now, UTC)
        for period in ("day", "week", "month"):
            start, end = period_bounds(period, now)
            assert end is not None
            self.assertLessEqual(start, now)
            self.assertLess(now, end)
            first = datetime.datetime.fromtimestamp(start, UTC)
            self.assertEqual((first.hour, first.minute, first.second), (0, 0, 0))
            if period == "week":
                self.assertEqual(first.weekday(), 0)
                self.assertEqual(end - start, 7 * 86400)
            if period == "month":
                self.assertEqual((first.year, first.month, first.day), (when.year, when.month, 1))
            if period == "day":
                self.assertEqual(first.date(), when.date())
