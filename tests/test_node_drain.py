"""
A node that drains on SIGTERM, and an Edge whose readiness route shows its own drain, with real
``twistd`` processes: two nodes serving one model (a stopping node's streams complete, new ones
go to the other node, it exits after its last one, the leases come back to zero); one node only,
restarted while requests arrive (they wait and the restarted node serves them); the drain bound
cutting a long stream with an error; an Edge's ``/readyz`` 503 while it drains.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from tests.harness import CLIENT_KEY, Cluster, wait_until
from tests.test_pool import Requests, counters, node, start_two_nodes


def node_state(cluster: Cluster, node_id: str) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {n["id"]: n for n in cluster.status()["nodes"]}
    return nodes[node_id]


def test_sigterm_drains_streams_complete_new_work_goes_elsewhere(cluster: Cluster) -> None:
    start_two_nodes(cluster, delay_ms=60)  # 40 tokens: ~2.4 s a run
    node_a = next(d for d in cluster.daemons if d.name == "node")
    first = Requests(cluster, 2)
    wait_until(lambda: all(v[0] == 1 for v in counters(cluster).values()), 10, "a run on each node")
    node_a.signal(signal.SIGTERM)
    wait_until(lambda: node_state(cluster, "node-a")["state"] == "draining", 5, "node-a draining")
    a = node_state(cluster, "node-a")
    assert a["connected"] is True and isinstance(a["draining_since_unix_ms"], int)
    # Its run in flight still counts on it; new work goes to node-b (queued behind its run).
    assert counters(cluster)["node-a-chat"][0] == 1
    later = Requests(cluster, 2)
    results = first.join(30) + later.join(30)
    assert [r[-1]["type"] for r in results] == ["complete"] * 4, results
    assert node_a.wait(10) == 0
    wait_until(lambda: not cluster.node_connected("node-a"), 5, "node-a gone")
    wait_until(lambda: all(v == (0, 0) for v in counters(cluster).values()), 5, "counters at 0")
    log = node_a.output()
    assert "node draining" in log and "node drained" in log, log


def test_single_node_restart_loses_nothing_that_fits_the_queue(cluster: Cluster) -> None:
    port = cluster.start_fake("fake_openai", "--delay-ms", "20", "--tokens", "20")
    cluster.write_edge_config(
        nodes=[node("node-a", "IOP_TEST_NODE_TOKEN", port)],
        models=[{"id": "pool", "providers": ["node-a-chat"]}],
    )
    cluster.start_edge()
    first = cluster.start_node("node")
    wait_until(cluster.node_connected, 20, "node-a connected")
    running = Requests(cluster, 1)
    wait_until(lambda: counters(cluster)["node-a-chat"][0] == 1, 10, "a run in flight")
    first.signal(signal.SIGTERM)
    wait_until(lambda: node_state(cluster, "node-a")["state"] == "draining", 5, "draining")
    # Requests arriving while the node drains and restarts wait in the queue.
    waiting = Requests(cluster, 3)
    assert first.wait(15) == 0
    time.sleep(0.5)
    cluster.start_node("node")
    results = running.join(30) + waiting.join(40)
    assert [r[-1]["type"] for r in results] == ["complete"] * 4, results
    wait_until(lambda: all(v == (0, 0) for v in counters(cluster).values()), 5, "counters at 0")


def test_drain_bound_cuts_a_long_stream(cluster: Cluster) -> None:
    port = cluster.start_fake("fake_openai", "--delay-ms", "100", "--tokens", "60")  # ~6 s
    cluster.write_edge_config(
        nodes=[node("node-a", "IOP_TEST_NODE_TOKEN", port)],
        models=[{"id": "pool", "providers": ["node-a-chat"]}],
    )
    cluster.write_node_config("node", drain_timeout_sec=1)
    cluster.start_edge()
    daemon = cluster.start_node("node")
    wait_until(cluster.node_connected, 20, "node-a connected")
    running = Requests(cluster, 1)
    wait_until(lambda: counters(cluster)["node-a-chat"][0] == 1, 10, "a run in flight")
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(10) == 0
    assert time.monotonic() - started < 4
    [result] = running.join(10)
    assert result[-1]["type"] == "error", result
    assert "disconnected" in result[-1]["error"]
    assert "drain bound of 1" in daemon.output()
    wait_until(lambda: all(v == (0, 0) for v in counters(cluster).values()), 5, "counters at 0")


def _readyz(cluster: Cluster) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(cluster.admin + "/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_edge_readyz_503_while_draining(cluster: Cluster) -> None:
    port = cluster.start_fake("fake_openai", "--delay-ms", "100", "--tokens", "30")  # ~3 s
    cluster.write_chat_edge_config(port)
    edge = cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    assert _readyz(cluster) == (200, {"status": "ready"})
    assert cluster.status()["edge"]["draining"] is False

    answered: list[int] = []

    def stream() -> None:
        request = urllib.request.Request(
            cluster.client_url + "/v1/chat/completions",
            data=json.dumps(
                {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            answered.append(response.status)

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 1, 10, "a stream in flight")
    edge.signal(signal.SIGTERM)
    wait_until(lambda: _readyz(cluster)[0] == 503, 5, "readyz 503")
    assert _readyz(cluster) == (503, {"status": "draining"})
    assert cluster.status()["edge"]["draining"] is True
    client.join(30)
    assert answered == [200]
    assert edge.wait(15) in (0, -signal.SIGTERM)  # twistd ends by the signal it got
