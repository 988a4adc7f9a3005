"""
Edges in a cluster (``cluster:`` in edge.yaml) end to end: real Edge and node processes, a real
``redis-server``, the fake OpenAI upstream counting how many requests it serves at once, clients
over the OpenAI-compatible API from many threads.

- One Edge with ``cluster:`` serves like an Edge alone, and the upstream never sees more than
  the provider's capacity.
- Redis gone: the Edge refuses new work at once with a clear 503 (fail closed) and serves again
  when Redis is back; its counters come back to zero.
- Two Edges and two nodes, each node dialing both Edges: 100 concurrent requests through both
  Edges never put more than a provider's capacity on its upstream; kill -9 one Edge under load:
  its clients fail, the other Edge's clients are unaffected, its leases expire within the TTL,
  the nodes keep serving; every counter converges to zero.
"""

from __future__ import annotations

import functools
import json
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from iop.config.cluster import min_lease_ttl
from iop.testing.ports import free_port
from tests.conftest import RedisServer
from tests.harness import (
    CLIENT_KEY,
    OPENAI_CHAT_PROFILE,
    Cluster,
    Daemon,
    port_open,
    wait_until,
)

CAPACITY = 4
# The harness's node heartbeat timeout (node_transport.heartbeat in its edge.yaml), and the
# shortest lease TTL the Edge accepts with it: the tests run at that floor.
HEARTBEAT_TIMEOUT = 3.0
TTL = min_lease_ttl(HEARTBEAT_TIMEOUT)


def chat(
    url: str, *, stream: bool = False, timeout: float = 60, max_tokens: int = 4
) -> tuple[int, dict[str, Any]]:
    """One chat completion; (status, body or error body)."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
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
        "lease_ttl_sec": TTL,
    }


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


def serve_clustered(cluster: Cluster, redis: RedisServer, *, tokens: int, delay_ms: int) -> int:
    """One Edge with ``cluster:`` on ``redis``, its node ready, and the fake upstream it serves
    (``tokens`` per answer, ``delay_ms`` each: requests overlap); the upstream's port."""
    cluster.env["IOP_TEST_REDIS_PASSWORD"] = redis.password
    upstream = cluster.start_fake(
        "fake_openai", "--tokens", str(tokens), "--delay-ms", str(delay_ms)
    )
    write_clustered_config(cluster, upstream, redis)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node ready")
    return upstream


def test_one_clustered_edge_holds_capacity_exactly(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    upstream = serve_clustered(cluster, redis_server, tokens=4, delay_ms=50)
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
    cluster: Cluster, redis_server: RedisServer
) -> None:
    serve_clustered(cluster, redis_server, tokens=4, delay_ms=50)
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


def stream_in_thread(url: str, results: list[Any], max_tokens: int = 8) -> threading.Thread:
    def run() -> None:
        try:
            results.append(chat(url, stream=True, timeout=30, max_tokens=max_tokens))
        except Exception as e:  # a cut stream
            results.append((0, {"error": repr(e)}))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_redis_restarted_empty_under_load_keeps_the_streams(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """Redis killed and back at once, empty, while streams run: the renewals re-assert their
    leases while the table recovers, so the streams complete and nothing is lost."""
    upstream = serve_clustered(cluster, redis_server, tokens=8, delay_ms=400)
    results: list[Any] = []
    threads = [stream_in_thread(cluster.client_url, results) for _ in range(CAPACITY)]
    wait_until(lambda: in_flight(cluster.admin_port) == CAPACITY, 10, "the streams hold leases")
    assert redis_server.proc is not None
    redis_server.proc.kill()
    redis_server.proc.wait(5)
    redis_server.start()
    for t in threads:
        t.join(30)
    assert [code for code, _ in results] == [200] * CAPACITY, results
    assert all("data: [DONE]" in body["stream"] for _, body in results)
    view = status(cluster.admin_port)["cluster"]
    assert view["leases_lost"] == 0, view
    assert cluster.fake_stats(upstream)["max_active_answers"] <= CAPACITY
    wait_until(lambda: in_flight(cluster.admin_port) == 0, 5, "leases returned")


def test_redis_gone_for_a_ttl_ends_the_streams_it_can_no_longer_vouch_for(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """Redis down longer than a lease TTL while streams run: their leases cannot be renewed,
    so the Edge ends them before the leases could expire (never a slot used twice), refuses new
    work meanwhile, and serves again once Redis is back; counters return to zero."""
    upstream = serve_clustered(cluster, redis_server, tokens=20, delay_ms=800)
    results: list[Any] = []
    threads = [stream_in_thread(cluster.client_url, results, max_tokens=20) for _ in range(2)]
    wait_until(lambda: in_flight(cluster.admin_port) == 2, 10, "the streams hold leases")
    redis_server.stop()
    stopped = time.monotonic()
    for t in threads:
        t.join(30)
    ended = time.monotonic() - stopped
    assert [code for code, _ in results] == [0, 0], results
    assert ended < TTL + 1.5, ended  # within the TTL, not at the answer's end
    code, body = chat(cluster.client_url)
    assert (code, body["error"]["code"]) == (503, "cluster_unavailable")
    assert status(cluster.admin_port)["cluster"]["leases_lost"] == 2
    wait_until(lambda: in_flight(cluster.admin_port) == 0, 10, "the cut requests released")
    wait_until(lambda: cluster.fake_stats(upstream)["active_answers"] == 0, 10, "upstream idle")
    redis_server.start()
    wait_until(lambda: chat(cluster.client_url)[0] == 200, 20, "served again")


# -- two Edges, two nodes ------------------------------------------------------------------------


class Edge:
    """One Edge of the two: its ports and process."""

    def __init__(self, name: str, node_port: int, admin_port: int, client_port: int) -> None:
        self.name = name
        self.node_port = node_port
        self.admin_port = admin_port
        self.client_port = client_port
        self.daemon: Daemon | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def status(self) -> dict[str, Any]:
        return status(self.admin_port)

    def ready(self, node_id: str) -> bool:
        try:
            nodes = {n["id"]: n for n in self.status()["nodes"]}
        except OSError:
            return False
        return bool(nodes[node_id]["connected"])


def chat_node(
    node_id: str, token_var: str, upstream: int, capacity: int = CAPACITY
) -> dict[str, Any]:
    return {
        "id": node_id,
        "token": "${" + token_var + "}",
        "adapters": [
            {
                "name": "fake-openai",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{upstream}/v1",
                "max_concurrency": 64,
            }
        ],
        "providers": [
            {
                "id": f"{node_id}-chat",
                "adapter": "fake-openai",
                "category": "api",
                "models": ["demo-model"],
                "profile": "openai-chat",
                "capacity": capacity,
                "max_queue": 200,
            }
        ],
    }


def two_edges(
    cluster: Cluster, redis: RedisServer, *, delay_ms: int, reuse_port: bool = False
) -> tuple[Edge, Edge, int, int]:
    """Edges A and B (one cluster), nodes node-a and node-b each dialing both, each node's
    provider (capacity 4) in front of its own fake upstream; all ready on both Edges. With
    ``reuse_port`` both Edges share A's client port (``openai.reuse_port``)."""
    cluster.env["IOP_TEST_REDIS_PASSWORD"] = redis.password
    cluster.env["IOP_TEST_NODE_B_TOKEN"] = secrets.token_urlsafe(24)
    upstreams = [
        cluster.start_fake("fake_openai", "--tokens", "8", "--delay-ms", str(delay_ms))
        for _ in range(2)
    ]
    a = Edge("edge", cluster.node_port, cluster.admin_port, cluster.client_port)
    b = Edge("edge-b", free_port(), free_port(), a.client_port if reuse_port else free_port())
    path = cluster.write_edge_config(
        protocol_profiles=[OPENAI_CHAT_PROFILE],
        nodes=[
            chat_node("node-a", "IOP_TEST_NODE_TOKEN", upstreams[0]),
            chat_node("node-b", "IOP_TEST_NODE_B_TOKEN", upstreams[1]),
        ],
        models=[
            {
                "id": "chat",
                "providers": ["node-a-chat", "node-b-chat"],
                "default_max_tokens": 64,
            }
        ],
        openai=cluster.client_api(reuse_port=True) if reuse_port else cluster.client_api(),
        cluster=cluster_section(redis, "edge-a"),
    )
    write_second_edge(cluster, path, b)
    for edge in (a, b):
        start_edge(cluster, edge)
    for name, token_var in (("node", "IOP_TEST_NODE_TOKEN"), ("node-b", "IOP_TEST_NODE_B_TOKEN")):
        write_node(cluster, name, token_var, (a, b))
        cluster.start_node(name)
    for edge in (a, b):
        wait_until(functools.partial(both_ready, edge), 30, f"both nodes ready on {edge.name}")
    return a, b, upstreams[0], upstreams[1]


def write_second_edge(cluster: Cluster, path: Path, b: Edge) -> None:
    """edge-b.yaml: the first Edge's config at ``path`` but for B's ids and listeners."""
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    config["edge"] = {"id": "systest-edge-b"}
    config["listen"] = {
        "nodes": f"tcp:{b.node_port}:interface=127.0.0.1",
        "admin": f"tcp:{b.admin_port}:interface=127.0.0.1",
    }
    config["openai"]["listen"] = f"tcp:{b.client_port}:interface=127.0.0.1"
    config["cluster"]["edge_id"] = "edge-b"
    (cluster.root / "edge-b.yaml").write_text(yaml.safe_dump(config))


def both_ready(edge: Edge) -> bool:
    return edge.ready("node-a") and edge.ready("node-b")


def start_edge(cluster: Cluster, edge: Edge) -> None:
    path = cluster.root / f"{edge.name}.yaml"
    edge.daemon = cluster.daemon("iop-edge", path, edge.name).start()
    wait_until(lambda: port_open(edge.admin_port), 20, f"{edge.name} admin port")
    # (A shared port, openai.reuse_port, is joined once the Edge's nodes are ready.)
    if not yaml.safe_load(path.read_text())["openai"].get("reuse_port"):
        wait_until(lambda: port_open(edge.client_port), 20, f"{edge.name} client port")


def write_node(cluster: Cluster, name: str, token_var: str, edges: tuple[Edge, ...]) -> None:
    config = {
        "edges": [
            {
                "host": "127.0.0.1",
                "port": edge.node_port,
                "server_name": "edge.iop.internal",
                "ca_file": "pki/ca.crt",
            }
            for edge in edges
        ],
        "token": "${" + token_var + "}",
        "reconnect": {"max_attempts": 0, "interval_sec": 0.5},
        "store": {"path": f"file:{cluster.root}/{name}.db?cache=shared&mode=rwc"},
    }
    (cluster.root / f"{name}.yaml").write_text(yaml.safe_dump(config))


def concurrently(jobs: list[Any], workers: int) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


def settled(edge: Edge) -> bool:
    """No lease held or waiter queued on this Edge, and none over the cluster as it sees it."""
    try:
        snap = edge.status()
    except OSError:
        return False
    here = sum(p["in_flight"] + p["queued"] for p in snap["providers"])
    everywhere = sum(c["in_flight"] for c in snap["cluster"]["providers"].values())
    return bool(here == 0 and everywhere == 0)


def test_two_edges_hold_each_providers_capacity_exactly(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, up_a, up_b = two_edges(cluster, redis_server, delay_ms=20)
    jobs = [functools.partial(chat, a.url if i % 2 else b.url) for i in range(100)]
    results = concurrently(jobs, 100)
    assert [code for code, _ in results] == [200] * 100, [r for r in results if r[0] != 200][:3]
    stats = [cluster.fake_stats(up_a), cluster.fake_stats(up_b)]
    # Each provider's upstream saw at most its capacity at once, and both were used to it.
    assert [s["max_active_answers"] for s in stats] == [CAPACITY, CAPACITY], stats
    assert sum(s["completed_responses"] for s in stats) == 100
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), 10, f"{edge.name} counters at zero")
    view = a.status()["cluster"]
    assert sorted(e["id"] for e in view["edges"]) == ["edge-a", "edge-b"]
    assert view["leases_lost"] == 0


def test_an_edge_killed_under_load_leaves_the_other_serving(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, up_a, up_b = two_edges(cluster, redis_server, delay_ms=150)  # ~1.2 s per answer
    results: dict[str, list[Any]] = {"a": [], "b": []}

    def run(edge: Edge, key: str) -> None:
        try:
            results[key].append(chat(edge.url, stream=True, timeout=30))
        except Exception as e:  # the killed Edge's clients: reset, refused, a cut stream
            results[key].append((0, {"error": repr(e)}))

    threads = [
        threading.Thread(target=run, args=(edge, key), daemon=True)
        for _ in range(12)
        for edge, key in ((a, "a"), (b, "b"))
    ]
    for t in threads:
        t.start()
    wait_until(lambda: sum(p["in_flight"] for p in a.status()["providers"]) >= 2, 10, "A has work")
    assert a.daemon is not None
    a.daemon.signal(signal.SIGKILL)
    a.daemon.wait(10)
    killed_at = time.monotonic()
    for t in threads:
        t.join(40)
    # The other Edge's clients: every stream complete.
    assert [code for code, _ in results["b"]] == [200] * 12, results["b"]
    assert all("data: [DONE]" in body["stream"] for _, body in results["b"])
    # The killed Edge's clients: failed (or finished before the kill), none left hanging.
    assert len(results["a"]) == 12
    assert any(code == 0 for code, _ in results["a"]), results["a"]
    assert all(code == 0 or "data: [DONE]" in body["stream"] for code, body in results["a"])
    # Its leases were not renewed: within the TTL the other Edge sees none held.
    wait_until(lambda: settled(b), TTL + 5, "the dead Edge's leases expired")
    assert time.monotonic() - killed_at < TTL + 5
    # The nodes keep serving through B.
    codes = [code for code, _ in concurrently([lambda: chat(b.url)] * 8, 8)]
    assert codes == [200] * 8
    for up in (up_a, up_b):
        assert cluster.fake_stats(up)["max_active_answers"] <= CAPACITY
    # A back on the same ports: the nodes register with it again and it serves.
    start_edge(cluster, a)
    wait_until(functools.partial(both_ready, a), 30, "nodes back on A")
    assert chat(a.url)[0] == 200
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), 10, f"{edge.name} counters at zero")
