"""
One key's limits and budget shared by two Edges on one ``redis-server``: real Edge and node
processes, one node dialing both Edges with one provider (a capacity far above the key's limits)
in front of one fake OpenAI upstream, which counts the answers it serves at once and the usage it
reported. Skipped without ``redis-server``, like the other cluster suites.

- 100 concurrent requests split over both Edges: never more than the key's 3 concurrent
  requests at the upstream; then requests alternating between the Edges spend the key's token
  budget, each admitted exactly when what the upstream reported so far plus the request's worst
  case fits — to the token, across Edges.
- Redis stopped: a limited key's requests are refused with 503 ``cluster_unavailable`` by the
  admit stage (fail closed, nothing reaches the upstream), on both Edges; once Redis is back
  they are served, and the key's limit holds again.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from typing import Any

import openai
import pytest

from iop.edge.ingress.tokens import estimate_prompt_tokens_openai
from iop.testing.fake_openai import fake_text
from iop.testing.ports import free_port
from tests.conftest import RedisServer
from tests.harness import OPENAI_CHAT_PROFILE, Cluster, wait_until
from tests.test_cluster_edges import (
    TTL,
    Edge,
    chat_node,
    cluster_section,
    settled,
    start_edge,
    write_node,
    write_second_edge,
)
from tests.test_key_limits import HELLO, HELLO_WORDS, secret

CONCURRENT = 3
# Worst case of a request here: 10 counted prompt tokens + max_tokens 8 = 18; its charge: the
# fake's 2 + 8 = 10. Charges come in tens, so the budget runs out with 15 left: room for exactly
# max_tokens 5, not 6.
BUDGET = 205
MAX_TOKENS = 8
KEYS: dict[str, dict[str, Any]] = {
    "shared": {
        "limits": {"concurrent_requests": CONCURRENT},
        "budgets": [{"period": "total", "tokens": BUDGET}],
    },
    "single": {"limits": {"concurrent_requests": 1}},
}
UNREACHABLE = "the request cannot be admitted right now: the gateway's cluster state is unreachable"


def two_edges(cluster: Cluster, redis: RedisServer) -> tuple[Edge, Edge, int, int]:
    """Edges A and B (one cluster) with :data:`KEYS`, one node dialing both, ready on both. Its
    two providers (capacity 64 each) front two fake upstreams answering 8 tokens: model ``slow``
    (a 2-s answer: requests sent together overlap there) and model ``chat`` (at once). Returns
    the Edges and the slow and fast upstreams' ports."""
    cluster.env["IOP_TEST_REDIS_PASSWORD"] = redis.password
    slow = cluster.start_fake("fake_openai", "--tokens", "8", "--delay-ms", "250")
    fast = cluster.start_fake("fake_openai", "--tokens", "8")
    a = Edge("edge", cluster.node_port, cluster.admin_port, cluster.client_port)
    b = Edge("edge-b", free_port(), free_port(), free_port())
    api = cluster.client_api()
    api["auth"]["keys"] += [
        {"name": name, "key_sha256": hashlib.sha256(secret(name).encode()).hexdigest(), **fields}
        for name, fields in KEYS.items()
    ]
    node = chat_node("node-a", "IOP_TEST_NODE_TOKEN", slow, capacity=64)
    other = chat_node("node-a", "IOP_TEST_NODE_TOKEN", fast, capacity=64)
    other["adapters"][0]["name"] = other["providers"][0]["adapter"] = "fake-fast"
    other["providers"][0]["id"] = "node-a-fast"
    node["adapters"] += other["adapters"]
    node["providers"] += other["providers"]
    path = cluster.write_edge_config(
        protocol_profiles=[OPENAI_CHAT_PROFILE],
        nodes=[node],
        models=[
            {"id": "slow", "providers": ["node-a-chat"], "default_max_tokens": 64},
            {"id": "chat", "providers": ["node-a-fast"], "default_max_tokens": 64},
        ],
        openai=api,
        cluster=cluster_section(redis, "edge-a"),
    )
    write_second_edge(cluster, path, b)
    for edge in (a, b):
        start_edge(cluster, edge)
    write_node(cluster, "node", "IOP_TEST_NODE_TOKEN", (a, b))
    cluster.start_node("node")
    for edge in (a, b):
        wait_until(functools.partial(edge.ready, "node-a"), 30, f"the node ready on {edge.name}")
    return a, b, slow, fast


def client(edge: Edge, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{edge.url}/v1", api_key=secret(key), max_retries=0, timeout=30)


def ask(chat: openai.OpenAI, max_tokens: int = MAX_TOKENS, model: str = "chat") -> tuple[str, Any]:
    """One HELLO: ("served", total tokens reported) or ("refused", the 429's error code)."""
    try:
        answer = chat.chat.completions.create(model=model, messages=HELLO, max_tokens=max_tokens)
    except openai.RateLimitError as e:
        return "refused", e.code
    assert answer.usage is not None
    return "served", answer.usage.total_tokens


def serves(edge: Edge) -> bool:
    """Whether ``edge`` serves the ``single`` key (not while Redis is away: 503)."""
    try:
        return ask(client(edge, "single"))[0] == "served"
    except openai.InternalServerError:
        return False


def reported(cluster: Cluster, *upstreams: int) -> int:
    """The usage the ``upstreams`` reported, all told."""
    total = 0
    for upstream in upstreams:
        stats = cluster.fake_stats(upstream)
        total += stats["reported_input_tokens"] + stats["reported_output_tokens"]
    return int(total)


def test_two_edges_share_a_keys_concurrency_and_budget(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a, b, slow, fast = two_edges(cluster, redis_server)
    prompt = estimate_prompt_tokens_openai({"model": "chat", "messages": HELLO})
    worst = prompt + MAX_TOKENS

    # 100 at once, half on each Edge, on the slow model: the first 3 hold the key's slots
    # (a 4th only if the burst outlasted an answer).
    clients = [client(a if i % 2 else b, "shared") for i in range(100)]
    gate = threading.Barrier(100)
    outcomes: list[tuple[str, Any]] = []

    def run(chat: openai.OpenAI) -> None:
        gate.wait()
        outcomes.append(ask(chat, model="slow"))

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 100
    served = [used for kind, used in outcomes if kind == "served"]
    refused = [code for kind, code in outcomes if kind == "refused"]
    assert len(served) >= CONCURRENT, outcomes
    assert served == [HELLO_WORDS + MAX_TOKENS] * len(served), outcomes
    assert set(refused) == {"concurrency_limit_exceeded"}, outcomes
    stats = cluster.fake_stats(slow)
    assert stats["max_active_answers"] == CONCURRENT, stats
    charged = reported(cluster, slow)
    assert charged == sum(served)

    # Then one at a time, alternating Edges: admitted exactly while it fits.
    for turn in range(BUDGET):
        fits = charged + worst <= BUDGET
        kind, what = ask(client((a, b)[turn % 2], "shared"))
        assert (kind == "served") == fits, (turn, charged, kind, what)
        if not fits:
            assert what == "insufficient_quota"
            break
        assert what == HELLO_WORDS + MAX_TOKENS
        charged += what
        assert reported(cluster, slow, fast) == charged
    left = BUDGET - charged
    assert 0 < left - prompt < MAX_TOKENS
    # To the token, whichever Edge asks.
    assert ask(client(a, "shared"), left - prompt + 1) == ("refused", "insufficient_quota")
    assert ask(client(b, "shared"), left - prompt) == ("served", HELLO_WORDS + left - prompt)
    assert reported(cluster, slow, fast) == charged + HELLO_WORDS + left - prompt <= BUDGET
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), 10, f"{edge.name} counters at zero")


@pytest.mark.parametrize("fault", ["stopped", "hung"])
def test_redis_stopped_fails_a_limited_key_closed(
    cluster: Cluster, redis_server: RedisServer, fault: str
) -> None:
    """Redis killed, or hung (SIGSTOP: it accepts and answers nothing): a limited key is
    refused 503 on both Edges — a hung Redis within the cluster timeout, not a request that
    hangs with it — and served and limited again once Redis is back."""
    a, b, _, fast = two_edges(cluster, redis_server)
    for edge in (a, b):
        assert ask(client(edge, "single"))[0] == "served"
    if fault == "stopped":
        redis_server.stop()
    else:
        redis_server.pause()
    for edge in (a, b):
        with pytest.raises(openai.InternalServerError) as refused:
            client(edge, "single").chat.completions.create(
                model="chat", messages=HELLO, max_tokens=4
            )
        error = refused.value
        # The admit stage's refusal (not the capacity lease's, which comes after it).
        assert (error.status_code, error.code) == (503, "cluster_unavailable")
        assert error.response.json()["error"]["message"] == UNREACHABLE
        assert error.response.headers["retry-after"] == "1"
        assert "x-should-retry" not in error.response.headers
    assert cluster.fake_stats(fast)["total_requests"] == 2

    if fault == "stopped":
        redis_server.start()
    else:
        redis_server.resume()
    for edge in (a, b):
        wait_until(functools.partial(serves, edge), TTL + 10, f"{edge.name} serves the key again")
    # The limit holds again: a stream on A holds the key's one slot, B refuses.
    held = client(a, "single").chat.completions.create(
        model="slow", messages=HELLO, max_tokens=8, stream=True
    )
    first = next(iter(held))
    assert ask(client(b, "single")) == ("refused", "concurrency_limit_exceeded")
    text = (first.choices[0].delta.content or "") + "".join(
        c.choices[0].delta.content or "" for c in held if c.choices
    )
    assert text == fake_text(8)
    assert ask(client(b, "single"))[0] == "served"
    for edge in (a, b):
        wait_until(functools.partial(settled, edge), 10, f"{edge.name} counters at zero")
