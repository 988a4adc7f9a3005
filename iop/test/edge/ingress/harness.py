# -*- test-case-name: iop.test.edge.ingress.test_app -*-
"""
The harness the client API tests share (:class:`Ingress`): a real
:class:`~iop.edge.gateway.EdgeGateway` over a real provider pool, run and tunnel dispatchers and
node registry, one ready node whose side is scripted (the test feeds run events and tunnel
frames), and the Klein app behind ``treq.testing.StubTreq``. No network.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request

from iop.config.model import (
    AdapterConfig,
    Budget,
    ClientAPIConfig,
    ClientKey,
    CorsConfig,
    EdgeConfig,
    HeartbeatConfig,
    Limits,
    ModelConfig,
    ModelProviderRef,
    ModelRoute,
    NodeConfig,
    NodeToken,
    ProfileConfig,
    ProviderConfig,
)
from iop.edge.events import EventBus, RequestFinished
from iop.edge.gateway import EdgeGateway
from iop.edge.ingress.app import ClientApp
from iop.edge.payload import build_node_payload
from iop.edge.pool import ProviderPool
from iop.edge.quota import InProcessQuotaTable, QuotaGate
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.tunnel import TunnelDispatcher
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.events import RuntimeEvent, Usage
from iop.telemetry.tracing import TRACING_OFF, Tracing
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
            capabilities=("streaming", "tools"),
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


def ingress_config(auth: bool = True, cors: CorsConfig | None = None) -> EdgeConfig:
    node = NodeConfig(
        id="node-a",
        token=NodeToken.from_plaintext(NODE_TOKEN),
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
                # Limited generously: every request of the suites reserves, settles, releases.
                ClientKey(
                    "all",
                    NodeToken.from_plaintext(KEY),
                    limits=Limits(concurrent_requests=64),
                    budgets=(Budget("total", tokens=10**12),),
                ),
                ClientKey("limited", NodeToken.from_plaintext(LIMITED_KEY), ("chat",)),
            ),
            max_body_bytes=BODY_LIMIT,
            cors=cors,
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

    def __init__(
        self, auth: bool = True, cors: CorsConfig | None = None, tracing: Tracing = TRACING_OFF
    ) -> None:
        self.clock = Clock()
        self.config = ingress_config(auth, cors)
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
        # Every finished client request's record, as the Edge publishes it.
        self.records: list[RequestFinished] = []
        self.gateway = EdgeGateway(self.config, self.pool, self.runs, self.tunnels)
        self.conn = FakeConnection()
        self.registry.register(NODE_TOKEN, self.conn)
        self.registry.ready("node-a", self.conn)
        # The keys' limits and budgets, counted in this process.
        self.quota = InProcessQuotaTable(self.clock)
        self.gate = QuotaGate(self.config.client_api, self.quota)
        self.app = ClientApp(
            self.gateway,
            self.config.client_api,
            self.clock,
            self.records.append,
            self.gate,
            tracing,
        )
        self.resource = Recording(self.app.resource())
        self.http: Any = StubTreq(self.resource)
        self._sequences: dict[str, int] = {}

    @property
    def finished(self) -> list[tuple[RequestFinished, Usage | None, str]]:
        """The finished requests that were placed: (record, usage, outcome)."""
        return [(r, r.usage, r.outcome) for r in self.records if r.node_id]

    # -- client side -------------------------------------------------------------------------

    def post(
        self,
        path: str,
        body: Any,
        key: str | None = KEY,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Deferred[Any]:
        all_headers = {"content-type": "application/json", **(headers or {})}
        if key is not None and "x-api-key" not in all_headers:
            all_headers["authorization"] = f"Bearer {key}"
        data = raw if raw is not None else json.dumps(body).encode()
        d: Deferred[Any] = self.http.post(BASE + path, data=data, headers=all_headers)
        return d

    def get(self, path: str, key: str | None = KEY, **headers: str) -> Deferred[Any]:
        all_headers = {k.replace("_", "-"): v for k, v in headers.items()}
        if key is not None:
            all_headers["authorization"] = f"Bearer {key}"
        d: Deferred[Any] = self.http.get(BASE + path, headers=all_headers)
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
            self.runs.run_event(self.conn, event_to_proto(event, run_id, self._next(run_id)))
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


def error(message: str, code: ErrorCode | None = None) -> dict[str, Any]:
    """An ERROR frame; ``code`` goes in its metadata, as a node sends it."""
    metadata = {ERROR_CODE_KEY: code.value} if code is not None else {}
    return {"kind": pb.ERROR, "end": True, "error": message, "metadata": metadata}


# What a node writes when its own capacity gate for the adapter is full.
AT_CAPACITY = {ERROR_CODE_KEY: ErrorCode.PROVIDER_AT_CAPACITY.value}


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
    cors: CorsConfig | None = None

    def setUp(self) -> None:
        self.edge = Ingress(self.auth, self.cors)

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
        code, headers, data = self.answer(d)
        body = json.loads(data)
        self.assertEqual(code, status, body)
        self.assertEqual(set(body), {"error", "request_id"})
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
        self.assertEqual(headers.getRawHeaders(b"x-request-id"), [body["request_id"].encode()])
        self.assertIn(fragment, body["error"]["message"])
        return body["error"]

    def assertAnthropicError(
        self, d: Deferred[Any], status: int, kind: str, fragment: str = ""
    ) -> Any:
        code, headers, data = self.answer(d)
        body = json.loads(data)
        self.assertEqual(code, status, body)
        self.assertEqual(set(body), {"type", "error", "request_id"})
        request_id = [body["request_id"].encode()]
        self.assertEqual(headers.getRawHeaders(b"x-request-id"), request_id)
        self.assertEqual(headers.getRawHeaders(b"request-id"), request_id)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], kind)
        self.assertIn(fragment, body["error"]["message"])
        return body["error"]
