"""The adapter registry built from NodeConfigPayload, and the per-instance capacity gate."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters import (
    KNOWN_ADAPTER_TYPES,
    AdapterApplyError,
    AdapterRegistry,
    CapacityGate,
    UnknownAdapter,
)
from iop.test.node.fakes import adapter, payload


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
        registry = AdapterRegistry.from_payload(
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
        registry = AdapterRegistry.from_payload(payload(adapter("", "openai_compat")))
        self.assertEqual(registry.get("openai_compat").type, "openai_compat")

    def test_disabledKeptAndMarked(self) -> None:
        registry = AdapterRegistry.from_payload(
            payload(adapter("old", "cli", enabled=False), adapter("new", "cli"))
        )
        self.assertFalse(registry.get("old").enabled)
        self.assertTrue(registry.get("new").enabled)

    def test_unsetConcurrencyMeansOne(self) -> None:
        registry = AdapterRegistry.from_payload(payload(adapter("a", "vllm", max_concurrency=0)))
        self.assertEqual(registry.get("a").max_concurrency, 1)
        self.assertEqual(registry.get("a").gate.limit, 1)

    def test_duplicateNames(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            AdapterRegistry.from_payload,
            payload(adapter("x", "vllm"), adapter("x", "ollama")),
        )
        self.assertEqual(str(error), "adapter 'x': duplicate instance name")

    def test_duplicateLegacyAndNamed(self) -> None:
        """An unnamed instance takes its type's name, which may collide with a named one."""
        self.assertRaises(
            AdapterApplyError,
            AdapterRegistry.from_payload,
            payload(adapter("vllm", "vllm"), adapter("", "vllm")),
        )

    def test_unknownType(self) -> None:
        error = self.assertRaises(
            AdapterApplyError,
            AdapterRegistry.from_payload,
            payload(adapter("x", "y")),
        )
        self.assertEqual(str(error), "adapter 'x': unknown type 'y'")

    def test_missingType(self) -> None:
        error = self.assertRaises(
            AdapterApplyError, AdapterRegistry.from_payload, payload(adapter("x", ""))
        )
        self.assertEqual(str(error), "adapter 'x': unknown type ''")

    def test_knownTypes(self) -> None:
        self.assertEqual(KNOWN_ADAPTER_TYPES, {"openai_compat", "vllm", "ollama", "cli"})
        registry = AdapterRegistry.from_payload(
            payload(*(adapter(t, t) for t in sorted(KNOWN_ADAPTER_TYPES)))
        )
        self.assertEqual(len(registry), 4)

    def test_emptyPayload(self) -> None:
        from iop.wire import runtime_pb2 as pb

        registry = AdapterRegistry.from_payload(pb.NodeConfigPayload(node_id="n"))
        self.assertEqual(registry.instances(), ())
        self.assertEqual(registry.describe(), [])

    def test_getUnknown(self) -> None:
        registry = AdapterRegistry.from_payload(payload(adapter("a", "vllm")))
        error = self.assertRaises(UnknownAdapter, registry.get, "b")
        self.assertIsInstance(error, KeyError)
        self.assertEqual(error.name, "b")
        self.assertEqual(str(error), "unknown adapter 'b'")

    def test_getIsExact(self) -> None:
        """get() never falls back to a legacy type name; resolve() does."""
        registry = AdapterRegistry.from_payload(payload(adapter("gpu", "vllm")))
        self.assertRaises(UnknownAdapter, registry.get, "vllm")
        self.assertEqual(registry.resolve("vllm").name, "gpu")
        self.assertEqual(registry.resolve("gpu").name, "gpu")

    def test_resolveNeedsExactlyOneEnabled(self) -> None:
        ambiguous = AdapterRegistry.from_payload(
            payload(adapter("a", "vllm"), adapter("b", "vllm"))
        )
        self.assertRaises(UnknownAdapter, ambiguous.resolve, "vllm")
        oneEnabled = AdapterRegistry.from_payload(
            payload(adapter("a", "vllm", enabled=False), adapter("b", "vllm"))
        )
        self.assertEqual(oneEnabled.resolve("vllm").name, "b")

    def test_configIsACopy(self) -> None:
        source = payload(adapter("a", "vllm"))
        registry = AdapterRegistry.from_payload(source)
        source.adapters[0].base_url = "http://elsewhere"
        self.assertEqual(registry.get("a").config.base_url, "http://10.0.0.5:8000/v1")

    def test_describeShowsNoSecrets(self) -> None:
        registry = AdapterRegistry.from_payload(payload(adapter("a", "vllm", max_concurrency=3)))
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
