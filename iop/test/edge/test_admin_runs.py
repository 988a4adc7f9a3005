"""The admin run endpoints: submit and stream NDJSON, cancel, validation."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ModelRoute
from iop.edge.admin import AdminApp
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto


class AdminRunTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        config = dataclasses.replace(
            edge_config(), model_routes=(ModelRoute("demo", "fake", "demo-model"),)
        )
        self.registry = NodeRegistry(
            config, lambda n: build_node_payload(config, n), EventBus(self.clock), self.clock
        )
        self.sent: list[pb.Envelope] = []
        self.conn = FakeConnection()
        self.runs = RunDispatcher(
            config, self.registry, self.clock, lambda c, e: self.sent.append(e)
        )
        self.treq: Any = StubTreq(AdminApp(lambda: {}, self.runs).resource())

    def ready(self) -> None:
        self.registry.register(TOKENS["node-a"], self.conn)
        self.registry.ready("node-a", self.conn)

    def post(self, body: object) -> Any:
        return self.treq.post("http://admin/runs", data=json.dumps(body).encode())

    def test_submit_streams_events_as_ndjson(self) -> None:
        self.ready()
        d = self.post({"model": "demo", "input": "hi"})
        [envelope] = self.sent
        run_id = envelope.run_request.run_id
        for seq, event in enumerate(
            [
                RuntimeEvent.start(),
                RuntimeEvent.text("hel"),
                RuntimeEvent.text("lo"),
                RuntimeEvent.complete(Usage(2, 2)),
            ],
            start=1,
        ):
            self.runs.run_event(self.conn, event_to_proto(event, run_id, seq))
        self.treq.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("x-iop-run-id"), [run_id])
        lines = self.successResultOf(response.text()).splitlines()
        events = [json.loads(line) for line in lines]
        self.assertEqual([e["type"] for e in events], ["start", "delta", "delta", "complete"])
        self.assertEqual("".join(e.get("delta", "") for e in events), "hello")
        self.assertEqual(events[-1]["usage"], {"input_tokens": 2, "output_tokens": 2})

    def test_no_node_is_503(self) -> None:
        response = self.successResultOf(self.post({"model": "demo", "input": "hi"}))
        self.assertEqual(response.code, 503)
        body = self.successResultOf(response.json())
        self.assertIn("no node", body["error"]["message"])

    def test_unknown_model_is_404(self) -> None:
        self.ready()
        response = self.successResultOf(self.post({"model": "nope", "input": "hi"}))
        self.assertEqual(response.code, 404)

    def test_bad_bodies_are_400(self) -> None:
        self.ready()
        bodies: list[object] = [
            [],
            {"model": "demo"},
            {"input": "x"},
            {"model": "demo", "input": 3},
            {"model": "demo", "adapter": "a", "target": "t", "input": "x"},
            {"model": "demo", "input": "x", "surprise": 1},
            # The wire carries these as uint32: out of range is the client's error, not a 500.
            {"model": "demo", "input": "x", "max_tokens": 2**40},
            {"model": "demo", "input": "x", "timeout_sec": -1},
        ]
        for body in bodies:
            response = self.successResultOf(self.post(body))
            self.assertEqual(response.code, 400, body)
        self.assertEqual(self.runs.active(), [])
        response = self.successResultOf(self.treq.post("http://admin/runs", data=b"{nope"))
        self.assertEqual(response.code, 400)
        self.assertEqual(self.sent, [])

    def test_delete_cancels(self) -> None:
        self.ready()
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        response = self.successResultOf(self.treq.delete(f"http://admin/runs/{handle.run_id}"))
        self.assertEqual(response.code, 202)
        self.assertTrue(any(e.HasField("cancel_request") for e in self.sent))
        response = self.successResultOf(self.treq.delete("http://admin/runs/nope"))
        self.assertEqual(response.code, 404)
        self.clock.advance(60)


class ManagedAdminRunTests(SynchronousTestCase):
    """
    Managed mode: the admin API sends no normalized run (and no lease-less debug tunnel) to an
    adapter only a leased tunnel may reach; it answers 409 and nothing goes to the node.
    """

    def setUp(self) -> None:
        from iop.config.model import AdapterConfig, EdgeSecurity
        from iop.edge.gateway import EdgeGateway
        from iop.edge.pool import ProviderPool
        from iop.edge.tunnel import TunnelDispatcher
        from iop.security.pki import issue_node, make_ca

        self.clock = Clock()
        base = edge_config()
        node_a, node_b = base.nodes
        local = AdapterConfig(name="local", type="ollama", base_url="http://127.0.0.1:11434")
        node_a = dataclasses.replace(node_a, adapters=(*node_a.adapters, local))
        config = dataclasses.replace(
            base,
            nodes=(node_a, node_b),
            security=EdgeSecurity(mode="managed"),
            model_routes=(
                ModelRoute("demo", "fake", "demo-model"),
                ModelRoute("llama", "local", "llama3"),
            ),
        )
        self.registry = NodeRegistry(
            config, lambda n: build_node_payload(config, n), EventBus(self.clock), self.clock
        )
        self.pool = ProviderPool(config, self.clock)
        self.registry.add_observer(self.pool)
        self.sent: list[pb.Envelope] = []
        send = lambda c, e: self.sent.append(e)  # noqa: E731
        self.runs = RunDispatcher(config, self.registry, self.clock, send)
        tunnels = TunnelDispatcher(self.registry, self.clock, send)
        gateway = EdgeGateway(config, self.pool, self.runs, tunnels)
        self.treq: Any = StubTreq(
            AdminApp(lambda: {}, self.runs, None, tunnels, gateway).resource()
        )
        self.conn = FakeConnection()
        announced = pb.LeaseSupport(recipient_key_id="rk", kem="x25519", issuer_key_id="ik")
        certificate = issue_node(make_ca("admin runs CA"), "node-a")[1]
        self.registry.register(TOKENS["node-a"], self.conn, certificate, announced)
        self.registry.ready("node-a", self.conn)

    def post(self, path: str, body: object) -> Any:
        return self.treq.post(f"http://admin{path}", data=json.dumps(body).encode())

    def assertRefused(self, path: str, body: object) -> str:
        response = self.successResultOf(self.post(path, body))
        self.treq.flush()
        self.assertEqual(response.code, 409, body)
        message: str = self.successResultOf(response.json())["error"]["message"]
        self.assertIn("managed mode", message)
        self.assertEqual(self.sent, [], "nothing reaches the node")
        self.assertEqual(self.runs.active(), [])
        return message

    def test_runs_on_http_providers_are_refused(self) -> None:
        for body in (
            {"adapter": "fake", "target": "demo-model", "input": "hi"},
            {"adapter": "openai_compat", "target": "demo-model", "input": "hi"},  # by type
            {"adapter": "fake", "target": "demo-model", "input": "hi", "node": "node-a"},
            {"model": "demo", "input": "hi"},  # a model route
        ):
            message = self.assertRefused("/runs", body)
            self.assertIn("credential lease", message)
            self.assertIn("'fake' (openai_compat)", message)

    def test_a_pooled_run_is_refused_and_its_slot_released(self) -> None:
        self.assertRefused("/runs", {"model": "pool", "input": "hi"})
        self.assertEqual(self.pool.counters("node-a", "a-chat")["in_flight"], 0)

    def test_debug_tunnels_are_refused(self) -> None:
        message = self.assertRefused(
            "/tunnels", {"adapter": "fake", "target": "demo-model", "operation": "chat_completions"}
        )
        self.assertIn("no credential lease", message)

    def test_runs_on_other_adapters_are_served(self) -> None:
        d = self.post("/runs", {"model": "llama", "input": "hi"})
        [envelope] = self.sent
        self.assertEqual(envelope.run_request.adapter, "local")
        run_id = envelope.run_request.run_id
        self.runs.run_event(self.conn, event_to_proto(RuntimeEvent.complete(), run_id, 1))
        self.treq.flush()
        self.assertEqual(self.successResultOf(d).code, 200)
