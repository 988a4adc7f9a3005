"""
Waiting for a provider: FIFO pump, per-model-group limits and timeouts, cancellation, and
re-evaluation on fence, disable and reconnect.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.errors import Overloaded, QueueTimeout, Unavailable
from iop.edge.pool import Lease
from iop.edge.queue import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_QUEUE_TIMEOUT_SEC,
    WaitQueue,
    queue_limit,
    queue_timeout,
)
from iop.test.edge.test_pool import PoolTestCase, outcome_of, prov, zero


class LimitRuleTests(SynchronousTestCase):
    def test_limit_sums_with_default_for_zero(self) -> None:
        self.assertEqual(DEFAULT_MAX_QUEUE, 100)
        self.assertEqual(queue_limit([prov("a", max_queue=2), prov("b", max_queue=3)]), 5)
        self.assertEqual(queue_limit([prov("a", max_queue=2), prov("b", max_queue=0)]), 102)
        self.assertEqual(queue_limit([]), 0)

    def test_timeout_is_max_with_default_for_zero(self) -> None:
        self.assertEqual(DEFAULT_QUEUE_TIMEOUT_SEC, 60.0)
        self.assertEqual(
            queue_timeout([prov("a", queue_timeout=5), prov("b", queue_timeout=10)]), 10
        )
        self.assertEqual(
            queue_timeout([prov("a", queue_timeout=5), prov("b", queue_timeout=0)]), 60
        )
        self.assertEqual(
            queue_timeout([prov("a", queue_timeout=90), prov("b", queue_timeout=0)]), 90
        )
        self.assertEqual(queue_timeout([]), 60)


class WaitQueueTests(SynchronousTestCase):
    """The queue on its own: FIFO passes, timers, cancellation, decide-then-deliver."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.discarded: list[str] = []
        self.queue: WaitQueue[str] = WaitQueue(
            self.clock,
            expired=lambda w: TimeoutError(w.model_id),
            discard=self.discarded.append,
        )

    def test_fifo_pass_skips_undecided(self) -> None:
        ds = [self.queue.enqueue(m, 0, 10) for m in ["a", "b", "a", "c"]]
        seen = [outcome_of(d) for d in ds]  # type: ignore[arg-type]
        asked: list[str] = []

        def decide(w: Any) -> str | None:
            asked.append(w.model_id)
            return None if w.model_id == "b" else f"lease-{w.seq}"

        self.queue.settle(decide)
        self.assertEqual(asked, ["a", "b", "a", "c"])
        self.assertEqual(seen, [["lease-1"], [], ["lease-3"], ["lease-4"]])
        self.assertEqual(
            (len(self.queue), self.queue.waiting("b"), self.queue.waiting("a")), (1, 1, 0)
        )
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_timeout(self) -> None:
        d = self.queue.enqueue("a", 0, 10)
        self.clock.advance(9.99)
        self.assertNoResult(d)
        self.clock.advance(0.01)
        self.assertEqual(str(self.failureResultOf(d, TimeoutError).value), "a")
        self.assertEqual((len(self.queue), self.clock.getDelayedCalls()), (0, []))

    def test_cancel_removes_waiter_and_timer(self) -> None:
        d = self.queue.enqueue("a", 0, 10)
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual((len(self.queue), self.queue.waiting("a")), (0, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_outcomes_delivered_after_the_whole_pass(self) -> None:
        """No caller code runs inside a pass: by the time the first waiter hears, every
        decision of the pass has been made."""
        d1 = self.queue.enqueue("a", 0, 10)
        d2 = self.queue.enqueue("a", 0, 10)
        decided: list[int] = []
        at_delivery: list[list[int]] = []
        d1.addCallback(lambda r: at_delivery.append(list(decided)))

        def decide(w: Any) -> str:
            decided.append(w.seq)
            return "x"

        self.queue.settle(decide)
        self.assertEqual(at_delivery, [[1, 2]])
        self.successResultOf(d2)

    def test_result_for_cancelled_waiter_is_discarded(self) -> None:
        d1 = self.queue.enqueue("a", 0, 10)
        d2 = self.queue.enqueue("a", 0, 10)
        d1.addCallback(lambda r: d2.cancel())
        self.queue.settle(lambda w: f"lease-{w.seq}")
        self.assertEqual(self.successResultOf(d1), None)
        self.failureResultOf(d2, CancelledError)
        self.assertEqual(self.discarded, ["lease-2"])

    def test_error_for_cancelled_waiter_is_dropped(self) -> None:
        d1 = self.queue.enqueue("a", 0, 10)
        d2 = self.queue.enqueue("a", 0, 10)
        d1.addErrback(lambda f: d2.cancel())
        self.queue.settle(lambda w: ValueError("no"))
        self.failureResultOf(d2, CancelledError)
        self.assertEqual(self.discarded, [])


class LaterDecisionTests(SynchronousTestCase):
    """A pump whose decisions answer later (a table on another server): one question at a
    time in arrival order, what was decided delivered before waiting, one pass more for a
    settle meanwhile, and nothing for a waiter gone while its answer was awaited."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.discarded: list[str] = []
        self.queue: WaitQueue[str] = WaitQueue(
            self.clock,
            expired=lambda w: TimeoutError(w.model_id),
            discard=self.discarded.append,
        )
        self.asked: list[tuple[int, Deferred[str | BaseException | None]]] = []

    def later(self, waiter: Any) -> Deferred[str | BaseException | None]:
        d: Deferred[str | BaseException | None] = Deferred()
        self.asked.append((waiter.seq, d))
        return d

    def test_one_question_at_a_time_in_arrival_order(self) -> None:
        ds = [self.queue.enqueue("a", 0, 10) for _ in range(3)]
        seen = [outcome_of(d) for d in ds]  # type: ignore[arg-type]
        self.queue.settle(self.later)
        self.assertEqual([seq for seq, _ in self.asked], [1])
        self.asked[0][1].callback("lease-1")
        self.assertEqual(seen[0], ["lease-1"])
        self.assertEqual([seq for seq, _ in self.asked], [1, 2])
        self.asked[1][1].callback(None)  # full: waiter 3 is asked too (no group given)
        self.asked[2][1].errback(ValueError("no"))
        self.assertEqual((seen[1], type(seen[2][0])), ([], ValueError))
        self.assertEqual(len(self.queue), 1)
        ds[1].cancel()

    def test_a_full_group_is_asked_once_per_pass(self) -> None:
        ds = [self.queue.enqueue(m, 0, 10) for m in ["a", "a", "b"]]
        self.queue.settle(self.later, group=lambda w: w.model_id)
        self.asked[0][1].callback(None)  # group "a" is full: the second "a" is not asked
        self.assertEqual([seq for seq, _ in self.asked], [1, 3])
        self.asked[1][1].callback("lease-3")
        self.assertEqual(self.successResultOf(ds[2]), "lease-3")
        for d in ds[:2]:
            d.cancel()
            self.failureResultOf(d, CancelledError)

    def test_a_settle_meanwhile_asks_for_one_more_pass(self) -> None:
        d = self.queue.enqueue("a", 0, 10)
        self.queue.settle(self.later)
        self.queue.settle(self.later)
        self.queue.settle(self.later)
        self.assertEqual(len(self.asked), 1)
        self.asked[0][1].callback(None)
        self.assertEqual(len(self.asked), 2)  # the one pass asked for meanwhile
        self.asked[1][1].callback(None)
        self.assertEqual(len(self.asked), 2)
        d.cancel()
        self.failureResultOf(d, CancelledError)

    def test_the_pass_asked_for_meanwhile_sees_the_waiters_queued_since(self) -> None:
        first = self.queue.enqueue("a", 0, 10)
        self.queue.settle(self.later)
        self.queue.settle(self.later)
        second = self.queue.enqueue("b", 0, 10)
        self.asked[0][1].callback(None)
        self.assertEqual([seq for seq, _ in self.asked], [1, 1])
        self.asked[1][1].callback(None)
        self.assertEqual([seq for seq, _ in self.asked], [1, 1, 2])
        self.asked[2][1].callback("lease-2")
        self.assertEqual(self.successResultOf(second), "lease-2")
        first.cancel()
        self.failureResultOf(first, CancelledError)

    def test_decided_outcomes_are_delivered_before_waiting(self) -> None:
        first = self.queue.enqueue("a", 0, 10)
        second = self.queue.enqueue("a", 0, 10)

        def decide(waiter: Any) -> str | Deferred[str | BaseException | None]:
            return "now" if waiter.seq == 1 else self.later(waiter)

        self.queue.settle(decide)
        self.assertEqual(self.successResultOf(first), "now")
        self.assertNoResult(second)
        self.asked[0][1].callback("later")
        self.assertEqual(self.successResultOf(second), "later")

    def test_a_result_for_a_waiter_gone_meanwhile_is_discarded(self) -> None:
        gone = self.queue.enqueue("a", 0, 10)
        timed_out = self.queue.enqueue("b", 0, 1)
        self.queue.settle(self.later)
        gone.cancel()
        self.failureResultOf(gone, CancelledError)
        self.asked[0][1].callback("lease-1")
        self.clock.advance(1)
        self.failureResultOf(timed_out, TimeoutError)
        self.asked[1][1].callback("lease-2")
        self.assertEqual(self.discarded, ["lease-1", "lease-2"])
        self.assertEqual(self.queue.stats.outcomes, {("a", "withdrawn"): 1, ("b", "timeout"): 1})

    def test_an_answer_already_there_costs_no_wait(self) -> None:
        ds = [self.queue.enqueue("a", 0, 10) for _ in range(200)]
        self.queue.settle(lambda w: succeed(f"lease-{w.seq}"))
        self.assertEqual([self.successResultOf(d) for d in ds][-1], "lease-200")


class PoolQueueTests(PoolTestCase):
    def tearDown(self) -> None:
        # Every test settles its waiters: no timer is left behind.
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_fifo_pump_in_arrival_order(self) -> None:
        self.build({"n1": [prov("p")]}, {"a": ["p"], "b": ["p"]})
        held = self.lease("a")
        order = ["a", "b", "a", "b"]
        waits = [self.pool.acquire(m) for m in order]
        for d in waits:
            self.assertNoResult(d)
        for i, model in enumerate(order):
            held.release()
            held = self.successResultOf(waits[i])
            self.assertEqual(held.model_id, model)
            for later in waits[i + 1 :]:
                self.assertNoResult(later)
        held.release()
        self.assertEqual(self.counters("p"), zero())

    def test_blocked_waiter_skipped_for_other_providers(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2")]}, {"a": ["p1"], "b": ["p2"]})
        held_a, held_b = self.lease("a"), self.lease("b")
        first = self.pool.acquire("a")
        second = self.pool.acquire("b")
        held_b.release()
        self.assertNoResult(first)
        lease = self.successResultOf(second)
        self.assertEqual(lease.provider_id, "p2")
        held_a.release()
        self.successResultOf(first).release()
        lease.release()

    def test_long_waiter_skipped_short_waiter_proceeds(self) -> None:
        self.build(
            {"n1": [prov("p", capacity=2, long_threshold=100, long_capacity=1)]}, {"m": ["p"]}
        )
        held_long, held_short = self.lease("m", 500), self.lease("m", 1)
        long_wait = self.pool.acquire("m", prompt_tokens=500)
        short_wait = self.pool.acquire("m", prompt_tokens=1)
        held_short.release()
        self.assertNoResult(long_wait)
        short = self.successResultOf(short_wait)
        held_long.release()
        long = self.successResultOf(long_wait)
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 2, "long_in_flight": 1})
        short.release()
        long.release()

    def test_queue_full_is_overloaded(self) -> None:
        self.build(
            {"n1": [prov("p1", max_queue=2), prov("p2", max_queue=1)]},
            {"m": ["p1", "p2"], "other": ["p1"]},
        )
        held = [self.lease("m"), self.lease("m")]
        waits = [self.pool.acquire("m") for _ in range(3)]
        err = self.failureResultOf(self.pool.acquire("m"), Overloaded).value
        self.assertEqual((err.limit, err.model_id), (3, "m"))
        # The limit is per model group: "other" (p1 only, limit 2) still queues.
        other = self.pool.acquire("other")
        self.assertNoResult(other)
        self.assertEqual(len(self.pool.snapshot()["waiters"]), 4)
        for d in [*waits, other]:
            d.cancel()
            self.failureResultOf(d, CancelledError)
        for lease in held:
            lease.release()

    def test_default_queue_limit(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        waits = [self.pool.acquire("m") for _ in range(100)]
        self.failureResultOf(self.pool.acquire("m"), Overloaded)
        held.release()
        # One waiter got the slot: room for one more.
        self.successResultOf(waits[0]).release()
        for d in waits[2:]:
            d.cancel()
            self.failureResultOf(d)
        self.successResultOf(waits[1]).release()

    def test_disabled_provider_does_not_add_queue_room(self) -> None:
        self.build(
            {"n1": [prov("p1", max_queue=1), prov("p2", max_queue=5, enabled=False)]},
            {"m": ["p1", "p2"]},
        )
        held = self.lease("m")
        wait = self.pool.acquire("m")
        self.failureResultOf(self.pool.acquire("m"), Overloaded)
        wait.cancel()
        self.failureResultOf(wait)
        held.release()

    def test_queue_timeout_is_max_over_enabled_providers(self) -> None:
        self.build(
            {
                "n1": [
                    prov("p1", queue_timeout=5),
                    prov("p2", queue_timeout=10),
                    prov("p3", queue_timeout=30, enabled=False),
                ]
            },
            {"m": ["p1", "p2", "p3"]},
        )
        held = [self.lease("m"), self.lease("m")]
        d = self.pool.acquire("m")
        self.clock.advance(9.9)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        err = self.failureResultOf(d, QueueTimeout).value
        self.assertEqual(err.timeout, 10)
        self.assertEqual(self.counters("p1")["queued"], 0)
        for lease in held:
            lease.release()

    def test_default_queue_timeout(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        d = self.pool.acquire("m")
        self.clock.advance(59)
        self.assertNoResult(d)
        self.clock.advance(1)
        self.failureResultOf(d, QueueTimeout)
        held.release()
        self.assertEqual(self.counters("p1"), zero())

    def test_cancel_waiting_acquire(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        gone = self.pool.acquire("m")
        next_ = self.pool.acquire("m")
        gone.cancel()
        self.failureResultOf(gone, CancelledError)
        self.assertEqual(self.counters("p1")["queued"], 1)
        held.release()
        lease = self.successResultOf(next_)
        lease.release()
        self.assertEqual(self.counters("p1"), zero())

    def test_lease_for_waiter_cancelled_during_delivery_never_leaks(self) -> None:
        """Two waiters are granted in one pump; the first one's callback cancels the second
        before it hears: its lease goes straight back."""
        self.build({"n1": [prov("p1", capacity=2)], "n2": [prov("p2")]}, {"m": ["p1", "p2"]})
        self.fence("n1")
        held = self.lease("m")  # p2
        first = self.pool.acquire("m")
        second = self.pool.acquire("m")

        def cancel_second(lease: Lease) -> Lease:
            second.cancel()
            return lease

        first.addCallback(cancel_second)
        self.ready("n1")  # grants both waiters on p1
        self.failureResultOf(second, CancelledError)
        lease = self.successResultOf(first)
        self.assertEqual(self.counters("p1")["in_flight"], 1)
        lease.release()
        held.release()
        self.assertEqual(self.counters("p1"), zero())

    def test_release_from_callback_reenters_safely(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        first = self.pool.acquire("m")
        second = self.pool.acquire("m")
        first.addCallback(lambda lease: lease.release())
        held.release()
        self.successResultOf(first)
        lease = self.successResultOf(second)
        self.assertEqual(self.counters("p1")["in_flight"], 1)
        lease.release()

    def test_fence_of_last_candidate_fails_waiters_now(self) -> None:
        self.build({"n1": [prov("p1")], "n2": [prov("p2")]}, {"m": ["p1"], "both": ["p1", "p2"]})
        held = self.lease("m")
        held2 = self.lease("both")  # p2 (p1 is busy)
        only = self.pool.acquire("m")
        both = self.pool.acquire("both")
        self.fence("n1")
        self.failureResultOf(only, Unavailable)
        self.assertNoResult(both)  # p2 is still live
        self.assertEqual(self.counters("p2")["queued"], 1)
        self.fence("n2")
        self.failureResultOf(both, Unavailable)
        self.assertEqual(self.pool.snapshot()["waiters"], [])
        held.release()
        held2.release()

    def test_reconnect_pumps_existing_waiters_at_once(self) -> None:
        self.build({"n1": [prov("p1")], "n2": [prov("p2")]}, {"m": ["p1", "p2"]})
        a, b = self.lease("m"), self.lease("m")
        waiting = self.pool.acquire("m")
        self.fence("n2")  # b's slot is returned, but p2 is offline
        self.assertTrue(b.fenced)
        self.assertNoResult(waiting)
        generation = self.ready("n2")
        lease = self.successResultOf(waiting)
        self.assertEqual((lease.provider_id, lease.generation), ("p2", generation))
        b.release()  # stale: nothing changes
        self.assertEqual(self.counters("p2")["in_flight"], 1)
        lease.release()
        a.release()
        self.assertEqual((self.counters("p1"), self.counters("p2")), (zero(), zero()))

    def test_waiter_outcome_recorded_once(self) -> None:
        """A granted Deferred that the client later cancels keeps its lease (the holder
        releases it); cancelling does not produce a second outcome."""
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        d: Deferred[Lease] = self.pool.acquire("m")
        seen = outcome_of(d)
        held.release()
        d.cancel()
        self.assertEqual(len(seen), 1)
        self.assertIsInstance(seen[0], Lease)
        seen[0].release()
        self.assertEqual(self.counters("p1"), zero())
