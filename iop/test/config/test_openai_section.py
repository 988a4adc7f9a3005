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


def parse_openai(section: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    data = copy.deepcopy(BASE)
    data["openai"] = section
    return parse_edge_config(data, base_dir=".", environ={**ENV, **(env or {})})


class ClientAPITests(SynchronousTestCase):
    LISTEN = "tcp:8080:interface=127.0.0.1"

    def test_listener_with_keys(self) -> None:
        config = parse_openai(
            {
                "listen": self.LISTEN,
                "auth": {
                    "keys": [
                        {"name": "ci", "key": "${CI_KEY}", "models": ["pooled"]},
                        {"name": "ops", "key_sha256": "ab" * 32},
                    ]
                },
            },
            {"CI_KEY": "sk-secret-ci"},
        )
        api = config.client_api
        self.assertEqual((api.listen, api.auth), (self.LISTEN, True))
        found = api.key_for("sk-secret-ci")
        assert found is not None
        self.assertEqual(
            (found.name, found.allows("pooled"), found.allows("other")), ("ci", True, False)
        )
        self.assertIsNone(api.key_for("sk-wrong"))
        self.assertNotIn("sk-secret-ci", repr(config))

    def test_defaults(self) -> None:
        api = parse_openai({}).client_api
        self.assertEqual((api.listen, api.auth, api.keys), (None, True, ()))

    def test_rules(self) -> None:
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"listen": self.LISTEN}, "openai.auth.keys", "at least one key"),
            (
                {"listen": "tcp:8080", "auth": {"enabled": False}},
                "openai.auth.enabled",
                "loopback",
            ),
            (
                {"listen": self.LISTEN, "auth": {"keys": [{"name": "k", "key": "sk-literal"}]}},
                "openai.auth.keys[0].key",
                "",
            ),
            (
                {
                    "listen": self.LISTEN,
                    "auth": {"keys": [{"name": "k", "key_sha256": "ab" * 32, "models": ["zz"]}]},
                },
                "openai.auth.keys[0].models[0]",
                "unknown model",
            ),
            (
                {
                    "listen": self.LISTEN,
                    "auth": {
                        "keys": [
                            {"name": "k", "key_sha256": "ab" * 32},
                            {"name": "k", "key_sha256": "cd" * 32},
                        ]
                    },
                },
                "openai.auth.keys[1].name",
                "duplicate",
            ),
            ({"listen": "tcp:notaport"}, "openai.listen", ""),
        ]
        for section, path, fragment in cases:
            e = self.assertRaises(ConfigError, parse_openai, section)
            self.assertIn(f"{path}: ", str(e), section)
            self.assertIn(fragment, str(e))
            self.assertNotIn("sk-literal", str(e))

    def test_loopback_without_auth(self) -> None:
        api = parse_openai({"listen": self.LISTEN, "auth": {"enabled": False}}).client_api
        self.assertFalse(api.auth)

    def test_token_counter(self) -> None:
        data = copy.deepcopy(BASE)
        data["models"][0]["token_counter"] = "approximate"
        config = parse_edge_config(data, base_dir=".", environ=ENV)
        self.assertEqual(config.models[0].token_counter, "approximate")
        data["models"][0]["token_counter"] = "exact"
        e = self.assertRaises(ConfigError, parse_edge_config, data, base_dir=".", environ=ENV)
        self.assertIn("models[0].token_counter: ", str(e))
