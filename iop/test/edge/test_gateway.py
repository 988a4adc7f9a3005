"""EdgeGateway: pool vs direct placement, wire choice, the frozen placement with its principal;
usage reported on every end by the source that carries the work."""

from __future__ import annotations

import dataclasses

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import AdapterConfig, ModelRoute
from iop.edge.errors import NodeUnavailable, UnknownModel
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway, Placement
from iop.edge.ingress.errors import client_error
from iop.edge.ingress.sources import RunSource, TunnelSource
from iop.edge.payload import build_node_payload
from iop.edge.pool import ProviderPool
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.tunnel import TunnelDispatcher
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto


class GatewayTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        base = edge_config()
        node_a = dataclasses.replace(
            base.nodes[0],
            adapters=(
                *base.nodes[0].adapters,
                AdapterConfig(name="llama", type="ollama", base_url="http://127.0.0.1:1"),
            ),
        )
        self.config = dataclasses.replace(
            base,
            nodes=(node_a, base.nodes[1]),
            model_routes=(ModelRoute("direct", "llama", "llama3.2"),),
        )
        self.pool = ProviderPool(self.config, self.clock)
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
            [self.pool],
        )
        self.sent: list[pb.Envelope] = []
        send = lambda c, e: self.sent.append(e)  # noqa: E731
        self.runs = RunDispatcher(self.config, self.registry, self.clock, send)
        self.tunnels = TunnelDispatcher(self.registry, self.clock, send)
        self.gateway = EdgeGateway(self.config, self.pool, self.runs, self.tunnels)
        self.conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], self.conn)
        self.registry.ready("node-a", self.conn)

    def in_flight(self) -> int:
        return self.pool.counters("node-a", "a-chat")["in_flight"]

    def test_pool_placement_keeps_attribution_and_wire(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool"))
        self.assertEqual(
            (placement.node_id, placement.provider_id, placement.adapter, placement.target),
            ("node-a", "a-chat", "fake", "demo-model"),
        )
        self.assertEqual(placement.wire, "tunnel")
        self.assertEqual(self.in_flight(), 1)
        placement.release()
        placement.release()
        self.assertEqual(self.in_flight(), 0)

    def test_direct_route(self) -> None:
        placement = self.successResultOf(self.gateway.place("direct"))
        self.assertEqual(
            (placement.adapter, placement.provider_type, placement.wire),
            ("llama", "ollama", "run"),
        )
        self.assertIsNone(placement.lease)

    def test_principal_is_given_at_placement_and_the_placement_is_frozen(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool", principal="team-a"))
        self.addCleanup(placement.release)
        self.assertEqual(placement.principal, "team-a")
        direct = self.successResultOf(self.gateway.place("direct", principal="team-b"))
        self.assertEqual(direct.principal, "team-b")
        with self.assertRaises(dataclasses.FrozenInstanceError):
            placement.principal = "someone else"  # type: ignore[misc]

    def test_unknown_model(self) -> None:
        e = self.assertRaises(UnknownModel, self.gateway.place, "nope")
        self.assertEqual((e.model_id, e.message), ("nope", "model 'nope' is not configured"))
        mapped = client_error(e)
        assert mapped is not None
        self.assertEqual((mapped.status, mapped.message), (404, "model 'nope' does not exist"))

    # The source over the gateway's run or tunnel reports how its work ended (to the request's
    # record); the gateway never releases the lease: the one owner does
    # (iop.edge.ingress.relay.with_placement, tested in ingress.test_relay).

    def test_run_end_reports_usage_and_leaves_the_lease(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool"))
        ended: list[tuple[str, Usage | None]] = []
        handle = self.gateway.run(placement, input="hi")
        RunSource(handle, lambda outcome, usage: ended.append((outcome, usage)))
        self.runs.run_event(
            self.conn, event_to_proto(RuntimeEvent.complete(Usage(3, 4)), handle.run_id, 1)
        )
        self.assertEqual(ended, [("complete", Usage(3, 4))])
        self.assertEqual(self.in_flight(), 1)
        placement.release()
        self.assertEqual(self.in_flight(), 0)

    def test_node_gone_mid_run_reports_once(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool"))
        ended: list[tuple[str, Usage | None]] = []
        handle = self.gateway.run(placement, input="hi")
        RunSource(handle, lambda outcome, usage: ended.append((outcome, usage)))
        self.registry.disconnected(self.conn)
        self.assertEqual(self.successResultOf(handle.when_done()).type.value, "error")
        self.assertEqual(ended, [("error", None)])
        assert placement.lease is not None
        self.assertFalse(placement.lease.released)
        placement.release()
        self.assertTrue(placement.lease.released)
        self.assertEqual(self.in_flight(), 0)

    def test_submit_failure_raises(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool"))
        self.addCleanup(placement.release)
        broken = Placement(**{**placement.__dict__, "node_id": "node-b"})
        self.assertRaises(NodeUnavailable, self.gateway.run, broken, input="hi")

    def test_tunnel_end_is_reported(self) -> None:
        placement = self.successResultOf(self.gateway.place("pool"))
        ended: list[tuple[str, Usage | None]] = []
        tunnel = self.gateway.tunnel(
            placement, operation="chat_completions", body=b"{}", stream=True
        )
        TunnelSource(tunnel, lambda outcome, usage: ended.append((outcome, usage)))
        run_id = self.sent[-1].provider_tunnel_request.run_id
        for seq, kind in enumerate((pb.RESPONSE_START, pb.END), start=1):
            self.tunnels.frame(
                self.conn,
                pb.ProviderTunnelFrame(run_id=run_id, kind=kind, sequence=seq, status_code=200),
            )
        self.assertTrue(self.successResultOf(tunnel.when_done()).ok)
        self.assertEqual(ended, [("complete", None)])
