"""
Client keys added, disabled and removed by a live config refresh, real processes: a real Edge
and node (twistd, TLS) in front of the fake OpenAI upstream, the official ``openai`` and
``anthropic`` SDKs as the clients, edge.yaml edited and ``POST /config/refresh`` applied as an
operator would.

- A key added to ``openai.auth.keys`` works on both surfaces as soon as the refresh answers
  ``applied``; nothing restarts (the Edge process and its node session are the same).
- A key removed while a stream made with it is in flight: the stream finishes whole (a key is
  checked when a request arrives, not while it runs), and the key's next request is a 401 in the
  surface's error shape.
- ``disabled: true`` refuses the key the same way, and taking it out again lets it back in.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

from iop.testing.fake_openai import fake_text
from tests.harness import Cluster, wait_until

TOKENS = 24


def secret(name: str) -> str:
    return f"sk-live-{name}"


def digest(name: str) -> str:
    return hashlib.sha256(secret(name).encode()).hexdigest()


def refresh(cluster: Cluster) -> dict[str, Any]:
    request = urllib.request.Request(
        cluster.admin + "/config/refresh",
        data=json.dumps({"mode": "apply"}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


def set_keys(path: Path, keys: list[dict[str, Any]]) -> None:
    config = yaml.safe_load(path.read_text())
    config["openai"]["auth"]["keys"] = keys
    path.write_text(yaml.safe_dump(config))


def chat(cluster: Cluster, name: str) -> str:
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=secret(name), max_retries=0, timeout=30
    )
    answer = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}]
    )
    return answer.choices[0].message.content or ""


def message(cluster: Cluster, name: str) -> str:
    client = anthropic.Anthropic(
        base_url=cluster.client_url, api_key=secret(name), max_retries=0, timeout=30
    )
    answer = client.messages.create(
        model="chat", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    return "".join(block.text for block in answer.content if block.type == "text")


@pytest.fixture
def edge(cluster: Cluster) -> tuple[Cluster, Path, int]:
    upstream = cluster.start_fake("fake_openai", "--tokens", str(TOKENS), "--delay-ms", "60")
    api = cluster.client_api()
    api["auth"]["keys"] = [{"name": "old", "key_sha256": digest("old")}]
    path = cluster.write_chat_edge_config(upstream, openai=api)
    edge = cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return cluster, path, edge.proc.pid if edge.proc else 0


def test_a_key_added_and_removed_live_while_its_stream_runs(
    edge: tuple[Cluster, Path, int],
) -> None:
    cluster, path, pid = edge
    with pytest.raises(openai.AuthenticationError):
        chat(cluster, "new")

    set_keys(
        path,
        [
            {"name": "old", "key_sha256": digest("old")},
            {"name": "new", "key_sha256": digest("new")},
        ],
    )
    assert refresh(cluster)["result"] == "applied"
    assert chat(cluster, "new") == fake_text(TOKENS)
    assert message(cluster, "new") == fake_text(TOKENS)

    # A stream with the old key, its first chunk read; then the key goes.
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=secret("old"), max_retries=0, timeout=60
    )
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    chunks = iter(stream)
    text = ""
    while not text:
        chunk = next(chunks)
        text += "".join(c.delta.content or "" for c in chunk.choices)

    set_keys(path, [{"name": "new", "key_sha256": digest("new")}])
    assert refresh(cluster)["result"] == "applied"
    with pytest.raises(openai.AuthenticationError) as refused:
        chat(cluster, "old")
    assert refused.value.status_code == 401
    with pytest.raises(anthropic.AuthenticationError) as refused_messages:
        message(cluster, "old")
    assert refused_messages.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]

    for chunk in chunks:
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert text == fake_text(TOKENS), "the removed key's stream in flight finished whole"
    assert chat(cluster, "new") == fake_text(TOKENS)

    # Same process: nothing restarted.
    [edge_daemon] = [d for d in cluster.daemons if d.proc is not None and d.proc.pid == pid]
    assert edge_daemon.running()
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 10, "leases back to zero")


def test_a_key_disabled_and_enabled_live(edge: tuple[Cluster, Path, int]) -> None:
    cluster, path, _ = edge
    assert chat(cluster, "old") == fake_text(TOKENS)
    set_keys(path, [{"name": "old", "key_sha256": digest("old"), "disabled": True}])
    assert refresh(cluster)["result"] == "applied"
    with pytest.raises(openai.AuthenticationError):
        chat(cluster, "old")
    set_keys(path, [{"name": "old", "key_sha256": digest("old")}])
    assert refresh(cluster)["result"] == "applied"
    assert chat(cluster, "old") == fake_text(TOKENS)
