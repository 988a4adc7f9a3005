# -*- test-case-name: iop.test.edge.test_status_models -*-
"""
The status snapshot's answers to "since when is this node down?" and "which client models can
be served now?" (L{iop.edge.status.snapshot}, L{iop.edge.registry.NodeRegistry.down_since}).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ModelRoute
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.status import snapshot
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config


class StatusModelsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.config = dataclasses.replace(
            edge_config(),
            model_routes=(
                ModelRoute("pinned", "fake", "t1", node_id="node-b"),
                ModelRoute("anywhere", "fake", "t2"),
            ),
        )
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
        )

    def connect(self, node_id: str) -> FakeConnection:
        conn = FakeConnection()
        self.registry.register(TOKENS[node_id], conn)
        self.registry.ready(node_id, conn)
        return conn

    def snap(self) -> dict[str, Any]:
        return snapshot(self.config, self.registry)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["id"]: n for n in self.snap()["nodes"]}

    def test_down_since(self) -> None:
        """Null before a node was ever ready and while it is ready; the time its ready
        connection went away after; null again once it is ready again."""
        self.assertIsNone(self.nodes()["node-a"]["down_since_unix_ms"])
        conn = self.connect("node-a")
        self.assertIsNone(self.nodes()["node-a"]["down_since_unix_ms"])
        self.clock.advance(5)
        self.registry.disconnected(conn, "heartbeat timed out")
        self.assertEqual(self.nodes()["node-a"]["down_since_unix_ms"], 1_700_000_005_000)
        self.assertEqual(self.registry.down_since("node-a"), 1_700_000_005.0)
        # A pending registration does not end the outage: the node is still not serving.
        self.clock.advance(5)
        pending = FakeConnection()
        self.registry.register(TOKENS["node-a"], pending)
        self.assertEqual(self.nodes()["node-a"]["down_since_unix_ms"], 1_700_000_005_000)
        self.registry.ready("node-a", pending)
        self.assertIsNone(self.nodes()["node-a"]["down_since_unix_ms"])

    def test_models_say_which_providers_are_available(self) -> None:
        [pool] = self.snap()["models"]
        self.assertEqual(
            pool,
            {
                "id": "pool",
                "available": False,
                "providers": [
                    {"provider_id": "a-chat", "target": "demo-model", "status": "unavailable"},
                    {"provider_id": "b-chat", "target": "demo-model", "status": "unavailable"},
                ],
            },
        )
        self.connect("node-b")
        [pool] = self.snap()["models"]
        self.assertTrue(pool["available"])
        self.assertEqual([r["status"] for r in pool["providers"]], ["unavailable", "available"])

    def test_routes(self) -> None:
        """A pinned route is available with its node; an unpinned one with exactly one ready
        node (the route resolver refuses to choose between several)."""

        def available() -> dict[str, bool]:
            return {r["model"]: r["available"] for r in self.snap()["routes"]}

        self.assertEqual(available(), {"pinned": False, "anywhere": False})
        self.connect("node-b")
        self.assertEqual(available(), {"pinned": True, "anywhere": True})
        self.connect("node-a")
        self.assertEqual(available(), {"pinned": True, "anywhere": False})
        [pinned, anywhere] = self.snap()["routes"]
        self.assertEqual(
            pinned,
            {
                "model": "pinned",
                "node_id": "node-b",
                "adapter": "fake",
                "target": "t1",
                "available": True,
            },
        )
        self.assertIsNone(anywhere["node_id"])
