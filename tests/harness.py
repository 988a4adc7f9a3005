"""
The system-test harness: real ``twistd`` processes on loopback, real TLS with a throwaway CA,
each cluster in its own directory with its own ports and token.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from iop.testing.ports import free_port

TWISTD = str(Path(sys.executable).with_name("twistd"))
# Client API keys of a cluster whose config uses :meth:`Cluster.client_api`: one for every model,
# one limited to the models named there.
CLIENT_KEY = "sk-systest-all-models"
LIMITED_CLIENT_KEY = "sk-systest-limited"


AGENTS_BIN = Path(__file__).with_name("agents") / "node_modules" / ".bin"


def agent_cli(name: str) -> str:
    """The path of an npm-installed agent CLI (``claude``, ``codex``); skips the test without it."""
    path = AGENTS_BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (make agents: npm could not install it)")
    return str(path)


# The OpenAI Chat protocol profile of write_chat_edge_config's provider.
OPENAI_CHAT_PROFILE: dict[str, Any] = {
    "name": "openai-chat",
    "driver": "openai_chat",
    "operations": {"chat_completions": "/chat/completions"},
    "capabilities": ["chat", "streaming", "tools"],
}


@dataclass
class Daemon:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    # RLIMIT_NOFILE (soft, hard) the process starts under; None: the test process's own.
    nofile: tuple[int, int] | None = None

    def start(self) -> Daemon:
        nofile = self.nofile

        def limit_files() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=limit_files if nofile is not None else None,
            )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.running():
            self.signal(signal.SIGTERM)
            try:
                self.wait(10)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    """One Edge and its nodes, configured in a private directory."""

    root: Path
    token: str
    node_port: int
    admin_port: int
    env: dict[str, str]
    daemons: list[Daemon] = field(default_factory=list)
    # The client API listener (OpenAI/Anthropic-compatible), when the config opens one.
    client_port: int = field(default_factory=free_port)
    # With IOP_TEST_CLUSTER: the ``cluster:`` section every Edge config gets (unless it has one).
    cluster_section: dict[str, Any] | None = None

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def client_api(
        self,
        *,
        limited_models: list[str] | None = None,
        model_routes: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """
        An ``openai:`` section: the client listener on :attr:`client_port` with auth on, the key
        :data:`CLIENT_KEY` for every model and :data:`LIMITED_CLIENT_KEY` for
        ``limited_models`` (both held as sha256 digests), plus ``model_routes``.
        """
        keys: list[dict[str, Any]] = [
            {"name": "all", "key_sha256": hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}
        ]
        if limited_models:
            keys.append(
                {
                    "name": "limited",
                    "key_sha256": hashlib.sha256(LIMITED_CLIENT_KEY.encode()).hexdigest(),
                    "models": limited_models,
                }
            )
        section: dict[str, Any] = {
            "listen": f"tcp:{self.client_port}:interface=127.0.0.1",
            "auth": {"enabled": True, "keys": keys},
            **extra,
        }
        if model_routes:
            section["model_routes"] = model_routes
        return section

    def write_edge_config(self, **overrides: Any) -> Path:
        config: dict[str, Any] = {
            "edge": {"id": "systest-edge"},
            "listen": {
                "nodes": f"tcp:{self.node_port}:interface=127.0.0.1",
                "admin": f"tcp:{self.admin_port}:interface=127.0.0.1",
            },
            "node_transport": {
                "tls": {"cert_file": "pki/edge.crt", "key_file": "pki/edge.key"},
                "heartbeat": {"interval_sec": 1, "timeout_sec": 3},
            },
            "nodes": [
                {
                    "id": "node-a",
                    "token": "${IOP_TEST_NODE_TOKEN}",
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
                        },
                        {
                            "id": "a-off",
                            "adapter": "fake-openai",
                            "category": "api",
                            "models": ["m"],
                            "enabled": False,
                        },
                    ],
                }
            ],
            "models": [{"id": "pool", "providers": ["a-chat"]}],
        }
        config.update(overrides)
        if self.cluster_section is not None and "cluster" not in config:
            config["cluster"] = dict(self.cluster_section)
        path = self.root / "edge.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def write_chat_edge_config(
        self, upstream_port: int, *, capacity: int = 4, **overrides: Any
    ) -> Path:
        """
        The one-provider Edge several suites use: node-a's ``openai_compat`` adapter at the fake
        OpenAI upstream on ``upstream_port``, provider ``p-chat`` (profile ``openai-chat``,
        ``capacity``) serving model ``chat``, the client API with auth on; ``overrides`` as
        :meth:`write_edge_config`'s (e.g. ``openai=`` with CORS).
        """
        config: dict[str, Any] = {
            "protocol_profiles": [OPENAI_CHAT_PROFILE],
            "nodes": [
                {
                    "id": "node-a",
                    "token": "${IOP_TEST_NODE_TOKEN}",
                    "adapters": [
                        {
                            "name": "fake-openai",
                            "type": "openai_compat",
                            "base_url": f"http://127.0.0.1:{upstream_port}/v1",
                        }
                    ],
                    "providers": [
                        {
                            "id": "p-chat",
                            "adapter": "fake-openai",
                            "category": "api",
                            "models": ["demo-model"],
                            "profile": "openai-chat",
                            "capacity": capacity,
                        }
                    ],
                }
            ],
            "models": [{"id": "chat", "providers": ["p-chat"], "default_max_tokens": 64}],
            "openai": self.client_api(),
        }
        config.update(overrides)
        return self.write_edge_config(**config)

    def join_node(self, token_file: Path, *extra: str) -> Daemon:
        """A node started with the one-line join (no node.yaml): ``twistd -n iop-node --edge
        --token-file --ca-file --store`` plus ``extra`` flags."""
        argv = [
            TWISTD,
            "--nodaemon",
            "--pidfile=",
            "--logfile=-",
            "iop-node",
            "--edge",
            f"127.0.0.1:{self.node_port}",
            "--token-file",
            str(token_file),
            "--ca-file",
            str(self.root / "pki" / "ca.crt"),
            "--store",
            f"file:{self.root}/joined.db?cache=shared&mode=rwc",
            *extra,
        ]
        node = Daemon("joined", argv, self.env, self.root / "joined.log")
        self.daemons.append(node)
        return node.start()

    def start_fake(self, module: str, *args: str) -> int:
        """Start ``python -m iop.testing.<module> --port P ...``; return its port once open."""
        port = free_port()
        fake = Daemon(
            module,
            [sys.executable, "-m", f"iop.testing.{module}", "--port", str(port), *args],
            self.env,
            self.root / f"{module}.log",
        )
        self.daemons.append(fake.start())
        wait_until(lambda: port_open(port), 20, f"{module} on port {port}")
        return port

    def write_runs_edge_config(
        self, openai_port: int, ollama_port: int, cli_env: dict[str, str] | None = None
    ) -> Path:
        """An edge.yaml whose node has one adapter of each kind and a direct route to each."""
        adapters = [
            {
                "name": "fake-openai",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{openai_port}/v1",
                "max_concurrency": 2,
            },
            {
                "name": "fake-ollama",
                "type": "ollama",
                "base_url": f"http://127.0.0.1:{ollama_port}",
                "max_concurrency": 2,
            },
            {
                "name": "agent",
                "type": "cli",
                "command": sys.executable,
                "args": [
                    "-m",
                    "iop.testing.fake_cli_agent",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "-p",
                ],
                "resume_args": ["--resume={session_id}"],
                "output_format": "stream-json",
                "workspace": str(self.root),
                "env": cli_env or {},
                "settings": {"kill_grace_ms": "1000"},
                "max_concurrency": 2,
            },
        ]
        return self.write_edge_config(
            nodes=[
                {
                    "id": "node-a",
                    "token": "${IOP_TEST_NODE_TOKEN}",
                    "adapters": adapters,
                    "providers": [
                        {
                            "id": "a-chat",
                            "adapter": "fake-openai",
                            "category": "api",
                            "models": ["demo-model"],
                        }
                    ],
                }
            ],
            models=[],
            openai={
                "model_routes": [
                    {"model": "demo-openai", "adapter": "fake-openai", "target": "demo-model"},
                    {"model": "demo-ollama", "adapter": "fake-ollama", "target": "llama3.2"},
                    {"model": "demo-cli", "adapter": "agent", "target": "agent-model"},
                ]
            },
        )

    def submit_run(self, body: dict[str, Any]) -> RunStream:
        """POST /runs and return the open NDJSON event stream."""
        connection = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=30)
        connection.request(
            "POST", "/runs", body=json.dumps(body), headers={"content-type": "application/json"}
        )
        return RunStream(connection, connection.getresponse())

    def fake_stats(self, port: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/stats", timeout=5) as r:
            stats: dict[str, Any] = json.loads(r.read())
            return stats

    def write_node_config(self, name: str = "node", **overrides: Any) -> Path:
        config: dict[str, Any] = {
            "edge": {
                "host": "127.0.0.1",
                "port": self.node_port,
                "server_name": "edge.iop.internal",
                "ca_file": "pki/ca.crt",
            },
            "token": "${IOP_TEST_NODE_TOKEN}",
            "reconnect": {"max_attempts": 0, "interval_sec": 0.5},
            "store": {"path": f"file:{self.root}/{name}.db?cache=shared&mode=rwc"},
        }
        config.update(overrides)
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def daemon(self, plugin: str, config: Path, name: str) -> Daemon:
        d = Daemon(
            name,
            [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", str(config)],
            self.env,
            self.root / f"{name}.log",
        )
        self.daemons.append(d)
        return d

    def start_edge(self, nofile: tuple[int, int] | None = None) -> Daemon:
        """Start the Edge (under the open-file limit ``nofile``, soft and hard, if given)."""
        config = self.root / "edge.yaml"
        if not config.exists():
            self.write_edge_config()
        edge = self.daemon("iop-edge", config, "edge")
        edge.nofile = nofile
        edge.start()
        wait_until(lambda: port_open(self.admin_port), 20, "edge admin port")
        section = yaml.safe_load(config.read_text()).get("openai") or {}
        # (A shared port, openai.reuse_port, is joined once the Edge's nodes are ready.)
        if section.get("listen") and not section.get("reuse_port"):
            wait_until(lambda: port_open(self.client_port), 20, "edge client API port")
        return edge

    def start_node(self, name: str = "node") -> Daemon:
        config = self.root / f"{name}.yaml"
        if not config.exists():
            self.write_node_config(name)
        return self.daemon("iop-node", config, name).start()

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.admin + "/status", timeout=5) as response:
            snapshot: dict[str, Any] = json.loads(response.read())
            return snapshot

    def node_connected(self, node_id: str = "node-a") -> bool:
        try:
            nodes = {n["id"]: n for n in self.status()["nodes"]}
        except (OSError, urllib.error.URLError):
            return False
        return bool(nodes[node_id]["connected"])

    def provider(self, provider_id: str) -> dict[str, Any]:
        providers: dict[str, dict[str, Any]] = {p["id"]: p for p in self.status()["providers"]}
        return providers[provider_id]


@dataclass
class RunStream:
    """An admin ``POST /runs`` response read line by line."""

    connection: http.client.HTTPConnection
    response: http.client.HTTPResponse

    @property
    def status(self) -> int:
        return self.response.status

    def run_id(self) -> str:
        return self.response.getheader("x-iop-run-id") or ""

    def next_event(self) -> dict[str, Any] | None:
        line = self.response.readline()
        if not line:
            return None
        event: dict[str, Any] = json.loads(line)
        return event

    def events(self) -> list[dict[str, Any]]:
        out = []
        while (event := self.next_event()) is not None:
            out.append(event)
        return out

    def close(self) -> None:
        """Go away mid-stream, like a client that disconnects."""
        self.response.close()
        self.connection.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; return the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


class ChatStreams:
    """
    ``count`` streamed chats of ``model`` through the official ``openai`` SDK (the client key,
    no retries), a thread each: :meth:`start` begins them, ``gap`` seconds apart;
    :meth:`join` gives each stream's (text, error) once they ended or ``timeout`` passed.
    """

    def __init__(self, cluster: Cluster, count: int, model: str = "chat") -> None:
        self.client = openai.OpenAI(
            base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=120
        )
        self.model = model
        self.results: list[tuple[str, BaseException | None]] = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._chat, daemon=True) for _ in range(count)]

    def start(self, gap: float = 0.0) -> ChatStreams:
        for thread in self.threads:
            thread.start()
            if gap:
                time.sleep(gap)
        return self

    def _chat(self) -> None:
        text, error = "", None
        try:
            stream = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "hello"}], stream=True
            )
            for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
        except BaseException as e:  # the caller's assertion shows it
            error = e
        with self._lock:
            self.results.append((text, error))

    def join(self, timeout: float) -> list[tuple[str, BaseException | None]]:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return list(self.results)
