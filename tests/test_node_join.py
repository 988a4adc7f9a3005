"""
The one-line node join: a real ``twistd iop-edge`` and a ``twistd iop-node`` started only with
flags (``--edge HOST:PORT --token-file F --ca-file F``), no node.yaml.
"""

from __future__ import annotations

import subprocess

from tests.harness import Cluster, wait_until


def test_node_joined_with_flags_registers_and_becomes_ready(cluster: Cluster) -> None:
    token_file = cluster.root / "node.token"
    token_file.write_text(cluster.token + "\n")
    token_file.chmod(0o600)
    cluster.start_edge()
    # No --server-name: the default (edge.iop.internal) is the name the Edge's certificate has.
    cluster.join_node(token_file)
    wait_until(cluster.node_connected, 20, "node-a connected")
    chat = cluster.provider("a-chat")
    assert (chat["status"], chat["health"], chat["capacity"]) == ("available", "healthy", 2)


def test_missing_token_file_fails_at_start_naming_the_flag(cluster: Cluster) -> None:
    missing = cluster.root / "absent.token"
    node = cluster.join_node(missing)
    try:
        code = node.wait(30)
    except subprocess.TimeoutExpired:
        node.stop()
        raise AssertionError("the node started without its token file") from None
    assert code != 0
    assert f"--token-file: token file {missing} does not exist" in node.output()
