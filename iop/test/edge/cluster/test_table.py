"""
The pool of an Edge in a cluster — :class:`~iop.edge.pool.ProviderPool` with the cluster's lease
table (:mod:`iop.edge.cluster.table`) — on an in-memory shared store: two Edges' pools sharing
one store hold a provider's capacity exactly; waiters wake on a slot returned anywhere;
a grant racing a fence or a client that left is returned; Redis down fails closed; leases are
renewed and a lost one is counted; and after arbitrary interleavings every counter — this
Edge's and the table's — comes back to zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from iop.config.model import ClusterConfig
from iop.edge.cluster.redis import reconnect_max_delay
from iop.edge.cluster.service import build
from iop.edge.cluster.table import RETRY_SEC, ClusterLeaseTable
from iop.edge.errors import CapacityUnknown, Overloaded, QueueTimeout, Unavailable
from iop.edge.leasetable import ILeaseTable
from iop.edge.pool import Lease, ProviderPool
from iop.test.edge.cluster.memtable import MemoryTable
from iop.test.edge.test_pool import make_config, prov

TTL = 3.0


@dataclass
class Edge:
    """One Edge's pool and the cluster lease table it grants from."""

    pool: ProviderPool
    table: ClusterLeaseTable


def two_edges(
    capacity: int = 2, *, max_queue: int = 8, queue_timeout: float = 30.0, providers: int = 1
) -> tuple[Clock, MemoryTable, Edge, Edge]:
    clock = Clock()
    table = MemoryTable(clock)
    ids = [f"p{i}" for i in range(providers)]
    config = make_config(
        {
            "n1": [
                prov(pid, capacity=capacity, max_queue=max_queue, queue_timeout=queue_timeout)
                for pid in ids
            ]
        },
        {"m": ids},
    )
    edges = []
    for edge_id in ("edge-a", "edge-b"):
        leases = ClusterLeaseTable(
            table, clock, edge_id=edge_id, lease_ttl_sec=TTL, provider_ids=ids
        )
        pool = ProviderPool(config, clock, leases)
        pool.node_ready("n1", 1)
        table.published.append(_waker(leases))
        edges.append(Edge(pool, leases))
    return clock, table, edges[0], edges[1]


def _waker(leases: ClusterLeaseTable) -> Callable[[str], None]:
    return lambda _provider_id: leases.wake()


class GrantTests(SynchronousTestCase):
    def test_capacity_is_shared_by_both_edges(self) -> None:
        _, table, a, b = two_edges(capacity=2)
        first = self.successResultOf(a.pool.acquire("m"))
        second = self.successResultOf(b.pool.acquire("m"))
        third = b.pool.acquire("m")
        self.assertNoResult(third)
        self.assertEqual(table.in_flight("p0"), 2)
        self.assertEqual((first.lease_id[:6], second.lease_id[:6]), ("edge-a", "edge-b"))
        # A slot returned on the other Edge wakes this Edge's waiter at once.
        first.release()
        lease = self.successResultOf(third)
        self.assertEqual(table.in_flight("p0"), 2)
        for held in (second, lease):
            held.release()
        self.assertEqual(table.in_flight("p0"), 0)
        self.assertEqual(table.releases, [first.lease_id, second.lease_id, lease.lease_id])

    def test_release_is_returned_to_the_table_once(self) -> None:
        _, table, a, _ = two_edges()
        lease = self.successResultOf(a.pool.acquire("m"))
        lease.release()
        lease.release()
        self.assertEqual(table.releases, [lease.lease_id])
        self.assertEqual(a.pool.stats().in_flight[("p0", "n1")], 0)

    def test_waiters_keep_arrival_order(self) -> None:
        _, _, a, b = two_edges(capacity=1)
        held = self.successResultOf(b.pool.acquire("m"))
        waiters = [a.pool.acquire("m") for _ in "xyz"]
        held.release()
        self.successResultOf(waiters[0])
        self.assertNoResult(waiters[1])
        self.assertNoResult(waiters[2])

    def test_a_slot_freed_by_an_expired_lease_is_found_by_the_retry(self) -> None:
        clock, table, a, b = two_edges(capacity=1)
        self.successResultOf(b.pool.acquire("m"))
        b.table.stop()  # edge-b "dies": nobody renews its lease, no release is ever sent
        waiting = a.pool.acquire("m")
        a.table.start()
        clock.advance(TTL - RETRY_SEC)
        self.assertNoResult(waiting)
        clock.pump([RETRY_SEC] * 3)
        self.successResultOf(waiting).release()
        self.assertEqual(table.in_flight("p0"), 0)
        a.table.stop()

    def test_queue_limit_is_per_edge(self) -> None:
        _, _, a, b = two_edges(capacity=1, max_queue=1)
        self.successResultOf(a.pool.acquire("m"))
        a.pool.acquire("m")
        self.failureResultOf(a.pool.acquire("m"), Overloaded)
        b.pool.acquire("m")  # edge-b's own queue has room
        self.assertEqual(len(b.pool.snapshot()["waiters"]), 1)

    def test_queue_timeout(self) -> None:
        clock, _, a, _ = two_edges(capacity=1, queue_timeout=5)
        self.successResultOf(a.pool.acquire("m"))
        waiting = a.pool.acquire("m")
        clock.advance(5)
        self.failureResultOf(waiting, QueueTimeout)


class RaceTests(SynchronousTestCase):
    def test_a_grant_for_a_fenced_node_is_returned(self) -> None:
        _, table, a, _ = two_edges()
        table.held = True
        d = a.pool.acquire("m")
        a.pool.node_fenced("n1", 1)
        table.answer()
        self.failureResultOf(d, Unavailable)
        self.assertEqual(table.in_flight("p0"), 0)

    def test_a_client_gone_before_the_grant_returns_it(self) -> None:
        _, table, a, _ = two_edges()
        table.held = True
        d = a.pool.acquire("m")
        d.cancel()
        self.failureResultOf(d, CancelledError)
        table.answer()
        self.assertEqual(table.in_flight("p0"), 0)
        self.assertEqual(a.pool.stats().queue_outcomes[("m", "withdrawn")], 1)
        self.assertEqual(a.pool.stats().in_flight[("p0", "n1")], 0)

    def test_a_waiter_gone_while_the_pump_asks_gets_nothing(self) -> None:
        _, table, a, b = two_edges(capacity=1)
        held = self.successResultOf(b.pool.acquire("m"))
        waiting = a.pool.acquire("m")
        table.held = True
        held.release()
        table.answer(1)  # the release: wakes edge-a, whose pump asks the table (held)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        table.answer()
        self.assertEqual(table.in_flight("p0"), 0)
        self.assertEqual(a.pool.stats().in_flight[("p0", "n1")], 0)

    def test_fence_returns_this_edges_leases_only(self) -> None:
        _, table, a, b = two_edges(capacity=4)
        mine = self.successResultOf(a.pool.acquire("m"))
        theirs = self.successResultOf(b.pool.acquire("m"))
        a.pool.node_fenced("n1", 1)
        self.assertEqual(table.releases, [mine.lease_id])
        self.assertEqual(table.in_flight("p0"), 1)
        mine.release()  # after the fence: nothing more
        theirs.release()
        self.assertEqual(table.releases, [mine.lease_id, theirs.lease_id])


class FailClosedTests(SynchronousTestCase):
    def test_redis_down_refuses_new_work(self) -> None:
        _, table, a, _ = two_edges()
        table.down = True
        failure = self.failureResultOf(a.pool.acquire("m"), CapacityUnknown)
        self.assertEqual(failure.value.code, "cluster_unavailable")
        self.assertNotIn("redis", failure.value.message.lower())
        self.assertEqual(a.pool.stats().queue_outcomes[("m", "unavailable")], 1)
        self.assertEqual(a.table.view()["redis"], "unreachable")
        table.down = False
        self.successResultOf(a.pool.acquire("m")).release()
        self.assertEqual(a.table.view()["redis"], "up")

    def test_waiters_fail_closed_when_redis_goes(self) -> None:
        clock, table, a, _ = two_edges(capacity=1)
        self.successResultOf(a.pool.acquire("m"))
        waiting = a.pool.acquire("m")
        a.table.start()
        table.down = True
        clock.advance(RETRY_SEC)
        self.failureResultOf(waiting, CapacityUnknown)
        a.table.stop()


class RenewalTests(SynchronousTestCase):
    def test_held_leases_are_renewed_and_outlive_the_ttl(self) -> None:
        clock, table, a, _ = two_edges()
        a.table.start()
        lease = self.successResultOf(a.pool.acquire("m"))
        clock.pump([TTL / 3] * 10)
        self.assertEqual(table.in_flight("p0"), 1)
        lease.release()
        self.assertEqual(table.in_flight("p0"), 0)
        a.table.stop()

    def test_one_failed_renewal_loses_nothing(self) -> None:
        clock, table, a, _ = two_edges()
        a.table.start()
        lease = self.successResultOf(a.pool.acquire("m"))
        lost: list[str] = []
        lease.when_lost(lambda: lost.append("lost"))
        clock.advance(TTL / 3)
        table.down = True
        clock.pump([TTL / 10] * 3)  # the renewal at 2/3 TTL fails
        table.down = False
        clock.pump([TTL / 10] * 30)
        self.assertEqual((lost, a.table.lost, table.in_flight("p0")), ([], 0, 1))
        lease.release()
        a.table.stop()

    def test_redis_away_less_than_a_third_of_the_ttl_loses_nothing(self) -> None:
        """
        Redis gone just before a renewal, in the worst phase, and back within a third of the
        TTL (the connection up again at most one reconnect backoff later): the failed renewal
        is sent again as the connection comes back, so no lease is lost and the table keeps
        counting it.
        """
        lag = reconnect_max_delay(TTL)
        for outage in (TTL / 3 * 0.99, TTL / 3 * 0.9, TTL / 6):
            clock, table, a, _ = two_edges()
            a.table.start()
            lease = self.successResultOf(a.pool.acquire("m"))
            clock.advance(TTL / 3 - 0.01)
            table.down = True  # just before the first renewal, which fails
            clock.pump([(outage + lag) / 50] * 50)
            table.down = False
            a.table.reconnected()
            clock.pump([TTL / 20] * 40)
            self.assertEqual(
                (lease.lost, a.table.lost, table.in_flight("p0")), (False, 0, 1), outage
            )
            lease.release()
            a.table.stop()

    def test_a_failed_renewal_is_tried_again_at_the_next_check(self) -> None:
        clock, table, a, _ = two_edges()
        a.table.start()
        lease = self.successResultOf(a.pool.acquire("m"))
        renewals: list[float] = []
        renew = table.renew

        def counted(*args: object, **kwargs: object) -> Deferred[frozenset[str]]:
            renewals.append(clock.seconds())
            return renew(*args, **kwargs)  # type: ignore[arg-type]

        table.renew = counted  # type: ignore[method-assign]
        table.down = True
        clock.advance(TTL / 3)  # the first renewal fails
        table.down = False
        clock.advance(TTL / 10)  # the next deadline check renews at once
        self.assertEqual(len(renewals), 2)
        self.assertAlmostEqual(renewals[1] - renewals[0], TTL / 10, places=6)
        clock.pump([TTL / 10] * 10)
        self.assertEqual((lease.lost, table.in_flight("p0")), (False, 1))
        lease.release()
        a.table.stop()

    def test_a_lease_not_renewed_in_time_is_lost_before_it_expires(self) -> None:
        clock, table, a, _ = two_edges()
        a.table.start()
        lease = self.successResultOf(a.pool.acquire("m"))
        lost: list[float] = []
        lease.when_lost(lambda: lost.append(clock.seconds()))
        table.down = True
        clock.pump([TTL / 10] * 12)
        # Told before the table's expiry (the grant's time + TTL): never a slot used twice.
        self.assertEqual(len(lost), 1)
        self.assertLess(lost[0], TTL)
        self.assertEqual((a.table.lost, a.table.view()["leases_lost"]), (1, 1))
        table.down = False
        lease.release()
        lease.release()
        self.assertEqual(a.pool.stats().in_flight[("p0", "n1")], 0)
        a.table.stop()

    def test_a_lease_the_table_forgot_is_lost(self) -> None:
        clock, table, a, _ = two_edges()
        a.table.start()
        lease = self.successResultOf(a.pool.acquire("m"))
        table.leases.clear()  # gone while the table's epoch stands (e.g. an eviction)
        clock.advance(TTL / 3)
        self.assertTrue(lease.lost)
        self.assertEqual(a.table.lost, 1)
        a.table.stop()

    def test_after_redis_restarts_empty_held_leases_are_reasserted_first(self) -> None:
        clock, table, a, b = two_edges(capacity=2)
        a.table.start()
        b.table.start()
        held = [
            self.successResultOf(a.pool.acquire("m")),
            self.successResultOf(b.pool.acquire("m")),
        ]
        table.restart()
        # Nothing is granted while the table recovers, however free it looks...
        waiting = b.pool.acquire("m")
        waiting_too = a.pool.acquire("m")
        clock.pump([TTL / 10] * 5)
        self.assertEqual(table.in_flight("p0"), 2)  # ...and both Edges re-asserted theirs.
        self.assertNoResult(waiting)
        self.assertEqual([lease.lost for lease in held], [False, False])
        # Recovered, and still full (capacity 2 is held) until a release frees one slot.
        clock.pump([TTL / 10] * 10)
        self.assertNoResult(waiting)
        held[0].release()
        served = [d for d in (waiting, waiting_too) if d.called]
        self.assertEqual(len(served), 1)
        self.assertEqual(table.in_flight("p0"), 2)
        a.table.stop()
        b.table.stop()

    def test_view_lists_every_edge_and_the_shared_leases(self) -> None:
        clock, _, a, b = two_edges(capacity=1)
        self.successResultOf(a.pool.acquire("m"))
        b.pool.acquire("m")
        a.table.start()
        b.table.start()
        clock.pump([1.0, 1.0])  # edge-a's second report sees edge-b's first
        view = a.table.view()
        self.assertEqual([e["id"] for e in view["edges"]], ["edge-a", "edge-b"])
        self.assertEqual({e["id"]: e["queued"] for e in view["edges"]}, {"edge-a": 0, "edge-b": 1})
        self.assertEqual(view["providers"]["p0"], {"in_flight": 1, "long_in_flight": 0})
        a.table.stop()
        b.table.stop()


class BuildTests(SynchronousTestCase):
    """The cluster subsystem builds itself from edge.yaml; the tap only composes it."""

    def test_no_cluster_section_builds_nothing(self) -> None:
        config = make_config({"n1": [prov("p0")]}, {"m": ["p0"]})
        self.assertIsNone(build(config, Clock()))

    def test_the_service_carries_the_table_for_the_pool(self) -> None:
        config = dataclasses.replace(
            make_config({"n1": [prov("p0")], "n2": [prov("p1")]}, {"m": ["p0", "p1"]}),
            cluster=ClusterConfig(redis="unix:///nonexistent/redis.sock", edge_id="e1"),
        )
        service = build(config, Clock())
        assert service is not None
        self.assertEqual(service.name, "cluster")
        self.assertTrue(verifyObject(ILeaseTable, service.table))
        pool = ProviderPool(config, Clock(), service.table)
        pool.node_ready("n1", 1)
        # Not started: nothing reaches Redis, and the pool fails closed.
        self.failureResultOf(pool.acquire("m"), CapacityUnknown)
        view = service.view()
        self.assertEqual((view["edge_id"], view["redis"]), ("e1", "unreachable"))


# Arbitrary interleavings: (edge index, action, argument).
_STEP = st.tuples(
    st.integers(0, 1),
    st.sampled_from(["acquire", "release", "cancel", "fence", "ready", "tick", "down", "up"]),
    st.integers(0, 7),
)


class CountersReturnToZeroTests(SynchronousTestCase):
    @settings(max_examples=150, deadline=None)
    @given(st.lists(_STEP, max_size=60), st.booleans())
    def test_capacity_holds_and_counters_return_to_zero(
        self, steps: list[tuple[int, str, int]], held: bool
    ) -> None:
        clock, table, a, b = two_edges(capacity=2, providers=2, max_queue=4)
        edges = (a, b)
        generation = [1, 1]
        leases: list[Lease] = []
        pending: list[Deferred[Lease]] = []
        table.held = held
        went_down = False
        for one in edges:
            one.table.start()

        def keep(lease: Lease) -> Lease:
            leases.append(lease)
            return lease

        for edge, action, arg in steps:
            one = edges[edge]
            if action == "acquire":
                d = one.pool.acquire("m")
                d.addCallback(keep).addErrback(lambda f: None)
                pending.append(d)
            elif action == "release" and leases:
                leases.pop(arg % len(leases)).release()
            elif action == "cancel" and pending:
                pending.pop(arg % len(pending)).cancel()
            elif action == "fence":
                one.pool.node_fenced("n1", generation[edge])
            elif action == "ready":
                generation[edge] += 1
                one.pool.node_ready("n1", generation[edge])
            elif action == "tick":
                clock.advance(RETRY_SEC)
            elif action == "down":
                table.down = went_down = True
            elif action == "up":
                table.down = False
            table.answer() if arg % 2 else None
            for pid in ("p0", "p1"):
                self.assertLessEqual(table.in_flight(pid), 2)
        # Drain: Redis back, every reply in, every waiter gone, every lease released.
        table.down = False
        table.answer()
        for d in pending:
            d.cancel()
        table.answer()
        for lease in leases:
            lease.release()
        table.answer()
        for one in edges:
            stats = one.pool.stats()
            self.assertEqual(sum(stats.in_flight.values()), 0, stats)
            self.assertEqual(one.pool.snapshot()["waiters"], [])
            self.assertEqual(one.table.view()["leases_held_here"], 0)
            one.table.stop()
        if not went_down:
            self.assertEqual(table.in_flight("p0") + table.in_flight("p1"), 0)
        # A release Redis could not take is collected by its lease's TTL.
        clock.advance(TTL)
        self.assertEqual(table.in_flight("p0") + table.in_flight("p1"), 0)
