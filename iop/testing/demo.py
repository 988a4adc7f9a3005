# -*- test-case-name: tests.test_demo_cluster -*-
"""
``make run``: serve the demo — one Edge and two Nodes from ``etc/iop/demo/`` on loopback, over
real TLS with a locally generated development CA, plus the fake providers the node serves: an
OpenAI-compatible upstream, an Ollama upstream and a scripted CLI coding agent.

Creates ``var/demo/`` on first use (dev PKI, a random node token, the agent's workspace; kept so
restarts reuse them), starts the fakes, ``twistd -n iop-edge`` and ``twistd -n iop-node`` as
child processes, prints how to try it (with each node's PID) once both nodes are ready on the
Edge (its ``/status``: the first request it suggests is served, not refused with a 503
``node_unavailable``), and stops everything on Ctrl-C. A
node that stops — `kill <pid>` to watch its queue drain to the other — leaves the Edge and the
other node serving; the Edge or a fake stopping ends the demo. The token reaches both
daemons as ``${IOP_DEMO_NODE_TOKEN}`` / ``${IOP_DEMO_NODE_B_TOKEN}``; never into the configs.

``make run-cluster`` (``--cluster``): the same demo world as a cluster of two Edges on one host,
from ``etc/iop/demo/cluster/``: Edge 1 and Edge 2 share the client port (``openai.reuse_port``),
each with its own node and admin port, and one provider lease table in a private
``redis-server`` this launcher starts (a unix socket under ``var/demo/``, no TCP port, no
persistence, a random password kept in ``var/demo/`` and handed to the Edges as
``${IOP_DEMO_REDIS_PASSWORD}``); both nodes dial both Edges. Their log lines are prefixed with
their names (``edge-1 | ...``). An Edge that stops leaves the other serving; the demo ends when
both are gone (or Redis or a fake stops).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from iop.testing.pki import create_dev_pki

DEMO_CONFIG = Path("etc/iop/demo")
CLUSTER_CONFIG = DEMO_CONFIG / "cluster"
STATE = Path("var/demo")
ADMIN = ("127.0.0.1", 8081)
CLIENT_PORT = 8080
# Fake upstreams: slow enough per token that streaming is visible.
FAKES = (
    (
        "fake_openai",
        9001,
        ("--delay-ms", "80", "--tokens", "40", "--anthropic-api", "--responses-api"),
    ),
    ("fake_ollama", 9002, ("--delay-ms", "80", "--tokens", "40")),
)
# The cluster demo's Redis: its socket (named so in the cluster edge.yaml files), its password
# file and its config file (which holds the password: not on the command line, where ps shows it).
REDIS_SOCKET = "redis.sock"
REDIS_PASSWORD = "redis.password"
REDIS_CONF = "redis.conf"
# cluster.key_prefix (the default): the lease table's keys are {iop}:...
REDIS_KEY_PREFIX = "iop"


@dataclass(frozen=True)
class EdgeSpec:
    """One demo Edge: its name, config and listeners."""

    name: str
    config: Path
    node_port: int
    admin_port: int

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"


EDGE = EdgeSpec("demo-edge", DEMO_CONFIG / "edge.yaml", 7443, ADMIN[1])
CLUSTER_EDGES = (
    EdgeSpec("edge-1", CLUSTER_CONFIG / "edge-1.yaml", 7443, 8081),
    EdgeSpec("edge-2", CLUSTER_CONFIG / "edge-2.yaml", 7444, 8083),
)
NODE_CONFIGS = (("demo-a", "node.yaml"), ("demo-b", "node-b.yaml"))


def secret_file(path: Path) -> str:
    """The random secret kept in ``path`` (0600), made on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def demo_token(state: Path, name: str = "node") -> str:
    return secret_file(state / f"{name}.token")


def twistd_command(plugin: str, config: Path) -> list[str]:
    twistd = Path(sys.executable).with_name("twistd")
    return [str(twistd), "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", str(config)]


# Children run in their own sessions: a Ctrl-C on the terminal reaches only this launcher, which
# stops each child once (a second signal would make twistd try to stop a stopped reactor).


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def port_taken(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_unix_socket(path: Path, child: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.poll() is None:
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
                return True
        except OSError:
            time.sleep(0.05)
    return False


def redis_call(path: Path, *commands: tuple[str, ...]) -> list[bytes]:
    """Send each command (RESP) over the unix socket; each simple reply line, in order."""
    replies: list[bytes] = []
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(str(path))
        reader = conn.makefile("rb")
        for command in commands:
            frame = f"*{len(command)}\r\n" + "".join(
                f"${len(part.encode())}\r\n{part}\r\n" for part in command
            )
            conn.sendall(frame.encode())
            replies.append(reader.readline().rstrip(b"\r\n"))
    return replies


class Children:
    """The demo's child processes, each in its own session; stopped in tiers, latest first. A
    child started with a ``label`` has each line it prints prefixed with it (``edge-1 | ...``):
    the cluster demo's two Edges log the same lines."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.tiers: list[list[subprocess.Popen[bytes]]] = []
        self.copiers: list[threading.Thread] = []
        self.output = threading.Lock()

    def start(
        self, argv: list[str], *, tier: int, cwd: Path | None = None, label: str | None = None
    ) -> subprocess.Popen[bytes]:
        pipe = subprocess.PIPE if label else None
        child = subprocess.Popen(
            argv,
            env=self.env,
            cwd=cwd,
            start_new_session=True,
            stdout=pipe,
            stderr=subprocess.STDOUT if label else None,
        )
        if label and child.stdout is not None:
            copier = threading.Thread(target=self.copy, args=(label, child.stdout), daemon=True)
            copier.start()
            self.copiers.append(copier)
        while len(self.tiers) <= tier:
            self.tiers.append([])
        self.tiers[tier].append(child)
        return child

    def copy(self, label: str, stream: IO[bytes]) -> None:
        out = sys.stdout.buffer
        prefix = f"{label} | ".encode()
        for line in stream:
            with self.output:
                out.write(prefix + line)
                out.flush()

    def stop(self) -> None:
        """SIGTERM each tier, the last started first (nodes and Edges before Redis and the
        fakes they use), and wait for it; SIGKILL what outlives 10 s."""
        for tier in reversed(self.tiers):
            for child in tier:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in tier:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        for copier in self.copiers:
            copier.join(timeout=5)


# Tiers: what the Edges and nodes use, then the Edges, then the nodes.
BACKENDS, EDGES, NODES = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iop.testing.demo", description=__doc__)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="two Edges on one host in one cluster (a private redis-server), both nodes "
        "dialing both",
    )
    args = parser.parse_args(argv)
    if args.cluster:
        return run_cluster()
    return run_single()


def prepare(config: Path) -> dict[str, str] | None:
    """The demo's state (PKI, workspace) and the children's environment; ``None`` outside the
    repository root."""
    if not config.exists():
        print("run this from the repository root (etc/iop/demo/ not found)", file=sys.stderr)
        return None
    create_dev_pki(STATE / "pki", node_names=["demo-a"])
    (STATE / "workspace").mkdir(parents=True, exist_ok=True)
    bindir = str(Path(sys.executable).parent)
    return dict(
        os.environ,
        IOP_DEMO_NODE_TOKEN=demo_token(STATE),
        IOP_DEMO_NODE_B_TOKEN=demo_token(STATE, "node-b"),
        # The node finds the scripted agent (iop-fake-cli-agent) next to this interpreter.
        PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
    )


def start_fakes(children: Children) -> bool:
    for module, port, args in FAKES:
        children.start(
            [sys.executable, "-m", f"iop.testing.{module}", "--port", str(port), *args],
            tier=BACKENDS,
        )
        if not wait_for_port("127.0.0.1", port, timeout=20):
            print(f"{module} did not start on port {port}", file=sys.stderr)
            return False
    return True


def start_nodes(
    children: Children, config_dir: Path, *, labelled: bool = False
) -> dict[str, subprocess.Popen[bytes]]:
    return {
        name: children.start(
            twistd_command("iop-node", config_dir / config),
            tier=NODES,
            label=name if labelled else None,
        )
        for name, config in NODE_CONFIGS
    }


# How long the launcher waits for its nodes to be ready on every Edge before it prints its banner.
NODES_READY_SEC = 60.0


def nodes_ready(admin: str, node_ids: Iterable[str]) -> bool:
    """Every node of ``node_ids`` is connected and ready on the Edge whose admin URL is
    ``admin`` (its ``/status``)."""
    try:
        with urllib.request.urlopen(admin + "/status", timeout=2) as response:
            snapshot = json.loads(response.read())
    except (OSError, ValueError):
        return False
    nodes = {node.get("id"): node for node in snapshot.get("nodes", [])}
    return all(
        nodes.get(n, {}).get("connected") and nodes[n].get("state") == "ready" for n in node_ids
    )


def wait_for_nodes(
    admins: Iterable[str], children: Sequence[subprocess.Popen[bytes]], timeout: float
) -> bool:
    """
    Wait until both demo nodes are ready on every Edge of ``admins``: the banner comes after,
    so that the first request it suggests is served (not a 503 ``node_unavailable``). False
    after ``timeout`` seconds, or when a child of ``children`` has exited.
    """
    ids = [name for name, _ in NODE_CONFIGS]
    pending = list(admins)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [admin for admin in pending if not nodes_ready(admin, ids)]
        if not pending:
            return True
        if time.monotonic() > deadline or any(c.poll() is not None for c in children):
            return False
        time.sleep(0.2)
    return True


def try_it_lines(admin: str) -> str:
    """The commands to try, against the client port and the admin listener ``admin``."""
    run = "curl -N -X POST " + admin + '/runs -d \'{"model": "%s", "input": "hello"}\''
    chat = (
        "curl -N http://127.0.0.1:8080/v1/chat/completions -H 'authorization: Bearer "
        "sk-iop-demo' -H 'content-type: application/json' -d '{\"model\": \"demo-pool\", "
        '"stream": true, "messages": [{"role": "user", "content": "hello"}]}\''
    )
    return (
        f"  {chat}\n"
        f"  curl {admin}/status      # run three chats at once and watch the queue\n"
        f"  curl {admin}/metrics     # Prometheus\n"
        f"  {run % 'demo-openai'}\n"
        f"  {run % 'demo-ollama'}\n"
        f"  {run % 'demo-cli'}\n"
    )


class Stopped(Exception):
    """SIGTERM reached the launcher."""


def on_sigterm(*_: object) -> None:
    raise Stopped


def quiet(*_: object) -> None:
    """While stopping: a further SIGTERM or Ctrl-C changes nothing (the children are being
    stopped, those that outlive 10 s killed)."""


def run_single() -> int:
    env = prepare(EDGE.config)
    if env is None:
        return 2
    children = Children(env)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if not start_fakes(children):
            return 1
        children.start(twistd_command("iop-edge", EDGE.config), tier=EDGES)
        if not wait_for_port(*ADMIN, timeout=20):
            print("iop-edge did not start; see its log above", file=sys.stderr)
            return 1
        essential = [child for tier in children.tiers for child in tier]
        nodes = start_nodes(children, DEMO_CONFIG)
        admin = EDGE.admin
        if not wait_for_nodes([admin], essential, NODES_READY_SEC):
            print("the demo nodes are not ready yet; see their logs above", file=sys.stderr)
        print(
            "\nIOP demo is up: edge (nodes on 127.0.0.1:7443 over TLS, client API on :8080 with\n"
            "key sk-iop-demo, admin on :8081), nodes demo-a and demo-b, and fake providers behind\n"
            "them (OpenAI-compatible :9001, Ollama :9002, a scripted CLI agent).\n"
            f"  open {admin}/ in a browser: the live console (nodes, providers, requests)\n"
            + try_it_lines(admin)
            + "".join(f"node {name}: pid {node.pid}\n" for name, node in nodes.items())
            + "Stop one node (kill <pid>): the Edge and the other node keep serving.\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        gone: set[str] = set()
        while all(child.poll() is None for child in essential):
            report_nodes(nodes, gone, "the Edge and the other node keep serving")
            time.sleep(0.5)
        return 1
    except (KeyboardInterrupt, Stopped):
        return 0
    finally:
        signal.signal(signal.SIGTERM, quiet)
        signal.signal(signal.SIGINT, quiet)
        children.stop()


def report_nodes(nodes: dict[str, subprocess.Popen[bytes]], gone: set[str], rest: str) -> None:
    for name, node in nodes.items():
        code = node.poll()
        if code is not None and name not in gone:
            gone.add(name)
            print(f"node {name} (pid {node.pid}) exited ({code}); {rest}", flush=True)


def start_redis(children: Children, password: str) -> subprocess.Popen[bytes] | None:
    """The cluster's private redis-server on ``var/demo/redis.sock``: no TCP port, no
    persistence, the password from its 0600 config file; its log in ``var/demo/redis.log``."""
    conf = STATE / REDIS_CONF
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'requirepass "{password}"\n')
    os.chmod(conf, 0o600)
    (STATE / REDIS_SOCKET).unlink(missing_ok=True)
    # Run in var/demo/ with relative paths: a socket path must fit in 108 bytes, wherever the
    # repository is.
    argv = ["redis-server", REDIS_CONF, "--port", "0", "--save", "", "--appendonly", "no",
            "--unixsocket", REDIS_SOCKET, "--unixsocketperm", "700", "--dir", ".",
            "--logfile", "redis.log"]  # fmt: skip
    redis = children.start(argv, tier=BACKENDS, cwd=STATE)
    socket_path = STATE / REDIS_SOCKET
    if not wait_for_unix_socket(socket_path, redis, timeout=20):
        print(f"redis-server did not start; see {STATE / 'redis.log'}", file=sys.stderr)
        return None
    # A fresh, empty table would hold the first grant back for one lease TTL (its recovery
    # period, while Edges re-assert the leases they held: iop.edge.cluster.scripts). No Edge has
    # run against this new Redis, so there is nothing to re-assert: mark the table established.
    replies = redis_call(
        socket_path, ("AUTH", password), ("SET", f"{{{REDIS_KEY_PREFIX}}}:epoch", "0")
    )
    if replies != [b"+OK", b"+OK"]:
        print("redis-server refused the demo's password", file=sys.stderr)
        return None
    return redis


def cluster_banner(
    edges: dict[str, subprocess.Popen[bytes]], nodes: dict[str, subprocess.Popen[bytes]]
) -> str:
    """What the cluster demo prints once it is up: what runs where, how to try it, the pids."""
    first, second = CLUSTER_EDGES
    return (
        "\nIOP demo is up as a cluster of two Edges on one host: edge-1 and edge-2 share the\n"
        "client API on :8080 (key sk-iop-demo; the kernel spreads connections over them),\n"
        f"each with its own node port ({first.node_port}, {second.node_port}; TLS) and admin "
        f"port ({first.admin_port}, {second.admin_port}), and one provider\n"
        f"lease table in a private redis-server ({STATE / REDIS_SOCKET}). Nodes demo-a and "
        "demo-b dial\n"
        "both Edges; fake providers behind them (OpenAI-compatible :9001, Ollama :9002, a\n"
        "scripted CLI agent).\n"
        f"  open {first.admin}/ or {second.admin}/ in a browser: each Edge's live console\n"
        + try_it_lines(first.admin)
        + f"  curl {second.admin}/status      # edge-2: its own node sessions and queue\n"
        '  (each /status ends with "cluster": redis up or not, leases held over both Edges,\n'
        "  every Edge reporting in)\n"
        + "".join(f"edge {name}: pid {edge.pid}\n" for name, edge in edges.items())
        + "".join(f"node {name}: pid {node.pid}\n" for name, node in nodes.items())
        + "Stop one Edge (kill <pid>): the other keeps serving :8080 through both nodes; the\n"
        "stopped Edge's leases expire within 5 s. Stop one node: the Edges and the other node\n"
        "keep serving. Ctrl-C stops everything.\n"
    )


def run_cluster() -> int:
    if shutil.which("redis-server") is None:
        print(
            "make run-cluster needs redis-server, which is not installed "
            "(Debian: apt-get install redis-server)",
            file=sys.stderr,
        )
        return 2
    env = prepare(CLUSTER_EDGES[0].config)
    if env is None:
        return 2
    ports = [CLIENT_PORT, *(p for _, p, _ in FAKES)]
    ports += [port for edge in CLUSTER_EDGES for port in (edge.node_port, edge.admin_port)]
    taken = [port for port in ports if port_taken(port)]
    if taken:
        print(
            f"port(s) {', '.join(map(str, taken))} already in use on 127.0.0.1 (another demo "
            "running?); the cluster demo needs them free",
            file=sys.stderr,
        )
        return 1
    password = secret_file(STATE / REDIS_PASSWORD)
    env["IOP_DEMO_REDIS_PASSWORD"] = password
    children = Children(env)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        redis = start_redis(children, password)
        if redis is None or not start_fakes(children):
            return 1
        edges: dict[str, subprocess.Popen[bytes]] = {}
        for spec in CLUSTER_EDGES:
            edge = children.start(
                twistd_command("iop-edge", spec.config), tier=EDGES, label=spec.name
            )
            edges[spec.name] = edge
            up = wait_for_port("127.0.0.1", spec.admin_port, timeout=20)
            if not up or edge.poll() is not None:
                print(f"iop-edge {spec.name} did not start; see its log above", file=sys.stderr)
                return 1
        essential = list(children.tiers[BACKENDS])
        nodes = start_nodes(children, CLUSTER_CONFIG, labelled=True)
        admins = [spec.admin for spec in CLUSTER_EDGES]
        if not wait_for_nodes(admins, [*essential, *edges.values()], NODES_READY_SEC):
            print("the demo nodes are not ready yet; see their logs above", file=sys.stderr)
        print(cluster_banner(edges, nodes), flush=True)
        gone: set[str] = set()
        while all(child.poll() is None for child in essential):
            for name, edge in edges.items():
                code = edge.poll()
                if code is not None and name not in gone:
                    gone.add(name)
                    rest = [other for other in edges if other not in gone]
                    if rest:
                        print(
                            f"edge {name} (pid {edge.pid}) exited ({code}); {rest[0]} keeps "
                            "serving :8080 and the nodes",
                            flush=True,
                        )
            if all(edge.poll() is not None for edge in edges.values()):
                print("both Edges are gone; stopping the demo", flush=True)
                return 1
            report_nodes(nodes, gone, "the Edges and the other node keep serving")
            time.sleep(0.5)
        return 1
    except (KeyboardInterrupt, Stopped):
        return 0
    finally:
        signal.signal(signal.SIGTERM, quiet)
        signal.signal(signal.SIGINT, quiet)
        children.stop()


if __name__ == "__main__":
    sys.exit(main())
