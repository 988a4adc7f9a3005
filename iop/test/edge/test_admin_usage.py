"""
Tests for ``GET /usage`` on the admin surface (:class:`iop.edge.admin.AdminApp`): the ledger's
totals as JSON, the query parameters and their 400s, 503 without a ledger; and ``GET /limits``.
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import Budget, ClientAPIConfig, ClientKey, Limits, NodeToken, Team
from iop.edge.admin import AdminApp
from iop.edge.quota import Charge, Demand, InProcessQuotaTable, QuotaGate, QuotaUnavailable
from iop.runtime.events import Usage
from iop.usage.ledger import InlineWorker, UsageLedger
from iop.usage.query import parse_time
from iop.usage.store import UsageRecord

MAY1_MS = int(parse_time("2026-05-01") * 1000)


class UsageRouteTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.ledger = UsageLedger(
            self.mktemp(), Clock(), currency="USD", retention_days=0, worker=InlineWorker()
        )
        self.ledger.startService()
        self.addCleanup(self.ledger.stopService)
        for time_ms, key, model, cost in (
            (MAY1_MS, "alice", "m1", 1_500_000),
            (MAY1_MS + 1, "alice", "m2", None),
            (MAY1_MS + 86_400_000, "bob", "m1", 250),
        ):
            self.ledger.record(
                UsageRecord.of(
                    time_ms, Usage(10, 5), key=key, team="t", model=model, cost_micros=cost
                )
            )
        snapshot = {"edge": {"id": "edge-1"}}
        self.treq: Any = StubTreq(AdminApp(lambda: snapshot, usage=self.ledger).resource())

    def get(self, query: str = "", status: int = 200) -> dict[str, Any]:
        response = self.successResultOf(self.treq.get("http://admin/usage" + query))
        self.assertEqual(response.code, status)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        document: dict[str, Any] = json.loads(self.successResultOf(response.content()))
        return document

    def test_total(self) -> None:
        document = self.get()
        self.assertEqual(document["edge"], "edge-1")
        self.assertEqual(document["currency"], "USD")
        [row] = document["rows"]
        self.assertEqual(
            row,
            {
                "group": "",
                "currency": "USD",
                "requests": 3,
                "input_tokens": 30,
                "output_tokens": 15,
                "cached_input_tokens": 0,
                "cache_write_tokens": 0,
                "reasoning_tokens": 0,
                "cost_micros": 1_500_250,
                "cost": "1.500250",
                "unpriced": 1,
                "unreported": 0,
            },
        )
        self.assertEqual(document["ledger"]["pending"], 0)
        self.assertEqual(document["ledger"]["written"], 3)

    def test_grouped_and_filtered(self) -> None:
        document = self.get("?by=key&model=m1&since=2026-05-01T00:00:00Z&until=2026-05-03")
        self.assertEqual(
            [(r["group"], r["requests"], r["cost_micros"]) for r in document["rows"]],
            [("alice", 1, 1_500_000), ("bob", 1, 250)],
        )
        self.assertEqual(
            document["query"],
            {
                "key": None,
                "team": None,
                "model": "m1",
                "since": "2026-05-01T00:00:00Z",
                "until": "2026-05-03T00:00:00Z",
                "by": "key",
            },
        )
        by_day = self.get("?by=day")
        self.assertEqual([r["group"] for r in by_day["rows"]], ["2026-05-01", "2026-05-02"])

    def test_nothing_matches(self) -> None:
        self.assertEqual(self.get("?key=nobody")["rows"], [])

    def test_bad_parameters(self) -> None:
        for query, fragment in (
            ("?by=week", "by must be one of"),
            ("?since=yesterday", "since: not an ISO 8601"),
            ("?key=a&key=b", "'key' given more than once"),
            ("?limit=3", "unknown query parameter 'limit'"),
        ):
            document = self.get(query, 400)
            self.assertIn(fragment, document["error"]["message"])

    def test_no_ledger(self) -> None:
        self.treq = StubTreq(AdminApp(lambda: {}).resource())
        document = self.get(status=503)
        self.assertIn("no usage ledger", document["error"]["message"])


class LimitsRouteTests(SynchronousTestCase):
    """``GET /limits``: each limited key's limits and budgets beside their counters now."""

    def setUp(self) -> None:
        team = Team("backend", Limits(concurrent_requests=10), (Budget("total", tokens=10_000),))
        keys = (
            ClientKey(
                "alice",
                NodeToken.from_plaintext("sk-a"),
                team="backend",
                limits=Limits(requests_per_minute=5),
                budgets=(Budget("day", tokens=1_000, cost_micros=2_000_000),),
            ),
            ClientKey("free", NodeToken.from_plaintext("sk-f")),
        )
        self.config = ClientAPIConfig(listen=None, keys=keys, teams=(team,))
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.table = InProcessQuotaTable(self.clock)
        self.gate = QuotaGate(self.config, self.table)
        snapshot = {"edge": {"id": "edge-1"}}
        self.treq: Any = StubTreq(AdminApp(lambda: snapshot, limits=self.gate).resource())

    def get(self, status: int = 200) -> dict[str, Any]:
        response = self.successResultOf(self.treq.get("http://admin/limits"))
        self.assertEqual(response.code, status)
        document: dict[str, Any] = json.loads(self.successResultOf(response.content()))
        return document

    def test_limited_keys_with_their_counters(self) -> None:
        held = self.successResultOf(self.gate.reserve(self.config.keys[0], Demand(300, 1_000)))
        document = self.get()
        self.assertEqual(document["edge"], "edge-1")
        [alice] = document["keys"]
        self.assertEqual((alice["key"], alice["team"]), ("alice", "backend"))
        own, team = alice["subjects"]
        self.assertEqual(own["subject"], "key:alice")
        self.assertEqual(own["requests_per_minute"], {"limit": 5, "used": 1, "remaining": 4})
        self.assertIsNone(own["concurrent_requests"])
        [day] = own["budgets"]
        self.assertEqual(day["period"], "day")
        self.assertEqual(day["tokens"], {"limit": 1_000, "used": 300, "remaining": 700})
        self.assertEqual(
            day["cost_micros"], {"limit": 2_000_000, "used": 1_000, "remaining": 1_999_000}
        )
        self.assertEqual(team["subject"], "team:backend")
        self.assertEqual(team["concurrent_requests"], {"limit": 10, "used": 1, "remaining": 9})
        held.settle(Charge(120, 400))
        [alice] = self.get()["keys"]
        own, team = alice["subjects"]
        self.assertEqual(own["budgets"][0]["tokens"]["used"], 120)
        self.assertEqual(team["concurrent_requests"]["used"], 0)

    def test_unreachable_counters_503(self) -> None:
        class Unreachable:
            def snapshot(self, subject: Any) -> Any:
                return fail(QuotaUnavailable())

        self.gate = QuotaGate(self.config, Unreachable())  # type: ignore[arg-type]
        self.treq = StubTreq(AdminApp(lambda: {}, limits=self.gate).resource())
        document = self.get(503)
        self.assertIn("Redis", document["error"]["message"])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_without_a_gate_503(self) -> None:
        self.treq = StubTreq(AdminApp(lambda: {}).resource())
        self.get(503)
