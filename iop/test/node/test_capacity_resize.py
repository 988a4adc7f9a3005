"""
An adapter's ``max_concurrency`` changed live: the capacity gate resizes (raised: admits at once;
lowered: held slots stay, acquires wait for releases; each slot released exactly once), the
instance and its provider report the new limit, and a refresh push whose only adapter change is
``max_concurrency`` applies without a restart and resizes the session's gates.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters import AdapterRegistry, CapacityGate
from iop.node.adapters.capacity import Slot
from iop.node.adapters.openai_compat import OpenAICompatProvider
from iop.node.refresh import ConfigRefreshHandler, decide
from iop.node.session import NodeSession
from iop.runtime import AdapterContext, AdapterSpec, IResizable
from iop.test.node.fakes import NODE_ID, adapter, payload
from iop.test.node.test_registry import Builds, from_payload
from iop.wire import runtime_pb2 as pb


def resized(base: pb.NodeConfigPayload, **limits: int) -> pb.NodeConfigPayload:
    """``base`` with the named adapters' ``max_concurrency`` changed."""
    copy = pb.NodeConfigPayload()
    copy.CopyFrom(base)
    for message in copy.adapters:
        if message.name in limits:
            message.max_concurrency = limits[message.name]
    return copy


class GateResizeTests(SynchronousTestCase):
    def test_raiseAdmitsAtOnce(self) -> None:
        gate = CapacityGate(2)
        held = [gate.try_acquire(), gate.try_acquire()]
        self.assertIsNone(gate.try_acquire())
        gate.resize(5)
        more = [gate.try_acquire() for _ in range(3)]
        self.assertTrue(all(s is not None for s in held + more))
        self.assertIsNone(gate.try_acquire())
        self.assertEqual((gate.in_use, gate.limit, gate.available), (5, 5, 0))

    def test_lowerKeepsHeldSlots(self) -> None:
        gate = CapacityGate(5)
        held = [gate.try_acquire() for _ in range(5)]
        gate.resize(2)
        # Nothing is cut: the five stay held, the gate reads over its limit, none available.
        self.assertEqual((gate.in_use, gate.limit, gate.available), (5, 2, 0))
        self.assertIsNone(gate.try_acquire())
        for slot in held[:3]:
            assert slot is not None
            slot.release()
            slot.release()  # exactly once, whatever the limit
        # in_use 2 = the new limit: still full.
        self.assertEqual(gate.in_use, 2)
        self.assertIsNone(gate.try_acquire())
        assert held[3] is not None
        held[3].release()
        self.assertIsNotNone(gate.try_acquire())

    def test_resizeBelowOneRefused(self) -> None:
        gate = CapacityGate(2)
        self.assertRaises(ValueError, gate.resize, 0)
        self.assertEqual(gate.limit, 2)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(
        st.integers(1, 6),
        st.lists(
            st.one_of(
                st.tuples(st.just("acquire"), st.just(0)),
                st.tuples(st.just("release"), st.integers(0, 20)),
                st.tuples(st.just("resize"), st.integers(1, 6)),
            ),
            max_size=60,
        ),
    )
    def test_anySequence(self, start: int, steps: list[tuple[str, int]]) -> None:
        """
        Any acquires, releases (twice over, of any slot) and resizes: an acquire succeeds exactly
        when ``in_use`` is below the limit at that moment, ``in_use`` counts the slots held, and
        releasing every slot brings it back to zero.
        """
        gate = CapacityGate(start)
        slots: list[Slot] = []
        for op, arg in steps:
            if op == "acquire":
                below = gate.in_use < gate.limit
                slot = gate.try_acquire()
                self.assertEqual(slot is not None, below)
                if slot is not None:
                    slots.append(slot)
                    self.assertLessEqual(gate.in_use, max(gate.limit, len(slots)))
            elif op == "release" and slots:
                slots[arg % len(slots)].release()
            elif op == "resize":
                gate.resize(arg)
            self.assertEqual(gate.in_use, sum(not s.released for s in slots))
            self.assertGreaterEqual(gate.available, 0)
        for slot in slots:
            slot.release()
        self.assertEqual(gate.in_use, 0)
        self.assertEqual(gate.available, gate.limit)


class InstanceResizeTests(SynchronousTestCase):
    def test_instanceAndProviderReportTheNewLimit(self) -> None:
        """The built-in providers are IResizable: capabilities() follows the gate."""
        spec = AdapterSpec(name="chat", type="openai_compat", base_url="http://u/v1")
        provider = OpenAICompatProvider(spec, AdapterContext(Clock(), http=object()))  # type: ignore[arg-type]
        self.assertTrue(IResizable.providedBy(provider))
        registry = AdapterRegistry.from_specs(
            [AdapterSpec(name="chat", type="openai_compat", base_url="http://u/v1")],
            AdapterContext(Clock(), http=object()),  # type: ignore[arg-type]
            {"openai_compat": lambda s, c: provider},
        )
        instance = registry.get("chat")
        self.assertEqual(
            (instance.max_concurrency, provider.capabilities().max_concurrency), (1, 1)
        )
        instance.resize(4)
        self.assertEqual(instance.gate.limit, 4)
        self.assertEqual(instance.max_concurrency, 4)
        self.assertEqual(provider.capabilities().max_concurrency, 4)
        self.assertEqual(instance.describe()["max_concurrency"], 4)
        instance.resize(0)  # unset on the wire: 1
        self.assertEqual((instance.gate.limit, provider.capabilities().max_concurrency), (1, 1))

    def test_providerWithoutResizeStillResizesTheGate(self) -> None:
        registry = from_payload(payload(adapter("gpu", "vllm", max_concurrency=2)), Builds())
        instance = registry.get("gpu")
        instance.resize(3)
        self.assertEqual(instance.gate.limit, 3)


class DecideMaxConcurrencyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.current = payload(adapter("gpu", "vllm"), adapter("cpu", "ollama"))

    def test_maxConcurrencyOnlyIsLive(self) -> None:
        candidate = resized(self.current, gpu=5)
        candidate.config_revision = 8
        outcome, reason, applied = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_APPLIED)
        self.assertEqual(reason, "adapter 'gpu' max_concurrency 2 → 5, config revision 7 → 8")
        assert applied is not None
        self.assertEqual(applied.adapters[0].max_concurrency, 5)

    def test_withAnotherSettingStillRestart(self) -> None:
        candidate = resized(self.current, gpu=5)
        candidate.adapters[0].base_url = "http://10.0.0.9:8000/v1"
        outcome, reason, applied = decide(self.current, candidate, NODE_ID)
        self.assertEqual(outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertEqual(reason, "restart the node to apply: adapter settings changed ('gpu')")
        self.assertIsNone(applied)

    def test_unsetMeansOne(self) -> None:
        current = resized(self.current, gpu=1)
        outcome, reason, _ = decide(current, resized(current, gpu=0), NODE_ID)
        self.assertEqual((outcome, reason), (pb.REFRESH_APPLIED, "no change"))


class HandlerResizeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[pb.Envelope] = []
        config = payload(adapter("gpu", "vllm", max_concurrency=2), adapter("", "ollama"))
        self.registry = from_payload(config, Builds())
        self.session = NodeSession(NODE_ID, config, self.registry, self.sent.append, Clock())

    def push(self, config: pb.NodeConfigPayload) -> pb.NodeConfigRefreshResponse:
        ConfigRefreshHandler(self.session).request_received(
            pb.Envelope(
                node_config_refresh_request=pb.NodeConfigRefreshRequest(
                    request_id="r1", config=config
                )
            )
        )
        return self.sent.pop().node_config_refresh_response

    def test_pushResizesGatesInPlace(self) -> None:
        gate = self.registry.get("gpu").gate
        held = [gate.try_acquire(), gate.try_acquire()]
        response = self.push(resized(self.session.config, gpu=5))
        self.assertEqual(response.outcome, pb.REFRESH_APPLIED)
        self.assertIs(self.registry.get("gpu").gate, gate)
        self.assertEqual((gate.limit, gate.in_use), (5, 2))
        self.assertIsNotNone(gate.try_acquire())
        self.assertEqual(self.session.config.adapters[0].max_concurrency, 5)
        # Lowered below in_use: nothing released, nothing admitted.
        response = self.push(resized(self.session.config, gpu=1))
        self.assertEqual(response.outcome, pb.REFRESH_APPLIED)
        self.assertEqual((gate.limit, gate.in_use), (1, 3))
        self.assertIsNone(gate.try_acquire())
        for slot in held:
            assert slot is not None
            slot.release()
        self.assertEqual(gate.in_use, 1)

    def test_unnamedAdapterResizedByType(self) -> None:
        candidate = pb.NodeConfigPayload()
        candidate.CopyFrom(self.session.config)
        candidate.adapters[1].max_concurrency = 4
        self.assertEqual(self.push(candidate).outcome, pb.REFRESH_APPLIED)
        self.assertEqual(self.registry.get("ollama").gate.limit, 4)

    def test_restartRequiredResizesNothing(self) -> None:
        candidate = resized(self.session.config, gpu=5)
        candidate.adapters[0].base_url = "http://10.0.0.9:8000/v1"
        self.assertEqual(self.push(candidate).outcome, pb.REFRESH_RESTART_REQUIRED)
        self.assertEqual(self.registry.get("gpu").gate.limit, 2)
