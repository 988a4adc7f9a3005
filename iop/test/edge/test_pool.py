"""
The provider pool: catalog, candidates, selection, long context, leases and the generation fence,
driven synchronously with a fake clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from iop.config.model import (
    EdgeConfig,
    HeartbeatConfig,
    ModelConfig,
    ModelProviderRef,
    NodeConfig,
    NodeToken,
    ProviderConfig,
)
from iop.edge.errors import Overloaded, PoolError, QueueTimeout, Unavailable, UnknownModel
from iop.edge.interfaces import INodeLifecycleObserver
from iop.edge.pool import Lease, ProviderPool, is_long
from iop.edge.status import ProviderCounters

# ---------------------------------------------------------------------------------------------
# Config builders (shared with test_queue and test_pool_properties)


def prov(
    pid: str,
    *,
    capacity: int = 1,
    priority: int = 0,
    long_threshold: int = 0,
    long_capacity: int = 0,
    max_queue: int = 0,
    queue_timeout: float = 0.0,
    enabled: bool = True,
    type: str = "openai_compat",
    category: str = "api",
    attribution: str = "",
) -> ProviderConfig:
    return ProviderConfig(
        id=pid,
        adapter=f"{pid}-adapter",
        category=category,
        adapter_instance=f"{pid}-instance",
        type=type,
        models=("served",),
        enabled=enabled,
        priority=priority,
        capacity=capacity,
        long_context_threshold=long_threshold,
        long_capacity=long_capacity,
        max_queue=max_queue,
        queue_timeout_sec=queue_timeout,
        usage_attribution=attribution,
    )


ModelSpec = Sequence[str | tuple[str, str]]


def make_config(
    nodes: Mapping[str, Iterable[ProviderConfig]], models: Mapping[str, ModelSpec]
) -> EdgeConfig:
    """
    ``nodes``: node id → providers. ``models``: model id → provider ids (served target
    ``"<model>@<provider>"``) or ``(provider_id, target)`` pairs.
    """

    def ref(model_id: str, item: str | tuple[str, str]) -> ModelProviderRef:
        if isinstance(item, tuple):
            return ModelProviderRef(*item)
        return ModelProviderRef(item, f"{model_id}@{item}")

    return EdgeConfig(
        id="edge-test",
        node_listen="tcp:0:interface=127.0.0.1",
        admin_listen="tcp:0:interface=127.0.0.1",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(2.0, 5.0),
        max_frame_bytes=1024 * 1024,
        register_timeout_sec=10.0,
        nodes=tuple(
            NodeConfig(id=nid, token=NodeToken.from_plaintext(f"token-{nid}"), providers=tuple(ps))
            for nid, ps in nodes.items()
        ),
        models=tuple(
            ModelConfig(id=mid, providers=tuple(ref(mid, item) for item in refs))
            for mid, refs in models.items()
        ),
    )


class PoolTestCase(SynchronousTestCase):
    """A pool on a fake clock plus helpers; each test builds ``self.pool`` via :meth:`build`."""

    clock: Clock
    pool: ProviderPool

    def build(
        self,
        nodes: Mapping[str, Iterable[ProviderConfig]],
        models: Mapping[str, ModelSpec],
        *,
        ready: Iterable[str] | None = None,
    ) -> ProviderPool:
        self.clock = Clock()
        self.pool = ProviderPool(make_config(nodes, models), self.clock)
        self.generation = 0
        self.active: dict[str, int] = {}
        for nid in nodes if ready is None else ready:
            self.ready(nid)
        return self.pool

    def ready(self, node_id: str) -> int:
        self.generation += 1
        self.active[node_id] = self.generation
        self.pool.node_ready(node_id, self.generation)
        return self.generation

    def fence(self, node_id: str) -> int:
        generation = self.active.pop(node_id)
        self.pool.node_fenced(node_id, generation)
        return generation

    def lease(self, model_id: str, prompt_tokens: int = 0) -> Lease:
        d = self.pool.acquire(model_id, prompt_tokens=prompt_tokens)
        return self.successResultOf(d)

    def busy(self, provider_id: str) -> int:
        return int(self.pool.snapshot()["providers"][provider_id]["in_flight"])

    def counters(self, provider_id: str) -> dict[str, int]:
        node_id = self.pool.snapshot()["providers"][provider_id]["node_id"]
        return self.pool.counters(node_id, provider_id)


def zero() -> dict[str, int]:
    return {"in_flight": 0, "long_in_flight": 0, "queued": 0, "long_queued": 0}


# ---------------------------------------------------------------------------------------------


class CatalogTests(PoolTestCase):
    def test_interfaces(self) -> None:
        pool = self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        self.assertTrue(verifyObject(INodeLifecycleObserver, pool))
        counters: ProviderCounters = pool
        self.assertEqual(counters.counters("n1", "p1"), zero())

    def test_unknown_model(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        err = self.failureResultOf(self.pool.acquire("nope"), UnknownModel).value
        self.assertEqual(err.model_id, "nope")
        self.assertEqual(err.code, "model_not_found")
        self.assertEqual(str(err), "model 'nope' is not configured")
        self.assertIsInstance(err, PoolError)

    def test_lease_carries_dispatch_identity(self) -> None:
        self.build(
            {
                "n1": [
                    prov(
                        "p1",
                        type="ollama",
                        category="local_inference",
                        attribution="provider",
                        long_threshold=10,
                        capacity=2,
                    )
                ]
            },
            {"m": [("p1", "llama3:8b")]},
        )
        lease = self.lease("m", prompt_tokens=10)
        self.assertEqual(
            (
                lease.provider_id,
                lease.node_id,
                lease.generation,
                lease.adapter,
                lease.target,
                lease.model_id,
                lease.provider_type,
                lease.category,
                lease.usage_attribution,
                lease.long,
            ),
            (
                "p1",
                "n1",
                self.active["n1"],
                "p1-instance",
                "llama3:8b",
                "m",
                "ollama",
                "local_inference",
                "provider",
                True,
            ),
        )
        self.assertFalse(lease.released)
        self.assertFalse(lease.fenced)
        self.assertNotEqual(lease, self.lease("m"))

    def test_no_ready_node_is_unavailable(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]}, ready=[])
        err = self.failureResultOf(self.pool.acquire("m"), Unavailable).value
        self.assertEqual(str(err), "no provider is available for model 'm'")
        self.assertEqual(err.code, "unavailable")
        self.assertEqual(self.pool.snapshot()["waiters"], [])

    def test_pending_node_excluded(self) -> None:
        """Only a ready generation makes candidates; a configured node that never became
        ready contributes nothing."""
        self.build({"n1": [prov("p1")], "n2": [prov("p2")]}, {"m": ["p1", "p2"]}, ready=["n2"])
        for _ in range(3):
            lease = self.lease("m")
            self.assertEqual(lease.provider_id, "p2")
            lease.release()

    def test_disabled_in_config_is_unavailable(self) -> None:
        self.build({"n1": [prov("p1", enabled=False)]}, {"m": ["p1"]})
        self.failureResultOf(self.pool.acquire("m"), Unavailable)
        self.assertEqual(self.counters("p1"), zero())

    def test_model_without_usable_providers(self) -> None:
        """A model key whose refs name no configured provider is simply never available."""
        self.build({"n1": [prov("p1")]}, {"m": ["ghost"]})
        self.failureResultOf(self.pool.acquire("m"), Unavailable)


class SelectionTests(PoolTestCase):
    def occupy(self, provider_id: str, n: int) -> list[Lease]:
        """Hold ``n`` slots on one provider through its single-provider model key."""
        return [self.lease(f"only-{provider_id}") for _ in range(n)]

    def test_selection_table(self) -> None:
        """
        Each row: per provider (capacity, priority, occupied slots) in config order, and the
        provider picked first by a fresh model key listing all of them.
        """
        table: list[tuple[str, list[tuple[int, int, int]], str | None]] = [
            ("lowest in_flight wins", [(4, 0, 2), (4, 0, 1), (4, 0, 3)], "p1"),
            ("in_flight beats priority", [(4, 0, 1), (4, 5, 0)], "p1"),
            ("priority breaks ties", [(4, 3, 1), (4, 1, 1), (4, 2, 1)], "p1"),
            ("config order after priority", [(4, 1, 0), (4, 0, 0), (4, 0, 0)], "p1"),
            ("full candidates skipped", [(1, 0, 1), (3, 9, 2)], "p1"),
            ("all full", [(1, 0, 1), (2, 0, 2)], None),
            ("first tied in config order", [(2, 0, 0), (2, 0, 0)], "p0"),
        ]
        for name, rows, expected in table:
            with self.subTest(name):
                providers = [
                    prov(f"p{i}", capacity=cap, priority=prio)
                    for i, (cap, prio, _) in enumerate(rows)
                ]
                models: dict[str, ModelSpec] = {"all": [p.id for p in providers]}
                models.update({f"only-{p.id}": [p.id] for p in providers})
                self.build({"n1": providers}, models)
                for i, (_, _, held) in enumerate(rows):
                    self.occupy(f"p{i}", held)
                d = self.pool.acquire("all")
                if expected is None:
                    self.assertNoResult(d)
                    d.cancel()
                    self.failureResultOf(d)
                else:
                    self.assertEqual(self.successResultOf(d).provider_id, expected)

    def test_lowest_in_flight_spreads_load(self) -> None:
        self.build({"n1": [prov("p1", capacity=2), prov("p2", capacity=2)]}, {"m": ["p1", "p2"]})
        picked = [self.lease("m").provider_id for _ in range(4)]
        self.assertEqual(sorted(picked[:2]), ["p1", "p2"])
        self.assertEqual(sorted(picked[2:]), ["p1", "p2"])
        self.assertEqual((self.busy("p1"), self.busy("p2")), (2, 2))

    def test_round_robin_alternates_over_many_cycles(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2")], "n2": [prov("p3")]}, {"m": ["p1", "p2", "p3"]})
        picked = []
        for _ in range(30):
            lease = self.lease("m")
            picked.append(lease.provider_id)
            lease.release()
        self.assertEqual(picked, ["p1", "p2", "p3"] * 10)

    def test_round_robin_only_among_best_priority(self) -> None:
        self.build(
            {"n1": [prov("a", priority=1), prov("b", priority=0), prov("c", priority=0)]},
            {"m": ["a", "b", "c"]},
        )
        picked = []
        for _ in range(6):
            lease = self.lease("m")
            picked.append(lease.provider_id)
            lease.release()
        self.assertEqual(picked, ["b", "c"] * 3)

    def test_round_robin_follows_model_order(self) -> None:
        """Rotation runs in the model key's provider order, not the nodes' order."""
        self.build({"n1": [prov("p1"), prov("p2")]}, {"m": ["p2", "p1"]})
        picked = []
        for _ in range(4):
            lease = self.lease("m")
            picked.append(lease.provider_id)
            lease.release()
        self.assertEqual(picked, ["p2", "p1", "p2", "p1"])

    def test_round_robin_is_per_model_group(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2")]}, {"a": ["p1", "p2"], "b": ["p1", "p2"]})
        picked = []
        for model in ["a", "b", "a", "b", "a"]:
            lease = self.lease(model)
            picked.append((model, lease.provider_id))
            lease.release()
        self.assertEqual(picked, [("a", "p1"), ("b", "p1"), ("a", "p2"), ("b", "p2"), ("a", "p1")])

    def test_round_robin_fair_when_tie_set_changes(self) -> None:
        """A candidate that is busy for a while is skipped; equals keep alternating."""
        self.build(
            {"n1": [prov("p1"), prov("p2"), prov("p3", capacity=2)]},
            {"m": ["p1", "p2", "p3"], "only-p3": ["p3"]},
        )
        held = self.lease("only-p3")  # p3 at in_flight 1: p1 and p2 are the equals
        picked = []
        for _ in range(6):
            lease = self.lease("m")
            picked.append(lease.provider_id)
            lease.release()
        self.assertEqual(picked, ["p1", "p2"] * 3)
        held.release()
        picked = []
        for _ in range(6):
            lease = self.lease("m")
            picked.append(lease.provider_id)
            lease.release()
        self.assertEqual(picked, ["p3", "p1", "p2"] * 2)

    def test_shared_capacity_across_model_keys(self) -> None:
        self.build(
            {"n1": [prov("p1", capacity=1)]},
            {"chat": [("p1", "served-chat")], "code": [("p1", "served-code")]},
        )
        first = self.lease("chat")
        waiting = self.pool.acquire("code")
        self.assertNoResult(waiting)
        self.assertEqual(
            self.counters("p1"),
            {"in_flight": 1, "long_in_flight": 0, "queued": 1, "long_queued": 0},
        )
        first.release()
        second = self.successResultOf(waiting)
        self.assertEqual((second.model_id, second.target), ("code", "served-code"))
        self.assertEqual(self.counters("p1")["in_flight"], 1)
        second.release()
        self.assertEqual(self.counters("p1"), zero())


class LongContextTests(PoolTestCase):
    def test_is_long(self) -> None:
        p = prov("p", long_threshold=100)
        self.assertEqual([is_long(p, n) for n in (0, 99, 100, 5000)], [False, False, True, True])
        never = prov("q", long_threshold=0)
        self.assertFalse(is_long(never, 10**9))

    def test_long_holds_normal_and_long_slot(self) -> None:
        self.build(
            {"n1": [prov("p", capacity=3, long_threshold=100, long_capacity=1)]}, {"m": ["p"]}
        )
        long1 = self.lease("m", 150)
        self.assertTrue(long1.long)
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 1, "long_in_flight": 1})
        long2 = self.pool.acquire("m", prompt_tokens=100)
        self.assertNoResult(long2)  # long cap reached, normal room left
        short = self.lease("m", 99)
        self.assertFalse(short.long)
        self.assertEqual(
            self.counters("p"),
            {"in_flight": 2, "long_in_flight": 1, "queued": 1, "long_queued": 1},
        )
        long1.release()
        granted = self.successResultOf(long2)
        self.assertTrue(granted.long)
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 2, "long_in_flight": 1})
        granted.release()
        short.release()
        self.assertEqual(self.counters("p"), zero())

    def test_long_requests_also_limited_by_capacity(self) -> None:
        self.build(
            {"n1": [prov("p", capacity=2, long_threshold=10, long_capacity=2)]}, {"m": ["p"]}
        )
        self.lease("m", 5)
        self.lease("m", 50)
        d = self.pool.acquire("m", prompt_tokens=50)
        self.assertNoResult(d)
        self.assertEqual(self.counters("p")["long_in_flight"], 1)

    def test_long_capacity_zero_means_no_separate_cap(self) -> None:
        self.build(
            {"n1": [prov("p", capacity=2, long_threshold=10, long_capacity=0)]}, {"m": ["p"]}
        )
        a, b = self.lease("m", 10), self.lease("m", 10)
        self.assertTrue(a.long and b.long)
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 2, "long_in_flight": 2})
        self.assertNoResult(self.pool.acquire("m", prompt_tokens=10))

    def test_threshold_zero_is_never_long(self) -> None:
        self.build({"n1": [prov("p", capacity=2, long_threshold=0, long_capacity=1)]}, {"m": ["p"]})
        a, b = self.lease("m", 10**9), self.lease("m", 10**9)
        self.assertFalse(a.long or b.long)
        self.assertEqual(self.counters("p")["long_in_flight"], 0)

    def test_long_is_judged_per_provider(self) -> None:
        """The same request is long on one candidate and not on another; a long-capped
        provider is skipped for a long request while the other still has room."""
        self.build(
            {
                "n1": [
                    prov("small", capacity=2, long_threshold=100, long_capacity=1),
                    prov("big", capacity=2, long_threshold=0, priority=1),
                ]
            },
            {"m": ["small", "big"], "only-small": ["small"]},
        )
        first = self.lease("m", 200)
        self.assertEqual((first.provider_id, first.long), ("small", True))
        second = self.lease("m", 200)
        self.assertEqual((second.provider_id, second.long), ("big", False))
        # small would win on priority but has no long room left.
        third = self.lease("m", 200)
        self.assertEqual((third.provider_id, third.long), ("big", False))
        # A short request still fits on small.
        self.assertEqual(self.lease("m", 1).provider_id, "small")


class LeaseTests(PoolTestCase):
    def test_release_is_idempotent(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        a, b = self.lease("m"), self.lease("m")
        w1 = self.pool.acquire("m")
        w2 = self.pool.acquire("m")
        for _ in range(3):
            a.release()
        self.assertTrue(a.released)
        self.successResultOf(w1)
        self.assertNoResult(w2)
        self.assertEqual(self.counters("p")["in_flight"], 2)
        self.assertEqual(self.counters("p")["queued"], 1)
        b.release()
        self.successResultOf(w2)

    def test_release_counts_never_negative(self) -> None:
        self.build({"n1": [prov("p", capacity=1, long_threshold=1, long_capacity=1)]}, {"m": ["p"]})
        lease = self.lease("m", 5)
        for _ in range(5):
            lease.release()
        self.assertEqual(self.counters("p"), zero())
        self.assertEqual(self.busy("p"), 0)

    def test_disconnect_returns_leases_once(self) -> None:
        self.build(
            {"n1": [prov("p", capacity=2, long_threshold=10, long_capacity=1)]}, {"m": ["p"]}
        )
        a, b = self.lease("m", 50), self.lease("m")
        old = self.fence("n1")
        self.assertTrue(a.fenced and b.fenced)
        self.assertFalse(a.released)
        self.assertEqual(self.counters("p"), zero())
        self.assertEqual(self.pool.snapshot()["providers"]["p"]["in_flight"], 0)
        a.release()
        b.release()
        b.release()
        self.assertEqual(self.pool.snapshot()["providers"]["p"]["long_in_flight"], 0)
        # The new generation starts empty; an old lease's release cannot free a new slot.
        new = self.ready("n1")
        self.assertNotEqual(new, old)
        c = self.lease("m", 50)
        d = self.lease("m")
        self.assertEqual(c.generation, new)
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 2, "long_in_flight": 1})
        a.release()
        self.assertEqual(self.counters("p"), {**zero(), "in_flight": 2, "long_in_flight": 1})
        c.release()
        d.release()
        self.assertEqual(self.counters("p"), zero())

    def test_fence_after_release_returns_nothing_twice(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        a, b = self.lease("m"), self.lease("m")
        a.release()
        self.fence("n1")
        self.assertFalse(a.fenced)
        self.assertTrue(b.fenced)
        self.assertEqual(self.busy("p"), 0)

    def test_lease_of_other_node_unaffected_by_fence(self) -> None:
        self.build({"n1": [prov("p1")], "n2": [prov("p2")]}, {"m": ["p1", "p2"]})
        a, b = self.lease("m"), self.lease("m")
        self.assertEqual({a.node_id, b.node_id}, {"n1", "n2"})
        self.fence("n1")
        on2 = b if b.node_id == "n2" else a
        self.assertFalse(on2.fenced)
        self.assertEqual(self.counters("p2")["in_flight"], 1)
        on2.release()
        self.assertEqual(self.counters("p2"), zero())


class LifecycleTests(PoolTestCase):
    def test_stale_fence_after_reconnect_changes_nothing(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        old = self.fence("n1")
        self.ready("n1")
        lease = self.lease("m")
        before = self.pool.snapshot()
        self.pool.node_fenced("n1", old)
        self.assertEqual(self.pool.snapshot(), before)
        self.assertFalse(lease.fenced)
        self.assertEqual(self.counters("p")["in_flight"], 1)

    def test_stale_ready_changes_nothing(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        old = self.fence("n1")
        # A late ready of the fenced generation does not revive it.
        self.pool.node_ready("n1", old)
        self.failureResultOf(self.pool.acquire("m"), Unavailable)
        # Nor does an older ready once a newer generation is active.
        self.ready("n1")
        lease = self.lease("m")
        before = self.pool.snapshot()
        self.pool.node_ready("n1", old)
        self.assertEqual(self.pool.snapshot(), before)
        self.assertFalse(lease.fenced)

    def test_duplicate_ready_keeps_occupancy(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        lease = self.lease("m")
        self.pool.node_ready("n1", self.active["n1"])
        self.assertEqual(self.counters("p")["in_flight"], 1)
        self.assertFalse(lease.fenced)

    def test_newer_ready_supersedes_active_generation(self) -> None:
        """Defensive: a newer ready without the old fence first fences the old one."""
        self.build({"n1": [prov("p", capacity=1)]}, {"m": ["p"]})
        lease = self.lease("m")
        self.ready("n1")
        self.assertTrue(lease.fenced)
        self.assertEqual(self.counters("p")["in_flight"], 0)
        self.lease("m")

    def test_unknown_node_callbacks_ignored(self) -> None:
        self.build({"n1": [prov("p")]}, {"m": ["p"]})
        before = self.pool.snapshot()
        self.pool.node_ready("ghost", 99)
        self.pool.node_fenced("ghost", 99)
        self.pool.node_fenced("n1", 12345)
        self.assertEqual(self.pool.snapshot(), before)

    def test_fence_of_never_ready_node_ignored(self) -> None:
        self.build({"n1": [prov("p")]}, {"m": ["p"]}, ready=[])
        self.pool.node_fenced("n1", 1)
        self.pool.node_ready("n1", 1)
        self.lease("m")

    def test_fence_logs_structured_fields(self) -> None:
        self.build({"n1": [prov("p", capacity=2)]}, {"m": ["p"]})
        self.lease("m")
        self.lease("m")
        events = EventLoggingObserver()
        globalLogPublisher.addObserver(events)
        self.addCleanup(globalLogPublisher.removeObserver, events)
        self.fence("n1")
        fenced = [e for e in events if e.get("returned") is not None]
        self.assertEqual(len(fenced), 1)
        self.assertEqual(fenced[0]["node_id"], "n1")
        self.assertEqual(fenced[0]["returned"], 2)


class EnableTests(PoolTestCase):
    def test_disable_excludes_and_keeps_leases_valid(self) -> None:
        self.build({"n1": [prov("p1", capacity=2), prov("p2", capacity=2)]}, {"m": ["p1", "p2"]})
        first = self.lease("m")
        self.assertEqual(first.provider_id, "p1")
        self.pool.set_enabled("p1", False)
        self.assertEqual(self.counters("p1"), zero())
        self.assertEqual([self.lease("m").provider_id for _ in range(2)], ["p2", "p2"])
        self.assertEqual(self.pool.snapshot()["providers"]["p1"]["in_flight"], 1)
        first.release()
        self.assertEqual(self.pool.snapshot()["providers"]["p1"]["in_flight"], 0)

    def test_disabled_provider_leases_counted_on_reenable(self) -> None:
        self.build({"n1": [prov("p1", capacity=2)]}, {"m": ["p1"]})
        held = self.lease("m")
        self.pool.set_enabled("p1", False)
        self.pool.set_enabled("p1", True)
        self.assertEqual(self.counters("p1")["in_flight"], 1)
        held.release()
        self.assertEqual(self.counters("p1"), zero())

    def test_disable_last_candidate_fails_waiters_at_once(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2")]}, {"m": ["p1"], "other": ["p2"]})
        held = self.lease("m")
        waiting = self.pool.acquire("m")
        unaffected = self.pool.acquire("other")
        self.successResultOf(unaffected)
        self.pool.set_enabled("p1", False)
        self.failureResultOf(waiting, Unavailable)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        held.release()
        self.assertEqual(self.pool.snapshot()["providers"]["p1"]["in_flight"], 0)

    def test_enable_pumps_waiters(self) -> None:
        self.build({"n1": [prov("p1"), prov("p2", enabled=False)]}, {"m": ["p1", "p2"]})
        self.lease("m")
        waiting = self.pool.acquire("m")
        self.assertNoResult(waiting)
        self.pool.set_enabled("p2", True)
        self.assertEqual(self.successResultOf(waiting).provider_id, "p2")

    def test_toggle_to_same_state_is_noop(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        before = self.pool.snapshot()
        self.pool.set_enabled("p1", True)
        self.assertEqual(self.pool.snapshot(), before)

    def test_unknown_provider(self) -> None:
        self.build({"n1": [prov("p1")]}, {"m": ["p1"]})
        self.assertRaises(KeyError, self.pool.set_enabled, "ghost", False)


class ReconfigureTests(PoolTestCase):
    """plan → switch → pump: the pool's part of a live config refresh."""

    def reconfigured(self, **providers: dict[str, Any]) -> EdgeConfig:
        config = make_config(self.nodes, self.models)
        nodes = tuple(
            dataclasses.replace(
                n,
                providers=tuple(
                    dataclasses.replace(p, **providers.get(p.id, {})) for p in n.providers
                ),
            )
            for n in config.nodes
        )
        return dataclasses.replace(config, nodes=nodes)

    def setUp(self) -> None:
        self.nodes = {"n1": [prov("p1"), prov("p2", capacity=2)], "n2": [prov("p3")]}
        self.models: dict[str, ModelSpec] = {"m": ["p1", "p2"], "k": ["p3"]}
        self.build(self.nodes, self.models)

    def test_plan_changes_nothing(self) -> None:
        before = self.pool.snapshot()
        self.pool.plan(self.reconfigured(p1={"capacity": 5, "enabled": False}))
        self.assertEqual(self.pool.snapshot(), before)

    def test_switch_waits_for_pump_and_returns_the_way_back(self) -> None:
        self.lease("k")
        waiting = outcome_of(self.pool.acquire("k"))
        before = self.pool.snapshot()
        undo = self.pool.switch(self.pool.plan(self.reconfigured(p3={"capacity": 2})))
        self.assertEqual(self.pool.snapshot()["providers"]["p3"]["capacity"], 2)
        self.assertEqual(waiting, [], "nobody's outcome changes before the pump")
        self.pool.switch(undo)
        self.assertEqual(self.pool.snapshot(), before)
        self.pool.switch(self.pool.plan(self.reconfigured(p3={"capacity": 2})))
        self.pool.pump()
        self.assertEqual([lease.provider_id for lease in waiting], ["p3"])

    def test_nodes_must_stay_and_providers_not_move(self) -> None:
        config = make_config(self.nodes, self.models)
        n1, n2 = config.nodes
        cases = [
            (dataclasses.replace(config, nodes=(n1,)), "nodes differ"),
            (
                dataclasses.replace(
                    config,
                    nodes=(
                        dataclasses.replace(n1, providers=n1.providers[:1]),
                        dataclasses.replace(n2, providers=(*n2.providers, n1.providers[1])),
                    ),
                ),
                "provider p2 moved from node n1 to node n2",
            ),
        ]
        before = self.pool.snapshot()
        for candidate, message in cases:
            e = self.assertRaises(ValueError, self.pool.plan, candidate)
            self.assertIn(message, str(e))
        self.assertEqual(self.pool.snapshot(), before)

    def test_round_robin_kept_unless_the_order_changes(self) -> None:
        self.pool.switch(self.pool.plan(self.reconfigured(p2={"capacity": 1})))
        first = self.lease("m")
        first.release()
        self.assertEqual(first.provider_id, "p1")
        # Same candidate order: the rotation goes on where it was.
        self.pool.switch(self.pool.plan(self.reconfigured(p1={"priority": 0})))
        second = self.lease("m")
        second.release()
        third = self.lease("m")
        third.release()
        self.assertEqual((second.provider_id, third.provider_id), ("p2", "p1"))
        # A new order starts the rotation afresh, at its first candidate (kept, the rotation
        # would have started at the second).
        reordered = dataclasses.replace(
            self.reconfigured(),
            models=(
                ModelConfig("m", (ModelProviderRef("p2", "m@p2"), ModelProviderRef("p1", "m@p1"))),
                *make_config(self.nodes, self.models).models[1:],
            ),
        )
        self.pool.switch(self.pool.plan(reordered))
        self.assertEqual(self.lease("m").provider_id, "p2")


class CounterTests(PoolTestCase):
    def setUp(self) -> None:
        self.build(
            {
                "n1": [prov("p1", long_threshold=100), prov("p2", long_threshold=1000)],
                "n2": [prov("p3")],
            },
            {"m": ["p1", "p2", "p3"], "only-p1": ["p1"]},
        )
        self.held = [self.lease("m") for _ in range(3)]

    def test_queued_counts_waiter_on_every_live_candidate(self) -> None:
        w1 = self.pool.acquire("m", prompt_tokens=500)
        w2 = self.pool.acquire("only-p1", prompt_tokens=5)
        self.assertNoResult(w1)
        self.assertNoResult(w2)
        self.assertEqual(
            self.counters("p1"),
            {"in_flight": 1, "long_in_flight": 0, "queued": 2, "long_queued": 1},
        )
        self.assertEqual(
            self.counters("p2"),
            {"in_flight": 1, "long_in_flight": 0, "queued": 1, "long_queued": 0},
        )
        self.assertEqual(
            self.counters("p3"),
            {"in_flight": 1, "long_in_flight": 0, "queued": 1, "long_queued": 0},
        )
        # p3's node goes away: it is no live candidate any more, and reads all zero.
        self.fence("n2")
        self.assertEqual(self.counters("p3"), zero())
        self.assertEqual(self.counters("p1")["queued"], 2)
        # Disabled p2: zero, and w1 no longer counts there.
        self.pool.set_enabled("p2", False)
        self.assertEqual(self.counters("p2"), zero())
        self.assertEqual(self.counters("p1")["queued"], 2)
        w1.cancel()
        self.failureResultOf(w1)
        self.assertEqual(
            self.counters("p1"),
            {"in_flight": 1, "long_in_flight": 0, "queued": 1, "long_queued": 0},
        )

    def test_wrong_or_unknown_ids_read_zero(self) -> None:
        self.assertEqual(self.pool.counters("n2", "p1"), zero())
        self.assertEqual(self.pool.counters("n1", "ghost"), zero())

    def test_snapshot_lists_waiters(self) -> None:
        self.clock.advance(3)
        self.pool.acquire("m", prompt_tokens=7)
        snap: dict[str, Any] = self.pool.snapshot()
        self.assertEqual(
            snap["waiters"],
            [{"model_id": "m", "prompt_tokens": 7, "enqueued_at": 3.0, "timeout": 60.0}],
        )
        self.assertEqual(snap["providers"]["p3"]["generation"], self.active["n2"])
        self.assertTrue(snap["providers"]["p3"]["live"])


class ErrorTests(SynchronousTestCase):
    def test_messages_and_codes(self) -> None:
        cases: list[tuple[PoolError, str, str]] = [
            (UnknownModel("m"), "model_not_found", "model 'm' is not configured"),
            (Unavailable("m"), "unavailable", "no provider is available for model 'm'"),
            (
                Overloaded("m", 3),
                "overloaded",
                "model 'm' is overloaded: 3 requests are already waiting",
            ),
            (
                QueueTimeout("m", 2.5),
                "queue_timeout",
                "timed out after 2.5s waiting for a provider for model 'm'",
            ),
        ]
        for err, code, message in cases:
            self.assertEqual((err.code, err.message, err.model_id), (code, message, "m"))


def outcome_of(d: Deferred[Lease]) -> list[Any]:
    """Record a Deferred's outcomes (a lease or an exception) without leaving errors unhandled."""
    seen: list[Any] = []
    d.addCallbacks(seen.append, lambda f: seen.append(f.value))
    return seen
