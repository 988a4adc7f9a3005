"""
From raw benchmark results to what a reader wants: ratios (IOP/direct, IOP/LiteLLM), the latency
each gateway adds over calling its upstream directly at the same level in the same run, and the
JSON + Markdown files in ``bench/results/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# (gateway, reference, label). A pair is reported when both ran.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("iop-tunnel", "direct", "IOP tunnel / direct"),
    ("iop-tunnel", "litellm", "IOP tunnel / LiteLLM"),
    ("iop-managed", "iop-tunnel", "IOP managed tunnel / legacy tunnel"),
    ("iop-run", "direct-ollama", "IOP run / direct (Ollama upstream)"),
    ("iop-run", "litellm", "IOP run / LiteLLM (different upstream wire)"),
    ("litellm", "direct", "LiteLLM / direct"),
)


def _runs(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["target"], int(r["concurrency"])): r for r in results.get("throughput", [])}


def _div(a: float, b: float) -> float | None:
    if b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return round(a / b, 3)


def _levels(results: dict[str, Any]) -> list[int]:
    return sorted({int(r["concurrency"]) for r in results.get("throughput", [])})


def failures(results: dict[str, Any], targets: Iterable[str], levels: Iterable[int]) -> list[str]:
    """What makes a run a failure: a target or level without results, or with errors."""
    out: list[str] = []
    runs = _runs(results)
    if "throughput" in results:
        for level in levels:
            for target in targets:
                run = runs.get((target, level))
                if run is None:
                    out.append(f"{target} at concurrency {level}: no result")
                elif run["ok"] == 0:
                    out.append(f"{target} at concurrency {level}: no successful request")
                elif run["errors"] or run["warmup"]["errors"]:
                    out.append(
                        f"{target} at concurrency {level}: {run['errors']} errors "
                        f"({run['warmup']['errors']} in warm-up): {run['error_kinds']}"
                    )
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


def derive(results: dict[str, Any]) -> None:
    """Add ``added_latency_ms`` and ``ratios`` to ``results``."""
    runs = _runs(results)
    levels = _levels(results)
    added: list[dict[str, Any]] = []
    for (target, level), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        baseline = run.get("baseline")
        base = runs.get((baseline, level)) if baseline else None
        if base is None:
            continue
        entry: dict[str, Any] = {"target": target, "baseline": baseline, "concurrency": level}
        for metric in ("total_ms", "ttfb_ms", "ttft_ms"):
            entry[metric] = {
                q: round(run[metric][q] - base[metric][q], 3) for q in ("p50", "p90", "p99")
            }
        added.append(entry)
    results["added_latency_ms"] = added

    ratios: list[dict[str, Any]] = []
    for gateway, reference, label in RATIOS:
        if not any((gateway, lv) in runs and (reference, lv) in runs for lv in levels):
            continue
        metrics: list[tuple[str, Callable[[dict[str, Any]], float], str]] = [
            ("throughput (req/s)", lambda r: float(r["rps"]), "higher"),
            ("p50 latency", lambda r: float(r["total_ms"]["p50"]), "lower"),
            ("p99 latency", lambda r: float(r["total_ms"]["p99"]), "lower"),
            ("p50 time to first token", lambda r: float(r["ttft_ms"]["p50"]), "lower"),
        ]
        if reference == "litellm":
            # Direct has no gateway process, so this one only compares gateways.
            metrics.append(("gateway CPU per request", gateway_cpu_ms, "lower"))
        for metric, value, better in metrics:
            row: dict[str, Any] = {
                "ratio": label,
                "gateway": gateway,
                "reference": reference,
                "metric": metric,
                "better": better,
                "by_level": {},
            }
            for level in levels:
                a, b = runs.get((gateway, level)), runs.get((reference, level))
                if a is not None and b is not None:
                    row["by_level"][str(level)] = _div(value(a), value(b))
            ratios.append(row)
    results["ratios"] = ratios


GATEWAY_PROCESSES = ("iop-edge", "iop-node", "iop-managed-edge", "iop-managed-node", "litellm")


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


def markdown(results: dict[str, Any]) -> str:
    levels = _levels(results)
    runs = _runs(results)
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
    level_heads = [f"c={lv}" for lv in levels]

    lines += ["## Ratios", ""]
    lines += [
        "Gateway ÷ reference at each concurrency level, same run, same machine, same upstream. "
        "Throughput: higher is better for the gateway; latency (request start → end of stream): "
        "lower is better.",
        "",
    ]
    rows = [
        [r["ratio"], r["metric"], *(_fmt(r["by_level"].get(str(lv))) for lv in levels)]
        for r in results.get("ratios", [])
    ]
    lines += _table(["ratio", "metric", *level_heads], rows)

    lines += [
        "",
        "Targets: `direct` = the load generator calls the fake OpenAI upstream itself; "
        "`direct-ollama` = the same for the fake Ollama upstream; `iop-tunnel` = Edge "
        "OpenAI-compatible listener → pooled model → Node over TLS → `openai_compat` provider "
        "(raw provider tunnel); `iop-managed` = the same in managed mode (mTLS workload "
        "identity, a signed, sealed credential lease per request, opened on the Node); "
        "`iop-run` = the same listener → pooled model → `ollama` provider "
        "(normalized RunRequest/RunEvent path, NDJSON → SSE on the Edge); `litellm` = LiteLLM "
        "proxy → the fake OpenAI upstream.",
        "",
        "## Gateway CPU per request (ms)",
        "",
        "CPU time of the gateway's own processes (Edge + Node, or LiteLLM; not the upstream, not "
        "the load generator) per request handled, warm-up included.",
        "",
    ]
    gateways = [t for t in results["settings"].get("targets", []) if not t.startswith("direct")]
    rows = []
    for target in gateways:
        cells = []
        for level in levels:
            run = runs.get((target, level))
            cells.append(_fmt(gateway_cpu_ms(run), 3) if run is not None else "-")
        rows.append([target, *cells])
    lines += _table(["target", *level_heads], rows)

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
                str(a["concurrency"]),
                _fmt(a["total_ms"]["p50"]),
                _fmt(a["total_ms"]["p90"]),
                _fmt(a["total_ms"]["p99"]),
                _fmt(a["ttft_ms"]["p50"]),
                _fmt(a["ttft_ms"]["p99"]),
            ]
        )
    lines += _table(
        ["target", "minus", "c", "total p50", "total p90", "total p99", "TTFT p50", "TTFT p99"],
        rows,
    )

    lines += ["", "## Every target and level", ""]
    rows = []
    for level in levels:
        for target in results["settings"].get("targets", []):
            run = runs.get((target, level))
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
        "Latencies in ms from sending the request: TTFB = first streamed event, TTFT = first "
        "event with answer text (a non-empty `content`), total = end of the stream. "
        "CPU ms/request: CPU seconds each server used during the level (warm-up included) ÷ "
        "requests it handled. RSS: resident memory after the level.",
    ]

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
    for r in results.get("ratios", []):
        values = ", ".join(f"c={lv}: {_fmt(r['by_level'].get(str(lv)))}" for lv in levels)
        lines.append(f"  {r['ratio']:<44} {r['metric']:<24} {values}")
    return "\n".join(["ratios (gateway ÷ reference):", *lines]) if lines else "no ratios"
