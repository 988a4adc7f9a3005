"""
Edges in a cluster (``cluster:`` in edge.yaml) end to end: real Edge and node processes, a real
``redis-server``, the fake OpenAI upstream counting how many requests it serves at once, clients
over the OpenAI-compatible API from many threads.

- One Edge with ``cluster:`` serves like an Edge alone, and the upstream never sees more than
  the provider's capacity.
- Redis gone: the Edge refuses new work at once with a clear 503 (fail closed) and serves again
  when Redis is back; its counters come back to zero.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from tests.conftest import RedisServer
from tests.harness import CLIENT_KEY, Cluster, Daemon, wait_until

CAPACITY = 4


def chat(url: str, *, stream: bool = False, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    """One chat completion; (status, body or error body)."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": stream,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            if stream:
                return response.status, {"stream": raw.decode()}
            return response.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def status(admin_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/status", timeout=5) as r:
        snapshot: dict[str, Any] = json.loads(r.read())
        return snapshot


def in_flight(admin_port: int) -> int:
    return sum(p["in_flight"] for p in status(admin_port)["providers"])


def cluster_section(redis: RedisServer, edge_id: str) -> dict[str, Any]:
    return {
        "redis": f"unix://{redis.socket}",
        "password": "${IOP_TEST_REDIS_PASSWORD}",
        "edge_id": edge_id,
        "lease_ttl_sec": 3,
    }


@pytest.fixture
def upstream(cluster: Cluster, redis_server: RedisServer) -> Iterator[int]:
    """The fake upstream, answering each request after ~0.2 s (so requests overlap)."""
    cluster.env["IOP_TEST_REDIS_PASSWORD"] = redis_server.password
    yield cluster.start_fake("fake_openai", "--tokens", "4", "--delay-ms", "50")


def write_clustered_config(
    cluster: Cluster, upstream: int, redis: RedisServer, edge_id: str = "edge-a"
) -> dict[str, Any]:
    """The one-provider chat config with ``cluster:``; the node's adapter admits far more than
    the provider's capacity, so only the Edges' leases can hold the upstream to it."""
    path = cluster.write_chat_edge_config(
        upstream, capacity=CAPACITY, cluster=cluster_section(redis, edge_id)
    )
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    config["nodes"][0]["adapters"][0]["max_concurrency"] = 64
    path.write_text(yaml.safe_dump(config))
    return config


def start_clustered_edge(cluster: Cluster, upstream: int, redis: RedisServer) -> Daemon:
    write_clustered_config(cluster, upstream, redis)
    return cluster.start_edge()


def test_one_clustered_edge_holds_capacity_exactly(
    cluster: Cluster, redis_server: RedisServer, upstream: int
) -> None:
    start_clustered_edge(cluster, upstream, redis_server)
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node ready")
    wait_until(lambda: status(cluster.admin_port)["cluster"]["redis"] == "up", 10, "redis up")

    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda _: chat(cluster.client_url), range(40)))
    assert [code for code, _ in results] == [200] * 40, results
    stats = cluster.fake_stats(upstream)
    assert stats["max_active_answers"] == CAPACITY, stats
    assert stats["completed_responses"] == 40

    wait_until(lambda: in_flight(cluster.admin_port) == 0, 5, "leases returned")
    view = status(cluster.admin_port)["cluster"]
    assert view["edge_id"] == "edge-a"
    assert view["leases_held_here"] == 0 and view["leases_lost"] == 0
    wait_until(
        lambda: status(cluster.admin_port)["cluster"]["providers"]["p-chat"]["in_flight"] == 0,
        5,
        "cluster view shows no lease held",
    )


def test_redis_gone_refuses_new_work_then_recovers(
    cluster: Cluster, redis_server: RedisServer, upstream: int
) -> None:
    start_clustered_edge(cluster, upstream, redis_server)
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node ready")
    wait_until(lambda: chat(cluster.client_url)[0] == 200, 10, "a first answer")

    redis_server.stop()
    code, body = chat(cluster.client_url)
    assert code == 503, body
    assert body["error"]["code"] == "cluster_unavailable", body
    assert "redis" not in body["error"]["message"].lower()
    wait_until(
        lambda: status(cluster.admin_port)["cluster"]["redis"] == "unreachable",
        5,
        "status says Redis is unreachable",
    )

    redis_server.start()
    wait_until(lambda: chat(cluster.client_url)[0] == 200, 15, "served again")
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: chat(cluster.client_url), range(12)))
    assert [code for code, _ in results] == [200] * 12
    wait_until(lambda: in_flight(cluster.admin_port) == 0, 5, "leases returned")
