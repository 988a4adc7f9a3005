"""
The usage ledger's read side against a real Edge: ``GET /usage`` and the real ``iop usage``.

The first test prepares the ledger file itself with the ledger's own store
(:class:`iop.usage.store.LedgerStore`, the module the Edge's ledger writes through), starts a
real Edge configured to keep that file, and checks what the admin API and the command answer:
totals by key and by UTC day, the filters, the exact cost, ``--csv``, and a second Edge that
cannot be reached named by ``iop usage`` (totals marked incomplete, exit 1). After the Edge has
stopped, the file is still whole and holds what it held. The second sends requests through a
real Edge and Node with the openai SDK: the ledger's totals are exactly the usage the upstream
reported, priced exactly.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import urllib.request
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from iop.config.model import Price
from iop.runtime.events import Usage
from iop.testing.ports import free_port
from iop.usage.price import cost_micros
from iop.usage.query import UsageQuery, parse_time
from iop.usage.store import LedgerStore, UsageRecord
from tests.harness import CLIENT_KEY, Cluster, wait_until

SONNET = Price(3_000_000, 15_000_000, 300_000, 3_750_000, 15_000_000)
DAY1 = int(parse_time("2026-05-01T10:00:00Z") * 1000)
DAY2 = int(parse_time("2026-05-02T10:00:00Z") * 1000)


def prepare_ledger(path: str) -> int:
    """Four requests: alice twice (cached and written prompt tokens), bob once priced and once
    with no usage reported. Returns alice's exact cost."""
    alice1 = Usage(20_000, 500, cached_input_tokens=18_000, cache_write_tokens=1_000)
    alice2 = Usage(1_000, 2_000, reasoning_tokens=1_500)
    store = LedgerStore.open(path)
    try:
        store.insert(
            [
                UsageRecord.of(
                    DAY1,
                    alice1,
                    request_id="req-1",
                    key="alice",
                    team="backend",
                    model="demo",
                    provider="a-chat",
                    node="node-a",
                    surface="anthropic",
                    outcome="ok",
                    cost_micros=cost_micros(alice1, SONNET),
                    currency="USD",
                    duration_ms=900,
                    ttft_ms=120,
                ),
                UsageRecord.of(
                    DAY2,
                    alice2,
                    key="alice",
                    team="backend",
                    model="demo",
                    cost_micros=cost_micros(alice2, SONNET),
                    currency="USD",
                ),
                UsageRecord.of(
                    DAY2, Usage(10, 10), key="bob", model="demo", cost_micros=180, currency="USD"
                ),
                UsageRecord.of(
                    DAY2, None, key="bob", model="demo", outcome="error", currency="USD"
                ),
            ]
        )
    finally:
        store.close()
    total = cost_micros(alice1, SONNET)
    other = cost_micros(alice2, SONNET)
    assert total is not None and other is not None
    return total + other


def get(cluster: Cluster, route: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(cluster.admin + route, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def iop_usage(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "iop.cli", "usage", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=cluster.env)


def test_usage_read_side_against_a_real_edge(cluster: Cluster) -> None:
    ledger = cluster.root / "state" / "usage.sqlite3"
    ledger.parent.mkdir()
    alice_cost = prepare_ledger(str(ledger))
    # 18000 cached at 0.30, 1000 written at 3.75, 1000 uncached at 3, 500 out at 15; then
    # 1000 in at 3 and 2000 out at 15 (reasoning priced as output): micro-units, exactly.
    assert alice_cost == 5_400 + 3_750 + 3_000 + 7_500 + 3_000 + 30_000
    cluster.write_edge_config(
        usage={"currency": "USD", "ledger": {"path": "state/usage.sqlite3", "retention_days": 0}}
    )
    cluster.start_edge()

    status, document = get(cluster, "/usage?by=key")
    assert status == 200, document
    assert document["edge"] == "systest-edge"
    rows = {r["group"]: r for r in document["rows"]}
    assert rows["alice"]["requests"] == 2
    assert rows["alice"]["input_tokens"] == 21_000
    assert rows["alice"]["cached_input_tokens"] == 18_000
    assert rows["alice"]["cache_write_tokens"] == 1_000
    assert rows["alice"]["reasoning_tokens"] == 1_500
    assert rows["alice"]["cost_micros"] == alice_cost
    assert rows["alice"]["cost"] == "0.052650"
    assert (rows["bob"]["requests"], rows["bob"]["unreported"]) == (2, 1)

    status, document = get(cluster, "/usage?by=day&key=alice")
    assert [(r["group"], r["requests"]) for r in document["rows"]] == [
        ("2026-05-01", 1),
        ("2026-05-02", 1),
    ]
    status, document = get(cluster, "/usage?since=2026-05-02&team=backend")
    assert [r["requests"] for r in document["rows"]] == [1]
    status, document = get(cluster, "/usage?by=month")
    assert status == 400 and "by must be one of" in document["error"]["message"]

    made = iop_usage(cluster, "--admin", cluster.admin, "--by", "key", "--csv")
    assert made.returncode == 0, made.stderr
    table = list(csv.DictReader(io.StringIO(made.stdout)))
    assert [(r["key"], r["requests"], r["cost"]) for r in table] == [
        ("alice", "2", "0.052650"),
        ("bob", "2", "0.000180"),
    ]

    # A second Edge that is not there: named, the totals marked incomplete, exit 1.
    gone = f"http://127.0.0.1:{free_port()}"
    made = iop_usage(cluster, "--admin", cluster.admin, "--admin", gone, "--json")
    assert made.returncode == 1
    assert f"could not ask {gone}" in made.stderr
    merged = json.loads(made.stdout)
    assert merged["complete"] is False
    assert [u["admin"] for u in merged["unreachable"]] == [gone]
    assert merged["rows"][0]["requests"] == 4

    edge = cluster.daemons[0]
    edge.stop()
    store = LedgerStore.open(str(ledger))
    try:
        assert len(store.records(UsageQuery())) == 4
    finally:
        store.close()


def test_requests_write_the_ledger_exactly(cluster: Cluster) -> None:
    """
    Requests through a real Edge write the ledger: one record per generation request, its
    tokens exactly what the upstream reported (the SDK sees the same usage), cached prompt
    tokens priced as cached, the cost exact; a refused request is recorded with no usage.
    """
    port = cluster.start_fake("fake_openai", "--delay-ms", "1", "--tokens", "6")
    price = {"input": 3, "output": 15, "cached_input": 0.3}
    openai_section = cluster.client_api(limited_models=["chat"])
    cluster.write_chat_edge_config(
        port,
        models=[{"id": "chat", "providers": ["p-chat"], "default_max_tokens": 64, "price": price}],
        openai=openai_section,
        usage={"currency": "USD", "ledger": {"path": "usage.sqlite3"}},
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    client = openai.OpenAI(
        base_url=f"{cluster.client_url}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )
    seen: list[Any] = []
    # A system message: the fake reports its words as cached prompt tokens.
    ask: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "you are terse and kind"},
        {"role": "user", "content": "say hello"},
    ]
    seen.append(client.chat.completions.create(model="chat", messages=ask).usage)
    for chunk in client.chat.completions.create(
        model="chat",
        messages=ask,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            seen.append(chunk.usage)
    try:
        client.chat.completions.create(model="nope", messages=ask)
    except openai.NotFoundError:
        pass
    assert len(seen) == 2 and all(u is not None for u in seen)
    prompt = sum(u.prompt_tokens for u in seen)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in seen)
    output = sum(u.completion_tokens for u in seen)
    assert cached > 0
    expected_cost = sum(
        cost_micros(
            Usage(
                u.prompt_tokens,
                u.completion_tokens,
                cached_input_tokens=u.prompt_tokens_details.cached_tokens,
            ),
            Price(3_000_000, 15_000_000, 300_000, 3_000_000, 15_000_000),
        )
        or 0
        for u in seen
    )

    def written() -> bool:
        status, document = get(cluster, "/usage?by=key")
        return status == 200 and sum(r["requests"] for r in document["rows"]) == 3

    # The ledger writes in batches (every second): wait for all three.
    wait_until(written, 10, "three ledger records")
    _, document = get(cluster, "/usage?by=key")
    [row] = document["rows"]
    assert row["group"] == "all"
    assert (row["requests"], row["unreported"]) == (3, 1)
    assert (row["input_tokens"], row["output_tokens"]) == (prompt, output)
    assert row["cached_input_tokens"] == cached
    assert row["cost_micros"] == expected_cost
    assert cluster.fake_stats(port)["total_requests"] == 2
