"""
Two real Edge processes on one host serving one client port (``openai.reuse_port``): each with
its own node listener, admin listener and node, both in front of the same fake OpenAI upstream.
New client connections land on both Edges (each one's ``/metrics`` counts some of them), and
when one Edge stops the other keeps the port: every request still succeeds.
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

import pytest

from iop.testing.pki import create_dev_pki
from iop.testing.ports import free_port
from tests.harness import CLIENT_KEY, TWISTD, Cluster, Daemon, wait_until
from tests.test_metrics import scrape, total

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="openai.reuse_port is Linux only"
)

TOKENS = 4


def second_edge(first: Cluster, root: Path) -> Cluster:
    """Another Edge beside ``first``: its own directory, PKI and ports, ``first``'s client port
    (and its daemon list, so that the fixture stops and checks both)."""
    root.mkdir()
    create_dev_pki(root / "pki", node_names=["node-a"])
    other = Cluster(root, first.token, free_port(), free_port(), first.env)
    other.client_port = first.client_port
    other.daemons = first.daemons
    return other


def start(edge: Cluster, edge_id: str, upstream: int) -> None:
    edge.write_chat_edge_config(
        upstream, capacity=8, edge={"id": edge_id}, openai=edge.client_api(reuse_port=True)
    )
    edge.start_edge()
    edge.start_node()


def chat(port: int) -> int:
    """One chat completion on a new connection; its HTTP status."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def served(edge: Cluster) -> float:
    return total(scrape(edge)[1], "iop_requests_total", status="200")


def test_two_edges_share_the_client_port(cluster: Cluster, tmp_path: Path) -> None:
    first = cluster
    upstream = first.start_fake("fake_openai", "--delay-ms", "0", "--tokens", str(TOKENS))
    second = second_edge(first, tmp_path / "second")
    start(first, "edge-1", upstream)
    start(second, "edge-2", upstream)
    wait_until(first.node_connected, 20, "edge-1's node connected")
    wait_until(second.node_connected, 20, "edge-2's node connected")

    # Each request on its own connection: the kernel picks a listening socket per connection.
    requests = 60
    assert [chat(first.client_port) for _ in range(requests)] == [200] * requests
    wait_until(lambda: served(first) + served(second) == requests, 10, "every request counted")
    counts = served(first), served(second)
    assert all(count > 0 for count in counts), f"one Edge took every connection: {counts}"

    # One Edge stops: the port stays served, by the other.
    edge_1 = next(d for d in first.daemons if d.name == "edge" and first.root in d.log.parents)
    edge_1.stop()
    before = served(second)
    more = 20
    assert [chat(first.client_port) for _ in range(more)] == [200] * more
    wait_until(lambda: served(second) == before + more, 10, "edge-2 counted the rest")


def test_a_port_taken_without_reuse_port_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """An Edge that shares the port never joins a listener that did not ask to share it."""
    first = cluster
    upstream = first.start_fake("fake_openai", "--delay-ms", "0", "--tokens", str(TOKENS))
    first.write_chat_edge_config(upstream, openai=first.client_api())
    first.start_edge()
    second = second_edge(first, tmp_path / "second")
    second.write_chat_edge_config(
        upstream, edge={"id": "edge-2"}, openai=second.client_api(reuse_port=True)
    )
    # Not in the fixture's list: it fails to start (one line naming openai.listen).
    argv = [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", "iop-edge", "--config"]
    daemon = Daemon(
        "edge-2", [*argv, str(second.root / "edge.yaml")], second.env, second.root / "edge.log"
    )
    assert daemon.start().wait(30) != 0
    assert f"openai.listen: 127.0.0.1:{first.client_port} is already in use" in daemon.output()
