"""``openai.model_routes[]``: external model id → adapter + target (+ node)."""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, parse_edge_config
from iop.config.model import CorsConfig, ModelRoute
from iop.edge.descriptors import client_caps

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


class ClientLimitTests(SynchronousTestCase):
    """``openai:``'s deadlines, connection caps and listen backlog."""

    OPEN = {"listen": "tcp:8080:interface=127.0.0.1", "auth": {"enabled": False}}

    def test_defaults(self) -> None:
        api = parse_openai(dict(self.OPEN)).client_api
        self.assertEqual(
            (
                api.request_head_timeout_sec,
                api.request_body_timeout_sec,
                api.request_body_min_rate,
                api.idle_timeout_sec,
                api.max_connections,
                api.max_connections_per_peer,
                api.listen_backlog,
            ),
            # The per-peer cap not given: a quarter of the served cap, once that is known.
            (10.0, 10.0, 1024, 60.0, 4096, None, 1024),
        )
        self.assertEqual(api.listen_endpoint, "tcp:8080:interface=127.0.0.1:backlog=1024")
        self.assertIsNone(parse_openai({}).client_api.listen_endpoint)

    def test_set(self) -> None:
        api = parse_openai(
            {
                **self.OPEN,
                "request_head_timeout_sec": 2,
                "request_body_timeout_sec": 0.5,
                "request_body_min_rate": 1,
                "idle_timeout_sec": 5,
                "max_connections": 10,
                "max_connections_per_peer": 10,
                "listen_backlog": 4096,
            }
        ).client_api
        self.assertEqual(
            (api.request_head_timeout_sec, api.request_body_timeout_sec, api.idle_timeout_sec),
            (2.0, 0.5, 5.0),
        )
        self.assertEqual((api.max_connections, api.max_connections_per_peer), (10, 10))
        self.assertEqual(api.listen_endpoint, "tcp:8080:interface=127.0.0.1:backlog=4096")

    def test_the_per_peer_cap_is_a_quarter_of_the_total_unless_given(self) -> None:
        api = parse_openai({**self.OPEN, "max_connections": 100}).client_api
        self.assertIsNone(api.max_connections_per_peer)
        caps = client_caps(api.max_connections, api.max_connections_per_peer)
        self.assertEqual(caps.max_connections_per_peer, 25)

    def test_backlog_in_the_endpoint(self) -> None:
        listen = "tcp:8080:interface=127.0.0.1:backlog=77"
        api = parse_openai({**self.OPEN, "listen": listen}).client_api
        self.assertEqual(api.listen_endpoint, listen)

    def test_rules(self) -> None:
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"request_head_timeout_sec": 0}, "openai.request_head_timeout_sec", "> 0"),
            ({"request_body_timeout_sec": "10"}, "openai.request_body_timeout_sec", "number"),
            ({"request_body_min_rate": 0}, "openai.request_body_min_rate", ">= 1"),
            ({"idle_timeout_sec": -1}, "openai.idle_timeout_sec", "> 0"),
            ({"max_connections": 0}, "openai.max_connections", ""),
            ({"max_connections_per_peer": 1.5}, "openai.max_connections_per_peer", ""),
            (
                {"max_connections": 10, "max_connections_per_peer": 11},
                "openai.max_connections_per_peer",
                "<= max_connections (10)",
            ),
            ({"listen_backlog": 0}, "openai.listen_backlog", ""),
            ({"listen_backlog": 70000}, "openai.listen_backlog", ""),
            (
                {"listen": "tcp:8080:interface=127.0.0.1:backlog=5", "listen_backlog": 9},
                "openai.listen_backlog",
                "one place",
            ),
        ]
        for extra, path, fragment in cases:
            e = self.assertRaises(ConfigError, parse_openai, {**self.OPEN, **extra})
            self.assertIn(f"{path}: ", str(e), extra)
            self.assertIn(fragment, str(e), extra)


class CorsTests(SynchronousTestCase):
    """``openai.cors``: origins exactly as browsers send them; ``*`` alone, with auth."""

    KEYS = {"enabled": True, "keys": [{"name": "k", "key_sha256": "0" * 64}]}

    def cors(self, cors: Any, auth: Any = None) -> Any:
        section: dict[str, Any] = {"cors": cors}
        if auth is not None:
            section["auth"] = auth
        return parse_openai(section).client_api.cors

    def test_absent_is_off(self) -> None:
        self.assertIsNone(parse_openai({}).client_api.cors)

    def test_origins(self) -> None:
        origins = [
            "https://app.example.com",
            "http://localhost:5173",
            "http://127.0.0.1:8000",
            "http://[::1]:3000",
            "chrome-extension://abcdefghijklmnop",
        ]
        cors = self.cors({"allow_origins": origins, "max_age_sec": 60})
        self.assertEqual(cors, CorsConfig(tuple(origins), 60))
        self.assertTrue(cors.allows("http://localhost:5173"))
        self.assertFalse(cors.allows("http://localhost:5174"))
        self.assertFalse(cors.any_origin)
        self.assertEqual(self.cors({"allow_origins": ["https://a.example"]}).max_age_sec, 600)

    def test_any_origin_with_auth(self) -> None:
        cors = self.cors({"allow_origins": ["*"]}, auth=self.KEYS)
        self.assertTrue(cors.any_origin)
        self.assertTrue(cors.allows("https://whatever.example"))

    def test_rules(self) -> None:
        path = "openai.cors.allow_origins"
        cases: list[tuple[Any, Any, str, str]] = [
            ({"allow_origins": ["*"]}, {"enabled": False}, f"{path}[0]", "needs openai.auth on"),
            ({"allow_origins": ["*", "https://a.example"]}, None, f"{path}[0]", "alone"),
            ({"allow_origins": ["null"]}, None, f"{path}[0]", "cannot be allowed"),
            ({"allow_origins": ["https://a.example/"]}, None, f"{path}[0]", "no path"),
            ({"allow_origins": ["https://a.example/app"]}, None, f"{path}[0]", "no path"),
            ({"allow_origins": ["a.example"]}, None, f"{path}[0]", "scheme://host"),
            ({"allow_origins": ["https://A.example"]}, None, f"{path}[0]", "'https://a.example'"),
            ({"allow_origins": ["https://a.example:443"]}, None, f"{path}[0]", "default port"),
            ({"allow_origins": ["http://a.example:80"]}, None, f"{path}[0]", "'http://a.example'"),
            ({"allow_origins": ["http://a.example:99999"]}, None, f"{path}[0]", "out of range"),
            ({"allow_origins": ["https://a.example"] * 2}, None, f"{path}[1]", "duplicate"),
            ({"allow_origins": [7]}, None, f"{path}[0]", "must be a string"),
            ({"allow_origins": []}, None, path, "at least one origin"),
            ({}, None, path, "list the origins"),
            ({"allow_origins": ["https://a.example"], "max_age_sec": -1}, None, "max_age_sec", ""),
            (
                {"allow_origins": ["https://a.example"], "credentials": True},
                None,
                "credentials",
                "",
            ),
        ]
        for cors, auth, where, fragment in cases:
            e = self.assertRaises(ConfigError, self.cors, cors, auth)
            self.assertIn(f"{where}: ", str(e), cors)
            self.assertIn(fragment, str(e), cors)
