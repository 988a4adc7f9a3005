"""
From raw benchmark results to what a reader wants, per cell (answer mode, tokens per answer,
concurrency level): the figures that carry across machines (Edge + Node CPU per request and per
streamed chunk, the p50 latency IOP adds over calling its upstream directly) beside the
performance goals (:data:`GOALS`) with a pass/miss mark; the ratios (IOP/direct, IOP/LiteLLM with
one worker, IOP/the better LiteLLM); the added latency of every gateway; and the JSON + Markdown
files in ``bench/results/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STREAM = "stream"
NON_STREAM = "non-stream"
MODES = (STREAM, NON_STREAM)
LITELLM_1W = "litellm-1w"
LITELLMS = (LITELLM_1W, "litellm-2w")
# A reference that stands for the better of the LiteLLM targets, per cell and metric.
BEST_LITELLM = "litellm-best"
IOP_TARGETS = ("iop-tunnel", "iop-managed", "iop-run")

# (gateway, reference, label). A pair is reported when both ran.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("iop-tunnel", "direct", "IOP tunnel / direct"),
    ("iop-tunnel", LITELLM_1W, "IOP tunnel / LiteLLM (1 worker)"),
    ("iop-tunnel", BEST_LITELLM, "IOP tunnel / best LiteLLM"),
    ("iop-managed", "iop-tunnel", "IOP managed tunnel / legacy tunnel"),
    ("iop-run", "direct-ollama", "IOP run / direct (Ollama upstream)"),
    ("iop-run", LITELLM_1W, "IOP run / LiteLLM 1 worker (different upstream wire)"),
    (LITELLM_1W, "direct", "LiteLLM (1 worker) / direct"),
    ("litellm-2w", LITELLM_1W, "LiteLLM 2 workers / 1 worker"),
)

Key = tuple[str, str, int, int]


def _mode(run: dict[str, Any]) -> str:
    return str(run.get("mode", STREAM))


def _tokens(run: dict[str, Any]) -> int:
    return int(run.get("tokens", 0))


def _runs(results: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """Every throughput result by (target, mode, tokens, level)."""
    return {
        (r["target"], _mode(r), _tokens(r), int(r["concurrency"])): r
        for r in results.get("throughput", [])
    }


def _cells(results: dict[str, Any]) -> list[tuple[str, int]]:
    """The (mode, tokens) cell sets that ran, streams first, smaller answers first."""
    cells = {(_mode(r), _tokens(r)) for r in results.get("throughput", [])}
    return sorted(cells, key=lambda c: (MODES.index(c[0]) if c[0] in MODES else 9, c[1]))


def _div(a: float, b: float) -> float | None:
    if b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return round(a / b, 3)


def _levels(results: dict[str, Any]) -> list[int]:
    return sorted({int(r["concurrency"]) for r in results.get("throughput", [])})


def failures(
    results: dict[str, Any],
    targets: Iterable[str],
    levels: Iterable[int],
    modes: Iterable[str] = (STREAM,),
    tokens: Iterable[int] = (),
) -> list[str]:
    """What makes a run a failure: a target or cell without results, or with errors."""
    out: list[str] = []
    runs = _runs(results)
    sizes = list(tokens) or sorted({_tokens(r) for r in results.get("throughput", [])})
    if "throughput" in results:
        for mode in modes:
            for size in sizes:
                for level in levels:
                    for target in targets:
                        where = f"{target} {mode} {size} tokens at concurrency {level}"
                        run = runs.get((target, mode, size, level))
                        if run is None:
                            out.append(f"{where}: no result")
                        elif run["ok"] == 0:
                            out.append(f"{where}: no successful request")
                        elif run["errors"] or run["warmup"]["errors"]:
                            out.append(
                                f"{where}: {run['errors']} errors "
                                f"({run['warmup']['errors']} in warm-up): {run['error_kinds']}"
                            )
    out += multi_edge_failures(results)
    scale = results.get("scale")
    if isinstance(scale, dict):
        idle = scale.get("idle_nodes", {})
        if idle.get("ready") != idle.get("requested"):
            out.append(f"scale: {idle.get('ready')} of {idle.get('requested')} idle nodes ready")
        for entry in scale.get("streams", []):
            if entry["errors"] or entry["ok"] == 0:
                out.append(
                    f"scale: {entry['target']} with {entry['streams']} streams: "
                    f"{entry['ok']} ok, {entry['errors']} errors {entry['error_kinds']}"
                )
    return out


def multi_edge_failures(results: dict[str, Any]) -> list[str]:
    """The multi-Edge scenario's failures: a group and cell without results, or with errors."""
    multi = results.get("multi_edge")
    if not isinstance(multi, dict):
        return []
    out: list[str] = []
    runs = {(r["target"], _mode(r), int(r["concurrency"])): r for r in multi.get("throughput", [])}
    modes = results.get("settings", {}).get("modes", list(MODES))
    for group in multi.get("groups", {}):
        for mode in modes:
            for level in multi.get("levels", []):
                where = f"multi-edge: {group} {mode} at concurrency {level}"
                run = runs.get((group, mode, level))
                if run is None:
                    out.append(f"{where}: no result")
                elif run["ok"] == 0 or run["errors"] or run["warmup"]["errors"]:
                    out.append(
                        f"{where}: {run['ok']} ok, {run['errors']} errors "
                        f"({run['warmup']['errors']} in warm-up): {run['error_kinds']}"
                    )
    return out


def _reference(
    runs: dict[Key, dict[str, Any]],
    reference: str,
    cell: tuple[str, int, int],
    value: Callable[[dict[str, Any]], float],
    better: str,
) -> tuple[str, dict[str, Any]] | None:
    """The reference's run in a cell; for :data:`BEST_LITELLM` the better LiteLLM's."""
    mode, tokens, level = cell
    names = LITELLMS if reference == BEST_LITELLM else (reference,)
    found = [(n, runs[(n, mode, tokens, level)]) for n in names if (n, mode, tokens, level) in runs]
    found = [(n, r) for n, r in found if not math.isnan(value(r))]
    if not found:
        return None
    pick = max if better == "higher" else min
    return pick(found, key=lambda nr: value(nr[1]))


def _rps(run: dict[str, Any]) -> float:
    return float(run["rps"])


def derive(results: dict[str, Any]) -> None:
    """Add ``added_latency_ms``, ``ratios``, ``figures`` and ``goals`` to ``results``."""
    runs = _runs(results)
    levels = _levels(results)
    added: list[dict[str, Any]] = []
    for (target, mode, tokens, level), run in sorted(
        runs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])
    ):
        baseline = run.get("baseline")
        base = runs.get((baseline, mode, tokens, level)) if baseline else None
        if base is None:
            continue
        entry: dict[str, Any] = {
            "target": target,
            "baseline": baseline,
            "mode": mode,
            "tokens": tokens,
            "concurrency": level,
        }
        for metric in ("total_ms", "ttfb_ms", "ttft_ms"):
            entry[metric] = {
                q: round(run[metric][q] - base[metric][q], 3) for q in ("p50", "p90", "p99")
            }
        added.append(entry)
    results["added_latency_ms"] = added

    ratios: list[dict[str, Any]] = []
    for mode, tokens in _cells(results):
        for gateway, reference, label in RATIOS:
            refs = LITELLMS if reference == BEST_LITELLM else (reference,)
            if not any(
                (gateway, mode, tokens, lv) in runs and (ref, mode, tokens, lv) in runs
                for lv in levels
                for ref in refs
            ):
                continue
            metrics: list[tuple[str, Callable[[dict[str, Any]], float], str]] = [
                ("throughput (req/s)", _rps, "higher"),
                ("p50 latency", lambda r: float(r["total_ms"]["p50"]), "lower"),
                ("p99 latency", lambda r: float(r["total_ms"]["p99"]), "lower"),
                ("p50 time to first token", lambda r: float(r["ttft_ms"]["p50"]), "lower"),
            ]
            if reference.startswith("litellm"):
                # Direct has no gateway process, so this one only compares gateways.
                metrics.append(("gateway CPU per request", gateway_cpu_ms, "lower"))
            for metric, value, better in metrics:
                row: dict[str, Any] = {
                    "ratio": label,
                    "mode": mode,
                    "tokens": tokens,
                    "gateway": gateway,
                    "reference": reference,
                    "metric": metric,
                    "better": better,
                    "by_level": {},
                }
                if reference == BEST_LITELLM:
                    row["reference_by_level"] = {}
                for level in levels:
                    a = runs.get((gateway, mode, tokens, level))
                    ref = _reference(runs, reference, (mode, tokens, level), value, better)
                    if a is not None and ref is not None:
                        row["by_level"][str(level)] = _div(value(a), value(ref[1]))
                        if reference == BEST_LITELLM:
                            row["reference_by_level"][str(level)] = ref[0]
                ratios.append(row)
    results["ratios"] = ratios
    results["figures"] = figures(runs)
    results["goals"] = goal_summary(results["figures"])


# -- the figures that carry across machines, and the goals --------------------------------------


@dataclass(frozen=True)
class Goal:
    """One performance goal: a figure (a key of a :func:`figures` entry) and where it applies."""

    figure: str
    label: str
    target: str
    limit: float
    # True: the figure must be at most ``limit``; False: at least.
    at_most: bool
    mode: str | None = None
    levels: tuple[int, ...] | None = None
    chunks: int | None = None

    def applies(self, entry: dict[str, Any]) -> bool:
        return (
            entry["target"] == self.target
            and (self.mode is None or entry["mode"] == self.mode)
            and (self.levels is None or entry["concurrency"] in self.levels)
            and (
                self.chunks is None or (entry["mode"] == STREAM and entry["chunks"] == self.chunks)
            )
        )

    def met(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    @property
    def bound(self) -> str:
        return f"{'≤' if self.at_most else '≥'} {self.limit:g}"


# The performance goals (one interleaved run, ratios only; the CPU figures carry across
# machines). The CPU, latency and LiteLLM goals are the tunnel's; the run path's is its own.
GOALS: tuple[Goal, ...] = (
    Goal(
        "edge_node_cpu_ms_per_request",
        "Edge + Node CPU per non-stream request ≤ 0.8 ms",
        "iop-tunnel",
        0.8,
        True,
        mode=NON_STREAM,
    ),
    Goal(
        "edge_node_cpu_us_per_chunk",
        "Edge + Node CPU per streamed chunk ≤ 20 µs",
        "iop-tunnel",
        20,
        True,
        mode=STREAM,
    ),
    Goal(
        "added_p50_ms",
        "added p50 at c=1 ≤ 1 ms, non-stream",
        "iop-tunnel",
        1.0,
        True,
        mode=NON_STREAM,
        levels=(1,),
    ),
    Goal(
        "added_p50_ms",
        "added p50 at c=1 ≤ 1.2 ms, 32-chunk stream",
        "iop-tunnel",
        1.2,
        True,
        mode=STREAM,
        levels=(1,),
        chunks=32,
    ),
    Goal(
        "vs_litellm_1w",
        "throughput ≥ 20x LiteLLM (1 worker) at c=1, 10, 50",
        "iop-tunnel",
        20,
        False,
        levels=(1, 10, 50),
    ),
    Goal(
        "vs_direct",
        "run path throughput ≥ 0.25x direct Ollama at c=50",
        "iop-run",
        0.25,
        False,
        levels=(50,),
    ),
)


def figures(runs: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    """
    Per IOP target and cell: Edge + Node CPU per request (ms) and per streamed chunk (µs;
    stream cells), the p50 latency added over its direct baseline, and its throughput over
    LiteLLM (1 worker), the better LiteLLM and direct; each goal that applies, met or not.
    """
    out: list[dict[str, Any]] = []
    for (target, mode, tokens, level), run in sorted(
        runs.items(),
        key=lambda kv: (
            MODES.index(kv[0][1]) if kv[0][1] in MODES else 9,
            *kv[0][2:],
            IOP_TARGETS.index(kv[0][0]) if kv[0][0] in IOP_TARGETS else 9,
        ),
    ):
        if target not in IOP_TARGETS:
            continue
        cpu_ms = gateway_cpu_ms(run)
        cpu_s = sum(
            float(p["cpu_seconds"])
            for name, p in run.get("processes", {}).items()
            if name in GATEWAY_PROCESSES
        )
        chunks = int(run.get("chunks") or tokens or 1)
        base = runs.get((run.get("baseline") or "", mode, tokens, level))
        litellm = runs.get((LITELLM_1W, mode, tokens, level))
        best = _reference(runs, BEST_LITELLM, (mode, tokens, level), _rps, "higher")
        entry: dict[str, Any] = {
            "target": target,
            "mode": mode,
            "tokens": tokens,
            "chunks": chunks,
            "concurrency": level,
            "rps": run["rps"],
            "edge_node_cpu_ms_per_request": round(cpu_ms, 4),
            "edge_node_cpu_us_per_chunk": round(cpu_ms * 1000 / chunks, 2)
            if mode == STREAM
            else None,
            # Cores the Edge + Node kept busy while the cell ran: well under the cores they
            # could use means they wait rather than compute.
            "edge_node_cores": round(cpu_s / run["wall_s"], 2) if run.get("wall_s") else None,
            "added_p50_ms": round(run["total_ms"]["p50"] - base["total_ms"]["p50"], 3)
            if base is not None
            else None,
            "baseline": run.get("baseline"),
            "vs_direct": _div(_rps(run), _rps(base)) if base is not None else None,
            "vs_litellm_1w": _div(_rps(run), _rps(litellm)) if litellm is not None else None,
            "vs_best_litellm": _div(_rps(run), _rps(best[1])) if best is not None else None,
            "best_litellm": best[0] if best is not None else None,
            "goals": [],
        }
        for goal in GOALS:
            value = entry.get(goal.figure)
            if goal.applies(entry) and isinstance(value, int | float) and not math.isnan(value):
                entry["goals"].append(
                    {
                        "goal": goal.label,
                        "figure": goal.figure,
                        "bound": goal.bound,
                        "pass": goal.met(float(value)),
                    }
                )
        out.append(entry)
    return out


def goal_summary(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per goal: the cells it was judged in, how many met it, and the worst value."""
    out: list[dict[str, Any]] = []
    for goal in GOALS:
        judged = [(e, g) for e in entries for g in e["goals"] if g["goal"] == goal.label]
        values = [float(e[goal.figure]) for e, _ in judged]
        worst = (max if goal.at_most else min)(values) if values else None
        out.append(
            {
                "goal": goal.label,
                "target": goal.target,
                "cells": len(judged),
                "pass": sum(1 for _, g in judged if g["pass"]),
                "miss": sum(1 for _, g in judged if not g["pass"]),
                "worst": worst,
            }
        )
    return out


GATEWAY_PROCESSES = (
    "iop-edge",
    "iop-node",
    "iop-managed-edge",
    "iop-managed-node",
    *LITELLMS,
    "litellm",
)


def multi_edge_cpu_ms(run: dict[str, Any], prefix: str) -> float:
    """CPU ms per request of a multi-Edge run's processes whose names start with ``prefix``."""
    return float(
        sum(
            p["cpu_ms_per_request"]
            for name, p in run.get("processes", {}).items()
            if name.startswith(prefix)
        )
    )


def multi_edge_cores(run: dict[str, Any]) -> float | None:
    """Cores busy while a multi-Edge run was driven: the CPU seconds of every process of the
    run (Edges, nodes, Redis, the fake upstream, the load generator) ÷ its wall seconds."""
    wall = run.get("wall_s")
    if not wall:
        return None
    spent = sum(float(p["cpu_seconds"]) for p in run.get("processes", {}).values())
    spent += float(run.get("loadgen", {}).get("cpu_seconds", 0.0))
    return spent / float(wall)


def multi_edge_others_cpu_ms(run: dict[str, Any], group: str) -> float:
    """CPU ms per request of a multi-Edge run's fake upstream(s): every process that is not
    the group's own and not Redis."""
    return float(
        sum(
            p["cpu_ms_per_request"]
            for name, p in run.get("processes", {}).items()
            if not name.startswith(f"{group}-") and name != "redis"
        )
    )


def multi_edge_section(results: dict[str, Any]) -> list[str]:
    """The multi-Edge scenario's table (empty when it did not run)."""
    multi = results.get("multi_edge")
    if not isinstance(multi, dict):
        return []
    groups: dict[str, dict[str, Any]] = multi.get("groups", {})
    runs = {(r["target"], _mode(r), int(r["concurrency"])): r for r in multi.get("throughput", [])}
    names = list(groups)
    one, many = (names[0], names[-1]) if names else ("", "")
    lines = ["", "## Several Edges on one host (shared client port)", ""]
    shared = all(g.get("nodes_dial_every_edge") for g in groups.values())
    nodes = (
        "one node dials every Edge of its group (`edges:`)"
        if shared
        else "**one node per Edge** (this tree's node.yaml has no `edges:` yet)"
    )
    lines += [
        f"{multi.get('tokens')} tokens per answer, one per chunk; `{one}` = one Edge, `{many}` "
        "= "
        f"{len(groups.get(many, {}).get('edges', []))} Edge processes on one client port "
        "(`openai.reuse_port`: the kernel spreads connections over them), every Edge with "
        f"`cluster:` on one Redis; {nodes}. Both groups ran side by side, rounds interleaved. "
        "CPU ms/request: the group's Edges, its node(s), Redis, the fake upstream and the load "
        "generator; ÷ every request the group handled, warm-up included. Cores busy: the CPU "
        "seconds of all of them ÷ the seconds the group was driven (this host has "
        f"{results.get('environment', {}).get('cpus', '?')}).",
        "",
    ]
    rows = []
    modes = sorted({m for _, m, _ in runs}, key=lambda m: MODES.index(m) if m in MODES else 9)
    for mode in modes:
        for level in multi.get("levels", []):
            base = runs.get((one, mode, level))
            for name in names:
                run = runs.get((name, mode, level))
                if run is None:
                    continue
                ratio = _div(run["rps"], base["rps"]) if base is not None else None
                rows.append(
                    [
                        mode,
                        str(level),
                        name,
                        f"{run['ok']}/{run['requests']}",
                        _fmt(run["rps"], 1),
                        _fmt(ratio, 2) if name != one else "1",
                        _fmt(run["ttft_ms"]["p50"]),
                        _fmt(run["total_ms"]["p50"]),
                        _fmt(run["total_ms"]["p99"]),
                        _fmt(multi_edge_cpu_ms(run, f"{name}-edge"), 3),
                        _fmt(multi_edge_cpu_ms(run, f"{name}-node"), 3),
                        _fmt(multi_edge_cpu_ms(run, "redis"), 3),
                        _fmt(multi_edge_others_cpu_ms(run, name), 3),
                        _fmt(run.get("loadgen", {}).get("cpu_ms_per_request"), 3),
                        _fmt(multi_edge_cores(run), 2),
                        str(run["errors"]),
                    ]
                )
    lines += _table(
        [
            "mode",
            "c",
            "group",
            "ok",
            "req/s",
            f"÷ {one}",
            "TTFT p50",
            "total p50",
            "total p99",
            "Edges CPU ms/req",
            "node CPU ms/req",
            "Redis CPU ms/req",
            "upstream CPU ms/req",
            "load gen CPU ms/req",
            "cores busy",
            "errors",
        ],
        rows,
    )
    split = [
        f"`{name}`: "
        + ", ".join(f"{edge} {count}" for edge, count in g["requests_by_edge"].items())
        for name, g in groups.items()
        if g.get("requests_by_edge")
    ]
    if split:
        lines += ["", "Requests answered by each Edge (its `/metrics`): " + "; ".join(split) + "."]
    return lines


def quota_section(results: dict[str, Any]) -> list[str]:
    """The per-key limits measurement (:mod:`bench.quota`): the admit stage's cost per request,
    in process and on Redis; nothing when it did not run."""
    quota = results.get("quota_cost")
    if not isinstance(quota, dict):
        return []
    request = quota.get("request", {})
    usage = request.get("usage", {})
    lines = [
        "",
        "## Per-key limits: the admit stage's cost",
        "",
        "Per request, what the client pipeline's admit stage adds for a key with limits: the "
        f"worst case ({request.get('prompt_tokens')} prompt + {request.get('max_output_tokens')} "
        "max output tokens at a priced model) reserved through the quota gate, then the "
        f"reservation ended with the usage reported ({usage.get('input_tokens')} in, "
        f"{usage.get('output_tokens')} out) and its cost. The limited key has requests and "
        "tokens per minute, concurrent requests, a daily token budget and a monthly cost "
        "budget; its team has its own limits and budgets (2 subjects per request). Nothing is "
        "refused.",
        "",
        "In process (one Edge alone): process CPU per admit + settle, the median of "
        f"{_first(quota.get('in_process', []), 'passes')} passes of "
        f"{_first(quota.get('in_process', []), 'iterations')} requests.",
        "",
    ]
    lines += _table(
        ["key", "subjects", "CPU µs per admit + settle"],
        [
            [str(row["variant"]), str(row["subjects"]), _fmt(row["cpu_us"], 1)]
            for row in quota.get("in_process", [])
        ],
    )
    redis = quota.get("redis")
    if not isinstance(redis, dict):
        reason = quota.get("redis_skipped") or "not measured"
        return [*lines, "", f"On Redis: skipped ({reason})."]
    lines += [
        "",
        f"On Redis (redis-server {redis.get('redis_version', '?')} on a private unix socket, "
        "the cluster's quota table as `cluster:` builds it, one Edge process): c requests in "
        "flight, each reserve → end → its settle answered; the phases interleaved in "
        f"{_first(redis.get('levels', []), 'rounds')} rounds. Admit: reserve sent → reservation "
        "in hand; request: → settle answered (ms, pooled over the rounds). req/s and CPU per "
        "request (the Edge process and redis-server, from /proc): the median of the rounds. "
        "Redis calls: the script calls the Edge's store made per request, one reserve and one "
        "settle (asserted).",
        "",
    ]
    lines += _table(
        [
            "c",
            "requests",
            "req/s",
            "admit p50",
            "admit p99",
            "request p50",
            "request p99",
            "Edge CPU µs",
            "Redis CPU µs",
            "Redis calls",
        ],
        [
            [
                str(row["concurrency"]),
                str(row["requests"]),
                _fmt(row["rps"], 0),
                _fmt(row["admit_ms"]["p50"], 3),
                _fmt(row["admit_ms"]["p99"], 3),
                _fmt(row["request_ms"]["p50"], 3),
                _fmt(row["request_ms"]["p99"], 3),
                _fmt(row["edge_cpu_us"], 0),
                _fmt(row["redis_cpu_us"], 0),
                _fmt(row["calls_per_request"], 0),
            ]
            for row in redis.get("levels", [])
        ],
    )
    trip, free = redis.get("round_trip", {}), redis.get("unlimited", {})
    lines += [
        "",
        f"A bare round trip on the same connection (a no-op script, one at a time): p50 "
        f"{_fmt(trip.get('ms', {}).get('p50'), 3)} ms, p99 {_fmt(trip.get('ms', {}).get('p99'), 3)}"
        f" ms, {_fmt(trip.get('edge_cpu_us'), 0)} µs of Edge CPU and "
        f"{_fmt(trip.get('redis_cpu_us'), 0)} µs of Redis CPU. A key without limits on the "
        f"same table: {_fmt(free.get('calls_per_request'), 0)} Redis calls, "
        f"{_fmt(free.get('edge_cpu_us'), 1)} µs of CPU per request (the gate's fast path).",
    ]
    return lines


def _first(rows: list[dict[str, Any]], field: str) -> Any:
    return rows[0].get(field) if rows else None


def gateway_cpu_ms(run: dict[str, Any]) -> float:
    """CPU ms per request of a target's gateway processes (not the upstream): 0 for direct."""
    return float(
        sum(
            p["cpu_ms_per_request"]
            for name, p in run.get("processes", {}).items()
            if name in GATEWAY_PROCESSES
        )
    )


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _cell_label(mode: str, tokens: int) -> str:
    return f"{mode}, {tokens} tokens"


def _mark(entry: dict[str, Any], figure: str) -> str:
    """The pass/miss mark of the goals on ``figure`` in a figures entry; ``-`` for none."""
    marks = [
        f"{'pass' if g['pass'] else '**miss**'} ({g['bound']})"
        for g in entry["goals"]
        if g["figure"] == figure
    ]
    return "; ".join(marks) or "-"


def _figures_section(results: dict[str, Any]) -> list[str]:
    entries = results.get("figures", [])
    if not entries:
        return []
    lines = [
        "## Figures that carry across machines, and the goals",
        "",
        "Edge + Node CPU: CPU seconds of the Edge and Node processes over the cell (warm-up "
        "included) ÷ requests handled, for a non-stream cell in **ms per request**, for a stream "
        "cell in **µs per streamed chunk** (÷ (requests · chunks per answer)). Added p50: the "
        "target's p50 latency minus its direct upstream's in the same cell. Cores: the Edge + "
        "Node CPU seconds ÷ the cell's wall-clock seconds (far below the machine's cores: they "
        "wait rather than compute). vs LiteLLM, vs direct: throughput ratios. A goal is marked "
        "where it applies.",
        "",
    ]
    rows = []
    for e in entries:
        stream = e["mode"] == STREAM
        cpu = (
            f"{_fmt(e['edge_node_cpu_us_per_chunk'], 1)} µs/chunk"
            if stream
            else f"{_fmt(e['edge_node_cpu_ms_per_request'], 3)} ms/request"
        )
        best = e.get("best_litellm")
        rows.append(
            [
                e["target"],
                e["mode"],
                str(e["tokens"]),
                str(e["concurrency"]),
                cpu,
                _mark(
                    e, "edge_node_cpu_us_per_chunk" if stream else "edge_node_cpu_ms_per_request"
                ),
                _fmt(e.get("edge_node_cores")),
                _fmt(e["added_p50_ms"]),
                _mark(e, "added_p50_ms"),
                _fmt(e["vs_litellm_1w"], 1),
                _mark(e, "vs_litellm_1w"),
                f"{_fmt(e['vs_best_litellm'], 1)}" + (f" ({best})" if best else ""),
                _fmt(e["vs_direct"], 3),
                _mark(e, "vs_direct"),
            ]
        )
    lines += _table(
        [
            "target",
            "mode",
            "tokens",
            "c",
            "Edge + Node CPU",
            "goal",
            "cores",
            "added p50 ms",
            "goal",
            "vs LiteLLM 1w",
            "goal",
            "vs best LiteLLM",
            "vs direct",
            "goal",
        ],
        rows,
    )
    goals = results.get("goals", [])
    if goals:
        lines += ["", "Goals over the run:", ""]
        lines += _table(
            ["goal", "target", "cells judged", "pass", "miss", "worst"],
            [
                [
                    g["goal"],
                    g["target"],
                    str(g["cells"]),
                    str(g["pass"]),
                    str(g["miss"]),
                    _fmt(g["worst"], 3),
                ]
                for g in goals
            ],
        )
    return [*lines, ""]


def _throughput_lines(results: dict[str, Any]) -> list[str]:
    """The throughput scenario's sections: figures and goals, ratios, CPU, latency, cells."""
    levels = _levels(results)
    runs = _runs(results)
    cells = _cells(results)
    settings = results.get("settings", {})
    level_heads = [f"c={lv}" for lv in levels]
    lines: list[str] = []
    lines += _figures_section(results)

    lines += ["## Ratios", ""]
    lines += [
        "Gateway ÷ reference at each concurrency level, same run, same machine, same upstream, "
        "per cell (answer mode, tokens per answer). Throughput: higher is better for the "
        "gateway; latency (request start → end of the answer): lower is better. Best LiteLLM: "
        "the better of 1 and 2 workers in each cell and metric.",
        "",
    ]
    rows = [
        [
            r["mode"],
            str(r["tokens"]),
            r["ratio"],
            r["metric"],
            *(_fmt(r["by_level"].get(str(lv))) for lv in levels),
        ]
        for r in results.get("ratios", [])
    ]
    lines += _table(["mode", "tokens", "ratio", "metric", *level_heads], rows)

    lines += [
        "",
        "Targets: `direct` = the load generator calls the fake OpenAI upstream itself; "
        "`direct-ollama` = the same for the fake Ollama upstream; `iop-tunnel` = Edge "
        "OpenAI-compatible listener → pooled model → Node over TLS → `openai_compat` provider "
        "(raw provider tunnel); `iop-managed` = the same in managed mode (mTLS workload "
        "identity, a signed, sealed credential lease per request, opened on the Node); "
        "`iop-run` = the same listener → pooled model → `ollama` provider "
        "(normalized RunRequest/RunEvent path, NDJSON → SSE on the Edge); `litellm-1w` / "
        "`litellm-2w` = the LiteLLM proxy with 1 / 2 workers → the fake OpenAI upstream. "
        'Modes: `stream` = `"stream": true` (SSE, NDJSON from Ollama), `non-stream` = '
        '`"stream": false` (one JSON answer). Every upstream answers at once (no delay), '
        "one token per chunk.",
        "",
        "## Gateway CPU per request (ms)",
        "",
        "CPU time of the gateway's own processes (Edge + Node, or LiteLLM; not the upstream, not "
        "the load generator) per request handled, warm-up included.",
        "",
    ]
    gateways = [t for t in settings.get("targets", []) if not t.startswith("direct")]
    rows = []
    for mode, tokens in cells:
        for target in gateways:
            cells_cpu = []
            for level in levels:
                run = runs.get((target, mode, tokens, level))
                cells_cpu.append(_fmt(gateway_cpu_ms(run), 3) if run is not None else "-")
            if any(c != "-" for c in cells_cpu):
                rows.append([mode, str(tokens), target, *cells_cpu])
    lines += _table(["mode", "tokens", "target", *level_heads], rows)

    leases = results.get("lease_cost")
    if leases:
        lines += [
            "",
            "## Managed mode: CPU per credential lease (µs)",
            "",
            "One lease per managed tunnel request: issued (signed, sealed to the node) on the "
            "Edge, verified and opened on the Node. Process CPU time, by the node's recipient "
            "key type.",
            "",
        ]
        lines += _table(
            ["recipient key", "lease bytes", "Edge: issue", "Node: verify + open", "total"],
            [
                [
                    str(row["kem"]),
                    str(row["lease_bytes"]),
                    _fmt(row["issue_us"], 1),
                    _fmt(row["open_us"], 1),
                    _fmt(row["total_us"], 1),
                ]
                for row in leases
            ],
        )

    lines += ["", "## Added latency (ms) over the direct upstream at the same level", ""]
    rows = []
    for a in results.get("added_latency_ms", []):
        rows.append(
            [
                a["target"],
                a["baseline"],
                a.get("mode", STREAM),
                str(a.get("tokens", "")),
                str(a["concurrency"]),
                _fmt(a["total_ms"]["p50"]),
                _fmt(a["total_ms"]["p90"]),
                _fmt(a["total_ms"]["p99"]),
                _fmt(a["ttft_ms"]["p50"]),
                _fmt(a["ttft_ms"]["p99"]),
            ]
        )
    lines += _table(
        [
            "target",
            "minus",
            "mode",
            "tokens",
            "c",
            "total p50",
            "total p90",
            "total p99",
            "TTFT p50",
            "TTFT p99",
        ],
        rows,
    )

    lines += ["", "## Every target and cell", ""]
    rows = []
    for mode, tokens in cells:
        for level in levels:
            for target in settings.get("targets", []):
                run = runs.get((target, mode, tokens, level))
                if run is None:
                    continue
                cpu = "; ".join(
                    f"{name} {_fmt(p['cpu_ms_per_request'], 3)}"
                    for name, p in run.get("processes", {}).items()
                )
                rss = "; ".join(
                    f"{name} {_fmt(p['after']['rss_mib'], 1)}"
                    for name, p in run.get("processes", {}).items()
                )
                rows.append(
                    [
                        mode,
                        str(tokens),
                        str(level),
                        target,
                        f"{run['ok']}/{run['requests']}",
                        _fmt(run["rps"], 1),
                        _fmt(run["ttfb_ms"]["p50"]),
                        _fmt(run["ttft_ms"]["p50"]),
                        _fmt(run["ttft_ms"]["p99"]),
                        _fmt(run["total_ms"]["p50"]),
                        _fmt(run["total_ms"]["p90"]),
                        _fmt(run["total_ms"]["p99"]),
                        _fmt(run["bytes_per_s"] / 2**20, 2),
                        str(run["errors"]),
                        cpu,
                        rss,
                    ]
                )
    lines += _table(
        [
            "mode",
            "tokens",
            "c",
            "target",
            "ok",
            "req/s",
            "TTFB p50",
            "TTFT p50",
            "TTFT p99",
            "total p50",
            "total p90",
            "total p99",
            "MiB/s",
            "errors",
            "CPU ms/request",
            "RSS MiB after",
        ],
        rows,
    )
    lines += [
        "",
        "Latencies in ms from sending the request: TTFB = first streamed event (non-stream: "
        "first byte of the body), TTFT = first event with answer text (a non-empty `content`; "
        "non-stream: the whole answer, = total), total = end of the answer. "
        "CPU ms/request: CPU seconds each server used during the cell (warm-up included) ÷ "
        "requests it handled. RSS: resident memory after the cell.",
    ]

    return lines


def markdown(results: dict[str, Any]) -> str:
    settings = results.get("settings", {})
    env = results.get("environment", {})
    title = f"# IOP benchmark, {results.get('date')}, {env.get('host_alias')}"
    if results.get("label"):
        title += f" ({results['label']})"
    lines: list[str] = [title, ""]
    for note in results.get("notes", []):
        lines += [f"> {note}", ">"]
    if results.get("notes"):
        lines[-1] = ""
    if "throughput" in results:
        lines += _throughput_lines(results)
    else:
        lines += ["The throughput scenario did not run (`--no-throughput`).", ""]

    scale = results.get("scale")
    if isinstance(scale, dict):
        idle = scale.get("idle_nodes", {})
        lines += ["", "## Scale: idle nodes and concurrent slow streams", ""]
        lines += [
            f"- {idle.get('ready')} of {idle.get('requested')} idle fake nodes ready "
            f"(real TLS + protobuf wire, heartbeating) in {idle.get('connect_seconds')} s; "
            f"Edge RSS {idle.get('edge_rss_before_mib')} → {idle.get('edge_rss_after_mib')} MiB "
            f"= **{idle.get('edge_kib_per_connection')} KiB per idle node connection**; "
            f"the Edge used {idle.get('edge_cpu_percent_while_idle')} % of a core meanwhile "
            "(heartbeats).",
            "",
        ]
        rows = []
        for entry in scale.get("streams", []):
            for name, rss in entry["rss"].items():
                rows.append(
                    [
                        entry["target"],
                        str(entry["streams"]),
                        f"{entry['ok']}/{entry['streams']}",
                        name,
                        _fmt(rss["before_mib"], 1),
                        _fmt(rss["peak_mib"], 1),
                        _fmt(rss["kib_per_stream"], 1),
                        _fmt(entry["ttft_ms"]["p50"], 0),
                        _fmt(entry["total_ms"]["p50"], 0),
                        _fmt(entry["total_ms"]["p99"], 0),
                    ]
                )
        lines += _table(
            [
                "target",
                "streams",
                "ok",
                "process",
                "RSS before MiB",
                "RSS peak MiB",
                "KiB/stream",
                "TTFT p50 ms",
                "total p50 ms",
                "total p99 ms",
            ],
            rows,
        )
        lines += [
            "",
            "KiB/stream: (peak RSS during the streams - RSS before the first stream level) ÷ "
            "streams.",
        ]

    lines += quota_section(results)
    lines += multi_edge_section(results)

    lines += ["", "## Settings", ""]
    lines += ["```json", json.dumps({"settings": settings, "environment": env}, indent=2), "```"]
    for failure in results.get("failures", []):
        lines.append(f"- FAILURE: {failure}")
    return "\n".join(lines) + "\n"


def write(
    results: dict[str, Any], out: Path, alias: str, smoke: bool, label: str = ""
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{'smoke-' if smoke else ''}{results['date']}-{alias}{'-' + label if label else ''}"
    json_path = out / f"{stem}.json"
    md_path = out / f"{stem}.md"
    json_path.write_text(json.dumps(_finite(results), indent=1, allow_nan=False) + "\n")
    md_path.write_text(markdown(results))
    return json_path, md_path


def _finite(value: Any) -> Any:
    """``value`` with every NaN/inf float replaced by ``None`` (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def ratio_summary(results: dict[str, Any]) -> str:
    levels = _levels(results)
    lines = []
    # The console gets the throughput ratios; the Markdown has every metric.
    for r in (r for r in results.get("ratios", []) if r["metric"] == "throughput (req/s)"):
        values = ", ".join(f"c={lv}: {_fmt(r['by_level'].get(str(lv)))}" for lv in levels)
        cell = _cell_label(r.get("mode", STREAM), r.get("tokens", 0))
        lines.append(f"  {cell:<22} {r['ratio']:<52} {values}")
    out = ["throughput ratios (gateway ÷ reference):", *lines] if lines else ["no ratios"]
    goals = [g for g in results.get("goals", []) if g["cells"]]
    if goals:
        out.append("goals:")
        out += [
            f"  {g['goal']:<54} {g['pass']} pass, {g['miss']} miss (worst {_fmt(g['worst'], 3)})"
            for g in goals
        ]
    return "\n".join(out)
