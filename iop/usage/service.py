# -*- test-case-name: iop.test.usage.test_service -*-
"""
The usage ledger as the Edge builds it: :func:`build` makes the
:class:`~iop.usage.ledger.UsageLedger` of ``usage.ledger`` (its own worker thread, the
currency of ``usage.currency``), or None when the config keeps no ledger. The Edge's composition
root adds it to its service tree (it opens the file when it starts) and hands it to the parts
that write records (the client pipeline's end of request) and read them (``GET /usage``).

The ledger's calls run on a thread of its own; on a reactor that cannot be called back from a
thread (a test's fake reactor) they run in line instead.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IReactorFromThreads

from iop.config.model import UsageConfig
from iop.usage.ledger import InlineWorker, ThreadWorker, UsageLedger, Worker

__all__ = ["build"]


def build(config: UsageConfig, reactor: Any) -> UsageLedger | None:
    """The ledger ``config`` asks for, not started; None without one."""
    ledger = config.ledger
    if ledger is None or not ledger.enabled:
        return None
    return UsageLedger(
        ledger.path,
        reactor,
        currency=config.currency,
        retention_days=ledger.retention_days,
        worker=_worker(reactor),
    )


def _worker(reactor: Any) -> Worker:
    if IReactorFromThreads.providedBy(reactor):
        return ThreadWorker(reactor)
    return InlineWorker()
