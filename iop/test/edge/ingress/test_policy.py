# -*- test-case-name: iop.test.edge.ingress.test_policy -*-
"""The generation policy: default and floor of the output limit, the default thinking budget."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ModelConfig
from iop.edge.ingress.policy import max_tokens_for, thinking_budget_for


class PolicyTests(SynchronousTestCase):
    def test_policy(self) -> None:
        policy = ModelConfig(
            id="m", providers=(), default_max_tokens=100, min_max_tokens=10,
            default_thinking_token_budget=64,
        )  # fmt: skip
        self.assertEqual(max_tokens_for(None, policy), 100)
        self.assertEqual(max_tokens_for(5, policy), 10)
        self.assertEqual(max_tokens_for(500, policy), 500)
        self.assertIsNone(max_tokens_for(None, ModelConfig(id="m", providers=())))
        self.assertIsNone(max_tokens_for(None, None))
        self.assertEqual(max_tokens_for(3, ModelConfig(id="m", providers=(), min_max_tokens=4)), 4)
        self.assertEqual(thinking_budget_for(policy), 64)
        self.assertEqual(thinking_budget_for(None), 0)
