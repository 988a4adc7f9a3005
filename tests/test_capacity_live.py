"""
Capacity changed live both ways, real processes: a real Edge and node, one provider on an
adapter that leaves ``max_concurrency`` out (so the node's gate follows the provider's
capacity), 20 concurrent streams through the official ``openai`` SDK while the capacity goes
2 → 5 → 2 by ``POST /config/refresh``. No request gets a 503 (``provider_busy`` was what a raise
used to cause), all 20 complete, the upstream never served more at once than the capacity of
the phase (after a lowering: once the streams in flight drained to it), the node reports the new
limit, and every lease and slot is back to zero.

And the other half: a capacity above an explicit ``max_concurrency`` is refused by
``iop config check`` and by the refresh dry run and apply, naming both paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from iop.testing.fake_openai import fake_text
from tests.harness import ChatStreams, Cluster, wait_until

STREAMS = 20
TOKENS = 16
DELAY_MS = 50


def refresh(cluster: Cluster, mode: str) -> dict[str, Any]:
    request = urllib.request.Request(
        cluster.admin + "/config/refresh",
        data=json.dumps({"mode": mode}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


def edit(path: Path, **provider: Any) -> None:
    data = yaml.safe_load(path.read_text())
    data["nodes"][0]["providers"][0].update(provider)
    path.write_text(yaml.safe_dump(data))


def node_command(cluster: Cluster, kind: str) -> dict[str, Any]:
    request = urllib.request.Request(
        cluster.admin + "/nodes/node-a/commands",
        data=json.dumps({"type": kind}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def node_adapter(cluster: Cluster, kind: str) -> dict[str, Any]:
    adapters: list[dict[str, Any]] = node_command(cluster, kind)["adapters"]
    [adapter] = [a for a in adapters if a["name"] == "fake-openai"]
    return adapter


class Sampler:
    """The upstream's answers in progress, sampled every few ms and tagged with the phase."""

    def __init__(self, cluster: Cluster, port: int) -> None:
        self.cluster, self.port = cluster, port
        self.phase = "2"
        self.samples: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            active = int(self.cluster.fake_stats(self.port)["active_answers"])
            self.samples.append((self.phase, active))
            time.sleep(0.01)

    def of(self, phase: str) -> list[int]:
        return [active for p, active in self.samples if p == phase]


def test_capacity_raised_and_lowered_under_load(cluster: Cluster) -> None:
    upstream = cluster.start_fake(
        "fake_openai", "--delay-ms", str(DELAY_MS), "--tokens", str(TOKENS)
    )
    path = cluster.write_chat_edge_config(upstream, capacity=2)
    edit(path, max_queue=STREAMS, queue_timeout_sec=120)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    # The adapter leaves max_concurrency out: the node's gate is the provider's capacity.
    assert node_adapter(cluster, "usage")["limit"] == 2

    sampler = Sampler(cluster, upstream)
    sampler.start()
    streams = ChatStreams(cluster, STREAMS).start()
    wait_until(lambda: cluster.provider("p-chat")["queued"] >= 10, 20, "streams queueing")
    time.sleep(0.5)

    edit(path, capacity=5)
    raised = refresh(cluster, "apply")
    sampler.phase = "5"
    assert raised["result"] == "applied", raised
    assert [(p["node_id"], p["outcome"]) for p in raised["node_pushes"]] == [
        ("node-a", "applied")
    ], raised
    assert node_adapter(cluster, "capabilities")["capabilities"]["max_concurrency"] == 5
    time.sleep(1.5)
    assert cluster.provider("p-chat")["queued"] > 0, "still queued when lowering"

    edit(path, capacity=2)
    lowered = refresh(cluster, "apply")
    sampler.phase = "2 again"
    assert lowered["result"] == "applied", lowered
    assert node_adapter(cluster, "capabilities")["capabilities"]["max_concurrency"] == 2

    results = streams.join(120)
    sampler.stop()
    assert len(results) == STREAMS, results
    failures = [error for _, error in results if error is not None]
    assert failures == [], failures
    assert all(text == fake_text(TOKENS) for text, _ in results), results

    stats = cluster.fake_stats(upstream)
    assert stats["total_requests"] == stats["completed_responses"] == STREAMS, stats
    assert stats["max_active_answers"] <= 5, stats
    assert max(sampler.of("2")) <= 2, sampler.samples
    assert 2 < max(sampler.of("5")) <= 5, sampler.samples
    # Lowered: the streams in flight finish (none is cut), then never more than 2.
    after = sampler.of("2 again")
    drained = next(i for i, active in enumerate(after) if active <= 2)
    assert max(after[drained:]) <= 2, after

    def settled() -> bool:
        provider = cluster.provider("p-chat")
        return (provider["in_flight"], provider["queued"]) == (0, 0)

    wait_until(settled, 10, "leases back to zero")
    wait_until(lambda: node_adapter(cluster, "usage")["in_use"] == 0, 10, "node slots free")
    assert node_adapter(cluster, "usage")["limit"] == 2
    assert "provider_busy" not in next(d for d in cluster.daemons if d.name == "edge").output()


MESSAGE = "nodes[0].providers[0].capacity: 5 exceeds nodes[0].adapters[0].max_concurrency (2)"


def test_capacity_over_an_explicit_max_concurrency_is_refused(cluster: Cluster) -> None:
    upstream = cluster.start_fake("fake_openai")
    path = cluster.write_chat_edge_config(upstream, capacity=2)
    data = yaml.safe_load(path.read_text())
    data["nodes"][0]["adapters"][0]["max_concurrency"] = 2
    path.write_text(yaml.safe_dump(data))
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    edit(path, capacity=5)
    checked = subprocess.run(
        [sys.executable, "-m", "iop.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
    )
    assert checked.returncode == 1, checked
    assert MESSAGE in checked.stdout + checked.stderr, checked
    assert "leave it out so the adapter follows its providers" in checked.stdout + checked.stderr

    for mode in ("dry_run", "apply"):
        document = refresh(cluster, mode)
        assert document["result"] == "rejected", document
        assert any(MESSAGE in error for error in document["errors"]), document
    assert cluster.provider("p-chat")["capacity"] == 2
    assert node_adapter(cluster, "usage")["limit"] == 2
