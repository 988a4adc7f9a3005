"""
Live config refresh under load, real processes: a real Edge, two real nodes, the official
``openai`` SDK streaming from many threads while requests queue. While they run, edge.yaml is
edited and applied (``POST /config/refresh``) again and again — capacity lowered and raised, a
provider disabled and re-enabled, the model moved to the other node's provider and back. No
request is lost or duplicated: every client gets exactly one outcome (the whole answer), the
upstream answered each request once, and every counter converges to 0.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from iop.testing.fake_openai import fake_text
from tests.harness import ChatStreams, Cluster, wait_until

TOKENS = 10
REQUESTS = 24


def provider(pid: str, capacity: int) -> dict[str, Any]:
    return {
        "id": pid,
        "adapter": "fake-openai",
        "category": "api",
        "models": ["demo-model"],
        "capacity": capacity,
        "max_queue": REQUESTS,
        "queue_timeout_sec": 120,
    }


def node(node_id: str, token_var: str, upstream: int) -> dict[str, Any]:
    return {
        "id": node_id,
        "token": "${" + token_var + "}",
        "adapters": [
            {
                "name": "fake-openai",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{upstream}/v1",
                "max_concurrency": 16,
            }
        ],
        "providers": [provider(f"{node_id}-chat", 2)],
    }


def apply(cluster: Cluster, path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    request = urllib.request.Request(
        cluster.admin + "/config/refresh",
        data=json.dumps({"mode": "apply"}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document = json.loads(response.read())
    assert document["result"] == "applied", document


def providers_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for n in data["nodes"] for p in n["providers"]}


def capacity(pid: str, value: int) -> Callable[[dict[str, Any]], None]:
    return lambda data: providers_of(data)[pid].update(capacity=value)


def enabled(pid: str, value: bool) -> Callable[[dict[str, Any]], None]:
    return lambda data: providers_of(data)[pid].update(enabled=value)


def model_on(*pids: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["models"][0].update(providers=list(pids))


def test_applies_under_load_lose_and_duplicate_nothing(cluster: Cluster) -> None:
    cluster.env["IOP_TEST_NODE_B_TOKEN"] = secrets.token_urlsafe(24)
    upstream = cluster.start_fake("fake_openai", "--delay-ms", "60", "--tokens", str(TOKENS))
    path = cluster.write_edge_config(
        nodes=[
            node("a", "IOP_TEST_NODE_TOKEN", upstream),
            node("b", "IOP_TEST_NODE_B_TOKEN", upstream),
        ],
        models=[{"id": "m", "providers": ["a-chat", "b-chat"]}],
        openai=cluster.client_api(),
    )
    cluster.write_node_config("node-a")
    cluster.write_node_config("node-b", token="${IOP_TEST_NODE_B_TOKEN}")
    cluster.start_edge()
    cluster.start_node("node-a")
    cluster.start_node("node-b")
    wait_until(lambda: cluster.node_connected("a") and cluster.node_connected("b"), 20, "nodes")

    chats = ChatStreams(cluster, REQUESTS, "m").start(gap=0.02)
    wait_until(lambda: cluster.provider("a-chat")["queued"] > 0, 20, "requests queueing")
    for change in (
        capacity("a-chat", 1),  # below in_flight: drains
        capacity("a-chat", 4),  # raised: the queue is served at once
        enabled("a-chat", False),  # out of rotation: its waiters move to b
        enabled("a-chat", True),
        model_on("b-chat"),  # the model moves to node b
        model_on("a-chat", "b-chat"),
        capacity("b-chat", 1),
        capacity("b-chat", 3),
    ):
        apply(cluster, path, change)
        time.sleep(0.3)
    results = chats.join(120)

    assert len(results) == REQUESTS, results
    failures = [error for _, error in results if error is not None]
    assert failures == [], failures
    assert all(text == fake_text(TOKENS) for text, _ in results), results
    stats = cluster.fake_stats(upstream)
    # Each request reached the upstream once, and only once.
    assert stats["total_requests"] == REQUESTS, stats
    assert stats["completed_responses"] == REQUESTS, stats

    def settled() -> bool:
        return all((p["in_flight"], p["queued"]) == (0, 0) for p in cluster.status()["providers"])

    wait_until(settled, 10, "counters at 0")
    final = yaml.safe_load(path.read_text())
    status = {p["id"]: p for p in cluster.status()["providers"]}
    assert status["b-chat"]["capacity"] == providers_of(final)["b-chat"]["capacity"] == 3
