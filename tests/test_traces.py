"""
Traces end to end: a real Edge and Node (twistd, TLS) with ``telemetry:`` pointed at a real
OTLP/HTTP receiver of the tests' own (:mod:`iop.testing.otlp_sink`, decoding with the official
``opentelemetry-proto`` messages), and the fake upstream reporting the ``traceparent`` it got.

What this covers today: the Node's side. A run submitted through the admin API with a
``traceparent`` in its metadata (the Edge hands run metadata to the Node as it is) is traced on
the Node as the child of that context — ``iop.node.run`` and its upstream ``POST`` client span
in the caller's trace — and the upstream receives the client span's ``traceparent``. A client
request through the tunnel gives the Node's ``iop.node.tunnel`` and ``POST`` spans, one trace,
which the upstream joins. (The Edge's own spans, and a client's ``traceparent`` carried into the
tunnel's metadata, come with the Edge's part; then the tunnel test sees the client's trace id.)
With the receiver down, both daemons keep serving.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import yaml

from iop.testing.ports import free_port
from tests.harness import CLIENT_KEY, Cluster, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def sink_spans(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sink/spans", timeout=5) as response:
        spans: list[dict[str, Any]] = json.loads(response.read())
        return spans


def with_telemetry(cluster: Cluster, endpoint: str) -> None:
    """edge.yaml and node.yaml export to ``endpoint``, sampling everything."""
    section = {"endpoint": endpoint, "sampling_ratio": 1.0, "export_timeout_sec": 2}
    edge = cluster.root / "edge.yaml"
    config = yaml.safe_load(edge.read_text())
    config["telemetry"] = section
    edge.write_text(yaml.safe_dump(config))
    cluster.write_node_config(telemetry=section)


def start_runs(cluster: Cluster, endpoint: str) -> int:
    openai = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "4")
    ollama = cluster.start_fake("fake_ollama", "--delay-ms", "1", "--tokens", "4")
    cluster.write_runs_edge_config(openai, ollama)
    with_telemetry(cluster, endpoint)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return openai


def test_run_joins_the_callers_trace(cluster: Cluster) -> None:
    sink = cluster.start_fake("otlp_sink")
    openai = start_runs(cluster, f"http://127.0.0.1:{sink}")
    stream = cluster.submit_run(
        {"model": "demo-openai", "input": "hello", "metadata": {"traceparent": TRACEPARENT}}
    )
    events = stream.events()
    assert events[-1]["type"] == "complete", events

    def exported() -> bool:
        names = {s["name"] for s in sink_spans(sink) if s["trace_id"] == TRACE_ID}
        return {"iop.node.run", "POST"} <= names

    wait_until(exported, 15, "the node's spans at the receiver")
    spans = [s for s in sink_spans(sink) if s["trace_id"] == TRACE_ID]
    run = next(s for s in spans if s["name"] == "iop.node.run")
    client = next(s for s in spans if s["name"] == "POST")
    assert run["parent_span_id"] == PARENT_ID
    assert run["kind"] == "SERVER" and run["service"] == "iop-node"
    assert client["parent_span_id"] == run["span_id"] and client["kind"] == "CLIENT"
    attributes = run["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "demo-model"
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["iop.outcome"] == "completed"
    assert client["attributes"]["http.response.status_code"] == 200
    assert client["attributes"]["url.full"] == f"http://127.0.0.1:{openai}/v1/chat/completions"
    # The upstream got the client span's context: its own spans would join this trace.
    stats = cluster.fake_stats(openai)
    assert stats["last_traceparent"] == f"00-{TRACE_ID}-{client['span_id']}-01"
    # No secret and no content on any span.
    text = json.dumps(spans)
    assert cluster.token not in text and "hello" not in text


def test_tunnel_spans_and_upstream(cluster: Cluster) -> None:
    sink = cluster.start_fake("otlp_sink")
    upstream = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "4")
    cluster.write_chat_edge_config(upstream)
    with_telemetry(cluster, f"http://127.0.0.1:{sink}/v1/traces")
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    request = urllib.request.Request(
        cluster.client_url + "/v1/chat/completions",
        data=json.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        ).encode(),
        headers={
            "authorization": f"Bearer {CLIENT_KEY}",
            "content-type": "application/json",
            "traceparent": TRACEPARENT,
        },
    )
    with urllib.request.urlopen(request, timeout=15) as response:
        assert response.status == 200
        assert b"[DONE]" in response.read()

    def exported() -> bool:
        return {"iop.node.tunnel", "POST"} <= {s["name"] for s in sink_spans(sink)}

    wait_until(exported, 15, "the node's tunnel spans at the receiver")
    spans = sink_spans(sink)
    tunnel = next(s for s in spans if s["name"] == "iop.node.tunnel")
    client = next(s for s in spans if s["name"] == "POST")
    assert client["trace_id"] == tunnel["trace_id"]
    assert client["parent_span_id"] == tunnel["span_id"]
    assert tunnel["attributes"]["gen_ai.request.model"] == "demo-model"
    assert tunnel["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert tunnel["attributes"]["http.response.status_code"] == 200
    traceparent = cluster.fake_stats(upstream)["last_traceparent"]
    # (flags 01 or 03: a root the node started also sets W3C's "random trace id" bit)
    assert traceparent.startswith(f"00-{tunnel['trace_id']}-{client['span_id']}-0")


def test_receiver_down_changes_nothing(cluster: Cluster) -> None:
    """Nothing listens at the endpoint: runs are served as quickly, the daemons keep going."""
    closed = free_port()
    start_runs(cluster, f"http://127.0.0.1:{closed}")
    started = time.monotonic()
    for _ in range(5):
        events = cluster.submit_run({"model": "demo-openai", "input": "hello"}).events()
        assert events[-1]["type"] == "complete", events
    assert time.monotonic() - started < 10
    assert cluster.node_connected()
