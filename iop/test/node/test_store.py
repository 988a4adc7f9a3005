"""The SQLite run store, driven with a synchronous executor (no threads, deterministic)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import DEFAULT_STORE_PATH
from iop.node.store import (
    INTERRUPTED_REASON,
    MAX_ERROR_CHARS,
    RunRecord,
    RunStatus,
    RunStore,
    SynchronousExecutor,
    ThreadExecutor,
)
from iop.test.node.fakes import capture_events


class StoreTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.path = os.path.abspath(self.mktemp())

    def uri(self) -> str:
        return f"file:{self.path}?mode=rwc"

    def open_store(self, uri: str | None = None) -> RunStore:
        store = RunStore(uri or self.uri(), self.clock, SynchronousExecutor())
        self.successResultOf(store.open())
        self.addCleanup(store.close)
        return store

    def get(self, store: RunStore, run_id: str) -> RunRecord:
        record = self.successResultOf(store.get(run_id))
        assert record is not None
        return record


class SchemaTests(StoreTestCase):
    def test_write_ahead_log(self) -> None:
        store = self.open_store()
        store.run_started("r1", "gpu", "m")
        self.successResultOf(store.close())
        conn = sqlite3.connect(self.path)
        self.addCleanup(conn.close)
        self.assertEqual(conn.execute("PRAGMA journal_mode").fetchone(), ("wal",))
        self.assertEqual(conn.execute("SELECT run_id FROM runs").fetchall(), [("r1",)])

    def test_schema(self) -> None:
        store = self.open_store()
        self.successResultOf(store.close())
        conn = sqlite3.connect(self.path)
        self.addCleanup(conn.close)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
        self.assertEqual(
            columns,
            [
                "run_id",
                "adapter",
                "target",
                "session_id",
                "background",
                "status",
                "created_at",
                "started_at",
                "finished_at",
                "error",
                "request_id",
            ],
        )
        self.assertEqual(conn.execute("PRAGMA user_version").fetchone(), (2,))

    def test_reopenKeepsRows(self) -> None:
        store = RunStore(self.uri(), self.clock, SynchronousExecutor())
        self.successResultOf(store.open())
        store.run_started("r1", "gpu", "llama")
        store.run_finished("r1", RunStatus.COMPLETED)
        self.successResultOf(store.close())
        again = self.open_store()
        self.assertEqual(self.get(again, "r1").status, RunStatus.COMPLETED)

    def test_defaultUri(self) -> None:
        self.assertEqual(RunStore(clock=self.clock).uri, DEFAULT_STORE_PATH)
        self.assertEqual(DEFAULT_STORE_PATH, "file:iop.db?cache=shared&mode=rwc")

    def test_inMemory(self) -> None:
        store = self.open_store(":memory:")
        store.run_started("r1", "gpu", "llama")
        self.assertEqual(self.get(store, "r1").status, RunStatus.RUNNING)


class RecordTests(StoreTestCase):
    def test_startAndFinish(self) -> None:
        store = self.open_store()
        self.assertIsNone(
            self.successResultOf(
                store.run_started(
                    "r1",
                    "agent",
                    "repo",
                    session_id="s1",
                    background=True,
                    created_at=990.0,
                    started_at=995.0,
                    request_id="req_r1",
                )
            )
        )
        record = self.get(store, "r1")
        self.assertEqual(
            record.as_dict(),
            {
                "run_id": "r1",
                "adapter": "agent",
                "target": "repo",
                "session_id": "s1",
                "background": True,
                "status": "running",
                "created_at": 990.0,
                "started_at": 995.0,
                "finished_at": None,
                "error": "",
                "request_id": "req_r1",
            },
        )
        self.clock.advance(5)
        self.successResultOf(store.run_finished("r1", "error", "boom", session_id="s2"))
        record = self.get(store, "r1")
        self.assertEqual(
            (record.status, record.error, record.finished_at, record.session_id),
            (RunStatus.ERROR, "boom", 1005.0, "s2"),
        )

    def test_defaultTimestampsFromTheClock(self) -> None:
        store = self.open_store()
        store.run_started("r1", "gpu", "llama")
        record = self.get(store, "r1")
        self.assertEqual((record.created_at, record.started_at), (1000.0, 1000.0))
        self.assertFalse(record.background)

    def test_rejected(self) -> None:
        store = self.open_store()
        store.run_rejected("r1", "gpu", "llama", "adapter 'gpu' is at capacity (1/1)", "s1")
        record = self.get(store, "r1")
        self.assertEqual(
            (record.status, record.started_at, record.finished_at, record.error),
            (RunStatus.ERROR, None, 1000.0, "adapter 'gpu' is at capacity (1/1)"),
        )

    def test_eachFinalStatus(self) -> None:
        store = self.open_store()
        for status in ("completed", "error", "cancelled", "interrupted"):
            store.run_started(status, "gpu", "t")
            store.run_finished(status, status)
            self.assertEqual(self.get(store, status).status.value, status)

    def test_notAFinalStatus(self) -> None:
        store = self.open_store()
        self.assertRaises(ValueError, store.run_finished, "r1", RunStatus.RUNNING)
        self.assertRaises(ValueError, store.run_finished, "r1", "exploded")

    def test_getUnknown(self) -> None:
        self.assertIsNone(self.successResultOf(self.open_store().get("nope")))

    def test_recent(self) -> None:
        store = self.open_store()
        for i in range(5):
            self.clock.advance(1)
            store.run_started(f"r{i}", "gpu", "t")
        records = self.successResultOf(store.recent(3))
        self.assertEqual([r.run_id for r in records], ["r4", "r3", "r2"])
        self.assertEqual(len(self.successResultOf(store.recent())), 5)

    def test_restartedRunIdReplacesRow(self) -> None:
        store = self.open_store()
        store.run_started("r1", "gpu", "t")
        store.run_finished("r1", "error", "x")
        store.run_started("r1", "gpu", "t2")
        record = self.get(store, "r1")
        self.assertEqual(
            (record.status, record.target, record.error), (RunStatus.RUNNING, "t2", "")
        )

    def test_longErrorClipped(self) -> None:
        store = self.open_store()
        store.run_started("r1", "gpu", "t")
        store.run_finished("r1", "error", "x" * (MAX_ERROR_CHARS * 2))
        self.assertEqual(len(self.get(store, "r1").error), MAX_ERROR_CHARS)


class InterruptedTests(StoreTestCase):
    def test_runningRowsBecomeInterruptedOnOpen(self) -> None:
        first = RunStore(self.uri(), self.clock, SynchronousExecutor())
        self.successResultOf(first.open())
        first.run_started("active", "gpu", "t")
        first.run_started("done", "gpu", "t")
        first.run_finished("done", "completed")
        first.run_rejected("refused", "gpu", "t", "at capacity")
        # The node dies: the store is never closed properly.
        self.clock.advance(60)
        second = RunStore(self.uri(), self.clock, SynchronousExecutor())
        self.assertEqual(self.successResultOf(second.open()), 1)
        self.addCleanup(second.close)
        self.addCleanup(first.close)
        active = self.get(second, "active")
        self.assertEqual(
            (active.status, active.error, active.finished_at),
            (RunStatus.INTERRUPTED, INTERRUPTED_REASON, 1060.0),
        )
        self.assertEqual(self.get(second, "done").status, RunStatus.COMPLETED)
        self.assertEqual(self.get(second, "refused").status, RunStatus.ERROR)


class FailureTests(StoreTestCase):
    def test_openFails(self) -> None:
        missing = os.path.join(self.path, "no", "such", "dir", "iop.db")
        store = RunStore(f"file:{missing}?mode=rwc", self.clock, SynchronousExecutor())
        self.failureResultOf(store.open(), sqlite3.OperationalError)
        self.assertFalse(store.is_open)
        # Writes are skipped quietly, reads fail, close is harmless.
        self.assertIsNone(self.successResultOf(store.run_started("r1", "gpu", "t")))
        self.failureResultOf(store.get("r1"), RuntimeError)
        self.assertIsNone(self.successResultOf(store.close()))

    def test_openOnce(self) -> None:
        store = self.open_store()
        self.failureResultOf(store.open(), RuntimeError)

    def test_writeFailureIsLoggedNotRaised(self) -> None:
        store = self.open_store()
        events = capture_events(self)
        d = store.run_finished("never-started", "completed")
        self.assertIsNone(self.successResultOf(d))
        [logged] = self.flushLoggedErrors(LookupError)
        self.assertIn("never-started", str(logged.value))
        self.assertTrue(any(e.get("run_id") == "never-started" for e in events))

    def test_executorFailureIsLoggedNotRaised(self) -> None:
        class Broken(SynchronousExecutor):
            def submit(self, job: Callable[[], Any]) -> Deferred[Any]:
                return fail(OSError("disk I/O error"))

        store = RunStore(":memory:", self.clock, SynchronousExecutor())
        self.successResultOf(store.open())
        store._executor = Broken()
        self.assertIsNone(self.successResultOf(store.run_started("r1", "gpu", "t")))
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.assertIsNone(self.successResultOf(store.close()))
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_writesAfterCloseAreSkipped(self) -> None:
        store = self.open_store()
        self.successResultOf(store.close())
        self.successResultOf(store.close())
        self.assertIsNone(self.successResultOf(store.run_started("r1", "gpu", "t")))
        self.failureResultOf(store.recent(), RuntimeError)


class FakePool:
    """A ThreadPool stand-in that runs each job at once, on the calling thread."""

    def __init__(self) -> None:
        self.started = self.stopped = False
        self.jobs = 0

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def callInThreadWithCallback(
        self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *a: Any, **kw: Any
    ) -> None:
        self.jobs += 1
        try:
            result = f(*a, **kw)
        except BaseException as e:
            on_result(False, e)
        else:
            on_result(True, result)


class FakeThreadedReactor:
    def __init__(self) -> None:
        self.triggers: list[tuple[str, str, Callable[[], None]]] = []

    def callFromThread(self, f: Callable[..., Any], *a: Any, **kw: Any) -> None:
        f(*a, **kw)

    def addSystemEventTrigger(self, phase: str, event: str, f: Callable[[], None]) -> None:
        self.triggers.append((phase, event, f))


class ThreadExecutorTests(StoreTestCase):
    def test_jobsGoToThePoolAndBack(self) -> None:
        pool = FakePool()
        reactor = FakeThreadedReactor()
        executor = ThreadExecutor(reactor, pool=pool)  # type: ignore[arg-type]
        self.failureResultOf(executor.submit(lambda: 1), RuntimeError)
        store = RunStore(":memory:", self.clock, executor)
        self.successResultOf(store.open())
        self.assertTrue(pool.started)
        self.assertEqual([(p, e) for p, e, _ in reactor.triggers], [("during", "shutdown")])
        store.run_started("r1", "gpu", "t")
        self.assertEqual(self.get(store, "r1").status, RunStatus.RUNNING)
        self.assertEqual(pool.jobs, 3)
        self.successResultOf(store.close())
        self.assertTrue(pool.stopped)
        self.failureResultOf(executor.submit(lambda: 1), RuntimeError)
