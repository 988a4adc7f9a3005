"""
The Node's provider raw tunnel against the fake OpenAI upstream and small scripted resources, in
memory (StubTreq) on a task.Clock: frames, passthrough, failures, the shared capacity gate,
cancel, timeouts, usage observation, header handling, and the session's cancel routing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request

from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.handlers import make_session_setup
from iop.node.runs import RunManager
from iop.node.session import NodeSession
from iop.node.tunnel import (
    BODY_FRAME_BYTES,
    TunnelManager,
    UsageObserver,
    filter_response_headers,
    upstream_request_headers,
)
from iop.runtime import AdapterContext, ITunnelProvider, TreqClient, Usage
from iop.runtime.codes import ErrorCode, error_code
from iop.test.node.fakes import capture_events
from iop.test.node.test_runs import open_store
from iop.testing.fake_openai import FAIL_500_MODEL, FAIL_MIDSTREAM_MODEL, FakeOpenAI, fake_text
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_spec, usage_from_proto

SECRET = "Bearer sk-tunnel-secret-0123456789"
KIND = {
    pb.RESPONSE_START: "start",
    pb.BODY: "body",
    pb.END: "end",
    pb.ERROR: "error",
    pb.USAGE: "usage",
}


def chat(stream: bool = True, model: str = "demo-model", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "hello world"}],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def sse(*events: dict[str, Any], done: bool = False) -> list[bytes]:
    out = [
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
        if "type" in event
        else f"data: {json.dumps(event)}\n\n".encode()
        for event in events
    ]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


class Scripted(Resource):
    """
    Answers every request with ``code``, ``content_type`` and ``chunks`` (then finishes, unless
    ``finish`` is false); records each request's method, path, headers and body.
    """

    isLeaf = True

    def __init__(
        self,
        chunks: Sequence[bytes] = (),
        code: int = 200,
        content_type: bytes = b"text/event-stream",
        finish: bool = True,
        extra_headers: dict[bytes, bytes] | None = None,
    ) -> None:
        super().__init__()
        self.chunks = list(chunks)
        self.code = code
        self.content_type = content_type
        self.finish = finish
        self.extra_headers = extra_headers or {}
        self.seen: list[tuple[str, str, dict[str, list[str]], bytes]] = []
        self.lost = 0

    def render(self, request: Request) -> int:
        headers = {
            name.decode().lower(): [v.decode() for v in values]
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        body = request.content.read() if request.content is not None else b""
        self.seen.append((request.method.decode(), request.uri.decode(), headers, body))
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", self.content_type)
        for name, value in self.extra_headers.items():
            request.setHeader(name, value)
        request.notifyFinish().addErrback(self._lost)
        for chunk in self.chunks:
            request.write(chunk)
        if self.finish:
            request.finish()
        return NOT_DONE_YET

    def _lost(self, _: object) -> None:
        self.lost += 1


class Hanging(Resource):
    """Never answers; counts clients that give up."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def render(self, request: Request) -> int:
        request.notifyFinish().addErrback(self._lost)
        return NOT_DONE_YET

    def _lost(self, _: object) -> None:
        self.lost += 1


class TunnelCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[pb.Envelope] = []
        self.events = capture_events(self)
        self.addCleanup(self.assertNoDelayedCalls)

    def assertNoDelayedCalls(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])

    # -- setup -------------------------------------------------------------------------------

    def use_fake(self, config_fields: dict[str, Any] | None = None, **settings: Any) -> FakeOpenAI:
        self.fake = FakeOpenAI(self.clock, **settings)
        self.use_resource(self.fake.resource(), **(config_fields or {}))
        return self.fake

    def use_resource(self, resource: IResource, http: Any = None, **config_fields: Any) -> None:
        self.http = StubTreq(resource)
        fields: dict[str, Any] = {
            "name": "up",
            "type": "openai_compat",
            "enabled": True,
            "base_url": "http://upstream.test/v1/",
            "headers": {"Authorization": SECRET},
            "max_concurrency": 1,
        }
        fields.update(config_fields)
        self.config = pb.AdapterConfig(**fields)
        ctx = AdapterContext(self.clock, cast(TreqClient, http if http is not None else self.http))
        self.instance = AdapterInstance.from_spec(adapter_spec(self.config), ctx)
        self.registry = AdapterRegistry([self.instance])
        self.tunnels = TunnelManager(self.registry, self.sent.append, self.clock)

    def request(
        self,
        body: dict[str, Any] | bytes | None = None,
        *,
        run_id: str = "t1",
        operation: str = "chat_completions",
        stream: bool | None = None,
        headers: Sequence[tuple[str, str]] = (("content-type", "application/json"),),
        **fields: Any,
    ) -> pb.ProviderTunnelRequest:
        if body is None:
            body = chat()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        if stream is None:
            stream = isinstance(body, dict) and body.get("stream") is True
        values: dict[str, Any] = {
            "run_id": run_id,
            "adapter": "up",
            "target": "demo-model",
            "method": "POST",
            "operation": operation,
            "body": raw,
            "stream": stream,
            "headers": [pb.Header(name=n, value=v) for n, v in headers],
        }
        values.update(fields)
        return pb.ProviderTunnelRequest(**values)

    def open(self, body: dict[str, Any] | bytes | None = None, **kwargs: Any) -> None:
        self.tunnels.submit(self.request(body, **kwargs))
        self.end_turn()

    def advance(self, seconds: float, steps: int = 1) -> None:
        for _ in range(steps):
            self.clock.advance(seconds / steps)
            self.end_turn()

    def end_turn(self) -> None:
        """What the upstream has sent arrives, and the reactor turn ends (held body goes out)."""
        self.http.flush()
        self.clock.advance(0)

    # -- reading what was sent ---------------------------------------------------------------

    def frames(self, run_id: str | None = "t1") -> list[pb.ProviderTunnelFrame]:
        return [
            e.provider_tunnel_frame
            for e in self.sent
            if e.WhichOneof("message") == "provider_tunnel_frame"
            and (run_id is None or e.provider_tunnel_frame.run_id == run_id)
        ]

    def kinds(self, run_id: str | None = "t1") -> list[str]:
        out: list[str] = []
        for frame in self.frames(run_id):
            kind = KIND[frame.kind]
            if not (kind == "body" and out and out[-1] == "body+"):
                out.append("body+" if kind == "body" else kind)
        return out

    def body(self, run_id: str = "t1") -> bytes:
        return b"".join(f.body for f in self.frames(run_id) if f.kind == pb.BODY)

    def last(self, run_id: str = "t1") -> pb.ProviderTunnelFrame:
        return self.frames(run_id)[-1]

    def assertValid(self, run_id: str = "t1") -> None:
        frames = self.frames(run_id)
        self.assertEqual([f.sequence for f in frames], list(range(1, len(frames) + 1)))
        ends = [f for f in frames if f.kind in (pb.END, pb.ERROR)]
        self.assertEqual(ends, [frames[-1]])
        self.assertEqual(self.instance.gate.in_use, 0)
        self.assertFalse(self.tunnels.is_active(run_id))

    def usage(self, run_id: str = "t1") -> pb.Usage:
        [frame] = [f for f in self.frames(run_id) if f.kind == pb.USAGE]
        return frame.usage


class StreamTests(TunnelCase):
    def test_streamedChatFrames(self) -> None:
        fake = self.use_fake(tokens=3)
        self.open(chat())
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()
        start = self.frames()[0]
        self.assertEqual(start.status_code, 200)
        headers = {h.name.lower(): h.value for h in start.headers}
        self.assertEqual(headers["content-type"], "text/event-stream")
        self.assertNotIn("content-length", headers)
        self.assertNotIn("transfer-encoding", headers)
        body = self.body().decode()
        self.assertTrue(body.endswith("data: [DONE]\n\n"))
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            for line in body.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        )
        self.assertEqual(text, fake_text(3))
        self.assertEqual(self.last().end, True)
        self.assertEqual(fake.stats().completed_responses, 1)
        usage = self.usage()
        self.assertEqual((usage.input_tokens, usage.output_tokens), (2, 3))
        self.assertFalse(usage.HasField("reasoning_tokens"))
        self.assertFalse(usage.HasField("cached_input_tokens"))
        # The upstream got the Edge's body as is, with the configured credential.
        received = fake.requests[0]
        self.assertEqual(received.body, chat())
        self.assertEqual(received.headers["authorization"], SECRET)

    def test_eachChunkIsForwardedAsItArrives(self) -> None:
        self.use_fake(tokens=4, delay_ms=1000)
        self.open(chat())
        self.assertEqual(self.kinds(), ["start", "body+"])
        before = len(self.frames())
        self.advance(1)
        self.assertGreater(len(self.frames()), before)
        self.assertIn(b"tok0", self.body())
        self.assertNotIn(b"tok1", self.body())
        self.advance(3, steps=3)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()

    def test_chunks_of_one_turn_go_in_one_body_frame(self) -> None:
        self.use_fake(tokens=16)
        self.tunnels.submit(self.request(chat()))
        self.http.flush()
        # The whole answer arrived in this turn: its first chunk at once, the rest in one frame.
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        first, rest = [f for f in self.frames() if f.kind == pb.BODY]
        self.assertNotIn(b"data: [DONE]", first.body)
        self.assertIn(b"data: [DONE]", rest.body)
        self.assertValid()

    def test_a_chunk_alone_in_its_turn_is_not_delayed(self) -> None:
        self.use_fake(tokens=4, delay_ms=1000)
        self.tunnels.submit(self.request(chat()))
        self.http.flush()
        self.assertEqual(self.kinds(), ["start", "body+"])
        before = len(self.frames())
        self.clock.advance(1)
        self.http.flush()
        # The next token's chunk went out as it arrived, before its turn ended.
        self.assertGreater(len(self.frames()), before)
        self.advance(4, steps=4)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()

    def test_nonStreamChat(self) -> None:
        self.use_fake(tokens=5)
        self.open(chat(stream=False))
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        completion = json.loads(self.body())
        self.assertEqual(completion["choices"][0]["message"]["content"], fake_text(5))
        headers = {h.name.lower(): h.value for h in self.frames()[0].headers}
        self.assertEqual(headers["content-type"], "application/json")
        usage = self.usage()
        self.assertEqual((usage.input_tokens, usage.output_tokens), (2, 5))
        self.assertValid()

    def test_bytesAreExactlyThoseTheUpstreamSent(self) -> None:
        chunks = [b'data: {"a": 1}\r\n\r\n', b"\xff\xfe\x00 not utf-8 ", b"da", b"ta: x\n\n"]
        self.use_resource(Scripted(chunks, content_type=b"text/event-stream; charset=utf-8"))
        self.open(chat())
        self.assertEqual(self.body(), b"".join(chunks))
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertValid()

    def test_bigChunksAreSplit(self) -> None:
        big = bytes(range(256)) * 2048  # 512 KiB in one write
        self.use_resource(Scripted([big], content_type=b"application/octet-stream"))
        self.open(chat(stream=False))
        sizes = [len(f.body) for f in self.frames() if f.kind == pb.BODY]
        self.assertTrue(all(0 < size <= BODY_FRAME_BYTES for size in sizes), sizes)
        self.assertGreaterEqual(len(sizes), 2)
        self.assertEqual(self.body(), big)
        self.assertValid()

    def test_smallerFrameSize(self) -> None:
        self.use_fake(tokens=3)
        self.tunnels = TunnelManager(
            self.registry, self.sent.append, self.clock, body_frame_bytes=7
        )
        self.open(chat())
        self.assertTrue(all(len(f.body) <= 7 for f in self.frames() if f.kind == pb.BODY))
        self.assertTrue(self.body().endswith(b"data: [DONE]\n\n"))
        self.assertValid()

    def test_hopByHopHeadersDropped(self) -> None:
        headers = Headers(
            {
                b"Content-Type": [b"text/event-stream"],
                b"Content-Length": [b"10"],
                b"Transfer-Encoding": [b"chunked"],
                b"Connection": [b"keep-alive, X-Hop"],
                b"X-Hop": [b"1"],
                b"Keep-Alive": [b"timeout=5"],
                b"X-Request-Id": [b"req-1"],
                b"Set-Cookie": [b"a=b", b"c=d"],
            }
        )
        kept = filter_response_headers(headers)
        self.assertEqual(
            sorted(kept),
            [
                ("Content-Type", "text/event-stream"),
                ("Set-Cookie", "a=b"),
                ("Set-Cookie", "c=d"),
                ("X-Request-Id", "req-1"),
            ],
        )


class PassthroughTests(TunnelCase):
    def test_upstream500IsPassedThrough(self) -> None:
        fake = self.use_fake()
        self.open(chat(model=FAIL_500_MODEL))
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual(self.frames()[0].status_code, 500)
        self.assertEqual(json.loads(self.body())["error"]["message"], "injected upstream failure")
        self.assertEqual(fake.stats().rejected_requests, 1)
        self.assertValid()

    def test_upstream400IsPassedThrough(self) -> None:
        self.use_fake()
        self.open({"model": "demo-model", "messages": []})
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual(self.frames()[0].status_code, 400)
        self.assertValid()

    def test_upstream404(self) -> None:
        self.use_fake()
        self.open(chat(), operation="responses")
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual(self.frames()[0].status_code, 404)
        self.assertValid()

    def test_connectFailureIsOneError(self) -> None:
        class Refusing:
            def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
                return fail(ConnectionRefusedError("connection refused"))

        self.use_resource(Resource(), http=Refusing())
        self.open()
        [frame] = self.frames()
        self.assertEqual((frame.kind, frame.sequence, frame.end), (pb.ERROR, 1, True))
        self.assertIn("upstream request failed", frame.error)
        self.assertIn("refused", frame.error)
        self.assertValid()

    def test_midstreamDropIsErrorAfterStart(self) -> None:
        fake = self.use_fake(tokens=10)
        self.open(chat(model=FAIL_MIDSTREAM_MODEL))
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertIn("upstream connection lost", self.last().error)
        self.assertEqual(fake.stats().dropped_streams, 1)
        self.assertValid()

    def test_midstreamDropOfAJSONBody(self) -> None:
        self.use_fake(tokens=10)
        self.open(chat(stream=False, model=FAIL_MIDSTREAM_MODEL))
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertValid()


class RoutingTests(TunnelCase):
    def test_defaultOperationPaths(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        for i, operation in enumerate(
            ["chat_completions", "responses", "messages", "count_tokens", "models"]
        ):
            self.open(b"{}", run_id=f"t{i}", operation=operation)
        self.assertEqual(
            [path for _, path, _, _ in scripted.seen],
            [
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/v1/models",
            ],
        )

    def test_profileOperationsWin(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        profile = pb.RuntimeProfile(
            name="p", driver="openai_chat", operations={"chat_completions": "/v2/chat"}
        )
        self.use_resource(scripted, profile=profile)
        self.open()
        self.open(run_id="t2", operation="responses")
        self.assertEqual([s[1] for s in scripted.seen], ["/v1/v2/chat", "/v1/responses"])

    def test_pathIsOnlyAFallback(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        self.open(operation="chat_completions", path="/ignored")
        self.open(run_id="t2", operation="", path="/custom?x=1")
        self.assertEqual([s[1] for s in scripted.seen], ["/v1/chat/completions", "/v1/custom?x=1"])

    def test_modelsWithGET(self) -> None:
        self.use_fake(models=["a", "b"])
        self.open(b"", operation="models", method="GET", headers=())
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual([m["id"] for m in json.loads(self.body())["data"]], ["a", "b"])
        self.assertValid()

    def test_methodDefaultsToPOST(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        self.open(method="")
        self.assertEqual(scripted.seen[0][0], "POST")

    def refused(self, **kwargs: Any) -> str:
        before = len(self.frames(None))
        self.open(**kwargs)
        new = self.frames(None)[before:]
        self.assertEqual(len(new), 1)
        [frame] = new
        self.assertEqual((frame.kind, frame.sequence, frame.end), (pb.ERROR, 1, True))
        self.assertEqual(self.instance.gate.in_use, 0)
        # Only a full gate is a coded refusal.
        self.assertEqual(dict(frame.metadata), {})
        return frame.error

    def test_refusals(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        self.assertEqual(self.refused(adapter="nope"), "unknown adapter 'nope'")
        self.assertIn("no path for operation 'embeddings'", self.refused(operation="embeddings"))
        self.assertIn("without an operation or a path", self.refused(operation=""))
        self.assertIn("relative path", self.refused(operation="", path="http://evil/x"))
        self.assertIn("relative path", self.refused(operation="", path="//evil/x"))
        self.assertIn("not allowed", self.refused(method="CONNECT"))
        self.assertIn("without a run_id", self.refused(run_id=""))
        self.assertIn(
            "credential leases",
            self.refused(credential_lease=b"sealed", credential_binding=pb.CredentialBinding()),
        )
        self.assertEqual(scripted.seen, [])

    def test_disabledAdapter(self) -> None:
        self.use_resource(Resource(), enabled=False)
        self.assertEqual(self.refused(), "adapter 'up' is disabled")

    def test_nonHTTPAdapterCannotTunnel(self) -> None:
        self.use_resource(Resource(), type="ollama")
        error = self.refused()
        self.assertIn("adapter 'up' (type ollama) cannot serve provider tunnels", error)

    def test_providersAreTunnelProviders(self) -> None:
        self.use_fake()
        provider = ITunnelProvider(self.instance.provider)
        self.assertEqual(provider.base_url, "http://upstream.test/v1")
        self.assertEqual(provider.idle_timeout, 120.0)
        self.use_resource(Resource(), type="vllm")
        self.assertTrue(ITunnelProvider.providedBy(self.instance.provider))

    def test_duplicateRunId(self) -> None:
        self.use_resource(Hanging())
        self.open()
        frames = self.frames()
        self.tunnels.submit(self.request())
        [refusal] = self.frames()[len(frames) :]
        self.assertIn("already active", refusal.error)
        self.assertTrue(self.tunnels.is_active("t1"))
        self.tunnels.cancel("t1")
        self.http.flush()


class GateTests(TunnelCase):
    """One gate per adapter instance, shared by normalized runs and tunnels."""

    def setUp(self) -> None:
        super().setUp()
        self.fake = self.use_fake(tokens=3, delay_ms=1000)
        self.runs = RunManager(
            self.registry, self.sent.append, open_store(self, self.clock), self.clock
        )

    def run_events(self) -> list[pb.RunEvent]:
        return [e.run_event for e in self.sent if e.WhichOneof("message") == "run_event"]

    def test_runHoldingTheSlotBlocksATunnel(self) -> None:
        self.runs.submit(
            pb.RunRequest(
                run_id="r1",
                adapter="up",
                target="demo-model",
                input=json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
            )
        )
        self.http.flush()
        self.assertEqual(self.instance.gate.in_use, 1)
        self.open()
        [frame] = self.frames()
        self.assertEqual(frame.kind, pb.ERROR)
        self.assertEqual(frame.error, "adapter 'up' is at capacity (1/1)")
        self.assertEqual(error_code(frame.metadata), ErrorCode.PROVIDER_AT_CAPACITY)
        self.advance(3, steps=3)
        self.assertEqual(self.run_events()[-1].type, "complete")
        self.assertEqual(self.instance.gate.in_use, 0)
        self.sent.clear()
        self.open()
        self.assertEqual(self.kinds(), ["start", "body+"])
        self.advance(3, steps=3)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()

    def test_tunnelHoldingTheSlotBlocksARun(self) -> None:
        self.open()
        self.assertEqual(self.instance.gate.in_use, 1)
        self.runs.submit(pb.RunRequest(run_id="r1", adapter="up", target="demo-model", input="x"))
        [event] = self.run_events()
        self.assertEqual((event.type, event.error), ("error", "adapter 'up' is at capacity (1/1)"))
        self.assertEqual(error_code(event.metadata), ErrorCode.PROVIDER_AT_CAPACITY)
        self.advance(3, steps=3)
        self.assertValid()
        self.runs.submit(
            pb.RunRequest(run_id="r2", adapter="up", target="demo-model", input="hello")
        )
        self.http.flush()
        self.assertEqual(self.instance.gate.in_use, 1)
        self.advance(3, steps=3)
        self.assertEqual(self.run_events()[-1].type, "complete")
        self.assertEqual(self.instance.gate.in_use, 0)

    def test_slotIsFreeWhenTheLastFrameGoesOut(self) -> None:
        seen: list[int] = []

        def send(envelope: pb.Envelope) -> None:
            frame = envelope.provider_tunnel_frame
            if frame.kind in (pb.END, pb.ERROR):
                seen.append(self.instance.gate.in_use)
            self.sent.append(envelope)

        self.tunnels = TunnelManager(self.registry, send, self.clock)
        self.open()
        self.advance(3, steps=3)
        self.open(run_id="t2")
        self.tunnels.cancel("t2")
        self.http.flush()
        self.assertEqual(seen, [0, 0])


class CancelTests(TunnelCase):
    def cancel(self, run_id: str = "t1", reason: str = "client went away") -> pb.CancelResponse:
        before = len(self.sent)
        self.tunnels.cancel_request_received(
            pb.Envelope(
                cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id=run_id, reason=reason)
            )
        )
        self.http.flush()
        [response] = [
            e.cancel_response
            for e in self.sent[before:]
            if e.WhichOneof("message") == "cancel_response"
        ]
        return response

    def test_cancelMidStream(self) -> None:
        fake = self.use_fake(tokens=6, delay_ms=1000)
        self.open()
        self.advance(2, steps=2)
        self.assertEqual(fake.stats().active_streams, 1)
        response = self.cancel()
        self.assertTrue(response.ok)
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertEqual(self.last().error, "cancelled: client went away")
        stats = fake.stats()
        self.assertEqual(
            (stats.client_disconnects, stats.active_streams, stats.completed_responses),
            (1, 0, 0),
        )
        count = len(self.sent)
        self.advance(10, steps=10)
        self.assertEqual(len(self.sent), count)
        self.assertValid()

    def test_cancelBeforeHeaders(self) -> None:
        hanging = Hanging()
        self.use_resource(hanging)
        self.open()
        self.assertEqual(self.frames(), [])
        self.assertTrue(self.cancel(reason="").ok)
        [frame] = self.frames()
        self.assertEqual((frame.kind, frame.sequence, frame.error), (pb.ERROR, 1, "cancelled"))
        self.assertEqual(hanging.lost, 1)
        self.assertValid()

    def test_cancelUnknownOrEnded(self) -> None:
        self.use_fake(tokens=1)
        self.open()
        self.assertValid()
        response = self.cancel("t1")
        self.assertFalse(response.ok)
        self.assertIn("no active tunnel", response.reason)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertFalse(self.tunnels.cancel("nope"))

    def test_sessionLostAbortsEveryTunnel(self) -> None:
        fake = self.use_fake(tokens=6, delay_ms=1000, config_fields={"max_concurrency": 2})
        self.open()
        self.open(run_id="t2")
        self.advance(1)
        self.assertEqual(self.instance.gate.in_use, 2)
        count = len(self.sent)
        self.tunnels.connection_lost()
        self.http.flush()
        self.assertEqual(len(self.sent), count)
        self.assertEqual(self.instance.gate.in_use, 0)
        self.assertEqual(self.tunnels.active_count(), 0)
        self.assertEqual(fake.stats().client_disconnects, 2)
        self.tunnels.submit(self.request(run_id="t3"))
        self.assertEqual(len(self.sent), count)


class TimeoutTests(TunnelCase):
    def test_idleTimeoutMidStream(self) -> None:
        fake = self.use_fake({"idle_timeout_ms": 1000}, tokens=4, delay_ms=5000)
        self.open()
        self.advance(0.999)
        self.assertEqual(self.kinds(), ["start", "body+"])
        self.advance(0.001)
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertEqual(self.last().error, "upstream idle for 1s")
        self.assertEqual(error_code(self.last().metadata), ErrorCode.UPSTREAM_TIMEOUT)
        self.assertEqual(fake.stats().client_disconnects, 1)
        self.assertValid()

    def test_idleTimerResetsOnEveryChunk(self) -> None:
        self.use_fake({"idle_timeout_ms": 1000}, tokens=5, delay_ms=900)
        self.open()
        self.advance(0.9 * 5, steps=5)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()

    def test_defaultIdleWhileWaitingForHeaders(self) -> None:
        hanging = Hanging()
        self.use_resource(hanging)
        self.open()
        self.advance(119.9)
        self.assertEqual(self.frames(), [])
        self.advance(0.1)
        [frame] = self.frames()
        self.assertEqual((frame.kind, frame.error), (pb.ERROR, "upstream idle for 120s"))
        self.assertEqual(hanging.lost, 1)
        self.assertValid()

    def test_overallTimeout(self) -> None:
        fake = self.use_fake(tokens=10, delay_ms=1000)
        self.open(timeout_sec=2)
        self.advance(2, steps=4)
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertEqual(self.last().error, "request timed out after 2s")
        self.assertEqual(error_code(self.last().metadata), ErrorCode.UPSTREAM_TIMEOUT)
        self.assertEqual(fake.stats().client_disconnects, 1)
        self.assertValid()

    def test_noOverallTimeoutByDefault(self) -> None:
        self.use_fake(tokens=3, delay_ms=100_000)
        self.open()
        self.advance(300, steps=3)
        self.assertEqual(self.kinds(), ["start", "body+", "usage", "end"])
        self.assertValid()


RESPONSES_USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 4},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 19,
}


class UsageTests(TunnelCase):
    def observed(
        self,
        chunks: Sequence[bytes],
        content_type: bytes = b"text/event-stream",
        operation: str = "chat_completions",
    ) -> pb.Usage | None:
        self.use_resource(Scripted(chunks, content_type=content_type))
        self.open(operation=operation)
        self.assertEqual(self.body(), b"".join(chunks))
        self.assertValid()
        usages = [f.usage for f in self.frames() if f.kind == pb.USAGE]
        self.assertLessEqual(len(usages), 1)
        if usages:
            self.assertEqual(self.kinds()[-2:], ["usage", "end"])
        return usages[0] if usages else None

    def assertUsage(self, usage: pb.Usage | None, expected: Usage) -> None:
        assert usage is not None
        self.assertEqual(usage_from_proto(usage), expected)

    def test_chatStreamWithDetails(self) -> None:
        self.use_fake(tokens=4)
        body = chat(
            model="reason-model",
            messages=[
                {"role": "system", "content": "be brief now"},
                {"role": "user", "content": "hi"},
            ],
        )
        self.open(body)
        self.assertEqual(usage_from_proto(self.usage()), Usage(4, 6, 2, 3))

    def test_chatStreamWithoutUsage(self) -> None:
        self.use_fake(tokens=2)
        body = chat()
        del body["stream_options"]
        self.open(body)
        self.assertEqual(self.kinds(), ["start", "body+", "end"])

    def test_chatJSON(self) -> None:
        self.use_fake(tokens=2)
        self.open(chat(stream=False, model="reason-x"))
        self.assertEqual(usage_from_proto(self.usage()), Usage(2, 3, 1, None))

    def test_responsesStream(self) -> None:
        chunks = sse(
            {"type": "response.created", "response": {"id": "r", "usage": None}},
            {"type": "response.output_text.delta", "delta": "Hi"},
            {"type": "response.completed", "response": {"id": "r", "usage": RESPONSES_USAGE}},
        )
        self.assertUsage(self.observed(chunks, operation="responses"), Usage(12, 7, 3, 4))

    def test_responsesJSON(self) -> None:
        body = json.dumps(
            {"object": "response", "usage": {"input_tokens": 5, "output_tokens": 2}}
        ).encode()
        usage = self.observed([body], b"application/json", operation="responses")
        self.assertUsage(usage, Usage(5, 2))

    def test_anthropicStream(self) -> None:
        chunks = sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "usage": {
                        "input_tokens": 25,
                        "cache_read_input_tokens": 10,
                        "cache_creation_input_tokens": 5,
                        "output_tokens": 1,
                    },
                },
            },
            {"type": "content_block_delta", "index": 0, "delta": {"text": "Hi"}},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 15},
            },
            {"type": "message_stop"},
        )
        usage = self.observed(chunks, operation="messages")
        self.assertUsage(usage, Usage(40, 15, None, 10, 5))

    def test_anthropicStreamWithoutCacheFields(self) -> None:
        chunks = sse(
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 3, "output_tokens": 1}},
            },
            {"type": "message_delta", "usage": {"output_tokens": 9}},
        )
        self.assertUsage(self.observed(chunks, operation="messages"), Usage(3, 9))

    def test_anthropicJSON(self) -> None:
        body = json.dumps(
            {"type": "message", "content": [], "usage": {"input_tokens": 5, "output_tokens": 9}}
        ).encode()
        usage = self.observed([body], b"application/json", operation="messages")
        self.assertUsage(usage, Usage(5, 9))

    def test_countTokensIsNotUsage(self) -> None:
        body = b'{"input_tokens": 42}'
        self.assertIsNone(self.observed([body], b"application/json", operation="count_tokens"))

    def test_errorBodiesAreNotUsage(self) -> None:
        body = json.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
        self.use_resource(Scripted([body], code=500, content_type=b"application/json"))
        self.open()
        self.assertEqual(self.kinds(), ["start", "body+", "end"])

    def test_malformedStreamHasNoUsageAndIsUntouched(self) -> None:
        chunks = [b"data: {nope\n\n", b"data: [1, 2]\n\n", b"event: x\ndata: \xff\xfe\n\n"]
        self.assertIsNone(self.observed(chunks))

    def test_usageSplitAcrossChunks(self) -> None:
        [whole] = sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
        chunks = [whole[i : i + 5] for i in range(0, len(whole), 5)]
        self.assertUsage(self.observed(chunks), Usage(3, 4))

    def test_observerNeverRaises(self) -> None:
        observer = UsageObserver(sse=False, json_limit=10)
        observer.feed(b"x" * 11)
        observer.feed(b"more")
        self.assertIsNone(observer.finish())
        observer = UsageObserver(sse=True)
        observer.feed(b"data: " + b"x" * (17 * 1024 * 1024))
        self.assertIsNone(observer.finish())


# Streams whose usage the observer must find however they are cut: Chat (usage in the last
# chunk, null before), Anthropic (message_start merged with message_delta), Responses.
OBSERVED_STREAMS = [
    b"".join(
        sse(
            *[{"choices": [{"delta": {"content": f"t{i}"}}], "usage": None} for i in range(5)],
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}},
            done=True,
        )
    ),
    b"".join(
        sse(
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 7, "output_tokens": 1}},
            },
            {"type": "content_block_delta", "delta": {"text": "hi"}},
            {"type": "message_delta", "usage": {"output_tokens": 9}},
        )
    ),
    b"".join(
        sse(
            {"type": "response.created", "response": {"usage": None}},
            {"type": "response.output_text.delta", "delta": "x"},
            {
                "type": "response.completed",
                "response": {"usage": {"input_tokens": 2, "output_tokens": 4, "total_tokens": 6}},
            },
        )
    ),
]


class UsageObserverScanTests(SynchronousTestCase):
    """Only whole events that mention a usage object are parsed; the usage found is the same."""

    def usage(self, chunks: Sequence[bytes]) -> Usage | None:
        observer = UsageObserver(sse=True)
        for chunk in chunks:
            observer.feed(chunk)
        return observer.finish()

    @settings(max_examples=200, deadline=None)
    @given(
        stream=st.sampled_from(OBSERVED_STREAMS),
        cuts=st.lists(st.integers(0, 2000), max_size=12),
        crlf=st.booleans(),
        tail=st.booleans(),
    )
    def test_any_cut_finds_the_same_usage(
        self, stream: bytes, cuts: list[int], crlf: bool, tail: bool
    ) -> None:
        self.assertIsNotNone(self.usage([stream]))
        if tail:
            # Without the last blank line (or the last line's end): what the parser makes of it.
            stream = stream.rstrip(b"\n")
        # The reference: with CR LF line ends the full parser reads every event.
        expected = self.usage([stream.replace(b"\n", b"\r\n")])
        if crlf:
            stream = stream.replace(b"\n", b"\r\n")
        points = sorted({min(c, len(stream)) for c in cuts})
        chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
        self.assertEqual(self.usage(chunks), expected)

    def test_no_usage_object_no_usage(self) -> None:
        chunks = sse({"choices": [{"delta": {"content": "x"}}], "usage": None}, done=True)
        self.assertIsNone(self.usage(chunks))


class HeaderTests(TunnelCase):
    def test_allowListAndConfiguredCredentials(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        self.open(
            headers=[
                ("Content-Type", "application/json"),
                ("anthropic-version", "2023-06-01"),
                ("Anthropic-Beta", "tools-2024"),
                ("OpenAI-Beta", "assistants=v2"),
                ("User-Agent", "sdk/1.0"),
                ("Accept", "text/event-stream"),
                ("Authorization", "Bearer client-supplied"),
                ("x-api-key", "client-key"),
                ("Cookie", "session=1"),
                ("Host", "evil.test"),
                ("X-Forwarded-For", "1.2.3.4"),
                ("Content-Length", "999"),
                ("X-Custom", "v"),
            ]
        )
        _, _, headers, _ = scripted.seen[0]
        self.assertEqual(headers["authorization"], [SECRET])
        self.assertEqual(headers["anthropic-version"], ["2023-06-01"])
        self.assertEqual(headers["anthropic-beta"], ["tools-2024"])
        self.assertEqual(headers["openai-beta"], ["assistants=v2"])
        self.assertEqual(headers["user-agent"], ["sdk/1.0"])
        self.assertEqual(headers["accept"], ["text/event-stream"])
        self.assertEqual(headers["content-type"], ["application/json"])
        for name in ("x-api-key", "cookie", "x-forwarded-for", "x-custom"):
            self.assertNotIn(name, headers)
        self.assertEqual(headers["host"], ["upstream.test"])
        self.assertEqual(headers["content-length"], [str(len(json.dumps(chat())))])

    def test_profileAuthHeaderCannotBeOverridden(self) -> None:
        headers, dropped = upstream_request_headers(
            {"X-Goog-Api-Key": "configured-secret"},
            [
                pb.Header(name="x-goog-api-key", value="client"),
                pb.Header(name="my-auth", value="client"),
            ],
            auth_header="My-Auth",
        )
        self.assertEqual(headers.getRawHeaders("x-goog-api-key"), ["configured-secret"])
        self.assertIsNone(headers.getRawHeaders("my-auth"))
        self.assertEqual(headers.getRawHeaders("content-type"), ["application/json"])
        self.assertEqual(sorted(dropped), ["my-auth", "x-goog-api-key"])

    def test_headerInjectionIsDropped(self) -> None:
        headers, dropped = upstream_request_headers(
            {}, [pb.Header(name="user-agent", value="a\r\nX-Evil: 1")], has_body=False
        )
        self.assertIsNone(headers.getRawHeaders("user-agent"))
        self.assertIsNone(headers.getRawHeaders("content-type"))
        self.assertEqual(dropped, ["user-agent"])

    def test_credentialsNeverInFramesErrorsOrLogs(self) -> None:
        secret_bare = SECRET.split()[1]
        echo = Scripted(
            [f'{{"error": "bad key {secret_bare}"}}'.encode()],
            code=401,
            content_type=b"application/json",
            extra_headers={b"x-echo": SECRET.encode()},
        )
        self.use_resource(echo)
        self.open(headers=[("authorization", "Bearer client-supplied-secret")])

        class Leaky:
            def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
                return fail(ConnectionRefusedError(f"refused while sending {SECRET}"))

        self.use_resource(Resource(), http=Leaky())
        self.open(run_id="t2")
        [error] = self.frames("t2")
        self.assertIn("[redacted]", error.error)
        frames = b"".join(f.SerializeToString() for f in self.frames(None) if f.kind != pb.BODY)
        self.assertNotIn(secret_bare.encode(), frames)
        for event in self.events:
            self.assertNotIn(secret_bare, repr(event))
            self.assertNotIn("client-supplied-secret", repr(event))
        self.assertIn(
            "[redacted]",
            dict((h.name.lower(), h.value) for h in self.frames("t1")[0].headers)["x-echo"],
        )


class LogLineTests(TunnelCase):
    """A finished tunnel logs exactly one line, with what it was, its result, size and time."""

    def test_one_line_per_finished_tunnel(self) -> None:
        self.use_fake(tokens=3, delay_ms=100)
        self.open(chat(), headers=[("content-type", "application/json"), ("x-unknown", "v")])
        self.advance(1, steps=10)
        self.assertValid()
        [event] = list(self.events)
        self.assertEqual(event["log_level"].name, "info")
        self.assertEqual(
            {k: event[k] for k in ("run_id", "adapter", "target", "outcome", "status_code")},
            {
                "run_id": "t1",
                "adapter": "up",
                "target": "demo-model",
                "outcome": "completed",
                "status_code": 200,
            },
        )
        self.assertEqual(event["body_bytes"], len(self.body()))
        self.assertGreater(event["duration_sec"], 0)
        self.assertEqual(event["dropped_headers"], ["x-unknown"])
        text = formatEvent(event)
        self.assertIn("tunnel t1 up/demo-model POST /chat/completions ended: completed", text)
        self.assertIn(f"status 200, {len(self.body())} bytes in", text)

    def test_a_failed_tunnel_says_why_in_its_line(self) -> None:
        class Refusing:
            def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
                return fail(ConnectionRefusedError("nobody home"))

        self.use_resource(Resource(), http=Refusing())
        self.open()
        [event] = [e for e in self.events if e.get("run_id") == "t1"]
        self.assertEqual(event["outcome"], "error")
        self.assertIn("nobody home", formatEvent(event))


class SessionTests(TunnelCase):
    """The session setup: tunnel requests, one cancel handler routing by run id, session loss."""

    def setUp(self) -> None:
        super().setUp()
        self.fake = self.use_fake(tokens=6, delay_ms=1000, config_fields={"max_concurrency": 2})
        config = pb.NodeConfigPayload(node_id="node-1", adapters=[self.config])
        self.session = NodeSession("node-1", config, self.registry, self.sent.append, self.clock)
        make_session_setup(open_store(self, self.clock), self.clock)(self.session)

    def deliver(self, **message: Any) -> None:
        self.session.envelope_received(pb.Envelope(**message))
        self.http.flush()

    def test_cancelRoutesByRunId(self) -> None:
        self.deliver(provider_tunnel_request=self.request(run_id="t1"))
        self.deliver(
            run_request=pb.RunRequest(run_id="r1", adapter="up", target="demo-model", input="hi")
        )
        self.advance(1)
        self.assertEqual(self.instance.gate.in_use, 2)
        self.assertEqual(self.fake.stats().active_streams, 2)

        self.deliver(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="t1"))
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertEqual(self.last().error, "cancelled")
        self.assertEqual(self.instance.gate.in_use, 1)

        self.deliver(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="r1"))
        run_events = [e.run_event for e in self.sent if e.WhichOneof("message") == "run_event"]
        self.assertEqual(run_events[-1].type, "cancelled")
        responses = [
            (e.cancel_response.run_id, e.cancel_response.ok)
            for e in self.sent
            if e.WhichOneof("message") == "cancel_response"
        ]
        self.assertEqual(responses, [("t1", True), ("r1", True)])
        self.assertEqual(self.instance.gate.in_use, 0)
        self.assertEqual(self.fake.stats().client_disconnects, 2)

        self.deliver(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="t1"))
        last = self.sent[-1].cancel_response
        self.assertEqual((last.run_id, last.ok), ("t1", False))

    def test_sessionLossAbortsTunnels(self) -> None:
        self.deliver(provider_tunnel_request=self.request(run_id="t1"))
        self.advance(1)
        self.session.connection_lost(Failure(ConnectionDone()))
        self.http.flush()
        self.assertEqual(self.instance.gate.in_use, 0)
        self.assertEqual(self.fake.stats().client_disconnects, 1)
        self.assertEqual(self.kinds(), ["start", "body+"])
