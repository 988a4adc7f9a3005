"""
The systems of the multi-Edge scenario (``python -m bench --multi-edge``): a group of N Edge
processes on this host sharing one client port (``openai.reuse_port``), each with its own node
and admin listener and ``cluster:`` on one private Redis, and the node(s) behind them.

The shared decisions for several Edges: every Edge of a group has the same edge.yaml but for
``edge.id``/``cluster.edge_id`` and its node and admin ports; one node dials every Edge of the
group (node.yaml ``edges:``, one entry per Edge's node port, one token). A tree whose node.yaml
does not take ``edges:`` yet gets one node per Edge instead (:func:`node_configs`), and the
group says so (:attr:`EdgeGroup.nodes_shared`).

Redis runs as ``redis-server`` on a unix socket only, no persistence, with a random password
(in its 0600 config file) handed to the Edges in their environment (``BENCH_REDIS_PASSWORD``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import BenchError, Child, Children, port_open, wait_until
from bench.systems import NODE_NAME, TWISTD, base_env, edge_config, get_json
from iop.config import ConfigError, parse_node_config
from iop.testing.pki import DEFAULT_EDGE_NAME, create_dev_pki
from iop.testing.ports import free_port

# The scenario's answer size: 32 tokens, one per chunk.
MULTI_EDGE_TOKENS = 32
# The targets (one per group) and their Edge counts.
GROUPS = {"iop-1edge": 1, "iop-2edge": 2}
_REQUESTS = re.compile(r'^iop_requests_total\{[^}]*status="200"[^}]*\} ([0-9.e+]+)$', re.M)


@dataclass
class Redis:
    socket: Path
    password: str
    child: Child

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"


def start_redis(children: Children, root: Path) -> Redis:
    """A private ``redis-server`` on ``root/redis.sock`` (BenchError if it is not installed)."""
    server = shutil.which("redis-server")
    if server is None:
        raise BenchError(
            "multi-edge: redis-server is not installed (Debian: apt-get install redis-server)"
        )
    root.mkdir(parents=True, exist_ok=True)
    path = root / "redis.sock"
    password = secrets.token_urlsafe(16)
    # The password in a 0600 file rather than on the command line (where ps shows it).
    conf = root / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f'port 0\nunixsocket "{path}"\nunixsocketperm 700\nsave ""\nappendonly no\n'
            f'requirepass "{password}"\ndir "{root}"\n'
        )
    argv = [server, str(conf)]
    child = children.start("redis", argv, base_env(), root / "redis.log", root)

    def listening() -> bool:
        if not child.running():
            return True
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
                return True
        except OSError:
            return False

    wait_until(listening, 30, "redis-server to open its socket")
    child.check()
    return Redis(path, password, child)


def establish(redis: Redis, prefix: str) -> None:
    """
    Mark the lease table of ``prefix`` established (an epoch whose recovery is over), as a
    running cluster's is: a brand-new table grants nothing for one lease TTL (the Edges could
    still hold leases it lost), which would land in the first round's warm-up.
    """
    commands = [("AUTH", redis.password), ("SET", f"{{{prefix}}}:epoch", "0")]
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(redis.socket))
        for command in commands:
            frame = f"*{len(command)}\r\n" + "".join(
                f"${len(part.encode())}\r\n{part}\r\n" for part in command
            )
            conn.sendall(frame.encode())
            reply = conn.recv(1024)
            if not reply.startswith(b"+OK"):
                raise BenchError(f"redis-server answered {command[0]} with {reply[:80]!r}")


@dataclass
class GroupEdge:
    name: str
    edge_id: str
    node_port: int
    admin_port: int
    child: Child | None = None

    def connected_nodes(self) -> int:
        try:
            status = get_json(f"http://127.0.0.1:{self.admin_port}/status")
            return sum(1 for n in status["nodes"] if n["connected"])
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            return 0

    def served(self) -> int:
        """Requests this Edge answered with 200, from its ``/metrics``."""
        url = f"http://127.0.0.1:{self.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return int(sum(float(v) for v in _REQUESTS.findall(text)))


@dataclass
class EdgeGroup:
    """N Edges on one client port and the node(s) that serve them."""

    name: str
    root: Path
    client_port: int
    edges: list[GroupEdge]
    nodes_shared: bool
    nodes: list[Child] = field(default_factory=list)

    @property
    def processes(self) -> dict[str, int]:
        """The group's process names → pids (for CPU and RSS)."""
        out = {e.name: e.child.pid for e in self.edges if e.child is not None}
        out.update({n.name: n.pid for n in self.nodes})
        return out


def group_edges(name: str, count: int) -> list[GroupEdge]:
    return [
        GroupEdge(f"{name}-edge-{i}", f"{name}-{i}", free_port(), free_port())
        for i in range(1, count + 1)
    ]


def group_edge_config(
    edge: GroupEdge,
    *,
    group: str,
    client_port: int,
    redis_url: str,
    openai_ports: Mapping[int, int],
    capacity: int,
) -> dict[str, Any]:
    """One Edge of a group: the bench's edge.yaml, its own ids and ports, the shared client port
    (``reuse_port``) and the group's ``cluster:`` (one key prefix per group)."""
    config = edge_config(
        node_port=edge.node_port,
        admin_port=edge.admin_port,
        client_port=client_port,
        openai_ports=openai_ports,
        ollama_ports={},
        capacity=capacity,
        fake_digests=[],
    )
    config["edge"] = {"id": edge.edge_id}
    config["openai"]["reuse_port"] = True
    config["cluster"] = {
        "redis": redis_url,
        "password": "${BENCH_REDIS_PASSWORD}",
        "edge_id": edge.edge_id,
        "key_prefix": group,
    }
    return config


def _edge_address(edge: GroupEdge) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": edge.node_port,
        "server_name": DEFAULT_EDGE_NAME,
        "ca_file": "pki/ca.crt",
    }


def node_configs(
    root: Path, edges: list[GroupEdge], environ: Mapping[str, str]
) -> tuple[bool, list[dict[str, Any]]]:
    """
    The node.yaml(s) of a group: one node with ``edges:`` naming every Edge when this tree's
    node config takes it (``True``), else one node per Edge with its ``edge:`` (``False``).
    """
    common: dict[str, Any] = {
        "token": "${BENCH_NODE_TOKEN}",
        "reconnect": {"max_attempts": 0, "interval_sec": 0.5},
    }
    shared = {
        "edges": [_edge_address(e) for e in edges],
        **common,
        "store": {"path": f"file:{root}/node.db?cache=shared&mode=rwc"},
    }
    try:
        parse_node_config(shared, base_dir=str(root), environ=environ)
    except ConfigError as e:
        if not any(issue.path.startswith("edges") for issue in e.issues):
            raise BenchError(f"multi-edge: the node config does not load:\n{e}") from None
        return False, [
            {
                "edge": _edge_address(edge),
                **common,
                "store": {"path": f"file:{root}/node-{i}.db?cache=shared&mode=rwc"},
            }
            for i, edge in enumerate(edges, 1)
        ]
    return True, [shared]


def start_group(
    children: Children,
    root: Path,
    name: str,
    count: int,
    *,
    redis: Redis,
    openai_ports: Mapping[int, int],
    capacity: int,
) -> EdgeGroup:
    """Write the PKI and configs under ``root``, start the Edges, then the node(s); wait until
    every Edge has a ready node."""
    root.mkdir(parents=True, exist_ok=True)
    create_dev_pki(root / "pki", node_names=[NODE_NAME])
    env = base_env()
    env["BENCH_NODE_TOKEN"] = secrets.token_urlsafe(32)
    env["BENCH_REDIS_PASSWORD"] = redis.password
    group = EdgeGroup(name, root, free_port(), group_edges(name, count), nodes_shared=False)
    establish(redis, name)  # the group's key prefix

    def twistd(plugin: str, config: str) -> list[str]:
        return [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", config]

    for i, edge in enumerate(group.edges, 1):
        config = group_edge_config(
            edge,
            group=name,
            client_port=group.client_port,
            redis_url=redis.url,
            openai_ports=openai_ports,
            capacity=capacity,
        )
        (root / f"edge-{i}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        edge.child = children.start(
            edge.name, twistd("iop-edge", f"edge-{i}.yaml"), env, root / f"edge-{i}.log", root
        )
    for edge in group.edges:
        child = edge.child
        assert child is not None
        wait_until(
            lambda: port_open(edge.admin_port) or not child.running(),  # noqa: B023
            30,
            f"{edge.name}'s admin listener",
        )
        child.check()
    group.nodes_shared, configs = node_configs(root, group.edges, env)
    for i, node_config in enumerate(configs, 1):
        path = root / f"node-{i}.yaml"
        path.write_text(yaml.safe_dump(node_config, sort_keys=False))
        group.nodes.append(
            children.start(
                f"{name}-node-{i}",
                twistd("iop-node", path.name),
                env,
                root / f"node-{i}.log",
                root,
            )
        )
    for edge in group.edges:
        wait_until(
            lambda: (
                edge.connected_nodes() >= 1  # noqa: B023
                or not all(n.running() for n in group.nodes)
            ),
            30,
            f"a node ready on {edge.name}",
        )
        for node in group.nodes:
            node.check()
    # Every Edge joins the shared client port once its nodes are ready.
    wait_until(lambda: port_open(group.client_port), 30, f"{name}'s client port")
    return group


def requests_by_edge(group: EdgeGroup) -> dict[str, int]:
    """How many requests each Edge of the group answered (200), by Edge name."""
    return {edge.name: edge.served() for edge in group.edges}
