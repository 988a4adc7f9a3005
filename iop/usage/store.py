# -*- test-case-name: iop.test.usage.test_store -*-
"""
The usage ledger's file: one SQLite table of one row per finished request, its indexes, and
the three things done to it — insert a batch, total by a :class:`~iop.usage.query.UsageQuery`,
delete what is older than the retention. Synchronous and single-connection: the ledger
(:mod:`iop.usage.ledger`) calls it from its one worker thread, never on the reactor; a test or
a tool may call it directly.

The file is in WAL mode (readers never block the writer, and a crash loses at most the last
batch not yet committed) with ``synchronous=NORMAL`` (durable at each checkpoint: a power cut
may lose the last commits, never corrupt the file; the ledger is an account of usage, the
budgets' running totals live elsewhere). Times are integer milliseconds since the epoch, UTC.
A count the provider did not report is NULL, as is the cost of a request whose model has no
price: "unknown" is never stored as 0.

Each row names its request's id (``request_id``, indexed: an operator looks a client's
complaint up by it); an older file gains the index when it is opened (every statement of the
schema is ``IF NOT EXISTS``). The schema carries ``PRAGMA user_version``; a file written by a
newer schema is refused rather than misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from typing import Any

from iop.runtime.events import Usage
from iop.usage.query import Totals, UsageQuery

__all__ = ["SCHEMA_VERSION", "LedgerStore", "UsageRecord"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    key TEXT NOT NULL,
    team TEXT NOT NULL,
    model TEXT NOT NULL,
    provider TEXT NOT NULL,
    node TEXT NOT NULL,
    surface TEXT NOT NULL,
    outcome TEXT NOT NULL,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cached_input_tokens INTEGER,
    cache_write_tokens INTEGER,
    reasoning_tokens INTEGER,
    cost_micros INTEGER,
    currency TEXT NOT NULL,
    duration_ms INTEGER,
    ttft_ms INTEGER
);
CREATE INDEX IF NOT EXISTS usage_time ON usage (time_ms);
CREATE INDEX IF NOT EXISTS usage_key_time ON usage (key, time_ms);
CREATE INDEX IF NOT EXISTS usage_team_time ON usage (team, time_ms);
CREATE INDEX IF NOT EXISTS usage_model_time ON usage (model, time_ms);
CREATE INDEX IF NOT EXISTS usage_request ON usage (request_id);
"""


@dataclass(frozen=True)
class UsageRecord:
    """
    One finished client request, as the ledger keeps it. ``time_ms``: when it finished (Unix
    milliseconds, UTC). ``key``/``team``: the client key's name and its team ("" when none);
    ``provider``/``node``: where it ran ("" when it never reached one); ``surface``: the client
    API (``openai``, ``anthropic``); ``outcome``: how it ended (the request record's words).
    Token counts and ``cost_micros`` are None when unknown; ``currency`` labels the cost.
    """

    time_ms: int
    request_id: str = ""
    key: str = ""
    team: str = ""
    model: str = ""
    provider: str = ""
    node: str = ""
    surface: str = ""
    outcome: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_micros: int | None = None
    currency: str = ""
    duration_ms: int | None = None
    ttft_ms: int | None = None

    @classmethod
    def of(cls, time_ms: int, usage: Usage | None, **facts: Any) -> UsageRecord:
        """A record whose token counts are ``usage``'s (all None when it was not reported)."""
        if usage is not None:
            facts.update(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_input_tokens=usage.cached_input_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                reasoning_tokens=usage.reasoning_tokens,
            )
        return cls(time_ms=time_ms, **facts)


_COLUMNS = tuple(f.name for f in fields(UsageRecord))
_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
_GROUP = {
    None: "''",
    "key": "key",
    "team": "team",
    "model": "model",
    "day": "strftime('%Y-%m-%d', time_ms / 1000, 'unixepoch')",
}


class LedgerStore:
    """One connection to the ledger file; every method runs on the caller's thread."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection

    @classmethod
    def open(cls, path: str, *, check_same_thread: bool = True) -> LedgerStore:
        """
        Open (creating it and its schema) the ledger at ``path``. Raises sqlite3.Error or
        OSError when the file cannot be opened or written, or ValueError when it holds a newer
        schema.
        """
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # Wait for another process's write (a tool reading the file) rather than fail.
            db.execute("PRAGMA busy_timeout=5000")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"{path}: usage ledger schema {version} is newer than this IOP's "
                    f"({SCHEMA_VERSION})"
                )
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            db.close()
            raise
        return cls(db)

    def close(self) -> None:
        self._db.close()

    def insert(self, records: Sequence[UsageRecord]) -> int:
        """Write ``records`` in one transaction; how many were written."""
        if not records:
            return 0
        with _transaction(self._db):
            self._db.executemany(_INSERT, (astuple(r) for r in records))
        return len(records)

    def totals(self, query: UsageQuery) -> list[Totals]:
        """The totals answering ``query``, one per group and currency, sorted by group."""
        where, args = _where(query)
        group = _GROUP[query.by]
        sql = f"""
            SELECT {group} AS grp, currency, COUNT(*),
                   COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),
                   COALESCE(SUM(cached_input_tokens), 0), COALESCE(SUM(cache_write_tokens), 0),
                   COALESCE(SUM(reasoning_tokens), 0), COALESCE(SUM(cost_micros), 0),
                   SUM(cost_micros IS NULL), SUM(input_tokens IS NULL)
            FROM usage {where}
            GROUP BY grp, currency
            ORDER BY grp, currency
        """
        return [Totals(*row) for row in self._db.execute(sql, args)]

    def records(self, query: UsageQuery, limit: int = 1000) -> list[UsageRecord]:
        """The records ``query`` filters (its grouping aside), oldest first, at most ``limit``."""
        where, args = _where(query)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM usage {where} ORDER BY time_ms, id LIMIT ?"
        return [UsageRecord(*row) for row in self._db.execute(sql, (*args, limit))]

    def prune(self, before_ms: int) -> int:
        """Delete the records older than ``before_ms``; how many were deleted."""
        with _transaction(self._db):
            cursor = self._db.execute("DELETE FROM usage WHERE time_ms < ?", (before_ms,))
        return cursor.rowcount


def _where(query: UsageQuery) -> tuple[str, tuple[Any, ...]]:
    clauses: list[str] = []
    args: list[Any] = []
    for column in ("key", "team", "model"):
        value = getattr(query, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if query.since is not None:
        clauses.append("time_ms >= ?")
        args.append(_ms(query.since))
    if query.until is not None:
        clauses.append("time_ms < ?")
        args.append(_ms(query.until))
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class _transaction:
    """BEGIN … COMMIT on an autocommit connection (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self._db.execute("ROLLBACK" if kind is not None else "COMMIT")
