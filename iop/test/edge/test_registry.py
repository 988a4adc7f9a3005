"""The node registry: pending → ready → closed and the generation fence, without sockets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.config.model import NodeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver
from iop.edge.payload import build_node_payload
from iop.edge.registry import (
    REJECT_REASONS,
    NodeRegistry,
    ReadyOutcome,
    RegisterAccepted,
    RegisterRejected,
)
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb
from iop.wire.runtime_pb2 import RegisterRejectCode


@implementer(INodeLifecycleObserver)
class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def node_ready(self, node_id: str, generation: int) -> None:
        self.calls.append(("ready", node_id, generation))

    def node_fenced(self, node_id: str, generation: int) -> None:
        self.calls.append(("fenced", node_id, generation))


class RegistryCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.bus = EventBus(self.clock)
        self.events: list[NodeEvent] = []
        self.bus.subscribe(self.events.append)
        self.observer = Observer()
        self.registry = NodeRegistry(
            self.config,
            lambda node: build_node_payload(self.config, node),
            self.bus,
            self.clock,
            [self.observer],
        )

    def kinds(self) -> list[tuple[NodeEventKind, str]]:
        self.clock.advance(0)
        return [(e.kind, e.node_id) for e in self.events]

    def accept(self, conn: INodeConnection, node_id: str = "node-a") -> RegisterAccepted:
        outcome = self.registry.register(TOKENS[node_id], conn)
        assert isinstance(outcome, RegisterAccepted), outcome
        return outcome


class RegistryTests(RegistryCase):
    def test_register_claims_pending_with_payload(self) -> None:
        conn = FakeConnection()
        outcome = self.accept(conn)
        self.assertEqual(outcome.node_id, "node-a")
        self.assertEqual(outcome.payload.node_id, "node-a")
        self.assertEqual([a.name for a in outcome.payload.adapters], ["fake"])
        self.assertEqual(self.registry.state("node-a"), "pending")
        self.assertFalse(self.registry.is_ready("node-a"))
        self.assertIsNone(self.registry.ready_connection("node-a"))
        self.assertEqual(self.observer.calls, [])
        self.assertEqual(self.kinds(), [(NodeEventKind.REGISTERED, "node-a")])

    def test_unknown_token(self) -> None:
        outcome = self.registry.register("nope", FakeConnection())
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_UNKNOWN_TOKEN)
        self.assertEqual(outcome.node_id, "")
        self.assertNotIn("nope", outcome.reason)
        self.assertEqual(self.kinds(), [(NodeEventKind.REJECTED, "")])

    def test_duplicate_connection_rejected_while_pending_or_ready(self) -> None:
        first = FakeConnection()
        self.accept(first)
        outcome = self.registry.register(TOKENS["node-a"], FakeConnection())
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_DUPLICATE_CONNECTION)
        self.assertTrue(self.registry.ready("node-a", first).ready)
        outcome = self.registry.register(TOKENS["node-a"], FakeConnection())
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_DUPLICATE_CONNECTION)
        self.assertIs(self.registry.ready_connection("node-a"), first)

    def test_same_connection_registering_twice(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        outcome = self.registry.register(TOKENS["node-b"], conn)
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_OTHER)
        self.assertEqual(self.registry.state("node-b"), "disconnected")

    def test_payload_failure(self) -> None:
        def broken(node: NodeConfig) -> pb.NodeConfigPayload:
            raise RuntimeError("boom")

        registry = NodeRegistry(self.config, broken, self.bus, self.clock)
        outcome = registry.register(TOKENS["node-a"], FakeConnection())
        assert isinstance(outcome, RegisterRejected)
        self.assertEqual(outcome.code, RegisterRejectCode.REGISTER_REJECT_CONFIG_PAYLOAD)
        self.assertEqual(outcome.node_id, "node-a")
        self.assertEqual(registry.state("node-a"), "disconnected")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_ready_before_register(self) -> None:
        outcome = self.registry.ready("node-a", FakeConnection())
        self.assertFalse(outcome.ready)
        self.assertIn("not registered", outcome.reason)
        self.assertEqual(self.observer.calls, [])

    def test_ready_after_register(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        self.assertTrue(self.registry.ready("node-a", conn).ready)
        self.assertTrue(self.registry.is_ready("node-a"))
        self.assertIs(self.registry.ready_connection("node-a"), conn)
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])
        self.assertEqual(
            self.kinds(),
            [(NodeEventKind.REGISTERED, "node-a"), (NodeEventKind.CONNECTED, "node-a")],
        )

    def test_ready_is_acknowledged_before_any_observer_hears_of_it(self) -> None:
        """The one ordering: decide, acknowledge, then mark ready and tell the observers."""
        conn = FakeConnection()
        self.accept(conn)
        seen: list[tuple[bool, bool, int]] = []

        def acknowledge(outcome: ReadyOutcome) -> None:
            seen.append((outcome.ready, self.registry.is_ready("node-a"), len(self.observer.calls)))

        self.assertTrue(self.registry.ready("node-a", conn, acknowledge).ready)
        self.assertEqual(seen, [(True, False, 0)])
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])
        # A repeated ready is acknowledged again; the observers are not told twice.
        self.registry.ready("node-a", conn, acknowledge)
        self.assertEqual(seen[-1], (True, True, 1))
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])

    def test_refused_ready_is_acknowledged_as_refused(self) -> None:
        acks: list[ReadyOutcome] = []
        outcome = self.registry.ready("node-a", FakeConnection(), acks.append)
        self.assertEqual(acks, [outcome])
        self.assertFalse(outcome.ready)
        self.assertEqual(self.observer.calls, [])

    def test_failed_acknowledgement_leaves_node_pending(self) -> None:
        conn = FakeConnection()
        self.accept(conn)

        def broken(outcome: ReadyOutcome) -> None:
            raise ConnectionError("socket gone")

        self.assertRaises(ConnectionError, self.registry.ready, "node-a", conn, broken)
        self.assertEqual(self.registry.state("node-a"), "pending")
        self.assertEqual(self.observer.calls, [])

    def test_connection_lost_while_acknowledging_makes_nothing_ready(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        outcome = self.registry.ready(
            "node-a", conn, lambda outcome: self.registry.disconnected(conn)
        )
        self.assertFalse(outcome.ready)
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertEqual(self.observer.calls, [])

    def test_duplicate_ready_is_idempotent(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        self.assertTrue(self.registry.ready("node-a", conn).ready)
        self.assertTrue(self.registry.ready("node-a", conn).ready)
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])
        self.assertEqual([k for k, _ in self.kinds()].count(NodeEventKind.CONNECTED), 1)

    def test_ready_for_another_nodes_id(self) -> None:
        a, b = FakeConnection(), FakeConnection()
        self.accept(a, "node-a")
        self.accept(b, "node-b")
        outcome = self.registry.ready("node-b", a)
        self.assertFalse(outcome.ready)
        self.assertFalse(self.registry.is_ready("node-b"))

    def test_stale_ready_from_superseded_connection(self) -> None:
        old, new = FakeConnection(), FakeConnection()
        self.accept(old)
        self.registry.disconnected(old)
        self.accept(new)
        outcome = self.registry.ready("node-a", old)
        self.assertFalse(outcome.ready)
        self.assertFalse(self.registry.is_ready("node-a"))
        self.assertEqual(self.observer.calls, [])
        self.assertTrue(self.registry.ready("node-a", new).ready)
        self.assertEqual(self.observer.calls, [("ready", "node-a", 2)])

    def test_ready_owner_disconnect_fences_its_generation_once(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        self.registry.ready("node-a", conn)
        self.registry.disconnected(conn, "heartbeat timeout")
        self.registry.disconnected(conn, "again")
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1), ("fenced", "node-a", 1)])
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.clock.advance(0)
        self.assertEqual(
            [(e.kind, e.reason) for e in self.events][-1],
            (NodeEventKind.DISCONNECTED, "heartbeat timeout"),
        )

    def test_stale_disconnect_changes_nothing(self) -> None:
        """A rejected duplicate's close leaves the ready owner alone."""
        owner, dup = FakeConnection(), FakeConnection()
        self.accept(owner)
        self.registry.ready("node-a", owner)
        self.registry.register(TOKENS["node-a"], dup)
        self.registry.disconnected(dup)
        self.registry.disconnected(FakeConnection())
        self.assertTrue(self.registry.is_ready("node-a"))
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1)])

    def test_pending_disconnect_is_not_a_fence(self) -> None:
        conn = FakeConnection()
        self.accept(conn)
        self.registry.disconnected(conn)
        self.assertEqual(self.observer.calls, [])
        self.assertNotIn(NodeEventKind.DISCONNECTED, [k for k, _ in self.kinds()])
        self.accept(FakeConnection())

    def test_reconnect_gets_new_generation(self) -> None:
        first, second = FakeConnection(), FakeConnection()
        self.accept(first)
        self.registry.ready("node-a", first)
        self.registry.disconnected(first)
        self.accept(second)
        self.registry.ready("node-a", second)
        self.assertEqual(
            self.observer.calls,
            [("ready", "node-a", 1), ("fenced", "node-a", 1), ("ready", "node-a", 2)],
        )


class RegistryStatsTests(RegistryCase):
    """The registry's counters (:meth:`NodeRegistry.stats`) for known sequences."""

    def test_every_label_is_there_at_zero(self) -> None:
        stats = self.registry.stats()
        zero = {"node-a": 0, "node-b": 0}
        self.assertEqual((stats.registrations, stats.reconnects, stats.fences), (zero, zero, zero))
        self.assertEqual(stats.rejections, dict.fromkeys(REJECT_REASONS, 0))
        self.assertEqual(
            set(REJECT_REASONS),
            {
                "unknown_token",
                "duplicate_connection",
                "config_payload",
                "workload_identity",
                "lease_support",
                "other",
                "ready_rejected",
            },
        )

    def test_registrations_reconnects_and_fences(self) -> None:
        first, second, third = FakeConnection(), FakeConnection(), FakeConnection()
        self.accept(first)
        self.registry.ready("node-a", first)
        self.registry.disconnected(first, "heartbeat timeout")  # a fence
        self.accept(second)  # a reconnect
        self.registry.disconnected(second)  # pending: no fence
        self.accept(third)  # another reconnect
        self.registry.ready("node-a", third)
        self.registry.ready("node-a", third)  # a repeated ready changes nothing
        self.registry.disconnected(third)
        self.registry.disconnected(third)  # once only
        b = FakeConnection()
        self.accept(b, "node-b")
        self.registry.ready("node-b", b)
        stats = self.registry.stats()
        self.assertEqual(stats.registrations, {"node-a": 3, "node-b": 1})
        self.assertEqual(stats.reconnects, {"node-a": 2, "node-b": 0})
        self.assertEqual(stats.fences, {"node-a": 2, "node-b": 0})
        self.assertEqual(sum(stats.rejections.values()), 0)

    def test_rejections_by_reason(self) -> None:
        owner = FakeConnection()
        self.registry.register("nope", FakeConnection())
        self.registry.register("also-nope", FakeConnection())
        self.accept(owner)
        self.registry.register(TOKENS["node-a"], FakeConnection())  # duplicate
        self.registry.register(TOKENS["node-b"], owner)  # this connection already registered
        self.registry.ready("node-b", FakeConnection())  # never registered
        stats = self.registry.stats()
        self.assertEqual(
            {r: n for r, n in stats.rejections.items() if n},
            {"unknown_token": 2, "duplicate_connection": 1, "other": 1, "ready_rejected": 1},
        )
        self.assertEqual(stats.registrations, {"node-a": 1, "node-b": 0})

    def test_a_payload_failure_is_a_config_payload_rejection(self) -> None:
        def broken(node: NodeConfig) -> pb.NodeConfigPayload:
            raise ValueError("no")

        registry = NodeRegistry(self.config, broken, self.bus, self.clock)
        registry.register(TOKENS["node-a"], FakeConnection())
        self.assertEqual(registry.stats().rejections["config_payload"], 1)
        self.assertEqual(registry.stats().registrations["node-a"], 0)
        self.flushLoggedErrors(ValueError)


# An operation on the registry: register (a node's token or a bad one), ready, disconnect, each
# on one of a few connections.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["register", "register", "ready", "ready", "disconnect"]),
        st.sampled_from(["node-a", "node-b", "bad"]),
        st.integers(min_value=0, max_value=3),
    ),
    max_size=40,
)


class RegistryStatsPropertyTests(RegistryCase):
    @settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @given(ops=_OPS)
    def test_counters_follow_what_callers_saw(self, ops: list[tuple[str, str, int]]) -> None:
        self.setUp()
        connections = [FakeConnection() for _ in range(4)]
        accepted = {"node-a": 0, "node-b": 0}
        refused = 0
        for op, node_id, index in ops:
            conn = connections[index]
            if op == "register":
                outcome = self.registry.register(TOKENS.get(node_id, "bad-token"), conn)
                if isinstance(outcome, RegisterAccepted):
                    accepted[outcome.node_id] += 1
                else:
                    refused += 1
            elif op == "ready":
                if not self.registry.ready(node_id if node_id in TOKENS else "node-a", conn).ready:
                    refused += 1
            else:
                self.registry.disconnected(conn)
                connections[index] = FakeConnection()  # a closed connection never comes back
            stats = self.registry.stats()
            fenced = {n: 0 for n in accepted}
            for kind, n, _ in self.observer.calls:
                fenced[n] += kind == "fenced"
            self.assertEqual(stats.registrations, accepted)
            self.assertEqual(stats.reconnects, {n: max(c - 1, 0) for n, c in accepted.items()})
            self.assertEqual(stats.fences, fenced)
            self.assertEqual(sum(stats.rejections.values()), refused)
