"""
Managed mode, defence in depth: real ``twistd`` processes, real mTLS, fake upstreams that record
every request they get.

- a lease the real Edge issuer mints for adapter A, replayed by a hostile Edge into a request
  for adapter B on the same node (same profile, same target, another upstream): the node refuses
  it by class (``lease_binding_mismatch``) and upstream B sees nothing; the same lease, sent to
  A, still serves. A normalized run on B reaches no upstream either (``lease_missing``);
- the admin API's ``POST /runs`` on a provider that needs a credential, in managed mode: refused
  by the Edge before anything is sent (the upstream saw no request), while the client API still
  reaches it with the lease;
- a node in legacy mode (no lease support) registering with a managed Edge: refused at
  registration (``REGISTER_REJECT_LEASE_SUPPORT``), the node exits 1, and the Edge's log and
  ``/status`` (``last_refusal``) say why; so is a managed node that trusts another issuer key.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from iop.config.edge import load_edge_config
from iop.config.model import EdgeConfig, ServerTLS
from iop.edge.credentials import CredentialIssuer
from iop.edge.gateway import Placement
from iop.edge.payload import build_node_payload
from iop.security.keys import generate_issuer, write_issuer
from iop.security.tls import server_context_factory
from iop.testing.fake_openai import fake_text
from iop.testing.pki import create_dev_pki
from iop.testing.ports import free_port
from iop.wire import runtime_pb2 as pb
from iop.wire.framing import EnvelopeProtocol
from tests.harness import CLIENT_KEY, Cluster, Daemon, port_open, wait_until
from tests.test_managed_mode import PROFILE, keys, node_home, write_node

TOKENS = 5
MANAGED_SECURITY = {
    "mode": "managed",
    "trust_domain": "iop.internal",
    "lease": {"signing_key_file": "keys/issuer.key", "ttl_sec": 30},
}
MANAGED_TRANSPORT = {
    "tls": {
        "cert_file": "pki/edge.crt",
        "key_file": "pki/edge.key",
        "client_ca_file": "pki/ca.crt",
    },
    "heartbeat": {"interval_sec": 1, "timeout_sec": 3},
}


def start_upstream(cluster: Cluster, name: str, secret: str) -> int:
    """A fake OpenAI upstream (its own log), answering 401 unless it gets the slot's secret."""
    port = free_port()
    env = dict(cluster.env, IOP_FAKE_EXPECT_VALUE=f"Bearer {secret}")
    argv = [sys.executable, "-m", "iop.testing.fake_openai", "--port", str(port)]
    argv += ["--tokens", str(TOKENS), "--expect-header", "authorization"]
    fake = Daemon(name, argv, env, cluster.root / f"{name}.log")
    cluster.daemons.append(fake.start())
    wait_until(lambda: port_open(port), 20, name)
    return port


def saw_nothing(cluster: Cluster, port: int) -> bool:
    stats = cluster.fake_stats(port)
    return (stats["total_requests"], stats["rejected_requests"]) == (0, 0)


def provider_secret(cluster: Cluster) -> str:
    secret = "sk-upstream-" + secrets.token_urlsafe(24)
    (cluster.root / "secrets").mkdir()
    path = cluster.root / "secrets" / "provider.key"
    path.write_text(secret + "\n")
    os.chmod(path, 0o600)
    return secret


def adapter(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "type": "openai_compat", "base_url": f"http://127.0.0.1:{port}/v1"}


def provider(provider_id: str, adapter_name: str) -> dict[str, Any]:
    return {
        "id": provider_id,
        "adapter": adapter_name,
        "category": "api",
        "models": ["demo-model"],
        "profile": "openai-chat",
        "credential": "upstream",
        "capacity": 2,
    }


def managed_edge(cluster: Cluster, adapters: list[dict[str, Any]], **overrides: Any) -> Path:
    """A managed edge.yaml: node-a with ``adapters``, one leased provider on each."""
    config: dict[str, Any] = {
        "security": MANAGED_SECURITY,
        "node_transport": MANAGED_TRANSPORT,
        "credentials": [{"name": "upstream", "secret_file": "secrets/provider.key"}],
        "protocol_profiles": [PROFILE],
        "nodes": [
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "recipient_key_file": "keys/node-a.recipient.pub",
                "adapters": adapters,
                "providers": [provider(f"p-{a['name']}", a["name"]) for a in adapters],
            }
        ],
        "models": [
            {"id": "chat", "providers": [f"p-{adapters[0]['name']}"], "default_max_tokens": 64}
        ],
    }
    config.update(overrides)
    return cluster.write_edge_config(**config)


def start_managed_node(cluster: Cluster, home: Path) -> Daemon:
    node = Daemon(
        "node",
        [
            str(Path(sys.executable).with_name("twistd")),
            "--nodaemon",
            "--pidfile=",
            "--logfile=-",
            "iop-node",
            "--config",
            str(write_node(cluster, home, "node-a")),
        ],
        cluster.env,
        home / "node.log",
    )
    cluster.daemons.append(node)
    return node.start()


# -- 1. a lease for one adapter, replayed into another --------------------------------------------


class Replayer(EnvelopeProtocol):
    """Plays a hostile Edge: the real node payload, then the scripted requests at once."""

    def __init__(self, edge: HostileEdge) -> None:
        super().__init__()
        self.edge = edge

    def envelope_received(self, envelope: pb.Envelope) -> None:
        kind = envelope.WhichOneof("message")
        if kind == "register_request":
            self.edge.registered.append(envelope.register_request)
            response = pb.RegisterResponse(
                accepted=True,
                node_id="node-a",
                heartbeat_interval_ms=1000,
                heartbeat_timeout_ms=5000,
            )
            response.config.CopyFrom(self.edge.payload)
            self.send_envelope(pb.Envelope(register_response=response))
        elif kind == "node_ready_request":
            self.send_envelope(pb.Envelope(node_ready_response=pb.NodeReadyResponse(ready=True)))
            for message in self.edge.script:
                self.send_envelope(message)
        elif kind == "provider_tunnel_frame":
            frame = envelope.provider_tunnel_frame
            if frame.kind in (pb.END, pb.ERROR):
                self.edge.ended(frame.run_id, frame.error if frame.kind == pb.ERROR else "")
        elif kind == "run_event":
            event = envelope.run_event
            if event.type in ("complete", "error", "cancelled"):
                self.edge.ended(event.run_id, event.error or event.type)

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)  # type: ignore[arg-type]


class HostileEdge(Factory):
    def __init__(self, payload: pb.NodeConfigPayload, script: list[pb.Envelope]) -> None:
        self.payload = payload
        self.script = script
        self.registered: list[pb.RegisterRequest] = []
        self.ends: dict[str, str] = {}
        self.done: Deferred[dict[str, str]] = Deferred()

    def ended(self, run_id: str, error: str) -> None:
        self.ends[run_id] = error
        if len(self.ends) == len(self.script) and not self.done.called:
            self.done.callback(dict(self.ends))

    def buildProtocol(self, addr: object) -> Replayer:
        return Replayer(self)


def mint(issuer: CredentialIssuer, config: EdgeConfig, adapter_name: str) -> tuple[Any, bytes]:
    """A lease the real Edge issuer makes for a request placed on ``adapter_name``."""
    profile = next(p for p in config.protocol_profiles if p.name == "openai-chat")
    placement = Placement(
        model="chat",
        node_id="node-a",
        adapter=adapter_name,
        target="demo-model",
        provider_type="openai_compat",
        provider_id=f"p-{adapter_name}",
        profile=profile,
        principal="mallory",
    )
    return issuer.seal(placement, issuer.bind(placement))


def tunnel(run_id: str, adapter_name: str, sealed: tuple[Any, bytes]) -> pb.Envelope:
    body = b'{"model": "demo-model", "messages": [{"role": "user", "content": "hi"}]}'
    return pb.Envelope(
        provider_tunnel_request=pb.ProviderTunnelRequest(
            run_id=run_id,
            adapter=adapter_name,
            target="demo-model",
            method="POST",
            operation="chat_completions",
            profile="openai-chat",
            headers=[pb.Header(name="content-type", value="application/json")],
            body=body,
            credential_binding=sealed[0],
            credential_lease=sealed[1],
        )
    )


@pytest_twisted.ensureDeferred
async def test_a_lease_for_one_adapter_does_not_open_another(cluster: Cluster) -> None:
    secret = provider_secret(cluster)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a")
    port_a = start_upstream(cluster, "upstream-a", secret)
    port_b = start_upstream(cluster, "upstream-b", secret)
    path = managed_edge(cluster, [adapter("chat-a", port_a), adapter("chat-b", port_b)])
    config = load_edge_config(str(path), cluster.env)
    # The hostile Edge holds the real issuer key and mints with the real Edge's issuer.
    issuer = CredentialIssuer.from_config(config, reactor)  # type: ignore[arg-type]
    assert issuer is not None
    node_a = config.nodes[0]
    lease_a = mint(issuer, config, "chat-a")
    script = [
        # A's lease, into a request for B (same profile, same target): refused, not spent.
        tunnel("t-cross", "chat-b", lease_a),
        # The same lease where it was minted for: it serves.
        tunnel("t-own", "chat-a", lease_a),
        # A normalized run on B: no lease, so no upstream call.
        pb.Envelope(
            run_request=pb.RunRequest(
                run_id="r-run", adapter="chat-b", target="demo-model", input="hi"
            )
        ),
    ]
    edge = HostileEdge(build_node_payload(config, node_a), script)
    tls = ServerTLS(
        str(cluster.root / "pki" / "edge.crt"),
        str(cluster.root / "pki" / "edge.key"),
        str(cluster.root / "pki" / "ca.crt"),
    )
    endpoint = SSL4ServerEndpoint(
        reactor, cluster.node_port, server_context_factory(tls), interface="127.0.0.1"
    )
    port = await endpoint.listen(edge)
    try:
        node = start_managed_node(cluster, node_home(cluster, "node-a"))
        ends = await edge.done.addTimeout(60, reactor)
    finally:
        await port.stopListening()
    assert ends["t-cross"].startswith("lease_binding_mismatch: "), ends
    assert "adapter" in ends["t-cross"] and "upstream origin" in ends["t-cross"], ends
    assert ends["t-own"] == "", ends
    assert ends["r-run"].startswith("lease_missing: "), ends
    for error in ends.values():
        assert secret not in error
    # Upstream B never saw a byte; A saw exactly the one request its lease was for.
    assert saw_nothing(cluster, port_b), cluster.fake_stats(port_b)
    stats_a = cluster.fake_stats(port_a)
    assert (stats_a["authorized_requests"], stats_a["unauthorized_requests"]) == (1, 0), stats_a
    # The node announced its lease keys when it registered.
    [register] = edge.registered
    assert register.lease_support == issuer.lease_support_for("node-a")
    node.stop()
    assert secret not in node.output()


# -- 2. the admin API's runs reach no credential-needing provider -------------------------------


def admin_post(cluster: Cluster, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        cluster.admin + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read().splitlines()[0])
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_admin_runs_on_a_leased_provider_are_refused_before_any_upstream_byte(
    cluster: Cluster,
) -> None:
    secret = provider_secret(cluster)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a")
    upstream = start_upstream(cluster, "upstream", secret)
    managed_edge(
        cluster,
        [adapter("chat-a", upstream)],
        openai=cluster.client_api(
            model_routes=[{"model": "direct", "adapter": "chat-a", "target": "demo-model"}]
        ),
    )
    edge = cluster.start_edge()
    node = start_managed_node(cluster, node_home(cluster, "node-a"))
    wait_until(cluster.node_connected, 20, "node-a connected")

    for body in (
        {"model": "chat", "input": "hello"},  # a pool: the provider needs the credential
        {"model": "direct", "input": "hello"},  # a model route
        {"adapter": "chat-a", "target": "demo-model", "input": "hello"},  # the adapter itself
    ):
        status, answer = admin_post(cluster, "/runs", body)
        assert status == 409, (body, status, answer)
        assert "credential lease" in answer["error"]["message"], answer
    assert saw_nothing(cluster, upstream), cluster.fake_stats(upstream)
    wait_until(lambda: cluster.provider("p-chat-a")["in_flight"] == 0, 10, "pool slot released")

    # The lease path still reaches it, with the slot's key, exactly once.
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    hello: Any = [{"role": "user", "content": "hello"}]
    completion = client.chat.completions.create(model="chat", messages=hello)
    assert completion.choices[0].message.content == fake_text(TOKENS)
    stats = cluster.fake_stats(upstream)
    assert (stats["authorized_requests"], stats["unauthorized_requests"]) == (1, 0), stats
    node.stop()
    edge.stop()
    assert secret not in edge.output() and secret not in node.output()


# -- 3. a node that cannot verify leases is refused at registration -----------------------------


def node_status(cluster: Cluster) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {n["id"]: n for n in cluster.status()["nodes"]}
    return nodes["node-a"]


def test_a_legacy_node_is_refused_at_registration(cluster: Cluster) -> None:
    secret = provider_secret(cluster)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a")
    upstream = start_upstream(cluster, "upstream", secret)
    managed_edge(cluster, [adapter("chat-a", upstream)])
    # node-a's own certificate (the identity holds), but security.mode legacy: no leases.
    cluster.write_node_config(
        "legacy",
        edge={
            "host": "127.0.0.1",
            "port": cluster.node_port,
            "server_name": "edge.iop.internal",
            "ca_file": "pki/ca.crt",
            "cert_file": "pki/node-node-a.crt",
            "key_file": "pki/node-node-a.key",
        },
    )
    edge = cluster.start_edge()
    legacy = cluster.start_node("legacy")
    # reconnect.max_attempts 0 (unlimited): only a fatal refusal ends the process.
    assert legacy.wait(30) == 1
    assert cluster.node_connected() is False
    node = node_status(cluster)
    assert node["state"] == "disconnected"
    assert node["identity"]["ok"] is True, node["identity"]
    refusal = node["last_refusal"]
    assert refusal is not None and refusal["code"] == "lease_support", node
    assert "no credential lease support" in refusal["reason"]
    legacy_log = legacy.output()
    assert "REGISTER_REJECT_LEASE_SUPPORT" in legacy_log
    assert "no credential lease support" in legacy_log and "giving up" in legacy_log
    edge_log = edge.output()
    assert "refused node node-a registration" in edge_log
    assert "no credential lease support" in edge_log
    assert saw_nothing(cluster, upstream)


def test_a_managed_node_trusting_another_issuer_is_refused(cluster: Cluster) -> None:
    secret = provider_secret(cluster)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a")
    upstream = start_upstream(cluster, "upstream", secret)
    managed_edge(cluster, [adapter("chat-a", upstream)])
    home = node_home(cluster, "node-a")
    # The node is given another issuer's public key: it could verify none of this Edge's leases.
    other = cluster.root / "other"
    other.mkdir()
    write_issuer(generate_issuer(), str(other / "issuer.key"), str(home / "issuer.pub.new"))
    (home / "issuer.pub.new").replace(home / "issuer.pub")
    edge = cluster.start_edge()
    node = start_managed_node(cluster, home)
    assert node.wait(30) == 1
    refusal = node_status(cluster)["last_refusal"]
    assert refusal is not None and refusal["code"] == "lease_support", refusal
    assert "trusts issuer key" in refusal["reason"]
    assert "REGISTER_REJECT_LEASE_SUPPORT" in node.output()
    assert "refused node node-a registration" in edge.output()
    assert saw_nothing(cluster, upstream)
