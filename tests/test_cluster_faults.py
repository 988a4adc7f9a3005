"""
Two Edges in one cluster under the faults that used to stop it or break its capacity, with real
Edge and node processes, a real ``redis-server`` and the fake OpenAI upstream counting how many
answers it serves at once:

- Redis hung (SIGSTOP) for 3 s, 7 s and 30 s under load: both Edges serve again within 2 s of
  Redis answering, every time, and each Edge's log says once that Redis was lost and once that
  it came back. (Before, a reconnect whose AUTH timed out stopped the reconnecting for good:
  both Edges answered 503 until restarted.)
- An Edge frozen (SIGSTOP) past the lease TTL, at the smallest TTL the config allows for the
  nodes' heartbeat timeout, while it holds the only slot of a capacity-1 provider: the other
  Edge is granted the slot only after the node has cancelled the frozen Edge's work, so the
  upstream never runs two answers at once.
- Redis restarted (killed, back empty) for less than a third of the TTL while streams run on
  both Edges: no request is ended, no lease lost.
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import time
from typing import Any

from iop.testing.ports import free_port
from tests.conftest import RedisServer
from tests.harness import OPENAI_CHAT_PROFILE, Cluster, wait_until
from tests.test_cluster_edges import (
    TTL,
    Edge,
    both_ready,
    chat,
    chat_node,
    cluster_section,
    settled,
    start_edge,
    stream_in_thread,
    two_edges,
    write_node,
    write_second_edge,
)

# Both Edges serve again within this long of Redis answering.
RECOVERY_SEC = 2.0
LOST = "refusing leases until Redis answers"
BACK = "Redis answers again"


def first_success(edge: Edge, since: float, limit: float) -> float:
    """Seconds from ``since`` until ``edge`` answered a chat request 200 (asking every 50 ms)."""
    deadline = since + limit
    while time.monotonic() < deadline:
        try:
            code, _ = chat(edge.url, timeout=5)
        except OSError:
            code = 0
        if code == 200:
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"{edge.name} did not serve within {limit:g}s of Redis answering")


class Load:
    """Clients asking both Edges in a loop until stopped; every answer's status kept."""

    def __init__(self, edges: tuple[Edge, ...], clients: int) -> None:
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(edges[i % len(edges)],), daemon=True)
            for i in range(clients)
        ]

    def _run(self, edge: Edge) -> None:
        while not self._stop.is_set():
            try:
                code, _ = chat(edge.url, timeout=10)
            except OSError:
                code = 0
            self.codes.append(code)
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


def holds(edge: Edge, leases: int) -> bool:
    return bool(sum(p["in_flight"] for p in edge.status()["providers"]) == leases)


def count(edge: Edge, text: str) -> int:
    assert edge.daemon is not None
    return edge.daemon.output().count(text)


def test_redis_hung_3_7_30_seconds_both_edges_recover_at_once(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, up_a, up_b = two_edges(cluster, redis_server, delay_ms=30)
    for edge in (a, b):
        first_success(edge, time.monotonic(), 10)
    for rounds, hang in enumerate((3.0, 7.0, 30.0), start=1):
        with Load((a, b), clients=6) as load:
            time.sleep(0.5)
            redis_server.pause()
            time.sleep(hang)
            redis_server.resume()
            answering = time.monotonic()
            took = {edge.name: first_success(edge, answering, 15) for edge in (a, b)}
        assert all(t < RECOVERY_SEC for t in took.values()), (hang, took)
        assert 200 in load.codes and set(load.codes) <= {200, 503}, (hang, set(load.codes))
        for edge in (a, b):
            assert edge.status()["cluster"]["redis"] == "up", edge.name
            # Said once each per outage: lost (warn), back (info).
            assert (count(edge, LOST), count(edge, BACK)) == (rounds, rounds), (
                hang,
                edge.name,
            )
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), TTL + 5, f"{edge.name} counters at zero")
    for up in (up_a, up_b):
        assert cluster.fake_stats(up)["max_active_answers"] <= 4
    for edge in (a, b):
        assert edge.daemon is not None
        log = edge.daemon.output()
        assert "could not auth" not in log
        assert not re.search(r"refused this Edge", log)


def one_provider_two_edges(
    cluster: Cluster, redis: RedisServer, *, tokens: int, delay_ms: int
) -> tuple[Edge, Edge, int]:
    """Edges A and B (one cluster at the smallest TTL allowed), one node dialing both, its one
    provider of capacity 1 in front of the fake upstream (whose port is returned)."""
    cluster.env["IOP_TEST_REDIS_PASSWORD"] = redis.password
    upstream = cluster.start_fake(
        "fake_openai", "--tokens", str(tokens), "--delay-ms", str(delay_ms)
    )
    a = Edge("edge", cluster.node_port, cluster.admin_port, cluster.client_port)
    b = Edge("edge-b", free_port(), free_port(), free_port())
    node = chat_node("node-a", "IOP_TEST_NODE_TOKEN", upstream, capacity=1)
    node["providers"][0]["queue_timeout_sec"] = 60
    path = cluster.write_edge_config(
        protocol_profiles=[OPENAI_CHAT_PROFILE],
        nodes=[node],
        models=[{"id": "chat", "providers": ["node-a-chat"], "default_max_tokens": 64}],
        openai=cluster.client_api(),
        cluster=cluster_section(redis, "edge-a"),
    )
    write_second_edge(cluster, path, b)
    for edge in (a, b):
        start_edge(cluster, edge)
    write_node(cluster, "node", "IOP_TEST_NODE_TOKEN", (a, b))
    cluster.start_node("node")
    for edge in (a, b):
        wait_until(functools.partial(edge.ready, "node-a"), 30, f"the node ready on {edge.name}")
    return a, b, upstream


def test_an_edge_frozen_past_the_ttl_never_lets_capacity_be_exceeded(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """
    A holds the only slot with a long stream and freezes for longer than the TTL; B's client
    waits for the slot. The node stops hearing A and cancels its work at its heartbeat timeout,
    before A's lease (last renewed at most a third of a TTL before the freeze) can expire and be
    granted to B: the upstream never serves two answers at once.
    """
    a, b, upstream = one_provider_two_edges(cluster, redis_server, tokens=40, delay_ms=250)
    held: list[Any] = []
    stream_in_thread(a.url, held, max_tokens=40)  # ~10 s of answer
    wait_until(lambda: cluster.fake_stats(upstream)["active_answers"] == 1, 10, "A streams")
    time.sleep(TTL / 3)  # any phase of A's renewal cycle will do; this one is mid-cycle
    waiting: list[Any] = []
    waiter = stream_in_thread(b.url, waiting, max_tokens=4)
    wait_until(lambda: sum(p["queued"] for p in b.status()["providers"]) == 1, 10, "B waits")
    assert a.daemon is not None
    a.daemon.signal(signal.SIGSTOP)
    try:
        waiter.join(TTL + 15)
        assert waiting and waiting[0][0] == 200, waiting
        assert "data: [DONE]" in waiting[0][1]["stream"]
    finally:
        a.daemon.signal(signal.SIGCONT)
    stats = cluster.fake_stats(upstream)
    assert stats["max_active_answers"] == 1, stats
    # A, thawed: its request was ended (the node cancelled it); the node comes back to it.
    wait_until(lambda: held != [], 20, "A's client answered")
    wait_until(lambda: a.ready("node-a"), 30, "the node back on A")
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), TTL + 10, f"{edge.name} counters at zero")
    assert cluster.fake_stats(upstream)["max_active_answers"] == 1


def test_a_redis_restart_shorter_than_a_third_of_the_ttl_ends_no_request(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, up_a, up_b = two_edges(cluster, redis_server, delay_ms=400)
    for rounds in range(3):
        results: list[Any] = []
        threads = [
            stream_in_thread(edge.url, results, max_tokens=16)  # ~6.4 s each
            for edge in (a, b)
            for _ in range(3)
        ]
        for edge in (a, b):
            wait_until(functools.partial(holds, edge, 3), 10, f"streams on {edge.name}")
        time.sleep(rounds * TTL / 9)  # a different phase of the renewal cycle each round
        assert redis_server.proc is not None
        down = time.monotonic()
        redis_server.proc.kill()
        redis_server.proc.wait(5)
        time.sleep(max(0.0, TTL / 3 - 0.5 - (time.monotonic() - down)))
        redis_server.start()
        assert time.monotonic() - down < TTL / 3
        for t in threads:
            t.join(40)
        assert [code for code, _ in results] == [200] * 6, results
        assert all("data: [DONE]" in body["stream"] for _, body in results)
        for edge in (a, b):
            assert edge.status()["cluster"]["leases_lost"] == 0, edge.name
        for edge in (a, b):
            wait_until(functools.partial(settled, edge), TTL + 5, f"{edge.name} at zero")
    for up in (up_a, up_b):
        assert cluster.fake_stats(up)["max_active_answers"] <= 4
    assert both_ready(a) and both_ready(b)
