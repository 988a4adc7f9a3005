"""
The benchmark harness's own logic, without running a benchmark: what the load generator counts
as a whole answer, the command line's cells (modes, answer sizes, LiteLLM targets), and the
report's figures and goals from known results. ``make bench-smoke`` runs the harness for real.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import multiedge, report
from bench.loadgen import JSON, SSE, EventScanner, is_answer
from bench.procs import BenchError
from bench.run import parse_args
from iop.config import ConfigError, ConfigIssue

COMPLETION = {"id": "x", "object": "chat.completion", "choices": [{"index": 0}]}
OLLAMA = {"model": "m", "message": {"role": "assistant", "content": "hi"}, "done": True}


def test_whole_answers() -> None:
    assert is_answer(json.dumps(COMPLETION).encode())
    assert is_answer(json.dumps(OLLAMA).encode())
    assert not is_answer(json.dumps({**COMPLETION, "choices": []}).encode())
    assert not is_answer(json.dumps({**OLLAMA, "done": False}).encode())
    assert not is_answer(b'data: {"choices": [{}]}\n\ndata: [DONE]\n\n')
    assert not is_answer(b"[1, 2]")


def test_json_scanner_times_the_first_byte_and_judges_the_body() -> None:
    scanner = EventScanner(JSON, start=0.0)
    body = json.dumps(COMPLETION).encode()
    scanner.feed(body[:5])
    assert not math.isnan(scanner.ttfb)
    scanner.feed(body[5:])
    scanner.end()
    assert scanner.terminated

    cut = EventScanner(JSON, start=0.0)
    cut.feed(body[:-1])
    cut.end()
    assert not cut.terminated


def test_sse_scanner_needs_done() -> None:
    scanner = EventScanner(SSE, start=0.0)
    scanner.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]')
    scanner.end()
    assert scanner.terminated and not math.isnan(scanner.ttft)


def test_cells_on_the_command_line() -> None:
    smoke = parse_args(["--smoke"])
    assert smoke.modes == ["stream", "non-stream"]
    assert smoke.tokens == [32]
    assert not any(t.startswith("litellm") for t in smoke.targets)
    full = parse_args([])
    assert full.tokens == [32, 64]
    assert {"litellm-1w", "litellm-2w"} <= set(full.targets)
    assert full.litellm_requests == 500
    picked = parse_args(["--targets", "iop-tunnel,litellm", "--modes", "non-stream"])
    assert picked.targets == ["iop-tunnel", "litellm-1w", "litellm-2w"]
    assert picked.modes == ["non-stream"]


def run(
    target: str,
    mode: str,
    tokens: int,
    rps: float,
    p50: float,
    cpu: dict[str, float],
    baseline: str | None = None,
) -> dict[str, Any]:
    times = {"p50": p50, "p90": p50, "p99": p50, "mean": p50}
    return {
        "target": target,
        "mode": mode,
        "tokens": tokens,
        "chunks": tokens,
        "concurrency": 1,
        "baseline": baseline,
        "requests": 100,
        "ok": 100,
        "errors": 0,
        "error_kinds": {},
        "warmup": {"requests": 0, "errors": 0},
        "rps": rps,
        "rps_by_round": [rps],
        "bytes_per_s": 0.0,
        "ttfb_ms": times,
        "ttft_ms": times,
        "total_ms": times,
        "wall_s": 0.5,
        "processes": {
            name: {"cpu_ms_per_request": ms, "cpu_seconds": ms / 10, "after": {"rss_mib": 1.0}}
            for name, ms in cpu.items()
        },
    }


def known_results() -> dict[str, Any]:
    edge_node = {"iop-edge": 0.3, "iop-node": 0.3, "fake-openai-32": 0.5}
    runs = [
        run("direct", mode, 32, 2000.0, 1.0, {"fake-openai-32": 0.5})
        for mode in ("stream", "non-stream")
    ]
    runs += [
        # Stream: 0.6 ms / 32 chunks = 18.75 µs per chunk; added p50 1.5 ms (goal 1.2: miss).
        run("iop-tunnel", "stream", 32, 500.0, 2.5, edge_node, "direct"),
        run("litellm-1w", "stream", 32, 20.0, 50.0, {"litellm-1w": 40.0}, "direct"),
        run("litellm-2w", "stream", 32, 30.0, 40.0, {"litellm-2w": 45.0}, "direct"),
        # Non-stream: 0.9 ms per request (goal 0.8: miss); added p50 0.5 ms (goal 1: pass).
        run("iop-tunnel", "non-stream", 32, 600.0, 1.5, {**edge_node, "iop-node": 0.6}, "direct"),
        run("litellm-1w", "non-stream", 32, 25.0, 40.0, {"litellm-1w": 30.0}, "direct"),
    ]
    return {
        "date": "2026-01-01",
        "settings": {"targets": ["direct", "iop-tunnel", "litellm-1w", "litellm-2w"]},
        "environment": {"host_alias": "test"},
        "throughput": runs,
    }


def test_figures_and_goals() -> None:
    results = known_results()
    report.derive(results)
    figures = {f["mode"]: f for f in results["figures"]}
    stream, whole = figures["stream"], figures["non-stream"]
    assert stream["edge_node_cpu_us_per_chunk"] == 18.75
    assert stream["added_p50_ms"] == 1.5
    assert stream["vs_litellm_1w"] == 25.0
    # The better LiteLLM (2 workers here) in that cell.
    assert (stream["vs_best_litellm"], stream["best_litellm"]) == (16.667, "litellm-2w")
    assert stream["vs_direct"] == 0.25
    # 100 requests of 0.6 ms of Edge + Node CPU in half a second.
    assert stream["edge_node_cores"] == 0.12
    assert whole["edge_node_cpu_ms_per_request"] == 0.9
    assert whole["edge_node_cpu_us_per_chunk"] is None
    marks = {(mode, g["goal"]): g["pass"] for mode, f in figures.items() for g in f["goals"]}
    assert marks == {
        ("stream", "Edge + Node CPU per streamed chunk ≤ 20 µs"): True,
        ("stream", "added p50 at c=1 ≤ 1.2 ms, 32-chunk stream"): False,
        ("stream", "throughput ≥ 20x LiteLLM (1 worker) at c=1, 10, 50"): True,
        ("non-stream", "Edge + Node CPU per non-stream request ≤ 0.8 ms"): False,
        ("non-stream", "added p50 at c=1 ≤ 1 ms, non-stream"): True,
        ("non-stream", "throughput ≥ 20x LiteLLM (1 worker) at c=1, 10, 50"): True,
    }
    summary = {g["goal"]: g for g in results["goals"]}
    assert summary["throughput ≥ 20x LiteLLM (1 worker) at c=1, 10, 50"]["worst"] == 24.0

    ratios = {(r["mode"], r["ratio"], r["metric"]): r for r in results["ratios"]}
    best = ratios[("stream", "IOP tunnel / best LiteLLM", "throughput (req/s)")]
    assert best["by_level"] == {"1": 16.667}
    assert best["reference_by_level"] == {"1": "litellm-2w"}

    text = report.markdown(results)
    assert "## Figures that carry across machines, and the goals" in text
    assert "| iop-tunnel | stream | 32 | 1 | 18.8 µs/chunk | pass (≤ 20) | 0.12 | 1.50 |" in text
    assert "0.900 ms/request | **miss** (≤ 0.8)" in text


def test_failures_name_the_cell() -> None:
    results = known_results()
    results["throughput"][2]["errors"] = 3
    found = report.failures(results, ["iop-tunnel"], [1], ["stream", "non-stream"], [32])
    assert found == ["iop-tunnel stream 32 tokens at concurrency 1: 3 errors (0 in warm-up): {}"]


def test_multi_edge_on_the_command_line() -> None:
    assert not parse_args([]).multi_edge
    smoke = parse_args(["--smoke", "--multi-edge", "--no-throughput"])
    assert (smoke.multi_edge, smoke.multi_edge_levels, smoke.skip_throughput) == (True, [4], True)
    full = parse_args(["--multi-edge"])
    assert (full.multi_edge_levels, full.skip_throughput) == ([50], False)
    assert full.as_dict()["multi_edge"]["groups"] == {"iop-1edge": 1, "iop-2edge": 2}
    assert parse_args(["--multi-edge", "--multi-edge-levels", "10,50"]).multi_edge_levels == [
        10,
        50,
    ]


def test_multi_edge_configs() -> None:
    edges = multiedge.group_edges("iop-2edge", 2)
    configs = [
        multiedge.group_edge_config(
            edge,
            group="iop-2edge",
            client_port=9000,
            redis_url="unix:///r/redis.sock",
            openai_ports={32: 9100},
            capacity=66,
        )
        for edge in edges
    ]
    # One client port, shared; every other listener and id the Edge's own.
    assert {c["openai"]["listen"] for c in configs} == {"tcp:9000:interface=127.0.0.1"}
    assert all(c["openai"]["reuse_port"] for c in configs)
    assert [c["edge"]["id"] for c in configs] == ["iop-2edge-1", "iop-2edge-2"]
    assert (
        len({c["listen"]["nodes"] for c in configs} | {c["listen"]["admin"] for c in configs}) == 4
    )
    # The same cluster (Redis, key prefix), each Edge under its own id; the same nodes.
    assert [c["cluster"]["edge_id"] for c in configs] == ["iop-2edge-1", "iop-2edge-2"]
    assert {(c["cluster"]["redis"], c["cluster"]["key_prefix"]) for c in configs} == {
        ("unix:///r/redis.sock", "iop-2edge")
    }
    assert configs[0]["nodes"] == configs[1]["nodes"]


def test_multi_edge_nodes_dial_every_edge_or_one_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edges = multiedge.group_edges("g", 2)
    ports = [e.node_port for e in edges]
    monkeypatch.setattr(multiedge, "parse_node_config", lambda *a, **k: None)
    shared, configs = multiedge.node_configs(tmp_path, edges, {})
    assert shared
    assert [[e["port"] for e in c["edges"]] for c in configs] == [ports]

    def no_edges(*args: Any, **kwargs: Any) -> None:
        raise ConfigError([ConfigIssue("edges", "unknown key; did you mean 'edge'?")])

    monkeypatch.setattr(multiedge, "parse_node_config", no_edges)
    shared, configs = multiedge.node_configs(tmp_path, edges, {})
    assert not shared
    assert [c["edge"]["port"] for c in configs] == ports
    assert len({c["store"]["path"] for c in configs}) == 2

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConfigError([ConfigIssue("token", "is required")])

    monkeypatch.setattr(multiedge, "parse_node_config", broken)
    with pytest.raises(BenchError, match="token: is required"):
        multiedge.node_configs(tmp_path, edges, {})


def multi_edge_results() -> dict[str, Any]:
    one = run("iop-1edge", "stream", 32, 400.0, 100.0, {"iop-1edge-edge-1": 1.0})
    two = run(
        "iop-2edge",
        "stream",
        32,
        700.0,
        60.0,
        {
            "iop-2edge-edge-1": 0.6,
            "iop-2edge-edge-2": 0.5,
            "iop-2edge-node-1": 0.4,
            "redis": 0.1,
            "fake-openai-32": 0.3,
        },
    )
    two["loadgen"] = {"cpu_seconds": 0.02, "cpu_ms_per_request": 0.2}
    for r in (one, two):
        r["concurrency"] = 50
    return {
        "settings": {"modes": ["stream"]},
        "multi_edge": {
            "tokens": 32,
            "levels": [50],
            "groups": {
                "iop-1edge": {
                    "edges": ["iop-1edge-edge-1"],
                    "nodes_dial_every_edge": True,
                    "requests_by_edge": {"iop-1edge-edge-1": 100},
                },
                "iop-2edge": {
                    "edges": ["iop-2edge-edge-1", "iop-2edge-edge-2"],
                    "nodes_dial_every_edge": True,
                    "requests_by_edge": {"iop-2edge-edge-1": 48, "iop-2edge-edge-2": 52},
                },
            },
            "throughput": [one, two],
        },
    }


def test_multi_edge_table() -> None:
    results = multi_edge_results()
    assert report.multi_edge_failures(results) == []
    text = "\n".join(report.multi_edge_section(results))
    assert "## Several Edges on one host (shared client port)" in text
    assert "one node dials every Edge of its group" in text
    assert "| stream | 50 | iop-1edge | 100/100 | 400.0 | 1 |" in text
    # 700 ÷ 400; the Edges' CPU summed, the node's, Redis's, the upstream's and the load
    # generator's apart; cores busy: (0.06 + 0.05 + 0.04 + 0.01 + 0.03 + 0.02) s ÷ 0.5 s.
    assert "| stream | 50 | iop-2edge | 100/100 | 700.0 | 1.75 |" in text
    assert "| 1.100 | 0.400 | 0.100 | 0.300 | 0.200 | 0.42 | 0 |" in text
    assert "iop-2edge-edge-1 48, iop-2edge-edge-2 52" in text
    assert report.multi_edge_section({}) == []
    # The whole report without the throughput scenario still renders, with the table.
    assert "## Several Edges on one host" in report.markdown(results)


def test_multi_edge_failures_name_the_group() -> None:
    results = multi_edge_results()
    results["multi_edge"]["throughput"][1]["errors"] = 2
    results["multi_edge"]["throughput"].pop(0)
    assert report.multi_edge_failures(results) == [
        "multi-edge: iop-1edge stream at concurrency 50: no result",
        "multi-edge: iop-2edge stream at concurrency 50: 100 ok, 2 errors (0 in warm-up): {}",
    ]
    assert report.failures(results, [], []) == report.multi_edge_failures(results)


def test_floor_takes_the_median_of_its_rounds() -> None:
    from bench import floor

    def one(round_: int, cpu_ms: float, p50: float) -> dict[str, Any]:
        return {
            "variant": "tls",
            "mode": "stream",
            "concurrency": 1,
            "round": round_,
            "errors": 0,
            "rps": 100.0 + round_,
            "p50_ms": p50,
            "added_p50_ms": p50 - 1,
            "cpu_ms_per_request": cpu_ms,
            "cpu_us_per_chunk": cpu_ms * 1000 / floor.TOKENS,
            "cores": 0.5,
        }

    cells = floor.medians([one(0, 1.0, 3.0), one(1, 9.0, 2.0), one(2, 2.0, 4.0)])
    assert len(cells) == 1
    cell = cells[0]
    assert (cell["cpu_ms_per_request"], cell["p50_ms"], cell["added_p50_ms"]) == (2.0, 3.0, 2.0)
    assert cell["cpu_us_per_chunk"] == 62.5
    assert "| stream | 1 | tls | 2.000 | 62.5 | 101 | 3.00 | 2.00 | 0.50 | 0 |" in (
        floor.markdown_table(cells)
    )


def test_floor_pipeline_answers_both_modes() -> None:
    """The minimal pipeline for real, a few requests (``python -m bench.floor`` measures it)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.floor", "--variants", "tls", "--levels", "2"),
            *("--rounds", "1", "--requests", "6", "--warmup", "2", "--no-write"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert any(row.startswith("| non-stream | 2 | tls |") for row in rows)
    assert any(row.startswith("| stream | 2 | tls |") for row in rows)
    assert all(row.endswith("| 0 |") for row in rows[2:])


def quota_results() -> dict[str, Any]:
    def level(c: int, rps: float) -> dict[str, Any]:
        return {
            "concurrency": c,
            "requests": 100,
            "rps": rps,
            "admit_ms": {"p50": 0.25, "p99": 0.9},
            "request_ms": {"p50": 0.45, "p99": 1.2},
            "edge_cpu_us": 230.4,
            "redis_cpu_us": 150.0,
            "calls": {"quota_reserve": 100, "quota_settle": 100},
            "calls_per_request": 2.0,
            "renewals": 0,
            "rounds": 3,
        }

    return {
        "quota_cost": {
            "request": {
                "prompt_tokens": 500,
                "max_output_tokens": 1000,
                "usage": {"input_tokens": 500, "output_tokens": 300},
            },
            "in_process": [
                {
                    "variant": "key + team",
                    "subjects": 2,
                    "iterations": 50,
                    "passes": 5,
                    "cpu_us": 43.21,
                },
                {
                    "variant": "no limits",
                    "subjects": 0,
                    "iterations": 50,
                    "passes": 5,
                    "cpu_us": 5.04,
                },
            ],
            "redis": {
                "redis_version": "7.0.15",
                "round_trip": {
                    "requests": 100,
                    "rounds": 3,
                    "ms": {"p50": 0.1, "p99": 0.2},
                    "edge_cpu_us": 95,
                    "redis_cpu_us": 20.0,
                },
                "unlimited": {
                    **level(1, 9000.0),
                    "calls": {},
                    "calls_per_request": 0.0,
                    "edge_cpu_us": 4.56,
                },
                "levels": [level(1, 2100.0), level(10, 2900.0)],
            },
            "redis_skipped": None,
        }
    }


def test_quota_section() -> None:
    results = quota_results()
    text = "\n".join(report.quota_section(results))
    assert "## Per-key limits: the admit stage's cost" in text
    assert "the median of 5 passes of 50 requests" in text
    assert "| key + team | 2 | 43.2 |" in text
    assert "| no limits | 0 | 5.0 |" in text
    assert "redis-server 7.0.15" in text
    assert "the phases interleaved in 3 rounds" in text
    assert "| 1 | 100 | 2100 | 0.250 | 0.900 | 0.450 | 1.200 | 230 | 150 | 2 |" in text
    assert "| 10 | 100 | 2900 |" in text
    assert "p50 0.100 ms, p99 0.200 ms, 95 µs of Edge CPU and 20 µs of Redis CPU" in text
    assert "0 Redis calls, 4.6 µs of CPU per request" in text
    # In the whole report, with or without the throughput scenario.
    assert "## Per-key limits" in report.markdown(results)
    assert report.quota_section({}) == []

    quota = results["quota_cost"]
    quota["redis"], quota["redis_skipped"] = None, "redis-server is not installed"
    skipped = report.quota_section(results)
    assert skipped[-1] == "On Redis: skipped (redis-server is not installed)."
    assert "| key + team | 2 | 43.2 |" in skipped


def test_quota_on_the_command_line() -> None:
    smoke = parse_args(["--smoke"])
    assert (smoke.skip_quota, smoke.quota_iterations, smoke.quota_redis_iterations) == (
        False,
        200,
        100,
    )
    full = parse_args([])
    assert (full.quota_iterations, full.quota_redis_iterations) == (5000, 2000)
    assert full.as_dict()["quota"]["redis_levels"] == [1, 10, 50]
    skipped = parse_args(["--no-quota"])
    assert skipped.skip_quota and skipped.as_dict()["quota"] is None


def test_quota_measures_for_real() -> None:
    """``python -m bench.quota`` with a few requests: every variant in process; on Redis (when
    redis-server is installed) one reserve and one settle per request, none for a key without
    limits, at every level."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.quota", "--iterations", "50"),
            *("--redis-iterations", "30", "--levels", "3"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    rows = {row["variant"]: row for row in out["in_process"]}
    assert {name: row["subjects"] for name, row in rows.items()} == {
        "key + team": 2,
        "key alone": 1,
        "no limits": 0,
    }
    assert all(row["cpu_us"] > 0 for row in rows.values())
    if shutil.which("redis-server") is None:
        assert out["redis"] is None and "redis-server" in out["redis_skipped"]
        return
    redis = out["redis"]
    assert [row["concurrency"] for row in redis["levels"]] == [1, 3]
    for row in redis["levels"]:
        assert row["calls"] == {"quota_reserve": 30, "quota_settle": 30}
        assert row["calls_per_request"] == 2.0
        assert row["admit_ms"]["p50"] > 0 and row["rps"] > 0
    assert redis["unlimited"]["calls"] == {}
    assert (redis["round_trip"]["requests"], redis["round_trip"]["rounds"]) == (30, 3)
    assert "## Per-key limits" in report.markdown({"quota_cost": out})
