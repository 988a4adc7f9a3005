"""
``python -m bench`` / ``python bench/run.py``: IOP vs the upstream called directly vs the LiteLLM
proxy, in one run, on one machine, against the same fake upstreams.

Throughput scenario (upstream without delay: each answer written at once). Targets, all
answering ``POST /v1/chat/completions`` (or Ollama's ``POST /api/chat`` for ``direct-ollama``):

- ``direct``: the load generator calls the fake OpenAI upstream itself (the physical limit);
- ``direct-ollama``: the same for the fake Ollama upstream (the baseline of ``iop-run``);
- ``iop-tunnel``: the Edge's OpenAI-compatible listener, pooled model over an ``openai_compat``
  provider: the raw provider tunnel (Edge ⇄ Node ``ProviderTunnel*`` frames, bytes untouched);
- ``iop-managed``: ``iop-tunnel`` on a second Edge + Node in managed mode: mTLS workload
  identity, and per request a credential lease signed and sealed on the Edge and verified and
  opened on the Node (the provider key injected in memory) — the cost of managed mode;
- ``iop-run``: the same listener, pooled model over an ``ollama`` provider: the normalized path
  (``RunRequest`` to the Node, Ollama NDJSON → ``RunEvent`` deltas → OpenAI SSE chunks on the
  Edge). This is the path every non-OpenAI provider takes;
- ``litellm-1w``, ``litellm-2w``: the LiteLLM proxy (own virtualenv) with one, resp. two
  workers, each on its own port, in front of the fake OpenAI upstream.

Cells: every target runs in each answer mode (``--modes``: ``stream`` = ``"stream": true``, an
SSE or NDJSON stream; ``non-stream`` = ``"stream": false``, one JSON answer) and answer size
(``--tokens``, default 32 and 64 tokens, one token per chunk: a fake upstream of each size),
at each concurrency level. Per mode, size and level the targets run one after the other (so
drift hits all alike), in ``--rounds`` passes, each with a short warm-up, then its share of a
fixed number of timed requests (fewer for LiteLLM, ``--litellm-requests``: it is ~20x slower),
from a separate load-generator process (:mod:`bench.loadgen`). Before and after each,
``/proc`` gives every server's RSS and CPU seconds. Every result row carries its ``mode`` and
``tokens``.

Scale scenario (fresh Edge + Node, slow upstream): the Edge's RSS with N idle fake nodes
connected (:mod:`bench.fakenodes`, the real TLS + protobuf wire) and with M concurrent slow
streams in flight, per connection and per stream (LiteLLM's RSS under the same streams beside
it when it is available).

Results: ``<out>/<date>-<alias>.json`` and ``.md`` (``smoke-…`` in smoke mode): the figures
that carry across machines (Edge + Node CPU per request and per streamed chunk, the latency IOP
adds over direct) beside the performance goals (:data:`bench.report.GOALS`) with a pass/miss
mark, then the ratios IOP/direct,
IOP/LiteLLM (1 worker) and IOP/best LiteLLM, per cell (:mod:`bench.report`).

Multi-Edge scenario (``--multi-edge``; :mod:`bench.multiedge`): one host, several cores.
Throughput at c = 50 (``--multi-edge-levels``), both modes, 32 tokens, of ``iop-1edge`` (one
Edge) vs ``iop-2edge`` (two Edge processes sharing the client port with ``openai.reuse_port``),
both groups with ``cluster:`` on one private Redis and running side by side, their rounds
interleaved like the throughput targets'; one node dials every Edge of its group (one node per
Edge where node.yaml has no ``edges:`` yet: the results say which). The report's own table
gives each group's throughput, the 2-Edge/1-Edge ratio, CPU per request and how the requests
split over the Edges. ``--no-throughput`` skips the throughput scenario (e.g. to run this one
alone).

Per-key limits (:mod:`bench.quota`, every run unless ``--no-quota``): the client pipeline's admit
stage per request — µs of CPU per admit + settle in process, for a key with every kind of limit
and a team, and for a key without limits; and on a private Redis, the latency of an admission,
requests per second at c = 1, 10, 50, the Edge's and Redis's CPU per request and the Redis calls
per request (asserted: one reserve, one settle). Without ``redis-server`` the Redis half is
skipped and the results say so.

Smoke (``--smoke``, what CI runs): no LiteLLM, both modes, one answer size (32), levels 1 and 4,
20 requests each, a tiny scale scenario, the per-key limits measurement with a few hundred
requests (and, with ``--multi-edge``, the multi-Edge scenario at c = 4).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # ``python bench/run.py``: make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import lease, multiedge, quota, report
from bench.loadgen import JSON, NDJSON, SSE, combine
from bench.procs import BenchError, Children, ProcSample, sample, wait_until
from bench.systems import (
    IOP,
    OLLAMA_MODEL,
    OPENAI_MODEL,
    LiteLLM,
    Upstream,
    litellm_available,
    litellm_model,
    run_model,
    start_iop,
    start_litellm,
    start_upstream,
    stop_quietly,
    tunnel_model,
)

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_VENV = BENCH_DIR / ".venv-litellm"
# The LiteLLM targets and their worker counts.
LITELLM_TARGETS = {"litellm-1w": 1, "litellm-2w": 2}
ALL_TARGETS = ("direct", "direct-ollama", "iop-tunnel", "iop-managed", "iop-run", *LITELLM_TARGETS)
STREAM = "stream"
NON_STREAM = "non-stream"
MODES = (STREAM, NON_STREAM)
HOST_ALIAS = f"python-{os.cpu_count() or 0}core"
PROMPT = "Write a short story about a gateway that measured itself."


@dataclass
class Settings:
    smoke: bool
    levels: list[int]
    requests: int
    litellm_requests: int
    rounds: int
    warmup: int
    targets: list[str]
    modes: list[str]
    tokens: list[int]
    chunk_tokens: int
    out: Path
    alias: str
    litellm_venv: Path
    idle_nodes: int
    stream_levels: list[int]
    stream_tokens: int
    stream_delay_ms: int
    skip_scale: bool
    keep: bool
    label: str
    multi_edge: bool = False
    multi_edge_levels: list[int] = field(default_factory=lambda: [50])
    skip_throughput: bool = False
    skip_quota: bool = False
    # Per-key limits' admit stage (bench.quota): in-process requests per pass, Redis per level.
    quota_iterations: int = 5000
    quota_redis_iterations: int = 2000
    # Traces: "off" (no telemetry: section), or "sink" (both daemons export every span,
    # sampling 1.0, to an OTLP/HTTP receiver the bench starts: iop.testing.otlp_sink).
    telemetry: str = "off"

    def as_dict(self) -> dict[str, Any]:
        return {
            "smoke": self.smoke,
            "levels": self.levels,
            "requests_per_level": self.requests,
            "litellm_requests_per_level": self.litellm_requests,
            "rounds_per_level": self.rounds,
            "warmup_per_round": self.warmup,
            "targets": self.targets,
            "modes": self.modes,
            "tokens_per_response": self.tokens,
            "chunk_tokens": self.chunk_tokens,
            "upstream_delay_ms": 0,
            "telemetry": self.telemetry,
            "scale": {
                "idle_nodes": self.idle_nodes,
                "stream_levels": self.stream_levels,
                "stream_tokens": self.stream_tokens,
                "stream_delay_ms_per_token": self.stream_delay_ms,
            },
            **(
                {
                    "multi_edge": {
                        "levels": self.multi_edge_levels,
                        "tokens_per_response": multiedge.MULTI_EDGE_TOKENS,
                        "groups": multiedge.GROUPS,
                    }
                }
                if self.multi_edge
                else {}
            ),
            "throughput_skipped": self.skip_throughput,
            "quota": (
                None
                if self.skip_quota
                else {
                    "in_process_requests_per_pass": self.quota_iterations,
                    "redis_requests_per_level": self.quota_redis_iterations,
                    "redis_levels": [1, *quota.DEFAULT_LEVELS],
                }
            ),
        }


@dataclass
class Target:
    name: str
    mode: str
    # Tokens per upstream answer, and the chunks a streamed answer has.
    tokens: int
    chunks: int
    port: int
    path: str
    body: dict[str, Any]
    fmt: str
    # The servers this target's requests go through (besides the load generator).
    servers: list[str]
    # The direct target with the same upstream (its latency is subtracted for "added latency").
    baseline: str | None


def openai_process(tokens: int) -> str:
    """The process name of the fake OpenAI upstream answering ``tokens`` tokens."""
    return f"fake-openai-{tokens}"


def ollama_process(tokens: int) -> str:
    """The process name of the fake Ollama upstream answering ``tokens`` tokens."""
    return f"fake-ollama-{tokens}"


@dataclass
class World:
    """Everything running for one scenario."""

    children: Children = field(default_factory=Children)
    pids: dict[str, int] = field(default_factory=dict)
    # The fake upstreams by tokens per answer.
    openai: dict[int, Upstream] = field(default_factory=dict)
    ollama: dict[int, Upstream] = field(default_factory=dict)
    iop: IOP | None = None
    # The same Edge + Node in managed mode (a credential lease per tunnel request).
    managed: IOP | None = None
    # By target name (``litellm-1w``, ``litellm-2w``).
    litellm: dict[str, LiteLLM] = field(default_factory=dict)

    def samples(self) -> dict[str, ProcSample]:
        return {name: sample(pid) for name, pid in self.pids.items()}

    def check(self) -> None:
        for child in self.children.items:
            child.check()


def chat_body(model: str, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
    }


def build_targets(
    world: World, names: list[str], mode: str, tokens: int, chunk_tokens: int = 1
) -> list[Target]:
    """The targets among ``names`` that ``world`` runs, for one mode and answer size."""
    stream = mode == STREAM
    chunks = -(-tokens // chunk_tokens)
    openai = world.openai.get(tokens)
    ollama = world.ollama.get(tokens)
    targets: list[Target] = []

    def add(
        name: str,
        port: int,
        path: str,
        model: str,
        fmt: str,
        servers: list[str],
        baseline: str | None,
        answer_chunks: int = chunks,
    ) -> None:
        targets.append(
            Target(
                name,
                mode,
                tokens,
                answer_chunks,
                port,
                path,
                chat_body(model, stream),
                fmt if stream else JSON,
                servers,
                baseline,
            )
        )

    fake_openai, fake_ollama = openai_process(tokens), ollama_process(tokens)
    for name in names:
        if name == "direct" and openai is not None:
            add(name, openai.port, "/v1/chat/completions", OPENAI_MODEL, SSE, [fake_openai], None)
        elif name == "direct-ollama" and ollama is not None:
            # The fake Ollama streams one token per line, whatever ``chunk_tokens`` says.
            add(name, ollama.port, "/api/chat", OLLAMA_MODEL, NDJSON, [fake_ollama], None, tokens)
        elif name == "iop-tunnel" and world.iop is not None and openai is not None:
            add(
                name,
                world.iop.client_port,
                "/v1/chat/completions",
                tunnel_model(tokens),
                SSE,
                ["iop-edge", "iop-node", fake_openai],
                "direct",
            )
        elif name == "iop-managed" and world.managed is not None and openai is not None:
            add(
                name,
                world.managed.client_port,
                "/v1/chat/completions",
                tunnel_model(tokens),
                SSE,
                ["iop-managed-edge", "iop-managed-node", fake_openai],
                "direct",
            )
        elif name == "iop-run" and world.iop is not None and ollama is not None:
            add(
                name,
                world.iop.client_port,
                "/v1/chat/completions",
                run_model(tokens),
                SSE,
                ["iop-edge", "iop-node", fake_ollama],
                "direct-ollama",
                tokens,
            )
        elif name in world.litellm and openai is not None:
            add(
                name,
                world.litellm[name].port,
                "/v1/chat/completions",
                litellm_model(tokens),
                SSE,
                [name, fake_openai],
                "direct",
            )
    return targets


def run_loadgen(
    target: Target,
    concurrency: int,
    requests: int,
    warmup: int,
    timeout: float = 120,
    raw: bool = False,
) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.loadgen",
        "--port",
        str(target.port),
        "--path",
        target.path,
        "--body",
        json.dumps(target.body),
        "--format",
        target.fmt,
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--warmup",
        str(warmup),
        "--timeout",
        str(timeout),
        *(["--raw"] if raw else []),
    ]
    done = subprocess.run(
        argv, cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"load generator failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- throughput scenario -------------------------------------------------------------------------


def start_throughput_world(settings: Settings, scratch: Path, world: World) -> None:
    """Start what the throughput targets need into ``world`` (stopped by the caller)."""
    wants_run = "iop-run" in settings.targets or "direct-ollama" in settings.targets
    for tokens in settings.tokens:
        upstream_args = ["--tokens", str(tokens), "--delay-ms", "0"]
        name = openai_process(tokens)
        world.openai[tokens] = start_upstream(
            world.children,
            scratch,
            "fake_openai",
            [*upstream_args, "--chunk-tokens", str(settings.chunk_tokens)],
            name,
        )
        world.pids[name] = world.openai[tokens].child.pid
        if wants_run:
            name = ollama_process(tokens)
            world.ollama[tokens] = start_upstream(
                world.children, scratch, "fake_ollama", upstream_args, name
            )
            world.pids[name] = world.ollama[tokens].child.pid
    openai_ports = {tokens: up.port for tokens, up in world.openai.items()}
    ollama_ports = {tokens: up.port for tokens, up in world.ollama.items()}
    capacity = max(settings.levels) + 16
    telemetry = None
    if settings.telemetry == "sink":
        sink = start_upstream(world.children, scratch, "otlp_sink", [], "otlp-sink")
        world.pids["otlp-sink"] = sink.child.pid
        telemetry = {"endpoint": f"http://127.0.0.1:{sink.port}", "sampling_ratio": 1.0}
    if "iop-tunnel" in settings.targets or "iop-run" in settings.targets:
        world.iop = start_iop(
            world.children,
            scratch / "iop",
            openai_ports=openai_ports,
            ollama_ports=ollama_ports,
            capacity=capacity,
            telemetry=telemetry,
        )
        world.pids["iop-edge"] = world.iop.edge.pid
        world.pids["iop-node"] = world.iop.node.pid
    if "iop-managed" in settings.targets:
        world.managed = start_iop(
            world.children,
            scratch / "iop-managed",
            openai_ports=openai_ports,
            ollama_ports={},
            capacity=capacity,
            managed=True,
        )
        world.pids["iop-managed-edge"] = world.managed.edge.pid
        world.pids["iop-managed-node"] = world.managed.node.pid
    # The proxies start side by side (each takes a while to import), then are waited for.
    for name, workers in LITELLM_TARGETS.items():
        if name in settings.targets:
            world.litellm[name] = start_litellm(
                world.children,
                scratch / name,
                settings.litellm_venv,
                openai_ports,
                workers,
                name,
                wait=False,
            )
            world.pids[name] = world.litellm[name].child.pid
    for proxy in world.litellm.values():
        proxy.wait_ready()


def _children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for children (the load generator)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def shares(total: int, rounds: int) -> list[int]:
    """``total`` requests split over ``rounds`` as evenly as possible."""
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


def throughput(settings: Settings, world: World) -> list[dict[str, Any]]:
    """
    Per cell set (mode and answer size) and level, ``rounds`` passes over the targets (each pass:
    warm-up, then its share of the timed requests), so that a burst of outside noise lands on
    every target alike; the rounds' samples are pooled per target. The LiteLLM targets get
    ``litellm_requests`` timed requests, the others ``requests``.
    """
    runs: list[dict[str, Any]] = []
    for mode in settings.modes:
        for tokens in settings.tokens:
            targets = build_targets(world, settings.targets, mode, tokens, settings.chunk_tokens)
            for level in settings.levels:
                runs += _level(settings, world, targets, level)
    return runs


def _level(
    settings: Settings, world: World, targets: list[Target], level: int
) -> list[dict[str, Any]]:
    parts: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    cpu: dict[str, dict[str, float]] = {t.name: {} for t in targets}
    # The load generator's own CPU (a child of this process), per target.
    loadgen_cpu: dict[str, float] = dict.fromkeys((t.name for t in targets), 0.0)
    first: dict[str, dict[str, ProcSample]] = {}
    last: dict[str, dict[str, ProcSample]] = {}
    plan = {
        t.name: shares(
            settings.litellm_requests if t.name in LITELLM_TARGETS else settings.requests,
            settings.rounds,
        )
        for t in targets
    }
    for index in range(settings.rounds):
        for target in targets:
            share = plan[target.name][index]
            if share == 0:
                continue
            world.check()
            before = world.samples()
            children_before = _children_cpu()
            part = run_loadgen(target, level, share, settings.warmup, raw=True)
            loadgen_cpu[target.name] += _children_cpu() - children_before
            after = world.samples()
            first.setdefault(target.name, before)
            last[target.name] = after
            parts[target.name].append(part)
            for name in target.servers:
                spent = after[name].cpu_seconds - before[name].cpu_seconds
                cpu[target.name][name] = cpu[target.name].get(name, 0.0) + spent
    runs: list[dict[str, Any]] = []
    for target in targets:
        if not parts[target.name]:
            continue
        result = combine(parts[target.name])
        handled = result["requests"] + result["warmup"]["requests"]
        result |= {
            "target": target.name,
            "mode": target.mode,
            "tokens": target.tokens,
            "chunks": target.chunks,
            "baseline": target.baseline,
            # Seconds the load generator drove the target (warm-up included, like the CPU).
            "wall_s": round(result["elapsed_s"] + result["warmup"]["elapsed_s"], 3),
        }
        result["processes"] = {
            name: {
                "before": first[target.name][name].as_dict(),
                "after": last[target.name][name].as_dict(),
                "cpu_seconds": round(cpu[target.name][name], 3),
                "cpu_ms_per_request": round(cpu[target.name][name] * 1000 / max(handled, 1), 4),
            }
            for name in target.servers
        }
        result["loadgen"] = {
            "cpu_seconds": round(loadgen_cpu[target.name], 3),
            "cpu_ms_per_request": round(loadgen_cpu[target.name] * 1000 / max(handled, 1), 4),
        }
        runs.append(result)
        log(
            f"{target.mode:<10} {target.tokens:>3} tok c={level:<4} {target.name:<13} "
            f"{result['rps']:>9.1f} req/s "
            f"(rounds {', '.join(f'{r:.0f}' for r in result['rps_by_round'])})  "
            f"TTFT p50 {result['ttft_ms']['p50']:>8.2f} ms  "
            f"p50 {result['total_ms']['p50']:>8.2f} ms  "
            f"p99 {result['total_ms']['p99']:>8.2f} ms  errors {result['errors']}"
        )
    return runs


# -- scale scenario ------------------------------------------------------------------------------


class PeakSampler:
    """Polls the RSS of some processes in a thread and keeps the peak of each."""

    def __init__(self, pids: dict[str, int], interval: float = 0.1) -> None:
        self._pids = pids
        self._interval = interval
        self.peak: dict[str, int] = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name, pid in self._pids.items():
                self.peak[name] = max(self.peak[name], sample(pid).rss_bytes)
            self._stop.wait(self._interval)


def mib(n: float) -> float:
    return round(n / 2**20, 2)


def kib(n: float) -> float:
    return round(n / 2**10, 1)


def scale(settings: Settings, scratch: Path) -> dict[str, Any]:
    world = World()
    tokens = settings.stream_tokens
    try:
        upstream = start_upstream(
            world.children,
            scratch,
            "fake_openai",
            [
                "--tokens",
                str(settings.stream_tokens),
                "--delay-ms",
                str(settings.stream_delay_ms),
                "--chunk-tokens",
                "1",
            ],
            "fake-openai-slow",
        )
        world.openai[tokens] = upstream
        world.pids[openai_process(tokens)] = upstream.child.pid
        world.iop = start_iop(
            world.children,
            scratch / "iop-scale",
            openai_ports={tokens: upstream.port},
            ollama_ports={},
            capacity=max(settings.stream_levels) + 16,
            fake_nodes=settings.idle_nodes,
        )
        edge_pid = world.iop.edge.pid
        world.pids["iop-edge"] = edge_pid
        world.pids["iop-node"] = world.iop.node.pid
        time.sleep(1)
        out: dict[str, Any] = {}

        # Idle node connections.
        before = sample(edge_pid).rss_bytes
        assert world.iop.fake_tokens_file is not None
        log(f"scale: connecting {settings.idle_nodes} idle fake nodes")
        fakes = world.children.start(
            "fake-nodes",
            [
                sys.executable,
                "-m",
                "bench.fakenodes",
                "--port",
                str(world.iop.node_port),
                "--ca",
                str(world.iop.ca_file),
                "--tokens-file",
                str(world.iop.fake_tokens_file),
            ],
            {**os.environ, "PYTHONUNBUFFERED": "1"},
            scratch / "fake-nodes.log",
            BENCH_DIR.parent,
        )

        def reported() -> bool:
            return '"ready"' in fakes.log.read_text(errors="replace") or not fakes.running()

        wait_until(reported, 300, "the fake nodes to connect")
        fakes.check()
        line = next(
            ln for ln in fakes.log.read_text().splitlines() if ln.startswith("{") and "ready" in ln
        )
        connected: dict[str, Any] = json.loads(line)
        # Let a few heartbeat rounds pass before measuring; the Edge's CPU meanwhile is what
        # keeping the idle nodes costs.
        cpu_before, idle_seconds = sample(edge_pid).cpu_seconds, 6.0
        time.sleep(idle_seconds)
        idle_cpu = sample(edge_pid).cpu_seconds - cpu_before
        iop_connected = world.iop.connected_nodes()
        after = sample(edge_pid).rss_bytes
        ready = int(connected["ready"])
        out["idle_nodes"] = {
            "requested": settings.idle_nodes,
            "ready": ready,
            "failed": connected["failed"],
            "connected_in_status": iop_connected,
            "connect_seconds": connected["seconds"],
            "errors": connected["errors"],
            "edge_rss_before_mib": mib(before),
            "edge_rss_after_mib": mib(after),
            "edge_kib_per_connection": kib((after - before) / ready) if ready else None,
            "edge_cpu_percent_while_idle": round(idle_cpu / idle_seconds * 100, 1),
        }
        log(
            f"scale: {ready} idle nodes ready ({connected['failed']} failed); Edge RSS "
            f"{mib(before)} → {mib(after)} MiB"
        )

        # LiteLLM with one worker beside it, when any LiteLLM target is on.
        wants_litellm = any(name in settings.targets for name in LITELLM_TARGETS)
        if wants_litellm and litellm_available(settings.litellm_venv):
            world.litellm["litellm-1w"] = start_litellm(
                world.children,
                scratch / "litellm-scale",
                settings.litellm_venv,
                {tokens: upstream.port},
                workers=1,
                name="litellm-1w",
            )
            world.pids["litellm-1w"] = world.litellm["litellm-1w"].child.pid
        names = ["direct", "iop-tunnel", *world.litellm]
        streams: list[dict[str, Any]] = []
        for target in build_targets(world, names, STREAM, tokens):
            watched = {n: world.pids[n] for n in target.servers if n in world.pids}
            # A few streams first, so that what a server loads on its first request (imports,
            # pools) is in the baseline rather than charged to the streams.
            run_loadgen(target, 10, 20, 0, timeout=600)
            start_rss = {n: sample(p).rss_bytes for n, p in watched.items()}
            for level in settings.stream_levels:
                world.check()
                base = {n: sample(p).rss_bytes for n, p in watched.items()}
                with PeakSampler(watched) as peaks:
                    result = run_loadgen(target, level, level, 0, timeout=600)
                entry: dict[str, Any] = {
                    "target": target.name,
                    "mode": STREAM,
                    "tokens": tokens,
                    "streams": level,
                    "ok": result["ok"],
                    "errors": result["errors"],
                    "error_kinds": result["error_kinds"],
                    "total_ms": result["total_ms"],
                    "ttfb_ms": result["ttfb_ms"],
                    "ttft_ms": result["ttft_ms"],
                    "rss": {},
                }
                for name in watched:
                    entry["rss"][name] = {
                        "before_mib": mib(base[name]),
                        "peak_mib": mib(peaks.peak[name]),
                        "kib_per_stream": kib((peaks.peak[name] - start_rss[name]) / level),
                    }
                streams.append(entry)
                server = target.servers[0]
                log(
                    f"scale: {target.name} {level} streams: ok {result['ok']} errors "
                    f"{result['errors']}; {server} RSS peak {entry['rss'][server]['peak_mib']} MiB"
                    f" ({entry['rss'][server]['kib_per_stream']} KiB/stream)"
                )
        out["streams"] = streams
        return out
    finally:
        stop_quietly(world.children)


# -- multi-Edge scenario -------------------------------------------------------------------------


def multi_edge(settings: Settings, scratch: Path) -> dict[str, Any]:
    """
    ``iop-1edge`` vs ``iop-2edge`` (module docstring), started side by side in front of one fake
    upstream and one Redis, measured with :func:`_level` (rounds interleaved). Returns the runs
    (the throughput rows' shape) and, per group, its Edges, how its nodes dial them and how many
    requests each Edge answered.
    """
    world = World()
    tokens = multiedge.MULTI_EDGE_TOKENS
    root = scratch / "multi-edge"
    try:
        name = openai_process(tokens)
        upstream = start_upstream(
            world.children,
            scratch,
            "fake_openai",
            ["--tokens", str(tokens), "--delay-ms", "0", "--chunk-tokens", "1"],
            f"{name}-multi",
        )
        world.openai[tokens] = upstream
        world.pids[name] = upstream.child.pid
        redis = multiedge.start_redis(world.children, root / "redis")
        world.pids["redis"] = redis.child.pid
        groups: list[multiedge.EdgeGroup] = []
        for group_name, count in multiedge.GROUPS.items():
            log(f"multi-edge: starting {group_name} ({count} Edge{'s' if count > 1 else ''})")
            group = multiedge.start_group(
                world.children,
                root / group_name,
                group_name,
                count,
                redis=redis,
                openai_ports={tokens: upstream.port},
                capacity=max(settings.multi_edge_levels) + 16,
            )
            world.pids.update(group.processes)
            groups.append(group)
        runs: list[dict[str, Any]] = []
        for mode in settings.modes:
            targets = [
                Target(
                    group.name,
                    mode,
                    tokens,
                    tokens,
                    group.client_port,
                    "/v1/chat/completions",
                    chat_body(tunnel_model(tokens), mode == STREAM),
                    SSE if mode == STREAM else JSON,
                    [*group.processes, name, "redis"],
                    None,
                )
                for group in groups
            ]
            for level in settings.multi_edge_levels:
                runs += _level(settings, world, targets, level)
        return {
            "tokens": tokens,
            "levels": settings.multi_edge_levels,
            "groups": {
                group.name: {
                    "edges": [edge.name for edge in group.edges],
                    "nodes": [node.name for node in group.nodes],
                    "nodes_dial_every_edge": group.nodes_shared,
                    "requests_by_edge": multiedge.requests_by_edge(group),
                }
                for group in groups
            },
            "throughput": runs,
        }
    finally:
        stop_quietly(world.children)


# -- main ----------------------------------------------------------------------------------------


def environment(settings: Settings, world: World) -> dict[str, Any]:
    import twisted

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=BENCH_DIR.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    # Read-only (no optional index refresh): whether the measured code differs from the commit.
    modified = subprocess.run(
        ["git", "--no-optional-locks", "diff", "--quiet", "HEAD", "--", "iop", "twisted"],
        cwd=BENCH_DIR.parent,
        capture_output=True,
        check=False,
    ).returncode
    env: dict[str, Any] = {
        "host_alias": settings.alias,
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "twisted": twisted.__version__,
        "commit": commit or None,
        "iop_code_modified_since_commit": modified == 1 if modified in (0, 1) else None,
    }
    if world.litellm:
        env["litellm"] = {
            "version": next(iter(world.litellm.values())).version,
            "num_workers": {name: proxy.workers for name, proxy in world.litellm.items()},
        }
    return env


def parse_levels(text: str) -> list[int]:
    """Positive integers, comma-separated (levels, stream counts, tokens per answer)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("expected positive integers, comma-separated")
    return list(dict.fromkeys(levels))


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)} (comma-separated)")
    return list(dict.fromkeys(modes))


def parse_targets(text: str) -> list[str]:
    """Comma-separated target names; ``litellm`` stands for every LiteLLM target."""
    targets: list[str] = []
    for name in (t.strip() for t in text.split(",")):
        if name:
            targets += list(LITELLM_TARGETS) if name == "litellm" else [name]
    return list(dict.fromkeys(targets))


def parse_args(argv: Sequence[str]) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="IOP vs direct vs LiteLLM proxy, side by side, with recorded results.",
    )
    parser.add_argument("--smoke", action="store_true", help="seconds; no LiteLLM; tiny scale")
    parser.add_argument("--levels", type=parse_levels, help="concurrency levels (1,10,50,200)")
    parser.add_argument(
        "--modes",
        type=parse_modes,
        help=f"answer modes, comma-separated, from {','.join(MODES)} (default: both)",
    )
    parser.add_argument("--requests", type=int, help="timed requests per target and level")
    parser.add_argument(
        "--litellm-requests",
        type=int,
        help="timed requests per LiteLLM target and level (default: --requests, at most 500)",
    )
    parser.add_argument(
        "--rounds", type=int, help="passes over the targets per level (requests split evenly)"
    )
    parser.add_argument(
        "--warmup", type=int, help="warm-up requests per target and round (at least c)"
    )
    parser.add_argument(
        "--targets",
        help=f"comma-separated, from {','.join(ALL_TARGETS)}; litellm = both LiteLLM targets "
        "(default: all)",
    )
    parser.add_argument(
        "--tokens",
        type=parse_levels,
        help="tokens per upstream answer, comma-separated: one cell set each (default 32,64; "
        "smoke 32)",
    )
    parser.add_argument("--chunk-tokens", type=int, default=1, help="tokens per SSE chunk")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--alias", default=HOST_ALIAS, help="machine alias in the file name")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--idle-nodes", type=int, help="scale: idle fake nodes")
    parser.add_argument("--streams", type=parse_levels, help="scale: concurrent slow streams")
    parser.add_argument("--stream-tokens", type=int, help="scale: tokens per slow stream")
    parser.add_argument("--stream-delay-ms", type=int, help="scale: upstream delay per token")
    parser.add_argument("--no-scale", action="store_true", help="skip the scale scenario")
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput scenario")
    parser.add_argument(
        "--no-quota",
        action="store_true",
        help="skip the per-key limits measurement (the admit stage's cost per request)",
    )
    parser.add_argument(
        "--multi-edge",
        action="store_true",
        help="also run the multi-Edge scenario: 1 Edge vs 2 Edges sharing the client port",
    )
    parser.add_argument(
        "--multi-edge-levels",
        type=parse_levels,
        help="multi-Edge: concurrency levels (default 50; smoke 4)",
    )
    parser.add_argument(
        "--telemetry",
        choices=("off", "sink"),
        default="off",
        help="traces: off (no telemetry: section) or sink (every span exported, sampling 1.0, "
        "to an OTLP/HTTP receiver the bench starts)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--label", default="", help="a suffix for the result file names")
    args = parser.parse_args(list(argv))
    smoke = bool(args.smoke)
    targets = parse_targets(args.targets or ",".join(ALL_TARGETS))
    unknown = sorted(set(targets) - set(ALL_TARGETS))
    if unknown:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    if smoke and args.targets is None:
        targets = [t for t in targets if t not in LITELLM_TARGETS]
    if args.chunk_tokens < 1:
        parser.error("--chunk-tokens must be >= 1")
    requests = args.requests or (20 if smoke else 2000)
    return Settings(
        smoke=smoke,
        levels=args.levels or ([1, 4] if smoke else [1, 10, 50, 200]),
        requests=requests,
        litellm_requests=args.litellm_requests or min(requests, 500),
        rounds=max(1, args.rounds or (1 if smoke else 3)),
        warmup=args.warmup if args.warmup is not None else (5 if smoke else 50),
        targets=targets,
        modes=args.modes or list(MODES),
        tokens=args.tokens or ([32] if smoke else [32, 64]),
        chunk_tokens=args.chunk_tokens,
        out=args.out,
        alias=args.alias,
        litellm_venv=args.litellm_venv,
        idle_nodes=args.idle_nodes if args.idle_nodes is not None else (20 if smoke else 1000),
        stream_levels=args.streams or ([50] if smoke else [250, 500, 1000]),
        stream_tokens=args.stream_tokens or (10 if smoke else 40),
        stream_delay_ms=args.stream_delay_ms or (20 if smoke else 100),
        skip_scale=bool(args.no_scale),
        keep=bool(args.keep),
        label=args.label,
        multi_edge=bool(args.multi_edge),
        multi_edge_levels=args.multi_edge_levels or ([4] if smoke else [50]),
        skip_throughput=bool(args.no_throughput),
        skip_quota=bool(args.no_quota),
        quota_iterations=200 if smoke else 5000,
        quota_redis_iterations=100 if smoke else 2000,
        telemetry=args.telemetry,
    )


def _terminated(signum: int, frame: object) -> None:
    # Unwind through the ``finally`` blocks, which stop every child.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    notes: list[str] = []
    wanted = [t for t in settings.targets if t in LITELLM_TARGETS]
    if wanted and not litellm_available(settings.litellm_venv):
        settings.targets[:] = [t for t in settings.targets if t not in LITELLM_TARGETS]
        notes.append(
            f"LiteLLM skipped: no proxy virtualenv at {settings.litellm_venv.name}/ "
            "(`make bench` creates it)"
        )
        log(notes[-1])
    elif settings.smoke and not wanted:
        notes.append("LiteLLM skipped in smoke mode")
        log(notes[-1])
    scratch = Path(tempfile.mkdtemp(prefix="iop-bench-"))
    started = time.monotonic()
    results: dict[str, Any] = {
        "kind": "iop-benchmark",
        "date": datetime.date.today().isoformat(),
        "label": settings.label,
        "settings": settings.as_dict(),
        "notes": notes,
    }
    failures: list[str] = []
    world = World()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if not settings.skip_throughput:
            log(f"throughput: starting {', '.join(settings.targets)}")
            start_throughput_world(settings, scratch, world)
            results["environment"] = environment(settings, world)
            runs = throughput(settings, world)
            results["throughput"] = runs
            stop_quietly(world.children)
        if settings.multi_edge:
            results["multi_edge"] = multi_edge(settings, scratch)
        if "iop-managed" in settings.targets and not settings.skip_throughput:
            log("managed mode: CPU per credential lease (issue on the Edge, open on the Node)")
            results["lease_cost"] = lease.measure(200 if settings.smoke else 2000)
        if not settings.skip_quota:
            log("per-key limits: the admit stage's cost per request, in process and on Redis")
            results["quota_cost"] = quota.measure(
                settings.quota_iterations, settings.quota_redis_iterations
            )
            skipped = results["quota_cost"].get("redis_skipped")
            if skipped:
                notes.append(f"per-key limits on Redis skipped: {skipped}")
                log(notes[-1])
        if not settings.skip_scale:
            results["scale"] = scale(settings, scratch)
    except BenchError as e:
        failures.append(str(e))
        log(f"FAILED: {e}")
    finally:
        stop_quietly(world.children)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results.setdefault("environment", environment(settings, world))
    failures += report.failures(
        results, settings.targets, settings.levels, settings.modes, settings.tokens
    )
    results["failures"] = failures
    report.derive(results)
    json_path, md_path = report.write(
        results, settings.out, settings.alias, settings.smoke, settings.label
    )
    log(f"wrote {json_path} and {md_path.name}")
    print(report.ratio_summary(results), flush=True)
    if settings.keep:
        log(f"scratch directory kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    if failures:
        for failure in failures:
            log(f"FAILURE: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
