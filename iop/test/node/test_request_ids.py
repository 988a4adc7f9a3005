"""
The client request's id on a node: from a run's or tunnel's metadata into the run store row
(schema 2, an older file migrated), ``describe``, every log line about that work, and (sent by
the Edge as a request header) the upstream request.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.store import RunStore, SynchronousExecutor
from iop.runtime.events import RuntimeEvent
from iop.test.node.fakes import capture_events
from iop.test.node.test_runs import RunManagerTestCase, run_request
from iop.test.node.test_tunnel import TunnelCase, chat

REQUEST_ID = "req_01JDTESTTESTTESTTESTTESTTE"

# The run store's schema 1, as a node before request ids wrote it.
SCHEMA_1 = """
CREATE TABLE runs (
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
    error       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_by_created ON runs (created_at);
INSERT INTO runs VALUES ('old', 'gpu', 'm', '', 0, 'completed', 1.0, 1.0, 2.0, '');
PRAGMA user_version = 1;
"""


class MigrationTests(SynchronousTestCase):
    def test_a_schema_1_file_gains_the_column(self) -> None:
        path = os.path.abspath(self.mktemp())
        old = sqlite3.connect(path)
        old.executescript(SCHEMA_1)
        old.close()
        store = RunStore(path, Clock(), SynchronousExecutor())
        self.successResultOf(store.open())
        record = self.successResultOf(store.get("old"))
        assert record is not None
        self.assertEqual((record.status.value, record.request_id), ("completed", ""))
        self.successResultOf(store.run_started("new", "gpu", "m", request_id=REQUEST_ID))
        new = self.successResultOf(store.get("new"))
        assert new is not None
        self.assertEqual(new.request_id, REQUEST_ID)
        self.successResultOf(store.close())
        db = sqlite3.connect(path)
        self.addCleanup(db.close)
        self.assertEqual(db.execute("PRAGMA user_version").fetchone(), (2,))
        indexes = {row[1] for row in db.execute("PRAGMA index_list(runs)")}
        self.assertIn("runs_by_request", indexes)
        # Opening again changes nothing.
        again = RunStore(path, Clock(), SynchronousExecutor())
        self.successResultOf(again.open())
        self.successResultOf(again.close())


class RunTests(RunManagerTestCase):
    def test_the_store_row_describe_and_log_lines_name_it(self) -> None:
        logged = capture_events(self)
        self.submit(run_id="r1", metadata={"request_id": REQUEST_ID})
        self.assertEqual(self.record("r1").request_id, REQUEST_ID)
        described: Any = self.manager.describe()["active"]
        self.assertEqual([a["request_id"] for a in described], [REQUEST_ID])
        self.gpu.last.emit(RuntimeEvent.complete())
        self.clock.advance(0)
        about = [e for e in logged if e.get("run_id") == "r1"]
        self.assertTrue(about)
        for event in about:
            self.assertEqual(event.get("request_id"), REQUEST_ID, event)

    def test_a_refused_run_is_recorded_with_it(self) -> None:
        self.submit(run_request("r2", adapter="nope", metadata={"request_id": REQUEST_ID}))
        self.submit(run_request("r3", metadata={}))
        self.assertEqual(self.record("r3").request_id, "")

    def test_an_id_that_is_not_sane_is_dropped(self) -> None:
        self.submit(run_id="r4", metadata={"request_id": "two words"})
        self.assertEqual(self.record("r4").request_id, "")
        self.gpu.last.emit(RuntimeEvent.complete())
        self.clock.advance(0)


class TunnelTests(TunnelCase):
    def test_the_upstream_gets_it_and_log_lines_name_it(self) -> None:
        fake = self.use_fake(tokens=2)
        self.open(
            chat(),
            headers=(("content-type", "application/json"), ("x-request-id", REQUEST_ID)),
            metadata={"request_id": REQUEST_ID},
        )
        self.assertValid()
        self.assertEqual(fake.requests[0].headers["x-request-id"], REQUEST_ID)
        about = [e for e in self.events if e.get("run_id") == "t1"]
        self.assertTrue(about)
        for event in about:
            self.assertEqual(event.get("request_id"), REQUEST_ID, event)

    def test_describe_and_cancel_name_it(self) -> None:
        self.use_fake(tokens=4, delay_ms=1000)
        self.open(chat(), metadata={"request_id": REQUEST_ID})
        described: Any = self.tunnels.describe()["active"]
        self.assertEqual([a["request_id"] for a in described], [REQUEST_ID])
        self.assertTrue(self.tunnels.cancel("t1", "client went away"))
        self.end_turn()
        cancelling = [e for e in self.events if "cancelling" in e.get("log_format", "")]
        self.assertEqual([e["request_id"] for e in cancelling], [REQUEST_ID])
        self.advance(5, steps=5)
