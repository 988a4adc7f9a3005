"""
A request id from the client to the provider, through real processes: an Edge and a Node (JSON
logs, a usage ledger), the fake OpenAI/Anthropic upstream and the fake Ollama, the official
openai and anthropic SDKs.

One id per request, the client's when sane: the SDKs' ``_request_id`` and raw headers show it;
the Edge's access log line, the ledger row, the node's JSON log lines and its run store row (a
run) name it; the upstream received it as ``x-request-id`` (an OpenAI-protocol profile; not the
Anthropic one, by default). A hostile id is replaced, and never echoed.
"""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from tests.harness import CLIENT_KEY, Cluster, wait_until

NEW_ID = re.compile(r"req_[0-9A-HJKMNP-TV-Z]{26}\Z")
CLIENT_ID = "client-7f3a:session-42.turn-3"
HOSTILE = "x" * 129
PROFILES = [
    {
        "name": "openai-chat",
        "driver": "openai_chat",
        "operations": {"chat_completions": "/chat/completions"},
        "capabilities": ["chat", "streaming"],
    },
    {
        "name": "anthropic-native",
        "driver": "anthropic_messages",
        "operations": {"messages": "/messages", "count_tokens": "/messages/count_tokens"},
        "capabilities": ["messages", "streaming", "count_tokens"],
    },
]


def start(cluster: Cluster) -> int:
    openai_port = cluster.start_fake(
        "fake_openai", "--delay-ms", "1", "--tokens", "4", "--anthropic-api"
    )
    ollama_port = cluster.start_fake("fake_ollama", "--delay-ms", "1", "--tokens", "4")
    base_url = f"http://127.0.0.1:{openai_port}/v1"
    cluster.write_edge_config(
        protocol_profiles=PROFILES,
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": [
                    {"name": "fake-openai", "type": "openai_compat", "base_url": base_url},
                    {"name": "fake-native", "type": "openai_compat", "base_url": base_url},
                    {
                        "name": "fake-ollama",
                        "type": "ollama",
                        "base_url": f"http://127.0.0.1:{ollama_port}",
                    },
                ],
                "providers": [
                    {
                        "id": "p-chat",
                        "adapter": "fake-openai",
                        "category": "api",
                        "models": ["demo-model"],
                        "profile": "openai-chat",
                    },
                    {
                        "id": "p-native",
                        "adapter": "fake-native",
                        "category": "api",
                        "models": ["claude-fake"],
                        "profile": "anthropic-native",
                    },
                    {
                        "id": "p-llama",
                        "adapter": "fake-ollama",
                        "category": "local_inference",
                        "models": ["llama3.2"],
                    },
                ],
            }
        ],
        models=[
            {"id": "chat", "providers": ["p-chat"], "default_max_tokens": 32},
            {"id": "native", "providers": ["p-native"]},
            {"id": "llama", "providers": ["p-llama"], "default_max_tokens": 32},
        ],
        openai=cluster.client_api(),
        usage={"currency": "USD", "ledger": {"path": "usage.sqlite3"}},
        logging={"format": "json"},
    )
    cluster.write_node_config(logging={"format": "json"})
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return openai_port


def json_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def upstream_ids(port: int) -> list[str | None]:
    url = f"http://127.0.0.1:{port}/_fake/requests"
    with urllib.request.urlopen(url, timeout=5) as response:
        shown = json.loads(response.read())["requests"]
    return [r["headers"].get("x-request-id") for r in shown]


def test_one_id_from_the_client_to_the_provider(cluster: Cluster) -> None:
    port = start(cluster)
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    ask: Any = [{"role": "user", "content": "hello"}]

    # A client's own id, kept: in the raw headers and the SDK's _request_id.
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=ask, extra_headers={"x-request-id": CLIENT_ID}
    )
    assert raw.headers.get_list("x-request-id") == [CLIENT_ID]
    assert raw.parse()._request_id == CLIENT_ID
    # None sent: a new one; streamed too.
    made = client.chat.completions.create(model="chat", messages=ask)
    assert made._request_id is not None and NEW_ID.match(made._request_id), made._request_id
    with client.chat.completions.with_streaming_response.create(
        model="chat", messages=ask, stream=True
    ) as streamed:
        stream_id = streamed.headers["x-request-id"]
        assert NEW_ID.match(stream_id)
        assert b"[DONE]" in b"".join(streamed.iter_bytes())
    # Over a run (Ollama), and a hostile id replaced, never echoed.
    over_run = client.chat.completions.with_raw_response.create(
        model="llama", messages=ask, extra_headers={"x-request-id": HOSTILE}
    )
    run_id = over_run.headers["x-request-id"]
    assert NEW_ID.match(run_id) and HOSTILE not in over_run.text
    # An error: the SDK's exception and the body name the same id.
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="nope", messages=ask)
    assert refused.value.request_id is not None and NEW_ID.match(refused.value.request_id)
    assert refused.value.response.json()["request_id"] == refused.value.request_id

    # The Anthropic SDK reads request-id.
    claude = anthropic.Anthropic(
        base_url=cluster.client_url, api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    message = claude.messages.create(
        model="native", max_tokens=32, messages=[{"role": "user", "content": "hello"}]
    )
    native_id = message._request_id
    assert native_id is not None and NEW_ID.match(native_id), native_id
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(
            model="nope", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.request_id is not None
    assert missing.value.response.json()["request_id"] == missing.value.request_id
    assert missing.value.response.headers["x-request-id"] == missing.value.request_id

    # The upstream saw the OpenAI-protocol ids, not the Anthropic-protocol one (the default).
    seen = upstream_ids(port)
    assert CLIENT_ID in seen and made._request_id in seen and stream_id in seen, seen
    assert native_id not in seen and None in seen, seen

    # The Edge's access log lines.
    daemons = {d.name: d for d in cluster.daemons}
    edge, node = daemons["edge"], daemons["node"]

    def accessed() -> set[str]:
        lines = json_events(edge.output())
        return {e.get("request_id", "") for e in lines if e.get("namespace") == "iop.edge.access"}

    every = {CLIENT_ID, made._request_id, stream_id, run_id, native_id, refused.value.request_id}
    wait_until(lambda: every <= accessed(), 10, "every id in the access log")

    # The usage ledger's rows (written in batches, each second).
    ledger = cluster.root / "usage.sqlite3"

    def recorded() -> set[str]:
        if not ledger.exists():
            return set()
        db = sqlite3.connect(ledger)
        try:
            return {row[0] for row in db.execute("SELECT request_id FROM usage")}
        finally:
            db.close()

    wait_until(lambda: every <= recorded(), 10, "every id in the usage ledger")

    # The node: its run store row for the run, its JSON log lines for the tunnel and the run.
    store = sqlite3.connect(cluster.root / "node.db")
    try:
        rows = {row[0] for row in store.execute("SELECT request_id FROM runs")}
    finally:
        store.close()
    assert run_id in rows, rows
    logged = {e.get("request_id") for e in json_events(node.output()) if "run_id" in e}
    assert {CLIENT_ID, made._request_id, stream_id, run_id, native_id} <= logged, logged
    assert HOSTILE not in edge.output() + node.output()
