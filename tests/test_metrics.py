"""
``/metrics`` of a real Edge (twistd, TLS to a real node, a fake OpenAI-compatible upstream)
after known traffic from the official ``openai`` and ``anthropic`` SDKs: every counter equals
the traffic sent, every histogram's count equals the requests it observes, the gauges equal
``/status``, and no key or token appears in the exposition.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, wait_until

TOKENS = 8
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(cluster: Cluster) -> tuple[dict[str, str], Samples]:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=10) as response:
        text = response.read().decode()
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return types, samples


def total(samples: Samples, name: str, **match: str) -> float:
    """The sum of ``name``'s samples whose labels include ``match``."""
    return sum(
        value
        for (sample, labels), value in samples.items()
        if sample == name and all((k, v) in labels for k, v in match.items())
    )


@pytest.fixture
def edge(cluster: Cluster) -> Cluster:
    port = cluster.start_fake("fake_openai", "--delay-ms", "2", "--tokens", str(TOKENS))
    cluster.write_chat_edge_config(port, capacity=2)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return cluster


def test_metrics_count_known_traffic_exactly(edge: Cluster) -> None:
    cluster = edge
    chats, streams, messages = 5, 4, 3
    client = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY, max_retries=0)
    hello: Any = [{"role": "user", "content": "say hello"}]
    for _ in range(chats):
        answer = client.chat.completions.create(model="chat", messages=hello)
        assert answer.choices[0].message.content == fake_text(TOKENS)
    for _ in range(streams):
        chunks = client.chat.completions.create(
            model="chat", messages=hello, stream=True, stream_options={"include_usage": True}
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == fake_text(TOKENS)
    claude = anthropic.Anthropic(base_url=cluster.client_url, api_key=CLIENT_KEY, max_retries=0)
    for _ in range(messages):
        message = claude.messages.create(model="chat", max_tokens=64, messages=hello)
        assert message.content[0].type == "text"
    # Refusals: a wrong key (401), an unknown model (404), a path that is no route (404).
    wrong = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="chat", messages=hello)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=hello)
    request = urllib.request.Request(
        cluster.client_url + "/v1/nothing", headers={"Authorization": f"Bearer {CLIENT_KEY}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 404

    placed = chats + streams + messages
    # The bus delivers a request's event a reactor turn after it ended: wait for the last.
    wait_until(
        lambda: total(scrape(cluster)[1], "iop_requests_total") == placed + 3, 10, "all counted"
    )
    types, samples = scrape(cluster)
    assert types["gen_ai_server_request_duration_seconds"] == "histogram"
    assert types["gen_ai_server_time_to_first_token_seconds"] == "histogram"
    assert types["iop_requests"] == "counter"

    where = {"model": "chat", "provider": "p-chat", "node": "node-a"}
    ok = {**where, "status": "200", "outcome": "complete"}
    assert total(samples, "iop_requests_total", operation="chat", **ok) == chats + streams
    assert (
        total(samples, "iop_requests_total", operation="messages", surface="anthropic", **ok)
        == messages
    )
    # Each generation one duration observation; only the streams a first-token time.
    duration = "gen_ai_server_request_duration_seconds_count"
    assert total(samples, duration, status="200", **where) == placed
    ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert total(samples, ttft, **where) == streams
    tpot = "gen_ai_server_time_per_output_token_seconds_count"
    assert total(samples, tpot, **where) == streams
    # Every placed request waited for its lease (0 s when one was free); the refusals did not.
    assert total(samples, "iop_queue_wait_seconds_count", model="chat") == placed
    # Usage as the upstream reported it: the streams asked for it, the rest get it anyway.
    output = total(samples, "gen_ai_client_token_usage_sum", type="output", **where)
    assert output == TOKENS * placed
    assert total(samples, "gen_ai_client_token_usage_count", type="output", **where) == placed
    # The refusals, by status and code; a refused generation is still a duration observation
    # (with its status), a request that was no route is not.
    errors = "iop_client_errors_total"
    assert total(samples, errors, status="401", code="invalid_api_key") == 1
    assert total(samples, errors, status="404", operation="chat", code="model_not_found") == 1
    assert total(samples, errors, status="404", operation="unrouted") == 1
    assert total(samples, errors) == 3
    assert total(samples, duration, status="401", operation="chat") == 1
    assert total(samples, duration, operation="unrouted") == 0
    # Nothing held: the gauges equal /status, and both are at rest.
    status = cluster.status()
    [provider] = [p for p in status["providers"] if p["id"] == "p-chat"]
    for field in ("capacity", "in_flight", "queued"):
        labels = (("node", "node-a"), ("provider", "p-chat"))
        assert samples[(f"iop_provider_{field}", labels)] == provider[field], field
    assert provider["in_flight"] == 0 and provider["queued"] == 0
    assert samples[("iop_node_connections", (("state", "ready"),))] == 1
    assert samples[("iop_event_bus_dropped_events_total", ())] == 0


def test_no_secret_in_the_exposition(edge: Cluster) -> None:
    cluster = edge
    client = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY, max_retries=0)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    wait_until(lambda: total(scrape(cluster)[1], "iop_requests_total") == 1, 10, "counted")
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for secret in (CLIENT_KEY, cluster.env["IOP_TEST_NODE_TOKEN"], "say hello"):
        assert secret not in text
