# -*- test-case-name: iop.test.config.test_usage_section -*-
"""
``usage:`` in edge.yaml: the currency of prices and cost budgets, and the usage ledger::

    usage:
      currency: USD                 # a label: an ISO 4217 code (three capital letters)
      ledger:
        path: usage.sqlite3         # relative to this file's directory
        retention_days: 90          # 0 = keep every record
        enabled: true

Every key is optional and so is the section: absent, the ledger is ``usage.sqlite3`` beside
edge.yaml, keeping 90 days, so a single Edge records its usage with nothing configured. An Edge
whose config directory is read-only (the systemd unit's ``ProtectSystem=strict`` makes
``/etc`` so) sets ``path`` to a writable place such as ``/var/lib/iop/usage.sqlite3``; the
ledger is opened when the Edge starts, and an Edge that cannot open it does not start.

The currency is only a label written beside every cost (IOP converts nothing); it is checked
to look like an ISO 4217 code so that reports from several Edges can be compared by it.
"""

from __future__ import annotations

import re

from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_CURRENCY,
    DEFAULT_LEDGER_PATH,
    DEFAULT_LEDGER_RETENTION_DAYS,
    LedgerConfig,
    UsageConfig,
)
from iop.config.secrets import absolute_path

__all__ = ["usage_section"]

_CURRENCY = re.compile(r"[A-Z]{3}\Z")
#: A retention beyond this is a typo (about 27 years), not a policy: use 0 to keep forever.
MAX_RETENTION_DAYS = 10_000


def usage_section(top: Section, *, base_dir: str) -> UsageConfig:
    """``top.usage`` as a :class:`UsageConfig`, its ledger path absolute."""
    default_ledger = LedgerConfig(path=absolute_path(base_dir, DEFAULT_LEDGER_PATH))
    section = top.section("usage")
    if section is None:
        return UsageConfig(ledger=default_ledger)
    currency = section.string("currency", DEFAULT_CURRENCY, nonempty=True)
    if section.has("currency") and currency.strip() and not _CURRENCY.match(currency):
        section.issues.add(
            section.path_of("currency"), "must be an ISO 4217 code: three capital letters (USD)"
        )
    ledger = _ledger(section, base_dir) if section.has("ledger") else default_ledger
    section.raw("ledger")
    section.finish()
    return UsageConfig(currency=currency, ledger=ledger)


def _ledger(usage: Section, base_dir: str) -> LedgerConfig:
    section = usage.section("ledger")
    if section is None:
        return LedgerConfig(path=absolute_path(base_dir, DEFAULT_LEDGER_PATH))
    path = section.string("path", DEFAULT_LEDGER_PATH, nonempty=True)
    retention = section.integer(
        "retention_days", DEFAULT_LEDGER_RETENTION_DAYS, minimum=0, maximum=MAX_RETENTION_DAYS
    )
    enabled = section.boolean("enabled", True)
    section.finish()
    return LedgerConfig(
        path=absolute_path(base_dir, path.strip() or DEFAULT_LEDGER_PATH),
        retention_days=retention,
        enabled=enabled,
    )
