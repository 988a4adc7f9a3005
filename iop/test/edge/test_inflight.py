"""The Edge's in-flight table: the sequence fence, the cancel grace and the sweep on a fence."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.errors import DispatchError
from iop.edge.inflight import InFlight, InFlightTable
from iop.test.edge.fixtures import FakeConnection


class InFlightTableTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.table: InFlightTable[str] = InFlightTable(self.clock, 10, "run", "event")
        self.conn = FakeConnection()

    def test_add_rejects_a_key_in_flight(self) -> None:
        self.table.add("r", "item", "node-a", self.conn, 1)
        error = self.assertRaises(DispatchError, self.table.add, "r", "x", "node-a", self.conn, 1)
        self.assertEqual(str(error), "run 'r' is already active")
        self.assertIn("r", self.table)

    def test_fence_counts_only_own_connection_in_increasing_sequence(self) -> None:
        entry = self.table.add("r", "item", "node-a", self.conn, 1)
        self.assertIsNone(self.table.accept(FakeConnection(), "r", 1))
        self.assertIsNone(self.table.accept(self.conn, "other", 1))
        self.assertIs(self.table.accept(self.conn, "r", 1), entry)
        self.assertIsNone(self.table.accept(self.conn, "r", 1))
        self.assertIs(self.table.accept(self.conn, "r", 5), entry)
        self.assertIsNone(self.table.accept(self.conn, "r", 4))
        self.assertEqual(entry.last_sequence, 5)

    def test_grace_fires_once_unless_ended(self) -> None:
        self.table.add("a", "A", "node-a", self.conn, 1)
        self.table.add("b", "B", "node-a", self.conn, 1)
        expired: list[InFlight[str]] = []
        self.table.start_grace("a", expired.append)
        self.table.start_grace("b", expired.append)
        self.table.pop("b")
        self.clock.advance(10)
        self.assertEqual([e.key for e in expired], ["a"])
        self.assertIsNone(expired[0].cancel_timer)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_pop_once(self) -> None:
        self.table.add("r", "item", "node-a", self.conn, 1)
        self.assertIsNotNone(self.table.pop("r"))
        self.assertIsNone(self.table.pop("r"))
        self.assertEqual(list(self.table), [])

    def test_sweep_takes_only_that_generation(self) -> None:
        self.table.add("old", "1", "node-a", self.conn, 1)
        self.table.add("new", "2", "node-a", self.conn, 2)
        self.table.add("other", "3", "node-b", self.conn, 1)
        self.assertEqual([e.key for e in self.table.of_generation("node-a", 1)], ["old"])
