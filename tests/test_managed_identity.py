"""
Managed mode, workload identity: real ``twistd iop-edge`` / ``iop-node`` processes over real mTLS
on loopback, certificates from the dev PKI.

The Edge requires a client certificate from its CA naming exactly the workload of the node the
token belongs to (``<node-id>.node.iop.internal``). node-a with its own certificate registers; a
node that presents node-b's certificate with node-a's token is refused before registration
(``REGISTER_REJECT_WORKLOAD_IDENTITY``), exits with the node's fatal exit code 1 even with
unlimited reconnects, and the Edge's log and ``/status`` show the refusal.

Skipped until the Edge config parses ``security:`` and the lease keys can be generated
(``iop.security.keys``): managed mode will not start without its key material.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from iop.config import ConfigError
from iop.config.edge import parse_edge_config
from iop.testing.pki import create_dev_pki
from tests.harness import Cluster, wait_until

WORKLOAD_A = "node-a.node.iop.internal"
WORKLOAD_B = "node-b.node.iop.internal"


def _edge_config_has_security() -> bool:
    """Whether edge.yaml may carry a ``security:`` section (managed mode's config)."""
    probe = {
        "listen": {"nodes": "tcp:0:interface=127.0.0.1", "admin": "tcp:0:interface=127.0.0.1"},
        "node_transport": {"plaintext": True},
        "nodes": [{"id": "probe", "token_sha256": "0" * 64}],
        "security": {"mode": "legacy"},
    }
    try:
        parse_edge_config(probe, base_dir=".", environ={})
    except ConfigError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(
        not _edge_config_has_security(), reason="edge.yaml has no security: section yet"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("iop.security.keys") is None,
        reason="iop.security.keys (lease key generation) is not available yet",
    ),
]


def _write_keys(root: Path) -> None:
    """The lease keys managed mode needs: the Edge's issuer pair, node-a's recipient pair."""
    from iop.security import keys  # type: ignore[attr-defined,unused-ignore]

    directory = root / "keys"
    directory.mkdir(exist_ok=True)
    keys.write_issuer(
        keys.generate_issuer(), str(directory / "issuer.key"), str(directory / "issuer.pub")
    )
    keys.write_recipient(
        keys.generate_recipient(),
        str(directory / "node-a.recipient.key"),
        str(directory / "node-a.recipient.pub"),
    )


def _managed_edge(cluster: Cluster) -> None:
    cluster.write_edge_config(
        node_transport={
            "tls": {
                "cert_file": "pki/edge.crt",
                "key_file": "pki/edge.key",
                "client_ca_file": "pki/ca.crt",
            },
            "heartbeat": {"interval_sec": 1, "timeout_sec": 3},
        },
        security={
            "mode": "managed",
            "trust_domain": "iop.internal",
            "lease": {"signing_key_file": "keys/issuer.key"},
        },
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "recipient_key_file": "keys/node-a.recipient.pub",
                "adapters": [
                    {
                        "name": "fake-openai",
                        "type": "openai_compat",
                        "base_url": "http://127.0.0.1:9/v1",
                    }
                ],
                "providers": [
                    {
                        "id": "a-chat",
                        "adapter": "fake-openai",
                        "category": "api",
                        "models": ["m"],
                        "capacity": 2,
                    }
                ],
            }
        ],
        models=[{"id": "pool", "providers": ["a-chat"]}],
    )


def _managed_node(cluster: Cluster, name: str, certificate: str) -> None:
    """node-a's token and keys, presenting ``pki/<certificate>.crt``; unlimited reconnects."""
    cluster.write_node_config(
        name,
        edge={
            "host": "127.0.0.1",
            "port": cluster.node_port,
            "server_name": "edge.iop.internal",
            "ca_file": "pki/ca.crt",
            "cert_file": f"pki/{certificate}.crt",
            "key_file": f"pki/{certificate}.key",
        },
        security={
            "mode": "managed",
            "recipient_key_file": "keys/node-a.recipient.key",
            "issuer_key_file": "keys/issuer.pub",
        },
    )


@pytest.fixture
def managed(cluster: Cluster) -> Cluster:
    create_dev_pki(cluster.root / "pki", node_names=["node-a", "node-b"])
    _write_keys(cluster.root)
    _managed_edge(cluster)
    _managed_node(cluster, "node", "node-node-a")
    _managed_node(cluster, "impostor", "node-node-b")
    return cluster


def _node(cluster: Cluster, node_id: str = "node-a") -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {n["id"]: n for n in cluster.status()["nodes"]}
    return nodes[node_id]


def test_own_certificate_registers(managed: Cluster) -> None:
    managed.start_edge()
    assert managed.status()["edge"]["mode"] == "managed"
    before = _node(managed)["identity"]
    assert (before["checked"], before["ok"], before["expected"]) == (False, None, WORKLOAD_A)

    managed.start_node("node")
    wait_until(managed.node_connected, 20, "node-a connected with its own certificate")
    identity = _node(managed)["identity"]
    assert (identity["checked"], identity["ok"]) == (True, True)
    assert identity["presented"] == [WORKLOAD_A]
    assert identity["refusals"] == 0


def test_another_nodes_certificate_is_refused_and_fatal(managed: Cluster) -> None:
    edge = managed.start_edge()
    impostor = managed.start_node("impostor")
    # reconnect.max_attempts 0 (unlimited): only a fatal error ends the process.
    assert impostor.wait(20) == 1
    assert managed.node_connected() is False
    node = _node(managed)
    assert node["state"] == "disconnected"
    identity = node["identity"]
    assert (identity["checked"], identity["ok"], identity["expected"]) == (True, False, WORKLOAD_A)
    assert identity["presented"] == [WORKLOAD_B]
    assert identity["refusals"] == 1
    assert WORKLOAD_B in identity["reason"]

    impostor_log = impostor.output()
    assert "REGISTER_REJECT_WORKLOAD_IDENTITY" in impostor_log
    assert WORKLOAD_A in impostor_log and WORKLOAD_B in impostor_log
    assert "giving up" in impostor_log
    edge_log = edge.output()
    assert "refused node node-a registration" in edge_log
    assert WORKLOAD_B in edge_log

    # The real node-a still gets in.
    managed.start_node("node")
    wait_until(managed.node_connected, 20, "node-a connected after the refusal")
    after = _node(managed)["identity"]
    assert (after["ok"], after["presented"], after["refusals"]) == (True, [WORKLOAD_A], 1)


def test_impostor_does_not_disturb_the_connected_node(managed: Cluster) -> None:
    managed.start_edge()
    node = managed.start_node("node")
    wait_until(managed.node_connected, 20, "node-a connected")
    impostor = managed.start_node("impostor")
    assert impostor.wait(20) == 1
    assert node.running()
    assert managed.node_connected()
    identity = _node(managed)["identity"]
    assert (identity["ok"], identity["presented"], identity["refusals"]) == (
        True,
        [WORKLOAD_A],
        1,
    )


def test_no_key_material_in_status(managed: Cluster) -> None:
    managed.start_edge()
    managed.start_node("node")
    wait_until(managed.node_connected, 20, "node-a connected")
    text = str(managed.status())
    assert "BEGIN" not in text and "PRIVATE" not in text
    for name in os.listdir(managed.root / "keys"):
        assert (managed.root / "keys" / name).read_text().strip() not in text
