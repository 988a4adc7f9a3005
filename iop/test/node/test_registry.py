"""
The adapter registry built from a NodeConfigPayload's adapter specs, and the per-instance
capacity gate.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters import (
    KNOWN_ADAPTER_TYPES,
    AdapterApplyError,
    AdapterRegistry,
    CapacityGate,
    UnknownAdapter,
)
from iop.node.adapters import registry as registryModule
from iop.runtime import AdapterContext, AdapterSpec, IProvider
from iop.runtime.interfaces import AdapterFactory
from iop.test.node.fakes import adapter, payload
from iop.test.node.test_runs import ScriptedProvider
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_specs

CTX = AdapterContext(reactor=Clock(), http=None)


class Builds:
    """A factory table for every known type that builds scripted providers and records calls."""

    def __init__(self, reported: int | None = None) -> None:
        self.reported = reported
        self.built: list[tuple[str, AdapterContext]] = []
        self.providers: dict[str, ScriptedProvider] = {}

    def build(self, spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
        name = spec.name
        self.built.append((name, ctx))
        limit = self.reported if self.reported is not None else (spec.max_concurrency or 1)
        provider = ScriptedProvider(name, spec.type, max_concurrency=limit)
        self.providers[name] = provider
        return provider

    def table(self) -> dict[str, Any]:
        return {t: self.build for t in KNOWN_ADAPTER_TYPES}


def apply(
    config: pb.NodeConfigPayload,
    ctx: AdapterContext,
    factories: Mapping[str, AdapterFactory] | None = None,
) -> AdapterRegistry:
    """What the node does with a payload: its adapters as specs, then the registry."""
    return AdapterRegistry.from_specs(adapter_specs(config), ctx, factories)


def from_payload(config: pb.NodeConfigPayload, builds: Builds | None = None) -> AdapterRegistry:
    return apply(config, CTX, (builds or Builds()).table())


class CapacityGateTests(SynchronousTestCase):
    def test_acquireUpToLimit(self) -> None:
        gate = CapacityGate(2)
        first, second = gate.try_acquire(), gate.try_acquire()
        self.assertIsNotNone(first)
        self.assertIsNotNone(second)
        self.assertEqual((gate.in_use, gate.limit, gate.available), (2, 2, 0))
        self.assertIsNone(gate.try_acquire())

    def test_releaseIsIdempotent(self) -> None:
        gate = CapacityGate(1)
        slot = gate.try_acquire()
        assert slot is not None
        slot.release()
        slot.release()
        self.assertTrue(slot.released)
        self.assertEqual(gate.in_use, 0)
        # The second release did not free a slot that was never taken.
        again = gate.try_acquire()
        self.assertIsNotNone(again)
        self.assertIsNone(gate.try_acquire())

    def test_limitMustBePositive(self) -> None:
        self.assertRaises(ValueError, CapacityGate, 0)
        self.assertRaises(ValueError, CapacityGate, -1)


class AdapterRegistryTests(SynchronousTestCase):
    def test_namedInstances(self) -> None:
        registry = from_payload(
            payload(adapter("gpu-a", "vllm", max_concurrency=4), adapter("local", "ollama"))
        )
        self.assertEqual([i.name for i in registry.instances()], ["gpu-a", "local"])
        gpu = registry.get("gpu-a")
        self.assertEqual((gpu.type, gpu.enabled, gpu.max_concurrency), ("vllm", True, 4))
        self.assertEqual(gpu.gate.limit, 4)
        self.assertIs(registry.get("gpu-a").gate, gpu.gate)
        self.assertIn("local", registry)
        self.assertEqual(len(registry), 2)

    def test_emptyNameIsLegacyTypeName(self) -> None:
        registry = from_payload(payload(adapter("", "openai_compat")))
        self.assertEqual(registry.get("openai_compat").type, "openai_compat")

    def test_disabledKeptAndMarked(self) -> None:
        registry = from_payload(
            payload(adapter("old", "cli", enabled=False), adapter("new", "cli"))
        )
        self.assertFalse(registry.get("old").enabled)
        self.assertTrue(registry.get("new").enabled)

    def test_unsetConcurrencyMeansOne(self) -> None:
        registry = from_payload(payload(adapter("a", "vllm", max_concurrency=0)))
        self.assertEqual(registry.get("a").max_concurrency, 1)
        self.assertEqual(registry.get("a").gate.limit, 1)

    def test_duplicateNames(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            from_payload,
            payload(adapter("x", "vllm"), adapter("x", "ollama")),
        )
        self.assertEqual(str(error), "adapter 'x': duplicate instance name")

    def test_duplicateLegacyAndNamed(self) -> None:
        """An unnamed instance takes its type's name, which may collide with a named one."""
        self.assertRaises(
            AdapterApplyError,
            from_payload,
            payload(adapter("vllm", "vllm"), adapter("", "vllm")),
        )

    def test_unknownType(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            from_payload,
            payload(adapter("x", "y")),
        )
        self.assertEqual(str(error), "adapter 'x': unknown type 'y'")

    def test_missingType(self) -> None:
        error = self.assertRaises(AdapterApplyError, from_payload, payload(adapter("x", "")))
        self.assertEqual(str(error), "adapter 'x': unknown type ''")

    def test_knownTypes(self) -> None:
        self.assertEqual(KNOWN_ADAPTER_TYPES, {"openai_compat", "vllm", "ollama", "cli"})
        registry = from_payload(payload(*(adapter(t, t) for t in sorted(KNOWN_ADAPTER_TYPES))))
        self.assertEqual(len(registry), 4)

    def test_emptyPayload(self) -> None:
        registry = from_payload(pb.NodeConfigPayload(node_id="n"))
        self.assertEqual(registry.instances(), ())
        self.assertEqual(registry.describe(), [])

    def test_getUnknown(self) -> None:
        registry = from_payload(payload(adapter("a", "vllm")))
        error = self.assertRaises(UnknownAdapter, registry.get, "b")
        self.assertIsInstance(error, KeyError)
        self.assertEqual(error.name, "b")
        self.assertEqual(str(error), "unknown adapter 'b'")

    def test_getIsExact(self) -> None:
        """get() never falls back to a legacy type name; resolve() does."""
        registry = from_payload(payload(adapter("gpu", "vllm")))
        self.assertRaises(UnknownAdapter, registry.get, "vllm")
        self.assertEqual(registry.resolve("vllm").name, "gpu")
        self.assertEqual(registry.resolve("gpu").name, "gpu")

    def test_resolveNeedsExactlyOneEnabled(self) -> None:
        ambiguous = from_payload(payload(adapter("a", "vllm"), adapter("b", "vllm")))
        self.assertRaises(UnknownAdapter, ambiguous.resolve, "vllm")
        one_enabled = from_payload(
            payload(adapter("a", "vllm", enabled=False), adapter("b", "vllm"))
        )
        self.assertEqual(one_enabled.resolve("vllm").name, "b")

    def test_specIsACopy(self) -> None:
        source = payload(adapter("a", "vllm"))
        registry = from_payload(source)
        source.adapters[0].base_url = "http://elsewhere"
        source.adapters[0].headers["Authorization"] = "changed"
        spec = registry.get("a").spec
        self.assertEqual(spec.base_url, "http://10.0.0.5:8000/v1")
        self.assertEqual(dict(spec.headers), {"Authorization": "Bearer upstream-secret"})

    def test_specsWithoutAPayload(self) -> None:
        """from_specs takes specs however they were made (an unnamed one is its type)."""
        registry = AdapterRegistry.from_specs(
            [AdapterSpec(name="", type="vllm", max_concurrency=4)], CTX, Builds().table()
        )
        self.assertEqual((registry.get("vllm").type, registry.get("vllm").gate.limit), ("vllm", 4))

    def test_describeShowsNoSecrets(self) -> None:
        registry = from_payload(payload(adapter("a", "vllm", max_concurrency=3)))
        slot = registry.get("a").gate.try_acquire()
        self.assertEqual(
            registry.describe(),
            [{"name": "a", "type": "vllm", "enabled": True, "max_concurrency": 3, "in_use": 1}],
        )
        assert slot is not None
        slot.release()
        for text in (repr(registry.describe()), repr(registry.get("a")), repr(registry)):
            self.assertNotIn("upstream-secret", text)
            self.assertNotIn("10.0.0.5", text)


class ProviderTests(SynchronousTestCase):
    def test_enabledInstancesHoldTheirProvider(self) -> None:
        builds = Builds()
        registry = from_payload(payload(adapter("gpu", "vllm"), adapter("local", "ollama")), builds)
        self.assertIs(registry.get("gpu").provider, builds.providers["gpu"])
        self.assertIs(registry.get("local").provider, builds.providers["local"])
        self.assertEqual([name for name, _ in builds.built], ["gpu", "local"])
        self.assertTrue(all(ctx is CTX for _, ctx in builds.built))
        self.assertNotIn("Scripted", repr(registry.get("gpu")))

    def test_gateSizedByTheProvider(self) -> None:
        """The provider's capabilities().max_concurrency sizes the one gate, not the config."""
        registry = from_payload(payload(adapter("gpu", "vllm", max_concurrency=2)), Builds(5))
        instance = registry.get("gpu")
        self.assertEqual((instance.max_concurrency, instance.gate.limit), (5, 5))

    def test_providerWithoutALimitFallsBackToConfig(self) -> None:
        registry = from_payload(payload(adapter("gpu", "vllm", max_concurrency=3)), Builds(0))
        self.assertEqual(registry.get("gpu").gate.limit, 3)

    def test_disabledIsNotBuilt(self) -> None:
        builds = Builds()
        registry = from_payload(payload(adapter("old", "cli", enabled=False)), builds)
        self.assertIsNone(registry.get("old").provider)
        self.assertEqual(builds.built, [])
        self.assertEqual(registry.get("old").gate.limit, 2)

    def test_namesCheckedBeforeAnyBuild(self) -> None:
        builds = Builds()
        self.assertRaises(
            AdapterApplyError,
            from_payload,
            payload(adapter("a", "vllm"), adapter("b", "nope")),
            builds,
        )
        self.assertEqual(builds.built, [])

    def test_factoryFails(self) -> None:
        def broken(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
            raise ValueError("base_url is required")

        error = self.assertRaises(
            AdapterApplyError,
            apply,
            payload(adapter("gpu", "vllm")),
            CTX,
            {"vllm": broken},
        )
        self.assertEqual(
            str(error), "adapter 'gpu': cannot build 'vllm' adapter: base_url is required"
        )

    def test_factoryReturnsNoProvider(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            apply,
            payload(adapter("gpu", "vllm")),
            CTX,
            {"vllm": lambda spec, ctx: object()},
        )
        self.assertEqual(
            str(error), "adapter 'gpu': the 'vllm' factory did not return an IProvider"
        )

    def test_noFactoryForType(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            apply,
            payload(adapter("gpu", "vllm")),
            CTX,
            {},
        )
        self.assertEqual(str(error), "adapter 'gpu': no factory for type 'vllm'")

    def test_defaultFactoriesImportByModuleName(self) -> None:
        """The default table imports <package>.<type> lazily and calls its build()."""
        package = types.ModuleType("iop_fake_adapters")
        module = types.ModuleType("iop_fake_adapters.vllm")
        builds = Builds()
        module.build = builds.build  # type: ignore[attr-defined]
        for fake in (package, module):
            sys.modules[fake.__name__] = fake
            self.addCleanup(sys.modules.pop, fake.__name__, None)
        self.patch(registryModule, "ADAPTER_PACKAGE", "iop_fake_adapters")
        registry = apply(payload(adapter("gpu", "vllm")), CTX)
        self.assertIs(registry.get("gpu").provider, builds.providers["gpu"])

    def test_missingModuleIsACleanApplyError(self) -> None:
        self.patch(registryModule, "ADAPTER_PACKAGE", "iop_no_such_adapters")
        error = self.assertRaises(AdapterApplyError, apply, payload(adapter("gpu", "vllm")), CTX)
        self.assertTrue(
            str(error).startswith("adapter 'gpu': type 'vllm' is not available on this node"),
            str(error),
        )
