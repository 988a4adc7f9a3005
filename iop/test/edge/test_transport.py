"""The Edge's node socket protocol over in-memory connections (iosim)."""

from __future__ import annotations

import dataclasses
import struct

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import EdgeConfig, ModelConfig, ModelProviderRef
from iop.edge.events import EventBus
from iop.edge.gateway import Placement
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.tap import EdgeService
from iop.edge.transport import NodeConnection, NodeConnectionFactory
from iop.runtime.events import RuntimeEvent
from iop.test.edge.fixtures import TOKENS, edge_config, provider
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto
from iop.wire.framing import EnvelopeProtocol


class ScriptedNode(EnvelopeProtocol):
    """A node stand-in that records what the Edge sends and notes its disconnect."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[pb.Envelope] = []
        self.lost = False

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self.received.append(envelope)

    def connectionLost(self, reason: object = None) -> None:
        self.lost = True

    def kinds(self) -> list[str | None]:
        return [e.WhichOneof("message") for e in self.received if not e.HasField("heartbeat")]

    # What a managed node announces of its lease keys (None: a legacy node, announcing none).
    lease_support: pb.LeaseSupport | None = None

    def register(self, node_id: str) -> None:
        request = pb.RegisterRequest(token=TOKENS[node_id])
        if self.lease_support is not None:
            request.lease_support.CopyFrom(self.lease_support)
        self.send_envelope(pb.Envelope(register_request=request))

    def ready(self, node_id: str) -> None:
        self.send_envelope(pb.Envelope(node_ready_request=pb.NodeReadyRequest(node_id=node_id)))


class EdgeTransportTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.registry = NodeRegistry(
            self.config,
            lambda node: build_node_payload(self.config, node),
            EventBus(self.clock),
            self.clock,
        )
        self.factory = NodeConnectionFactory(
            self.registry,
            self.clock,
            heartbeat_interval=2.0,
            heartbeat_timeout=5.0,
            register_timeout=10.0,
            max_frame_bytes=64 * 1024,
        )

    def connect(self) -> tuple[ScriptedNode, NodeConnection, iosim.IOPump]:
        return iosim.connectedServerAndClient(
            lambda: self.factory.buildProtocol(None),  # type: ignore[arg-type]
            ScriptedNode,
            clock=self.clock,
        )

    def handshake(
        self, node_id: str = "node-a"
    ) -> tuple[ScriptedNode, NodeConnection, iosim.IOPump]:
        node, edge, pump = self.connect()
        node.register(node_id)
        pump.flush()
        node.ready(node_id)
        pump.flush()
        return node, edge, pump

    def test_register_then_ready(self) -> None:
        node, edge, pump = self.connect()
        node.register("node-a")
        pump.flush()
        self.assertEqual(node.kinds(), ["register_response"])
        response = node.received[-1].register_response
        self.assertTrue(response.accepted)
        self.assertEqual(response.node_id, "node-a")
        self.assertEqual(response.config.node_id, "node-a")
        self.assertEqual(
            (response.heartbeat_interval_ms, response.heartbeat_timeout_ms), (2000, 5000)
        )
        self.assertEqual(self.registry.state("node-a"), "pending")
        node.ready("node-a")
        pump.flush()
        self.assertEqual(node.kinds(), ["register_response", "node_ready_response"])
        self.assertTrue(node.received[-1].node_ready_response.ready)
        self.assertTrue(self.registry.is_ready("node-a"))
        self.assertIs(self.registry.ready_connection("node-a"), edge)

    def test_unknown_token_rejected_and_closed(self) -> None:
        node, _edge, pump = self.connect()
        node.send_envelope(pb.Envelope(register_request=pb.RegisterRequest(token="wrong")))
        pump.flush()
        response = node.received[-1].register_response
        self.assertFalse(response.accepted)
        self.assertEqual(response.reject_code, pb.REGISTER_REJECT_UNKNOWN_TOKEN)
        self.assertTrue(node.lost)

    def test_duplicate_connection_rejected_owner_untouched(self) -> None:
        first, _, _ = self.handshake()
        second, _, pump2 = self.connect()
        second.register("node-a")
        pump2.flush()
        self.assertEqual(
            second.received[-1].register_response.reject_code,
            pb.REGISTER_REJECT_DUPLICATE_CONNECTION,
        )
        self.assertTrue(second.lost)
        self.assertFalse(first.lost)
        self.assertTrue(self.registry.is_ready("node-a"))

    def test_ready_before_register_rejected(self) -> None:
        node, _, pump = self.connect()
        node.ready("node-a")
        pump.flush()
        self.assertFalse(node.received[-1].node_ready_response.ready)
        self.assertTrue(node.lost)
        self.assertFalse(self.registry.is_ready("node-a"))

    def test_clean_close_fences_at_once(self) -> None:
        node, _, pump = self.handshake()
        node.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_heartbeats_flow_and_keep_connection(self) -> None:
        node, _, pump = self.handshake()
        for i in range(1, 6):
            node.send_envelope(pb.Envelope(heartbeat=pb.Heartbeat(sequence=i)))
            self.clock.advance(2)
            pump.flush()
        self.assertTrue(self.registry.is_ready("node-a"))
        beats = [e for e in node.received if e.HasField("heartbeat")]
        self.assertGreaterEqual(len(beats), 4)

    def test_heartbeat_timeout_fences_only_current_generation(self) -> None:
        """A silent ready node is fenced after the wait; a live one is untouched."""
        silent, _, silent_pump = self.handshake("node-a")
        live, _, live_pump = self.handshake("node-b")
        for _ in range(3):
            self.clock.advance(2)
            live.send_envelope(pb.Envelope(heartbeat=pb.Heartbeat(sequence=1)))
            live_pump.flush()
            silent_pump.flush(advanceClock=False)
        self.assertTrue(silent.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertTrue(self.registry.is_ready("node-b"))
        self.assertFalse(live.lost)

    def test_no_register_in_time(self) -> None:
        node, _, pump = self.connect()
        for _ in range(6):
            node.send_envelope(pb.Envelope(heartbeat=pb.Heartbeat(sequence=1)))
            self.clock.advance(2)
            pump.flush(advanceClock=False)
        self.assertTrue(node.lost)

    def test_message_before_ready_closes(self) -> None:
        node, _, pump = self.connect()
        node.register("node-a")
        pump.flush()
        node.send_envelope(pb.Envelope(run_event=pb.RunEvent(run_id="r", type="delta")))
        pump.flush()
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_messages_after_ready_reach_their_handler_until_the_connection_goes(self) -> None:
        seen: list[str] = []
        self.factory.handlers["run_event"] = lambda conn, env: seen.append(env.run_event.run_id)
        node, edge, pump = self.handshake()
        node.send_envelope(pb.Envelope(run_event=pb.RunEvent(run_id="r1", type="delta")))
        pump.flush()
        self.assertEqual(seen, ["r1"])
        edge.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        # Whatever is still delivered to a closed connection goes to the machine: ignored.
        edge.envelope_received(pb.Envelope(run_event=pb.RunEvent(run_id="r2", type="delta")))
        self.assertEqual(seen, ["r1"])

    def test_edge_only_message_from_node_closes(self) -> None:
        node, _, pump = self.handshake()
        node.send_envelope(pb.Envelope(run_request=pb.RunRequest(run_id="r")))
        pump.flush()
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_malformed_frame_closes_one_connection_only(self) -> None:
        bad, _, bad_pump = self.handshake("node-a")
        good, _, good_pump = self.handshake("node-b")
        bad.transport.write(struct.pack("!I", 64 * 1024 + 1))  # type: ignore[union-attr]
        bad_pump.flush()
        good_pump.flush()
        self.assertTrue(bad.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")
        self.assertFalse(good.lost)
        self.assertTrue(self.registry.is_ready("node-b"))

    def test_reconnect_after_close(self) -> None:
        node, _, pump = self.handshake()
        node.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        _again, edge, _ = self.handshake()
        self.assertTrue(self.registry.is_ready("node-a"))
        self.assertIs(self.registry.ready_connection("node-a"), edge)

    def test_register_twice_refused_and_closed(self) -> None:
        node, _, pump = self.handshake()
        node.register("node-a")
        pump.flush()
        self.assertFalse(node.received[-1].register_response.accepted)
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_ready_for_another_node_refused_and_closed(self) -> None:
        node, _, pump = self.connect()
        node.register("node-a")
        pump.flush()
        node.ready("node-b")
        pump.flush()
        response = node.received[-1].node_ready_response
        self.assertFalse(response.ready)
        self.assertIn("not the current owner", response.reason)
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_repeated_ready_is_acknowledged_again(self) -> None:
        node, edge, pump = self.handshake()
        node.ready("node-a")
        pump.flush()
        self.assertEqual(
            node.kinds(), ["register_response", "node_ready_response", "node_ready_response"]
        )
        self.assertTrue(node.received[-1].node_ready_response.ready)
        self.assertIs(self.registry.ready_connection("node-a"), edge)
        self.assertFalse(node.lost)

    def test_nothing_answered_once_refused(self) -> None:
        """What a refused node still sends in the same breath changes nothing."""
        node, _, pump = self.connect()
        node.send_envelope(pb.Envelope(register_request=pb.RegisterRequest(token="wrong")))
        node.ready("node-a")
        pump.flush()
        self.assertEqual(node.kinds(), ["register_response"])
        self.assertTrue(node.lost)
        self.assertEqual(self.registry.state("node-a"), "disconnected")

    def test_heartbeat_stamped_by_the_injected_clock(self) -> None:
        self.clock.advance(1000)
        node, _, pump = self.handshake()
        self.clock.advance(2)
        pump.flush(advanceClock=False)
        [beat] = [e.heartbeat for e in node.received if e.HasField("heartbeat")]
        self.assertEqual(beat.sent_unix_ms, 1_002_000)

    def test_register_timer_cancelled_once_registered(self) -> None:
        node, _, pump = self.handshake()
        node.transport.loseConnection()  # type: ignore[union-attr]
        pump.flush()
        self.assertEqual(self.clock.getDelayedCalls(), [])


def _pool_config(provider_type: str) -> EdgeConfig:
    """Model ``m`` over one provider on each node, capacity 1 each, ``max_queue`` 4."""
    base = edge_config()
    nodes = tuple(
        dataclasses.replace(
            n,
            adapters=(dataclasses.replace(n.adapters[0], type=provider_type),),
            providers=(
                dataclasses.replace(
                    provider(f"{n.id}-p", capacity=1), type=provider_type, max_queue=4
                ),
            ),
        )
        for n in base.nodes
    )
    model = ModelConfig(
        id="m", providers=tuple(ModelProviderRef(f"{n.id}-p", "demo-model") for n in nodes)
    )
    return dataclasses.replace(base, nodes=nodes, models=(model,))


class ReadyPumpsQueueTests(SynchronousTestCase):
    """
    A node becoming ready while pooled requests wait for its model: the ready acknowledgement
    reaches the node before the first request of that generation, and every waiter is served
    exactly once, on both wires.
    """

    def build(self, provider_type: str) -> None:
        self.clock = MemoryReactorClock()
        self.edge = EdgeService(_pool_config(provider_type), self.clock)
        self.served: list[tuple[int, str, str]] = []

    def connect(self, node_id: str) -> tuple[ScriptedNode, iosim.IOPump]:
        node, _edge, pump = iosim.connectedServerAndClient(
            lambda: self.edge.node_factory.buildProtocol(None),  # type: ignore[arg-type]
            ScriptedNode,
            clock=self.clock,
        )
        node.register(node_id)
        pump.flush()
        return node, pump

    def requests(self, node: ScriptedNode) -> list[str]:
        """The run ids of the tunnel/run requests ``node`` received, in order."""
        found: list[str] = []
        for envelope in node.received:
            kind = envelope.WhichOneof("message")
            if kind == "provider_tunnel_request":
                found.append(envelope.provider_tunnel_request.run_id)
            elif kind == "run_request":
                found.append(envelope.run_request.run_id)
        return found

    def submit(self, index: int) -> None:
        gateway = self.edge.gateway

        def send(placement: Placement) -> None:
            # The client surfaces' relay owns the lease: it releases it when the work ends.
            if placement.wire == "tunnel":
                stream = gateway.tunnel(
                    placement, operation="chat_completions", body=b"{}", stream=True
                )
                run_id = stream.run_id
                stream.when_done().addBoth(lambda _: placement.release())
            else:
                handle = gateway.run(placement, input="hi")
                run_id = handle.run_id
                handle.when_done().addBoth(lambda _: placement.release())
            self.served.append((index, placement.node_id, run_id))

        gateway.place("m").addCallback(send)

    def finish(self, node: ScriptedNode, pump: iosim.IOPump, run_id: str, wire: str) -> None:
        if wire == "tunnel":
            for seq, kind in enumerate((pb.RESPONSE_START, pb.END), start=1):
                node.send_envelope(
                    pb.Envelope(
                        provider_tunnel_frame=pb.ProviderTunnelFrame(
                            run_id=run_id, kind=kind, sequence=seq, status_code=200
                        )
                    )
                )
        else:
            node.send_envelope(
                pb.Envelope(run_event=event_to_proto(RuntimeEvent.complete(), run_id, 1))
            )
        pump.flush()

    def in_flight(self) -> int:
        return sum(self.edge.pool.counters(n, f"{n}-p")["in_flight"] for n in ("node-a", "node-b"))

    def check(self, provider_type: str, wire: str) -> None:
        self.build(provider_type)
        busy, busy_pump = self.connect("node-b")
        busy.ready("node-b")
        busy_pump.flush()
        self.submit(0)  # holds node-b's only slot
        for index in (1, 2, 3):
            self.submit(index)
        busy_pump.flush()
        self.assertEqual([(i, n) for i, n, _ in self.served], [(0, "node-b")])

        late, late_pump = self.connect("node-a")
        late.ready("node-a")
        late_pump.flush()
        kinds = late.kinds()
        request = "provider_tunnel_request" if wire == "tunnel" else "run_request"
        self.assertEqual(kinds, ["register_response", "node_ready_response", request])
        self.assertTrue(late.received[1].node_ready_response.ready)
        self.assertFalse(late.lost)

        # Each end on node-a frees its slot for the next waiter, in arrival order.
        for expected in (1, 2, 3):
            index, node_id, run_id = self.served[-1]
            self.assertEqual((index, node_id), (expected, "node-a"))
            self.finish(late, late_pump, run_id, wire)
        self.assertEqual([i for i, _, _ in self.served], [0, 1, 2, 3])
        self.assertEqual(self.requests(late), [r for _, n, r in self.served if n == "node-a"])
        self.assertEqual(len(set(self.requests(late))), 3)
        self.assertEqual(self.requests(busy), [self.served[0][2]])

        self.finish(busy, busy_pump, self.served[0][2], wire)
        self.assertEqual(self.in_flight(), 0)
        self.assertEqual(self.edge.pool.snapshot()["waiters"], [])
        self.assertFalse(late.lost or busy.lost)

    def test_tunnel_provider(self) -> None:
        self.check("openai_compat", "tunnel")

    def test_vllm_provider(self) -> None:
        self.check("vllm", "tunnel")

    def test_run_provider(self) -> None:
        self.check("ollama", "run")
