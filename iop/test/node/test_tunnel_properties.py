"""
Property: whatever the upstream does — any status, any chunking, a failure before or after the
response headers, a cancel, an idle or overall timeout, or the session going away at any point
— the frames a tunnel sends are a valid sequence, their body bytes are exactly what the upstream
sent before the end, and the capacity slot is released exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers

from iop.node.adapters.capacity import CapacityGate
from iop.node.adapters.openai_compat import OpenAICompatProvider
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.tunnel import TunnelManager
from iop.runtime import AdapterContext, AdapterSpec
from iop.test import examples
from iop.wire import runtime_pb2 as pb

IDLE = 30.0
# Shorter than the idle timeout, so that an overall timeout is not mistaken for an idle one.
BOUND = 20.0
RUN_ID = "t1"


class CountingGate(CapacityGate):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.releases = 0

    def _release(self) -> None:
        self.releases += 1
        super()._release()


class BodyTransport:
    """The push producer a response body's protocol is connected to."""

    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


@dataclass
class Response:
    code: int
    headers: Headers
    transport: BodyTransport = field(default_factory=BodyTransport)
    protocol: Protocol | None = None

    def deliverBody(self, protocol: Protocol) -> None:
        self.protocol = protocol
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]


class Upstream:
    """A treq-shaped client whose one request the test answers (or fails) by hand."""

    def __init__(self) -> None:
        self.pending: Deferred[Any] | None = None
        self.cancelled_before_headers = False

    def request(self, method: str, url: object, **kwargs: Any) -> Deferred[Any]:
        def cancel(_: Deferred[Any]) -> None:
            self.cancelled_before_headers = True

        self.pending = Deferred(cancel)
        return self.pending


INTERRUPTIONS = ("cancel", "idle", "bound", "session_lost")
ENDINGS = ("done", "potential_data_loss", "broken", "refused_before_headers", *INTERRUPTIONS)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    chunks = draw(st.lists(st.binary(min_size=1, max_size=64), max_size=8))
    ending = draw(st.sampled_from(ENDINGS))
    return {
        "chunks": chunks,
        "ending": ending,
        # For an interruption: after how many chunks (-1: before the response headers).
        "at": draw(st.integers(-1, len(chunks))),
        "status": draw(st.sampled_from([200, 201, 204, 400, 401, 404, 429, 500, 503])),
        "content_type": draw(
            st.sampled_from([b"text/event-stream", b"application/json", b"text/plain"])
        ),
        "stream": draw(st.booleans()),
        "frame_bytes": draw(st.integers(1, 64)),
        "gaps": draw(st.lists(st.floats(0, IDLE * 0.9), min_size=9, max_size=9)),
        "late": draw(st.booleans()),
    }


class FrameSequenceProperties(SynchronousTestCase):
    @settings(
        max_examples=examples(200),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(scenarios())
    def test_framesAreAlwaysValid(self, scenario: dict[str, Any]) -> None:
        clock = Clock()
        upstream = Upstream()
        config = AdapterSpec(
            name="up",
            type="openai_compat",
            enabled=True,
            base_url="http://upstream.test/v1",
            headers={"Authorization": "Bearer sk-property-secret"},
            idle_timeout_ms=int(IDLE * 1000),
            max_concurrency=1,
        )
        gate = CountingGate(1)
        instance = AdapterInstance(
            name="up",
            type="openai_compat",
            enabled=True,
            spec=config,
            gate=gate,
            provider=OpenAICompatProvider(config, AdapterContext(clock, upstream)),
        )
        sent: list[pb.Envelope] = []
        manager = TunnelManager(
            AdapterRegistry([instance]),
            sent.append,
            clock,
            body_frame_bytes=scenario["frame_bytes"],
        )
        ending = scenario["ending"]
        interrupt = ending in INTERRUPTIONS
        at = scenario["at"] if interrupt else len(scenario["chunks"])
        manager.submit(
            pb.ProviderTunnelRequest(
                run_id=RUN_ID,
                adapter="up",
                target="m",
                operation="chat_completions",
                body=b'{"model": "m"}',
                stream=scenario["stream"],
                timeout_sec=int(BOUND) if ending == "bound" else 0,
            )
        )
        self.assertEqual(gate.in_use, 1)
        assert upstream.pending is not None

        def interrupt_now() -> None:
            if ending == "cancel":
                self.assertTrue(manager.cancel(RUN_ID, "test"))
            elif ending == "idle":
                clock.advance(IDLE)
            elif ending == "bound":
                clock.advance(BOUND - clock.seconds())
            else:
                manager.connection_lost()
            self.assertFalse(manager.is_active(RUN_ID))

        delivered = b""
        response: Response | None = None
        if ending == "refused_before_headers":
            upstream.pending.errback(ConnectionRefusedError("refused"))
        elif interrupt and at < 0:
            interrupt_now()
            self.assertTrue(upstream.cancelled_before_headers)
        else:
            headers = Headers({b"content-type": [scenario["content_type"]]})
            response = Response(scenario["status"], headers)
            upstream.pending.callback(response)
            protocol = response.protocol
            assert protocol is not None
            for i, chunk in enumerate(scenario["chunks"]):
                if interrupt and i == at:
                    interrupt_now()
                    self.assertTrue(response.transport.stopped, "upstream not disconnected")
                if response.transport.stopped and not scenario["late"]:
                    break
                if manager.is_active(RUN_ID):
                    delivered += chunk
                protocol.dataReceived(chunk)
                if ending != "bound":
                    clock.advance(scenario["gaps"][i])
            if interrupt and at == len(scenario["chunks"]):
                interrupt_now()
                self.assertTrue(response.transport.stopped, "upstream not disconnected")
            if not response.transport.stopped or scenario["late"]:
                reason: Failure = {
                    "done": Failure(ResponseDone()),
                    "potential_data_loss": Failure(PotentialDataLoss()),
                }.get(ending, Failure(ResponseFailed([Failure(ConnectionLost())])))
                protocol.connectionLost(reason)

        # Whatever happens later changes nothing.
        count = len(sent)
        clock.advance(10 * BOUND)
        self.assertEqual(len(sent), count)
        self.assertEqual(clock.getDelayedCalls(), [])

        self.assertEqual((gate.releases, gate.in_use), (1, 0))
        self.assertFalse(manager.is_active(RUN_ID))
        frames = [e.provider_tunnel_frame for e in sent]
        self.assertTrue(all(e.WhichOneof("message") == "provider_tunnel_frame" for e in sent))
        self.assertTrue(all(f.run_id == RUN_ID for f in frames))
        if ending == "session_lost":
            # Nothing can be sent once the session is gone; what went before is still valid.
            self.assertValidPrefix(frames, scenario["frame_bytes"])
            self.assertEqual(body(frames), delivered)
            return
        self.assertValid(frames, scenario["frame_bytes"])
        self.assertEqual(body(frames), delivered)
        last = frames[-1]
        if ending in ("done", "potential_data_loss"):
            self.assertEqual(last.kind, pb.END)
            self.assertEqual(frames[0].status_code, scenario["status"])
        else:
            self.assertEqual(last.kind, pb.ERROR)
            self.assertNotIn("sk-property-secret", last.error)
            expected = {
                "cancel": "cancelled: test",
                "idle": "upstream idle for 30s",
                "bound": "request timed out after 20s",
            }.get(ending)
            if expected is not None:
                self.assertEqual(last.error, expected)
            else:
                self.assertTrue(last.error)
        if response is None:
            self.assertNotIn(pb.RESPONSE_START, [f.kind for f in frames])

    def assertValidPrefix(self, frames: list[pb.ProviderTunnelFrame], frame_bytes: int) -> None:
        self.assertEqual([f.sequence for f in frames], list(range(1, len(frames) + 1)))
        kinds = [f.kind for f in frames]
        self.assertLessEqual(kinds.count(pb.RESPONSE_START), 1)
        if pb.RESPONSE_START in kinds:
            self.assertEqual(kinds[0], pb.RESPONSE_START)
        else:
            self.assertNotIn(pb.BODY, kinds)
            self.assertNotIn(pb.USAGE, kinds)
        for frame in frames:
            if frame.kind == pb.BODY:
                self.assertTrue(0 < len(frame.body) <= frame_bytes)
        self.assertLessEqual(kinds.count(pb.END) + kinds.count(pb.ERROR), 1)
        if pb.END in kinds or pb.ERROR in kinds:
            self.assertIn(kinds[-1], (pb.END, pb.ERROR))
        if pb.END in kinds:
            self.assertIn(pb.RESPONSE_START, kinds)
        if pb.USAGE in kinds:
            self.assertEqual(kinds.count(pb.USAGE), 1)
            self.assertEqual(kinds[-1], pb.END)
            self.assertEqual(kinds.index(pb.USAGE), len(kinds) - 2)

    def assertValid(self, frames: list[pb.ProviderTunnelFrame], frame_bytes: int) -> None:
        self.assertValidPrefix(frames, frame_bytes)
        kinds = [f.kind for f in frames]
        self.assertEqual(kinds.count(pb.END) + kinds.count(pb.ERROR), 1)
        self.assertIn(kinds[-1], (pb.END, pb.ERROR))


def body(frames: list[pb.ProviderTunnelFrame]) -> bytes:
    return b"".join(f.body for f in frames if f.kind == pb.BODY)
