"""
Managed mode, real processes: an upstream that echoes the request's credential (the fake's
``echo-auth-*`` models: in a 401's reason phrase and body, in a 500 that dumps the request
headers, in response headers, and in a streamed body whose SSE event is written in two pieces
cut mid-key). The client never sees the key — not in the status line, the headers, the chunk
framing or the body, read off the raw socket — and sees the marker instead; the Edge's
``iop_upstream_secret_echoes_redacted_total`` counts every echo the node removed, and the node
says so in one warning per tunnel, without the key.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import urllib.request
from pathlib import Path

from iop.testing.pki import create_dev_pki
from tests.harness import CLIENT_KEY, Cluster, Daemon, wait_until
from tests.test_managed_mode import PROFILE, keys, node_home, start_upstream, write_node

MARKER = b"[redacted]"
# client model id → the fake's echoing model
ECHO_MODELS = {
    "echo-401": "echo-auth-401",
    "echo-500": "echo-auth-500",
    "echo-header": "echo-auth-header",
    "echo-stream": "echo-auth-stream",
}


def exchange(port: int, model: str, stream: bool) -> tuple[bytes, bytes, bytes]:
    """
    One chat completion over a raw socket: every byte the client received (status line,
    headers, chunk framing, body), the head, and the de-chunked body.
    """
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {CLIENT_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        while data := sock.recv(65536):
            received += data
    raw = bytes(received)
    response_head, _, rest = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in response_head.lower():
        return raw, response_head, rest
    decoded = bytearray()
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        decoded += rest[:size]
        rest = rest[size + 2 :]
    return raw, response_head, bytes(decoded)


def echoes_counted(cluster: Cluster) -> float:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith('iop_upstream_secret_echoes_redacted_total{node="node-a"}'):
            return float(line.split()[-1])
    raise AssertionError("no iop_upstream_secret_echoes_redacted_total for node-a")


def test_an_echoed_provider_key_never_reaches_the_client(cluster: Cluster) -> None:
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
                        "models": sorted(ECHO_MODELS.values()),
                        "profile": "openai-chat",
                        "credential": "upstream",
                        "capacity": 2,
                    }
                ],
            }
        ],
        models=[
            {"id": model, "providers": [{"id": "p-chat", "target": target}]}
            for model, target in ECHO_MODELS.items()
        ],
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
    key = secret.encode()
    assert echoes_counted(cluster) == 0

    # A 401 whose reason phrase and message quote "Bearer <key>".
    raw, head, body = exchange(cluster.client_port, "echo-401", stream=False)
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), head
    assert key not in raw
    assert b"Incorrect API key provided: Bearer " + MARKER in body, body

    # A 500 dumping the request headers.
    raw, head, body = exchange(cluster.client_port, "echo-500", stream=True)
    assert head.startswith(b"HTTP/1.1 500 "), head
    assert key not in raw
    assert json.loads(body)["error"]["debug"]["request_headers"]["authorization"] == (
        "Bearer [redacted]"
    )

    # An ordinary answer whose headers echo it (the upstream's x-request-id is passed on, as
    # x-upstream-request-id: the answer's x-request-id is the Edge's own).
    raw, head, body = exchange(cluster.client_port, "echo-header", stream=False)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert key not in raw
    assert b"\r\nX-Upstream-Request-Id: req-Bearer " + MARKER + b"\r\n" in head, head

    # A stream whose event carrying the key arrives in two pieces cut in the middle of it.
    raw, head, body = exchange(cluster.client_port, "echo-stream", stream=True)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert key not in raw
    assert key[: len(key) // 2] not in raw
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in body.decode().split("\n\n")
        if line.startswith("data: {")
    )
    assert text == "Your key is Bearer [redacted].", text
    assert body.endswith(b"data: [DONE]\n\n")

    # 1 (401 body) + 1 (500 body) + 2 (two headers) + 1 (stream); the reason phrase is never
    # relayed (the Edge writes its own), so it needs no redaction and counts nothing.
    wait_until(lambda: echoes_counted(cluster) == 5, 10, "the Edge counted 5 echoes")
    stats = cluster.fake_stats(upstream)
    assert (stats["authorized_requests"], stats["unauthorized_requests"]) == (4, 0), stats
    node.stop()
    edge.stop()
    node_log = node.output()
    assert node_log.count("echoed the leased credential") == 4, node_log
    assert secret not in node_log
    assert secret not in edge.output()
