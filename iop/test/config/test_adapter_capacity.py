"""
``nodes[].adapters[].max_concurrency`` against the providers it serves: optional (left out, the
node's gate follows the providers); given, the enabled providers' ``capacity`` on that adapter
must fit under it, or the config does not load, with one issue naming both paths.
"""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.test.config.test_edge_config import (
    EdgeConfigTestMixin,
    Mutation,
    append,
    assertIssue,
    base_config,
    chain,
    put,
)

A0 = "nodes.0.adapters.0"
P0 = "nodes.0.providers.0"
SECOND = {
    "id": "a-chat-2",
    "adapter": "fake-openai",
    "category": "api",
    "models": ["m1"],
    "capacity": 5,
}


class AdapterCapacityTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def load(self, mutation: Mutation) -> Any:
        data = copy.deepcopy(base_config())
        mutation(data)
        return self.parse(data)

    def refused(self, mutation: Mutation) -> ConfigError:
        data = copy.deepcopy(base_config())
        mutation(data)
        error: ConfigError = self.assertRaises(ConfigError, self.parse, data)
        return error

    def test_leftOutFollowsProviders(self) -> None:
        config = self.load(chain(put(f"{P0}.capacity", 7), append("nodes.0.providers", SECOND)))
        self.assertIsNone(config.nodes[0].adapters[0].max_concurrency)

    def test_withinTheCeiling(self) -> None:
        config = self.load(
            chain(
                put(f"{A0}.max_concurrency", 7),
                put(f"{P0}.capacity", 2),
                append("nodes.0.providers", SECOND),
            )
        )
        self.assertEqual(config.nodes[0].adapters[0].max_concurrency, 7)

    def test_oneProviderOver(self) -> None:
        error = self.refused(chain(put(f"{A0}.max_concurrency", 2), put(f"{P0}.capacity", 5)))
        issue = assertIssue(
            self,
            error,
            "nodes[0].providers[0].capacity",
            "5 exceeds nodes[0].adapters[0].max_concurrency (2)",
        )
        self.assertIn("raise max_concurrency to at least 5 or leave it out", issue.message)
        self.assertEqual(len(error.issues), 1)

    def test_sumOverNamesTheProviderThatTakesIt(self) -> None:
        error = self.refused(
            chain(
                put(f"{A0}.max_concurrency", 2),
                put(f"{P0}.capacity", 2),
                append("nodes.0.providers", SECOND),
            )
        )
        assertIssue(
            self,
            error,
            "nodes[0].providers[2].capacity",
            "5 (7 together with the other providers of adapter 'fake-openai') exceeds "
            "nodes[0].adapters[0].max_concurrency (2)",
        )
        self.assertEqual(len(error.issues), 1)
        self.assertIn(
            "nodes[0].providers[2].capacity: 5 (7 together with the other providers",
            str(error),
        )

    def test_disabledProvidersDoNotCount(self) -> None:
        config = self.load(
            chain(
                put(f"{A0}.max_concurrency", 2),
                put(f"{P0}.capacity", 2),
                append("nodes.0.providers", {**SECOND, "enabled": False}),
            )
        )
        self.assertEqual(len(config.nodes[0].providers), 3)

    def test_legacyMappingPath(self) -> None:
        error = self.refused(
            chain(
                put("nodes.1.adapters.ollama.max_concurrency", 1),
                put("nodes.1.providers.0.capacity", 3),
            )
        )
        assertIssue(
            self,
            error,
            "nodes[1].providers[0].capacity",
            "exceeds nodes[1].adapters.ollama.max_concurrency (1)",
        )

    def test_invalidCeilingNotCheckedFurther(self) -> None:
        error = self.refused(chain(put(f"{A0}.max_concurrency", 0), put(f"{P0}.capacity", 5)))
        assertIssue(self, error, "nodes[0].adapters[0].max_concurrency", "must be >= 1")
        self.assertEqual(len(error.issues), 1)
