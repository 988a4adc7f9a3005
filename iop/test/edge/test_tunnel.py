"""
The Edge's provider tunnels: open, ordered relay, frames from the wrong connection, fencing
mid-stream, cancel and its grace, backpressure with a bounded buffer, and the admin debug route.
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseFailed
from twisted.web.http import _DataLoss
from zope.interface.verify import verifyObject

from iop.edge.admin import AdminApp
from iop.edge.errors import DispatchError, NodeUnavailable, TunnelFailed
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.tunnel import (
    CLIENT_TOO_SLOW,
    TUNNEL_TERMINALS,
    TunnelDispatcher,
    TunnelOutcome,
    TunnelStream,
)
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.events import Usage
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.test.node.fakes import capture_events
from iop.wire import runtime_pb2 as pb

Conn = FakeConnection


def start(status: int = 200, **headers: str) -> dict[str, Any]:
    return {
        "kind": pb.RESPONSE_START,
        "status_code": status,
        "headers": [pb.Header(name=k.replace("_", "-"), value=v) for k, v in headers.items()],
    }


def body(data: bytes) -> dict[str, Any]:
    return {"kind": pb.BODY, "body": data}


END: dict[str, Any] = {"kind": pb.END, "end": True}


def error(message: str) -> dict[str, Any]:
    return {"kind": pb.ERROR, "end": True, "error": message}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "kind": pb.USAGE,
        "usage": pb.Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    }


class TunnelCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
        )

        self.tunnels = TunnelDispatcher(
            self.registry, self.clock, cancel_grace=10, max_buffered_bytes=100
        )
        self.a = self.connect("node-a")
        self.sequence: dict[str, int] = {}
        self.logged = capture_events(self)
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))

    def connect(self, node_id: str, fail: bool = False) -> Conn:
        conn = Conn(fail)
        self.registry.register(TOKENS[node_id], conn)
        self.registry.ready(node_id, conn)
        return conn

    def open(self, node_id: str = "node-a", **kwargs: Any) -> TunnelStream:
        values: dict[str, Any] = {
            "adapter": "fake",
            "target": "demo-model",
            "operation": "chat_completions",
            "body": b'{"model": "demo-model"}',
            "stream": True,
        }
        values.update(kwargs)
        return self.tunnels.open(node_id, **values)

    def feed(
        self,
        stream: TunnelStream,
        *frames: dict[str, Any],
        conn: Conn | None = None,
        sequence: int | None = None,
    ) -> None:
        for fields in frames:
            seq = sequence if sequence is not None else self.sequence.get(stream.run_id, 0) + 1
            self.sequence[stream.run_id] = max(seq, self.sequence.get(stream.run_id, 0))
            message = pb.ProviderTunnelFrame(run_id=stream.run_id, sequence=seq, **fields)
            self.tunnels.frame(conn or self.a, message)

    def cancels(self, conn: Conn | None = None) -> list[pb.CancelRequest]:
        return [
            e.cancel_request
            for e in (conn or self.a).sent
            if e.WhichOneof("message") == "cancel_request"
        ]


class OpenTests(TunnelCase):
    def test_openSendsTheRequest(self) -> None:
        stream = self.open(
            method="POST",
            path="/legacy",
            headers=[("content-type", "application/json"), ("anthropic-version", "2023-06-01")],
            timeout_sec=30,
            metadata={"k": "v"},
            profile="p",
            run_id="tun-1",
        )
        [envelope] = self.a.sent
        request = envelope.provider_tunnel_request
        self.assertEqual(
            (
                request.run_id,
                request.adapter,
                request.target,
                request.operation,
                request.method,
                request.path,
                request.body,
                request.stream,
                request.timeout_sec,
                request.profile,
                dict(request.metadata),
            ),
            (
                "tun-1",
                "fake",
                "demo-model",
                "chat_completions",
                "POST",
                "/legacy",
                b'{"model": "demo-model"}',
                True,
                30,
                "p",
                {"k": "v"},
            ),
        )
        self.assertEqual(
            [(h.name, h.value) for h in request.headers],
            [("content-type", "application/json"), ("anthropic-version", "2023-06-01")],
        )
        self.assertEqual((stream.run_id, stream.node_id), ("tun-1", "node-a"))
        self.assertEqual(self.tunnels.get("tun-1"), stream)
        self.assertEqual(self.tunnels.active(), [stream])
        self.assertRaises(DispatchError, self.open, run_id="tun-1")
        self.feed(stream, error("x"))

    def test_nodeMustBeReady(self) -> None:
        self.assertRaises(NodeUnavailable, self.open, "node-b")
        self.assertRaises(NodeUnavailable, self.open, "no-such-node")
        pending = Conn()
        self.registry.register(TOKENS["node-b"], pending)
        self.assertRaises(NodeUnavailable, self.open, "node-b")
        self.assertEqual(pending.sent, [])

    def test_sendFailureEndsAtOnce(self) -> None:
        self.registry.disconnected(self.a)
        self.connect("node-a", fail=True)
        stream = self.open()
        failure = self.failureResultOf(stream.when_started(), TunnelFailed)
        self.assertIn("could not send tunnel to node node-a", str(failure.value))
        self.flushLoggedErrors(ConnectionError)
        outcome = self.successResultOf(stream.when_done())
        self.assertFalse(outcome.ok)
        self.assertEqual(self.tunnels.active(), [])

    def test_streamIsAPushProducer(self) -> None:
        stream = self.open()
        verifyObject(IPushProducer, stream)
        self.feed(stream, error("x"))


class RelayTests(TunnelCase):
    def test_wholeExchange(self) -> None:
        stream = self.open()
        first, second = stream.when_started(), stream.when_started()
        self.assertNotIdentical(first, second)
        done = stream.when_done()
        self.assertNoResult(first)
        self.feed(stream, start(200, content_type="text/event-stream", x_id="1"))
        expected = (200, [("content-type", "text/event-stream"), ("x-id", "1")])
        self.assertEqual(self.successResultOf(first), expected)
        self.assertEqual(self.successResultOf(second), expected)
        self.assertEqual(self.successResultOf(stream.when_started()), expected)
        self.feed(stream, body(b"data: 1\n\n"), body(b"data: 2\n\n"))
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.assertEqual(received, [b"data: 1\n\n", b"data: 2\n\n"])
        self.feed(stream, body(b"data: [DONE]\n\n"), usage(3, 4))
        self.assertEqual(received[-1], b"data: [DONE]\n\n")
        self.assertNoResult(done)
        self.feed(stream, END)
        outcome = self.successResultOf(done)
        self.assertEqual(
            outcome,
            TunnelOutcome(ok=True, usage=Usage(3, 4), status_code=200, body_bytes=32),
        )
        self.assertEqual(self.successResultOf(stream.when_done()), outcome)
        self.assertEqual(self.tunnels.active(), [])
        self.assertRaises(RuntimeError, stream.deliver_body, received.append)

    def test_passthroughOfAnUpstreamError(self) -> None:
        stream = self.open()
        self.feed(stream, start(500), body(b'{"error": {}}'), END)
        self.assertEqual(self.successResultOf(stream.when_started())[0], 500)
        outcome = self.successResultOf(stream.when_done())
        self.assertTrue(outcome.ok)
        self.assertEqual(outcome.status_code, 500)

    def test_errorBeforeStart(self) -> None:
        stream = self.open()
        started = stream.when_started()
        self.feed(stream, error("adapter 'fake' is at capacity (1/1)"))
        failure = self.failureResultOf(started, TunnelFailed)
        self.assertEqual(str(failure.value), "adapter 'fake' is at capacity (1/1)")
        self.failureResultOf(stream.when_started(), TunnelFailed)
        outcome = self.successResultOf(stream.when_done())
        self.assertEqual(
            (outcome.ok, outcome.error, outcome.status_code), (False, failure.value.args[0], None)
        )

    def test_errorAfterStart(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.feed(stream, start(), body(b"partial"), error("upstream connection lost"))
        self.assertEqual(received, [b"partial"])
        outcome = self.successResultOf(stream.when_done())
        self.assertEqual((outcome.ok, outcome.error), (False, "upstream connection lost"))

    def test_endWithoutStartIsAnError(self) -> None:
        stream = self.open()
        self.feed(stream, END)
        self.failureResultOf(stream.when_started(), TunnelFailed)
        self.assertFalse(self.successResultOf(stream.when_done()).ok)

    def test_outOfOrderAndDuplicateFramesDropped(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.feed(stream, start(), body(b"a"), body(b"b"))
        self.feed(stream, body(b"dup"), sequence=3)
        self.feed(stream, body(b"old"), sequence=1)
        self.feed(stream, body(b"c"), sequence=5)
        self.feed(stream, body(b"late"), sequence=4)
        self.assertEqual(received, [b"a", b"b", b"c"])
        dropped = [e for e in self.logged if "out-of-order" in e.get("log_format", "")]
        self.assertEqual(len(dropped), 3)
        self.feed(stream, END, sequence=6)
        self.assertTrue(self.successResultOf(stream.when_done()).ok)

    def test_protocolViolationsDropped(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.feed(stream, body(b"too early"), start(201), start(500), body(b"ok"))
        self.assertEqual(received, [b"ok"])
        self.assertEqual(stream.status_code, 201)
        self.feed(stream, {"kind": pb.TUNNEL_FRAME_KIND_UNSPECIFIED}, END)
        self.assertTrue(self.successResultOf(stream.when_done()).ok)

    def test_framesFromAnotherConnectionIgnored(self) -> None:
        stream = self.open()
        stranger = Conn()
        self.feed(stream, start(), body(b"forged"), END, conn=stranger)
        self.assertNoResult(stream.when_started())
        # A new connection of the same node (after a reconnect) does not own the tunnel either.
        self.feed(stream, start(), body(b"mine"))
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.assertEqual(received, [b"mine"])
        self.feed(stream, END)
        self.assertTrue(self.successResultOf(stream.when_done()).ok)

    def test_framesOfUnknownTunnelsIgnored(self) -> None:
        self.tunnels.frame(self.a, pb.ProviderTunnelFrame(run_id="nope", sequence=1, kind=pb.END))

    def test_cancellingAWaiterLeavesOthers(self) -> None:
        stream = self.open()
        mine, theirs = stream.when_done(), stream.when_done()
        mine.cancel()
        self.failureResultOf(mine, CancelledError)
        started = stream.when_started()
        started.cancel()
        self.failureResultOf(started, CancelledError)
        self.feed(stream, start(), END)
        self.assertTrue(self.successResultOf(theirs).ok)


class FenceTests(TunnelCase):
    def test_fenceMidStreamEndsAtOnce(self) -> None:
        b = self.connect("node-b")
        mine = self.open()
        other = self.open("node-b")
        received: list[bytes] = []
        mine.deliver_body(received.append)
        self.feed(mine, start(), body(b"some"))
        self.registry.disconnected(self.a, "heartbeat timeout")
        outcome = self.successResultOf(mine.when_done())
        self.assertEqual(
            (outcome.ok, outcome.error), (False, "node node-a disconnected during the tunnel")
        )
        self.feed(mine, body(b"late"), END)
        self.assertEqual(received, [b"some"])
        self.assertNoResult(other.when_done())
        self.assertEqual(self.tunnels.active(), [other])
        self.feed(other, start(), END, conn=b)
        self.assertTrue(self.successResultOf(other.when_done()).ok)

    def test_fenceBeforeStartFailsWhenStarted(self) -> None:
        stream = self.open()
        started = stream.when_started()
        self.registry.disconnected(self.a)
        self.failureResultOf(started, TunnelFailed)

    def test_staleConnectionCloseChangesNothing(self) -> None:
        stream = self.open()
        self.registry.disconnected(Conn())
        self.assertNoResult(stream.when_done())
        self.feed(stream, start(), END)

    def test_fenceOfACancelledTunnelKeepsTheCancelReason(self) -> None:
        stream = self.open()
        stream.cancel("client disconnected")
        self.registry.disconnected(self.a)
        self.assertEqual(self.successResultOf(stream.when_done()).error, "client disconnected")


class CancelTests(TunnelCase):
    def test_cancelIsSentOnceAndTheNodeAnswers(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.feed(stream, start(), body(b"a"))
        stream.cancel("client disconnected")
        stream.cancel("again")
        self.assertFalse(self.tunnels.cancel(stream.run_id, "and again"))
        [cancel] = self.cancels()
        self.assertEqual(
            (cancel.kind, cancel.run_id, cancel.reason),
            (pb.CANCEL_RUN, stream.run_id, "client disconnected"),
        )
        self.feed(stream, body(b"after cancel"))
        self.assertEqual(received, [b"a"])
        done = stream.when_done()
        self.assertNoResult(done)
        self.feed(stream, error("cancelled: client disconnected"))
        outcome = self.successResultOf(done)
        self.assertEqual((outcome.ok, outcome.error), (False, "client disconnected"))

    def test_endRacingTheCancelIsStillAnError(self) -> None:
        stream = self.open()
        self.feed(stream, start(), body(b"a"))
        stream.cancel("operator")
        self.feed(stream, END)
        self.assertEqual(self.successResultOf(stream.when_done()).error, "operator")

    def test_graceEndsItLocally(self) -> None:
        stream = self.open()
        started = stream.when_started()
        stream.cancel("client disconnected")
        self.clock.advance(9.9)
        self.assertNoResult(started)
        self.clock.advance(0.1)
        self.assertEqual(
            str(self.failureResultOf(started, TunnelFailed).value), "client disconnected"
        )
        self.assertEqual(self.tunnels.active(), [])
        self.feed(stream, error("cancelled"))

    def test_cancelSendFailureEndsAtOnce(self) -> None:
        stream = self.open()
        self.a.fail = True
        stream.cancel("bye")
        self.assertEqual(self.successResultOf(stream.when_done()).error, "bye")
        self.flushLoggedErrors(ConnectionError)

    def test_cancelAfterTheEndDoesNothing(self) -> None:
        stream = self.open()
        self.feed(stream, start(), END)
        stream.cancel()
        self.assertEqual(self.cancels(), [])


class TerminalCountTests(TunnelCase):
    """Every way a tunnel ends is counted once, per node and kind; only abnormal ends log."""

    def kinds(self) -> dict[tuple[str, str], int]:
        return {key: n for key, n in self.tunnels.stats().items() if n}

    def test_every_label_is_there_at_zero(self) -> None:
        self.assertEqual(
            self.tunnels.stats(),
            {(n, k): 0 for n in ("node-a", "node-b") for k in TUNNEL_TERMINALS},
        )

    def test_each_kind(self) -> None:
        b = self.connect("node-b")
        self.feed(self.open(), start(), body(b"x"), END)
        self.feed(self.open(), start(500), body(b"upstream error"), END)  # a passthrough
        self.feed(self.open(), error("upstream refused"))
        self.feed(self.open(), END)  # no response: an error
        at_capacity = self.open()
        self.feed(
            at_capacity,
            {**error("full"), "metadata": {ERROR_CODE_KEY: ErrorCode.PROVIDER_AT_CAPACITY}},
        )
        timed_out = self.open()
        self.feed(timed_out, start())
        self.feed(
            timed_out,
            {**error("upstream idle for 5s"), "metadata": {ERROR_CODE_KEY: "upstream_timeout"}},
        )
        refused = self.open()
        self.feed(refused, {**error("no"), "metadata": {ERROR_CODE_KEY: ErrorCode.LEASE_EXPIRED}})
        cancelled = self.open()
        cancelled.cancel("client disconnected")
        self.feed(cancelled, error("cancelled"))
        unconfirmed = self.open()
        unconfirmed.cancel("client disconnected")
        self.clock.advance(10)
        racing = self.open()
        self.feed(racing, start())
        racing.cancel("operator")
        self.feed(racing, END)  # a cancel's end wins over the node's END
        on_b = self.open("node-b")
        self.feed(on_b, start(), END, conn=b)
        lost = self.open()
        self.feed(lost, start())
        cancelled_then_lost = self.open()
        cancelled_then_lost.cancel("client disconnected")
        self.registry.disconnected(self.a, "heartbeat timeout")
        self.connect("node-a", fail=True)
        self.open()
        self.flushLoggedErrors(ConnectionError)
        self.assertEqual(
            self.kinds(),
            {
                ("node-a", "complete"): 2,
                ("node-a", "error"): 2,
                ("node-a", "at_capacity"): 1,
                ("node-a", "timeout"): 1,
                ("node-a", "lease_refused"): 1,
                ("node-a", "cancelled"): 4,
                ("node-a", "node_lost"): 1,
                ("node-a", "send_failed"): 1,
                ("node-b", "complete"): 1,
            },
        )
        self.assertEqual(self.tunnels.active(), [])

    def test_a_clean_tunnel_logs_nothing_and_a_failed_one_says_why(self) -> None:
        self.feed(self.open(), start(), body(b"x"), END)
        self.assertEqual(list(self.logged), [])
        stream = self.open()
        self.feed(stream, error("upstream refused"))
        [event] = self.logged
        self.assertEqual(event["log_level"].name, "warn")
        self.assertEqual((event["run_id"], event["kind"]), (stream.run_id, "error"))
        self.assertEqual(event["result"], "upstream refused")


class BackpressureTests(TunnelCase):
    def test_pausedConsumerGetsBytesInOrderOnResume(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        self.feed(stream, start(), body(b"1"))
        stream.pauseProducing()
        self.feed(stream, body(b"2"), body(b"3"))
        self.assertEqual(received, [b"1"])
        self.assertEqual(stream.buffered_bytes, 2)
        stream.resumeProducing()
        self.assertEqual(received, [b"1", b"2", b"3"])
        self.feed(stream, body(b"4"), END)
        self.assertEqual(received, [b"1", b"2", b"3", b"4"])
        self.assertTrue(self.successResultOf(stream.when_done()).ok)

    def test_doneWaitsForAPausedConsumer(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        stream.pauseProducing()
        self.feed(stream, start(), body(b"tail"), END)
        done = stream.when_done()
        self.assertNoResult(done)
        stream.resumeProducing()
        self.assertEqual(received, [b"tail"])
        self.assertTrue(self.successResultOf(done).ok)

    def test_consumerThatPausesWhileWriting(self) -> None:
        stream = self.open()
        received: list[bytes] = []

        def write(data: bytes) -> None:
            received.append(data)
            stream.pauseProducing()

        stream.deliver_body(write)
        stream.pauseProducing()
        self.feed(stream, start(), body(b"a"), body(b"b"), body(b"c"))
        stream.resumeProducing()
        self.assertEqual(received, [b"a"])
        stream.resumeProducing()
        stream.resumeProducing()
        self.assertEqual(received, [b"a", b"b", b"c"])
        self.feed(stream, END)

    def test_boundedBufferCancelsASlowClient(self) -> None:
        stream = self.open()
        received: list[bytes] = []
        stream.deliver_body(received.append)
        stream.pauseProducing()
        self.feed(stream, start(), body(b"x" * 60), body(b"y" * 40))
        self.assertEqual(self.cancels(), [])
        self.feed(stream, body(b"z"))
        [cancel] = self.cancels()
        self.assertEqual(cancel.reason, CLIENT_TOO_SLOW)
        self.assertEqual(stream.buffered_bytes, 0)
        self.feed(stream, body(b"more" * 100))
        self.assertEqual(stream.buffered_bytes, 0)
        stream.resumeProducing()
        self.assertEqual(received, [])
        self.feed(stream, error("cancelled: client too slow"))
        outcome = self.successResultOf(stream.when_done())
        self.assertEqual((outcome.ok, outcome.error), (False, CLIENT_TOO_SLOW))

    def test_bufferWithoutAConsumerIsBoundedToo(self) -> None:
        stream = self.open()
        self.feed(stream, start(), body(b"x" * 101))
        [cancel] = self.cancels()
        self.assertEqual(cancel.reason, CLIENT_TOO_SLOW)
        self.clock.advance(10)
        self.assertEqual(self.successResultOf(stream.when_done()).error, CLIENT_TOO_SLOW)

    def test_stopProducingCancels(self) -> None:
        stream = self.open()
        stream.deliver_body(lambda data: None)
        stream.pauseProducing()
        self.feed(stream, start(), body(b"abc"))
        stream.stopProducing()
        [cancel] = self.cancels()
        self.assertEqual(cancel.reason, "client went away")
        self.assertEqual(stream.buffered_bytes, 0)
        self.feed(stream, error("cancelled"))
        self.assertFalse(self.successResultOf(stream.when_done()).ok)

    def test_stopProducingWhilePausedAfterTheEnd(self) -> None:
        stream = self.open()
        stream.deliver_body(lambda data: None)
        stream.pauseProducing()
        self.feed(stream, start(), body(b"abc"), END)
        done = stream.when_done()
        self.assertNoResult(done)
        stream.stopProducing()
        self.assertTrue(self.successResultOf(done).ok)
        self.assertEqual(self.cancels(), [])

    def test_failingConsumerCancels(self) -> None:
        stream = self.open()

        def broken(data: bytes) -> None:
            raise OSError("client socket broke")

        stream.deliver_body(broken)
        self.feed(stream, start(), body(b"a"), body(b"b"))
        [cancel] = self.cancels()
        self.assertEqual(cancel.reason, "client write failed")
        self.flushLoggedErrors(OSError)
        self.feed(stream, error("cancelled"))


class AdminTunnelTests(TunnelCase):
    def setUp(self) -> None:
        super().setUp()
        runs = RunDispatcher(self.config, self.registry, self.clock, lambda c, e: None)
        self.http: Any = StubTreq(AdminApp(lambda: {}, runs, None, self.tunnels).resource())

    def post(self, body: dict[str, Any]) -> Any:
        d = self.http.post("http://admin/tunnels", data=json.dumps(body).encode())
        self.http.flush()
        return d

    def request(self) -> pb.ProviderTunnelRequest:
        return self.a.sent[-1].provider_tunnel_request

    def stream(self) -> TunnelStream:
        stream = self.tunnels.get(self.request().run_id)
        assert stream is not None
        return stream

    def test_streamsTheRawBody(self) -> None:
        d = self.post(
            {
                "adapter": "fake",
                "target": "demo-model",
                "operation": "chat_completions",
                "body": {"messages": [{"role": "user", "content": "hi"}], "model": "x"},
                "stream": True,
                "headers": {"anthropic-version": "2023-06-01"},
            }
        )
        request = self.request()
        self.assertEqual(
            json.loads(request.body),
            {
                "messages": [{"role": "user", "content": "hi"}],
                "model": "demo-model",
                "stream": True,
            },
        )
        self.assertEqual(
            (request.operation, request.method, request.stream), ("chat_completions", "POST", True)
        )
        self.assertIn(
            ("anthropic-version", "2023-06-01"), [(h.name, h.value) for h in request.headers]
        )
        stream = self.stream()
        self.feed(stream, start(201, content_type="text/event-stream", x_other="1"))
        self.http.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 201)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        self.assertEqual(response.headers.getRawHeaders("x-iop-run-id"), [stream.run_id])
        content = self.http.content(response)
        self.feed(stream, body(b"data: 1\n\n"), body(b"\xff raw"), END)
        self.http.flush()
        self.assertEqual(self.successResultOf(content), b"data: 1\n\n\xff raw")

    def test_errorBeforeTheResponse(self) -> None:
        d = self.post({"adapter": "fake", "target": "t", "operation": "chat_completions"})
        self.feed(
            self.stream(),
            {
                **error("adapter 'fake' is at capacity (1/1)"),
                "metadata": {ERROR_CODE_KEY: ErrorCode.PROVIDER_AT_CAPACITY.value},
            },
        )
        self.http.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 503)
        self.assertEqual(
            json.loads(self.successResultOf(self.http.content(response)))["error"]["message"],
            "adapter 'fake' is at capacity (1/1)",
        )
        d = self.post({"adapter": "fake", "target": "t", "operation": "chat_completions"})
        self.feed(self.stream(), error("upstream request failed: refused"))
        self.http.flush()
        self.assertEqual(self.successResultOf(d).code, 502)

    def test_modelsIsAGET(self) -> None:
        d = self.post({"adapter": "fake", "target": "t", "operation": "models"})
        request = self.request()
        self.assertEqual((request.method, request.body), ("GET", b""))
        self.feed(self.stream(), start(200, content_type="application/json"), body(b"{}"), END)
        self.http.flush()
        self.assertEqual(self.successResultOf(self.http.content(self.successResultOf(d))), b"{}")

    def test_validation(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"target": "t", "operation": "o"}, "'adapter' is required"),
            ({"adapter": "a", "target": "t", "operation": "o", "x": 1}, "unknown field 'x'"),
            ({"adapter": "a", "target": "t", "operation": "o", "stream": "yes"}, "must be a bool"),
            ({"adapter": "a", "target": "t", "operation": "o", "body": []}, "must be a dict"),
            ({"adapter": "a", "target": "t", "operation": "o", "timeout_sec": -1}, ">= 0"),
        ]
        for body, fragment in cases:
            response = self.successResultOf(self.post(body))
            self.assertEqual(response.code, 400)
            self.assertIn(fragment, self.successResultOf(self.http.content(response)).decode())
        self.assertEqual(self.a.sent, [])

    def test_unavailableNode(self) -> None:
        response = self.successResultOf(
            self.post({"node": "node-b", "adapter": "a", "target": "t", "operation": "o"})
        )
        self.assertEqual(response.code, 503)
        response = self.successResultOf(
            self.post({"node": "zz", "adapter": "a", "target": "t", "operation": "o"})
        )
        self.assertEqual(response.code, 404)

    def test_errorAfterTheResponseStartedTruncates(self) -> None:
        d = self.post({"adapter": "fake", "target": "t", "operation": "chat_completions"})
        stream = self.stream()
        self.feed(stream, start(200, content_type="text/event-stream"), body(b"data: 1\n\n"))
        self.http.flush()
        content = self.http.content(self.successResultOf(d))
        self.feed(stream, error("upstream connection lost"))
        self.http.flush()
        failure = self.failureResultOf(content, ResponseFailed)
        self.assertTrue(any(reason.check(_DataLoss) for reason in failure.value.reasons))
