"""
Tests for ``iop usage`` (:mod:`iop.cli.usage`) through :func:`iop.cli.main.main`, with the admin
listeners replaced by fakes: the query string sent, the table, ``--json``, ``--csv``, several
Edges merged, and an Edge that cannot be asked named (totals marked incomplete, exit 1).
"""

from __future__ import annotations

import csv
import io
import json
import os
import urllib.parse
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import status as status_cli
from iop.cli import usage as usage_cli
from iop.test.cli.support import run
from iop.usage.query import Totals, parse_time

NOW = parse_time("2026-05-08T00:00:00Z")


def answer(edge: str, *rows: Totals) -> tuple[int, bytes]:
    document = {"edge": edge, "currency": "USD", "rows": [r.as_json() for r in rows]}
    return 200, json.dumps(document).encode()


class UsageCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.asked: list[str] = []
        self.answers: dict[str, Any] = {
            "http://e1:8081": answer(
                "edge-1",
                Totals("alice", "USD", 2, 100, 10, 50, 5, 2, 1_500_000, 0, 0),
                Totals("bob", "USD", 1, 10, 1, cost_micros=0, unpriced=1),
            ),
            "http://e2:8081": answer("edge-2", Totals("alice", "USD", 1, 1, 1, cost_micros=250)),
        }
        self.patch(status_cli, "http_get", self.get)
        self.patch(usage_cli, "now", lambda: NOW)
        self.patch(os, "environ", {})

    def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        self.asked.append(url)
        base = url.split("/usage")[0]
        found = self.answers.get(base)
        if found is None:
            raise OSError(111, "Connection refused")
        if isinstance(found, Exception):
            raise found
        return found  # type: ignore[no-any-return]

    def usage(self, *argv: str) -> Any:
        return run(["usage", "--admin", "http://e1:8081", "--admin", "e2:8081", *argv])

    def test_query_string(self) -> None:
        result = self.usage(
            "--key",
            "alice",
            "--model",
            "m1",
            "--since",
            "7d",
            "--until",
            "2026-05-08",
            "--by",
            "day",
        )
        self.assertEqual(result.code, 0, result)
        self.assertEqual(len(self.asked), 2)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.asked[0]).query)
        self.assertEqual(
            query,
            {
                "key": ["alice"],
                "model": ["m1"],
                "since": ["2026-05-01T00:00:00Z"],
                "until": ["2026-05-08T00:00:00Z"],
                "by": ["day"],
            },
        )
        # Every Edge is asked the same window.
        self.assertEqual(self.asked[0].split("?")[1], self.asked[1].split("?")[1])

    def test_table_merges_every_edge(self) -> None:
        result = self.usage("--by", "key")
        self.assertEqual((result.code, result.err), (0, ""))
        lines = result.out.splitlines()
        self.assertEqual(
            lines[0].split(),
            [
                "KEY",
                "REQUESTS",
                "INPUT",
                "CACHED",
                "CACHE_WRITE",
                "OUTPUT",
                "REASONING",
                "COST",
                "UNPRICED",
            ],
        )
        self.assertEqual(
            lines[1].split(), ["alice", "3", "101", "50", "5", "11", "2", "1.500250", "USD", "0"]
        )
        self.assertEqual(
            lines[2].split(), ["bob", "1", "10", "0", "0", "1", "0", "0.000000", "USD", "1"]
        )
        self.assertIn("no price", result.out)
        self.assertIn("from 2 Edges: edge-1, edge-2", result.out)

    def test_json(self) -> None:
        result = self.usage("--by", "key", "--json")
        self.assertEqual(result.code, 0)
        document = json.loads(result.out)
        self.assertTrue(document["complete"])
        self.assertEqual(
            document["edges"],
            [
                {"admin": "http://e1:8081", "edge": "edge-1"},
                {"admin": "http://e2:8081", "edge": "edge-2"},
            ],
        )
        self.assertEqual(document["unreachable"], [])
        self.assertEqual(
            [(r["group"], r["requests"], r["cost"]) for r in document["rows"]],
            [("alice", 3, "1.500250"), ("bob", 1, "0.000000")],
        )

    def test_csv(self) -> None:
        result = self.usage("--by", "key", "--csv")
        self.assertEqual(result.code, 0)
        rows = list(csv.reader(io.StringIO(result.out)))
        self.assertEqual(
            rows[0],
            [
                "key",
                "requests",
                "input_tokens",
                "cached_input_tokens",
                "cache_write_tokens",
                "output_tokens",
                "reasoning_tokens",
                "cost",
                "currency",
                "unpriced",
                "unreported",
            ],
        )
        self.assertEqual(
            rows[1], ["alice", "3", "101", "50", "5", "11", "2", "1.500250", "USD", "0", "0"]
        )
        self.assertEqual(len(rows), 3)

    def test_unreachable_edge_named_and_incomplete(self) -> None:
        del self.answers["http://e2:8081"]
        result = self.usage()
        self.assertEqual(result.code, 1)
        self.assertIn("could not ask http://e2:8081", result.err)
        self.assertIn("Connection refused", result.err)
        self.assertIn("INCOMPLETE", result.out)
        self.assertIn("total", result.out.splitlines()[1])
        document = json.loads(self.usage("--json").out)
        self.assertFalse(document["complete"])
        self.assertEqual([u["admin"] for u in document["unreachable"]], ["http://e2:8081"])

    def test_edge_without_ledger_named(self) -> None:
        self.answers["http://e2:8081"] = (
            503,
            json.dumps(
                {"error": {"message": "this edge keeps no usage ledger", "code": 503}}
            ).encode(),
        )
        result = self.usage()
        self.assertEqual(result.code, 1)
        self.assertIn("HTTP 503: this edge keeps no usage ledger", result.err)

    def test_nobody_answered(self) -> None:
        self.answers.clear()
        result = self.usage()
        self.assertEqual(result.code, 1)
        self.assertIn("no Edge answered", result.err)
        self.assertEqual(result.out, "")

    def test_bad_document_named(self) -> None:
        self.answers["http://e2:8081"] = (200, json.dumps({"rows": [{"requests": "x"}]}).encode())
        result = self.usage()
        self.assertEqual(result.code, 1)
        self.assertIn("bad document", result.err)

    def test_env_list(self) -> None:
        self.patch(os, "environ", {"IOP_ADMIN": "http://e1:8081, e2:8081"})
        result = run(["usage"])
        self.assertEqual(result.code, 0, result)
        self.assertEqual(
            [u.split("/usage")[0] for u in self.asked], ["http://e1:8081", "http://e2:8081"]
        )

    def test_bad_times(self) -> None:
        result = self.usage("--since", "yesterday")
        self.assertEqual(result.code, 1)
        self.assertIn("--since/--until", result.err)
        result = self.usage("--since", "1d", "--until", "2d")
        self.assertIn("--until must not be before --since", result.err)
        self.assertEqual(self.asked, [])

    def test_empty(self) -> None:
        self.answers = {"http://e1:8081": answer("edge-1"), "http://e2:8081": answer("edge-2")}
        result = self.usage()
        self.assertEqual(result.code, 0)
        self.assertIn("no usage recorded", result.out)
