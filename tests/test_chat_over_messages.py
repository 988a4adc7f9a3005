"""
Chat Completions over a native Anthropic Messages provider, with the official ``openai`` SDK: a
real Edge and Node (twistd, TLS) and the fake upstream's Anthropic-shaped ``/v1/messages``. The
SDK lists ``/v1/models``, then uses the Anthropic-native model through
``client.chat.completions.create``: a plain chat, a streamed chat with usage, a tool call round
trip and an upstream error; every lease comes back.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, wait_until

TOKENS = 8
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "say hello"},
]
WEATHER_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
PROFILE = {
    "name": "anthropic-native",
    "driver": "anthropic_messages",
    "operations": {"messages": "/messages", "count_tokens": "/messages/count_tokens"},
    "capabilities": ["messages", "streaming", "tools", "count_tokens"],
}


def start(cluster: Cluster) -> int:
    port = cluster.start_fake(
        "fake_openai", "--delay-ms", "5", "--tokens", str(TOKENS), "--anthropic-api"
    )
    adapter = {
        "name": "fake-native",
        "type": "openai_compat",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "max_concurrency": 8,
    }

    def provider(pid: str, target: str) -> dict[str, Any]:
        return {
            "id": pid,
            "adapter": "fake-native",
            "category": "api",
            "models": [target],
            "profile": "anthropic-native",
            "capacity": 4,
        }

    cluster.write_edge_config(
        protocol_profiles=[PROFILE],
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": [adapter],
                "providers": [provider("p-claude", "claude-fake"), provider("p-fail", "fail-500")],
            }
        ],
        models=[
            {"id": "demo-claude", "providers": ["p-claude"], "default_max_tokens": 64},
            {"id": "broken-claude", "providers": ["p-fail"]},
        ],
        openai=cluster.client_api(),
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return port


def leases_returned(cluster: Cluster) -> None:
    def idle() -> bool:
        return all(cluster.provider(pid)["in_flight"] == 0 for pid in ("p-claude", "p-fail"))

    wait_until(idle, 5, "leases returned")


@pytest.fixture
def client(cluster: Cluster) -> openai.OpenAI:
    start(cluster)
    return openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )


def test_plain_and_streamed_chat(cluster: Cluster, client: openai.OpenAI) -> None:
    assert "demo-claude" in [m.id for m in client.models.list()]
    completion = client.chat.completions.create(model="demo-claude", messages=HELLO)
    choice = completion.choices[0]
    assert choice.message.content == fake_text(TOKENS)
    assert choice.finish_reason == "stop"
    assert completion.model == "demo-claude"
    assert completion.usage is not None
    # The fake counts words: "be brief" + "say hello".
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, TOKENS)
    assert completion.usage.total_tokens == 4 + TOKENS

    text, usage, finish = "", None, None
    for chunk in client.chat.completions.create(
        model="demo-claude",
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for streamed in chunk.choices:
            text += streamed.delta.content or ""
            finish = streamed.finish_reason or finish
    assert text == fake_text(TOKENS)
    assert finish == "stop"
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (4, TOKENS)

    # A limit the request gives reaches the provider as max_tokens: the answer is cut.
    short = client.chat.completions.create(model="demo-claude", messages=HELLO, max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.choices[0].message.content == fake_text(3)
    leases_returned(cluster)


def test_tool_call_round_trip(cluster: Cluster, client: openai.OpenAI) -> None:
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "weather in Seoul?"}]
    first = client.chat.completions.create(model="demo-claude", messages=ask, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "fake"}

    # Streamed, the call's arguments arrive in fragments the SDK puts together.
    names, fragments, finish = [], [], None
    for chunk in client.chat.completions.create(
        model="demo-claude", messages=ask, tools=[WEATHER_TOOL], stream=True
    ):
        for streamed in chunk.choices:
            finish = streamed.finish_reason or finish
            for delta in streamed.delta.tool_calls or []:
                if delta.function is not None and delta.function.name:
                    names.append(delta.function.name)
                if delta.function is not None and delta.function.arguments:
                    fragments.append(delta.function.arguments)
    assert names == ["get_weather"]
    assert len(fragments) > 1
    assert json.loads("".join(fragments)) == {"city": "fake"}
    assert finish == "tool_calls"

    # The tool's result goes back as a tool message; the model answers in text.
    second = client.chat.completions.create(
        model="demo-claude",
        messages=[
            *ask,
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == fake_text(TOKENS)
    leases_returned(cluster)


def test_upstream_error(cluster: Cluster, client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as whole:
        client.chat.completions.create(model="broken-claude", messages=HELLO)
    assert whole.value.status_code == 500
    assert "injected failure" in whole.value.message
    with pytest.raises(openai.InternalServerError) as streamed:
        for _ in client.chat.completions.create(model="broken-claude", messages=HELLO, stream=True):
            pass
    assert streamed.value.status_code == 500
    leases_returned(cluster)
