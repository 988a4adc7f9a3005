"""
``make run``: serve the demo — one Edge and one Node from ``etc/iop/demo/`` on loopback, over
real TLS with a locally generated development CA.

Creates ``var/demo/`` on first use (dev PKI and a random node token, kept so restarts reuse
them), starts ``twistd -n iop-edge`` and ``twistd -n iop-node`` as child processes, prints where
to look, and stops both on Ctrl-C. The token reaches both daemons as ``${IOP_DEMO_NODE_TOKEN}``;
it is never written into the configs.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from iop.testing.pki import create_dev_pki

DEMO_CONFIG = Path("etc/iop/demo")
STATE = Path("var/demo")
ADMIN = ("127.0.0.1", 8081)


def demo_token(state: Path) -> str:
    path = state / "node.token"
    if not path.exists():
        state.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def twistd_command(plugin: str, config: Path) -> list[str]:
    twistd = Path(sys.executable).with_name("twistd")
    return [str(twistd), "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", str(config)]


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def main() -> int:
    if not (DEMO_CONFIG / "edge.yaml").exists():
        print("run this from the repository root (etc/iop/demo/ not found)", file=sys.stderr)
        return 2
    create_dev_pki(STATE / "pki", node_names=["demo-a"])
    env = dict(os.environ, IOP_DEMO_NODE_TOKEN=demo_token(STATE))
    children: list[subprocess.Popen[bytes]] = []

    def stop(*_: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        children.append(
            subprocess.Popen(twistd_command("iop-edge", DEMO_CONFIG / "edge.yaml"), env=env)
        )
        if not wait_for_port(*ADMIN, timeout=20):
            print("iop-edge did not start; see its log above", file=sys.stderr)
            return 1
        children.append(
            subprocess.Popen(twistd_command("iop-node", DEMO_CONFIG / "node.yaml"), env=env)
        )
        print(
            "\nIOP demo is up: edge (nodes on 127.0.0.1:7443, TLS) and node demo-a.\n"
            f"  curl http://{ADMIN[0]}:{ADMIN[1]}/status\n"
            f"  curl http://{ADMIN[0]}:{ADMIN[1]}/healthz\n"
            "Ctrl-C stops both.\n",
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    sys.exit(main())
