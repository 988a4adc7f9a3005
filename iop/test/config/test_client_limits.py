"""
``openai.auth``'s limits and budgets (per key, per team, defaults) and key lifecycle (rotation
with a grace period, ``disabled``): what loads, and every rule naming its YAML path.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, parse_edge_config
from iop.config.model import Budget, Limits
from iop.test.config.test_openai_section import BASE, ENV

LISTEN = "tcp:8080:interface=127.0.0.1"
NEW, OLD = "sk-new-key", "sk-old-key"
UNTIL = datetime.datetime(2026, 12, 10, tzinfo=datetime.UTC).timestamp()


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_auth(auth: dict[str, Any]) -> Any:
    data = copy.deepcopy(BASE)
    # Priced models: a cost budget needs a price for every model its key may use.
    for model in data["models"]:
        model["price"] = {"input": 3, "output": 15}
    data["openai"] = {"listen": LISTEN, "auth": auth}
    return parse_edge_config(data, base_dir=".", environ=ENV).client_api


def key(name: str = "k", token: str = NEW, **fields: Any) -> dict[str, Any]:
    return {"name": name, "key_sha256": sha(token), **fields}


class LimitsTests(SynchronousTestCase):
    def test_key_team_and_defaults(self) -> None:
        api = parse_auth(
            {
                "teams": [
                    {
                        "name": "backend",
                        "limits": {"concurrent_requests": 8},
                        "budgets": [{"period": "month", "cost": 100.5}],
                    }
                ],
                "default_limits": {"requests_per_minute": 10},
                "default_budgets": [{"period": "day", "tokens": 1000}],
                "keys": [
                    key(
                        "alice",
                        "sk-a",
                        team="backend",
                        limits={
                            "requests_per_minute": 60,
                            "tokens_per_minute": 200000,
                            "concurrent_requests": 4,
                        },
                        budgets=[
                            {"period": "month", "tokens": 5000000},
                            {"period": "day", "cost": 20, "tokens": 9},
                        ],
                    ),
                    key("bob", "sk-b"),
                    key("carol", "sk-c", limits={}, budgets=[]),
                ],
            }
        )
        alice, bob, carol = api.keys
        self.assertEqual(alice.team, "backend")
        self.assertEqual(alice.limits, Limits(60, 200000, 4))
        self.assertEqual(
            alice.budgets,
            (Budget("month", tokens=5000000), Budget("day", tokens=9, cost_micros=20_000_000)),
        )
        # No limits / budgets of its own: the defaults; explicitly empty: unlimited.
        self.assertEqual((bob.limits, bob.budgets), (Limits(10), (Budget("day", 1000),)))
        self.assertEqual((carol.limits, carol.budgets), (Limits(), ()))
        self.assertTrue(carol.limits.unlimited)
        team = api.team("backend")
        assert team is not None
        self.assertEqual(team.limits, Limits(concurrent_requests=8))
        self.assertEqual(team.budgets, (Budget("month", cost_micros=100_500_000),))
        self.assertEqual(api.default_limits, Limits(10))
        self.assertIsNone(api.team("frontend"))

    def test_cost_in_micros(self) -> None:
        for cost, micros in ((0.1, 100_000), (3, 3_000_000), (0.0000015, 2), (1e-6, 1)):
            api = parse_auth({"keys": [key(budgets=[{"period": "total", "cost": cost}])]})
            self.assertEqual(api.keys[0].budgets[0].cost_micros, micros, cost)

    def test_rules(self) -> None:
        keys = "openai.auth.keys[0]"
        cases: list[tuple[dict[str, Any], str, str]] = [
            (
                {"keys": [key(limits={"requests_per_minute": 0})]},
                f"{keys}.limits.requests_per_minute",
                ">= 1",
            ),
            (
                {"keys": [key(limits={"tokens_per_minute": -5})]},
                f"{keys}.limits.tokens_per_minute",
                ">= 1",
            ),
            (
                {"keys": [key(limits={"concurrent_requests": 1.5})]},
                f"{keys}.limits.concurrent_requests",
                "integer",
            ),
            (
                {"keys": [key(limits={"request_per_minute": 5})]},
                f"{keys}.limits.request_per_minute",
                "did you mean 'requests_per_minute'",
            ),
            ({"keys": [key(limits=[1])]}, f"{keys}.limits", "mapping"),
            (
                {"keys": [key(budgets=[{"period": "day"}])]},
                f"{keys}.budgets[0]",
                "tokens, cost or both",
            ),
            (
                {"keys": [key(budgets=[{"period": "year", "tokens": 1}])]},
                f"{keys}.budgets[0].period",
                "must be one of",
            ),
            ({"keys": [key(budgets=[{"tokens": 1}])]}, f"{keys}.budgets[0].period", "required"),
            (
                {"keys": [key(budgets=[{"period": "day", "tokens": 0}])]},
                f"{keys}.budgets[0].tokens",
                ">= 1",
            ),
            (
                {"keys": [key(budgets=[{"period": "day", "cost": 0}])]},
                f"{keys}.budgets[0].cost",
                "> 0",
            ),
            (
                {"keys": [key(budgets=[{"period": "day", "cost": "5"}])]},
                f"{keys}.budgets[0].cost",
                "number",
            ),
            (
                {"keys": [key(budgets=[{"period": "day", "cost": 1e-9}])]},
                f"{keys}.budgets[0].cost",
                "0.000001",
            ),
            (
                {"keys": [key(budgets=[{"period": "day", "tokns": 5}])]},
                f"{keys}.budgets[0].tokns",
                "did you mean 'tokens'",
            ),
            (
                {
                    "keys": [
                        key(budgets=[{"period": "day", "tokens": 5}, {"period": "day", "cost": 1}])
                    ]
                },
                f"{keys}.budgets[1].period",
                "one entry",
            ),
            ({"keys": [key(team="nope")]}, f"{keys}.team", "no team 'nope'"),
            (
                {"teams": [{"name": "t"}, {"name": "t"}], "keys": [key()]},
                "openai.auth.teams[1].name",
                "duplicate team",
            ),
            (
                {"teams": [{"name": "t", "limits": {"concurrent_requests": 0}}], "keys": [key()]},
                "openai.auth.teams[0].limits.concurrent_requests",
                ">= 1",
            ),
            (
                {"teams": [{"name": "t", "budget": []}], "keys": [key()]},
                "openai.auth.teams[0].budget",
                "did you mean 'budgets'",
            ),
            (
                {"default_limits": {"concurrent": 1}, "keys": [key()]},
                "openai.auth.default_limits.concurrent",
                "did you mean 'concurrent_requests'",
            ),
            (
                {"default_budgets": [{"period": "week"}], "keys": [key()]},
                "openai.auth.default_budgets[0]",
                "tokens, cost or both",
            ),
            ({"keys": [key(disabled="yes")]}, f"{keys}.disabled", "boolean"),
        ]
        for auth, path, fragment in cases:
            e = self.assertRaises(ConfigError, parse_auth, auth)
            self.assertIn(f"{path}: ", str(e), auth)
            self.assertIn(fragment, str(e), auth)


class LifecycleTests(SynchronousTestCase):
    def test_rotation_grace(self) -> None:
        api = parse_auth(
            {
                "keys": [
                    key(
                        "alice",
                        NEW,
                        previous_key_sha256=sha(OLD),
                        previous_valid_until="2026-12-10T00:00:00Z",
                    )
                ]
            }
        )
        alice = api.keys[0]
        self.assertEqual(alice.previous_valid_until, UNTIL)
        before, after = UNTIL - 1, UNTIL
        self.assertIs(api.key_for(NEW, before), alice)
        self.assertIs(api.key_for(OLD, before), alice)
        self.assertIs(api.key_for(NEW, after), alice)
        self.assertIsNone(api.key_for(OLD, after))
        self.assertEqual(api.why_refused(OLD, after), "rotated")
        self.assertIsNone(api.why_refused(OLD, before))
        self.assertIsNone(api.why_refused("sk-unknown", after))

    def test_valid_until_forms(self) -> None:
        for value in (
            "2026-12-10T00:00:00Z",
            "2026-12-10T01:00:00+01:00",
            datetime.datetime(2026, 12, 10, tzinfo=datetime.UTC),
        ):
            api = parse_auth(
                {"keys": [key(previous_key_sha256=sha(OLD), previous_valid_until=value)]}
            )
            self.assertEqual(api.keys[0].previous_valid_until, UNTIL, value)

    def test_disabled(self) -> None:
        api = parse_auth(
            {
                "keys": [
                    key(
                        "alice",
                        NEW,
                        disabled=True,
                        previous_key_sha256=sha(OLD),
                        previous_valid_until="2099-01-01T00:00:00Z",
                    ),
                    key("bob", "sk-bob"),
                ]
            }
        )
        self.assertTrue(api.keys[0].disabled)
        self.assertIsNone(api.key_for(NEW, 0.0))
        self.assertIsNone(api.key_for(OLD, 0.0))
        self.assertEqual(api.why_refused(NEW, 0.0), "disabled")
        self.assertEqual(api.why_refused(OLD, 0.0), "disabled")
        self.assertIs(api.key_for("sk-bob", 0.0), api.keys[1])

    def test_rules(self) -> None:
        keys = "openai.auth.keys[0]"
        cases: list[tuple[dict[str, Any], str, str]] = [
            (key(previous_key_sha256=sha(OLD)), f"{keys}.previous_valid_until", "required"),
            (
                key(previous_valid_until="2026-12-10T00:00:00Z"),
                f"{keys}.previous_valid_until",
                "no previous key",
            ),
            (
                key(previous_key_sha256=sha(OLD), previous_valid_until="2026-12-10T00:00:00"),
                f"{keys}.previous_valid_until",
                "zone",
            ),
            (
                key(previous_key_sha256=sha(OLD), previous_valid_until="next tuesday"),
                f"{keys}.previous_valid_until",
                "time with its zone",
            ),
            (
                key(previous_key_sha256=sha(OLD), previous_valid_until=datetime.date(2026, 12, 10)),
                f"{keys}.previous_valid_until",
                "time with its zone",
            ),
            (
                key(previous_key_sha256=sha(NEW), previous_valid_until="2026-12-10T00:00:00Z"),
                f"{keys}.previous_key_sha256",
                "same key",
            ),
            (
                key(
                    previous_key_sha256=sha(OLD),
                    previous_key="${X}",
                    previous_valid_until="2026-12-10T00:00:00Z",
                ),
                keys,
                "set only one of previous_key",
            ),
            (
                key(previous_key_sha256="zz", previous_valid_until="2026-12-10T00:00:00Z"),
                f"{keys}.previous_key_sha256",
                "64 hexadecimal",
            ),
        ]
        for entry, path, fragment in cases:
            e = self.assertRaises(ConfigError, parse_auth, {"keys": [entry]})
            self.assertIn(f"{path}: ", str(e), entry)
            self.assertIn(fragment, str(e), entry)
