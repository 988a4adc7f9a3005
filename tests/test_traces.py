"""
Traces end to end: a real Edge and Node (twistd, TLS) with ``telemetry:`` pointed at a real
OTLP/HTTP receiver of the tests' own (:mod:`iop.testing.otlp_sink`, decoding with the official
``opentelemetry-proto`` messages), and the fake upstream reporting the ``traceparent`` it got.

The Node's side: a run submitted through the admin API with a ``traceparent`` in its metadata
(the Edge hands run metadata to the Node as it is) is traced on the Node as the child of that
context — ``iop.node.run`` and its upstream ``POST`` client span in the caller's trace — and
the upstream receives the client span's ``traceparent``. End to end: an OpenAI SDK request
with a ``traceparent`` header gives the Edge's server span (its child) with its admission,
placement and dispatch children, the Node's ``iop.node.tunnel`` under the dispatch span, its
``POST`` under that, and the upstream's received ``traceparent`` under the ``POST``: one trace,
the client's; the Edge's access log line carries the trace and span ids.
With the receiver down, both daemons keep serving.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import openai
import yaml

from iop.testing.ports import free_port
from tests.harness import CLIENT_KEY, Cluster, wait_until
from tests.test_request_ids import json_events

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


def test_a_client_request_traced_from_the_edge_to_the_upstream(cluster: Cluster) -> None:
    sink = cluster.start_fake("otlp_sink")
    upstream = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "4")
    cluster.write_chat_edge_config(upstream, logging={"format": "json"})
    with_telemetry(cluster, f"http://127.0.0.1:{sink}/v1/traces")
    edge = cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    client = openai.OpenAI(
        base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=15
    )
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"traceparent": TRACEPARENT},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    names = {"chat chat", "iop.edge.place", "iop.edge.dispatch", "iop.node.tunnel", "POST"}

    def exported() -> bool:
        return names <= {s["name"] for s in sink_spans(sink) if s["trace_id"] == TRACE_ID}

    wait_until(exported, 15, "the Edge's and the node's spans at the receiver")
    spans = {s["name"]: s for s in sink_spans(sink) if s["trace_id"] == TRACE_ID}
    server, place = spans["chat chat"], spans["iop.edge.place"]
    dispatch, tunnel, post = spans["iop.edge.dispatch"], spans["iop.node.tunnel"], spans["POST"]
    assert server["parent_span_id"] == PARENT_ID
    assert (server["kind"], server["service"]) == ("SERVER", "iop-edge")
    assert place["parent_span_id"] == server["span_id"]
    assert (dispatch["parent_span_id"], dispatch["kind"]) == (server["span_id"], "CLIENT")
    assert (tunnel["parent_span_id"], tunnel["service"]) == (dispatch["span_id"], "iop-node")
    assert post["parent_span_id"] == tunnel["span_id"]
    attributes = server["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["http.response.status_code"] == 200
    assert place["attributes"]["iop.queue.outcome"] == "placed"
    assert tunnel["attributes"]["gen_ai.request.model"] == "demo-model"
    traceparent = cluster.fake_stats(upstream)["last_traceparent"]
    assert traceparent == f"00-{TRACE_ID}-{post['span_id']}-01"
    # No key and no content on any span.
    text = json.dumps(list(spans.values()))
    assert CLIENT_KEY not in text and '"hi"' not in text

    def accessed() -> list[dict[str, Any]]:
        return [e for e in json_events(edge.output()) if e.get("namespace") == "iop.edge.access"]

    wait_until(lambda: bool(accessed()), 10, "the access log line")
    line = accessed()[-1]
    assert (line["trace_id"], line["span_id"]) == (TRACE_ID, server["span_id"])
    assert line["request_id"] == attributes["iop.request_id"]


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


def test_a_slow_receiver_costs_the_clients_nothing(cluster: Cluster) -> None:
    """
    The receiver answers each export only after 5 s (longer than the 2 s export timeout) and
    the queue holds 8 spans: 60 requests from 6 concurrent SDK clients are all served, none
    waits for the export (each answer well under the export timeout), and the spans that found
    the queue full are dropped and counted in ``iop_telemetry_spans_dropped_total``.
    """
    sink = cluster.start_fake("otlp_sink", "--delay-ms", "5000")
    upstream = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "4")
    cluster.write_chat_edge_config(upstream, capacity=8)
    section = {
        "endpoint": f"http://127.0.0.1:{sink}/v1/traces",
        "sampling_ratio": 1.0,
        "export_timeout_sec": 2,
        "queue_size": 8,
    }
    edge = cluster.root / "edge.yaml"
    config = yaml.safe_load(edge.read_text())
    config["telemetry"] = section
    edge.write_text(yaml.safe_dump(config))
    cluster.write_node_config(telemetry=section)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    client = openai.OpenAI(
        base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=15
    )
    latencies: list[float] = []
    errors: list[BaseException] = []

    def ask(count: int) -> None:
        for _ in range(count):
            started = time.monotonic()
            try:
                answer = client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}]
                )
                assert answer.choices[0].message.content
            except BaseException as e:  # collected for the assertion below
                errors.append(e)
            latencies.append(time.monotonic() - started)

    threads = [threading.Thread(target=ask, args=(10,)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(latencies) == 60
    assert max(latencies) < 2.0, sorted(latencies)[-5:]

    def dropped() -> float:
        with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("iop_telemetry_spans_dropped_total "):
                    return float(line.split()[1])
        return 0.0

    wait_until(lambda: dropped() > 0, 10, "spans dropped and counted")
    assert cluster.node_connected()
