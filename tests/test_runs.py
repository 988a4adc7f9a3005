"""
Runs end to end: a real Edge and Node (twistd, TLS), real fake upstreams on loopback ports and a
real CLI-agent subprocess. Runs are submitted through the admin ``POST /runs`` endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness import Cluster, wait_until

HEARTBEAT_TIMEOUT = 3.0


def start(
    cluster: Cluster, delay_ms: int = 5, tokens: int = 8, cli_env: dict[str, str] | None = None
) -> tuple[int, int]:
    openai = cluster.start_fake("fake_openai", "--delay-ms", str(delay_ms), "--tokens", str(tokens))
    ollama = cluster.start_fake("fake_ollama", "--delay-ms", str(delay_ms), "--tokens", str(tokens))
    cluster.write_runs_edge_config(openai, ollama, cli_env)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return openai, ollama


@pytest.mark.parametrize("model", ["demo-openai", "demo-ollama", "demo-cli"])
def test_run_streams_deltas_and_completes_with_usage(cluster: Cluster, model: str) -> None:
    start(cluster)
    stream = cluster.submit_run({"model": model, "input": "say something"})
    assert stream.status == 200
    events = stream.events()
    types = [e["type"] for e in events]
    assert types[0] == "start"
    assert types[-1] == "complete", events[-1]
    assert types.count("complete") == 1
    text = "".join(e.get("delta", "") for e in events if e["type"] == "delta")
    # Text that arrives within one reactor turn goes as one delta (the node joins a turn's
    # text), so an instant fake may send its whole answer as one.
    assert len([t for t in types if t == "delta"]) >= 1
    assert text.strip()
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    if model == "demo-cli":
        assert events[-1].get("session_id")


def test_cli_session_resumes(cluster: Cluster) -> None:
    start(cluster)
    first = cluster.submit_run({"model": "demo-cli", "input": "hello"}).events()
    session = first[-1]["session_id"]
    second = cluster.submit_run(
        {"model": "demo-cli", "input": "again", "session_id": session}
    ).events()
    assert second[-1]["type"] == "complete"
    assert second[-1]["session_id"] == session


@pytest.mark.parametrize("model,fake", [("demo-openai", 0), ("demo-ollama", 1)])
def test_client_disconnect_cancels_upstream(cluster: Cluster, model: str, fake: int) -> None:
    ports = start(cluster, delay_ms=200, tokens=200)
    port = ports[fake]
    stream = cluster.submit_run({"model": model, "input": "a long answer"})
    deltas = 0
    while deltas < 2:
        event = stream.next_event()
        assert event is not None
        deltas += event["type"] == "delta"
    assert cluster.fake_stats(port)["active_streams"] == 1
    stream.close()
    wait_until(
        lambda: cluster.fake_stats(port)["client_disconnects"] == 1, 10, "upstream disconnect"
    )
    wait_until(lambda: cluster.fake_stats(port)["active_streams"] == 0, 10, "upstream idle")
    wait_until(lambda: not _active_runs(cluster), 10, "edge run table empty")


def test_cancel_kills_cli_process_group(cluster: Cluster, tmp_path: Path) -> None:
    pidfile = tmp_path / "agent.pids"
    start(cluster, cli_env={"FAKE_CLI_MODE": "child", "FAKE_CLI_PIDFILE": str(pidfile)})
    stream = cluster.submit_run({"model": "demo-cli", "input": "work forever"})
    first = stream.next_event()
    assert first is not None and first["type"] == "start"
    wait_until(lambda: pidfile.exists() and len(pidfile.read_text().split()) >= 2, 10, "pids")
    pids = [int(p) for p in pidfile.read_text().split()]
    request = urllib.request.Request(f"{cluster.admin}/runs/{stream.run_id()}", method="DELETE")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 202
    rest = stream.events()
    assert rest[-1]["type"] == "cancelled"
    wait_until(lambda: not any(_alive(pid) for pid in pids), 10, "agent and its child gone")


def test_node_killed_mid_run_ends_stream_with_error(cluster: Cluster) -> None:
    start(cluster, delay_ms=200, tokens=200)
    node = cluster.daemons[-1]
    stream = cluster.submit_run({"model": "demo-openai", "input": "long"})
    while (event := stream.next_event()) is not None and event["type"] != "delta":
        pass
    began = time.monotonic()
    node.signal(signal.SIGKILL)
    rest = stream.events()
    assert rest[-1]["type"] == "error"
    assert "disconnected" in rest[-1]["error"]
    assert time.monotonic() - began <= HEARTBEAT_TIMEOUT + 1.5


def _active_runs(cluster: Cluster) -> list[object]:
    with urllib.request.urlopen(f"{cluster.admin}/runs", timeout=5) as response:
        runs: list[object] = json.loads(response.read())["runs"]
        return runs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _post_json(url: str, body: dict[str, object], method: str = "POST") -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_node_commands_through_the_edge(cluster: Cluster) -> None:
    start(cluster)
    url = f"{cluster.admin}/nodes/node-a/commands"
    code, caps = _post_json(url, {"type": "capabilities"})
    assert code == 200
    assert {a["name"] for a in caps["adapters"]} == {"fake-openai", "fake-ollama", "agent"}  # type: ignore[index]
    code, tags = _post_json(url, {"type": "ollama-tags"})
    assert code == 200
    assert tags["result"]["models"][0]["name"].startswith("llama3.2")  # type: ignore[index]
    code, transport = _post_json(url, {"type": "transport"})
    assert code == 200 and transport["node_id"] == "node-a"  # type: ignore[index]
    assert cluster.token not in json.dumps(transport)
    code, error = _post_json(url, {"type": "ollama-show", "arguments": {"model": "nope"}})
    assert code == 502
    assert "not found" in json.dumps(error)
    code, _ = _post_json(f"{cluster.admin}/nodes/zz/commands", {"type": "usage"})
    assert code == 503


def test_terminate_cli_session(cluster: Cluster, tmp_path: Path) -> None:
    start(cluster, cli_env={"FAKE_CLI_MODE": "hang"})
    stream = cluster.submit_run({"model": "demo-cli", "input": "hang", "session_id": "s-1"})
    assert stream.next_event()["type"] == "start"  # type: ignore[index]
    url = f"{cluster.admin}/nodes/node-a/sessions/s-1?adapter=agent&target=agent-model"
    wait_until(
        lambda: any(
            s["session_id"] == "s-1"
            for s in _post_json(f"{cluster.admin}/nodes/node-a/commands", {"type": "sessions"})[1][
                "sessions"
            ]  # type: ignore[index]
        ),
        10,
        "session listed",
    )
    request = urllib.request.Request(url, method="DELETE")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    rest = stream.events()
    assert rest[-1]["type"] in ("cancelled", "error")
