"""
The client API plumbing: authentication, error shapes and statuses, the body limit, the
generation policy, client disconnects (queued and running), the catalog and the usage event.

Also the harness the surface tests share (:class:`Ingress`): a real
:class:`~iop.edge.gateway.EdgeGateway` over a real provider pool, run and tunnel dispatchers
and node registry, one ready node whose side is scripted (the test feeds run events and tunnel
frames), and the Klein app behind ``treq.testing.StubTreq``. No network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from typing import Any

import yaml
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request

from iop.config import parse_edge_config
from iop.config.model import (
    AdapterConfig,
    ClientAPIConfig,
    ClientKey,
    EdgeConfig,
    HeartbeatConfig,
    ModelConfig,
    ModelProviderRef,
    ModelRoute,
    NodeConfig,
    NodeToken,
    ProfileConfig,
    ProviderConfig,
)
from iop.edge import tap as edge_tap
from iop.edge.dispatch import RunDispatcher
from iop.edge.events import EventBus, UsageEvent
from iop.edge.gateway import Dispatch, EdgeGateway
from iop.edge.ingress.app import ClientApp
from iop.edge.ingress.common import (
    ApiError,
    ClientSite,
    LimitedRequest,
    dispatch_error,
    max_tokens_for,
    thinking_budget_for,
    upstream_error,
)
from iop.edge.payload import build_node_payload
from iop.edge.pool import Overloaded, ProviderPool, QueueTimeout, Unavailable, UnknownModel
from iop.edge.registry import NodeRegistry
from iop.edge.tap import EdgeService
from iop.edge.tunnel import TunnelDispatcher, TunnelFailed
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.fixtures import FakeConnection
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto

NODE_TOKEN = "token-for-node-a"
KEY = "sk-test-all-models"
LIMITED_KEY = "sk-test-chat-only"
BODY_LIMIT = 8192
BASE = "http://edge.test"


def profiles() -> tuple[ProfileConfig, ...]:
    return (
        ProfileConfig(
            name="openai-chat",
            driver="openai_chat",
            operations=(("chat_completions", "/chat/completions"),),
            capabilities=("chat", "streaming", "tools"),
            extensions=(("thinking", True),),
        ),
        ProfileConfig(
            name="chat-no-stream",
            driver="openai_chat",
            operations=(("chat_completions", "/chat/completions"),),
            capabilities=("chat",),
        ),
        ProfileConfig(
            name="anthropic-native",
            driver="anthropic_messages",
            operations=(("messages", "/messages"), ("count_tokens", "/messages/count_tokens")),
            capabilities=("messages", "streaming", "tools", "count_tokens"),
        ),
        ProfileConfig(
            name="openai-responses",
            driver="openai_responses",
            operations=(("responses", "/responses"),),
            capabilities=("streaming",),
        ),
    )


def provider(
    pid: str, adapter: str, kind: str, target: str, profile: str = "", **extra: Any
) -> ProviderConfig:
    return ProviderConfig(
        id=pid,
        adapter=adapter,
        category="api",
        adapter_instance=adapter,
        type=kind,
        models=(target,),
        profile=profile,
        usage_attribution=f"team-{pid}",
        **extra,
    )


def model(mid: str, pid: str, target: str, **policy: Any) -> ModelConfig:
    return ModelConfig(id=mid, providers=(ModelProviderRef(pid, target),), **policy)


def ingress_config(auth: bool = True) -> EdgeConfig:
    node = NodeConfig(
        id="node-a",
        token=NodeToken.fromPlaintext(NODE_TOKEN),
        adapters=(
            AdapterConfig(name="chat", type="openai_compat", base_url="http://127.0.0.1:1/v1"),
            AdapterConfig(name="llama", type="ollama", base_url="http://127.0.0.1:2"),
            AdapterConfig(name="agent", type="cli", command="agent"),
        ),
        providers=(
            provider("p-chat", "chat", "openai_compat", "chat-target", "openai-chat",
                     capacity=1, max_queue=1, queue_timeout_sec=30.0),
            provider("p-native", "chat", "openai_compat", "claude-target", "anthropic-native"),
            provider("p-resp", "chat", "openai_compat", "resp-target", "openai-responses"),
            provider("p-plain", "chat", "openai_compat", "plain-target", "chat-no-stream"),
            provider("p-bare", "chat", "openai_compat", "bare-target"),
            provider("p-llama", "llama", "ollama", "llama3.2"),
        ),
    )  # fmt: skip
    return EdgeConfig(
        id="edge-test",
        node_listen="tcp:0:interface=127.0.0.1",
        admin_listen="tcp:0:interface=127.0.0.1",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(2.0, 5.0),
        max_frame_bytes=1024 * 1024,
        register_timeout_sec=10.0,
        nodes=(node,),
        models=(
            model("chat", "p-chat", "chat-target", default_max_tokens=256, min_max_tokens=16),
            model("native", "p-native", "claude-target", display_name="Native Claude"),
            model("resp", "p-resp", "resp-target", default_max_tokens=300),
            model("plain", "p-plain", "plain-target"),
            model("bare", "p-bare", "bare-target", default_max_tokens=64),
            model(
                "llama",
                "p-llama",
                "llama3.2",
                default_max_tokens=128,
                min_max_tokens=8,
                default_thinking_token_budget=512,
            ),
            model("counted", "p-chat", "chat-target", token_counter="approximate"),
        ),
        protocol_profiles=profiles(),
        model_routes=(ModelRoute("cli", "agent", "agent-model", "node-a"),),
        client_api=ClientAPIConfig(
            listen=None,
            auth=auth,
            keys=(
                ClientKey("all", NodeToken.fromPlaintext(KEY)),
                ClientKey("limited", NodeToken.fromPlaintext(LIMITED_KEY), ("chat",)),
            ),
            max_body_bytes=BODY_LIMIT,
        ),
    )


class Recording(Resource):
    """The app's resource, remembering each server-side request (to drop its connection)."""

    isLeaf = True

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.requests: list[Request] = []

    def render(self, request: Any) -> Any:
        self.requests.append(request)
        return self.inner.render(request)


class Ingress:
    """The client app over a real gateway and one ready, scripted node."""

    def __init__(self, auth: bool = True) -> None:
        self.clock = Clock()
        self.config = ingress_config(auth)
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
        self.finished: list[tuple[Dispatch, Usage | None, str]] = []
        self.gateway = EdgeGateway(
            self.config,
            self.pool,
            self.runs,
            self.tunnels,
            onFinished=lambda d, u, o: self.finished.append((d, u, o)),
        )
        self.conn = FakeConnection()
        self.registry.register(NODE_TOKEN, self.conn)
        self.registry.ready("node-a", self.conn)
        self.app = ClientApp(self.gateway, self.config.client_api, self.clock)
        self.resource = Recording(self.app.resource())
        self.http: Any = StubTreq(self.resource)
        self._sequences: dict[str, int] = {}

    # -- client side -------------------------------------------------------------------------

    def post(
        self,
        path: str,
        body: Any,
        key: str | None = KEY,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Deferred[Any]:
        allHeaders = {"content-type": "application/json", **(headers or {})}
        if key is not None and "x-api-key" not in allHeaders:
            allHeaders["authorization"] = f"Bearer {key}"
        data = raw if raw is not None else json.dumps(body).encode()
        d: Deferred[Any] = self.http.post(BASE + path, data=data, headers=allHeaders)
        return d

    def get(self, path: str, key: str | None = KEY, **headers: str) -> Deferred[Any]:
        allHeaders = {k.replace("_", "-"): v for k, v in headers.items()}
        if key is not None:
            allHeaders["authorization"] = f"Bearer {key}"
        d: Deferred[Any] = self.http.get(BASE + path, headers=allHeaders)
        return d

    def flush(self) -> None:
        self.http.flush()

    def disconnect(self) -> None:
        """The client goes away: the server side of the last request loses its connection."""
        request = self.resource.requests[-1]
        request.connectionLost(Failure(ConnectionDone("client went away")))
        self.flush()

    # -- node side ---------------------------------------------------------------------------

    def requests(self, kind: str) -> list[Any]:
        return [getattr(e, kind) for e in self.sent if e.HasField(kind)]

    def run_request(self) -> pb.RunRequest:
        runs = self.requests("run_request")
        assert runs, "no run was sent"
        return runs[-1]  # type: ignore[no-any-return]

    def tunnel_request(self) -> pb.ProviderTunnelRequest:
        tunnels = self.requests("provider_tunnel_request")
        assert tunnels, "no tunnel was sent"
        return tunnels[-1]  # type: ignore[no-any-return]

    def cancels(self) -> list[str]:
        return [c.run_id for c in self.requests("cancel_request")]

    def _next(self, run_id: str) -> int:
        self._sequences[run_id] = self._sequences.get(run_id, 0) + 1
        return self._sequences[run_id]

    def events(self, run_id: str, *events: RuntimeEvent) -> None:
        for event in events:
            self.runs.runEvent(self.conn, event_to_proto(event, run_id, self._next(run_id)))
        self.flush()

    def frames(self, run_id: str, *frames: dict[str, Any]) -> None:
        for frame in frames:
            self.tunnels.frame(
                self.conn,
                pb.ProviderTunnelFrame(run_id=run_id, sequence=self._next(run_id), **frame),
            )
        self.flush()

    def in_flight(self, provider_id: str = "p-chat") -> int:
        return self.pool.counters("node-a", provider_id)["in_flight"]


# -- tunnel frames -----------------------------------------------------------------------------


def start(status: int = 200, content_type: str = "application/json") -> dict[str, Any]:
    return {
        "kind": pb.RESPONSE_START,
        "status_code": status,
        "headers": [
            pb.Header(name="Content-Type", value=content_type),
            pb.Header(name="X-Upstream-Secret-Header", value="not passed"),
        ],
    }


def body(data: bytes) -> dict[str, Any]:
    return {"kind": pb.BODY, "body": data}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "kind": pb.USAGE,
        "usage": pb.Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    }


END: dict[str, Any] = {"kind": pb.END, "end": True}


def error(message: str) -> dict[str, Any]:
    return {"kind": pb.ERROR, "end": True, "error": message}


def sse(chunks: Iterable[Any]) -> bytes:
    out = b""
    for chunk in chunks:
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        out += f"data: {data}\n\n".encode()
    return out


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "bare", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


class IngressCase(SynchronousTestCase):
    """A test case with an :class:`Ingress` and helpers to read answers."""

    auth = True

    def setUp(self) -> None:
        self.edge = Ingress(self.auth)

    def answer(self, d: Deferred[Any]) -> tuple[int, Any, bytes]:
        """Flush, then the response's status, headers and whole body (it must have ended)."""
        self.edge.flush()
        response = self.successResultOf(d)
        content = response.content()
        self.edge.flush()
        return response.code, response.headers, self.successResultOf(content)

    def json_answer(self, d: Deferred[Any]) -> tuple[int, Any]:
        code, _, data = self.answer(d)
        return code, json.loads(data)

    def assertOpenAIError(self, d: Deferred[Any], status: int, fragment: str = "") -> Any:
        code, body = self.json_answer(d)
        self.assertEqual(code, status, body)
        self.assertEqual(set(body), {"error"})
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
        self.assertIn(fragment, body["error"]["message"])
        return body["error"]

    def assertAnthropicError(
        self, d: Deferred[Any], status: int, kind: str, fragment: str = ""
    ) -> Any:
        code, body = self.json_answer(d)
        self.assertEqual(code, status, body)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], kind)
        self.assertIn(fragment, body["error"]["message"])
        return body["error"]


# ---------------------------------------------------------------------------------------------
# Tests


class AuthTests(IngressCase):
    def test_missing_key_is_401_on_both_surfaces(self) -> None:
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT, key=None), 401)
        self.assertEqual(error["code"], "missing_api_key")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, key=None), 401, "authentication_error"
        )
        self.assertEqual(self.edge.sent, [])

    def test_wrong_key_is_401(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", CHAT, key="sk-nope"), 401
        )
        self.assertEqual(
            (error["type"], error["code"]), ("invalid_request_error", "invalid_api_key")
        )
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, headers={"x-api-key": "sk-nope"}, key=None),
            401,
            "authentication_error",
        )
        self.assertOpenAIError(self.edge.get("/v1/models", key="sk-nope"), 401)

    def test_either_header_on_either_surface(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, key=None, headers={"x-api-key": KEY})
        self.edge.flush()
        self.assertEqual(len(self.edge.requests("provider_tunnel_request")), 1)
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(d)[0], 200)
        d = self.edge.post("/v1/messages/count_tokens", {**MESSAGES, "model": "counted"})
        self.assertEqual(self.json_answer(d)[0], 200)

    def test_restricted_key_is_403_for_other_models_even_unknown_ones(self) -> None:
        for name in ("llama", "does-not-exist"):
            error = self.assertOpenAIError(
                self.edge.post("/v1/chat/completions", {**CHAT, "model": name}, key=LIMITED_KEY),
                403,
                name,
            )
            self.assertEqual(error["code"], "model_not_allowed")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, key=LIMITED_KEY), 403, "permission_error"
        )
        self.assertEqual(self.edge.sent, [])

    def test_restricted_key_sees_only_its_models(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models", key=LIMITED_KEY))
        self.assertEqual(code, 200)
        self.assertEqual([m["id"] for m in listing["data"]], ["chat"])
        self.assertOpenAIError(self.edge.get("/v1/models/llama", key=LIMITED_KEY), 403)

    def test_auth_order_before_body(self) -> None:
        d = self.edge.post("/v1/chat/completions", None, key=None, raw=b"{not json")
        self.assertOpenAIError(d, 401)


class AuthOffTests(IngressCase):
    auth = False

    def test_no_key_needed(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models", key=None))
        self.assertEqual(code, 200)
        self.assertIn("llama", [m["id"] for m in listing["data"]])


class ErrorShapeTests(IngressCase):
    def test_bad_json_is_400(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", None, raw=b"{nope"), 400
        )
        self.assertEqual(error["type"], "invalid_request_error")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", None, raw=b"[1, 2]"), 400, "invalid_request_error"
        )

    def test_schema_errors_are_400(self) -> None:
        for bad in (
            {"messages": [{"role": "user", "content": "x"}]},
            {"model": "chat"},
            {"model": "chat", "messages": []},
            {"model": "chat", "messages": [{"content": "x"}]},
            {**CHAT, "stream": "yes"},
            {**CHAT, "max_tokens": 0},
            {**CHAT, "stream_options": 3},
            {**CHAT, "tools": {}},
        ):
            self.assertOpenAIError(self.edge.post("/v1/chat/completions", bad), 400)
        self.assertEqual(self.edge.sent, [])

    def test_unknown_model_is_404(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "nope"}), 404, "nope"
        )
        self.assertEqual(error["code"], "model_not_found")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**MESSAGES, "model": "nope"}), 404, "not_found_error"
        )
        self.assertOpenAIError(self.edge.get("/v1/models/nope"), 404)

    def test_unknown_path_and_method(self) -> None:
        self.assertOpenAIError(self.edge.get("/v1/embeddings"), 404, "/v1/embeddings")
        self.assertOpenAIError(self.edge.get("/v1/chat/completions"), 405)
        self.assertAnthropicError(
            self.edge.get("/v1/messages"), 405, "invalid_request_error", "GET /v1/messages"
        )

    def test_body_limit_is_413(self) -> None:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", big), 413)
        self.assertEqual(error["code"], "request_too_large")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**MESSAGES, "system": "x" * BODY_LIMIT}),
            413,
            "request_too_large",
        )
        self.assertEqual(self.edge.sent, [])

    def test_no_node_is_503(self) -> None:
        self.edge.registry.disconnected(self.edge.conn)
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT), 503)
        self.assertEqual(error["type"], "server_error")
        self.assertAnthropicError(self.edge.post("/v1/messages", MESSAGES), 503, "overloaded_error")
        # A direct route whose node is gone.
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "cli"}), 503
        )

    def test_full_queue_is_429_with_retry_after(self) -> None:
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        queued = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        code, headers, data = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 429)
        self.assertEqual(headers.getRawHeaders("retry-after"), ["1"])
        self.assertEqual(json.loads(data)["error"]["type"], "rate_limit_error")
        code, headers, data = self.answer(
            self.edge.post("/v1/messages", {**MESSAGES, "model": "chat"})
        )
        self.assertEqual(code, 429)
        self.assertEqual(json.loads(data)["error"]["type"], "rate_limit_error")
        self.assertNoResult(queued)
        self.assertNoResult(first)

    def test_queue_timeout_is_503(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        queued = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.clock.advance(31)
        error = self.assertOpenAIError(queued, 503, "timed out")
        self.assertEqual(error["code"], "queue_timeout")

    def test_upstream_error_passes_through(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        upstream = json.dumps({"error": {"message": "bad things", "type": "x", "code": "y"}})
        self.edge.frames(
            self.edge.tunnel_request().run_id, start(418), body(upstream.encode()), END
        )
        code, _, data = self.answer(d)
        self.assertEqual((code, data), (418, upstream.encode()))

    def test_tunnel_failing_before_start_is_502(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.frames(self.edge.tunnel_request().run_id, error("connection refused"))
        error_ = self.assertOpenAIError(d, 502, "connection refused")
        self.assertEqual(error_["code"], "upstream_error")
        self.assertEqual(self.edge.in_flight(), 0)

    def test_node_capacity_gate_full_is_503(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        self.edge.frames(
            self.edge.tunnel_request().run_id, error("adapter 'chat' is at capacity (1/1)")
        )
        self.assertAnthropicError(d, 503, "overloaded_error", "at capacity")


class MappingTests(SynchronousTestCase):
    def test_dispatch_errors(self) -> None:
        cases: list[tuple[BaseException, int]] = [
            (UnknownModel("m"), 404),
            (Overloaded("m", 3), 429),
            (Unavailable("m"), 503),
            (QueueTimeout("m", 2.0), 503),
            (TunnelFailed("provider at capacity"), 503),
            (TunnelFailed("boom"), 502),
        ]
        for exc, status in cases:
            mapped = dispatch_error(exc)
            assert mapped is not None
            self.assertEqual(mapped.status, status, exc)
        self.assertIsNone(dispatch_error(ValueError("x")))

    def test_error_bodies(self) -> None:
        e = ApiError(429, "slow down", code="overloaded", param="model")
        self.assertEqual(
            e.openai_body(),
            {
                "error": {
                    "message": "slow down",
                    "type": "rate_limit_error",
                    "param": "model",
                    "code": "overloaded",
                }
            },
        )
        self.assertEqual(
            e.anthropic_body(),
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        )
        self.assertEqual(
            ApiError(418, "x").anthropic_body()["error"]["type"], "invalid_request_error"
        )
        self.assertEqual(ApiError(599, "x").openai_body()["error"]["type"], "server_error")

    def test_upstream_error_message(self) -> None:
        self.assertEqual(upstream_error(400, b'{"error": {"message": "no"}}').message, "no")
        self.assertEqual(upstream_error(500, b'{"error": "flat"}').message, "flat")
        self.assertEqual(upstream_error(502, b"gateway down").message, "gateway down")
        self.assertIn("HTTP 500", upstream_error(500, b"").message)

    def test_policy(self) -> None:
        policy = ModelConfig(
            id="m", providers=(), default_max_tokens=100, min_max_tokens=10,
            default_thinking_token_budget=64,
        )  # fmt: skip
        self.assertEqual(max_tokens_for(None, policy), 100)
        self.assertEqual(max_tokens_for(5, policy), 10)
        self.assertEqual(max_tokens_for(500, policy), 500)
        self.assertIsNone(max_tokens_for(None, ModelConfig(id="m", providers=())))
        self.assertIsNone(max_tokens_for(None, None))
        self.assertEqual(max_tokens_for(3, ModelConfig(id="m", providers=(), min_max_tokens=4)), 4)
        self.assertEqual(thinking_budget_for(policy), 64)
        self.assertEqual(thinking_budget_for(None), 0)


class ClientSiteTests(SynchronousTestCase):
    """The listener's ``Site``, over an in-memory HTTP connection: the body limit is enforced."""

    def exchange(self, raw: bytes) -> bytes:
        self.edge = Ingress()
        site = ClientSite(self.edge.resource, BODY_LIMIT)
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(raw)
        return transport.value()  # type: ignore[no-any-return]

    def tooLarge(self) -> bool:
        request = self.edge.resource.requests[-1]
        self.assertIsInstance(request, LimitedRequest)
        return bool(getattr(request, "bodyTooLarge", False))

    def head(self, extra: str) -> bytes:
        return (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n{extra}\r\n"
        ).encode()

    def test_declared_length_over_limit(self) -> None:
        data = b"x" * (BODY_LIMIT + 1)
        out = self.exchange(self.head(f"Content-Length: {len(data)}\r\n") + data)
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertIn(b"request_too_large", out)
        self.assertTrue(self.tooLarge())

    def test_chunked_body_over_limit(self) -> None:
        chunk = b"x" * 4096
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))
        out = self.exchange(self.head("Transfer-Encoding: chunked\r\n") + chunks + b"0\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertTrue(self.tooLarge())

    def test_within_limit_reaches_the_app(self) -> None:
        data = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        out = self.exchange(self.head(f"Content-Length: {len(data)}\r\n") + data.encode())
        self.assertTrue(out.startswith(b"HTTP/1.1 404 "), out[:100])
        self.assertFalse(self.tooLarge())

    def test_app_site(self) -> None:
        site = Ingress().app.site()
        self.assertIsInstance(site, ClientSite)
        self.assertEqual(site.requestFactory.maxBodyBytes, BODY_LIMIT)  # type: ignore[attr-defined]


class DisconnectTests(IngressCase):
    def test_queued_request_is_withdrawn(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertEqual(self.edge.pool.counters("node-a", "p-chat")["queued"], 1)
        self.edge.disconnect()
        self.assertEqual(self.edge.pool.counters("node-a", "p-chat")["queued"], 0)
        self.assertEqual(len(self.edge.requests("provider_tunnel_request")), 1)
        # The queue has room again: a new request queues instead of a 429.
        third = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertNoResult(third)

    def test_running_tunnel_is_cancelled(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(200, "text/event-stream"), body(sse([{"choices": []}])))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.frames(run_id, error("cancelled"))
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(self.edge.finished[-1][2], "error")

    def test_running_run_is_cancelled(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.events(run_id, RuntimeEvent.start(), RuntimeEvent.text("he"))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.events(run_id, RuntimeEvent.cancelled("client disconnected"))
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.assertEqual(self.edge.finished[-1][2], "cancelled")

    def test_waiting_for_the_first_event_is_cancelled(self) -> None:
        self.edge.post("/v1/messages", {**MESSAGES, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.clock.advance(60)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)


class CatalogTests(IngressCase):
    def test_openai_list(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models"))
        self.assertEqual(code, 200)
        self.assertEqual(listing["object"], "list")
        self.assertEqual(
            [m["id"] for m in listing["data"]],
            ["chat", "native", "resp", "plain", "bare", "llama", "counted", "cli"],
        )
        self.assertEqual(set(listing["data"][0]), {"id", "object", "created", "owned_by"})
        code, one = self.json_answer(self.edge.get("/v1/models/cli"))
        self.assertEqual((code, one["id"], one["object"]), (200, "cli", "model"))

    def test_anthropic_list(self) -> None:
        code, listing = self.json_answer(
            self.edge.get("/v1/models", anthropic_version="2023-06-01")
        )
        self.assertEqual(code, 200)
        self.assertEqual(listing["has_more"], False)
        self.assertEqual((listing["first_id"], listing["last_id"]), ("chat", "cli"))
        native = next(m for m in listing["data"] if m["id"] == "native")
        self.assertEqual(native["type"], "model")
        self.assertEqual(native["display_name"], "Native Claude")
        code, one = self.json_answer(
            self.edge.get("/v1/models/native", anthropic_version="2023-06-01")
        )
        self.assertEqual((code, one["display_name"]), (200, "Native Claude"))


class UsageEventTests(SynchronousTestCase):
    def test_finished_request_publishes_usage(self) -> None:
        reactor = MemoryReactorClock()
        edge = EdgeService(ingress_config(), reactor)
        seen: list[Any] = []
        edge.bus.subscribe(seen.append)
        dispatch = Dispatch(
            model="chat",
            node_id="node-a",
            adapter="chat",
            target="chat-target",
            provider_type="openai_compat",
            provider_id="p-chat",
            usage_attribution="team-p-chat",
        )
        edge.requestFinished(dispatch, Usage(3, 4), "complete")
        reactor.advance(0)
        [event] = seen
        self.assertIsInstance(event, UsageEvent)
        self.assertEqual(
            (event.model, event.provider_id, event.node_id, event.target),
            ("chat", "p-chat", "node-a", "chat-target"),
        )
        self.assertEqual((event.usage_attribution, event.outcome), ("team-p-chat", "complete"))
        self.assertEqual(event.usage, Usage(3, 4))

    def test_client_listener_only_when_configured(self) -> None:
        options = edge_tap.Options()
        options.edgeConfig = ingress_config()
        service = edge_tap.makeService(options, reactor=MemoryReactorClock())
        self.assertNotIn("clients", [s.name for s in service])  # type: ignore[attr-defined]
        listening = ingress_config()
        options.edgeConfig = dataclasses.replace(
            listening,
            client_api=dataclasses.replace(
                listening.client_api, listen="tcp:0:interface=127.0.0.1"
            ),
        )
        service = edge_tap.makeService(options, reactor=MemoryReactorClock())
        self.assertIn("clients", [s.name for s in service])  # type: ignore[attr-defined]


ETC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "etc", "iop")
README = os.path.join(ETC, "..", "..", "README.md")


class ConfigInStepTests(SynchronousTestCase):
    """The demo config, the example config and the README agree on the client API."""

    def load(self, name: str, **environ: str) -> EdgeConfig:
        path = os.path.join(ETC, name)
        if not os.path.exists(path):
            raise SkipTest(f"{path} is not in this tree")
        with open(path) as f:
            data = yaml.safe_load(f)
        # TLS material is made at run time; the listeners are loopback, so plaintext loads.
        data["node_transport"] = {"plaintext": True}
        data["listen"]["nodes"] = "tcp:7443:interface=127.0.0.1"
        for node in data["nodes"]:
            if "token_file" in node:  # a secret file that only exists where it is deployed
                del node["token_file"]
                node["token_sha256"] = "0" * 64
        return parse_edge_config(data, base_dir=os.path.dirname(path), environ=environ)

    def test_demo_client_api(self) -> None:
        config = self.load(
            os.path.join("demo", "edge.yaml"), IOP_DEMO_NODE_TOKEN="t", IOP_DEMO_NODE_B_TOKEN="u"
        )
        api = config.client_api
        self.assertEqual(api.listen, "tcp:8080:interface=127.0.0.1")
        self.assertTrue(api.auth)
        key = api.key_for("sk-iop-demo")
        assert key is not None
        self.assertEqual((key.name, key.models), ("demo", ()))
        self.assertIsNone(api.key_for("sk-iop-demo "))
        ids = [m.id for m in config.models] + [r.model for r in config.model_routes]
        self.assertEqual(ids, ["demo-pool", "demo-llama", "demo-openai", "demo-ollama", "demo-cli"])
        pool = config.models[0]
        self.assertEqual(pool.token_counter, "approximate")
        chat = next(p for p in config.nodes[0].providers if p.id == "demo-a-chat")
        [profile] = config.protocol_profiles
        self.assertEqual((chat.profile, profile.driver), ("openai-chat", "openai_chat"))
        self.assertEqual(profile.operations, (("chat_completions", "/chat/completions"),))
        self.assertEqual(set(profile.capabilities), {"chat", "streaming", "tools"})

    def test_readme_examples_use_the_demo(self) -> None:
        if not os.path.exists(README):
            raise SkipTest("README.md is not in this tree")
        with open(README) as f:
            text = f.read()
        config = self.load(
            os.path.join("demo", "edge.yaml"), IOP_DEMO_NODE_TOKEN="t", IOP_DEMO_NODE_B_TOKEN="u"
        )
        ids = {m.id for m in config.models} | {r.model for r in config.model_routes}
        used = set(re.findall(r'"(demo-[a-z]+)"', text))
        self.assertTrue(used)
        self.assertLessEqual(used, ids)
        self.assertIn("sk-iop-demo", text)
        self.assertIn("127.0.0.1:8080", text)

    def test_example_documents_the_keys(self) -> None:
        config = self.load(
            "edge.yaml",
            IOP_NODE_GPU_A_TOKEN="a",
            IOP_VLLM_API_KEY="b",
            IOP_AGENT_API_KEY="c",
            IOP_UPSTREAM_KEY="d",
        )
        api = config.client_api
        self.assertEqual(api.listen, "tcp:8080:interface=0.0.0.0")
        self.assertEqual(api.max_body_bytes, 10 * 1024 * 1024)
        teamA = api.key_for("example-client-key-team-a")
        assert teamA is not None
        self.assertEqual(teamA.models, ("qwen-coder", "local-llama"))
        ops = api.key_for("example-client-key-ops")
        assert ops is not None and ops.allows("anything")
