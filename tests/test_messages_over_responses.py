"""
Anthropic Messages and Chat Completions over a native OpenAI Responses provider, with the
official ``anthropic`` and ``openai`` SDKs: a real Edge and Node (twistd, TLS) and the fake
upstream's ``/v1/responses`` (``--responses-api``), reached only through an ``openai_responses``
protocol profile. ``client.messages`` gets a plain and a streamed message with usage (the
instructions the fake reports cached become ``cache_read_input_tokens``), a tool round trip
(whole and streamed ``tool_use``, then the ``tool_result`` → text), a ``max_tokens`` cut and an
upstream 500; ``client.chat.completions`` a plain, a streamed and a tool round trip. Every
lease comes back.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionMessageParam

from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, wait_until
from tests.test_chat_over_messages import WEATHER_TOOL

TOKENS = 8
PROFILE = {
    "name": "responses-native",
    "driver": "openai_responses",
    "operations": {"responses": "/responses"},
    "capabilities": ["streaming", "tools"],
}
ASK: list[MessageParam] = [{"role": "user", "content": "say hello"}]
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
PROVIDERS = ("p-resp", "p-fail")


def start(cluster: Cluster) -> int:
    port = cluster.start_fake(
        "fake_openai", "--delay-ms", "5", "--tokens", str(TOKENS), "--responses-api"
    )
    adapter = {
        "name": "fake-responses",
        "type": "openai_compat",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "max_concurrency": 8,
    }

    def provider(pid: str, target: str) -> dict[str, Any]:
        return {
            "id": pid,
            "adapter": "fake-responses",
            "category": "api",
            "models": [target],
            "profile": "responses-native",
            "capacity": 4,
        }

    cluster.write_edge_config(
        protocol_profiles=[PROFILE],
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": [adapter],
                "providers": [provider("p-resp", "gpt-fake"), provider("p-fail", "fail-500")],
            }
        ],
        models=[
            {"id": "demo-gpt", "providers": ["p-resp"], "default_max_tokens": 64},
            {"id": "broken-gpt", "providers": ["p-fail"]},
        ],
        openai=cluster.client_api(),
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return port


def leases_returned(cluster: Cluster) -> None:
    def idle() -> bool:
        return all(cluster.provider(pid)["in_flight"] == 0 for pid in PROVIDERS)

    wait_until(idle, 5, "leases returned")


@pytest.fixture
def claude(cluster: Cluster) -> anthropic.Anthropic:
    start(cluster)
    return anthropic.Anthropic(
        base_url=cluster.client_url, api_key=CLIENT_KEY, max_retries=0, timeout=30
    )


def test_plain_and_streamed_message(cluster: Cluster, claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="demo-gpt", max_tokens=64, system="be brief", messages=ASK
    )
    assert message.model == "demo-gpt"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == fake_text(TOKENS)  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    # The fake counts words: "be brief" (instructions, reported cached) + "say hello".
    assert message.usage.input_tokens == 2
    assert message.usage.cache_read_input_tokens == 2
    assert message.usage.output_tokens == TOKENS

    with claude.messages.stream(
        model="demo-gpt", max_tokens=64, system="be brief", messages=ASK
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1
    assert "".join(texts) == fake_text(TOKENS)
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (2, 2)
    assert final.usage.output_tokens == TOKENS
    leases_returned(cluster)


def test_max_tokens_cut(cluster: Cluster, claude: anthropic.Anthropic) -> None:
    short = claude.messages.create(model="demo-gpt", max_tokens=3, messages=ASK)
    assert short.stop_reason == "max_tokens"
    assert short.content[0].text == fake_text(3)  # type: ignore[union-attr]
    with claude.messages.stream(model="demo-gpt", max_tokens=3, messages=ASK) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert final.content[0].text == fake_text(3)  # type: ignore[union-attr]
    leases_returned(cluster)


def test_tool_use_round_trip(cluster: Cluster, claude: anthropic.Anthropic) -> None:
    ask: list[MessageParam] = [{"role": "user", "content": "weather in Seoul?"}]
    first = claude.messages.create(model="demo-gpt", max_tokens=64, messages=ask, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    [block] = first.content
    assert block.type == "tool_use"
    assert (block.name, block.input) == ("get_weather", {"city": "fake"})

    # Streamed: the tool_use block's input arrives as input_json_delta the SDK puts together.
    partial: list[str] = []
    with claude.messages.stream(
        model="demo-gpt", max_tokens=64, messages=ask, tools=[WEATHER]
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        streamed = stream.get_final_message()
    assert json.loads("".join(partial)) == {"city": "fake"}
    assert streamed.stop_reason == "tool_use"
    [streamed_block] = streamed.content
    assert streamed_block.type == "tool_use" and streamed_block.input == {"city": "fake"}

    # The tool's result goes back as a tool_result block; the model answers in text.
    second = claude.messages.create(
        model="demo-gpt",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *ask,
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}],
            },
        ],
    )
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == fake_text(TOKENS)  # type: ignore[union-attr]
    leases_returned(cluster)


def test_upstream_error(cluster: Cluster, claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError) as whole:
        claude.messages.create(model="broken-gpt", max_tokens=10, messages=ASK)
    assert whole.value.status_code == 500
    assert whole.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "injected upstream failure" in whole.value.message
    with pytest.raises(anthropic.InternalServerError) as streamed:
        with claude.messages.stream(model="broken-gpt", max_tokens=10, messages=ASK) as stream:
            for _ in stream:
                pass
    assert streamed.value.status_code == 500
    leases_returned(cluster)


def test_chat_completions(cluster: Cluster) -> None:
    start(cluster)
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    hello: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "say hello"},
    ]
    completion = client.chat.completions.create(model="demo-gpt", messages=hello)
    choice = completion.choices[0]
    assert (choice.message.content, choice.finish_reason) == (fake_text(TOKENS), "stop")
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, TOKENS)
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 2

    text, usage, finish = "", None, None
    for chunk in client.chat.completions.create(
        model="demo-gpt", messages=hello, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for streamed in chunk.choices:
            text += streamed.delta.content or ""
            finish = streamed.finish_reason or finish
    assert (text, finish) == (fake_text(TOKENS), "stop")
    assert usage is not None and usage.completion_tokens == TOKENS

    # A tool call, its arguments streamed in fragments; the result back; the answer in text.
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "weather in Seoul?"}]
    fragments: list[str] = []
    for chunk in client.chat.completions.create(
        model="demo-gpt", messages=ask, tools=[WEATHER_TOOL], stream=True
    ):
        for streamed in chunk.choices:
            for delta in streamed.delta.tool_calls or []:
                if delta.function is not None and delta.function.arguments:
                    fragments.append(delta.function.arguments)
    assert len(fragments) > 1 and json.loads("".join(fragments)) == {"city": "fake"}
    first = client.chat.completions.create(model="demo-gpt", messages=ask, tools=[WEATHER_TOOL])
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    second = client.chat.completions.create(
        model="demo-gpt",
        messages=[
            *ask,
            first.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == fake_text(TOKENS)

    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="broken-gpt", messages=hello)
    assert failed.value.status_code == 500
    leases_returned(cluster)
