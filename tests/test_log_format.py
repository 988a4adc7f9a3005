"""
``logging:`` end to end: real ``twistd iop-edge`` and ``twistd iop-node`` processes writing JSON
lines (``logging.format: json``, or ``--log-format json``), to stdout or to ``--logfile``, and
twistd's classic text lines when nothing is configured.
"""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from typing import Any

import yaml

from tests.harness import CLIENT_KEY, TWISTD, Cluster, Daemon, port_open, wait_until

REQUIRED = ("time", "level", "namespace", "message")
# A twistd text line: "2026-12-01T14:41:31+0000 [namespace#level] message".
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[[^\]]+\] ")
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def configure(cluster: Cluster, **edge: Any) -> None:
    """An Edge whose pool model ``pool`` is served by the fake OpenAI upstream through node-a."""
    port = cluster.start_fake("fake_openai", "--delay-ms", "5", "--tokens", "4")
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
        models=[{"id": "pool", "providers": ["a-chat"]}],
        openai=cluster.client_api(),
        **edge,
    )


def chat(cluster: Cluster) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{cluster.client_url}/v1/chat/completions",
        data=json.dumps(
            {"model": "pool", "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def serve_and_stop(cluster: Cluster, *daemons: Daemon) -> None:
    """node-a ready, one pooled request and a /status answered; then every daemon stopped."""
    wait_until(cluster.node_connected, 20, "node-a connected")
    assert chat(cluster)["choices"]
    cluster.status()
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
        daemon.wait(20)  # twistd re-raises SIGTERM on itself: the Edge ends by the signal


def json_lines(text: str, name: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object with the required fields."""
    lines = text.splitlines()
    assert lines, f"{name} wrote nothing"
    events: list[dict[str, Any]] = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            raise AssertionError(f"{name}: not a JSON line: {line!r}") from None
        assert isinstance(event, dict), line
        missing = [key for key in REQUIRED if key not in event]
        assert not missing, f"{name}: {missing} missing in {line!r}"
        assert RFC3339_UTC.match(event["time"]), line
        assert event["level"] in ("debug", "info", "warn", "error", "critical"), line
        events.append(event)
    return events


def test_json_lines_edge_and_node(cluster: Cluster) -> None:
    """
    With ``logging.format: json`` every line either daemon writes is one JSON object carrying
    time, level, namespace and message, plus the event's own keys (the access line's facts).
    """
    configure(cluster, logging={"format": "json"})
    cluster.write_node_config(logging={"format": "json"})
    edge = cluster.start_edge()
    node = cluster.start_node()
    serve_and_stop(cluster, node, edge)

    edge_events = json_lines(edge.output(), "edge")
    messages = [e["message"] for e in edge_events]
    assert any(m.startswith("twistd ") and "starting up" in m for m in messages), messages
    ready = [e for e in edge_events if e["message"] == "node node-a ready"]
    assert ready and ready[0]["node_id"] == "node-a" and ready[0]["level"] == "info", ready
    assert ready[0]["namespace"].startswith("iop.edge."), ready
    [access] = [e for e in edge_events if e["namespace"] == "iop.edge.access"]
    assert access["message"].startswith("openai chat pool "), access
    assert (access["level"], access["status"], access["outcome"]) == ("info", 200, "complete")
    assert (access["model"], access["provider_id"], access["node_id"]) == (
        "pool",
        "a-chat",
        "node-a",
    )
    assert access["duration_ms"] > 0 and access["stream"] is False, access
    assert messages[-1] == "Server Shut Down.", messages[-3:]
    # Twisted's bookkeeping is not repeated as fields.
    assert not [k for e in edge_events for k in e if k.startswith("log_")]

    node_events = json_lines(node.output(), "node")
    assert any("ready" in e["message"] for e in node_events), node_events
    # The node's default level is info: no debug line.
    assert all(e["level"] != "debug" for e in node_events)


def test_text_by_default(cluster: Cluster) -> None:
    """
    No ``logging:`` section: twistd's classic text lines as before (no JSON), and the default
    level (info) keeps debug events out; the request's access line is there.
    """
    configure(cluster)
    edge = cluster.start_edge()
    node = cluster.start_node()
    serve_and_stop(cluster, node, edge)
    for daemon in (edge, node):
        lines = daemon.output().splitlines()
        assert lines, daemon.name
        for line in lines:
            assert TEXT_LINE.match(line), f"{daemon.name}: {line!r}"
    text = edge.output()
    assert "[iop.edge.registry.NodeRegistry#info] node node-a ready" in text, text
    assert "twistd " in text and "Server Shut Down." in text
    assert "[iop.edge.access#info] openai chat pool \N{RIGHTWARDS ARROW} 200 complete" in text
    assert "#debug]" not in text


def test_logfile_flag_and_one_line_join(cluster: Cluster) -> None:
    """
    ``--log-format json`` on the command line (no ``logging:`` section), with twistd's
    ``--logfile``: the file holds the JSON lines, stdout nothing; a node joined with flags only
    (no node.yaml) takes ``--log-format`` too.
    """
    configure(cluster)
    log_file = cluster.root / "edge-json.log"
    argv = [
        TWISTD,
        "--nodaemon",
        "--pidfile=",
        f"--logfile={log_file}",
        "iop-edge",
        "--config",
        str(cluster.root / "edge.yaml"),
        "--log-format",
        "json",
    ]
    edge = Daemon("edge", argv, cluster.env, cluster.root / "edge.log")
    cluster.daemons.append(edge.start())
    wait_until(lambda: port_open(cluster.admin_port), 20, "edge admin port")
    wait_until(lambda: port_open(cluster.client_port), 20, "edge client API port")
    token_file = cluster.root / "node.token"
    token_file.write_text(cluster.token + "\n")
    node = cluster.join_node(token_file, "--log-format", "json")
    serve_and_stop(cluster, node, edge)

    assert edge.output() == "", edge.output()
    events = json_lines(log_file.read_text(), "edge --logfile")
    assert any(e["message"] == "node node-a ready" for e in events)
    assert not any(e["level"] == "debug" for e in events)
    json_lines(node.output(), "joined node")


def refresh(cluster: Cluster) -> dict[str, Any]:
    request = urllib.request.Request(
        cluster.admin + "/config/refresh",
        data=json.dumps({"mode": "apply"}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


def test_level_switched_by_a_refresh(cluster: Cluster) -> None:
    """``logging.level`` applied live by a config refresh: at ``warn`` no access line, back
    at ``info`` the next request's appears."""
    configure(cluster, logging={"format": "json", "level": "warn"})
    edge = cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    assert chat(cluster)["choices"]
    assert "iop.edge.access" not in edge.output()

    path = cluster.root / "edge.yaml"
    data = yaml.safe_load(path.read_text())
    data["logging"]["level"] = "info"
    path.write_text(yaml.safe_dump(data))
    result = refresh(cluster)
    assert result["result"] == "applied", result
    assert [(r["path"], r["change_class"]) for r in result["reports"]] == [
        ("logging.level", "live")
    ]
    assert chat(cluster)["choices"]
    wait_until(lambda: "iop.edge.access" in edge.output(), 10, "the access line")
    access = [e for e in json_lines(edge.output(), "edge") if e["namespace"] == "iop.edge.access"]
    assert len(access) == 1 and access[0]["provider_id"] == "a-chat", access
