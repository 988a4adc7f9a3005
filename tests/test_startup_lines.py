"""
What the daemons say when they start, and when they cannot: real ``twistd`` processes.

- Every startup failure of ``twistd iop-edge`` and ``twistd iop-node`` is one or two lines on
  standard error naming the setting and the fix — exact text — with exit code 1, no usage
  text, no traceback, no repr: bad flags, a config file missing, a config that does not
  validate, a port in use (``listen.nodes``, ``listen.admin``, ``openai.listen`` as
  configured), a port not permitted, a TLS certificate that is not one.
- A started Edge logs one banner line with its version and every listener's URL (the real port
  for port 0), and no ``Starting factory`` noise.
- ``make run``'s launcher prints "IOP demo is up" only once its nodes are ready: the first
  request after the banner is served.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from iop import __version__
from tests.harness import TWISTD, Cluster, port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, str]:
    """``twistd -n`` with ``argv``; (exit code, standard error)."""
    result = subprocess.run(
        [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return result.returncode, result.stderr


def assert_plain(stderr: str) -> None:
    assert "Traceback" not in stderr and "Usage:" not in stderr, stderr
    assert "object at 0x" not in stderr and "Error(" not in stderr, stderr


def test_bad_flags() -> None:
    for plugin in ("iop-edge", "iop-node"):
        code, err = run(plugin, "--bogus")
        assert (code, err) == (
            1,
            f"{plugin}: option --bogus not recognized (twistd {plugin} --help lists them)\n",
        )


def test_a_config_file_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    for plugin in ("iop-edge", "iop-node"):
        code, err = run(plugin, "--config", str(missing))
        assert (code, err) == (
            1,
            f"{plugin}: cannot read config file {missing}: No such file or directory "
            "(--config names the file)\n",
        )


def test_a_config_that_does_not_validate(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_text("listen: {}\n")
    code, err = run("iop-edge", "--config", str(path))
    assert (code, err) == (
        1,
        f"iop-edge: invalid config {path} (3 problems):\n"
        "  listen.nodes: is required\n"
        "  node_transport.tls: is required unless node_transport.plaintext is true\n"
        "  nodes: is required\n",
    )


def test_join_flags_missing() -> None:
    code, err = run("iop-node", "--edge", "127.0.0.1:1", "--ca-file", "/nonexistent/ca.crt")
    assert code == 1
    assert err.startswith("iop-node: invalid flags (2 problems):\n"), err
    assert "--ca-file: file /nonexistent/ca.crt does not exist" in err
    assert_plain(err)


@pytest.mark.parametrize("setting", ["listen.nodes", "listen.admin", "openai.listen"])
def test_a_port_in_use_names_its_setting(cluster: Cluster, setting: str) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        if setting == "listen.nodes":
            cluster.node_port = port
        elif setting == "listen.admin":
            cluster.admin_port = port
        else:
            cluster.client_port = port
        path = cluster.write_edge_config(openai=cluster.client_api())
        code, err = run("iop-edge", "--config", str(path), env=cluster.env)
    finally:
        holder.close()
    assert (code, err) == (
        1,
        f"iop-edge: {setting}: 127.0.0.1:{port} is already in use (another Edge, or another "
        f"program, listens there): stop it, or give {setting} another port\n",
    )


def test_a_port_not_permitted(cluster: Cluster) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root, and no setpriv to drop it")
    cluster.write_edge_config(openai=cluster.client_api())
    # A directory every user can read: the Edge runs as nobody when the test runs as root.
    shared = Path(tempfile.mkdtemp(prefix="iop-port-"))
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(cluster.root / "pki", shared / "pki")
        for entry in (shared / "pki").iterdir():
            os.chmod(entry, 0o644)
        os.chmod(shared / "pki", 0o755)
        config = yaml.safe_load((cluster.root / "edge.yaml").read_text())
        config["openai"]["listen"] = "tcp:81:interface=127.0.0.1"
        path = shared / "edge.yaml"
        path.write_text(yaml.safe_dump(config))
        os.chmod(path, 0o644)
        argv = [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", "iop-edge", "--config"]
        argv.append(str(path))
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, env=cluster.env, timeout=30)
    finally:
        shutil.rmtree(shared)
    if "setpriv" in result.stderr:
        pytest.skip(f"cannot run as nobody here: {result.stderr}")
    assert (result.returncode, result.stderr) == (
        1,
        "iop-edge: openai.listen: permission denied binding 127.0.0.1:81 (ports below 1024 "
        "need root or CAP_NET_BIND_SERVICE): choose a port from 1024 up, or grant the "
        "capability\n",
    )


def test_a_certificate_that_is_not_one(cluster: Cluster) -> None:
    path = cluster.write_edge_config()
    bad = cluster.root / "pki" / "edge.crt"
    bad.write_text("not a certificate\n")
    code, err = run("iop-edge", "--config", str(path), env=cluster.env)
    assert (code, err) == (
        1,
        f"iop-edge: node_transport.tls: TLS certificate file '{bad}': no valid PEM "
        "certificate found\n",
    )


def test_the_banner(cluster: Cluster) -> None:
    path = cluster.write_edge_config(openai=cluster.client_api())
    config = yaml.safe_load(path.read_text())
    config["openai"]["listen"] = "tcp:0:interface=127.0.0.1"
    path.write_text(yaml.safe_dump(config))
    edge = cluster.daemon("iop-edge", path, "edge").start()
    wait_until(lambda: " up: clients " in edge.output(), 20, "the banner")
    [line] = [ln for ln in edge.output().splitlines() if " up: clients " in ln]
    banner = line.split("] ", 1)[1]
    prefix = f"iop-edge {__version__} up: clients http://127.0.0.1:"
    assert banner.startswith(prefix), banner
    client_port = int(banner[len(prefix) :].split(",")[0])
    assert client_port != 0 and port_open(client_port)
    assert banner.endswith(
        f", nodes tls://127.0.0.1:{cluster.node_port}, admin http://127.0.0.1:{cluster.admin_port}"
    ), banner
    assert "Starting factory" not in edge.output()
    edge.stop()
    assert "Stopping factory" not in edge.output()


# -- the demo's banner -------------------------------------------------------------------------

DEMO_PORTS = (8080, 8081, 7443, 9001, 9002)


def test_the_demo_banner_comes_once_its_nodes_are_ready(tmp_path: Path) -> None:
    taken = [port for port in DEMO_PORTS if port_open(port)]
    if taken:
        pytest.skip(f"the demo's fixed ports are taken: {taken}")
    shutil.copytree(ROOT / "etc" / "iop" / "demo", tmp_path / "etc" / "iop" / "demo")
    log = tmp_path / "launcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "iop.testing.demo"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def banner() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            return "IOP demo is up" in log.read_text(errors="replace")

        wait_until(banner, 90, "the launcher's banner")
        # At once: the banner's first suggestion, answered (no 503 node_unavailable).
        body = {"model": "demo-pool", "messages": [{"role": "user", "content": "hi"}]}
        request = urllib.request.Request(
            "http://127.0.0.1:8080/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer sk-iop-demo", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{e.code}: {e.read()!r}") from None
        assert "not ready yet" not in log.read_text(errors="replace")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
