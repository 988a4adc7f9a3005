"""
The systems under test, each started as real processes on loopback in a private directory:

- the fake upstreams (:mod:`iop.testing.fake_openai`, :mod:`iop.testing.fake_ollama`), one of
  each per answer size (tokens per answer), every answer written at once (no delay);
- IOP: one Edge and one Node as ``twistd`` daemons, TLS between them with a throwaway PKI and a
  random node token (handed over in the environment, never written to a file), the Edge's
  OpenAI-compatible client listener on loopback without auth, per answer size one adapter,
  provider and pooled model for each fake upstream (``bench-tunnel-<tokens>``,
  ``bench-run-<tokens>``), and optionally many extra ``nodes[]`` entries (``token_sha256``
  only) for :mod:`bench.fakenodes`;
- IOP in managed mode (``managed=True``): the same, plus mTLS with the node's workload
  certificate, a lease-signing key and the node's recipient key (:mod:`iop.security.keys`), and
  the provider bound to a credential slot whose secret (random, in a 0600 file) reaches the node
  only sealed in each tunnel request's lease;
- the LiteLLM proxy from its own virtualenv with an explicit worker count, per answer size one
  model (``bench-litellm-<tokens>``) pointing at that size's fake OpenAI upstream.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.procs import BenchError, Child, Children, port_open, wait_until
from iop.security.keys import generate_issuer, generate_recipient, write_issuer, write_recipient
from iop.testing.pki import DEFAULT_EDGE_NAME, create_dev_pki
from iop.testing.ports import free_port

TWISTD = str(Path(sys.executable).with_name("twistd"))
NODE_NAME = "bench"
# What the load generator asks for on each target: the upstreams' own model names, and the
# gateways' models, one per answer size (see the functions below).
OPENAI_MODEL = "demo-model"
OLLAMA_MODEL = "llama3.2"


def tunnel_model(tokens: int) -> str:
    """IOP's pooled model over the ``openai_compat`` provider of the ``tokens``-token upstream."""
    return f"bench-tunnel-{tokens}"


def run_model(tokens: int) -> str:
    """IOP's pooled model over the ``ollama`` provider of the ``tokens``-token upstream."""
    return f"bench-run-{tokens}"


def litellm_model(tokens: int) -> str:
    """LiteLLM's model for the ``tokens``-token fake OpenAI upstream."""
    return f"bench-litellm-{tokens}"


def get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def base_env() -> dict[str, str]:
    """The environment children start with: ours, minus anything that would steer them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IOP_", "LITELLM_"))}
    env.pop("DATABASE_URL", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Upstream:
    name: str
    port: int
    child: Child

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = get_json(f"http://127.0.0.1:{self.port}/_fake/stats")
        return stats


def start_upstream(
    children: Children, root: Path, module: str, args: list[str], label: str | None = None
) -> Upstream:
    """``python -m iop.testing.<module> --port P ...``, once its port is open."""
    port = free_port()
    name = label or module
    child = children.start(
        name,
        [sys.executable, "-m", f"iop.testing.{module}", "--port", str(port), *args],
        base_env(),
        root / f"{name}.log",
    )
    wait_until(lambda: port_open(port) or not child.running(), 30, f"{name} on port {port}")
    child.check()
    return Upstream(name, port, child)


# -- IOP -----------------------------------------------------------------------------------------


@dataclass
class IOP:
    """One Edge + one Node (and the directory holding their config, PKI and logs)."""

    root: Path
    node_port: int
    admin_port: int
    client_port: int
    edge: Child
    node: Child
    fake_tokens_file: Path | None = None

    @property
    def ca_file(self) -> Path:
        return self.root / "pki" / "ca.crt"

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = get_json(f"http://127.0.0.1:{self.admin_port}/status")
        return status

    def connected_nodes(self) -> int:
        try:
            return sum(1 for n in self.status()["nodes"] if n["connected"])
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            return 0


def edge_config(
    *,
    node_port: int,
    admin_port: int,
    client_port: int,
    openai_ports: Mapping[int, int],
    ollama_ports: Mapping[int, int],
    capacity: int,
    fake_digests: list[str],
    managed: bool = False,
) -> dict[str, Any]:
    """
    ``openai_ports`` / ``ollama_ports``: the fake upstreams' ports by tokens per answer; each
    gets its own adapter, provider and pooled model on the one Node.
    """
    adapters: list[dict[str, Any]] = []
    providers: list[dict[str, Any]] = []
    models: list[dict[str, Any]] = []
    for tokens, port in sorted(openai_ports.items()):
        adapters.append(
            {
                "name": f"fake-openai-{tokens}",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "max_concurrency": capacity,
            }
        )
        providers.append(
            {
                "id": f"bench-openai-{tokens}",
                "adapter": f"fake-openai-{tokens}",
                "category": "api",
                "models": [OPENAI_MODEL],
                "capacity": capacity,
            }
        )
        models.append({"id": tunnel_model(tokens), "providers": [f"bench-openai-{tokens}"]})
    openai_providers = list(providers)
    for tokens, port in sorted(ollama_ports.items()):
        adapters.append(
            {
                "name": f"fake-ollama-{tokens}",
                "type": "ollama",
                "base_url": f"http://127.0.0.1:{port}",
                "max_concurrency": capacity,
            }
        )
        providers.append(
            {
                "id": f"bench-ollama-{tokens}",
                "adapter": f"fake-ollama-{tokens}",
                "category": "local_inference",
                "models": [OLLAMA_MODEL],
                "capacity": capacity,
            }
        )
        models.append({"id": run_model(tokens), "providers": [f"bench-ollama-{tokens}"]})
    nodes: list[dict[str, Any]] = [
        {
            "id": NODE_NAME,
            "token": "${BENCH_NODE_TOKEN}",
            "adapters": adapters,
            "providers": providers,
        }
    ]
    nodes += [
        {"id": f"fake-{i:05d}", "token_sha256": digest} for i, digest in enumerate(fake_digests)
    ]
    managed_parts: dict[str, Any] = {}
    tls: dict[str, Any] = {"cert_file": "pki/edge.crt", "key_file": "pki/edge.key"}
    if managed:
        tls["client_ca_file"] = "pki/ca.crt"
        nodes[0]["recipient_key_file"] = "keys/node.recipient.pub"
        for provider in openai_providers:
            provider.update(profile="openai-chat", credential="upstream")
        managed_parts = {
            "security": {"mode": "managed", "lease": {"signing_key_file": "keys/issuer.key"}},
            "credentials": [{"name": "upstream", "secret_file": "secrets/upstream.key"}],
            "protocol_profiles": [
                {
                    "name": "openai-chat",
                    "driver": "openai_chat",
                    "operations": {"chat_completions": "/chat/completions"},
                    "capabilities": ["chat", "streaming", "tools"],
                    "auth_header": "authorization",
                }
            ],
        }
    return {
        **managed_parts,
        "edge": {"id": "bench-edge"},
        "listen": {
            "nodes": f"tcp:{node_port}:interface=127.0.0.1",
            "admin": f"tcp:{admin_port}:interface=127.0.0.1",
        },
        "node_transport": {"tls": tls, "heartbeat": {"interval_sec": 2, "timeout_sec": 5}},
        "nodes": nodes,
        "models": models,
        "openai": {
            "listen": f"tcp:{client_port}:interface=127.0.0.1",
            "auth": {"enabled": False},
        },
    }


def start_iop(
    children: Children,
    root: Path,
    *,
    openai_ports: Mapping[int, int],
    ollama_ports: Mapping[int, int],
    capacity: int,
    fake_nodes: int = 0,
    managed: bool = False,
    telemetry: dict[str, Any] | None = None,
) -> IOP:
    """
    Write the PKI and configs under ``root``, start the Edge, then the Node; wait for ready.
    ``openai_ports`` / ``ollama_ports``: the fake upstreams by tokens per answer (see
    :func:`edge_config`); ``managed``: managed mode (module docstring); ``telemetry``: the
    ``telemetry:`` section both daemons get (None: none, tracing off).
    """
    root.mkdir(parents=True, exist_ok=True)
    create_dev_pki(root / "pki", node_names=[NODE_NAME])
    if managed:
        write_managed_keys(root)
    env = base_env()
    env["BENCH_NODE_TOKEN"] = secrets.token_urlsafe(32)
    fake_tokens = [secrets.token_urlsafe(24) for _ in range(fake_nodes)]
    tokens_file: Path | None = None
    if fake_tokens:
        tokens_file = root / "fake-node-tokens"
        fd = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(fake_tokens) + "\n")
    node_port, admin_port, client_port = free_port(), free_port(), free_port()
    config = edge_config(
        node_port=node_port,
        admin_port=admin_port,
        client_port=client_port,
        openai_ports=openai_ports,
        ollama_ports=ollama_ports,
        capacity=capacity,
        fake_digests=[hashlib.sha256(t.encode()).hexdigest() for t in fake_tokens],
        managed=managed,
    )
    if telemetry is not None:
        config["telemetry"] = telemetry
    (root / "edge.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    node_config: dict[str, Any] = {
        "edge": {
            "host": "127.0.0.1",
            "port": node_port,
            "server_name": DEFAULT_EDGE_NAME,
            "ca_file": "pki/ca.crt",
        },
        "token": "${BENCH_NODE_TOKEN}",
        "reconnect": {"max_attempts": 0, "interval_sec": 0.5},
        "store": {"path": f"file:{root}/node.db?cache=shared&mode=rwc"},
    }
    if managed:
        node_config["edge"].update(
            cert_file=f"pki/node-{NODE_NAME}.crt", key_file=f"pki/node-{NODE_NAME}.key"
        )
        node_config["security"] = {
            "mode": "managed",
            "recipient_key_file": "keys/node.recipient.key",
            "issuer_key_file": "keys/issuer.pub",
        }
    if telemetry is not None:
        node_config["telemetry"] = telemetry
    (root / "node.yaml").write_text(yaml.safe_dump(node_config, sort_keys=False))

    def twistd(plugin: str, config: str) -> list[str]:
        return [TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", config]

    edge = children.start("iop-edge", twistd("iop-edge", "edge.yaml"), env, root / "edge.log", root)
    wait_until(
        lambda: (port_open(admin_port) and port_open(client_port)) or not edge.running(),
        30,
        "the Edge's admin and client listeners",
    )
    edge.check()
    node = children.start("iop-node", twistd("iop-node", "node.yaml"), env, root / "node.log", root)
    iop = IOP(root, node_port, admin_port, client_port, edge, node, tokens_file)
    wait_until(lambda: iop.connected_nodes() >= 1 or not node.running(), 30, "the Node to be ready")
    node.check()
    return iop


def write_managed_keys(root: Path) -> None:
    """The lease keys and the provider's (random) secret for a managed IOP under ``root``."""
    keys = root / "keys"
    keys.mkdir(exist_ok=True)
    write_issuer(generate_issuer(), str(keys / "issuer.key"), str(keys / "issuer.pub"))
    write_recipient(
        generate_recipient(), str(keys / "node.recipient.key"), str(keys / "node.recipient.pub")
    )
    (root / "secrets").mkdir(exist_ok=True)
    fd = os.open(root / "secrets" / "upstream.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("sk-bench-" + secrets.token_urlsafe(24) + "\n")


# -- LiteLLM -------------------------------------------------------------------------------------


# Seconds LiteLLM may take to start (it imports a lot; several workers import it at once).
LITELLM_START_S = 300


@dataclass
class LiteLLM:
    name: str
    port: int
    child: Child
    version: str
    workers: int

    def wait_ready(self) -> None:
        """Until the proxy answers ``/health/liveliness`` (BenchError if it exits or lingers)."""

        def alive() -> bool:
            if not self.child.running():
                return True
            try:
                get_json(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2)
                return True
            except (OSError, urllib.error.URLError, ValueError):
                return False

        wait_until(
            alive, LITELLM_START_S, f"the LiteLLM proxy ({self.name}) to answer /health/liveliness"
        )
        self.child.check()


def litellm_available(venv: Path) -> bool:
    return (venv / "bin" / "litellm").exists()


def litellm_version(venv: Path) -> str:
    for info in (venv / "lib").glob("python*/site-packages/litellm-*.dist-info"):
        return info.name.removeprefix("litellm-").removesuffix(".dist-info")
    return "unknown"


def start_litellm(
    children: Children,
    root: Path,
    venv: Path,
    openai_ports: Mapping[int, int],
    workers: int = 1,
    name: str = "litellm",
    wait: bool = True,
) -> LiteLLM:
    """
    The LiteLLM proxy on its own port: no database, no telemetry, the local model cost map (no
    network), no retries, no client auth, ``workers`` worker processes, per answer size one
    model ``openai/<name>`` at that size's fake upstream (:func:`litellm_model`). ``name``
    names the child (and its log). ``wait``: return once it answers (else call
    :meth:`LiteLLM.wait_ready`, e.g. after starting another one beside it).
    """
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "model_list": [
            {
                "model_name": litellm_model(tokens),
                "litellm_params": {
                    "model": f"openai/{OPENAI_MODEL}",
                    "api_base": f"http://127.0.0.1:{port}/v1",
                    "api_key": "sk-bench-not-a-secret",
                    "max_retries": 0,
                },
            }
            for tokens, port in sorted(openai_ports.items())
        ],
        "litellm_settings": {"num_retries": 0, "request_timeout": 120, "telemetry": False},
        "router_settings": {"num_retries": 0},
        # No client auth, like the IOP listener here (loopback, auth off): no master key, which
        # this LiteLLM only accepts when told so explicitly.
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    env = base_env()
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["LITELLM_TELEMETRY"] = "False"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    child = children.start(
        name,
        [
            str(venv / "bin" / "litellm"),
            "--config",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            str(workers),
            # With several workers uvicorn's supervisor kills a worker that has not answered
            # its health check within a few seconds, and importing the proxy takes longer than
            # that on a busy machine: the workers would be restarted forever.
            *(["--timeout_worker_healthcheck", str(LITELLM_START_S)] if workers > 1 else []),
            "--telemetry",
            "False",
        ],
        env,
        root / f"{name}.log",
        root,
    )

    proxy = LiteLLM(name, port, child, litellm_version(venv), workers)
    if wait:
        proxy.wait_ready()
    return proxy


def stop_quietly(children: Children) -> None:
    try:
        children.stop_all()
    except (OSError, BenchError):
        pass
