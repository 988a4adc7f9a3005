"""
One node dialling two independent Edges (node.yaml ``edges:``; no ``cluster:`` section): real
twistd processes, TLS, a real fake OpenAI upstream. The node registers and becomes ready on
both; each Edge's client API is served through it; an Edge killed with SIGKILL leaves the other
serving, and once it is started again on the same ports the node registers with it again.
"""

from __future__ import annotations

import json
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from iop.testing.ports import free_port
from tests.harness import CLIENT_KEY, Cluster, wait_until


def second_edge(cluster: Cluster) -> Cluster:
    """Another Edge for the same node and token: its own directory, ports and daemons' logs,
    the same dev PKI (the node checks both certificates against one CA). Its daemons join the
    fixture's list, so they are stopped and their logs checked at teardown like the first's."""
    root = cluster.root / "edge-b"
    root.mkdir()
    shutil.copytree(cluster.root / "pki", root / "pki")

    return Cluster(
        root, cluster.token, free_port(), free_port(), cluster.env, daemons=cluster.daemons
    )


def chat(edge: Cluster) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{edge.client_url}/v1/chat/completions",
        data=json.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def transport(edge: Cluster) -> dict[str, Any]:
    """The node's TRANSPORT_STATUS, asked through ``edge``'s admin API."""
    request = urllib.request.Request(
        f"{edge.admin}/nodes/node-a/commands",
        data=json.dumps({"type": "transport"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def node_yaml(path: Path, *edges: Cluster) -> Path:
    entries = [
        {
            "host": "127.0.0.1",
            "port": edge.node_port,
            "server_name": "edge.iop.internal",
            "ca_file": str(path.parent / "pki" / "ca.crt"),
        }
        for edge in edges
    ]
    config = {
        "edges": entries,
        "token": "${IOP_TEST_NODE_TOKEN}",
        "reconnect": {"max_attempts": 0, "interval_sec": 0.3},
        "store": {"path": f"file:{path.parent}/node.db?cache=shared&mode=rwc"},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_node_serves_every_edge_and_survives_losing_one(cluster: Cluster) -> None:
    upstream = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "4")
    a, b = cluster, second_edge(cluster)
    for edge, name in ((a, "edge-a"), (b, "edge-b")):
        edge.write_chat_edge_config(upstream, edge={"id": name})
        edge.start_edge()
    node = cluster.daemon("iop-node", node_yaml(cluster.root / "node.yaml", a, b), "node")
    node.start()
    for edge in (a, b):
        wait_until(edge.node_connected, 20, f"node-a ready on {edge.node_port}")
        assert chat(edge)["choices"][0]["message"]["content"]

    status = transport(a)
    assert status["edge"] == f"127.0.0.1:{a.node_port}"
    assert [(e["edge"], e["supervisor_state"]) for e in status["edges"]] == [
        (f"127.0.0.1:{a.node_port}", "ready"),
        (f"127.0.0.1:{b.node_port}", "ready"),
    ]
    assert transport(b)["edge"] == f"127.0.0.1:{b.node_port}"

    # Edge B dies without a word: A's clients are still served, the node keeps running.
    [edge_b] = [d for d in cluster.daemons if d.log == b.root / "edge.log"]
    edge_b.signal(signal.SIGKILL)
    edge_b.wait(10)
    for _ in range(3):
        assert chat(a)["choices"]
    assert node.running()
    wait_until(
        lambda: [e["supervisor_state"] for e in transport(a)["edges"]][1] != "ready",
        10,
        "the node to notice edge B is gone",
    )

    # B again on the same ports: the node registers with it again by itself.
    b.start_edge()
    wait_until(b.node_connected, 20, "node-a ready on edge B again")
    assert chat(b)["choices"]
    assert chat(a)["choices"]
    assert [e["supervisor_state"] for e in transport(b)["edges"]] == ["ready", "ready"]
    log = node.output()
    assert f"edge 127.0.0.1:{b.node_port}: " in log
    assert node.running()
