"""
Managed mode end to end, real processes and real mTLS: the provider key lives only in the
Edge's config; each tunnel request carries a lease sealed to its node; the node opens it in
memory, sends exactly the slot's credential in the profile's header, and keeps nothing.

- a managed Edge + node (the node in a directory of its own, as on another machine) serve the
  official ``openai`` SDK through a fake upstream that answers 401 unless it gets exactly
  ``Authorization: Bearer <the slot's secret>``; afterwards neither the node's directory (config,
  keys, store) nor its log contain the secret, nor does the Edge's log or ``/status``;
- a real managed node dialling a hostile Edge (a raw wire server holding the issuer key): a valid
  lease is used once; the same lease again, an expired one, one for another node and one whose
  binding does not match its request are each refused with the class named, and nothing but
  the one valid request reaches the upstream.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

import openai
import pytest_twisted
import yaml
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from iop.config.model import ServerTLS
from iop.security.keys import generate_issuer, generate_recipient, write_issuer, write_recipient
from iop.security.lease import issue_lease
from iop.security.tls import server_context_factory
from iop.testing.fake_openai import fake_text
from iop.testing.pki import create_dev_pki
from iop.testing.ports import free_port
from iop.wire import runtime_pb2 as pb
from iop.wire.framing import EnvelopeProtocol
from tests.harness import CLIENT_KEY, Cluster, Daemon, port_open, wait_until

TOKENS = 5
PROFILE = {
    "name": "openai-chat",
    "driver": "openai_chat",
    "operations": {"chat_completions": "/chat/completions"},
    "capabilities": ["chat", "streaming"],
    "auth_header": "authorization",
    "auth_scheme": "Bearer",
}


def start_upstream(cluster: Cluster, secret: str) -> int:
    """The fake upstream, checking the credential (given to it alone, in its environment)."""
    port = free_port()
    env = dict(cluster.env, IOP_FAKE_EXPECT_VALUE=f"Bearer {secret}")
    fake = Daemon(
        "fake_openai",
        [
            sys.executable,
            "-m",
            "iop.testing.fake_openai",
            "--port",
            str(port),
            "--tokens",
            str(TOKENS),
            "--expect-header",
            "authorization",
        ],
        env,
        cluster.root / "fake_openai.log",
    )
    cluster.daemons.append(fake.start())
    wait_until(lambda: port_open(port), 20, "fake upstream")
    return port


def node_home(cluster: Cluster, node_id: str) -> Path:
    """A directory for the node alone, holding only what a managed node is given."""
    home = cluster.root / f"home-{node_id}"
    home.mkdir()
    pki = cluster.root / "pki"
    for name in ("ca.crt", f"node-{node_id}.crt", f"node-{node_id}.key"):
        shutil.copy(pki / name, home / name)
    shutil.copy(cluster.root / "keys" / "issuer.pub", home / "issuer.pub")
    # The private half lives on the node only.
    shutil.move(cluster.root / "keys" / f"{node_id}.recipient.key", home / "recipient.key")
    return home


def write_node(cluster: Cluster, home: Path, node_id: str) -> Path:
    config = {
        "edge": {
            "host": "127.0.0.1",
            "port": cluster.node_port,
            "server_name": "edge.iop.internal",
            "ca_file": "ca.crt",
            "cert_file": f"node-{node_id}.crt",
            "key_file": f"node-{node_id}.key",
        },
        "token": "${IOP_TEST_NODE_TOKEN}",
        "reconnect": {"max_attempts": 0, "interval_sec": 0.5},
        "store": {"path": f"file:{home}/node.db?cache=shared&mode=rwc"},
        "security": {
            "mode": "managed",
            "recipient_key_file": "recipient.key",
            "issuer_key_file": "issuer.pub",
            "clock_skew_sec": 5,
        },
    }
    path = home / "node.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def keys(cluster: Cluster, *node_ids: str) -> None:
    directory = cluster.root / "keys"
    directory.mkdir(exist_ok=True)
    write_issuer(generate_issuer(), str(directory / "issuer.key"), str(directory / "issuer.pub"))
    for node_id in node_ids:
        write_recipient(
            generate_recipient(),
            str(directory / f"{node_id}.recipient.key"),
            str(directory / f"{node_id}.recipient.pub"),
        )


def test_the_provider_key_stays_on_the_edge(cluster: Cluster) -> None:
    secret = "sk-upstream-" + secrets.token_urlsafe(24)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a")
    (cluster.root / "secrets").mkdir()
    secret_file = cluster.root / "secrets" / "provider.key"
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    upstream = start_upstream(cluster, secret)
    cluster.write_edge_config(
        security={
            "mode": "managed",
            "trust_domain": "iop.internal",
            "lease": {"signing_key_file": "keys/issuer.key", "ttl_sec": 30},
        },
        node_transport={
            "tls": {
                "cert_file": "pki/edge.crt",
                "key_file": "pki/edge.key",
                "client_ca_file": "pki/ca.crt",
            },
            "heartbeat": {"interval_sec": 1, "timeout_sec": 3},
        },
        credentials=[{"name": "upstream", "secret_file": "secrets/provider.key", "revision": 1}],
        protocol_profiles=[PROFILE],
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "recipient_key_file": "keys/node-a.recipient.pub",
                "adapters": [
                    {
                        "name": "fake-openai",
                        "type": "openai_compat",
                        "base_url": f"http://127.0.0.1:{upstream}/v1",
                    }
                ],
                "providers": [
                    {
                        "id": "p-chat",
                        "adapter": "fake-openai",
                        "category": "api",
                        "models": ["demo-model"],
                        "profile": "openai-chat",
                        "credential": "upstream",
                        "capacity": 2,
                    }
                ],
            }
        ],
        models=[{"id": "chat", "providers": ["p-chat"], "default_max_tokens": 64}],
        openai=cluster.client_api(),
    )
    edge = cluster.start_edge()
    home = node_home(cluster, "node-a")
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
    cluster.daemons.append(node.start())
    wait_until(cluster.node_connected, 20, "node-a connected")

    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    hello: Any = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="chat", messages=hello)
    assert answer.choices[0].message.content == fake_text(TOKENS)
    stream = client.chat.completions.create(model="chat", messages=hello, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == fake_text(TOKENS)
    stats = cluster.fake_stats(upstream)
    assert (stats["authorized_requests"], stats["unauthorized_requests"]) == (2, 0), stats
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 10, "p-chat idle")
    status = cluster.status()
    assert secret not in repr(status)

    node.stop()
    edge.stop()
    for path in home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the secret is in {path.name}"
    assert secret not in edge.output()


# -- a hostile Edge -----------------------------------------------------------------------------


class LeaseReplayer(EnvelopeProtocol):
    """Plays the Edge to a managed node, then sends tunnels with the leases of :attr:`script`."""

    def __init__(self, edge: HostileEdge) -> None:
        super().__init__()
        self.edge = edge

    def envelope_received(self, envelope: pb.Envelope) -> None:
        kind = envelope.WhichOneof("message")
        if kind == "register_request":
            self.send_envelope(self.edge.accepted())
        elif kind == "node_ready_request":
            self.send_envelope(pb.Envelope(node_ready_response=pb.NodeReadyResponse(ready=True)))
            for request in self.edge.requests:
                self.send_envelope(pb.Envelope(provider_tunnel_request=request))
        elif kind == "provider_tunnel_frame":
            message = envelope.provider_tunnel_frame
            if message.kind in (pb.END, pb.ERROR):
                self.edge.ends[message.run_id] = message.error if message.kind == pb.ERROR else ""
                if len(self.edge.ends) == len(self.edge.requests) and not self.edge.done.called:
                    self.edge.done.callback(dict(self.edge.ends))

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)  # type: ignore[arg-type]


class HostileEdge(Factory):
    def __init__(self, upstream: int, requests: list[pb.ProviderTunnelRequest]) -> None:
        self.upstream = upstream
        self.requests = requests
        self.ends: dict[str, str] = {}
        self.done: Deferred[dict[str, str]] = Deferred()

    def accepted(self) -> pb.Envelope:
        adapter = pb.AdapterConfig(
            name="chat",
            type="openai_compat",
            enabled=True,
            max_concurrency=4,
            base_url=f"http://127.0.0.1:{self.upstream}/v1",
            profile=pb.RuntimeProfile(
                name="openai-chat",
                driver="openai_chat",
                operations={"chat_completions": "/chat/completions"},
                capabilities=["chat", "streaming"],
                auth_header="authorization",
                auth_scheme="Bearer",
            ),
        )
        return pb.Envelope(
            register_response=pb.RegisterResponse(
                accepted=True,
                node_id="node-a",
                config=pb.NodeConfigPayload(node_id="node-a", adapters=[adapter]),
                heartbeat_interval_ms=1000,
                heartbeat_timeout_ms=5000,
            )
        )

    def buildProtocol(self, addr: object) -> LeaseReplayer:
        return LeaseReplayer(self)


@pytest_twisted.ensureDeferred
async def test_a_managed_node_refuses_replayed_and_forged_leases(cluster: Cluster) -> None:
    import time

    from iop.security.keys import load_issuer_private, load_recipient_public

    secret = "sk-upstream-" + secrets.token_urlsafe(24)
    create_dev_pki(cluster.root / "pki", node_names=["node-a"])
    keys(cluster, "node-a", "node-b")
    upstream = start_upstream(cluster, secret)
    issuer = load_issuer_private(str(cluster.root / "keys" / "issuer.key"))
    node_a = load_recipient_public(str(cluster.root / "keys" / "node-a.recipient.pub"))
    node_b = load_recipient_public(str(cluster.root / "keys" / "node-b.recipient.pub"))

    def binding(node: str = "node-a") -> pb.CredentialBinding:
        return pb.CredentialBinding(
            principal="mallory",
            slot="upstream",
            route="chat:node-a/p-chat",
            profile="openai-chat",
            target="demo-model",
            node_recipient=node,
            credential_revision=1,
            route_revision=1,
            projection_generation=1,
            # The adapter the hostile Edge configures, and the origin of its base_url.
            adapter="chat",
            upstream_origin=f"http://127.0.0.1:{upstream}",
        )

    def request(
        run_id: str, lease: bytes, bound: pb.CredentialBinding, target: str = "demo-model"
    ) -> pb.ProviderTunnelRequest:
        body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % (
            target.encode()
        )
        return pb.ProviderTunnelRequest(
            run_id=run_id,
            adapter="chat",
            target=target,
            method="POST",
            operation="chat_completions",
            profile="openai-chat",
            body=body,
            credential_lease=lease,
            credential_binding=bound,
        )

    now = time.time()
    valid = issue_lease(
        binding=binding(), secret=secret.encode(), recipient=node_a, issuer=issuer, now=now,
        ttl_sec=60,
    )  # fmt: skip
    expired = issue_lease(
        binding=binding(), secret=secret.encode(), recipient=node_a, issuer=issuer,
        now=now - 600, ttl_sec=30,
    )  # fmt: skip
    for_b = issue_lease(
        binding=binding("node-b"), secret=secret.encode(), recipient=node_b, issuer=issuer,
        now=now, ttl_sec=60,
    )  # fmt: skip
    other_target = binding()
    other_target.target = "other-model"
    mismatched = issue_lease(
        binding=other_target, secret=secret.encode(), recipient=node_a, issuer=issuer, now=now,
        ttl_sec=60,
    )  # fmt: skip
    requests = [
        request("t-valid", valid, binding()),
        request("t-replayed", valid, binding()),
        request("t-expired", expired, binding()),
        request("t-other-node", for_b, binding("node-b")),
        request("t-mismatch", mismatched, other_target, target="demo-model"),
        request("t-missing", b"", pb.CredentialBinding()),
    ]
    edge = HostileEdge(upstream, requests)
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
        home = node_home(cluster, "node-a")
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
        cluster.daemons.append(node.start())
        ends = await edge.done.addTimeout(60, reactor)
    finally:
        await port.stopListening()
    assert ends["t-valid"] == "", ends
    expected = {
        "t-replayed": "lease_replayed",
        "t-expired": "lease_expired",
        "t-other-node": "lease_wrong_recipient",
        "t-mismatch": "lease_binding_mismatch",
        "t-missing": "lease_missing",
    }
    for run_id, code in expected.items():
        assert ends[run_id].startswith(code), (run_id, ends[run_id])
        assert secret not in ends[run_id]
    stats = cluster.fake_stats(upstream)
    assert (stats["authorized_requests"], stats["unauthorized_requests"]) == (1, 0), stats
    node.stop()
    assert secret not in node.output()
