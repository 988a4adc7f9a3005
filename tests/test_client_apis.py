"""
The client APIs end to end, with the official ``openai`` and ``anthropic`` SDKs: a real Edge and
Node (twistd, TLS), a fake OpenAI-compatible upstream (which also answers the Responses API and,
for the native path, an Anthropic-shaped ``/v1/messages``), a fake Ollama and a scripted CLI agent.

Catalog of the cluster:

========  ==========================  =========================================
model     provider                    wire
========  ==========================  =========================================
chat      fake OpenAI, openai-chat    tunnel (Messages: bridged over Chat)
native    fake OpenAI, anthropic      tunnel (Messages: native passthrough)
resp      fake OpenAI, responses      tunnel (Chat, Messages: over Responses)
tight     fake OpenAI, capacity 1     tunnel; max_queue 1 for the 429 test
llama     fake Ollama                 normalized run
counted   = chat, token_counter       count_tokens answered on the Edge
cli       direct route to the agent   normalized run
========  ==========================  =========================================
"""

from __future__ import annotations

import http.client
import http.server
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import anthropic
import openai
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from iop.edge.ingress.tokens import count_tokens
from iop.testing.fake_cli_agent import reply_text
from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, LIMITED_CLIENT_KEY, Cluster, wait_until

TOKENS = 8
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello"}]
# The same question for the Anthropic SDK.
ASK: list[MessageParam] = [{"role": "user", "content": "say hello"}]
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": WEATHER_PARAMETERS,
    },
}
PROFILES = [
    {
        "name": "openai-chat",
        "driver": "openai_chat",
        "operations": {"chat_completions": "/chat/completions"},
        "capabilities": ["chat", "streaming", "tools"],
    },
    {
        "name": "anthropic-native",
        "driver": "anthropic_messages",
        "operations": {"messages": "/messages", "count_tokens": "/messages/count_tokens"},
        "capabilities": ["messages", "streaming", "tools", "count_tokens"],
    },
    {
        "name": "openai-responses",
        "driver": "openai_responses",
        "operations": {"responses": "/responses"},
        "capabilities": ["streaming", "tools"],
    },
]


def start(
    cluster: Cluster, delay_ms: int = 5, tokens: int = TOKENS, cli_env: dict[str, str] | None = None
) -> tuple[int, int]:
    openai_port = cluster.start_fake(
        "fake_openai",
        "--delay-ms",
        str(delay_ms),
        "--tokens",
        str(tokens),
        "--responses-api",
        "--anthropic-api",
    )
    ollama_port = cluster.start_fake(
        "fake_ollama", "--delay-ms", str(delay_ms), "--tokens", str(tokens)
    )
    base_url = f"http://127.0.0.1:{openai_port}/v1"

    def http_adapter(name: str) -> dict[str, Any]:
        return {"name": name, "type": "openai_compat", "base_url": base_url, "max_concurrency": 8}

    def tunnel_provider(pid: str, adapter: str, target: str, profile: str, **extra: Any) -> Any:
        return {
            "id": pid,
            "adapter": adapter,
            "category": "api",
            "models": [target],
            "profile": profile,
            **extra,
        }

    adapters = [
        http_adapter("fake-openai"),
        http_adapter("fake-native"),
        http_adapter("fake-responses"),
        {
            "name": "fake-ollama",
            "type": "ollama",
            "base_url": f"http://127.0.0.1:{ollama_port}",
            "max_concurrency": 4,
        },
        {
            "name": "agent",
            "type": "cli",
            "command": sys.executable,
            "args": [
                "-m",
                "iop.testing.fake_cli_agent",
                "--output-format",
                "stream-json",
                "--verbose",
                "-p",
            ],
            "output_format": "stream-json",
            "workspace": str(cluster.root),
            "env": cli_env or {},
            "settings": {"kill_grace_ms": "1000"},
            "max_concurrency": 2,
        },
    ]
    providers = [
        tunnel_provider("p-chat", "fake-openai", "demo-model", "openai-chat", capacity=4),
        tunnel_provider(
            "p-tight",
            "fake-openai",
            "demo-model",
            "openai-chat",
            capacity=1,
            max_queue=1,
            queue_timeout_sec=60,
        ),
        tunnel_provider("p-native", "fake-native", "claude-fake", "anthropic-native"),
        tunnel_provider("p-resp", "fake-responses", "resp-model", "openai-responses"),
        {
            "id": "p-llama",
            "adapter": "fake-ollama",
            "category": "local_inference",
            "models": ["llama3.2"],
            "capacity": 4,
        },
    ]
    cluster.write_edge_config(
        protocol_profiles=PROFILES,
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": adapters,
                "providers": providers,
            }
        ],
        models=[
            {"id": "chat", "providers": ["p-chat"]},
            {"id": "tight", "providers": ["p-tight"]},
            {"id": "native", "providers": ["p-native"]},
            {"id": "resp", "providers": ["p-resp"]},
            {"id": "llama", "providers": ["p-llama"], "default_max_tokens": 64},
            {"id": "counted", "providers": ["p-chat"], "token_counter": "approximate"},
        ],
        openai=cluster.client_api(
            limited_models=["chat"],
            model_routes=[
                {"model": "cli", "adapter": "agent", "target": "agent-model", "node": "node-a"}
            ],
        ),
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return openai_port, ollama_port


def openai_client(cluster: Cluster, key: str = CLIENT_KEY) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=key, max_retries=0, timeout=30
    )


def anthropic_client(cluster: Cluster, key: str = CLIENT_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cluster.client_url, api_key=key, max_retries=0, timeout=30)


def stream_chat(client: openai.OpenAI, model: str, **extra: Any) -> tuple[str, Any, str | None]:
    """A streamed chat answer: its text, the usage chunk's usage and the finish reason."""
    text, usage, finish = "", None, None
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, usage, finish


# -- OpenAI surface ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["chat", "llama", "cli"])
def test_chat_completions_stream_and_whole(cluster: Cluster, model: str) -> None:
    start(cluster)
    client = openai_client(cluster)
    completion = client.chat.completions.create(model=model, messages=HELLO)
    whole = completion.choices[0].message.content or ""
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    text, usage, finish = stream_chat(client, model)
    assert finish == "stop"
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert text == whole
    if model == "chat":
        assert text == fake_text(TOKENS)
        # The tunnel passes the provider's answer through: it names the served target.
        assert completion.model == "demo-model"
    elif model == "cli":
        assert text == reply_text("say hello", 5)
    else:
        assert completion.model == model and text.strip()
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 5, "leases returned")


def test_catalog(cluster: Cluster) -> None:
    start(cluster)
    ids = [m.id for m in openai_client(cluster).models.list()]
    assert ids == ["chat", "tight", "native", "resp", "llama", "counted", "cli"]
    assert [m.id for m in openai_client(cluster, LIMITED_CLIENT_KEY).models.list()] == ["chat"]
    page = anthropic_client(cluster).models.list()
    assert [m.id for m in page.data] == ids


@pytest.mark.parametrize("model", ["chat", "llama"])
def test_tools_round_trip(cluster: Cluster, model: str) -> None:
    start(cluster)
    client = openai_client(cluster)
    first = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "weather in Seoul?"}],
        tools=[WEATHER_TOOL],
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    # Streamed, the same call arrives as tool-call deltas.
    names = []
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "weather in Seoul?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    ):
        for streamed in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if streamed.function is not None and streamed.function.name:
                names.append(streamed.function.name)
    assert names == ["get_weather"]
    # The tool's result goes back; without tools the model answers in text.
    second = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "weather in Seoul?"},
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content


def test_responses(cluster: Cluster) -> None:
    start(cluster)
    client = openai_client(cluster)
    response = client.responses.create(model="resp", input="say hello")
    assert response.output_text == fake_text(TOKENS)
    assert response.usage is not None and response.usage.output_tokens == TOKENS
    deltas = [
        event.delta
        for event in client.responses.create(model="resp", input="say hello", stream=True)
        if event.type == "response.output_text.delta"
    ]
    assert "".join(deltas) == fake_text(TOKENS)
    # A native Messages provider answers Responses too, translated
    # (tests/test_responses_over_messages.py).
    assert client.responses.create(model="native", input="hi").output_text == fake_text(TOKENS)


# -- Anthropic surface -------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["native", "chat", "llama", "cli"])
def test_messages_stream_and_whole(cluster: Cluster, model: str) -> None:
    start(cluster)
    client = anthropic_client(cluster)
    message = client.messages.create(model=model, max_tokens=100, messages=ASK)
    [block] = message.content
    assert block.type == "text"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens > 0
    with client.messages.stream(model=model, max_tokens=100, messages=ASK) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == block.text
    assert final.stop_reason == "end_turn"
    if model in ("native", "chat"):
        assert block.text == fake_text(TOKENS)
    if model == "native":
        assert message.model == "claude-fake"  # passed through from the provider
    else:
        assert message.model == model


def test_messages_tools_round_trip_over_the_bridge(cluster: Cluster) -> None:
    start(cluster)
    client = anthropic_client(cluster)
    tool: ToolParam = {"name": "get_weather", "input_schema": WEATHER_PARAMETERS}
    question: MessageParam = {"role": "user", "content": "weather in Seoul?"}
    first = client.messages.create(model="chat", max_tokens=100, messages=[question], tools=[tool])
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    second = client.messages.create(
        model="chat",
        max_tokens=100,
        messages=[
            question,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text"


def test_count_tokens(cluster: Cluster) -> None:
    start(cluster)
    client = anthropic_client(cluster)
    local = client.messages.count_tokens(model="counted", messages=ASK)
    assert local.input_tokens == count_tokens({"model": "counted", "messages": ASK})
    native = client.messages.count_tokens(model="native", messages=ASK)
    assert native.input_tokens == 2  # the fake's word count of "say hello"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="llama", messages=ASK)


# -- errors ------------------------------------------------------------------------------------


def test_auth_and_unknown_models(cluster: Cluster) -> None:
    start(cluster)
    with pytest.raises(openai.AuthenticationError):
        openai_client(cluster, "sk-wrong").chat.completions.create(model="chat", messages=HELLO)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(cluster, "sk-wrong").messages.create(
            model="chat",
            max_tokens=10,
            messages=ASK,
        )
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client(cluster).chat.completions.create(model="nope", messages=HELLO)
    assert missing.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError):
        anthropic_client(cluster).messages.create(model="nope", max_tokens=10, messages=ASK)
    with pytest.raises(openai.PermissionDeniedError):
        openai_client(cluster, LIMITED_CLIENT_KEY).chat.completions.create(
            model="llama",
            messages=HELLO,
        )
    # No key at all: curl-style.
    connection = http.client.HTTPConnection("127.0.0.1", cluster.client_port, timeout=10)
    connection.request("GET", "/v1/models")
    response = connection.getresponse()
    assert response.status == 401
    assert json.loads(response.read())["error"]["code"] == "missing_api_key"


def _open_stream(cluster: Cluster, model: str) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", cluster.client_port, timeout=30)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps({"model": model, "messages": HELLO, "stream": True}),
        headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
    )
    return connection


def test_full_queue_is_429(cluster: Cluster) -> None:
    start(cluster, delay_ms=200, tokens=200)
    running = _open_stream(cluster, "tight")
    response = running.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    queued = _open_stream(cluster, "tight")
    wait_until(lambda: cluster.provider("p-tight")["queued"] == 1, 10, "one request queued")
    with pytest.raises(openai.RateLimitError) as refused:
        openai_client(cluster).chat.completions.create(model="tight", messages=HELLO)
    assert refused.value.response.headers["retry-after"] == "1"
    with pytest.raises(anthropic.RateLimitError):
        anthropic_client(cluster).messages.create(model="tight", max_tokens=10, messages=ASK)
    # The running client leaves: the queued one gets the provider.
    running.close()
    answer = queued.getresponse()
    assert answer.status == 200
    assert answer.readline().startswith(b"data: ")
    queued.close()
    wait_until(lambda: cluster.provider("p-tight")["in_flight"] == 0, 10, "leases returned")


@pytest.mark.parametrize("model,fake", [("chat", 0), ("llama", 1)])
def test_client_dropping_mid_stream_cancels_upstream(
    cluster: Cluster, model: str, fake: int
) -> None:
    ports = start(cluster, delay_ms=200, tokens=200)
    port = ports[fake]
    provider = "p-chat" if model == "chat" else "p-llama"
    client = openai_client(cluster)
    stream = client.chat.completions.create(model=model, messages=HELLO, stream=True)
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen >= 2:
            break
    assert cluster.fake_stats(port)["active_streams"] == 1
    assert cluster.provider(provider)["in_flight"] == 1
    stream.close()
    client.close()
    took = wait_until(
        lambda: cluster.fake_stats(port)["client_disconnects"] == 1, 5, "upstream disconnect"
    )
    assert took < 1.0, f"the upstream saw the disconnect only after {took:.2f}s"
    wait_until(lambda: cluster.provider(provider)["in_flight"] == 0, 5, "in_flight back to 0")
    assert cluster.fake_stats(port)["active_streams"] == 0


def test_anthropic_client_dropping_mid_stream(cluster: Cluster) -> None:
    ports = start(cluster, delay_ms=200, tokens=200)
    client = anthropic_client(cluster)
    with client.messages.stream(model="chat", max_tokens=500, messages=ASK) as stream:
        for i, _ in enumerate(stream.text_stream):
            if i >= 1:
                break
    client.close()
    took = wait_until(
        lambda: cluster.fake_stats(ports[0])["client_disconnects"] == 1, 5, "upstream disconnect"
    )
    assert took < 1.0
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 5, "in_flight back to 0")


# -- hostile bodies, and credentials an upstream echoes -----------------------------------------

UPSTREAM_SECRET = "sk-upstream-credential-0123456789abcdef"


class _EchoingUpstream(http.server.BaseHTTPRequestHandler):
    """An upstream that refuses every request with 401, echoing the credential it was sent."""

    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        type(self).received.append(self.rfile.read(length))
        body = json.dumps(
            {
                "error": {
                    "message": f"invalid header Authorization: {self.headers['authorization']}",
                    "type": "invalid_request_error",
                }
            }
        ).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echoing() -> Iterator[tuple[type[_EchoingUpstream], int]]:
    """An :class:`_EchoingUpstream` in this process: its handler class and port."""
    handler = type("Echo", (_EchoingUpstream,), {"received": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, server.server_address[1]
    server.shutdown()
    server.server_close()


def start_echoing(
    cluster: Cluster, echoing: tuple[type[_EchoingUpstream], int]
) -> type[_EchoingUpstream]:
    handler, port = echoing
    cluster.write_edge_config(
        protocol_profiles=PROFILES,
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": [
                    {
                        "name": "echo",
                        "type": "openai_compat",
                        "base_url": f"http://127.0.0.1:{port}/v1",
                        "headers": {"Authorization": f"Bearer {UPSTREAM_SECRET}"},
                    }
                ],
                "providers": [
                    {
                        "id": "p-echo",
                        "adapter": "echo",
                        "category": "api",
                        "models": ["echo-model"],
                        "profile": "openai-chat",
                    },
                    {
                        "id": "p-echo-native",
                        "adapter": "echo",
                        "category": "api",
                        "models": ["echo-model"],
                        "profile": "anthropic-native",
                    },
                ],
            }
        ],
        models=[
            {"id": "echo", "providers": ["p-echo"]},
            {"id": "echo-native", "providers": ["p-echo-native"]},
        ],
        openai=cluster.client_api(),
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return handler


def _post_raw(cluster: Cluster, path: str, data: bytes) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", cluster.client_port, timeout=30)
    connection.request(
        "POST",
        path,
        body=data,
        headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
    )
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def test_bodies_the_edge_cannot_send_on_are_400_on_every_route(
    cluster: Cluster, echoing: tuple[type[_EchoingUpstream], int]
) -> None:
    upstream = start_echoing(cluster, echoing)
    user = '{"role": "user", "content": X}'
    routes = {
        "/v1/chat/completions": '{"model": "echo", "messages": [' + user + "]}",
        "/v1/responses": '{"model": "echo", "input": X}',
        "/v1/messages": '{"model": "echo", "max_tokens": 5, "messages": [' + user + "]}",
        "/v1/messages/count_tokens": '{"model": "echo-native", "messages": [' + user + "]}",
    }
    poisons = ['"\\ud800"', "NaN", "Infinity", "-Infinity", "1e999", "[" * 100_000 + "]" * 100_000]
    for path, template in routes.items():
        for poison in poisons:
            status, answer = _post_raw(cluster, path, template.replace("X", poison).encode())
            assert status == 400, (path, poison[:10], answer)
            if path.startswith("/v1/messages"):
                assert answer["type"] == "error"
                assert answer["error"]["type"] == "invalid_request_error"
            else:
                assert answer["error"]["type"] == "invalid_request_error"
        status, answer = _post_raw(
            cluster, path, template.replace("X", '"hi"').replace('"echo', '"\\udfffecho').encode()
        )
        assert status == 400, (path, answer)
    assert upstream.received == []
    assert cluster.provider("p-echo")["in_flight"] == 0


def test_wrong_fields_are_400_with_the_sdks(
    cluster: Cluster, echoing: tuple[type[_EchoingUpstream], int]
) -> None:
    upstream = start_echoing(cluster, echoing)
    client = openai_client(cluster)
    wrong: list[dict[str, Any]] = [
        {"max_tokens": 10**30},
        {"n": 0},
        {"temperature": "hot"},
        {"stop": [1]},
    ]
    for extra in wrong:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="echo", messages=HELLO, **extra)
        assert refused.value.param == next(iter(extra)), extra
    content: Any = [{"role": "user", "content": 5}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="echo", messages=content)
    assert refused.value.param == "messages[0].content"
    with pytest.raises(anthropic.BadRequestError) as bad:
        anthropic_client(cluster).messages.create(model="echo", max_tokens=10**30, messages=ASK)
    assert "max_tokens" in str(bad.value)
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(cluster).messages.create(
            model="echo",
            max_tokens=5,
            messages=ASK,
            tools=[{"name": "f"}, "not a tool"],  # type: ignore[list-item]
        )
    assert upstream.received == []


def test_an_echoed_credential_never_reaches_the_client_in_iop_errors(
    cluster: Cluster, echoing: tuple[type[_EchoingUpstream], int]
) -> None:
    upstream = start_echoing(cluster, echoing)
    client = anthropic_client(cluster)
    with pytest.raises(anthropic.AuthenticationError) as whole:
        client.messages.create(model="echo", max_tokens=5, messages=ASK)
    assert UPSTREAM_SECRET not in str(whole.value.body)
    assert "Bearer [redacted]" in whole.value.message
    with pytest.raises(anthropic.AuthenticationError) as streamed:
        with client.messages.stream(model="echo", max_tokens=5, messages=ASK) as stream:
            for _ in stream:
                pass
    assert UPSTREAM_SECRET not in str(streamed.value.body)
    assert "[redacted]" in streamed.value.message
    # The upstream did get the requests (and the credential): the redaction is the Edge's.
    assert len(upstream.received) == 2
    for daemon in cluster.daemons:
        assert UPSTREAM_SECRET not in daemon.output(), daemon.name
