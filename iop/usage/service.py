# -*- test-case-name: iop.test.usage.test_service -*-
"""
The usage ledger as the Edge builds it: :func:`build` makes the
:class:`~iop.usage.ledger.UsageLedger` of ``usage.ledger`` (its own worker thread, the
currency of ``usage.currency``), or None when the config keeps no ledger. The Edge's composition
root adds it to its service tree (it opens the file when it starts) and hands it to the parts
that write records (the client pipeline's end of request) and read them (``GET /usage``).
"""

from __future__ import annotations

from typing import Any

from iop.config.model import UsageConfig
from iop.usage.ledger import ThreadWorker, UsageLedger

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
        worker=ThreadWorker(reactor),
    )
