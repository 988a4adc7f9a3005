"""
``make run-cluster`` (``python -m iop.testing.demo --cluster``) end to end: the launcher in a
copy of the repository's layout (``etc/iop/demo/``, its own ``var/demo/``), its private
``redis-server``, two Edges sharing the client port :8080 and both demo nodes dialing both.

- Chats through :8080 answer; both Edges' ``/status`` show both nodes ready and a ``cluster``
  section with Redis up and both Edges reporting.
- An Edge stopped: the launcher says so and keeps running; the other Edge serves.
- SIGTERM to the launcher: it exits 0 and every child it started is gone.

The demo listens on fixed ports (its committed configs name them): the end-to-end test skips
when one is taken. Also here: the cluster configs mirror the single-Edge demo's and pass
``iop config check``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ERROR_MARKERS
from tests.harness import port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "etc" / "iop" / "demo"
CLUSTER = DEMO / "cluster"
CLIENT_PORT = 8080
EDGES = {"edge-1": (7443, 8081), "edge-2": (7444, 8083)}
PORTS = (CLIENT_PORT, 9001, 9002, *(p for ports in EDGES.values() for p in ports))
KEY = "sk-iop-demo"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


# -- the committed configs -------------------------------------------------------------------


def test_cluster_edge_configs_are_the_demo_edge_config_but_for_their_own_lines() -> None:
    single = load(DEMO / "edge.yaml")
    for name, (node_port, admin_port) in EDGES.items():
        config = load(CLUSTER / f"{name}.yaml")
        assert config["edge"] == {"id": name}
        assert config["listen"] == {
            "nodes": f"tcp:{node_port}:interface=127.0.0.1",
            "admin": f"tcp:{admin_port}:interface=127.0.0.1",
        }
        assert config["openai"].pop("reuse_port") is True
        cluster = config.pop("cluster")
        assert cluster["edge_id"] == name
        assert cluster["password"] == "${IOP_DEMO_REDIS_PASSWORD}"
        assert cluster["redis"].endswith("/var/demo/redis.sock")
        for key in ("cert_file", "key_file"):  # one directory deeper, the same files
            tls = config["node_transport"]["tls"]
            assert tls[key] == "../" + single["node_transport"]["tls"][key]
            tls[key] = single["node_transport"]["tls"][key]
        # Each Edge keeps its own usage ledger (one directory deeper, a file of its own).
        ledger = config["usage"]["ledger"]
        assert ledger["path"] == f"../../../../var/demo/usage-{name}.sqlite3"
        ledger["path"] = single["usage"]["ledger"]["path"]
        for key in ("edge", "listen"):
            del config[key]
        assert config == {k: v for k, v in single.items() if k not in ("edge", "listen")}


def test_cluster_node_configs_dial_both_edges() -> None:
    for name in ("node.yaml", "node-b.yaml"):
        single, config = load(DEMO / name), load(CLUSTER / name)
        edge = single.pop("edge")
        edge["ca_file"] = "../" + edge["ca_file"]
        assert config.pop("edges") == [
            dict(edge, port=node_port) for node_port, _ in EDGES.values()
        ]
        assert config == single


def test_cluster_configs_pass_config_check() -> None:
    for path in sorted(CLUSTER.glob("*.yaml")):
        result = subprocess.run(
            [sys.executable, "-m", "iop.cli", "config", "check", "--offline", str(path)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            timeout=60,
        )
        assert (result.returncode, result.stderr) == (0, ""), result.stdout
        assert ": ok (" in result.stdout


# -- the launcher ----------------------------------------------------------------------------


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def status(edge: str) -> dict[str, Any] | None:
    try:
        return get_json(f"http://127.0.0.1:{EDGES[edge][1]}/status")
    except (OSError, ValueError):
        return None


def chat(model: str) -> int:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{CLIENT_PORT}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
            assert answer["choices"][0]["message"]["content"], answer
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def ready_everywhere(edge: str) -> bool:
    """The Edge's /status: both nodes ready, Redis up, both Edges reporting in the cluster."""
    snapshot = status(edge)
    if snapshot is None:
        return False
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    cluster = snapshot.get("cluster") or {}
    return (
        all(nodes[n]["connected"] and nodes[n]["state"] == "ready" for n in ("demo-a", "demo-b"))
        and cluster.get("edge_id") == edge
        and cluster.get("redis") == "up"
        and {e["id"] for e in cluster.get("edges", [])} == set(EDGES)
    )


def children_of(pid: int) -> set[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold blanks and parentheses
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """The repository layout the launcher runs in: etc/iop/demo/ (copied), no var/ yet."""
    shutil.copytree(DEMO, tmp_path / "etc" / "iop" / "demo")
    return tmp_path


@pytest.fixture
def launcher(layout: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    if sys.platform != "linux":
        pytest.skip("two Edges share a port with SO_REUSEPORT: Linux only")
    taken = [port for port in PORTS if port_open(port)]
    if taken:
        pytest.skip(f"the demo's fixed ports are taken: {taken}")
    log = layout / "launcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "iop.testing.demo", "--cluster"],
            cwd=layout,
            env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    yield proc, log
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_run_cluster(launcher: tuple[subprocess.Popen[bytes], Path], layout: Path) -> None:
    proc, log = launcher

    def banner() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")
        return "Ctrl-C stops everything." in log.read_text(errors="replace")

    wait_until(banner, 60, "the launcher's banner")
    for edge in EDGES:
        wait_until(functools.partial(ready_everywhere, edge), 30, f"{edge}: ready, cluster up")
    output = log.read_text(errors="replace")
    for edge in EDGES:
        assert f"http://127.0.0.1:{EDGES[edge][1]}/status" in output
    pids = {
        line.split(": pid ")[0]: int(line.split(": pid ")[1])
        for line in output.splitlines()
        if ": pid " in line
    }
    assert set(pids) == {"edge edge-1", "edge edge-2", "node demo-a", "node demo-b"}, output
    started = children_of(proc.pid)
    assert set(pids.values()) <= started
    assert len(started) == len(pids) + 3  # and redis-server, the two fake upstreams

    results = [chat(model) for model in ("demo-pool", "demo-openai") * 4]
    assert results == [200] * 8

    # One Edge stopped: the launcher says so and keeps running, the other Edge serves :8080.
    os.kill(pids["edge edge-1"], signal.SIGTERM)
    wait_until(lambda: "edge edge-1 (pid" in log.read_text(errors="replace"), 20, "the report")
    assert "edge-2 keeps serving" in log.read_text(errors="replace")
    assert proc.poll() is None
    assert [chat("demo-pool") for _ in range(4)] == [200] * 4
    survivor = status("edge-2")
    assert survivor is not None and survivor["cluster"]["redis"] == "up"
    assert all(n["connected"] for n in survivor["nodes"])

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert [pid for pid in started if alive(pid)] == []
    output = log.read_text(errors="replace")
    for marker in ERROR_MARKERS:
        assert marker not in output, output
    state = layout / "var" / "demo"
    for secret in ("node.token", "node-b.token", "redis.password"):
        path = state / secret
        assert path.stat().st_mode & 0o077 == 0
        assert path.read_text().strip() not in output
    assert (state / "redis.conf").stat().st_mode & 0o077 == 0
