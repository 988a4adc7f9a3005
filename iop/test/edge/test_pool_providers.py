"""
Providers added to and removed from a node by a config refresh, in the pool: plan, switch and
its undo; a new provider live at once on a ready node; a removed one retiring — no new work,
its waiters moved or ended, its leases returned exactly once — and a state machine over
add/remove/acquire/release/fence sequences on both lease tables whose counters come back to
zero with every lease returned once.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import EdgeConfig, ProviderConfig
from iop.edge.cluster.table import ClusterLeaseTable
from iop.edge.errors import Overloaded, QueueTimeout, Unavailable
from iop.edge.leasetable import Lease
from iop.edge.pool import ProviderPool
from iop.edge.status import snapshot
from iop.test import examples
from iop.test.edge.cluster.memtable import MemoryTable
from iop.test.edge.test_pool import ModelSpec, PoolTestCase, make_config, outcome_of, prov


def catalog(
    nodes: Mapping[str, Iterable[ProviderConfig]], models: Mapping[str, ModelSpec]
) -> EdgeConfig:
    return make_config({n: list(ps) for n, ps in nodes.items()}, models)


class AddRemoveTests(PoolTestCase):
    def setUp(self) -> None:
        self.build({"n1": [prov("p1", max_queue=4)], "n2": [prov("p3")]}, {"m": ["p1"]})

    def switch(self, config: EdgeConfig) -> Any:
        undo = self.pool.switch(self.pool.plan(config))
        self.pool.pump()
        return undo

    def test_added_on_a_ready_node_is_live_at_once(self) -> None:
        first = self.lease("m")
        waiting = outcome_of(self.pool.acquire("m"))
        self.switch(
            catalog({"n1": [prov("p1"), prov("p2")], "n2": [prov("p3")]}, {"m": ["p1", "p2"]})
        )
        [lease] = waiting
        self.assertEqual((lease.provider_id, lease.generation), ("p2", self.active["n1"]))
        self.assertEqual(self.counters("p2")["in_flight"], 1)
        self.assertEqual(first.provider_id, "p1")

    def test_added_on_a_node_not_ready_is_unavailable_until_it_is(self) -> None:
        self.fence("n2")
        self.switch(catalog({"n1": [prov("p1")], "n2": [prov("p3"), prov("p4")]}, {"k": ["p4"]}))
        self.failureResultOf(self.pool.acquire("k"), Unavailable)
        self.ready("n2")
        self.assertEqual(self.lease("k").provider_id, "p4")

    def test_removed_takes_no_new_work_and_its_leases_end_once(self) -> None:
        self.switch(
            catalog({"n1": [prov("p1"), prov("p2")], "n2": [prov("p3")]}, {"m": ["p1", "p2"]})
        )
        held = self.lease("m"), self.lease("m")
        self.assertEqual({lease.provider_id for lease in held}, {"p1", "p2"})
        on_p1 = next(lease for lease in held if lease.provider_id == "p1")
        waiting = outcome_of(self.pool.acquire("m"))
        self.switch(catalog({"n1": [prov("p2")], "n2": [prov("p3")]}, {"m": ["p2"]}))
        self.assertEqual(waiting, [], "p2 is still full")
        self.assertEqual(self.pool.removed("n1")[0][1]["in_flight"], 1)
        self.assertTrue(self.pool.snapshot()["providers"]["p1"]["removed"])
        stats = self.pool.stats()
        self.assertEqual(stats.in_flight[("p1", "n1")], 1)
        # Its release frees nothing for the waiter (p1 is gone), and counts once.
        on_p1.release()
        on_p1.release()
        self.assertEqual(waiting, [])
        self.assertEqual(self.pool.removed("n1"), [])
        self.assertNotIn("p1", self.pool.snapshot()["providers"])
        self.assertNotIn(("p1", "n1"), self.pool.stats().in_flight)
        # A release on p2 serves the waiter there.
        next(lease for lease in held if lease.provider_id == "p2").release()
        self.assertEqual([lease.provider_id for lease in waiting], ["p2"])

    def test_removed_last_candidate_ends_waiters_unavailable(self) -> None:
        self.lease("m")
        waiting = outcome_of(self.pool.acquire("m"))
        self.switch(catalog({"n1": [], "n2": [prov("p3")]}, {"m": []}))
        [error] = waiting
        self.assertIsInstance(error, Unavailable)

    def test_fence_returns_a_retiring_providers_leases(self) -> None:
        lease = self.lease("m")
        self.switch(catalog({"n1": [], "n2": [prov("p3")]}, {}))
        self.assertEqual(len(self.pool.removed("n1")), 1)
        self.fence("n1")
        self.assertTrue(lease.fenced)
        self.assertEqual(self.pool.removed("n1"), [])
        lease.release()
        self.assertEqual(self.pool.stats().lease_grants, {("p3", "n2"): 0})

    def test_added_back_while_retiring_keeps_its_leases_and_counts(self) -> None:
        lease = self.lease("m")
        self.switch(catalog({"n1": [], "n2": [prov("p3")]}, {}))
        self.switch(catalog({"n1": [prov("p1", capacity=2)], "n2": [prov("p3")]}, {"m": ["p1"]}))
        self.assertEqual(self.pool.removed("n1"), [])
        self.assertEqual(self.counters("p1")["in_flight"], 1)
        second = self.lease("m")
        self.assertEqual(self.counters("p1")["in_flight"], 2)
        lease.release()
        second.release()
        stats = self.pool.stats()
        self.assertEqual(stats.lease_grants[("p1", "n1")], 2)
        self.assertEqual(stats.lease_releases[("p1", "n1", "released")], 2)

    def test_retiring_elsewhere_is_refused(self) -> None:
        self.lease("m")
        self.switch(catalog({"n1": [], "n2": [prov("p3")]}, {}))
        e = self.assertRaises(
            ValueError,
            self.pool.plan,
            catalog({"n1": [], "n2": [prov("p3"), prov("p1")]}, {}),
        )
        self.assertIn("still holds 1 leases on node n1", str(e))

    def test_undo_restores_the_catalog_and_its_leases(self) -> None:
        lease = self.lease("m")
        before = self.pool.snapshot()
        undo = self.pool.switch(
            self.pool.plan(catalog({"n1": [prov("p2")], "n2": [prov("p3")]}, {"m": ["p2"]}))
        )
        self.assertEqual(set(self.pool.snapshot()["providers"]), {"p1", "p2", "p3"})
        self.pool.switch(undo)
        self.assertEqual(self.pool.snapshot(), before)
        self.assertEqual(self.pool.removed("n1"), [])
        lease.release()
        self.assertEqual(self.counters("p1")["in_flight"], 0)
        self.assertEqual(self.pool.stats().lease_releases[("p1", "n1", "released")], 1)

    def test_status_lists_a_retiring_provider_until_its_last_lease(self) -> None:
        lease = self.lease("m")
        config = catalog({"n1": [], "n2": [prov("p3")]}, {})
        self.switch(config)

        class Ready:
            def is_ready(self, node_id: str) -> bool:
                return True

            def state(self, node_id: str) -> str:
                return "ready"

            def identity(self, node_id: str) -> dict[str, Any]:
                return {}

            def last_refusal(self, node_id: str) -> None:
                return None

            def down_since(self, node_id: str) -> float | None:
                return None

        entries = {p["id"]: p for p in snapshot(config, Ready(), self.pool)["providers"]}
        self.assertEqual(
            {k: entries["p1"][k] for k in ("status", "health", "capacity", "in_flight")},
            {"status": "removed", "health": "draining", "capacity": 0, "in_flight": 1},
        )
        self.assertEqual(snapshot(config, Ready(), self.pool)["nodes"][0]["providers"], [])
        lease.release()
        ids = [p["id"] for p in snapshot(config, Ready(), self.pool)["providers"]]
        self.assertEqual(ids, ["p3"])


# ---------------------------------------------------------------------------------------------
# The state machine

NODES = ("n1", "n2")
# Every provider that may be configured, and on which node.
POSSIBLE = {
    "a": ("n1", prov("a", capacity=2, long_threshold=50, long_capacity=1, max_queue=3)),
    "b": ("n1", prov("b", capacity=1, queue_timeout=5)),
    "c": ("n2", prov("c", capacity=2, max_queue=2)),
    "d": ("n2", prov("d", capacity=1, priority=1)),
}
TOKENS = [0, 10, 60]


class AddRemoveMachine(RuleBasedStateMachine):
    """Acquires, releases, adds, removes, fences and readies on one pool; its counters match
    what the requests saw at every step, and come back to zero."""

    def make_pool(self, config: EdgeConfig, clock: Clock) -> ProviderPool:
        return ProviderPool(config, clock)

    @initialize(start=st.sets(st.sampled_from(sorted(POSSIBLE)), min_size=1))
    def setup(self, start: set[str]) -> None:
        self.clock = Clock()
        self.configured = set(start)
        self.pool = self.make_pool(self.config(), self.clock)
        self.generation = 0
        self.active: dict[str, int] = {}
        for node_id in NODES:
            self.ready(node_id)
        self.held: list[Lease] = []
        self.released: list[Lease] = []
        self.outcomes: list[list[Any]] = []

    def config(self) -> EdgeConfig:
        nodes = {
            n: [POSSIBLE[p][1] for p in sorted(self.configured) if POSSIBLE[p][0] == n]
            for n in NODES
        }
        models = {"m": sorted(self.configured), "k": sorted(self.configured & {"a", "c"})}
        return catalog(nodes, models)

    # -- rules ---------------------------------------------------------------------------------

    @rule(model=st.sampled_from(["m", "k"]), tokens=st.sampled_from(TOKENS))
    def acquire(self, model: str, tokens: int) -> None:
        seen = outcome_of(self.pool.acquire(model, prompt_tokens=tokens))
        self.outcomes.append(seen)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held = self.leases()
        if not held:
            return
        lease = data.draw(st.sampled_from(held))
        lease.release()
        if data.draw(st.booleans()):
            lease.release()  # a second release changes nothing

    @rule(provider=st.sampled_from(sorted(POSSIBLE)))
    def toggle(self, provider: str) -> None:
        """Add the provider if it is not configured, remove it if it is."""
        self.configured ^= {provider}
        # Each provider has one node here: the plan never refuses (no move).
        self.pool.switch(self.pool.plan(self.config()))
        self.pool.pump()

    @rule(node=st.sampled_from(NODES))
    def reconnect(self, node: str) -> None:
        if node in self.active:
            self.pool.node_fenced(node, self.active.pop(node))
        self.ready(node)

    @rule(node=st.sampled_from(NODES))
    def disconnect(self, node: str) -> None:
        if node in self.active:
            self.pool.node_fenced(node, self.active.pop(node))
            self.pool.pump()

    @rule(seconds=st.sampled_from([1.0, 6.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- helpers -------------------------------------------------------------------------------

    def ready(self, node_id: str) -> None:
        self.generation += 1
        self.active[node_id] = self.generation
        self.pool.node_ready(node_id, self.generation)

    def leases(self) -> list[Lease]:
        """Every lease granted so far that is neither released nor fenced."""
        granted = [o[0] for o in self.outcomes if o and isinstance(o[0], Lease)]
        return [lease for lease in granted if not lease.released and not lease.fenced]

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def counters_match_the_leases_held(self) -> None:
        if not hasattr(self, "pool"):
            return
        held = collections.Counter((lease.provider_id, lease.node_id) for lease in self.leases())
        stats = self.pool.stats()
        for key, count in stats.in_flight.items():
            assert count == held.get(key, 0), (key, count, held)
            grants = stats.lease_grants[key]
            returned = sum(stats.lease_releases[(*key, o)] for o in ("released", "fenced"))
            assert grants - returned == count, (key, grants, returned, count)
        # A fence returns every lease of its generation, a retiring provider's too.
        for lease in self.leases():
            assert self.active.get(lease.node_id) == lease.generation, lease
        # A provider holding leases is in the stats: configured or retiring.
        assert set(held) <= set(stats.in_flight), (held, stats.in_flight)
        retiring = {p.id for n in NODES for p, _ in self.pool.removed(n)}
        assert retiring == {pid for pid, _ in held} - self.configured, retiring
        # No removed provider takes new work: no lease on one is younger than its removal
        # (checked as: nothing retiring is a candidate of any model).
        for n in NODES:
            for p, counts in self.pool.removed(n):
                assert counts["in_flight"] == held[(p.id, n)] > 0

    @invariant()
    def each_outcome_once(self) -> None:
        if not hasattr(self, "pool"):
            return
        for seen in self.outcomes:
            assert len(seen) <= 1, seen
            if seen:
                assert isinstance(seen[0], Lease | Unavailable | Overloaded | QueueTimeout), seen

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        for _ in range(100):
            leases = self.leases()
            if not leases and not self.pool.snapshot()["waiters"]:
                break
            for lease in leases:
                lease.release()
            self.clock.advance(30)
        assert all(len(seen) == 1 for seen in self.outcomes), self.outcomes
        stats = self.pool.stats()
        assert set(stats.in_flight.values()) <= {0}, stats.in_flight
        assert all(self.pool.removed(n) == [] for n in NODES)
        assert set(stats.in_flight) == {(pid, POSSIBLE[pid][0]) for pid in self.configured}, (
            stats.in_flight
        )


class ClusterAddRemoveMachine(AddRemoveMachine):
    """The same on the cluster's lease table over an in-memory store answering at once: every
    lease id is released to the store exactly once, and the store ends empty."""

    def make_pool(self, config: EdgeConfig, clock: Clock) -> ProviderPool:
        self.store = MemoryTable(clock)
        self.store_releases: collections.Counter[str] = collections.Counter()
        release = self.store.release

        def counted(lease_id: str) -> Deferred[bool]:
            self.store_releases[lease_id] += 1
            return release(lease_id)

        self.store.release = counted  # type: ignore[method-assign]
        table = ClusterLeaseTable(
            self.store, clock, edge_id="edge-a", lease_ttl_sec=10**7, provider_ids=()
        )
        self.table = table
        return ProviderPool(config, clock, table)

    @invariant()
    def each_lease_id_returned_at_most_once(self) -> None:
        if not hasattr(self, "store"):
            return
        assert all(n == 1 for n in self.store_releases.values()), self.store_releases
        by_provider = collections.Counter(h.provider_id for h in self.store.leases.values())
        mine = collections.Counter(lease.provider_id for lease in self.leases())
        assert by_provider == mine, (by_provider, mine)

    @invariant()
    def the_view_reports_the_pools_providers(self) -> None:
        if not hasattr(self, "store"):
            return
        reported = list(self.pool.provider_ids())
        retiring = [p.id for n in NODES for p, _ in self.pool.removed(n)]
        assert set(reported) == self.configured | set(retiring), reported

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "store"):
            assert self.store.leases == {}, self.store.leases


class AddRemoveMachineTests(SynchronousTestCase):
    def run_machine(self, machine: type[AddRemoveMachine]) -> None:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples(150),
                stateful_step_count=40,
                deadline=None,
                derandomize=True,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )

    def test_in_process_table(self) -> None:
        self.run_machine(AddRemoveMachine)

    def test_cluster_table(self) -> None:
        self.run_machine(ClusterAddRemoveMachine)
