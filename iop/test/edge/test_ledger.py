"""The usage ledger's feed (:mod:`iop.edge.ledger`): which finished requests become records."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.events import NodeEvent, NodeEventKind, RequestFinished
from iop.edge.ledger import LedgerFeed
from iop.runtime.events import Usage
from iop.usage.store import UsageRecord


class Ledger:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


def finished(**facts: Any) -> RequestFinished:
    base: dict[str, Any] = {
        "surface": "openai",
        "operation": "chat",
        "status": 200,
        "outcome": "complete",
        "duration": 1.25,
        "model": "demo",
        "provider_id": "p-1",
        "node_id": "node-a",
        "key": "alice",
        "team": "backend",
        "usage": Usage(10, 5, cached_input_tokens=4, reasoning_tokens=2),
        "cost_micros": 1234,
        "time_to_first_token": 0.0504,
        "at": 1_700_000_000.5,
    }
    base.update(facts)
    return RequestFinished(**base)


class LedgerFeedTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.ledger = Ledger()
        self.feed = LedgerFeed(self.ledger)  # type: ignore[arg-type]

    def test_a_finished_generation_request_is_one_record(self) -> None:
        self.feed.observe(finished())
        [record] = self.ledger.records
        self.assertEqual(
            record,
            UsageRecord(
                time_ms=1_700_000_000_500,
                key="alice",
                team="backend",
                model="demo",
                provider="p-1",
                node="node-a",
                surface="openai",
                outcome="complete",
                input_tokens=10,
                output_tokens=5,
                cached_input_tokens=4,
                reasoning_tokens=2,
                cost_micros=1234,
                duration_ms=1250,
                ttft_ms=50,
            ),
        )

    def test_unknown_usage_stays_unknown(self) -> None:
        self.feed.observe(finished(usage=None, cost_micros=None, time_to_first_token=None))
        [record] = self.ledger.records
        self.assertEqual(
            (record.input_tokens, record.output_tokens, record.cost_micros, record.ttft_ms),
            (None, None, None, None),
        )

    def test_refusals_are_recorded_but_not_unauthenticated_ones(self) -> None:
        self.feed.observe(finished(status=429, outcome="refused", usage=None, provider_id=""))
        self.feed.observe(finished(status=401, outcome="refused", usage=None, key=""))
        self.assertEqual([r.outcome for r in self.ledger.records], ["refused"])

    def test_only_generation_operations(self) -> None:
        for operation in ("models", "count_tokens", "unrouted", "run", "tunnel"):
            self.feed.observe(finished(operation=operation))
        self.feed.observe(NodeEvent(NodeEventKind.CONNECTED, "node-a"))
        self.assertEqual(self.ledger.records, [])
        for operation in ("chat", "responses", "messages"):
            self.feed.observe(finished(operation=operation))
        self.assertEqual(len(self.ledger.records), 3)
