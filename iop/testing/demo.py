"""
``make run``: serve the demo — one Edge and two Nodes from ``etc/iop/demo/`` on loopback, over
real TLS with a locally generated development CA, plus the fake providers the node serves: an
OpenAI-compatible upstream, an Ollama upstream and a scripted CLI coding agent.

Creates ``var/demo/`` on first use (dev PKI, a random node token, the agent's workspace; kept so
restarts reuse them), starts the fakes, ``twistd -n iop-edge`` and ``twistd -n iop-node`` as
child processes, prints how to try it (with each node's PID), and stops everything on Ctrl-C. A
node that stops — `kill <pid>` to watch its queue drain to the other — leaves the Edge and the
other node serving; the Edge or a fake stopping ends the demo. The token reaches both
daemons as ``${IOP_DEMO_NODE_TOKEN}`` / ``${IOP_DEMO_NODE_B_TOKEN}``; never into the configs.
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
# Fake upstreams: slow enough per token that streaming is visible.
FAKES = (
    (
        "fake_openai",
        9001,
        ("--delay-ms", "80", "--tokens", "40", "--anthropic-api", "--responses-api"),
    ),
    ("fake_ollama", 9002, ("--delay-ms", "80", "--tokens", "40")),
)


def demo_token(state: Path, name: str = "node") -> str:
    path = state / f"{name}.token"
    if not path.exists():
        state.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


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


def main() -> int:
    if not (DEMO_CONFIG / "edge.yaml").exists():
        print("run this from the repository root (etc/iop/demo/ not found)", file=sys.stderr)
        return 2
    create_dev_pki(STATE / "pki", node_names=["demo-a"])
    (STATE / "workspace").mkdir(parents=True, exist_ok=True)
    bindir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        IOP_DEMO_NODE_TOKEN=demo_token(STATE),
        IOP_DEMO_NODE_B_TOKEN=demo_token(STATE, "node-b"),
        # The node finds the scripted agent (iop-fake-cli-agent) next to this interpreter.
        PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
    )
    children: list[subprocess.Popen[bytes]] = []

    def stop(*_: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        for module, port, args in FAKES:
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", f"iop.testing.{module}", "--port", str(port), *args],
                    env=env,
                    start_new_session=True,
                )
            )
            if not wait_for_port("127.0.0.1", port, timeout=20):
                print(f"{module} did not start on port {port}", file=sys.stderr)
                return 1
        children.append(
            subprocess.Popen(
                twistd_command("iop-edge", DEMO_CONFIG / "edge.yaml"),
                env=env,
                start_new_session=True,
            )
        )
        if not wait_for_port(*ADMIN, timeout=20):
            print("iop-edge did not start; see its log above", file=sys.stderr)
            return 1
        essential = list(children)
        nodes: dict[str, subprocess.Popen[bytes]] = {}
        for name, config in (("demo-a", "node.yaml"), ("demo-b", "node-b.yaml")):
            node = subprocess.Popen(
                twistd_command("iop-node", DEMO_CONFIG / config),
                env=env,
                start_new_session=True,
            )
            children.append(node)
            nodes[name] = node
        admin = f"http://{ADMIN[0]}:{ADMIN[1]}"
        run = "curl -N -X POST " + admin + '/runs -d \'{"model": "%s", "input": "hello"}\''
        chat = (
            "curl -N http://127.0.0.1:8080/v1/chat/completions -H 'authorization: Bearer "
            "sk-iop-demo' -H 'content-type: application/json' -d '{\"model\": \"demo-pool\", "
            '"stream": true, "messages": [{"role": "user", "content": "hello"}]}\''
        )
        print(
            "\nIOP demo is up: edge (nodes on 127.0.0.1:7443 over TLS, client API on :8080 with\n"
            "key sk-iop-demo, admin on :8081), nodes demo-a and demo-b, and fake providers behind\n"
            "them (OpenAI-compatible :9001, Ollama :9002, a scripted CLI agent).\n"
            f"  open {admin}/ in a browser: the live console (nodes, providers, requests)\n"
            f"  {chat}\n"
            f"  curl {admin}/status      # run three chats at once and watch the queue\n"
            f"  curl {admin}/metrics     # Prometheus\n"
            f"  {run % 'demo-openai'}\n"
            f"  {run % 'demo-ollama'}\n"
            f"  {run % 'demo-cli'}\n"
            + "".join(f"node {name}: pid {node.pid}\n" for name, node in nodes.items())
            + "Stop one node (kill <pid>): the Edge and the other node keep serving.\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        gone: set[str] = set()
        while all(child.poll() is None for child in essential):
            for name, node in nodes.items():
                code = node.poll()
                if code is not None and name not in gone:
                    gone.add(name)
                    print(
                        f"node {name} (pid {node.pid}) exited ({code}); the Edge and the other"
                        " node keep serving",
                        flush=True,
                    )
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
