# -*- test-case-name: iop.test.cli.test_status_cli -*-
"""
The tables of C{iop status} (L{iop.cli.status.summary}): a node that is down says since when, a
provider's load reads as in flight against capacity (``-`` when it takes nothing), and the
client models say whether they can be served now and where they go.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import status as status_cli
from iop.test.cli.support import run
from iop.test.cli.test_admin_commands_cli import ADMIN, STATUS, FakeAdmin

#: 2023-11-14 22:13:20 UTC, in ms.
DOWN_MS = 1_700_000_000_000


def document() -> dict[str, Any]:
    d: dict[str, Any] = copy.deepcopy(STATUS)
    d["nodes"][1]["down_since_unix_ms"] = DOWN_MS
    d["nodes"][1]["providers"] = ["b-chat"]
    d["providers"].append(
        dict(
            d["providers"][0],
            id="b-chat",
            node_id="node-b",
            models=["m1"],
            status="unavailable",
            health="offline",
            capacity=0,
            long_capacity=0,
            in_flight=0,
            long_in_flight=0,
            queued=0,
            long_queued=0,
        )
    )
    d["models"] = [
        {
            "id": "m1",
            "available": True,
            "providers": [
                {"provider_id": "a-chat", "target": "big", "status": "available"},
                {"provider_id": "b-chat", "target": "big", "status": "unavailable"},
            ],
        },
        {
            "id": "m3",
            "available": False,
            "providers": [{"provider_id": "b-chat", "target": "", "status": "unavailable"}],
        },
    ]
    d["routes"] = [
        {"model": "agent", "node_id": "node-a", "adapter": "cli", "target": "t", "available": True},
        {"model": "any", "node_id": None, "adapter": "cli", "target": "u", "available": False},
    ]
    return d


class StatusTableTests(SynchronousTestCase):
    def lines(self, at: float | None = DOWN_MS / 1000 + 750) -> list[str]:
        return status_cli.summary(document(), at)

    def test_node_down_since(self) -> None:
        lines = self.lines()
        self.assertIn(
            "node-b  disconnected  down since 2023-11-14 22:13:20Z (12m ago)  -         b-chat",
            lines,
        )
        self.assertTrue(any(line.startswith("node-a  ready         -  ") for line in lines))
        # Without a clock, only the time.
        self.assertIn("down since 2023-11-14 22:13:20Z  ", "\n".join(self.lines(None)))

    def test_never_connected(self) -> None:
        d = document()
        d["nodes"][1]["down_since_unix_ms"] = None
        self.assertIn("never connected", "\n".join(status_cli.summary(d)))

    def test_ago(self) -> None:
        ago = status_cli._ago
        self.assertEqual(
            [ago(s) for s in (-3, 0, 59, 60, 3599, 3600, 86400 * 3 + 5)],
            ["0s ago", "0s ago", "59s ago", "1m ago", "59m ago", "1h ago", "3d ago"],
        )

    def test_provider_load(self) -> None:
        """In flight of capacity; '-' for a provider that takes nothing (not "0/0")."""
        lines = self.lines()
        header = next(line for line in lines if line.startswith("NODE    PROVIDER"))
        self.assertEqual(
            header.split(),
            ["NODE", "PROVIDER", "ADAPTER", "MODEL(S)", "STATUS", "HEALTH", "IN", "FLIGHT/CAPACITY",
             "LONG", "QUEUED"],
        )  # fmt: skip
        a = next(line for line in lines if line.startswith("node-a  a-chat"))
        b = next(line for line in lines if line.startswith("node-b  b-chat"))
        self.assertTrue(a.endswith("2/4                 0/1   3 (1 long)"), a)
        self.assertTrue(b.endswith("unavailable  offline  -                   -     -"), b)
        self.assertNotIn("0/0", "\n".join(lines))

    def test_no_long_capacity(self) -> None:
        self.assertEqual(
            status_cli._load(
                {"status": "available", "capacity": 2, "long_capacity": 0, "in_flight": 1,
                 "queued": 0, "long_queued": 0}
            ),
            ("1/2", "-", "0"),
        )  # fmt: skip

    def test_models(self) -> None:
        lines = self.lines()
        start = lines.index(next(line for line in lines if line.startswith("MODEL ")))
        self.assertEqual(
            lines[start:],
            [
                "MODEL  AVAILABLE            PROVIDERS",
                "m1     yes (1/2 providers)  a-chat (big), b-chat (big) [unavailable]",
                "m3     no                   b-chat [unavailable]",
                "agent  yes                  direct route: cli t on node node-a",
                "any    no                   direct route: cli u on the single ready node",
            ],
        )


class StatusCommandTests(SynchronousTestCase):
    def test_json_is_the_snapshot(self) -> None:
        admin = FakeAdmin(self)
        admin.answer(f"{ADMIN}/status", document())
        result = run(["status", "--json"])
        self.assertEqual(result.code, 0)
        self.assertEqual(json.loads(result.out), document())

    def test_table_uses_the_clock(self) -> None:
        admin = FakeAdmin(self)
        admin.answer(f"{ADMIN}/status", document())
        self.patch(status_cli, "now", lambda: DOWN_MS / 1000 + 7200)
        self.assertIn("(2h ago)", run(["status"]).out)
