"""
Tests for :mod:`iop.usage.store`: the ledger file's schema, inserts, totals by every grouping
and filter, unknown counts kept unknown, retention, and a newer schema refused.
"""

from __future__ import annotations

import sqlite3

from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.events import Usage
from iop.usage.query import Totals, UsageQuery, parse_time
from iop.usage.store import SCHEMA_VERSION, LedgerStore, UsageRecord

DAY1 = int(parse_time("2026-03-31T23:59:59Z") * 1000)
DAY2 = int(parse_time("2026-04-01T00:00:00Z") * 1000)


def records() -> list[UsageRecord]:
    return [
        UsageRecord.of(
            DAY1,
            Usage(100, 10, cached_input_tokens=60, cache_write_tokens=5),
            request_id="r1",
            key="alice",
            team="backend",
            model="m1",
            provider="p1",
            node="n1",
            surface="openai",
            outcome="ok",
            cost_micros=1000,
            currency="USD",
            duration_ms=120,
            ttft_ms=30,
        ),
        UsageRecord.of(
            DAY2,
            Usage(200, 20, reasoning_tokens=15),
            key="alice",
            team="backend",
            model="m2",
            outcome="ok",
            cost_micros=None,
            currency="USD",
        ),
        UsageRecord.of(DAY2 + 1, None, key="bob", model="m1", outcome="error", currency="USD"),
        UsageRecord.of(DAY2 + 2, Usage(1, 1), key="bob", model="m1", cost_micros=7, currency="USD"),
    ]


class StoreTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = self.mktemp()
        self.store = LedgerStore.open(self.path)
        self.addCleanup(self.store.close)
        self.assertEqual(self.store.insert(records()), 4)

    def test_wal_and_schema_version(self) -> None:
        db = sqlite3.connect(self.path)
        self.addCleanup(db.close)
        self.assertEqual(db.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        self.assertEqual(db.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)

    def test_round_trip(self) -> None:
        """Every field comes back as written; unknown counts stay None, not 0."""
        self.assertEqual(self.store.records(UsageQuery()), records())

    def test_total(self) -> None:
        [total] = self.store.totals(UsageQuery())
        self.assertEqual(
            total,
            Totals(
                group="",
                currency="USD",
                requests=4,
                input_tokens=301,
                output_tokens=31,
                cached_input_tokens=60,
                cache_write_tokens=5,
                reasoning_tokens=15,
                cost_micros=1007,
                unpriced=2,
                unreported=1,
            ),
        )

    def test_by_key(self) -> None:
        rows = self.store.totals(UsageQuery(by="key"))
        self.assertEqual(
            [(r.group, r.requests, r.cost_micros) for r in rows],
            [
                ("alice", 2, 1000),
                ("bob", 2, 7),
            ],
        )

    def test_by_team_without_team_is_empty_group(self) -> None:
        rows = self.store.totals(UsageQuery(by="team"))
        self.assertEqual([(r.group, r.requests) for r in rows], [("", 2), ("backend", 2)])

    def test_by_model(self) -> None:
        rows = self.store.totals(UsageQuery(by="model"))
        self.assertEqual([(r.group, r.requests) for r in rows], [("m1", 3), ("m2", 1)])

    def test_by_day_is_the_utc_day(self) -> None:
        """One second before midnight UTC and midnight itself are different days."""
        rows = self.store.totals(UsageQuery(by="day"))
        self.assertEqual(
            [(r.group, r.requests) for r in rows], [("2026-03-31", 1), ("2026-04-01", 3)]
        )

    def test_filters(self) -> None:
        def requests(query: UsageQuery) -> int:
            return sum(r.requests for r in self.store.totals(query))

        self.assertEqual(requests(UsageQuery(key="alice")), 2)
        self.assertEqual(requests(UsageQuery(team="backend", model="m2")), 1)
        self.assertEqual(requests(UsageQuery(model="nope")), 0)
        # since inclusive, until exclusive.
        self.assertEqual(requests(UsageQuery(since=DAY2 / 1000)), 3)
        self.assertEqual(requests(UsageQuery(until=DAY2 / 1000)), 1)
        self.assertEqual(requests(UsageQuery(since=DAY2 / 1000, until=(DAY2 + 2) / 1000)), 2)

    def test_currencies_never_added_up(self) -> None:
        self.store.insert([UsageRecord(DAY2, key="alice", cost_micros=5, currency="EUR")])
        rows = self.store.totals(UsageQuery(key="alice"))
        self.assertEqual([(r.currency, r.cost_micros) for r in rows], [("EUR", 5), ("USD", 1000)])

    def test_prune(self) -> None:
        self.assertEqual(self.store.prune(DAY2 + 1), 2)
        self.assertEqual(
            [r.request_id or r.key for r in self.store.records(UsageQuery())],
            [
                "bob",
                "bob",
            ],
        )
        self.assertEqual(self.store.prune(DAY2 + 1), 0)

    def test_reopen_keeps_records(self) -> None:
        self.store.close()
        self.store = LedgerStore.open(self.path)
        self.assertEqual(len(self.store.records(UsageQuery())), 4)

    def test_newer_schema_refused(self) -> None:
        db = sqlite3.connect(self.path)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        db.close()
        error = self.assertRaises(ValueError, LedgerStore.open, self.path)
        self.assertIn("newer", str(error))

    def test_failed_batch_writes_nothing(self) -> None:
        """One transaction per batch: a bad record leaves none of its batch behind."""
        bad = UsageRecord(DAY2, key=None)  # type: ignore[arg-type]
        self.assertRaises(sqlite3.IntegrityError, self.store.insert, [records()[0], bad])
        self.assertEqual(len(self.store.records(UsageQuery())), 4)
