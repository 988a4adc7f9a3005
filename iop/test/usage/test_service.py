"""Tests for :mod:`iop.usage.service`: the ledger the config asks for, or none."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import LedgerConfig, UsageConfig
from iop.usage import service
from iop.usage.ledger import InlineWorker, ThreadWorker


class BuildTests(SynchronousTestCase):
    def test_none_without_a_ledger(self) -> None:
        self.assertIsNone(service.build(UsageConfig(), Clock()))
        disabled = UsageConfig(ledger=LedgerConfig("x.sqlite3", enabled=False))
        self.assertIsNone(service.build(disabled, Clock()))

    def test_ledger(self) -> None:
        from twisted.internet import reactor

        config = UsageConfig("EUR", LedgerConfig("/tmp/u.sqlite3", retention_days=7))
        ledger = service.build(config, reactor)
        assert ledger is not None
        self.assertEqual(
            (ledger.path, ledger.currency, ledger.retention_days, ledger.name, ledger.running),
            ("/tmp/u.sqlite3", "EUR", 7, "usage-ledger", 0),
        )
        self.assertIsInstance(ledger._worker, ThreadWorker)

    def test_inline_without_threads(self) -> None:
        """A reactor that cannot be called from a thread (a fake one): calls run in line."""
        ledger = service.build(UsageConfig(ledger=LedgerConfig("/tmp/u.sqlite3")), Clock())
        assert ledger is not None
        self.assertIsInstance(ledger._worker, InlineWorker)
