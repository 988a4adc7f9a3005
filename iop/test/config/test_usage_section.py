"""
Tests for prices (``models[].price``, :mod:`iop.config.edge.models`) and the ``usage:`` section
(:mod:`iop.config.edge.usage`): exact micro-units, defaults, and each field's path-named error.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.config.edge.links import cost_budgets_priced
from iop.config.errors import Issues
from iop.config.model import LedgerConfig, ModelConfig, ModelRoute, Price, UsageConfig
from iop.test.config.test_edge_config import EdgeConfigTestMixin, assertIssue, base_config

P = "models[0].price"


class PriceTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def price(self, price: Any) -> Price | None:
        data = base_config()
        data["models"][0]["price"] = price
        return self.parse(data).models[0].price

    def error(self, price: Any) -> ConfigError:
        data = base_config()
        data["models"][0]["price"] = price
        error: ConfigError = self.assertRaises(ConfigError, self.parse, data)
        return error

    def test_absent(self) -> None:
        """No price: cost unknown."""
        self.assertIsNone(self.parse(base_config()).models[0].price)

    def test_full(self) -> None:
        price = self.price(
            {"input": 3.0, "output": 15, "cached_input": 0.3, "cache_write": 3.75, "reasoning": 60}
        )
        self.assertEqual(price, Price(3_000_000, 15_000_000, 300_000, 3_750_000, 60_000_000))

    def test_defaults(self) -> None:
        """cached_input and cache_write default to input, reasoning to output."""
        self.assertEqual(
            self.price({"input": 1.1, "output": 4.4}),
            Price(1_100_000, 4_400_000, 1_100_000, 1_100_000, 4_400_000),
        )

    def test_exact_decimals(self) -> None:
        """The decimal as written, not the float's binary neighbour (0.1 + 0.2 trouble)."""
        price = self.price({"input": 0.000001, "output": 0.075, "cached_input": 0.29})
        self.assertEqual(price, Price(1, 75_000, 290_000, 1, 75_000))

    def test_free(self) -> None:
        self.assertEqual(self.price({"input": 0, "output": 0}), Price(0, 0, 0, 0, 0))

    def test_input_and_output_required(self) -> None:
        error = self.error({"cached_input": 0.3})
        assertIssue(self, error, f"{P}.input", "is required")
        assertIssue(self, error, f"{P}.output", "is required")

    def test_bad_values(self) -> None:
        for value, message in (
            (-1, "must be >= 0"),
            ("3", "must be a number"),
            (True, "must be a number"),
            (0.0000001, "at most 6 decimal places"),
            (float("inf"), "finite"),
        ):
            error = self.error({"input": value, "output": 1})
            assertIssue(self, error, f"{P}.input", message)

    def test_unknown_field(self) -> None:
        error = self.error({"input": 1, "output": 1, "cached_inpt": 1})
        assertIssue(self, error, f"{P}.cached_inpt", "did you mean 'cached_input'")

    def test_not_a_mapping(self) -> None:
        assertIssue(self, self.error(3), P, "must be a mapping")


class UsageSectionTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def usage(self, section: Any) -> UsageConfig:
        data = base_config()
        data["usage"] = section
        return self.parse(data).usage

    def error(self, section: Any) -> ConfigError:
        data = base_config()
        data["usage"] = section
        error: ConfigError = self.assertRaises(ConfigError, self.parse, data)
        return error

    def test_absent(self) -> None:
        """No section: USD, a ledger beside edge.yaml keeping 90 days."""
        usage = self.parse(base_config()).usage
        self.assertEqual(
            usage,
            UsageConfig("USD", LedgerConfig(os.path.join(self.base, "usage.sqlite3"), 90, True)),
        )

    def test_full(self) -> None:
        usage = self.usage(
            {
                "currency": "EUR",
                "ledger": {"path": "state/ledger.db", "retention_days": 0, "enabled": False},
            }
        )
        self.assertEqual(
            usage,
            UsageConfig(
                "EUR", LedgerConfig(os.path.join(self.base, "state", "ledger.db"), 0, False)
            ),
        )

    def test_absolute_path(self) -> None:
        usage = self.usage({"ledger": {"path": "/var/lib/iop/usage.sqlite3"}})
        assert usage.ledger is not None
        self.assertEqual(usage.ledger.path, "/var/lib/iop/usage.sqlite3")

    def test_currency(self) -> None:
        for bad in ("usd", "US", "DOLLAR", "€"):
            assertIssue(self, self.error({"currency": bad}), "usage.currency", "ISO 4217")
        assertIssue(self, self.error({"currency": ""}), "usage.currency", "must not be empty")

    def test_retention(self) -> None:
        assertIssue(
            self,
            self.error({"ledger": {"retention_days": -1}}),
            "usage.ledger.retention_days",
            ">= 0",
        )
        assertIssue(
            self,
            self.error({"ledger": {"retention_days": 10**6}}),
            "usage.ledger.retention_days",
            "<= ",
        )

    def test_unknown_keys(self) -> None:
        assertIssue(
            self, self.error({"curency": "USD"}), "usage.curency", "did you mean 'currency'"
        )
        assertIssue(
            self,
            self.error({"ledger": {"retention": 3}}),
            "usage.ledger.retention",
            "did you mean 'retention_days'",
        )

    def test_not_mappings(self) -> None:
        assertIssue(self, self.error([]), "usage", "must be a mapping")
        assertIssue(self, self.error({"ledger": "x"}), "usage.ledger", "must be a mapping")


class CostBudgetsNeedPricesTests(SynchronousTestCase):
    """
    :func:`iop.config.edge.links.cost_budgets_priced`, on the ``openai.auth`` shape of keys,
    teams and budgets (called directly: the budgets' own parser is another section's).
    """

    PRICE = Price(1, 1, 1, 1, 1)
    MODELS = (
        ModelConfig("priced", (), price=PRICE),
        ModelConfig("free", (), price=Price(0, 0, 0, 0, 0)),
        ModelConfig("unpriced", ()),
    )

    def issues(self, auth: dict[str, Any], routes: tuple[ModelRoute, ...] = ()) -> list[str]:
        issues = Issues()
        cost_budgets_priced(issues, {"auth": auth}, self.MODELS, routes)
        return [str(issue) for issue in issues]

    def test_key_scoped_to_priced_models(self) -> None:
        auth = {"keys": [{"name": "a", "models": ["priced", "free"], "budgets": [{"cost": 5}]}]}
        self.assertEqual(self.issues(auth), [])

    def test_key_that_may_use_an_unpriced_model(self) -> None:
        auth = {
            "keys": [
                {
                    "name": "a",
                    "models": ["priced", "unpriced"],
                    "budgets": [{"tokens": 9}, {"cost": 5}],
                }
            ]
        }
        [issue] = self.issues(auth)
        self.assertTrue(issue.startswith("openai.auth.keys[0].budgets[1].cost: "), issue)
        self.assertIn("no models[].price for: unpriced", issue)

    def test_key_without_scope_may_use_everything(self) -> None:
        auth = {"keys": [{"name": "a", "budgets": [{"cost": 5}]}]}
        [issue] = self.issues(auth, (ModelRoute("direct", "fake", "t"),))
        self.assertIn("no models[].price for: direct, unpriced", issue)

    def test_token_budgets_need_no_price(self) -> None:
        auth = {"keys": [{"name": "a", "budgets": [{"period": "day", "tokens": 5}]}]}
        self.assertEqual(self.issues(auth), [])

    def test_team_sums_its_keys(self) -> None:
        auth = {
            "keys": [
                {"name": "a", "team": "t", "models": ["priced"]},
                {"name": "b", "team": "t", "models": ["unpriced"]},
                {"name": "c", "team": "other", "models": ["unpriced"]},
            ],
            "teams": [
                {"name": "t", "budgets": [{"cost": 1}]},
                {"name": "u", "budgets": [{"cost": 1}]},
            ],
        }
        [issue] = self.issues(auth)
        self.assertTrue(issue.startswith("openai.auth.teams[0].budgets[0].cost: "), issue)
        self.assertIn("every model its keys may use", issue)

    def test_default_budgets_for_keys_without_budgets(self) -> None:
        first: dict[str, Any] = {"name": "a", "models": ["unpriced"], "budgets": [{"tokens": 1}]}
        auth = {
            "keys": [first, {"name": "b", "models": ["priced"]}],
            "default_budgets": [{"cost": 1}],
        }
        self.assertEqual(self.issues(auth), [])
        first.pop("budgets")
        [issue] = self.issues(auth)
        self.assertTrue(issue.startswith("openai.auth.default_budgets[0].cost: "), issue)

    def test_malformed_is_skipped(self) -> None:
        for auth in ({"keys": "x"}, {"keys": [3, {"budgets": "x"}]}, {"teams": [None]}):
            self.assertEqual(self.issues(auth), [])
