"""EdgeGateway: pool vs direct dispatch, wire choice, lease release on every end."""

from __future__ import annotations

import dataclasses

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import AdapterConfig, ModelRoute
from iop.edge.dispatch import NodeUnavailable, RunDispatcher
from iop.edge.events import EventBus
from iop.edge.gateway import Dispatch, EdgeGateway
from iop.edge.payload import build_node_payload
from iop.edge.pool import ProviderPool, UnknownModel
from iop.edge.registry import NodeRegistry
from iop.edge.tunnel import TunnelDispatcher
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto


class GatewayTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        base = edge_config()
        nodeA = dataclasses.replace(
            base.nodes[0],
            adapters=(
                *base.nodes[0].adapters,
                AdapterConfig(name="llama", type="ollama", base_url="http://127.0.0.1:1"),
            ),
        )
        self.config = dataclasses.replace(
            base,
            nodes=(nodeA, base.nodes[1]),
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
        self.finished: list[tuple[str, Usage | None, str]] = []
        self.gateway = EdgeGateway(
            self.config,
            self.pool,
            self.runs,
            self.tunnels,
            onFinished=lambda d, u, o: self.finished.append((d.model, u, o)),
        )
        self.conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], self.conn)
        self.registry.ready("node-a", self.conn)

    def in_flight(self) -> int:
        return self.pool.counters("node-a", "a-chat")["in_flight"]

    def test_pool_dispatch_keeps_attribution_and_wire(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("pool"))
        self.assertEqual(
            (dispatch.node_id, dispatch.provider_id, dispatch.adapter, dispatch.target),
            ("node-a", "a-chat", "fake", "demo-model"),
        )
        self.assertEqual(dispatch.wire, "tunnel")
        self.assertEqual(self.in_flight(), 1)
        dispatch.release()
        dispatch.release()
        self.assertEqual(self.in_flight(), 0)

    def test_direct_route(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("direct"))
        self.assertEqual(
            (dispatch.adapter, dispatch.provider_type, dispatch.wire), ("llama", "ollama", "run")
        )
        self.assertIsNone(dispatch.lease)

    def test_unknown_model(self) -> None:
        self.assertRaises(UnknownModel, self.gateway.dispatch, "nope")

    def test_run_end_releases_lease_and_reports_usage(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("pool"))
        handle = self.gateway.run(dispatch, input="hi")
        self.assertEqual(self.in_flight(), 1)
        self.runs.runEvent(
            self.conn, event_to_proto(RuntimeEvent.complete(Usage(3, 4)), handle.run_id, 1)
        )
        self.assertEqual(self.in_flight(), 0)
        self.assertEqual(self.finished, [("pool", Usage(3, 4), "complete")])

    def test_node_gone_mid_run_releases_once(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("pool"))
        handle = self.gateway.run(dispatch, input="hi")
        self.registry.disconnected(self.conn)
        self.assertEqual(self.successResultOf(handle.whenDone()).type.value, "error")
        self.assertEqual(self.in_flight(), 0)
        self.assertTrue(dispatch.lease is not None and dispatch.lease.released)

    def test_submit_failure_releases(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("pool"))
        broken = Dispatch(**{**dispatch.__dict__, "node_id": "node-b"})
        self.assertRaises(NodeUnavailable, self.gateway.run, broken, input="hi")
        self.assertEqual(self.in_flight(), 0)

    def test_tunnel_end_releases(self) -> None:
        dispatch = self.successResultOf(self.gateway.dispatch("pool"))
        tunnel = self.gateway.tunnel(
            dispatch, operation="chat_completions", body=b"{}", stream=True
        )
        run_id = self.sent[-1].provider_tunnel_request.run_id
        for seq, kind in enumerate((pb.RESPONSE_START, pb.END), start=1):
            self.tunnels.frame(
                self.conn,
                pb.ProviderTunnelFrame(run_id=run_id, kind=kind, sequence=seq, status_code=200),
            )
        self.assertTrue(self.successResultOf(tunnel.whenDone()).ok)
        self.assertEqual(self.in_flight(), 0)
        self.assertEqual([o for _, _, o in self.finished], ["complete"])
