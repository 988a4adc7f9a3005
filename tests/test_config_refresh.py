"""
Live config refresh end to end: a real Edge and node, edge.yaml edited on disk, then SIGHUP or
``POST /config/refresh`` (and ``iop config refresh``): a live change shows in ``/status`` and the
log, a node push is answered by the real node, a broken or restart-required file changes
nothing and the Edge keeps serving.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from iop.testing.ports import free_port
from tests.harness import Cluster, wait_until

LISTS = ("changed_nodes", "changed_providers", "changed_models", "reports")


def refresh(cluster: Cluster, mode: str) -> dict[str, Any]:
    request = urllib.request.Request(
        cluster.admin + "/config/refresh",
        data=json.dumps({"mode": mode}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        document: dict[str, Any] = json.loads(response.read())
        return document


def edit(path: Path, change: Any) -> None:
    """Load edge.yaml, let ``change`` edit the data, write it back."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


def set_capacity(value: int) -> Any:
    def change(data: dict[str, Any]) -> None:
        data["nodes"][0]["providers"][0]["capacity"] = value

    return change


def started(cluster: Cluster, capacity: int = 1) -> Path:
    path = cluster.write_edge_config()
    edit(path, set_capacity(capacity))
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a ready")
    assert cluster.provider("a-chat")["capacity"] == capacity
    return path


def edge(cluster: Cluster) -> Any:
    return next(d for d in cluster.daemons if d.name == "edge")


def test_sighup_applies_a_live_change(cluster: Cluster) -> None:
    path = started(cluster, capacity=1)
    edit(path, set_capacity(2))
    edge(cluster).signal(signal.SIGHUP)
    wait_until(lambda: cluster.provider("a-chat")["capacity"] == 2, 10, "capacity 2")
    wait_until(
        lambda: "nodes[0].providers[0].capacity: 1 → 2 (live)" in edge(cluster).output(),
        10,
        "the refresh logged",
    )
    out = edge(cluster).output()
    assert "config refresh (apply): applied" in out
    assert "SIGHUP" in out


def test_sighup_with_a_broken_file_keeps_serving(cluster: Cluster) -> None:
    path = started(cluster, capacity=1)
    before = cluster.status()
    path.write_text("nodes: [\n")
    edge(cluster).signal(signal.SIGHUP)
    wait_until(lambda: "config refresh (apply): rejected" in edge(cluster).output(), 10, "rejected")
    assert "invalid YAML" in edge(cluster).output()
    assert cluster.status() == before

    # A file that parses but does not validate: the loader's message, by path.
    cluster.write_edge_config()
    edit(path, set_capacity(0))
    edge(cluster).signal(signal.SIGHUP)
    wait_until(
        lambda: edge(cluster).output().count("config refresh (apply): rejected") == 2,
        10,
        "second rejection",
    )
    assert "nodes[0].providers[0].capacity" in edge(cluster).output()
    assert cluster.status() == before
    assert edge(cluster).running()


def test_dry_run_no_op_has_four_empty_lists(cluster: Cluster) -> None:
    started(cluster, capacity=1)
    document = refresh(cluster, "dry_run")
    assert (document["result"], document["mode"]) == ("applied", "dry_run")
    for key in LISTS:
        assert document[key] == [], key


def test_restart_required_changes_nothing(cluster: Cluster) -> None:
    path = started(cluster, capacity=1)
    before = cluster.status()
    other = free_port()

    def change(data: dict[str, Any]) -> None:
        data["listen"]["admin"] = f"tcp:{other}:interface=127.0.0.1"
        data["nodes"][0]["providers"][0]["capacity"] = 2

    edit(path, change)
    document = refresh(cluster, "apply")
    assert document["result"] == "restart_required"
    classes = {r["path"]: r["change_class"] for r in document["reports"]}
    assert classes["nodes[0].providers[0].capacity"] == "live"
    assert "restart_required" in classes.values()
    assert document["node_pushes"] == []
    assert cluster.status() == before
    assert cluster.provider("a-chat")["capacity"] == 1


def test_node_push_is_answered(cluster: Cluster) -> None:
    path = started(cluster, capacity=1)

    def change(data: dict[str, Any]) -> None:
        data["nodes"][0]["concurrency"] = 3

    edit(path, change)
    document = refresh(cluster, "apply")
    assert document["result"] == "applied", document
    assert [(p["node_id"], p["outcome"]) for p in document["node_pushes"]] == [
        ("node-a", "applied")
    ]
    assert "node-a" in document["changed_nodes"]


def test_console_command(cluster: Cluster) -> None:
    path = started(cluster, capacity=1)
    iop = [sys.executable, "-m", "iop.cli", "config", "refresh", "--admin", cluster.admin]
    dry = subprocess.run([*iop, "--dry-run"], capture_output=True, text=True, timeout=30)
    assert (dry.returncode, dry.stdout) == (0, "dry run: would apply (0 changes)\n")

    edit(path, set_capacity(2))
    applied = subprocess.run(iop, capture_output=True, text=True, timeout=30)
    assert applied.returncode == 0, applied.stderr
    assert "  nodes[0].providers[0].capacity: 1 → 2 (live)" in applied.stdout
    assert cluster.provider("a-chat")["capacity"] == 2

    path.write_text("nodes: [\n")
    rejected = subprocess.run([*iop, "--json"], capture_output=True, text=True, timeout=30)
    assert rejected.returncode == 1
    assert json.loads(rejected.stdout)["result"] == "rejected"
