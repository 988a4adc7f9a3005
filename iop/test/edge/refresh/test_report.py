"""The refresh result document: its outcome rule and its JSON form."""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.refresh.classify import candidate_result
from iop.edge.refresh.report import (
    ChangeReport,
    NodePush,
    RefreshResult,
    rejected_result,
)

LISTS = ("changed_nodes", "changed_providers", "changed_models", "reports")


def report(path: str, change_class: str, **scope: str) -> ChangeReport:
    return ChangeReport(path, "1", "2", change_class, **scope)  # type: ignore[arg-type]


class ResultTests(SynchronousTestCase):
    def test_no_op(self) -> None:
        """Nothing changed: applied (would apply), every list present and empty, not null."""
        for mode in ("dry_run", "apply"):
            document = candidate_result(mode, []).as_dict()
            self.assertEqual(document["result"], "applied")
            self.assertEqual(document["mode"], mode)
            for key in (*LISTS, "errors", "node_pushes"):
                self.assertEqual(document[key], [], key)
            self.assertIn('"changed_nodes": []', json.dumps(document))

    def test_outcome(self) -> None:
        """rejected over restart_required over applied."""
        live = report("nodes[0].providers[0].capacity", "live")
        restart = report("listen.admin", "restart_required")
        rejected = report("nodes[0].providers[0].capacity", "rejected")
        self.assertEqual(candidate_result("dry_run", [live]).result, "applied")
        self.assertEqual(candidate_result("dry_run", [live, restart]).result, "restart_required")
        self.assertEqual(candidate_result("apply", [restart, rejected, live]).result, "rejected")
        result = candidate_result("apply", [live, restart])
        self.assertEqual(result.blocking, [restart])
        self.assertEqual(result.reports, [live, restart])

    def test_unknown_mode(self) -> None:
        result = candidate_result("yolo", [])
        self.assertEqual(result.result, "rejected")
        self.assertEqual(result.errors, ["unknown refresh mode 'yolo': use dry_run or apply"])

    def test_changed_lists_unique(self) -> None:
        reports = [
            report("a", "live", node="n1", provider="p1"),
            report("b", "live", node="n1", provider="p2"),
            report("c", "live", model="m1"),
            report("d", "live", node="n1", provider="p1"),
            report("e", "restart_required"),
        ]
        result = candidate_result("dry_run", reports)
        self.assertEqual(result.changed_nodes, ["n1"])
        self.assertEqual(result.changed_providers, ["p1", "p2"])
        self.assertEqual(result.changed_models, ["m1"])

    def test_as_dict(self) -> None:
        result = RefreshResult(
            result="applied",
            mode="apply",
            changed_nodes=["node-a"],
            changed_providers=["a-chat"],
            changed_models=[],
            reports=[
                ChangeReport(
                    "nodes[0].providers[0].capacity",
                    "2",
                    "4",
                    "live",
                    "the pool",
                    node="node-a",
                    provider="a-chat",
                )
            ],
            node_pushes=[NodePush("node-a", "applied"), NodePush("node-b", "timeout", "10 s")],
        )
        self.assertEqual(
            json.loads(json.dumps(result.as_dict())),
            {
                "result": "applied",
                "mode": "apply",
                "changed_nodes": ["node-a"],
                "changed_providers": ["a-chat"],
                "changed_models": [],
                "reports": [
                    {
                        "path": "nodes[0].providers[0].capacity",
                        "old": "2",
                        "new": "4",
                        "change_class": "live",
                        "detail": "the pool",
                    }
                ],
                "errors": [],
                "node_pushes": [
                    {"node_id": "node-a", "outcome": "applied", "reason": ""},
                    {"node_id": "node-b", "outcome": "timeout", "reason": "10 s"},
                ],
            },
        )
        self.assertEqual(
            result.describe(),
            [
                "config refresh (apply): applied",
                "nodes[0].providers[0].capacity: 2 → 4 (live): the pool",
                "node node-a: applied",
                "node node-b: timeout: 10 s",
            ],
        )

    def test_lists_not_shared(self) -> None:
        """Each result owns its lists (no shared mutable default)."""
        first, second = RefreshResult("applied", "dry_run"), RefreshResult("applied", "dry_run")
        first.errors.append("x")
        first.reports.append(report("a", "live"))
        self.assertEqual((second.errors, second.reports), ([], []))

    def test_rejected(self) -> None:
        result = rejected_result("apply", ["edge.yaml: nodes[0].id: required"])
        document = result.as_dict()
        self.assertEqual(document["result"], "rejected")
        self.assertEqual(document["errors"], ["edge.yaml: nodes[0].id: required"])
        for key in LISTS:
            self.assertEqual(document[key], [], key)
