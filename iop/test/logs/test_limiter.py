# -*- test-case-name: iop.test.logs.test_limiter -*-
"""
Tests for :mod:`iop.logs.limiter`: one line per key per interval, a burst cap over all keys,
the summary of what was held back (once, an interval after the first), bounded memory. All on
``task.Clock``.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.logs.limiter import LogLimiter


class LimiterTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.summaries: list[tuple[int, dict[str, int], float]] = []
        self.limiter = LogLimiter(
            self.clock, lambda *s: self.summaries.append(s), interval=60.0, burst=3
        )
        self.clock.advance(1000)

    def assertNothingPending(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.limiter.pending(), 0)


class PerKeyTests(LimiterTestCase):
    def test_first_event_of_a_key_gets_a_line(self) -> None:
        self.assertTrue(self.limiter.admit(("10.0.0.1", "expired"), "expired"))
        self.assertNothingPending()

    def test_same_key_within_the_interval_is_held(self) -> None:
        self.assertTrue(self.limiter.admit("a", "x"))
        self.clock.advance(59.9)
        self.assertFalse(self.limiter.admit("a", "x"))
        self.assertEqual(self.limiter.pending(), 1)

    def test_same_key_after_the_interval_gets_a_line_again(self) -> None:
        self.assertTrue(self.limiter.admit("a", "x"))
        self.clock.advance(60)
        self.assertTrue(self.limiter.admit("a", "x"))

    def test_other_keys_are_independent(self) -> None:
        self.assertTrue(self.limiter.admit(("h", "expired"), "expired"))
        self.assertTrue(self.limiter.admit(("h", "unknown_ca"), "unknown_ca"))
        self.assertTrue(self.limiter.admit(("other-host", "expired"), "expired"))


class BurstTests(LimiterTestCase):
    def test_at_most_burst_lines_per_interval_whatever_the_keys(self) -> None:
        admitted = [self.limiter.admit(f"host-{i}", "x") for i in range(10)]
        self.assertEqual(admitted, [True] * 3 + [False] * 7)
        self.assertEqual(self.limiter.pending(), 7)

    def test_the_burst_is_a_sliding_window(self) -> None:
        for i in range(3):
            self.assertTrue(self.limiter.admit(f"host-{i}", "x"))
            self.clock.advance(10)
        # Lines at 0, 10, 20; now 30: full until the first ages out at 60.
        self.assertFalse(self.limiter.admit("host-3", "x"))
        self.clock.advance(29.9)
        self.assertFalse(self.limiter.admit("host-4", "x"))
        self.clock.advance(0.1)
        self.assertTrue(self.limiter.admit("host-5", "x"))


class SummaryTests(LimiterTestCase):
    def test_a_flood_gets_one_line_and_one_summary(self) -> None:
        start = self.clock.seconds()
        admitted = 0
        for _ in range(1000):
            admitted += self.limiter.admit(("127.0.0.1", "no_certificate"), "no_certificate")
            self.clock.advance(0.001)
        self.assertEqual(admitted, 1)
        self.assertEqual(self.summaries, [])
        # The summary comes one interval after the first event held back (the second one).
        self.clock.advance(58.9)
        self.assertEqual(self.summaries, [])
        self.clock.advance(0.2)
        self.assertEqual(self.summaries, [(999, {"no_certificate": 999}, start + 0.001)])
        self.assertNothingPending()

    def test_the_summary_counts_by_category(self) -> None:
        self.limiter.admit("a", "expired")
        self.limiter.admit("a", "expired")
        self.limiter.admit("a", "unknown_ca")
        self.limiter.admit("a", "expired")
        self.clock.advance(60)
        self.assertEqual(self.summaries, [(3, {"expired": 2, "unknown_ca": 1}, 1000.0)])

    def test_no_summary_and_no_timer_when_nothing_was_held(self) -> None:
        for i in range(3):
            self.limiter.admit(i, "x")
        self.assertNothingPending()
        self.clock.advance(600)
        self.assertEqual(self.summaries, [])

    def test_one_summary_per_interval_under_a_steady_flood(self) -> None:
        for _ in range(300):
            self.limiter.admit("a", "x")
            self.clock.advance(1)
        # 300 s: one line at 0 and one each time the key's interval is over (60, 120, ...).
        counts = [count for count, _, _ in self.summaries]
        self.assertEqual(len(self.summaries), 4)
        self.assertTrue(all(55 <= c <= 60 for c in counts), counts)
        self.clock.advance(60)
        self.assertEqual(sum(c for c, _, _ in self.summaries) + 5, 300)
        self.assertNothingPending()

    def test_flush_summarises_now(self) -> None:
        self.limiter.admit("a", "x")
        self.limiter.admit("a", "x")
        self.limiter.flush()
        self.assertEqual(self.summaries, [(1, {"x": 1}, 1000.0)])
        self.assertNothingPending()
        self.limiter.flush()
        self.assertEqual(len(self.summaries), 1)


class BoundsTests(LimiterTestCase):
    def test_memory_stays_bounded_with_ever_new_keys(self) -> None:
        for i in range(10_000):
            self.limiter.admit(f"host-{i}", "x")
            self.clock.advance(0.5)
        self.assertLessEqual(len(self.limiter._last), 2 * self.limiter.burst)
        self.clock.advance(60)

    def test_bad_parameters(self) -> None:
        self.assertRaises(ValueError, LogLimiter, self.clock, print, interval=0)
        self.assertRaises(ValueError, LogLimiter, self.clock, print, burst=0)
