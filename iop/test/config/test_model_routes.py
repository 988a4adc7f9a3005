"""``openai.model_routes[]``: external model id → adapter + target (+ node)."""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, parse_edge_config
from iop.config.model import ModelRoute

BASE: dict[str, Any] = {
    "listen": {"nodes": "tcp:7443:interface=127.0.0.1"},
    "node_transport": {"plaintext": True},
    "nodes": [
        {
            "id": "n1",
            "token": "${T1}",
            "adapters": [
                {"name": "o", "type": "ollama", "base_url": "http://127.0.0.1:1"},
                {"name": "off", "type": "cli", "command": "x", "enabled": False},
            ],
            "providers": [
                {"id": "p", "adapter": "o", "category": "local_inference", "models": ["l"]}
            ],
        },
        {"id": "n2", "token": "${T2}"},
    ],
    "models": [{"id": "pooled", "providers": ["p"]}],
}
ENV = {"T1": "token-one", "T2": "token-two"}


def parse(routes: list[dict[str, Any]]) -> Any:
    data = copy.deepcopy(BASE)
    data["openai"] = {"model_routes": routes}
    return parse_edge_config(data, base_dir=".", environ=ENV)


class ModelRouteTests(SynchronousTestCase):
    def assertIssue(self, routes: list[dict[str, Any]], path: str, fragment: str) -> None:
        e = self.assertRaises(ConfigError, parse, routes)
        self.assertIn(f"{path}: ", str(e))
        self.assertIn(fragment, str(e))

    def test_routes_load(self) -> None:
        config = parse(
            [
                {"model": "a", "adapter": "o", "target": "l"},
                {"model": "b", "adapter": "ollama", "target": "l", "node": "n1"},
            ]
        )
        self.assertEqual(
            config.model_routes,
            (ModelRoute("a", "o", "l"), ModelRoute("b", "ollama", "l", "n1")),
        )

    def test_no_openai_section(self) -> None:
        config = parse_edge_config(copy.deepcopy(BASE), base_dir=".", environ=ENV)
        self.assertEqual(config.model_routes, ())

    def test_rules(self) -> None:
        ok = {"model": "a", "adapter": "o", "target": "l"}
        self.assertIssue([ok, ok], "openai.model_routes[1].model", "duplicate route")
        self.assertIssue(
            [{**ok, "model": "pooled"}], "openai.model_routes[0].model", "also a models[] id"
        )
        self.assertIssue([{**ok, "node": "zz"}], "openai.model_routes[0].node", "unknown node")
        self.assertIssue(
            [{**ok, "node": "n2"}], "openai.model_routes[0].adapter", "no enabled adapter"
        )
        self.assertIssue(
            [{**ok, "adapter": "off"}], "openai.model_routes[0].adapter", "no enabled adapter"
        )
        self.assertIssue([{"model": "a", "adapter": "o"}], "openai.model_routes[0].target", "")
        self.assertIssue([{**ok, "extra": 1}], "openai.model_routes[0].extra", "unknown key")
