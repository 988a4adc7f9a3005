"""The Edge's direct run path: node choice, relay, cancel, and fencing mid-run."""

from __future__ import annotations

import dataclasses

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ModelRoute
from iop.edge.errors import NodeUnavailable, NoRoute
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RUN_TERMINALS, RunDispatcher
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.test.node.fakes import capture_events
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto

Conn = FakeConnection


class DispatchCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = dataclasses.replace(
            edge_config(),
            model_routes=(
                ModelRoute("m-any", "fake", "demo-model"),
                ModelRoute("m-b", "fake", "demo-model", node_id="node-b"),
            ),
        )
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
        )

        self.runs = RunDispatcher(self.config, self.registry, self.clock, cancel_grace=10)
        self.a = self.connect("node-a")

    def connect(self, node_id: str, fail: bool = False) -> Conn:
        conn = Conn(fail)
        self.registry.register(TOKENS[node_id], conn)
        self.registry.ready(node_id, conn)
        return conn

    def event(self, run_id: str, seq: int, event: RuntimeEvent) -> None:
        self.runs.run_event(self.a, event_to_proto(event, run_id, seq))

    def collect(self, handle: object) -> list[RuntimeEvent]:
        seen: list[RuntimeEvent] = []
        handle.subscribe(seen.append)  # type: ignore[attr-defined]
        return seen


class DispatchTests(DispatchCase):
    def test_single_node_fallback_sends_run_request(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="demo-model", input="hi")
        self.assertEqual(handle.node_id, "node-a")
        [envelope] = self.a.sent
        request = envelope.run_request
        self.assertEqual(
            (request.run_id, request.adapter, request.target, request.input),
            (handle.run_id, "fake", "demo-model", "hi"),
        )

    def test_a_request_the_wire_cannot_carry_leaves_no_run(self) -> None:
        self.assertRaises(
            ValueError,
            self.runs.submit_run,
            adapter="fake",
            target="demo-model",
            input="hi",
            max_tokens=2**40,
        )
        self.assertEqual((self.runs.active(), self.a.sent), ([], []))

    def test_fallback_needs_exactly_one_ready_node(self) -> None:
        self.connect("node-b")
        self.assertRaises(NoRoute, self.runs.submit_run, adapter="fake", target="t", input="x")
        handle = self.runs.submit_run(adapter="fake", target="t", input="x", node_id="node-b")
        self.assertEqual(handle.node_id, "node-b")

    def test_no_ready_node(self) -> None:
        self.registry.disconnected(self.a)
        self.assertRaises(
            NodeUnavailable, self.runs.submit_run, adapter="fake", target="t", input="x"
        )

    def test_pending_node_is_not_dispatchable(self) -> None:
        self.registry.register(TOKENS["node-b"], Conn())
        self.assertRaises(
            NodeUnavailable,
            self.runs.submit_run,
            adapter="fake",
            target="t",
            input="x",
            node_id="node-b",
        )

    def test_unknown_node(self) -> None:
        self.assertRaises(
            NoRoute, self.runs.submit_run, adapter="f", target="t", input="x", node_id="zz"
        )

    def test_model_routes(self) -> None:
        handle = self.runs.submit_model_run("m-any", "hello")
        self.assertEqual(
            (handle.adapter, handle.target, handle.node_id), ("fake", "demo-model", "node-a")
        )
        self.assertRaises(NodeUnavailable, self.runs.submit_model_run, "m-b", "hello")
        self.assertRaises(NoRoute, self.runs.submit_model_run, "nope", "hello")

    def test_events_relayed_in_order_until_terminal(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        seen = self.collect(handle)
        done = handle.when_done()
        self.event(handle.run_id, 1, RuntimeEvent.start())
        self.event(handle.run_id, 2, RuntimeEvent.text("he"))
        self.event(handle.run_id, 2, RuntimeEvent.text("dup"))
        self.event(handle.run_id, 3, RuntimeEvent.text("llo"))
        self.assertNoResult(done)
        self.event(handle.run_id, 4, RuntimeEvent.complete(Usage(3, 2, cached_input_tokens=1)))
        self.event(handle.run_id, 5, RuntimeEvent.text("late"))
        self.assertEqual(
            [(e.type, e.delta) for e in seen],
            [
                (EventType.START, ""),
                (EventType.DELTA, "he"),
                (EventType.DELTA, "llo"),
                (EventType.COMPLETE, ""),
            ],
        )
        terminal = self.successResultOf(done)
        self.assertEqual(terminal.usage, Usage(3, 2, None, 1))
        self.assertEqual(self.runs.active(), [])
        # A late subscriber still sees the whole run.
        self.assertEqual(len(self.collect(handle)), 4)

    def test_event_from_another_connection_ignored(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        seen = self.collect(handle)
        self.runs.run_event(Conn(), event_to_proto(RuntimeEvent.text("spoof"), handle.run_id, 1))
        self.assertEqual(seen, [])

    def test_disconnect_mid_run_ends_with_error(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        self.event(handle.run_id, 1, RuntimeEvent.start())
        self.registry.disconnected(self.a)
        terminal = self.successResultOf(handle.when_done())
        self.assertEqual(terminal.type, EventType.ERROR)
        self.assertIn("disconnected", terminal.error)
        self.assertEqual(self.runs.active(), [])

    def test_stale_generation_fence_leaves_new_runs(self) -> None:
        old = self.runs.submit_run(adapter="fake", target="t", input="x")
        self.registry.disconnected(self.a)
        self.a = self.connect("node-a")
        new = self.runs.submit_run(adapter="fake", target="t", input="x")
        self.runs.node_fenced("node-a", 1)  # a late callback for the old generation
        self.assertEqual(self.successResultOf(old.when_done()).type, EventType.ERROR)
        self.assertNoResult(new.when_done())

    def test_cancel_sends_cancel_request_and_node_confirms(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        handle.cancel("client went away")
        handle.cancel("again")
        cancels = [e.cancel_request for e in self.a.sent if e.HasField("cancel_request")]
        self.assertEqual(len(cancels), 1)
        self.assertEqual((cancels[0].kind, cancels[0].run_id), (pb.CANCEL_RUN, handle.run_id))
        self.event(handle.run_id, 1, RuntimeEvent.cancelled())
        self.assertEqual(self.successResultOf(handle.when_done()).type, EventType.CANCELLED)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_unanswered_cancel_ends_locally_after_grace(self) -> None:
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        handle.cancel()
        self.clock.advance(9)
        self.assertNoResult(handle.when_done())
        self.clock.advance(1)
        self.assertEqual(self.successResultOf(handle.when_done()).type, EventType.CANCELLED)

    def test_send_failure_ends_run_with_error(self) -> None:
        self.registry.disconnected(self.a)
        self.a = self.connect("node-a", fail=True)
        handle = self.runs.submit_run(adapter="fake", target="t", input="x")
        terminal = self.successResultOf(handle.when_done())
        self.assertEqual(terminal.type, EventType.ERROR)
        self.assertIn("could not send", terminal.error)
        self.assertEqual(len(self.flushLoggedErrors(ConnectionError)), 1)
        self.assertEqual(self.runs.active(), [])


class RunTerminalCountTests(DispatchCase):
    """Every way a run ends is counted once, per node and kind; a sent run logs nothing."""

    def submit(self, node_id: str | None = None) -> str:
        handle = self.runs.submit_run(
            adapter="fake", target="demo-model", input="x", node_id=node_id
        )
        return handle.run_id

    def test_every_label_is_there_at_zero(self) -> None:
        self.assertEqual(
            self.runs.stats(), {(n, k): 0 for n in ("node-a", "node-b") for k in RUN_TERMINALS}
        )

    def test_each_kind(self) -> None:
        logged = capture_events(self)
        done = self.submit()
        self.event(done, 1, RuntimeEvent.text("hi"))
        self.event(done, 2, RuntimeEvent.complete(Usage(1, 1)))
        self.assertEqual(list(logged), [])
        self.event(self.submit(), 1, RuntimeEvent.failed("upstream refused"))
        at_capacity = RuntimeEvent.failed(
            "full", {ERROR_CODE_KEY: ErrorCode.PROVIDER_AT_CAPACITY.value}
        )
        self.event(self.submit(), 1, at_capacity)
        timed_out = RuntimeEvent.failed(
            "timed out after 5 s", {ERROR_CODE_KEY: ErrorCode.UPSTREAM_TIMEOUT.value}
        )
        self.event(self.submit(), 1, timed_out)
        confirmed = self.submit()
        self.runs.cancel_run(confirmed, "client left")
        self.event(confirmed, 1, RuntimeEvent.cancelled("client left"))
        self.runs.cancel_run(self.submit(), "client left")
        self.clock.advance(10)  # never confirmed
        self.runs.cancel_run(self.submit(), "client left")
        self.submit()
        self.registry.disconnected(self.a)  # one cancelled, one lost
        self.connect("node-a", fail=True)
        self.submit()
        self.flushLoggedErrors(ConnectionError)
        self.assertEqual(
            {key: n for key, n in self.runs.stats().items() if n},
            {
                ("node-a", "complete"): 1,
                ("node-a", "error"): 1,
                ("node-a", "at_capacity"): 1,
                ("node-a", "timeout"): 1,
                ("node-a", "cancelled"): 3,
                ("node-a", "node_lost"): 1,
                ("node-a", "send_failed"): 1,
            },
        )
        self.assertEqual(self.runs.active(), [])
