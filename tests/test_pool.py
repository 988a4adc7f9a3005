"""
The provider pool end to end: two real nodes, one model over both with capacity 1 each, runs
submitted concurrently through the admin surface (normalized runs on the pooled providers).
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from typing import Any

from tests.harness import Cluster, wait_until

HEARTBEAT_TIMEOUT = 3.0


def provider(pid: str) -> dict[str, Any]:
    return {
        "id": pid,
        "adapter": "fake-openai",
        "category": "api",
        "models": ["demo-model"],
        "capacity": 1,
        "max_queue": 4,
        "queue_timeout_sec": 30,
    }


def node(node_id: str, token_var: str, port: int) -> dict[str, Any]:
    return {
        "id": node_id,
        "token": "${" + token_var + "}",
        "adapters": [
            {
                "name": "fake-openai",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "max_concurrency": 2,
            }
        ],
        "providers": [provider(f"{node_id}-chat")],
    }


def start_two_nodes(cluster: Cluster, delay_ms: int) -> int:
    cluster.env["IOP_TEST_NODE_B_TOKEN"] = secrets.token_urlsafe(24)
    port = cluster.start_fake("fake_openai", "--delay-ms", str(delay_ms), "--tokens", "40")
    cluster.write_edge_config(
        nodes=[
            node("node-a", "IOP_TEST_NODE_TOKEN", port),
            node("node-b", "IOP_TEST_NODE_B_TOKEN", port),
        ],
        models=[{"id": "pool", "providers": ["node-a-chat", "node-b-chat"]}],
    )
    cluster.write_node_config("node-b", token="${IOP_TEST_NODE_B_TOKEN}")
    cluster.start_edge()
    cluster.start_node("node")
    cluster.start_node("node-b")
    wait_until(
        lambda: cluster.node_connected("node-a") and cluster.node_connected("node-b"),
        20,
        "both nodes",
    )
    return port


def counters(cluster: Cluster) -> dict[str, tuple[int, int]]:
    return {p["id"]: (p["in_flight"], p["queued"]) for p in cluster.status()["providers"]}


class Requests:
    """``n`` pooled runs submitted concurrently, in a stable arrival order, each read to its end."""

    def __init__(self, cluster: Cluster, n: int) -> None:
        self.results: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.threads = [
            threading.Thread(target=self._run, args=(cluster, i), daemon=True) for i in range(n)
        ]
        for t in self.threads:
            t.start()
            time.sleep(0.1)

    def _run(self, cluster: Cluster, i: int) -> None:
        self.results[i].extend(
            cluster.submit_run({"model": "pool", "input": f"request {i}"}).events()
        )

    def join(self, timeout: float) -> list[list[dict[str, Any]]]:
        for t in self.threads:
            t.join(timeout)
        return self.results


def test_three_requests_two_run_one_queues(cluster: Cluster) -> None:
    start_two_nodes(cluster, delay_ms=50)
    requests = Requests(cluster, 3)
    wait_until(lambda: sum(q for _, q in counters(cluster).values()) >= 1, 10, "one request queued")
    snap = counters(cluster)
    assert snap["node-a-chat"][0] == 1 and snap["node-b-chat"][0] == 1
    # The queued request is a live candidate on both providers: it counts on each.
    assert snap["node-a-chat"][1] == 1 and snap["node-b-chat"][1] == 1
    results = requests.join(30)
    assert [r[-1]["type"] for r in results] == ["complete"] * 3
    wait_until(lambda: all(v == (0, 0) for v in counters(cluster).values()), 5, "counters at 0")


def test_node_killed_mid_run_queue_drains_to_survivor(cluster: Cluster) -> None:
    start_two_nodes(cluster, delay_ms=100)
    requests = Requests(cluster, 3)
    wait_until(lambda: sum(q for _, q in counters(cluster).values()) >= 1, 10, "one request queued")
    node_b = cluster.daemons[-1]
    node_b.signal(signal.SIGKILL)
    results = requests.join(40)
    outcomes = sorted(r[-1]["type"] for r in results)
    assert outcomes == ["complete", "complete", "error"], results
    errored = next(r for r in results if r[-1]["type"] == "error")
    assert "disconnected" in errored[-1]["error"]
    wait_until(lambda: all(v == (0, 0) for v in counters(cluster).values()), 5, "counters at 0")
    status = {p["id"]: p for p in cluster.status()["providers"]}
    assert status["node-b-chat"]["health"] == "offline"
