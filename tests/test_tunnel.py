"""
Provider raw tunnels end to end: a real Edge and Node (twistd, TLS) and a real fake OpenAI
upstream on a loopback port. Tunnels are opened through the admin debug route ``POST /tunnels``,
which streams the provider's raw body back.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from typing import Any

from tests.harness import Cluster, wait_until

MESSAGES = [{"role": "user", "content": "tell me something"}]
# The two fields of the fake's answers that differ between two calls: a counter and the clock.
VOLATILE = re.compile(rb'"(id|created)": ("chatcmpl-fake-\d+"|\d+)')


def start(cluster: Cluster, delay_ms: int = 5, tokens: int = 8) -> int:
    """The fake upstream, and an Edge + Node whose only adapter (max_concurrency 1) points to it."""
    port = cluster.start_fake("fake_openai", "--delay-ms", str(delay_ms), "--tokens", str(tokens))
    cluster.write_edge_config(
        nodes=[
            {
                "id": "node-a",
                "token": "${IOP_TEST_NODE_TOKEN}",
                "adapters": [
                    {
                        "name": "fake-openai",
                        "type": "openai_compat",
                        "base_url": f"http://127.0.0.1:{port}/v1",
                        "max_concurrency": 1,
                    }
                ],
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
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return port


def open_tunnel(
    cluster: Cluster, body: dict[str, Any], stream: bool, **fields: Any
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    request = {
        "adapter": "fake-openai",
        "target": "demo-model",
        "operation": "chat_completions",
        "body": body,
        "stream": stream,
        **fields,
    }
    connection = http.client.HTTPConnection("127.0.0.1", cluster.admin_port, timeout=30)
    connection.request(
        "POST", "/tunnels", body=json.dumps(request), headers={"content-type": "application/json"}
    )
    return connection, connection.getresponse()


def direct(port: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """The same request straight to the fake: status, content type and raw body."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read()


def normalized(raw: bytes) -> bytes:
    return VOLATILE.sub(rb'"\1": "*"', raw)


def test_stream_passthrough_is_byte_exact(cluster: Cluster) -> None:
    port = start(cluster)
    body = {"messages": MESSAGES, "stream_options": {"include_usage": True}}
    connection, response = open_tunnel(cluster, body, stream=True)
    assert response.status == 200
    assert response.getheader("content-type") == "text/event-stream"
    assert response.getheader("x-iop-run-id")
    tunneled = response.read()
    connection.close()

    status, content_type, expected = direct(port, {**body, "model": "demo-model", "stream": True})
    assert (status, content_type) == (200, "text/event-stream")
    assert tunneled.endswith(b"data: [DONE]\n\n")
    assert normalized(tunneled) == normalized(expected)


def test_non_stream_and_error_passthrough(cluster: Cluster) -> None:
    port = start(cluster)
    connection, response = open_tunnel(cluster, {"messages": MESSAGES}, stream=False)
    assert response.status == 200
    assert response.getheader("content-type") == "application/json"
    tunneled = response.read()
    connection.close()
    status, _, expected = direct(
        port, {"messages": MESSAGES, "model": "demo-model", "stream": False}
    )
    assert status == 200
    assert normalized(tunneled) == normalized(expected)
    assert json.loads(tunneled)["choices"][0]["message"]["content"].startswith("tok0")

    # An upstream error is the provider's answer, passed through as is.
    connection, response = open_tunnel(
        cluster, {"messages": MESSAGES}, stream=False, target="fail-500"
    )
    assert response.status == 500
    assert json.loads(response.read())["error"]["message"] == "injected upstream failure"
    connection.close()


def test_client_drop_disconnects_upstream_and_frees_the_gate(cluster: Cluster) -> None:
    port = start(cluster, delay_ms=200, tokens=200)
    connection, response = open_tunnel(cluster, {"messages": MESSAGES}, stream=True)
    assert response.status == 200
    tokens = 0
    while tokens < 2:
        line = response.readline()
        assert line, "the stream ended early"
        tokens += b'"content": "' in line and b"tok" in line
    assert cluster.fake_stats(port)["active_streams"] == 1
    response.close()
    connection.close()
    took = wait_until(
        lambda: cluster.fake_stats(port)["client_disconnects"] == 1, 5, "upstream disconnect"
    )
    assert took <= 1.0, f"the upstream saw the disconnect only after {took:.2f}s"
    assert cluster.fake_stats(port)["active_streams"] == 0

    # max_concurrency is 1: this succeeds only if the dropped tunnel gave its slot back.
    connection, response = open_tunnel(
        cluster, {"messages": MESSAGES, "max_tokens": 2}, stream=False
    )
    assert response.status == 200, response.read()
    answer = json.loads(response.read())
    connection.close()
    assert answer["choices"][0]["message"]["content"] == "tok0 tok1"
