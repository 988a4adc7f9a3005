"""
The provider pool with a draining node (:meth:`ProviderPool.node_draining`): no new grants on it,
its held leases counted and released exactly once, waiters moving to another live candidate or
waiting for the node to come back — examples, then a hypothesis machine over drain, acquire,
release, disconnect, ready and clock sequences whose counters come back to zero.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.errors import QueueTimeout, Unavailable
from iop.edge.pool import Lease, ProviderPool
from iop.test.edge.test_pool import PoolTestCase, make_config, prov, zero


class DrainExamples(PoolTestCase):
    def setUp(self) -> None:
        self.build(
            {"n1": [prov("a", capacity=2, queue_timeout=20)], "n2": [prov("b", capacity=2)]},
            {"m": ["a", "b"], "only-a": ["a"]},
        )

    def drain(self, node_id: str) -> None:
        self.pool.node_draining(node_id, self.active[node_id])

    def test_no_new_grants_held_leases_count(self) -> None:
        held = self.lease("only-a")
        self.drain("n1")
        self.assertEqual(self.counters("a")["in_flight"], 1)
        self.assertFalse(self.pool.snapshot()["providers"]["a"]["live"])
        # m goes to n2; only-a waits (the node may come back), it is not Unavailable.
        self.assertEqual(self.lease("m").node_id, "n2")
        waiting = self.pool.acquire("only-a")
        self.assertNoResult(waiting)
        held.release()
        self.assertNoResult(waiting)  # a released slot on a draining node grants nothing
        stats = self.pool.stats()
        self.assertEqual(stats.lease_releases[("a", "n1", "released")], 1)
        self.assertEqual(stats.in_flight[("a", "n1")], 0)
        # The node goes (its fence finds nothing in flight) and comes back: the waiter is served.
        self.fence("n1")
        self.assertEqual(self.pool.stats().lease_releases[("a", "n1", "fenced")], 0)
        self.assertNoResult(waiting)
        self.ready("n1")
        self.assertEqual(self.successResultOf(waiting).node_id, "n1")

    def test_waiters_move_to_another_live_candidate(self) -> None:
        self.lease("m")
        self.lease("m")
        self.lease("m")
        self.lease("m")  # both full: a, b, a, b
        waiting = self.pool.acquire("m")
        self.assertNoResult(waiting)
        self.drain("n1")
        self.assertNoResult(waiting)
        [lease_b] = [lease for lease in self._held() if lease.node_id == "n2"][:1]
        lease_b.release()
        self.assertEqual(self.successResultOf(waiting).node_id, "n2")

    def _held(self) -> list[Lease]:
        return [lease for res in self.pool._resources.values() for lease in res.leases]

    def test_fence_returns_held_leases_once(self) -> None:
        held = self.lease("only-a")
        self.drain("n1")
        self.fence("n1")
        stats = self.pool.stats()
        self.assertEqual(stats.lease_releases[("a", "n1", "fenced")], 1)
        held.release()  # after its fence: counts nothing
        self.assertEqual(self.pool.stats().lease_releases[("a", "n1", "released")], 0)

    def test_waits_for_a_drained_node_one_queue_timeout(self) -> None:
        self.drain("n1")
        self.fence("n1")
        waiting = self.pool.acquire("only-a")
        self.assertNoResult(waiting)
        self.clock.advance(20)
        self.failureResultOf(waiting, QueueTimeout)
        # Past one queue timeout after the fence, the node is not waited for any more.
        self.failureResultOf(self.pool.acquire("only-a"), Unavailable)

    def test_lost_node_is_unavailable_at_once(self) -> None:
        """A node lost without draining keeps today's rule."""
        self.fence("n1")
        self.failureResultOf(self.pool.acquire("only-a"), Unavailable)

    def test_stale_drain_ignored(self) -> None:
        self.pool.node_draining("n1", self.active["n1"] + 5)
        self.assertEqual(self.lease("only-a").node_id, "n1")

    def test_new_generation_serves(self) -> None:
        self.drain("n1")
        self.fence("n1")
        self.ready("n1")
        self.assertEqual(self.lease("only-a").node_id, "n1")
        self.assertEqual(self.counters("a")["in_flight"], 1)

    def test_counters_zero_for_offline(self) -> None:
        self.drain("n1")
        self.fence("n1")
        self.assertEqual(self.counters("a"), zero())


class DrainMachine(RuleBasedStateMachine):
    """Random drains, acquires, releases (some repeated), fences, readies and clock steps."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        nodes = {
            "n1": [prov("a", capacity=2, queue_timeout=5), prov("c", capacity=1)],
            "n2": [prov("b", capacity=1, queue_timeout=8)],
        }
        self.pool = ProviderPool(make_config(nodes, {"m": ["a", "b"], "x": ["c"]}), self.clock)
        self.generation = 0
        self.active: dict[str, int] = {}
        self.draining: set[str] = set()
        self.leases: list[Lease] = []
        self.pending: list[Deferred[Lease]] = []
        for node_id in nodes:
            self._ready(node_id)

    def _ready(self, node_id: str) -> None:
        self.generation += 1
        self.active[node_id] = self.generation
        self.draining.discard(node_id)
        self.pool.node_ready(node_id, self.generation)

    def _collect(self, d: Deferred[Lease]) -> None:
        def got(lease: Lease) -> None:
            # Never a new grant on a node whose generation drains.
            assert lease.node_id not in self.draining, lease
            self.leases.append(lease)

        d.addCallbacks(got, lambda failure: None)

    @rule(model=st.sampled_from(["m", "x"]))
    def acquire(self, model: str) -> None:
        d = self.pool.acquire(model)
        self.pending.append(d)
        self._collect(d)

    @rule(index=st.integers(0, 20), twice=st.booleans())
    def release(self, index: int, twice: bool) -> None:
        if self.leases:
            lease = self.leases.pop(index % len(self.leases))
            lease.release()
            if twice:
                lease.release()

    @rule(node=st.sampled_from(["n1", "n2"]))
    def drain(self, node: str) -> None:
        if node in self.active:
            self.draining.add(node)
            self.pool.node_draining(node, self.active[node])

    @rule(node=st.sampled_from(["n1", "n2"]))
    def fence(self, node: str) -> None:
        if node in self.active:
            self.draining.discard(node)
            self.pool.node_fenced(node, self.active.pop(node))

    @rule(node=st.sampled_from(["n1", "n2"]))
    def ready(self, node: str) -> None:
        if node not in self.active:
            self._ready(node)

    @rule(seconds=st.sampled_from([0.5, 3, 10]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def counted(self) -> None:
        stats = self.pool.stats()
        for key, grants in stats.lease_grants.items():
            returned = (
                stats.lease_releases[(*key, "released")] + stats.lease_releases[(*key, "fenced")]
            )
            assert grants - returned == stats.in_flight[key], (key, stats)
        snapshot: dict[str, Any] = self.pool.snapshot()
        for pid, state in snapshot["providers"].items():
            assert state["in_flight"] <= state["capacity"], (pid, state)

    def teardown(self) -> None:
        # Everything back: leases released, nodes ready, queue emptied by time.
        for lease in self.leases:
            lease.release()
        self.leases = []
        for node in ("n1", "n2"):
            if node not in self.active:
                self._ready(node)
        for lease in self.leases:
            lease.release()
        self.leases = []
        self.clock.advance(60)
        for lease in self.leases:
            lease.release()
        stats = self.pool.stats()
        assert all(v == 0 for v in stats.in_flight.values()), stats
        assert self.pool.waiting() == {}, self.pool.waiting()
        for d in self.pending:
            assert d.called


class DrainPropertyTests(SynchronousTestCase):
    def test_drain_sequences(self) -> None:
        run_state_machine_as_test(
            DrainMachine,
            settings=settings(
                max_examples=150,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )
