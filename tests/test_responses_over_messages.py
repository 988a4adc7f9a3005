"""
The Responses API over a native Anthropic Messages provider, with the official ``openai`` SDK's
``client.responses.create``: a real Edge and Node (twistd, TLS) and the fake upstream's
Anthropic-shaped ``/v1/messages`` (the setup of :mod:`tests.test_chat_over_messages`). A plain
and a streamed response with usage, a function-call round trip (whole and streamed), an upstream
500; every lease comes back.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import FunctionToolParam

from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster
from tests.test_chat_over_messages import TOKENS, leases_returned, start

WEATHER_TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


@pytest.fixture
def client(cluster: Cluster) -> openai.OpenAI:
    start(cluster)
    return openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )


def test_plain_and_streamed_response(cluster: Cluster, client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="demo-claude", instructions="be brief", input="say hello"
    )
    assert response.status == "completed"
    assert response.model == "demo-claude"
    assert response.output_text == fake_text(TOKENS)
    assert response.usage is not None
    # The fake counts words: "be brief" + "say hello".
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4, TOKENS)

    deltas: list[str] = []
    final: Any = None
    with client.responses.stream(
        model="demo-claude", instructions="be brief", input="say hello"
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert len(deltas) > 1
    assert "".join(deltas) == fake_text(TOKENS)
    assert final.status == "completed" and final.output_text == fake_text(TOKENS)
    assert final.usage is not None and final.usage.output_tokens == TOKENS

    # Also the plain create(stream=True) iterator: the terminal event is response.completed.
    types = [e.type for e in client.responses.create(model="demo-claude", input="hi", stream=True)]
    assert types[0] == "response.created" and types[-1] == "response.completed"

    # max_output_tokens reaches the provider as max_tokens: the answer is cut, incomplete.
    short = client.responses.create(model="demo-claude", input="say hello", max_output_tokens=3)
    assert short.status == "incomplete"
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.output_text == fake_text(3)
    leases_returned(cluster)


def test_function_call_round_trip(cluster: Cluster, client: openai.OpenAI) -> None:
    ask: list[Any] = [{"role": "user", "content": "weather in Seoul?"}]
    first = client.responses.create(model="demo-claude", input=ask, tools=[WEATHER_TOOL])
    assert first.status == "completed"
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "fake"}

    # Streamed, the arguments arrive as argument deltas the SDK puts together.
    fragments: list[str] = []
    with client.responses.stream(model="demo-claude", input=ask, tools=[WEATHER_TOOL]) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                fragments.append(event.delta)
        streamed = stream.get_final_response()
    assert len(fragments) > 1
    assert json.loads("".join(fragments)) == {"city": "fake"}
    [streamed_call] = [item for item in streamed.output if item.type == "function_call"]
    assert streamed_call.name == "get_weather"
    assert json.loads(streamed_call.arguments) == {"city": "fake"}

    # The function's output goes back as a function_call_output item; the model answers in text.
    answered: list[Any] = [
        *ask,
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    second = client.responses.create(model="demo-claude", input=answered, tools=[WEATHER_TOOL])
    assert second.status == "completed"
    assert second.output_text == fake_text(TOKENS)
    assert [item.type for item in second.output] == ["message"]
    leases_returned(cluster)


def test_upstream_error(cluster: Cluster, client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as whole:
        client.responses.create(model="broken-claude", input="say hello")
    assert whole.value.status_code == 500
    assert "injected failure" in whole.value.message
    with pytest.raises(openai.InternalServerError) as streamed:
        for _ in client.responses.create(model="broken-claude", input="say hello", stream=True):
            pass
    assert streamed.value.status_code == 500
    leases_returned(cluster)
