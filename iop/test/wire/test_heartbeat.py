"""The heartbeat helper on a fake clock."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.wire.heartbeat import Heartbeat


class HeartbeatTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[int] = []
        self.timeouts: list[bool] = []
        self.hb = Heartbeat(
            self.clock, 2.0, 5.0, self.sent.append, lambda: self.timeouts.append(True)
        )
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))

    def test_sends_every_interval(self) -> None:
        self.hb.start()
        self.clock.advance(2)
        self.clock.advance(2)
        self.assertEqual(self.sent, [1, 2])
        self.hb.received()
        self.hb.stop()

    def test_times_out_after_silence(self) -> None:
        self.hb.start()
        self.clock.advance(4.9)
        self.assertEqual(self.timeouts, [])
        self.clock.advance(0.1)
        self.assertEqual(self.timeouts, [True])
        self.assertFalse(self.hb.running)

    def test_received_pushes_deadline(self) -> None:
        self.hb.start()
        for _ in range(10):
            self.clock.advance(4)
            self.hb.received()
        self.assertEqual(self.timeouts, [])
        self.hb.stop()

    def test_stop_is_idempotent_and_start_restarts(self) -> None:
        self.hb.start()
        self.hb.start()
        self.hb.stop()
        self.hb.stop()
        self.clock.advance(10)
        self.assertEqual((self.sent, self.timeouts), ([], []))

    def test_rejects_nonpositive(self) -> None:
        self.assertRaises(ValueError, Heartbeat, self.clock, 0, 5, self.sent.append, lambda: None)
