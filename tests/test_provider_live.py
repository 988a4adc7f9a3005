"""
Providers added and removed live on a connected node, real processes: a real Edge and node,
two fake OpenAI upstreams behind two adapters of the node (``fake-openai`` serving ``chat`` by
provider ``p-chat``, ``second`` serving ``spare`` by ``p-spare``), streams through the official
``openai`` SDK.

1. ``p-two`` is added on ``second`` and to ``chat`` while streams run on ``p-chat``: the refresh
   applies (the node is pushed ``second``'s larger gate), no stream is cut, and new requests
   spread to ``p-two`` (its upstream serves them).
2. ``p-chat`` is removed while streams run on it: they all complete; ``/status`` shows it
   ``removed``/``draining`` with its leases until they end, then drops it; new requests go to
   ``p-two`` only (the first upstream sees none); every lease is back to zero.
3. A provider on an adapter new on the node is answered ``restart_required``, naming it.

With ``IOP_TEST_CLUSTER=1`` the same runs on the cluster's Redis lease table, whose view then
lists the new provider and drops the removed one.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from iop.testing.fake_openai import fake_text
from tests.conftest import WITH_CLUSTER
from tests.harness import ChatStreams, Cluster, wait_until

TOKENS = 30
DELAY_MS = 60
STREAMS = 4


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


def provider(pid: str, adapter: str, capacity: int = 4) -> dict[str, Any]:
    return {
        "id": pid,
        "adapter": adapter,
        "category": "api",
        "models": ["demo-model"],
        "profile": "openai-chat",
        "capacity": capacity,
        "max_queue": 16,
        "queue_timeout_sec": 60,
    }


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data))


def complete(streams: ChatStreams) -> None:
    results = streams.join(120)
    assert len(results) == len(streams.threads), results
    assert [error for _, error in results if error is not None] == []
    assert all(text == fake_text(TOKENS) for text, _ in results), results


def providers(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in cluster.status()["providers"]}


def test_provider_added_then_removed_under_load(cluster: Cluster) -> None:
    args = ("--delay-ms", str(DELAY_MS), "--tokens", str(TOKENS))
    first, second = (
        cluster.start_fake("fake_openai", *args),
        cluster.start_fake("fake_openai", *args),
    )
    path = cluster.write_chat_edge_config(first, capacity=STREAMS)
    data = yaml.safe_load(path.read_text())
    node = data["nodes"][0]
    node["providers"][0].update(max_queue=16, queue_timeout_sec=60)
    node["adapters"].append(
        {"name": "second", "type": "openai_compat", "base_url": f"http://127.0.0.1:{second}/v1"}
    )
    node["providers"].append(provider("p-spare", "second"))
    data["models"].append({"id": "spare", "providers": ["p-spare"], "default_max_tokens": 64})
    write(path, data)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    # 1. Added while streams run on p-chat.
    running = ChatStreams(cluster, STREAMS).start()
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == STREAMS, 20, "p-chat busy")
    node["providers"].append(provider("p-two", "second"))
    data["models"][0]["providers"] = ["p-chat", "p-two"]
    write(path, data)
    added = refresh(cluster, "apply")
    assert added["result"] == "applied", added
    assert [(r["path"], r["change_class"]) for r in added["reports"]] == [
        ("nodes[0].providers[2]", "live"),
        ("models[0].providers", "live"),
    ], added
    assert [(p["node_id"], p["outcome"]) for p in added["node_pushes"]] == [
        ("node-a", "applied")
    ], added
    assert providers(cluster)["p-two"]["status"] == "available"
    assert [n["providers"] for n in cluster.status()["nodes"]] == [["p-chat", "p-spare", "p-two"]]
    spread = ChatStreams(cluster, STREAMS).start()
    wait_until(lambda: cluster.provider("p-two")["in_flight"] == STREAMS, 20, "p-two busy")
    complete(running)
    complete(spread)
    assert cluster.fake_stats(second)["completed_responses"] == STREAMS
    if WITH_CLUSTER:
        wait_until(lambda: "p-two" in cluster.status()["cluster"]["providers"], 10, "cluster view")

    # 2. Removed while streams run on it.
    both = ChatStreams(cluster, 2 * STREAMS).start()
    # Both providers' leases held *and* every request arrived upstream (a lease is granted
    # before its request has crossed the node to the upstream).
    wait_until(
        lambda: (
            (cluster.provider("p-chat")["in_flight"], cluster.provider("p-two")["in_flight"])
            == (STREAMS, STREAMS)
            and cluster.fake_stats(first)["active_answers"] == STREAMS
            and cluster.fake_stats(second)["active_answers"] == STREAMS
        ),
        20,
        "streams on both",
    )
    served_first = cluster.fake_stats(first)["total_requests"]
    node["providers"] = [p for p in node["providers"] if p["id"] != "p-chat"]
    data["models"][0]["providers"] = ["p-two"]
    write(path, data)
    removed = refresh(cluster, "apply")
    assert removed["result"] == "applied", removed
    assert ("nodes[0].providers[0]", "live") in [
        (r["path"], r["change_class"]) for r in removed["reports"]
    ], removed
    draining = providers(cluster)["p-chat"]
    assert (draining["status"], draining["health"]) == ("removed", "draining"), draining
    assert draining["in_flight"] > 0, draining
    after = ChatStreams(cluster, STREAMS).start()
    complete(both)
    complete(after)
    assert cluster.fake_stats(first)["total_requests"] == served_first
    assert cluster.fake_stats(first)["completed_responses"] == served_first

    def settled() -> bool:
        now = providers(cluster)
        return "p-chat" not in now and now["p-two"]["in_flight"] == 0

    wait_until(settled, 10, "p-chat dropped, leases back to zero")
    if WITH_CLUSTER:

        def view_settled() -> bool:
            held = cluster.status()["cluster"]["providers"]
            return "p-chat" not in held and held["p-two"]["in_flight"] == 0

        wait_until(view_settled, 10, "cluster view without p-chat")
    edge = next(d for d in cluster.daemons if d.name == "edge").output()
    assert "provider_busy" not in edge

    # 3. A provider on an adapter new on the node needs a restart, and the report says so.
    node["adapters"].append(
        {"name": "third", "type": "openai_compat", "base_url": f"http://127.0.0.1:{second}/v1"}
    )
    node["providers"].append(provider("p-three", "third"))
    write(path, data)
    for mode in ("dry_run", "apply"):
        blocked = refresh(cluster, mode)
        assert blocked["result"] == "restart_required", blocked
        [report] = [r for r in blocked["reports"] if r["new"] == "p-three"]
        assert report["change_class"] == "restart_required", report
        assert "its adapter 'third' is new on node node-a" in report["detail"], report
    assert "p-three" not in providers(cluster)
