"""
Tests for :mod:`iop.usage.ledger`: batching on the clock and by size, the bound (drop and
count, never block), failed writes counted, questions answered after earlier records,
retention pruning on the clock, opening failures and an orderly stop. Deterministic: a
``task.Clock`` and a worker the test runs by hand; SQLite on a temporary file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.usage.ledger import PRUNE_INTERVAL_SEC, InlineWorker, UsageLedger
from iop.usage.query import UsageQuery
from iop.usage.store import LedgerStore, UsageRecord

T = TypeVar("T")
DAY = 86400.0


class ManualWorker:
    """A worker whose calls wait until the test runs them, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...], Deferred[Any]]] = []
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        d: Deferred[T] = Deferred()
        self.calls.append((f, args, d))
        return d

    def run_all(self) -> None:
        while self.calls:
            f, args, d = self.calls.pop(0)
            maybeDeferred(f, *args).chainDeferred(d)

    def stop(self) -> None:
        self.stopped = True


class LedgerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(100 * DAY)
        self.path = self.mktemp()
        self.worker = ManualWorker()

    def ledger(self, **kwargs: Any) -> UsageLedger:
        options: dict[str, Any] = {
            "currency": "USD",
            "retention_days": 0,
            "worker": self.worker,
            "batch_size": 3,
            "max_pending": 5,
            **kwargs,
        }
        ledger = UsageLedger(self.path, self.clock, **options)
        ledger.startService()
        self.addCleanup(self.stop, ledger)
        return ledger

    def stop(self, ledger: UsageLedger) -> None:
        if ledger.running:
            d = ledger.stopService()
            if isinstance(self.worker, ManualWorker):
                self.worker.run_all()
            self.successResultOf(d)

    def rows(self) -> list[UsageRecord]:
        store = LedgerStore.open(self.path)
        try:
            return store.records(UsageQuery())
        finally:
            store.close()

    def record(self, ledger: UsageLedger, key: str = "alice") -> bool:
        return ledger.record(UsageRecord(ledger.now_ms(), key=key, cost_micros=1))

    def test_written_each_flush_interval(self) -> None:
        ledger = self.ledger()
        self.assertTrue(self.record(ledger))
        self.assertEqual(self.worker.calls, [])
        self.clock.advance(1.0)
        self.assertEqual(len(self.worker.calls), 1)
        self.assertEqual(ledger.stats()["pending"], 1)
        self.worker.run_all()
        self.assertEqual([r.key for r in self.rows()], ["alice"])
        self.assertEqual(ledger.stats()["pending"], 0)
        self.assertEqual(ledger.stats()["written"], 1)

    def test_currency_filled_in(self) -> None:
        ledger = self.ledger()
        self.record(ledger)
        ledger.record(UsageRecord(ledger.now_ms(), key="eve", currency="EUR"))
        self.clock.advance(1.0)
        self.worker.run_all()
        self.assertEqual([r.currency for r in self.rows()], ["USD", "EUR"])

    def test_a_full_batch_goes_at_once(self) -> None:
        ledger = self.ledger()
        for _ in range(3):
            self.record(ledger)
        self.assertEqual(len(self.worker.calls), 1)
        self.worker.run_all()
        self.assertEqual(len(self.rows()), 3)

    def test_bounded_drop_and_count_never_block(self) -> None:
        """Five records may wait (here or in the worker); the sixth is dropped and counted,
        with one warning per stall."""
        ledger = self.ledger()
        accepted = [self.record(ledger) for _ in range(7)]
        self.assertEqual(accepted, [True] * 5 + [False] * 2)
        self.assertEqual(ledger.stats()["dropped"], 2)
        self.clock.advance(1.0)
        self.worker.run_all()
        self.assertEqual(ledger.stats()["pending"], 0)
        self.assertTrue(self.record(ledger))
        self.assertEqual(ledger.stats()["written"], 5)

    def test_failed_write_counted_and_logged(self) -> None:
        ledger = self.ledger()
        ledger.record(UsageRecord(ledger.now_ms(), key=None))  # type: ignore[arg-type]
        self.clock.advance(1.0)
        self.worker.run_all()
        self.assertEqual(ledger.stats()["write_failures"], 1)
        self.assertEqual(ledger.stats()["pending"], 0)
        self.assertEqual(len(self.flushLoggedErrors()), 1)
        # The ledger goes on.
        self.record(ledger)
        self.clock.advance(1.0)
        self.worker.run_all()
        self.assertEqual(len(self.rows()), 1)

    def test_totals_include_what_was_recorded_before(self) -> None:
        ledger = self.ledger()
        self.record(ledger)
        self.record(ledger, "bob")
        d = ledger.totals(UsageQuery(by="key"))
        self.worker.run_all()
        rows = self.successResultOf(d)
        self.assertEqual([(r.group, r.requests) for r in rows], [("alice", 1), ("bob", 1)])

    def test_retention_pruned_at_start_and_daily(self) -> None:
        """Records older than the retention go at start and then once a day."""
        store = LedgerStore.open(self.path)
        now_ms = int(self.clock.seconds() * 1000)
        store.insert(
            [
                UsageRecord(now_ms - int(31 * DAY * 1000), key="old"),
                UsageRecord(now_ms - int(29 * DAY * 1000), key="recent"),
            ]
        )
        store.close()
        ledger = self.ledger(retention_days=30)
        self.worker.run_all()
        self.assertEqual([r.key for r in self.rows()], ["recent"])
        self.assertEqual(ledger.stats()["pruned"], 1)
        self.clock.advance(PRUNE_INTERVAL_SEC - 1)
        self.worker.run_all()
        self.assertEqual([r.key for r in self.rows()], ["recent"])
        # Exactly 30 days old is kept (only older goes); the next daily run deletes it.
        self.clock.advance(1)
        self.worker.run_all()
        self.assertEqual([r.key for r in self.rows()], ["recent"])
        self.clock.advance(PRUNE_INTERVAL_SEC)
        self.worker.run_all()
        self.assertEqual(self.rows(), [])

    def test_zero_retention_keeps_forever(self) -> None:
        ledger = self.ledger(retention_days=0)
        ledger.record(UsageRecord(0, key="ancient"))
        self.clock.advance(10 * PRUNE_INTERVAL_SEC)
        self.worker.run_all()
        self.assertEqual([r.key for r in self.rows()], ["ancient"])

    def test_stop_writes_what_waits_then_closes(self) -> None:
        ledger = self.ledger()
        self.record(ledger)
        d = ledger.stopService()
        self.assertNoResult(d)
        self.worker.run_all()
        self.successResultOf(d)
        self.assertTrue(self.worker.stopped)
        self.assertEqual(len(self.rows()), 1)
        # Stopped: records are refused, questions fail.
        self.assertFalse(self.record(ledger))
        self.failureResultOf(ledger.totals(UsageQuery()), RuntimeError)

    def test_cannot_open(self) -> None:
        ledger = UsageLedger(
            self.mktemp() + "/missing-dir/usage.sqlite3",
            self.clock,
            currency="USD",
            retention_days=0,
            worker=self.worker,
        )
        error = self.assertRaises(RuntimeError, ledger.startService)
        self.assertIn("cannot open the usage ledger", str(error))
        self.assertFalse(self.worker.started)

    def test_inline_worker(self) -> None:
        self.worker = InlineWorker()  # type: ignore[assignment]
        ledger = self.ledger()
        self.record(ledger)
        rows = self.successResultOf(ledger.totals(UsageQuery()))
        self.assertEqual(rows[0].requests, 1)
