"""
What an operator reads when something goes wrong, from a real Edge and node (twistd, TLS, a fake
OpenAI-compatible upstream): ``iop status`` (table and ``--json``) says which client models can
be served and, once the node is stopped, since when it is down; requests refused by a key's
scope, for a model the Edge does not have, or for a direct route whose node is gone are counted
under their model — or ``(none)`` — in ``/metrics``, never under an empty label, with their
error codes; the console's first event carries each model's last error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tests.harness import CLIENT_KEY, LIMITED_CLIENT_KEY, Cluster, wait_until
from tests.test_metrics import scrape


def iop(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "iop.cli", *argv, "--admin", cluster.admin]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=cluster.env)


def chat(cluster: Cluster, model: str, key: str = CLIENT_KEY) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        cluster.client_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code)


def status_json(cluster: Cluster) -> dict[str, Any]:
    done = iop(cluster, "status", "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def console_snapshot(cluster: Cluster) -> dict[str, Any]:
    """The first event of ``GET /events``: what the Edge remembers."""
    with urllib.request.urlopen(cluster.admin + "/events", timeout=10) as response:
        lines: list[bytes] = []
        while True:
            line = response.readline()
            if line.startswith(b"data: "):
                snapshot: dict[str, Any] = json.loads(line[len(b"data: ") :])
                return snapshot
            lines.append(line)
            assert len(lines) < 20, lines


def test_status_metrics_and_console_say_why(cluster: Cluster) -> None:
    upstream = cluster.start_fake("fake_openai", "--tokens", "4")
    route = {"model": "direct", "node": "node-a", "adapter": "fake-openai", "target": "demo-model"}
    cluster.write_chat_edge_config(
        upstream, openai=cluster.client_api(limited_models=["direct"], model_routes=[route])
    )
    cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    # While all is well: the models say where they go and that they can be served.
    document = status_json(cluster)
    [model] = document["models"]
    assert model == {
        "id": "chat",
        "available": True,
        "providers": [{"provider_id": "p-chat", "target": "demo-model", "status": "available"}],
    }
    assert document["routes"] == [
        {
            "model": "direct",
            "node_id": "node-a",
            "adapter": "fake-openai",
            "target": "demo-model",
            "available": True,
        }
    ]
    assert document["nodes"][0]["down_since_unix_ms"] is None

    assert chat(cluster, "chat") == 200
    assert chat(cluster, "chat", key=LIMITED_CLIENT_KEY) == 403  # not in the key's models
    assert chat(cluster, "no-such-model") == 404

    # The node goes away: since when, in the table and the JSON.
    stopped = time.time()
    node.stop()
    wait_until(lambda: not cluster.node_connected(), 20, "node-a gone")
    table = iop(cluster, "status")
    assert table.returncode == 0, table.stderr
    # The nodes table's row (the providers table's rows start with their node too).
    row = next(line for line in table.stdout.splitlines() if line.startswith("node-a "))
    assert " disconnected  down since 20" in row and " ago)" in row, table.stdout
    [chat_row] = [line for line in table.stdout.splitlines() if line.startswith("chat ")]
    assert chat_row.split()[1] == "no", table.stdout
    document = status_json(cluster)
    down = document["nodes"][0]["down_since_unix_ms"]
    assert isinstance(down, int) and abs(down / 1000 - stopped) < 15, (down, stopped)
    assert document["models"][0]["available"] is False
    assert document["routes"][0]["available"] is False
    # The direct route has no node to run on now.
    assert chat(cluster, "direct") == 503

    def counted() -> dict[tuple[str, str], float]:
        _, samples = scrape(cluster)
        found: dict[tuple[str, str], float] = {}
        for (name, labels), value in samples.items():
            if name == "iop_requests_total":
                label = dict(labels)
                key = (label["model"], label["status"])
                found[key] = found.get(key, 0.0) + value
        return found

    wait_until(lambda: ("direct", "503") in counted(), 10, "the direct route's 503 counted")
    requests = counted()
    assert requests == {
        ("chat", "200"): 1.0,
        ("chat", "403"): 1.0,
        ("(none)", "404"): 1.0,
        ("direct", "503"): 1.0,
    }, requests
    _, samples = scrape(cluster)
    errors = {
        (dict(labels)["model"], dict(labels)["code"]): value
        for (name, labels), value in samples.items()
        if name == "iop_request_errors_total"
    }
    assert errors == {
        ("chat", "model_not_allowed"): 1.0,
        ("(none)", "model_not_found"): 1.0,
        ("direct", "node_unavailable"): 1.0,
    }, errors

    last = console_snapshot(cluster)["last_errors"]["models"]
    assert {model: (e["status"], e["code"]) for model, e in last.items()} == {
        "chat": (403, "model_not_allowed"),
        "(none)": (404, "model_not_found"),
        "direct": (503, "node_unavailable"),
    }, last
