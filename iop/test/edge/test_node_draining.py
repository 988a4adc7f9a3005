"""
The Edge's side of drains: a ready node's ``NodeDraining`` through the registry (state, since,
the drain observers, the answer) and the Edge's own drain on its readiness route and ``/status``.
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.edge.admin import AdminApp
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.interfaces import INodeDrainObserver, INodeLifecycleObserver
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry, RegisterAccepted
from iop.edge.status import snapshot
from iop.edge.transport import NodeConnectionFactory
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb


@implementer(INodeLifecycleObserver, INodeDrainObserver)
class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def node_ready(self, node_id: str, generation: int) -> None:
        self.calls.append(("ready", node_id, generation))

    def node_fenced(self, node_id: str, generation: int) -> None:
        self.calls.append(("fenced", node_id, generation))

    def node_draining(self, node_id: str, generation: int) -> None:
        self.calls.append(("draining", node_id, generation))


class RegistryDrainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(100)
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
        self.factory = NodeConnectionFactory(self.registry, self.clock)

    def ready(self, conn: FakeConnection, node_id: str = "node-a") -> None:
        outcome = self.registry.register(TOKENS[node_id], conn)  # type: ignore[arg-type]
        assert isinstance(outcome, RegisterAccepted)
        self.assertTrue(self.registry.ready(node_id, conn).ready)  # type: ignore[arg-type]

    def drain(self, conn: FakeConnection) -> None:
        self.factory.handlers["node_draining"](
            conn,  # type: ignore[arg-type]
            pb.Envelope(node_draining=pb.NodeDraining(deadline_unix_ms=1)),
        )

    def test_ready_node_drains_and_is_answered(self) -> None:
        conn = FakeConnection()
        self.ready(conn)
        self.clock.advance(5)
        self.drain(conn)
        self.assertEqual(self.registry.state("node-a"), "draining")
        self.assertEqual(self.registry.draining_since("node-a"), 105)
        self.assertTrue(self.registry.is_ready("node-a"))  # its work in flight runs on
        self.assertEqual(self.observer.calls, [("ready", "node-a", 1), ("draining", "node-a", 1)])
        self.assertEqual(
            [e.WhichOneof("message") for e in conn.sent], ["node_draining"]
        )  # the answer
        self.clock.advance(0)
        self.assertIn(NodeEventKind.DRAINING, [e.kind for e in self.events])
        # Once only.
        self.drain(conn)
        self.assertEqual(len(self.observer.calls), 2)
        # Its disconnect fences it as usual and clears the drain.
        self.registry.disconnected(conn)  # type: ignore[arg-type]
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertIsNone(self.registry.draining_since("node-a"))
        self.assertEqual(self.observer.calls[-1], ("fenced", "node-a", 1))

    def test_not_ready_or_stale_changes_nothing(self) -> None:
        pending = FakeConnection()
        self.registry.register(TOKENS["node-a"], pending)  # type: ignore[arg-type]
        self.drain(pending)
        self.assertEqual(self.registry.state("node-a"), "pending")
        self.assertEqual(pending.sent, [])
        self.drain(FakeConnection())
        self.assertEqual(self.observer.calls, [])

    def test_status_shows_the_drain(self) -> None:
        conn = FakeConnection()
        self.ready(conn)
        self.drain(conn)
        status = snapshot(self.config, self.registry, draining=None)
        [node] = [n for n in status["nodes"] if n["id"] == "node-a"]
        self.assertEqual(node["state"], "draining")
        self.assertEqual(node["draining_since_unix_ms"], 100_000)
        self.assertTrue(node["connected"])
        self.assertFalse(status["edge"]["draining"])

    def test_register_response_says_drains_are_understood(self) -> None:
        from twisted.internet.testing import StringTransport

        from iop.wire.framing import EnvelopeProtocol

        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        register = pb.Envelope(register_request=pb.RegisterRequest(token=TOKENS["node-a"]))
        data = register.SerializeToString()
        protocol.dataReceived(len(data).to_bytes(4, "big") + data)
        seen: list[pb.Envelope] = []

        class Reader(EnvelopeProtocol):
            def envelope_received(self, envelope: pb.Envelope) -> None:
                seen.append(envelope)

        reader = Reader()
        reader.makeConnection(StringTransport())
        reader.dataReceived(transport.value())
        [response] = [e for e in seen if e.WhichOneof("message") == "register_response"]
        self.assertTrue(response.register_response.accepted)
        self.assertTrue(response.register_response.node_draining_supported)
        protocol.connectionLost()


class ReadinessTests(SynchronousTestCase):
    def get(self, status: dict[str, Any]) -> tuple[int, Any]:
        treq: Any = StubTreq(AdminApp(lambda: status).resource())
        response = self.successResultOf(treq.get("http://admin/readyz"))
        return response.code, json.loads(self.successResultOf(response.content()))

    def test_ready(self) -> None:
        self.assertEqual(self.get({"edge": {"draining": False}}), (200, {"status": "ready"}))

    def test_draining(self) -> None:
        self.assertEqual(self.get({"edge": {"draining": True}}), (503, {"status": "draining"}))

    def test_status_edge_draining(self) -> None:
        config = edge_config()
        registry = NodeRegistry(
            config, lambda node: build_node_payload(config, node), EventBus(Clock()), Clock()
        )
        edge = snapshot(config, registry, draining=12.5)["edge"]
        self.assertEqual((edge["draining"], edge["draining_since_unix_ms"]), (True, 12500))
