"""
Per-key limits and budgets on one Edge, end to end: a real Edge and node (twistd, TLS), the fake
OpenAI upstream (counting how many answers it serves at once and the usage it reported), and
the clients that meet the refusals — the official ``openai`` and ``anthropic`` SDKs, the real
Claude Code and Codex CLIs.

- A key with 5 requests per minute: the 6th is a 429 with the surface's rate-limit headers
  (OpenAI's ``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``) and ``retry-after``.
- The SDKs' own retries (their defaults): a spent budget fails at once (one request reaches the
  Edge, none the upstream); a concurrency refusal is retried after its ``retry-after: 1`` and
  succeeds once the slot frees (the holder, a stream, is closed by its client when the retrying
  client has seen its first 429, so the outcome does not depend on timing).
- A key with 2 concurrent requests and 20 concurrent streaming clients: never more than 2 at the
  upstream, every other client a 429 concurrency refusal, and a request after them is served.
- A token budget spent by streams: the usage the SDK saw is what the upstream reported, and the
  budget refuses exactly when what was charged plus the next request's worst case (its counted
  prompt, :func:`~iop.edge.ingress.tokens.estimate_prompt_tokens_openai`, plus ``max_tokens``)
  no longer fits — to the token (one token more refused, the exact fit admitted).
- Claude Code and Codex against a spent budget: a clear error at once, not minutes of retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import yaml
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from iop.edge.ingress.tokens import estimate_prompt_tokens_openai
from iop.testing.fake_openai import fake_text
from tests.harness import Cluster, agent_cli, wait_until

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello"}]
ASK: list[MessageParam] = [{"role": "user", "content": "say hello"}]
# The fake's usage of one answer to HELLO/ASK: its words in, its tokens (capped) out.
HELLO_WORDS = 2

STREAM_BUDGET = 100
SPENT_BUDGET = 100
# Larger than Claude Code's first request (its counted prompt, some 12k tokens, plus its
# max_tokens of 32000), spent by one answer of SPENDING tokens: a budget Claude Code meets spent.
AGENT_BUDGET = 200_000
SPENDING = 195_000

KEYS: dict[str, dict[str, Any]] = {
    "rpm-openai": {"limits": {"requests_per_minute": 5}},
    "rpm-anthropic": {"limits": {"requests_per_minute": 5}},
    "pair": {"limits": {"concurrent_requests": 2}},
    "single": {"limits": {"concurrent_requests": 1}},
    "streams": {"budgets": [{"period": "total", "tokens": STREAM_BUDGET}]},
    "plain-streams": {"budgets": [{"period": "total", "tokens": STREAM_BUDGET}]},
    "monthly": {"budgets": [{"period": "month", "tokens": SPENT_BUDGET}]},
    # A request of an agent alone exceeds this.
    "tiny": {"budgets": [{"period": "total", "tokens": 1000}]},
    "agent": {"budgets": [{"period": "month", "tokens": AGENT_BUDGET}]},
}


def secret(name: str) -> str:
    return f"sk-limits-{name}"


def start(cluster: Cluster, *, tokens: int = 8, delay_ms: int = 0) -> int:
    """The Edge (model ``chat`` on one provider in front of the fake upstream, a capacity far
    above every key's limits so only the keys' limits bind) with :data:`KEYS`, its node
    connected; returns the upstream's port."""
    upstream = cluster.start_fake(
        "fake_openai", "--tokens", str(tokens), "--delay-ms", str(delay_ms)
    )
    api = cluster.client_api()
    api["auth"]["keys"] += [
        {"name": name, "key_sha256": hashlib.sha256(secret(name).encode()).hexdigest(), **fields}
        for name, fields in KEYS.items()
    ]
    path = cluster.write_chat_edge_config(upstream, capacity=64, openai=api)
    config = yaml.safe_load(path.read_text())
    config["nodes"][0]["adapters"][0]["max_concurrency"] = 64
    path.write_text(yaml.safe_dump(config))
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    return upstream


def openai_client(cluster: Cluster, key: str, **options: Any) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    return openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=secret(key), timeout=30, **options
    )


def anthropic_client(cluster: Cluster, key: str, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(
        base_url=cluster.client_url, api_key=secret(key), timeout=30, **options
    )


def refusals(cluster: Cluster, code: str) -> int:
    """How many client requests the Edge answered with error ``code`` (its /metrics)."""
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("iop_client_errors_total{") and f'code="{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def stream_usage(client: openai.OpenAI, max_tokens: int) -> tuple[str, int]:
    """A streamed HELLO asking for its usage: (text, total tokens the stream reported)."""
    stream = client.chat.completions.create(
        model="chat",
        messages=HELLO,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, total = "", 0
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            total += chunk.usage.total_tokens
    return text, total


# -- rate-limit headers ------------------------------------------------------------------------


def test_the_sixth_request_in_a_minute_is_refused_with_the_headers(cluster: Cluster) -> None:
    upstream = start(cluster)
    chat = openai_client(cluster, "rpm-openai")
    for _ in range(5):
        chat.chat.completions.create(model="chat", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.RateLimitError) as refused:
        chat.chat.completions.create(model="chat", messages=HELLO, max_tokens=4)
    error = refused.value
    headers = error.response.headers
    assert error.status_code == 429
    assert (error.type, error.code) == ("rate_limit_error", "rate_limit_exceeded")
    assert "5 requests per minute" in error.message
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    reset = headers["x-ratelimit-reset-requests"]
    # The window is whole when the newest of the five leaves it, has room when the oldest does.
    assert re.fullmatch(r"\d+(\.\d+)?s", reset) and 0 < float(reset[:-1]) <= 60, reset
    assert 0 < int(headers["retry-after"]) <= 60
    assert "x-should-retry" not in headers
    assert not any(name.startswith("anthropic-ratelimit-") for name in headers)

    messages = anthropic_client(cluster, "rpm-anthropic")
    for _ in range(5):
        messages.messages.create(model="chat", max_tokens=4, messages=ASK)
    asked = time.time()
    with pytest.raises(anthropic.RateLimitError) as limited:
        messages.messages.create(model="chat", max_tokens=4, messages=ASK)
    answer = limited.value.response
    assert answer.status_code == 429
    assert answer.json()["error"]["type"] == "rate_limit_error"
    assert answer.headers["anthropic-ratelimit-requests-limit"] == "5"
    assert answer.headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset_at = datetime.strptime(
        answer.headers["anthropic-ratelimit-requests-reset"], "%Y-%m-%dT%H:%M:%SZ"
    ).replace(tzinfo=UTC)
    assert 0 < reset_at.timestamp() - asked <= 61
    assert 0 < int(answer.headers["retry-after"]) <= 60
    assert not any(name.startswith("x-ratelimit-") for name in answer.headers)
    # The refused requests never reached the upstream.
    assert cluster.fake_stats(upstream)["total_requests"] == 10


# -- the SDKs' own retries ---------------------------------------------------------------------


def test_sdk_retries_stop_at_once_on_a_spent_budget(cluster: Cluster) -> None:
    """The monthly budget spent (one answer charged 2 + 64 tokens of 100); the next request's
    worst case (10 counted + 64) no longer fits. Both SDKs, with their default retries, ask
    once: x-should-retry: false, though retry-after says when the month ends."""
    upstream = start(cluster, tokens=64)
    body = {"model": "chat", "messages": HELLO}
    spend = SPENT_BUDGET - estimate_prompt_tokens_openai({**body, "max_tokens": 1})
    # The exact fit is admitted: its worst case is the whole budget.
    openai_client(cluster, "monthly").chat.completions.create(
        model="chat", messages=HELLO, max_tokens=spend
    )
    assert cluster.fake_stats(upstream)["reported_output_tokens"] == 64

    began = time.monotonic()
    with pytest.raises(openai.RateLimitError) as refused:
        openai_client(cluster, "monthly", max_retries=2).chat.completions.create(
            model="chat", messages=HELLO, max_tokens=64
        )
    error = refused.value
    assert (error.type, error.code) == ("insufficient_quota", "insufficient_quota")
    assert error.response.json()["error"]["message"] == (
        "the per month budget of key 'monthly' (100 tokens) is nearly spent: 34 tokens left, "
        "less than this request may use (its prompt and max_tokens)"
    )
    headers = error.response.headers
    assert headers["x-should-retry"] == "false"
    assert 0 < int(headers["retry-after"]) <= 31 * 86400
    assert refusals(cluster, "insufficient_quota") == 1

    with pytest.raises(anthropic.RateLimitError) as limited:
        anthropic_client(cluster, "monthly", max_retries=2).messages.create(
            model="chat", max_tokens=64, messages=ASK
        )
    answer = limited.value.response
    assert answer.json()["error"]["type"] == "rate_limit_error"
    assert "budget" in answer.json()["error"]["message"]
    assert answer.headers["x-should-retry"] == "false"
    assert refusals(cluster, "insufficient_quota") == 2
    assert time.monotonic() - began < 10  # no backoff, let alone the month's retry-after
    assert cluster.fake_stats(upstream)["total_requests"] == 1


def test_sdk_retries_a_concurrency_refusal_until_the_slot_frees(cluster: Cluster) -> None:
    upstream = start(cluster, tokens=64, delay_ms=100)  # an answer: 6.4 s
    holder = openai_client(cluster, "single").chat.completions.create(
        model="chat", messages=HELLO, stream=True
    )
    next(iter(holder))  # the slot is held: the answer is streaming
    seen: list[tuple[int, str | None]] = []
    refused = threading.Event()

    def record(response: httpx2.Response) -> None:
        seen.append((response.status_code, response.headers.get("retry-after")))
        if response.status_code == 429:
            refused.set()

    retrying = openai_client(
        cluster,
        "single",
        max_retries=2,
        http_client=openai.DefaultHttpxClient(event_hooks={"response": [record]}),
    )
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            retrying.chat.completions.create(model="chat", messages=HELLO, max_tokens=4)
        ),
        daemon=True,
    )
    waiter.start()
    assert refused.wait(10), seen
    holder.close()  # its client goes away: the slot comes back
    waiter.join(20)
    assert answers and answers[0].choices[0].message.content == fake_text(4), seen
    # Refused once (or twice, had the slot not come back within the second), then served.
    assert seen[-1][0] == 200 and seen[:-1] and all(s == (429, "1") for s in seen[:-1]), seen
    assert refusals(cluster, "concurrency_limit_exceeded") == len(seen) - 1
    assert cluster.fake_stats(upstream)["total_requests"] == 2


# -- concurrency -------------------------------------------------------------------------------


def test_two_slots_twenty_streaming_clients(cluster: Cluster) -> None:
    upstream = start(cluster, tokens=8, delay_ms=100)  # a stream: 0.8 s
    clients = [openai_client(cluster, "pair") for _ in range(20)]
    gate = threading.Barrier(20)
    outcomes: list[Any] = []

    def run(client: openai.OpenAI) -> None:
        gate.wait()
        try:
            stream = client.chat.completions.create(
                model="chat", messages=HELLO, max_tokens=8, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            outcomes.append(("served", text))
        except openai.RateLimitError as e:
            outcomes.append(("refused", (e.code, e.response.headers.get("retry-after"))))

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    served = [text for kind, text in outcomes if kind == "served"]
    refused = [what for kind, what in outcomes if kind == "refused"]
    assert len(outcomes) == 20
    assert served and all(text == fake_text(8) for text in served), outcomes
    assert refused and set(refused) == {("concurrency_limit_exceeded", "1")}, outcomes
    stats = cluster.fake_stats(upstream)
    assert stats["max_active_answers"] <= 2, stats
    assert stats["total_requests"] == stats["completed_responses"] == len(served)
    answer = clients[0].chat.completions.create(model="chat", messages=HELLO, max_tokens=4)
    assert answer.choices[0].message.content == fake_text(4)


# -- budgets -----------------------------------------------------------------------------------


def test_streams_that_do_not_ask_for_usage_are_charged_their_usage(cluster: Cluster) -> None:
    """A plain Chat stream (no stream_options): the Edge asks the provider for its usage and
    keeps the usage chunk from the client, so the key is charged what the provider reported —
    the same 8 streams fit the 100-token budget as when the client asks — and the client sees
    exactly the stream it asked for (no chunk without choices)."""
    upstream = start(cluster, tokens=8)
    client = openai_client(cluster, "plain-streams")
    admitted = 0
    while True:
        try:
            stream = client.chat.completions.create(
                model="chat", messages=HELLO, max_tokens=16, stream=True
            )
            chunks = list(stream)
        except openai.RateLimitError as e:
            assert (e.type, e.code) == ("insufficient_quota", "insufficient_quota")
            break
        assert all(chunk.choices and chunk.usage is None for chunk in chunks), chunks
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        assert text == fake_text(8)
        admitted += 1
    assert admitted == 8
    stats = cluster.fake_stats(upstream)
    assert stats["reported_input_tokens"] + stats["reported_output_tokens"] == 8 * (HELLO_WORDS + 8)


def test_a_token_budget_spent_by_streams_is_exact(cluster: Cluster) -> None:
    """Each stream's worst case is 10 counted prompt tokens + max_tokens 16, its charge the
    fake's 2 + 8: admitted while charged + 26 <= 100, so 8 streams (80 charged), then the 9th is
    refused. The 20 tokens left admit exactly max_tokens 10, not 11."""
    upstream = start(cluster, tokens=8)
    client = openai_client(cluster, "streams")
    body: dict[str, Any] = {
        "model": "chat",
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    prompt = estimate_prompt_tokens_openai({**body, "max_tokens": 16})
    charged = 0
    admitted = 0
    while True:
        fits = charged + prompt + 16 <= STREAM_BUDGET
        try:
            text, used = stream_usage(client, 16)
        except openai.RateLimitError as e:
            assert not fits, (admitted, charged)
            assert (e.type, e.code) == ("insufficient_quota", "insufficient_quota")
            assert "budget of key 'streams' (100 tokens) is nearly spent: 20 tokens" in e.message
            assert e.response.headers["x-should-retry"] == "false"
            assert "retry-after" not in e.response.headers
            break
        assert fits, (admitted, charged)
        assert text == fake_text(8) and used == HELLO_WORDS + 8
        charged += used
        admitted += 1
    assert admitted == 8
    stats = cluster.fake_stats(upstream)
    # What the SDK saw is what the upstream reported: the Edge charged exactly that.
    assert charged == stats["reported_input_tokens"] + stats["reported_output_tokens"] == 80

    left = STREAM_BUDGET - charged
    with pytest.raises(openai.RateLimitError):
        stream_usage(client, left - prompt + 1)
    text, used = stream_usage(client, left - prompt)
    assert used == HELLO_WORDS + 8
    with pytest.raises(openai.RateLimitError):
        stream_usage(client, 1)  # 10 left: the prompt alone fills them
    stats = cluster.fake_stats(upstream)
    assert stats["total_requests"] == admitted + 1
    assert stats["reported_input_tokens"] + stats["reported_output_tokens"] == charged + used


# -- the agent CLIs ----------------------------------------------------------------------------


def spend_the_agent_budget(cluster: Cluster, upstream: int) -> None:
    """One answer of :data:`SPENDING` tokens charged to the ``agent`` key's month."""
    answer = openai_client(cluster, "agent").chat.completions.create(
        model="chat", messages=HELLO, max_tokens=SPENDING
    )
    assert answer.usage is not None and answer.usage.completion_tokens == SPENDING
    assert cluster.fake_stats(upstream)["reported_output_tokens"] == SPENDING


def claude(cluster: Cluster, tmp_path: Path, key: str) -> tuple[float, dict[str, Any], str]:
    """Claude Code (``-p``, JSON output, its default retries) with ``key``: seconds it took,
    its result, its stderr."""
    home = tmp_path / "claude-home"
    work = tmp_path / "claude-work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": cluster.client_url,
        "ANTHROPIC_API_KEY": secret(key),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    argv = [agent_cli("claude"), "-p", "say hello", "--model", "chat", "--output-format", "json"]
    began = time.monotonic()
    done = subprocess.run(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    took = time.monotonic() - began
    (tmp_path / f"claude-{key}.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    assert done.returncode != 0, done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    return took, result, done.stderr


def test_claude_code_stops_at_once_on_a_spent_budget(cluster: Cluster, tmp_path: Path) -> None:
    """
    Claude Code honours ``x-should-retry: false`` on a 429: one request, then an error that
    quotes the Edge's message (measured with 2.1.x: ``API Error: Request rejected (429) · the
    per month budget of key 'agent' (200000 tokens) is nearly spent: 4998 tokens left, ...``).
    A spent monthly budget says ``retry-after`` until the month ends; without ``x-should-retry:
    false`` a 429 is retried with backoff for minutes.
    """
    agent_cli("claude")
    upstream = start(cluster, tokens=SPENDING)
    spend_the_agent_budget(cluster, upstream)
    for key, what in (
        (
            "agent",
            f"the per month budget of key 'agent' ({AGENT_BUDGET} tokens) is nearly spent: "
            f"{AGENT_BUDGET - SPENDING - HELLO_WORDS} tokens left, less than this request may use "
            "(its prompt and max_tokens)",
        ),
        (
            "tiny",
            "this request alone exceeds the total budget of key 'tiny' (1000 tokens): "
            "lower max_tokens",
        ),
    ):
        before = refusals(cluster, "insufficient_quota")
        took, result, _ = claude(cluster, tmp_path, key)
        assert took < 30, took
        assert result["is_error"] is True and result["api_error_status"] == 429, result
        assert result["result"] == f"API Error: Request rejected (429) · {what}", result
        assert refusals(cluster, "insufficient_quota") == before + 1
    assert cluster.fake_stats(upstream)["total_requests"] == 1


def codex(cluster: Cluster, key: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``codex exec`` with its default retries (request and stream) and ``key``."""
    codex_cli = agent_cli("codex")
    home = cluster.root / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        'model_provider = "iop"\nmodel = "chat"\ncheck_for_update_on_startup = false\n\n'
        "[analytics]\nenabled = false\n\n"
        f'[model_providers.iop]\nname = "IOP"\nbase_url = "{cluster.client_url}/v1"\n'
        'env_key = "IOP_TEST_CODEX_KEY"\nwire_api = "responses"\n'
    )
    work = cluster.root / "codex-work"
    work.mkdir(exist_ok=True)
    env = {**os.environ, "CODEX_HOME": str(home), "IOP_TEST_CODEX_KEY": secret(key)}
    env["NO_COLOR"] = "1"
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    argv = [codex_cli, "exec", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only",
            "--color", "never", "--cd", str(work), "say hello"]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - began
    (cluster.root / f"codex-{key}.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    return took, done


def test_codex_stops_at_once_on_a_spent_budget(cluster: Cluster) -> None:
    """
    Codex reads OpenAI's ``insufficient_quota`` on its Responses request as a spent quota: no
    retry, and its own sentence (measured with 0.169: ``Quota exceeded. Check your plan and
    billing details.``) rather than the Edge's message.
    """
    agent_cli("codex")
    upstream = start(cluster, tokens=SPENDING)
    spend_the_agent_budget(cluster, upstream)
    for key in ("agent", "tiny"):
        before = refusals(cluster, "insufficient_quota")
        took, done = codex(cluster, key)
        assert took < 30, took
        assert done.returncode != 0
        assert "Quota exceeded" in done.stdout + done.stderr, (done.stdout, done.stderr[-2000:])
        assert refusals(cluster, "insufficient_quota") == before + 1
    assert cluster.fake_stats(upstream)["total_requests"] == 1
