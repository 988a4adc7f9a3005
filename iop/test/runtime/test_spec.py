"""AdapterSpec and RuntimeProfile: immutable all the way down, named, and silent about secrets."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, cast

from twisted.trial.unittest import SynchronousTestCase

from iop.runtime import AdapterSpec, RuntimeProfile


class AdapterSpecTests(SynchronousTestCase):
    def test_frozenAllTheWayDown(self) -> None:
        headers = {"Authorization": "Bearer secret-token"}
        args = ["-p", "{model}"]
        spec = AdapterSpec(name="a", type="cli", headers=headers, args=args)  # type: ignore[arg-type]
        headers["Authorization"] = "changed"
        args.append("more")
        self.assertEqual(
            (dict(spec.headers), spec.args),
            ({"Authorization": "Bearer secret-token"}, ("-p", "{model}")),
        )
        self.assertRaises(TypeError, operator.setitem, cast(Any, spec.headers), "x", "y")
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, spec, "base_url", "x")

    def test_unnamedIsNamedAfterItsType(self) -> None:
        self.assertEqual(AdapterSpec(name="", type="vllm").name, "vllm")
        self.assertEqual(AdapterSpec(name="gpu", type="vllm").name, "gpu")

    def test_equality(self) -> None:
        self.assertEqual(
            AdapterSpec(name="a", type="vllm", headers={"k": "v"}),
            AdapterSpec(name="a", type="vllm", headers={"k": "v"}),
        )

    def test_reprNamesTheInstanceOnly(self) -> None:
        spec = AdapterSpec(
            name="a",
            type="openai_compat",
            base_url="https://user:pw@upstream.example/v1",
            headers={"Authorization": "Bearer secret-token"},
            env={"API_KEY": "env-secret"},
            settings={"token": "settings-secret"},
        )
        text = repr(spec)
        self.assertIn("'a'", text)
        for secret in ("secret-token", "env-secret", "settings-secret", "pw@"):
            self.assertNotIn(secret, text)


class RuntimeProfileTests(SynchronousTestCase):
    def test_frozen(self) -> None:
        operations = {"chat_completions": "/v2/chat"}
        profile = RuntimeProfile(name="p", operations=operations, capabilities=["chat"])  # type: ignore[arg-type]
        operations["responses"] = "/r"
        self.assertEqual(dict(profile.operations), {"chat_completions": "/v2/chat"})
        self.assertEqual(profile.capabilities, ("chat",))
        self.assertRaises(TypeError, operator.setitem, cast(Any, profile.operations), "x", "/x")
