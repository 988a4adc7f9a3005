"""Tests for :mod:`iop.usage.query`: query strings, times, merging several Edges' totals."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.usage.query import (
    Totals,
    UsageQuery,
    format_time,
    merge,
    parse_time,
    parse_when,
    totals_from_json,
)

MAY1 = 1777593600.0  # 2026-05-01T00:00:00Z


class TimeTests(SynchronousTestCase):
    def test_forms(self) -> None:
        self.assertEqual(parse_time("2026-05-01"), MAY1)
        self.assertEqual(parse_time("2026-05-01T00:00:00Z"), MAY1)
        self.assertEqual(parse_time("2026-05-01T00:00:00"), MAY1)  # UTC unless an offset
        self.assertEqual(parse_time("2026-05-01T02:00:00+02:00"), MAY1)
        self.assertEqual(parse_time("2026-05-01T00:00:01.500Z"), MAY1 + 1.5)

    def test_bad(self) -> None:
        for text in ("", "yesterday", "2026-13-01", "05/01/2026"):
            self.assertRaises(ValueError, parse_time, text)

    def test_relative(self) -> None:
        self.assertEqual(parse_when("7d", MAY1), MAY1 - 7 * 86400)
        self.assertEqual(parse_when("30m", MAY1), MAY1 - 1800)
        self.assertEqual(parse_when("2w", MAY1), MAY1 - 14 * 86400)
        self.assertEqual(parse_when("24h", MAY1), MAY1 - 86400)
        self.assertEqual(parse_when("2026-05-01", 0), MAY1)

    def test_format(self) -> None:
        self.assertEqual(format_time(MAY1), "2026-05-01T00:00:00Z")
        self.assertEqual(format_time(MAY1 + 1.5), "2026-05-01T00:00:01.500Z")


class QueryTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        query = UsageQuery(key="alice", team="t", model="m", since=MAY1, until=MAY1 + 60, by="day")
        self.assertEqual(UsageQuery.from_params(query.params()), query)
        self.assertEqual(UsageQuery.from_params({}), UsageQuery())

    def test_errors(self) -> None:
        for params, fragment in (
            ({"by": "week"}, "by must be one of"),
            ({"since": "soon"}, "since: not an ISO 8601"),
            ({"keys": "a"}, "unknown query parameter 'keys'"),
            ({"since": "2026-05-02", "until": "2026-05-01"}, "until must not be before since"),
        ):
            error = self.assertRaises(ValueError, UsageQuery.from_params, params)
            self.assertIn(fragment, str(error))


class MergeTests(SynchronousTestCase):
    def test_sums_per_group_and_currency(self) -> None:
        edge1 = [Totals("alice", "USD", 2, 10, 5, cost_micros=3), Totals("bob", "USD", 1)]
        edge2 = [
            Totals("alice", "USD", 1, 1, 1, cost_micros=4, unpriced=1),
            Totals("alice", "EUR", 1),
        ]
        self.assertEqual(
            merge([edge1, edge2]),
            [
                Totals("alice", "EUR", 1),
                Totals("alice", "USD", 3, 11, 6, cost_micros=7, unpriced=1),
                Totals("bob", "USD", 1),
            ],
        )

    def test_json_round_trip(self) -> None:
        row = Totals("alice", "USD", 3, 11, 6, 1, 2, 3, 1_500_000, 1, 0)
        document = row.as_json()
        self.assertEqual(document["cost"], "1.500000")
        self.assertEqual(totals_from_json(document), row)
        self.assertRaises(ValueError, totals_from_json, {**document, "requests": "3"})
        self.assertRaises(ValueError, totals_from_json, {**document, "group": None})
