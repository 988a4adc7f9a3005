# -*- test-case-name: iop.test.usage.test_ledger -*-
"""
The usage ledger of one Edge: one :class:`~iop.usage.store.UsageRecord` per finished client
request, written to its SQLite file (:mod:`iop.usage.store`) off the reactor thread, in
batches, and pruned to its retention once a day.

Decisions, and why:

- **One worker thread owns the connection** (a one-thread ``ThreadPool``, not
  ``adbapi.ConnectionPool``): SQLite takes one writer at a time anyway, a single thread keeps
  the connection's use serial without locks, and its FIFO queue orders everything — a question
  asked after a record was handed over is answered after that record is written, so ``GET
  /usage`` always includes what finished before it was asked. The file is opened on the
  reactor thread when the service starts, so an Edge that cannot open its ledger does not start
  (it was configured to keep one); from then on only the worker touches it.
- **:meth:`UsageLedger.record` never blocks and never fails the request.** Records wait in
  memory and are written every ``flush_interval`` seconds, or at once when ``batch_size`` of
  them wait, one transaction per batch. At most ``max_pending`` records may wait or be in the
  worker's hands at once; past that (the disk stalled) a new record is **dropped and counted**
  (``dropped`` in :meth:`stats`, a warning logged once per stall) rather than the reactor
  slowed or memory grown without bound — the request was served, and the budgets' running
  totals, which enforce limits, do not depend on the ledger. A batch the file refuses (disk
  full, I/O error) is counted in ``write_failures`` and logged; its records are lost, not
  retried forever.
- **Retention**: at start and then every 24 hours, records older than ``retention_days`` are
  deleted (0: kept forever). The clock is the reactor's (:class:`IReactorTime`), so tests drive
  it with ``task.Clock``.
- **Stopping** writes what waits, then closes the file, then stops the thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from iop.usage.query import Totals, UsageQuery
from iop.usage.store import LedgerStore, UsageRecord

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_FLUSH_INTERVAL_SEC",
    "DEFAULT_MAX_PENDING",
    "PRUNE_INTERVAL_SEC",
    "InlineWorker",
    "ThreadWorker",
    "UsageLedger",
    "Worker",
]

T = TypeVar("T")

DEFAULT_FLUSH_INTERVAL_SEC = 1.0
DEFAULT_BATCH_SIZE = 500
DEFAULT_MAX_PENDING = 10_000
PRUNE_INTERVAL_SEC = 24 * 3600.0
_DAY_MS = 24 * 3600 * 1000


class Worker(Protocol):
    """Where the store's calls run: in order, one at a time, off the reactor thread."""

    def start(self) -> None: ...

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]: ...

    def stop(self) -> None: ...


class ThreadWorker:
    """The production :class:`Worker`: one thread of its own."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="iop-usage-ledger")

    def start(self) -> None:
        self._pool.start()

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        return deferToThreadPool(self._reactor, self._pool, f, *args)

    def stop(self) -> None:
        self._pool.stop()


class InlineWorker:
    """A :class:`Worker` that runs each call at once on the caller's thread (tests, tools)."""

    def start(self) -> None:
        pass

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        return maybeDeferred(f, *args)

    def stop(self) -> None:
        pass


class UsageLedger(Service):
    """The ledger as a service of the Edge (named ``usage-ledger``)."""

    log = Logger()

    def __init__(
        self,
        path: str,
        reactor: IReactorTime,
        *,
        currency: str,
        retention_days: int,
        worker: Worker,
        opener: Callable[[str], LedgerStore] | None = None,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL_SEC,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.setName("usage-ledger")
        self.path = path
        self.currency = currency
        self.retention_days = retention_days
        self._reactor = reactor
        self._worker = worker
        self._opener = opener or (lambda p: LedgerStore.open(p, check_same_thread=False))
        self._flush_interval = flush_interval
        self._batch_size = batch_size
        self._max_pending = max_pending
        self._store: LedgerStore | None = None
        self._pending: list[UsageRecord] = []
        # Records handed over and not yet written (waiting here or in the worker's hands).
        self._queued = 0
        self._stalled = False
        self._flusher = LoopingCall(self.flush)
        self._flusher.clock = reactor
        self._pruner = LoopingCall(self.prune)
        self._pruner.clock = reactor
        self._counts = {"written": 0, "dropped": 0, "write_failures": 0, "pruned": 0}

    # -- the service -----------------------------------------------------------------------------

    def startService(self) -> None:
        try:
            self._store = self._opener(self.path)
        except Exception as e:
            raise RuntimeError(f"cannot open the usage ledger {self.path}: {e}") from e
        self._worker.start()
        super().startService()
        self._flusher.start(self._flush_interval, now=False)
        if self.retention_days > 0:
            self._pruner.start(PRUNE_INTERVAL_SEC, now=True)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        for loop in (self._flusher, self._pruner):
            if loop.running:
                loop.stop()
        store = self._store
        done = self.flush()
        if store is not None:
            done.addBoth(lambda _: self._worker.run(store.close))
        done.addErrback(self._logged, "closing the usage ledger failed")

        def stopped(_: object) -> None:
            self._store = None
            self._worker.stop()

        return done.addBoth(stopped)

    # -- writing -------------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The reactor's time in Unix milliseconds: a record's ``time_ms`` for "now"."""
        return round(self._reactor.seconds() * 1000)

    def record(self, record: UsageRecord) -> bool:
        """
        Hand ``record`` over to be written (its ``currency`` defaults to the ledger's). Never
        blocks; False when it was dropped (too many waiting, or the ledger is not running).
        """
        if self._store is None or self._queued >= self._max_pending:
            self._counts["dropped"] += 1
            if not self._stalled:
                self._stalled = True
                self.log.warn(
                    "usage ledger {path}: {queued} records wait to be written; dropping new "
                    "ones until the file catches up",
                    path=self.path,
                    queued=self._queued,
                )
            return False
        if not record.currency:
            record = replace(record, currency=self.currency)
        self._pending.append(record)
        self._queued += 1
        if len(self._pending) >= self._batch_size:
            self.flush()
        return True

    def flush(self) -> Deferred[None]:
        """Hand what waits to the worker as one batch; fires once it is written (or failed)."""
        store = self._store
        if not self._pending or store is None:
            return succeed(None)
        batch, self._pending = self._pending, []

        def written(count: int) -> None:
            self._counts["written"] += count
            self._stalled = False

        def failed(failure: Failure) -> None:
            self._counts["write_failures"] += len(batch)
            self.log.failure(
                "usage ledger {path}: {count} records could not be written",
                failure,
                path=self.path,
                count=len(batch),
            )

        def settled(_: None) -> None:
            self._queued -= len(batch)

        d: Deferred[None] = self._worker.run(store.insert, batch).addCallbacks(written, failed)
        d.addCallback(settled)
        return d

    def prune(self) -> Deferred[None]:
        """Delete the records older than the retention (nothing when it is 0)."""
        store = self._store
        if store is None or self.retention_days <= 0:
            return succeed(None)
        cutoff = self.now_ms() - self.retention_days * _DAY_MS

        def pruned(count: int) -> None:
            self._counts["pruned"] += count
            if count:
                self.log.info(
                    "usage ledger {path}: {count} records older than {days} days deleted",
                    path=self.path,
                    count=count,
                    days=self.retention_days,
                )

        d: Deferred[None] = self._worker.run(store.prune, cutoff).addCallback(pruned)
        d.addErrback(self._logged, "pruning the usage ledger failed")
        return d

    # -- reading -------------------------------------------------------------------------------

    def totals(self, query: UsageQuery) -> Deferred[list[Totals]]:
        """The totals answering ``query``, including every record handed over before it."""
        store = self._store
        if store is None:
            return fail(RuntimeError("the usage ledger is not open"))
        self.flush()
        return self._worker.run(store.totals, query)

    def stats(self) -> dict[str, int]:
        """``pending`` (waiting or being written), ``written``, ``dropped``,
        ``write_failures``, ``pruned``: since the Edge started."""
        return {"pending": self._queued, **self._counts}

    def _logged(self, failure: Failure, message: str) -> None:
        self.log.failure(message + " ({path})", failure, path=self.path)
