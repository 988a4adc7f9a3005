# -*- test-case-name: iop.test.edge.test_pool_stats -*-
"""
The pool's counters (:meth:`ProviderPool.stats`) for known sequences: leases granted and
returned (released or fenced), and every request's queue outcome, exactly.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError

from iop.edge.errors import Overloaded, QueueTimeout, Unavailable
from iop.edge.pool import Lease, PoolStats
from iop.edge.queue import QUEUE_OUTCOMES
from iop.test.edge.test_pool import PoolTestCase, prov


def outcomes(stats: PoolStats, model_id: str) -> dict[str, int]:
    """The non-zero queue outcomes of ``model_id``."""
    return {
        outcome: n
        for (model, outcome), n in stats.queue_outcomes.items()
        if model == model_id and n
    }


class PoolStatsTests(PoolTestCase):
    def test_every_label_is_there_at_zero(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2")], "n2": [prov("p3")]}, {"m": ["p1", "p3"]})
        stats = self.pool.stats()
        pairs = [("p1", "n1"), ("p2", "n1"), ("p3", "n2")]
        self.assertEqual(stats.lease_grants, dict.fromkeys(pairs, 0))
        self.assertEqual(
            stats.lease_releases,
            {(p, n, o): 0 for p, n in pairs for o in ("released", "fenced")},
        )
        self.assertEqual(stats.in_flight, dict.fromkeys(pairs, 0))
        self.assertEqual(stats.queue_entered, {"m": 0})
        self.assertEqual(stats.queue_outcomes, {("m", o): 0 for o in QUEUE_OUTCOMES})

    def test_grants_and_releases(self) -> None:
        self.build({"n1": [prov("p1", capacity=3)]}, {"m": ["p1"]})
        leases = [self.lease("m") for _ in range(3)]
        leases[0].release()
        leases[0].release()  # idempotent: counted once
        leases[1].release()
        stats = self.pool.stats()
        self.assertEqual(stats.lease_grants[("p1", "n1")], 3)
        self.assertEqual(stats.lease_releases[("p1", "n1", "released")], 2)
        self.assertEqual(stats.lease_releases[("p1", "n1", "fenced")], 0)
        self.assertEqual(stats.in_flight[("p1", "n1")], 1)
        self.assertEqual(outcomes(stats, "m"), {"served": 3})
        self.assertEqual(stats.queue_entered["m"], 0)

    def test_a_fence_returns_leases_and_a_later_release_counts_nothing(self) -> None:
        self.build({"n1": [prov("p1", capacity=2)], "n2": [prov("p2")]}, {"m": ["p1", "p2"]})
        held = [self.lease("m") for _ in range(3)]
        self.assertEqual([h.provider_id for h in held], ["p1", "p2", "p1"])
        held[0].release()
        self.fence("n1")
        for lease in held:
            lease.release()
        stats = self.pool.stats()
        self.assertEqual(stats.lease_grants, {("p1", "n1"): 2, ("p2", "n2"): 1})
        self.assertEqual(
            stats.lease_releases,
            {
                ("p1", "n1", "released"): 1,
                ("p1", "n1", "fenced"): 1,
                ("p2", "n2", "released"): 1,
                ("p2", "n2", "fenced"): 0,
            },
        )
        self.assertEqual(stats.in_flight, {("p1", "n1"): 0, ("p2", "n2"): 0})

    def test_queue_outcomes(self) -> None:
        self.build({"n1": [prov("p1", max_queue=2, queue_timeout=5)]}, {"m": ["p1"]})
        first = self.lease("m")  # served at once
        timed_out = self.pool.acquire("m")
        self.clock.advance(3)
        withdrawn = self.pool.acquire("m")
        self.assertIsInstance(self.failureResultOf(self.pool.acquire("m")).value, Overloaded)
        withdrawn.cancel()
        self.failureResultOf(withdrawn, CancelledError)
        served_later = self.pool.acquire("m")
        self.clock.advance(2)
        self.failureResultOf(timed_out, QueueTimeout)
        first.release()
        second = self.successResultOf(served_later)
        self.fence("n1")
        self.assertTrue(second.fenced)
        self.assertIsInstance(self.failureResultOf(self.pool.acquire("m")).value, Unavailable)
        stats = self.pool.stats()
        self.assertEqual(
            outcomes(stats, "m"),
            {"served": 2, "timeout": 1, "overloaded": 1, "withdrawn": 1, "unavailable": 1},
        )
        self.assertEqual(stats.queue_entered["m"], 3)
        self.assertEqual(stats.lease_grants[("p1", "n1")], 2)
        self.assertEqual(stats.lease_releases[("p1", "n1", "released")], 1)
        self.assertEqual(stats.lease_releases[("p1", "n1", "fenced")], 1)

    def test_waiter_made_unavailable_by_a_fence(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        held = self.lease("m")
        waiting = self.pool.acquire("m")
        self.fence("n1")
        self.failureResultOf(waiting, Unavailable)
        held.release()
        stats = self.pool.stats()
        self.assertEqual(outcomes(stats, "m"), {"served": 1, "unavailable": 1})
        self.assertEqual(stats.queue_entered["m"], 1)

    def test_a_waiter_cancelled_between_decision_and_delivery_is_withdrawn(self) -> None:
        """
        A node coming up lets two waiters in in one pump; the first one's callback cancels the
        second, already granted but not yet delivered: its lease goes back and it counts as
        withdrawn.
        """
        self.build(
            {"n1": [prov("p1")], "n2": [prov("p2", capacity=2)]}, {"m": ["p1", "p2"]}, ready=["n1"]
        )
        held = self.lease("m")
        first = self.pool.acquire("m")
        second = self.pool.acquire("m")

        def cancel_the_other(lease: Lease) -> Lease:
            second.cancel()
            return lease

        first.addCallback(cancel_the_other)
        self.ready("n2")
        self.successResultOf(first).release()
        self.failureResultOf(second, CancelledError)
        held.release()
        stats = self.pool.stats()
        self.assertEqual(outcomes(stats, "m"), {"served": 2, "withdrawn": 1})
        self.assertEqual(stats.queue_entered["m"], 2)
        self.assertEqual(stats.lease_grants, {("p1", "n1"): 1, ("p2", "n2"): 2})
        self.assertEqual(stats.lease_releases[("p2", "n2", "released")], 2)
        self.assertEqual(stats.in_flight, {("p1", "n1"): 0, ("p2", "n2"): 0})

    def test_an_unknown_model_counts_nowhere(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        self.pool.acquire("no-such-model").addErrback(lambda f: None)
        stats = self.pool.stats()
        self.assertEqual(set(stats.queue_entered), {"m"})
        self.assertEqual({m for m, _ in stats.queue_outcomes}, {"m"})
        self.assertEqual(sum(stats.queue_outcomes.values()), 0)
