"""
A stopping Edge drains (``edge.drain_timeout_sec``, iop.edge.ingress.drain), with real processes.

- One Edge stopped (SIGTERM) with streams in flight: its client port closes at once, the
  streams run to their end, the Edge exits 0 and logs the drain's two lines.
- A rolling restart: two Edges sharing one client port (``openai.reuse_port``) and one lease
  table on Redis, two nodes dialing both, a steady load of streaming and non-streaming chat
  completions through the OpenAI SDK (its default retries: what users have). Edge A is stopped
  and started again, then B: every call succeeds, the upstreams served exactly one request per
  call, no call was refused (a restarted Edge joins the port once its nodes are ready), what
  the SDK retried — if anything — was a connection-level error before the request reached an
  Edge's app (so never a duplicate), and every lease is back to zero.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
import time
from typing import Any

import openai
import pytest
import yaml

from tests.conftest import RedisServer
from tests.harness import CLIENT_KEY, Cluster, Daemon, port_open, wait_until
from tests.test_cluster_edges import (
    Edge,
    both_ready,
    settled,
    start_edge,
    two_edges,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="openai.reuse_port is Linux only"
)

MESSAGES: Any = [{"role": "user", "content": "hi"}]


class Retries(logging.Handler):
    """What the OpenAI SDK retried, from its own debug log: each retry's reason (an exception's
    type, or a status code)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("Encountered", "Retrying due to status")):
            self.reasons.append(message)

    def __enter__(self) -> Retries:
        sdk = logging.getLogger("openai._base_client")
        self._level = sdk.level
        sdk.setLevel(logging.DEBUG)
        sdk.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sdk = logging.getLogger("openai._base_client")
        sdk.removeHandler(self)
        sdk.setLevel(self._level)


class Load:
    """``workers`` threads calling the Edges through the OpenAI SDK until :meth:`stop`, every
    other call a stream; each call's outcome."""

    def __init__(self, url: str, workers: int) -> None:
        self.url = url
        self.ok = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)
        ]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, worker: int) -> None:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY, timeout=60)
        stream = bool(worker % 2)
        while not self._stop.is_set():
            try:
                if stream:
                    chunks = client.chat.completions.create(
                        model="chat", messages=MESSAGES, stream=True
                    )
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                else:
                    answer = client.chat.completions.create(model="chat", messages=MESSAGES)
                    text = answer.choices[0].message.content or ""
                assert text, "an empty answer"
                with self._lock:
                    self.ok += 1
            except Exception as e:
                with self._lock:
                    self.failed.append(f"{type(e).__name__}: {e}")
            stream = not stream
        client.close()


def served(cluster: Cluster, *upstreams: int) -> int:
    return sum(cluster.fake_stats(u)["completed_responses"] for u in upstreams)


def drained_lines(log: str) -> tuple[list[str], list[str]]:
    lines = log.splitlines()
    return [ln for ln in lines if "draining:" in ln], [ln for ln in lines if "drained in" in ln]


def restart(cluster: Cluster, edge: Edge) -> None:
    """Stop ``edge`` (it drains), check it exited cleanly, start it again until both nodes are
    ready on it."""
    assert edge.daemon is not None
    edge.daemon.signal(signal.SIGTERM)
    assert edge.daemon.wait(60) in (0, -signal.SIGTERM)
    starts, ends = drained_lines(edge.daemon.output())
    assert len(starts) == 1 and len(ends) == 1, edge.daemon.output()
    assert "every request finished" in ends[0], ends
    start_edge(cluster, edge)
    wait_until(functools.partial(both_ready, edge), 30, f"both nodes ready on {edge.name}")


def test_a_rolling_restart_under_load_loses_nothing(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, up_a, up_b = two_edges(cluster, redis_server, delay_ms=30, reuse_port=True)
    assert a.client_port == b.client_port
    with Retries() as retries:
        load = Load(a.url, workers=6).start()
        try:
            wait_until(lambda: load.ok >= 20, 30, "the load running")
            for edge in (a, b):
                restart(cluster, edge)
                wanted = load.ok + 20
                wait_until(lambda: load.ok >= wanted, 30, f"load served after {edge.name}")  # noqa: B023
        finally:
            load.stop()
    assert load.failed == [], load.failed[:5]
    assert load.ok > 60
    # Exactly one upstream request per call: a retried attempt never reached a provider.
    wait_until(lambda: served(cluster, up_a, up_b) == load.ok, 10, "every answer counted")
    # What the SDK retried, if anything: connection-level errors only, never a refusal (a
    # restarted Edge joins the port once its nodes are ready, so none answers 503).
    print(f"calls {load.ok}, retried {len(retries.reasons)}: {retries.reasons}")
    assert not [r for r in retries.reasons if "status" in r], retries.reasons
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), 15, f"no lease left on {edge.name}")


def serve_alone(cluster: Cluster, upstream: int, **edge: Any) -> Daemon:
    """One Edge, its node ready, in front of ``upstream`` (capacity 8); ``edge``: its
    ``edge:`` section's settings."""
    path = cluster.write_chat_edge_config(upstream, capacity=8, openai=cluster.client_api())
    config = yaml.safe_load(path.read_text())
    config["nodes"][0]["adapters"][0]["max_concurrency"] = 8
    config["edge"] = {"id": "edge", **edge}
    path.write_text(yaml.safe_dump(config))
    daemon = cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node ready")
    return daemon


def test_streams_in_flight_finish_when_the_edge_stops(cluster: Cluster) -> None:
    upstream = cluster.start_fake("fake_openai", "--tokens", "20", "--delay-ms", "100")
    edge = serve_alone(cluster, upstream)
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node ready")

    client = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY)
    results: list[tuple[int, str]] = []

    def stream() -> None:
        chunks = client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        results.append((len(pieces), "".join(pieces)))

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: cluster.fake_stats(upstream)["active_streams"] == 4, 20, "4 streams")
    stopped_at = time.monotonic()
    edge.signal(signal.SIGTERM)
    # The listener closes at once: nothing new is taken while the streams finish.
    wait_until(lambda: not port_open(cluster.client_port), 1.5, "the client port closed")
    for thread in threads:
        thread.join(30)
    assert edge.wait(30) in (0, -signal.SIGTERM)  # twistd ends by the signal it got
    assert len(results) == 4, results
    # Every token of every answer arrived (the fake's 20 tokens, each its own chunk).
    assert all(count >= 20 for count, _ in results), results
    assert time.monotonic() - stopped_at > 1.0  # it waited for them
    starts, ends = drained_lines(edge.output())
    assert len(starts) == 1 and "4 client requests in flight" in starts[0], starts
    assert len(ends) == 1 and "every request finished" in ends[0], ends
    assert cluster.fake_stats(upstream)["client_disconnects"] == 0


def test_at_the_bound_what_is_left_is_cut(cluster: Cluster) -> None:
    """A drain's bound reached: what is left is cut, the Edge exits 0 and says so."""
    upstream = cluster.start_fake("fake_openai", "--tokens", "100", "--delay-ms", "100")
    edge = serve_alone(cluster, upstream, drain_timeout_sec=1)
    client = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY, max_retries=0)
    errors: list[str] = []

    def stream() -> None:
        try:
            for _ in client.chat.completions.create(model="chat", messages=MESSAGES, stream=True):
                pass
        except Exception as e:
            errors.append(type(e).__name__)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    wait_until(lambda: cluster.fake_stats(upstream)["active_streams"] == 1, 20, "a stream")
    edge.signal(signal.SIGTERM)
    assert edge.wait(30) in (0, -signal.SIGTERM)  # twistd ends by the signal it got
    thread.join(10)
    assert errors, "the cut stream ended without an error"
    _, ends = drained_lines(edge.output())
    assert len(ends) == 1 and "1 connections (1 requests) still busy" in ends[0], ends
    wait_until(
        lambda: cluster.fake_stats(upstream)["client_disconnects"] == 1, 10, "upstream cancelled"
    )
