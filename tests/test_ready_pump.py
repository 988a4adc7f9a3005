"""
A node that becomes ready while requests wait in the provider queue serves each of them exactly
once, on both wires, without its session being dropped.

Model ``m`` (OpenAI-compatible providers: the raw tunnel) and model ``m-run`` (Ollama providers:
normalized runs) each have one provider on node X and one on node Y, capacity 1, ``max_queue``
4. Only Y runs; one long stream holds Y's slot of each model and three more requests of each
queue. Then X starts: the moment it is ready, the queue drains to it. The Edge must acknowledge
X's ready before it sends X a single request; a request sent earlier is a protocol violation the
node answers by dropping its session (every queued request then failed with 502).

Clients are the official ``openai`` SDK, streaming, as a user's program would be.
"""

from __future__ import annotations

import secrets
import threading
import time
from functools import partial
from typing import Any

import openai

from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, wait_until

QUEUED = 3
TOKENS = 12


def provider(pid: str, adapter: str, model: str) -> dict[str, Any]:
    return {
        "id": pid,
        "adapter": adapter,
        "category": "api",
        "models": [model],
        "capacity": 1,
        "max_queue": 4,
        "queue_timeout_sec": 60,
    }


def node(node_id: str, token_var: str, openai_port: int, ollama_port: int) -> dict[str, Any]:
    return {
        "id": node_id,
        "token": "${" + token_var + "}",
        "adapters": [
            {
                "name": "fake-openai",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{openai_port}/v1",
                "max_concurrency": 4,
            },
            {
                "name": "fake-ollama",
                "type": "ollama",
                "base_url": f"http://127.0.0.1:{ollama_port}",
                "max_concurrency": 4,
            },
        ],
        "providers": [
            provider(f"{node_id}-chat", "fake-openai", "demo-model"),
            provider(f"{node_id}-llama", "fake-ollama", "llama3.2"),
        ],
    }


def queued(cluster: Cluster, provider_id: str) -> int:
    return int(cluster.provider(provider_id)["queued"])


def holds_one(cluster: Cluster, provider_id: str) -> bool:
    return bool(cluster.provider(provider_id)["in_flight"] == 1)


def counters(cluster: Cluster) -> dict[str, tuple[int, int]]:
    return {p["id"]: (p["in_flight"], p["queued"]) for p in cluster.status()["providers"]}


class Chats:
    """Streamed chats started one after another, each read to its end in its own thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.client = openai.OpenAI(
            base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=90
        )
        self.threads: list[threading.Thread] = []
        self.results: list[tuple[str, str, BaseException | None]] = []
        self._lock = threading.Lock()

    def start(self, model: str) -> None:
        thread = threading.Thread(target=self._chat, args=(model,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _chat(self, model: str) -> None:
        text, error = "", None
        try:
            stream = self.client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
            )
            for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
        except BaseException as e:  # the assertion below shows it
            error = e
        with self._lock:
            self.results.append((model, text, error))

    def join(self, timeout: float) -> list[tuple[str, str, BaseException | None]]:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return list(self.results)


class TestActualNodeReconnectReadyPumpsQueuedWaiterExactlyOnce:
    def test_queued_requests_run_on_the_node_that_becomes_ready(self, cluster: Cluster) -> None:
        cluster.env["IOP_TEST_NODE_B_TOKEN"] = secrets.token_urlsafe(24)
        openai_port = cluster.start_fake(
            "fake_openai", "--delay-ms", "150", "--tokens", str(TOKENS)
        )
        ollama_port = cluster.start_fake(
            "fake_ollama", "--delay-ms", "150", "--tokens", str(TOKENS)
        )
        cluster.write_edge_config(
            nodes=[
                node("x", "IOP_TEST_NODE_TOKEN", openai_port, ollama_port),
                node("y", "IOP_TEST_NODE_B_TOKEN", openai_port, ollama_port),
            ],
            models=[
                {"id": "m", "providers": ["x-chat", "y-chat"]},
                {"id": "m-run", "providers": ["x-llama", "y-llama"]},
            ],
            openai=cluster.client_api(),
        )
        cluster.write_node_config("node-x")
        cluster.write_node_config("node-y", token="${IOP_TEST_NODE_B_TOKEN}")
        cluster.start_edge()
        cluster.start_node("node-y")
        wait_until(lambda: cluster.node_connected("y"), 20, "node y")

        chats = Chats(cluster)
        for model, pid in (("m", "y-chat"), ("m-run", "y-llama")):
            chats.start(model)  # holds y's slot of the model
            wait_until(partial(holds_one, cluster, pid), 10, pid)
        for _ in range(QUEUED):
            chats.start("m")
            chats.start("m-run")
        wait_until(
            lambda: queued(cluster, "y-chat") == QUEUED and queued(cluster, "y-llama") == QUEUED,
            10,
            "three requests queued per model",
        )

        node_x = cluster.start_node("node-x")
        wait_until(lambda: cluster.node_connected("x"), 20, "node x")
        results = chats.join(90)

        assert len(results) == 2 * (QUEUED + 1), results
        failures = [(model, error) for model, _, error in results if error is not None]
        assert failures == [], failures
        expected = {"m": fake_text(TOKENS)}
        for model, text, _ in results:
            if model in expected:
                assert text == expected[model], (model, text)
            else:
                assert text, (model, text)
        wait_until(
            lambda: all(v == (0, 0) for v in counters(cluster).values()), 10, "counters at 0"
        )
        # X's one session served the queue: never aborted, never re-registered.
        log = node_x.output()
        assert "unexpected" not in log, log
        assert log.count("ready") >= 1 and cluster.node_connected("x")
        assert log.count("registering with edge") == 1, log
