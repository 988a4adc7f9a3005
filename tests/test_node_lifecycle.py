"""
Real ``twistd iop-edge`` and ``twistd iop-node`` processes over TLS on loopback: registration,
readiness, fencing on SIGKILL (heartbeat) and on clean close, node restart, Edge restart.
"""

from __future__ import annotations

import signal
import time

from tests.harness import Cluster, wait_until

HEARTBEAT_TIMEOUT = 3.0  # the cluster fixture's edge.yaml


def test_node_registers_and_becomes_ready(cluster: Cluster) -> None:
    cluster.start_edge()
    snap = cluster.status()
    assert snap["nodes"][0]["connected"] is False
    assert cluster.provider("a-chat")["status"] == "unavailable"

    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    chat = cluster.provider("a-chat")
    assert (chat["status"], chat["health"], chat["capacity"]) == ("available", "healthy", 2)
    assert [chat[k] for k in ("in_flight", "long_in_flight", "queued", "long_queued")] == [0] * 4
    off = cluster.provider("a-off")
    assert (off["status"], off["health"], off["capacity"]) == ("disabled", "disabled", 0)


def test_sigkill_goes_offline_within_heartbeat_wait_and_restart_reconnects(
    cluster: Cluster,
) -> None:
    cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    # SIGKILL on loopback still closes the socket (the kernel sends FIN/RST), so the Edge sees
    # it at once; the heartbeat bounds the worst case. Either way: offline within the wait.
    node.signal(signal.SIGKILL)
    node.wait(10)
    took = wait_until(lambda: not cluster.node_connected(), HEARTBEAT_TIMEOUT + 2, "offline")
    assert took <= HEARTBEAT_TIMEOUT + 1
    chat = cluster.provider("a-chat")
    assert (chat["status"], chat["health"], chat["capacity"]) == ("unavailable", "offline", 0)

    cluster.start_node("node")
    wait_until(cluster.node_connected, 20, "node-a connected again after restart")


def test_clean_close_goes_offline_at_once(cluster: Cluster) -> None:
    cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    node.signal(signal.SIGTERM)
    assert node.wait(10) == 0
    took = wait_until(lambda: not cluster.node_connected(), 5, "offline after clean close")
    assert took < 1.0


def test_edge_restart_node_reconnects_by_itself(cluster: Cluster) -> None:
    edge = cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    edge.stop()
    time.sleep(1.0)  # the node sees the close and starts re-dialing into a closed port
    assert node.running()
    cluster.start_edge()
    wait_until(cluster.node_connected, 20, "node-a reconnected to the restarted edge")
    assert node.running()


def test_unknown_token_is_fatal_exit_1(cluster: Cluster) -> None:
    cluster.start_edge()
    cluster.env["IOP_TEST_NODE_TOKEN"] = "not-the-token"
    node = cluster.start_node()
    assert node.wait(20) == 1
    assert cluster.node_connected() is False


def test_finite_reconnect_exhaustion_exit_1(cluster: Cluster) -> None:
    # No edge at all: every attempt is refused.
    cluster.write_node_config(reconnect={"max_attempts": 3, "interval_sec": 0.2})
    node = cluster.start_node()
    assert node.wait(20) == 1
    assert node.output().count("attempt") >= 1


def test_frozen_node_is_fenced_by_heartbeat_and_recovers(cluster: Cluster) -> None:
    """
    SIGSTOP keeps the socket open but silences the node, which is what a power cut or a
    network partition looks like to the Edge: only the heartbeat can notice.
    """
    cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    node.signal(signal.SIGSTOP)
    try:
        took = wait_until(
            lambda: not cluster.node_connected(), HEARTBEAT_TIMEOUT + 3, "heartbeat fence"
        )
        assert HEARTBEAT_TIMEOUT - 1.5 <= took <= HEARTBEAT_TIMEOUT + 1.5
        assert cluster.provider("a-chat")["health"] == "offline"
    finally:
        node.signal(signal.SIGCONT)
    wait_until(cluster.node_connected, 20, "node-a reconnected after thaw")


def test_frozen_edge_makes_node_redial(cluster: Cluster) -> None:
    """The node's own heartbeat notices a silent Edge and re-dials once it answers again."""
    edge = cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    edge.signal(signal.SIGSTOP)
    try:
        time.sleep(HEARTBEAT_TIMEOUT + 2.5)  # default node wait is 5 s, adopted from the edge: 3 s
    finally:
        edge.signal(signal.SIGCONT)
    wait_until(cluster.node_connected, 20, "node-a connected again")
    assert "heartbeat timeout" in node.output()
    assert node.running()
