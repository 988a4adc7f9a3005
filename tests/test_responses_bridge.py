"""
The Responses API bridged over every provider kind, with the official ``openai`` SDK: a Chat
tunnel provider (``chat``), an Ollama run (``llama``) and a CLI-agent run (``cli``), streamed
and not, with a function-tool round trip; the event sequence compared with what a native
Responses upstream (``resp``, the fake's ``--responses-api``) produces for the same question.
The cluster is :func:`tests.test_client_apis.start`'s.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.responses import FunctionToolParam, Response

from iop.testing.fake_cli_agent import reply_text
from iop.testing.fake_openai import fake_text
from tests.harness import Cluster, wait_until
from tests.test_client_apis import TOKENS, WEATHER_PARAMETERS, openai_client, start

WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": WEATHER_PARAMETERS,
    "strict": False,
}


def expected_text(model: str) -> str | None:
    if model in ("chat", "resp"):
        return fake_text(TOKENS)
    if model == "cli":
        return reply_text("say hello", 5)
    return None


def streamed(client: openai.OpenAI, model: str, **request: Any) -> tuple[list[str], Response]:
    """The event types of a streamed answer (each event parsed by the SDK) and its last response."""
    types: list[str] = []
    final: Response | None = None
    for event in client.responses.create(model=model, stream=True, **request):
        types.append(event.type)
        if event.type in ("response.completed", "response.incomplete", "response.failed"):
            final = event.response
    assert final is not None, types
    Response.model_validate(final.model_dump())
    return types, final


@pytest.mark.parametrize("model", ["chat", "llama", "cli"])
def test_responses_stream_and_whole(cluster: Cluster, model: str) -> None:
    start(cluster)
    client = openai_client(cluster)
    whole = client.responses.create(model=model, input="say hello", instructions="be brief")
    Response.model_validate(whole.model_dump())
    assert whole.status == "completed"
    assert whole.output_text
    if expected_text(model) is not None:
        assert whole.output_text == expected_text(model)
    types, final = streamed(client, model, input="say hello", instructions="be brief")
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert final.output_text == whole.output_text
    if model != "cli":
        assert final.usage is not None and final.usage.output_tokens > 0
    # The SDK's accumulating stream helper checks item identities as it goes.
    with client.responses.stream(model=model, input="say hello") as stream:
        accumulated = stream.get_final_response()
    assert accumulated.output_text == whole.output_text
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 5, "leases returned")
    wait_until(lambda: cluster.provider("p-llama")["in_flight"] == 0, 5, "leases returned")


@pytest.mark.parametrize("model", ["chat", "llama"])
def test_responses_tool_round_trip(cluster: Cluster, model: str) -> None:
    start(cluster)
    client = openai_client(cluster)
    question: Any = {"role": "user", "content": "weather in Seoul?"}
    first = client.responses.create(model=model, input=[question], tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert call.call_id
    types, streamed_first = streamed(client, model, input=[question], tools=[WEATHER])
    assert "response.function_call_arguments.done" in types
    assert [i.type for i in streamed_first.output] == [i.type for i in first.output]
    conversation: Any = [
        question,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    second = client.responses.create(model=model, input=conversation, tools=[WEATHER])
    assert second.status == "completed"
    assert second.output_text
    assert not [item for item in second.output if item.type == "function_call"]
    types, final = streamed(client, model, input=conversation, tools=[WEATHER])
    assert final.output_text == second.output_text


def test_cli_agent_answers_tools_in_text(cluster: Cluster) -> None:
    """A CLI agent runs its own tools: a request with function tools gets its text answer."""
    start(cluster)
    answer = openai_client(cluster).responses.create(
        model="cli", input="say hello", tools=[WEATHER]
    )
    assert answer.output_text == reply_text("say hello", 5)


def test_bridged_event_sequence_matches_a_native_upstream(cluster: Cluster) -> None:
    start(cluster)
    client = openai_client(cluster)
    native, native_final = streamed(client, "resp", input="say hello")
    bridged, bridged_final = streamed(client, "chat", input="say hello")
    assert bridged == native
    assert bridged_final.output_text == native_final.output_text == fake_text(TOKENS)
    assert [i.type for i in bridged_final.output] == [i.type for i in native_final.output]


def test_refusals(cluster: Cluster) -> None:
    start(cluster)
    client = openai_client(cluster)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="chat", input="hi", previous_response_id="resp_1")
    assert refused.value.param == "previous_response_id"
    # The same refusal on a native Messages provider (bridged to Chat, then to Messages:
    # tests/test_responses_over_messages.py), before anything reaches it.
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="native", input="hi", previous_response_id="resp_1")
    assert refused.value.param == "previous_response_id"
