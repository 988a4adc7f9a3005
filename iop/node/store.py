# -*- test-case-name: iop.test.node.test_store -*-
"""
The Node's local run store: one SQLite table of the runs this node executed.

It records run id, adapter, target, session id, background flag, status, the created / started /
finished timestamps, the error text and the id of the client request the run serves
(``request_id``, from the run's metadata: the id in the client's ``x-request-id`` answer and the
Edge's access log; "" for a run without one). It is a local record for operators, not a global
history or audit API.

Schema 2 added ``request_id``: a file of schema 1 gains the column (every old row "") and its
index when it is opened; nothing else changes, so an older node can still read the file.

SQLite is blocking, so the reactor never calls it: every statement runs on one dedicated worker
thread (:class:`ThreadExecutor`, a one-thread ``ThreadPool``), one job at a time and in submission
order, so writes need no locking and a run's ``finished`` row always lands after its ``started``
row. The executor is a parameter; tests use :class:`SynchronousExecutor`, which runs each job
inline and makes the store deterministic.

Writes (:meth:`RunStore.run_started`, :meth:`~RunStore.run_rejected`,
:meth:`~RunStore.run_finished`) return Deferreds that never fail: a store failure is logged and must
never break a run. Opening does fail, and the daemon treats that as fatal. On open, every row still
``running`` (a run that was active when the node died) becomes ``interrupted``.

The database is in WAL mode with ``synchronous = NORMAL``: commits are not synced one by one
(a run costs two), so a killed node loses no row and a power loss at most the last ones.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from iop.config.model import DEFAULT_STORE_PATH

T = TypeVar("T")

# Longer error texts are cut to this many characters.
MAX_ERROR_CHARS = 4000

INTERRUPTED_REASON = "node stopped while the run was active"

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    adapter     TEXT NOT NULL,
    target      TEXT NOT NULL,
    session_id  TEXT NOT NULL DEFAULT '',
    background  INTEGER NOT NULL DEFAULT 0,
    status      TEXT NOT NULL
                CHECK (status IN ('running', 'completed', 'error', 'cancelled', 'interrupted')),
    created_at  REAL NOT NULL,
    started_at  REAL,
    finished_at REAL,
    error       TEXT NOT NULL DEFAULT '',
    request_id  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at);
"""
# After the migration (an older file's table has no request_id until it runs).
_INDEXES = "CREATE INDEX IF NOT EXISTS runs_by_request ON runs (request_id);"

_COLUMNS = (
    "run_id, adapter, target, session_id, background, status, "
    "created_at, started_at, finished_at, error, request_id"
)


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


FINAL_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.ERROR, RunStatus.CANCELLED, RunStatus.INTERRUPTED}
)


@dataclass(frozen=True)
class RunRecord:
    """One row of the store. Timestamps are seconds since the epoch."""

    run_id: str
    adapter: str
    target: str
    session_id: str
    background: bool
    status: RunStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: str
    request_id: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "adapter": self.adapter,
            "target": self.target,
            "session_id": self.session_id,
            "background": self.background,
            "status": self.status.value,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "request_id": self.request_id,
        }


def _record(row: tuple[object, ...]) -> RunRecord:
    (
        run_id,
        adapter,
        target,
        session_id,
        background,
        status,
        created,
        started,
        finished,
        error,
        request_id,
    ) = row
    return RunRecord(
        run_id=str(run_id),
        adapter=str(adapter),
        target=str(target),
        session_id=str(session_id),
        background=bool(background),
        status=RunStatus(str(status)),
        created_at=float(created),  # type: ignore[arg-type]
        started_at=None if started is None else float(started),  # type: ignore[arg-type]
        finished_at=None if finished is None else float(finished),  # type: ignore[arg-type]
        error=str(error),
        request_id=str(request_id),
    )


def _clip(error: str) -> str:
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Executors


class StoreExecutor(Protocol):
    """Runs the store's blocking jobs one at a time, in order, off the reactor thread."""

    def start(self) -> None: ...

    def submit(self, job: Callable[[], T]) -> Deferred[T]: ...

    def stop(self) -> None: ...


class ThreadExecutor:
    """One dedicated worker thread; results come back on the reactor thread."""

    def __init__(
        self,
        reactor: IReactorFromThreads,
        name: str = "iop-run-store",
        pool: ThreadPool | None = None,
    ) -> None:
        self._reactor = reactor
        self._pool = pool if pool is not None else ThreadPool(minthreads=1, maxthreads=1, name=name)
        self._started = False
        self._stopped = False

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._pool.start()
        add_trigger = getattr(self._reactor, "addSystemEventTrigger", None)
        if add_trigger is not None:
            # A safety net: never keep the process alive after the reactor stops.
            add_trigger("during", "shutdown", self.stop)

    def submit(self, job: Callable[[], T]) -> Deferred[T]:
        if not self._started or self._stopped:
            return fail(RuntimeError("the run store's worker thread is not running"))
        return deferToThreadPool(self._reactor, self._pool, job)

    def stop(self) -> None:
        if self._started and not self._stopped:
            self._stopped = True
            self._pool.stop()


class SynchronousExecutor:
    """Runs each job inline on the calling thread: for tests, and reactors without threads."""

    def start(self) -> None:
        pass

    def submit(self, job: Callable[[], T]) -> Deferred[T]:
        try:
            return succeed(job())
        except BaseException:
            return fail(Failure())

    def stop(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# The store


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"  # open() called (the open job may still be queued ahead of later jobs)
    CLOSED = "closed"


class RunStore:
    """
    The SQLite run store at ``uri`` (a ``file:`` URI or a plain path, opened with
    ``sqlite3.connect(uri, uri=True)``).

    :param clock: the time source of the timestamps (a reactor in a daemon).
    :param executor: where the blocking work runs; by default a :class:`ThreadExecutor` on
        ``clock``, which must then be a reactor (``IReactorFromThreads``).
    """

    log = Logger()

    def __init__(
        self,
        uri: str = DEFAULT_STORE_PATH,
        clock: IReactorTime | None = None,
        executor: StoreExecutor | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = reactor  # type: ignore[assignment]
        assert clock is not None
        self.uri = uri
        self._clock = clock
        if executor is None:
            executor = ThreadExecutor(clock)  # type: ignore[arg-type]
        self._executor: StoreExecutor = executor
        self._state = _State.NEW
        # Only ever touched by jobs on the executor.
        self._conn: sqlite3.Connection | None = None

    @property
    def is_open(self) -> bool:
        return self._state is _State.OPEN

    def _now(self) -> float:
        return float(self._clock.seconds())

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> Deferred[int]:
        """
        Open the database, create the schema, and mark rows left ``running`` as ``interrupted``.
        Fires with the number of interrupted runs; fails if the database cannot be opened.
        """
        if self._state is not _State.NEW:
            return fail(RuntimeError("a RunStore opens once"))
        self._state = _State.OPEN
        try:
            self._executor.start()
        except Exception:
            self._state = _State.CLOSED
            return fail(Failure())
        now = self._now()
        d = self._executor.submit(lambda: self._open_sync(now))

        def opened(interrupted: int) -> int:
            self.log.info(
                "run store open at {uri}; {interrupted} interrupted run(s) found",
                uri=self.uri,
                interrupted=interrupted,
            )
            return interrupted

        def failed(failure: Failure) -> Failure:
            self._state = _State.CLOSED
            self._executor.stop()
            return failure

        return d.addCallbacks(opened, failed)

    def close(self) -> Deferred[None]:
        """Close the database and stop the worker thread. Idempotent; never fails."""
        if self._state is not _State.OPEN:
            self._state = _State.CLOSED
            return succeed(None)
        self._state = _State.CLOSED
        d = self._executor.submit(self._close_sync)

        def closed(result: Failure | None) -> None:
            if isinstance(result, Failure):
                self.log.failure("closing the run store failed", result, uri=self.uri)
            self._executor.stop()

        return d.addBoth(closed)

    # -- writes ------------------------------------------------------------------------------

    def run_started(
        self,
        run_id: str,
        adapter: str,
        target: str,
        session_id: str = "",
        background: bool = False,
        created_at: float | None = None,
        started_at: float | None = None,
        request_id: str = "",
    ) -> Deferred[None]:
        """Record a run that began executing (status ``running``)."""
        now = self._now()
        created = now if created_at is None else created_at
        started = now if started_at is None else started_at
        row = (run_id, adapter, target, session_id, int(background), created, started, request_id)

        def job() -> None:
            with self._connection() as conn:
                conn.execute(
                    "INSERT OR REPLACE INTO runs (run_id, adapter, target, session_id, "
                    "background, status, created_at, started_at, finished_at, error, "
                    "request_id) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, NULL, '', ?)",
                    row,
                )

        return self._write("run_started", run_id, job)

    def run_rejected(
        self,
        run_id: str,
        adapter: str,
        target: str,
        error: str,
        session_id: str = "",
        background: bool = False,
        at: float | None = None,
        request_id: str = "",
    ) -> Deferred[None]:
        """Record a run refused before it started (status ``error``, no ``started_at``)."""
        when = self._now() if at is None else at
        row = (
            run_id,
            adapter,
            target,
            session_id,
            int(background),
            when,
            when,
            _clip(error),
            request_id,
        )

        def job() -> None:
            with self._connection() as conn:
                conn.execute(
                    "INSERT OR REPLACE INTO runs (run_id, adapter, target, session_id, "
                    "background, status, created_at, started_at, finished_at, error, "
                    "request_id) VALUES (?, ?, ?, ?, ?, 'error', ?, NULL, ?, ?, ?)",
                    row,
                )

        return self._write("run_rejected", run_id, job)

    def run_finished(
        self,
        run_id: str,
        status: RunStatus | str,
        error: str = "",
        session_id: str | None = None,
        finished_at: float | None = None,
    ) -> Deferred[None]:
        """
        Record a run's end. ``status`` is ``completed``, ``error``, ``cancelled`` or
        ``interrupted``; ``session_id`` (when given) replaces the recorded one, since adapters
        may assign it while running.
        """
        final = RunStatus(status)
        if final not in FINAL_STATUSES:
            raise ValueError(f"{final.value!r} is not a final run status")
        when = self._now() if finished_at is None else finished_at
        clipped = _clip(error)

        def job() -> None:
            with self._connection() as conn:
                if session_id is None:
                    cursor = conn.execute(
                        "UPDATE runs SET status = ?, finished_at = ?, error = ? WHERE run_id = ?",
                        (final.value, when, clipped, run_id),
                    )
                else:
                    cursor = conn.execute(
                        "UPDATE runs SET status = ?, finished_at = ?, error = ?, session_id = ? "
                        "WHERE run_id = ?",
                        (final.value, when, clipped, session_id, run_id),
                    )
                if cursor.rowcount == 0:
                    raise LookupError(f"no recorded run {run_id!r}")

        return self._write("run_finished", run_id, job)

    # -- reads -------------------------------------------------------------------------------

    def get(self, run_id: str) -> Deferred[RunRecord | None]:
        """The record of ``run_id``, or ``None``."""

        def job() -> RunRecord | None:
            row = (
                self._connection()
                .execute(f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
                .fetchone()
            )
            return None if row is None else _record(row)

        return self._read(job)

    def recent(self, limit: int = 50) -> Deferred[list[RunRecord]]:
        """Up to ``limit`` records, newest first."""

        def job() -> list[RunRecord]:
            rows = (
                self._connection()
                .execute(
                    f"SELECT {_COLUMNS} FROM runs ORDER BY created_at DESC, rowid DESC LIMIT ?",
                    (max(0, limit),),
                )
                .fetchall()
            )
            return [_record(row) for row in rows]

        return self._read(job)

    # -- plumbing ----------------------------------------------------------------------------

    def _write(self, what: str, run_id: str, job: Callable[[], None]) -> Deferred[None]:
        if self._state is not _State.OPEN:
            self.log.warn(
                "run store is not open; {what} of run {run_id} not recorded",
                what=what,
                run_id=run_id,
            )
            return succeed(None)
        try:
            d = self._executor.submit(job)
        except Exception:
            d = fail(Failure())

        def failed(failure: Failure) -> None:
            self.log.failure(
                "run store {what} of run {run_id} failed",
                failure,
                what=what,
                run_id=run_id,
            )

        return d.addErrback(failed)

    def _read(self, job: Callable[[], T]) -> Deferred[T]:
        if self._state is not _State.OPEN:
            return fail(RuntimeError("the run store is not open"))
        return self._executor.submit(job)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the run store's database is not open")
        return self._conn

    def _open_sync(self, now: float) -> int:
        conn = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            # A write-ahead log synced at checkpoints, not at every run's two commits: a node
            # killed at any moment loses nothing (the log is the OS's), a machine that loses
            # power may lose its last rows. (An in-memory database keeps its own journal.)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            with conn:
                conn.executescript(_SCHEMA)
                _migrate(conn)
                conn.executescript(_INDEXES)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            with conn:
                cursor = conn.execute(
                    "UPDATE runs SET status = 'interrupted', finished_at = ?, error = ? "
                    "WHERE status = 'running'",
                    (now, INTERRUPTED_REASON),
                )
                interrupted = cursor.rowcount
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return interrupted

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a file of an older schema to this one (module docstring): schema 1 lacks
    ``request_id``."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "request_id" not in columns:
        conn.execute("ALTER TABLE runs ADD COLUMN request_id TEXT NOT NULL DEFAULT ''")
