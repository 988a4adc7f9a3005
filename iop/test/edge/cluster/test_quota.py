"""
The cluster's quota table (:mod:`iop.edge.cluster.quota`) without a server, on a ``task.Clock``:
the script replies become reservations or refusals, Redis failures fail closed, every slot
held is renewed in one call every third of the TTL, a slot the table no longer has or whose
renewal cannot be confirmed in time is lost (its holder told), and every end is one settle.
The scripts themselves run against a real redis-server in tests/test_cluster_quota.py.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from iop.config.model import Budget, Limits
from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.quota import ClusterQuotaTable
from iop.edge.cluster.scripts import Script
from iop.edge.quota import Charge, Demand, IQuotaTable, QuotaUnavailable, Refused, SubjectLimits

TTL = 3.0
KEY = SubjectLimits("key:a", Limits(concurrent_requests=2), (Budget("day", tokens=100),))
TEAM = SubjectLimits("team:t", Limits(requests_per_minute=5))


class FakeStore:
    """Records each script call; answers from ``replies`` (by script name), or fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], list[Any]]] = []
        self.replies: dict[str, list[Any]] = {}
        self.down = False

    def key(self, *parts: str) -> str:
        return ":".join(("{iop}", *parts))

    def deadline(self) -> int:
        return 0

    def run(self, script: Script, keys: list[str], args: list[Any]) -> Deferred[Any]:
        self.calls.append((script.name, keys, args))
        if self.down:
            return fail(ClusterUnavailable("not connected to the cluster's Redis"))
        queue = self.replies.get(script.name) or []
        return succeed(queue.pop(0) if queue else 1)

    def named(self, name: str) -> list[tuple[str, list[str], list[Any]]]:
        return [c for c in self.calls if c[0] == name]


def table() -> tuple[Clock, FakeStore, ClusterQuotaTable]:
    clock, store = Clock(), FakeStore()
    quota = ClusterQuotaTable(store, clock, edge_id="edge-a", ttl_sec=TTL)
    quota.start()
    return clock, store, quota


class ClusterQuotaTests(SynchronousTestCase):
    def test_interface(self) -> None:
        verifyObject(IQuotaTable, table()[2])

    def test_reserve_and_settle(self) -> None:
        _, store, quota = table()
        store.replies["quota_reserve"] = [b"OK edge-a:7 1700000000000"]
        r = self.successResultOf(quota.reserve([KEY, TEAM], Demand(50, 3)))
        self.assertEqual((r.id, r.subjects), ("edge-a:7", ("key:a", "team:t")))
        (_, keys, args) = store.named("quota_reserve")[0]
        self.assertEqual(keys, ["{iop}:quota:seq"])
        self.assertEqual(args[:6], ["{iop}:quota:", "edge-a", 3000, 60000, 50, 3])
        self.assertEqual(
            args[6],
            '[["key:a",0,0,2,[["day",100,0]]],["team:t",5,0,0,[]]]',
        )
        self.assertEqual(quota.running, 1)
        r.settle(Charge(20, None))  # no cost reported: the reserved cost is kept
        r.release()  # a second end: nothing sent
        self.assertEqual(
            store.named("quota_settle"),
            [("quota_settle", ["{iop}:quota:res:edge-a:7"], ["{iop}:quota:", "edge-a:7", 20, 3])],
        )
        self.assertEqual(quota.running, 0)

    def test_refused(self) -> None:
        _, store, quota = table()
        store.replies["quota_reserve"] = [
            "NO budget 1 100 10 5000 5000 day tokens",
            "NO concurrent_requests 2 2 0 1000 -1 - -",
        ]
        e = self.failureResultOf(quota.reserve([KEY, TEAM], Demand(50)), Refused).value
        self.assertEqual(
            (e.subject, e.kind, e.limit, e.remaining, e.retry_after_sec, e.period, e.unit),
            ("key:a", "budget", 100, 10, 5.0, "day", "tokens"),
        )
        e = self.failureResultOf(quota.reserve([KEY, TEAM], Demand(50)), Refused).value
        self.assertEqual(
            (e.subject, e.kind, e.reset_after_sec, e.period),
            ("team:t", "concurrent_requests", None, None),
        )

    def test_fail_closed(self) -> None:
        _, store, quota = table()
        store.down = True
        failure = self.failureResultOf(quota.reserve([KEY], Demand(1)), QuotaUnavailable)
        self.assertEqual(failure.value.code, "cluster_unavailable")
        store.down = False
        store.replies["quota_reserve"] = [-2]  # run after its deadline
        self.failureResultOf(quota.reserve([KEY], Demand(1)), QuotaUnavailable)

    def test_renewal_and_lost_slots(self) -> None:
        clock, store, quota = table()
        store.replies["quota_reserve"] = [b"OK edge-a:1 0", b"OK edge-a:2 0"]
        one = self.successResultOf(quota.reserve([KEY], Demand(1)))
        two = self.successResultOf(quota.reserve([KEY], Demand(1)))
        lost: list[str] = []
        one.when_lost(lambda: lost.append("one"))
        two.when_lost(lambda: lost.append("two"))
        store.replies["quota_renew"] = [[1, 0]]
        clock.advance(TTL / 3)
        (_, keys, args) = store.named("quota_renew")[0]
        self.assertEqual(keys, ["{iop}:quota:res:edge-a:1", "{iop}:quota:res:edge-a:2"])
        self.assertEqual(args[2], "edge-a:1\nedge-a:2")
        self.assertEqual((lost, quota.lost), (["two"], 1))
        # Redis gone: renewals fail; before the slot may expire, its holder is told.
        store.down = True
        clock.pump([TTL / 10] * 20)
        self.assertEqual((lost, quota.lost), (["two", "one"], 2))
        # Ending them still settles (Redis may take it once back).
        store.down = False
        one.settle(Charge(1))
        two.release()
        self.assertEqual(len(store.named("quota_settle")), 2)
        self.assertEqual((quota.running, quota.unsettled), (0, 0))

    def test_unsettled_is_counted(self) -> None:
        _, store, quota = table()
        store.replies["quota_reserve"] = [b"OK edge-a:1 0"]
        r = self.successResultOf(quota.reserve([KEY], Demand(1)))
        store.down = True
        r.settle(None)
        self.assertEqual(quota.unsettled, 1)

    def test_snapshot(self) -> None:
        _, store, quota = table()
        store.replies["quota_snapshot"] = [
            b"1700000000000 1 4 120 1699920000000 1700006400000 90 7"
        ]
        snap = self.successResultOf(quota.snapshot(KEY))
        self.assertEqual((snap.concurrent, snap.requests, snap.tokens), (1, 4, 120))
        (use,) = snap.budgets
        self.assertEqual(
            (use.start, use.end, use.tokens, use.cost_micros), (1699920000.0, 1700006400.0, 90, 7)
        )
