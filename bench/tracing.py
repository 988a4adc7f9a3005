"""
What tracing costs a run on the node, in process (no sockets, no other process): one
``RunManager`` run — admission, the adapter's events, the terminal, the store — timed with
tracing off (no ``telemetry:``), and on (sampling 1.0, every span handed to a batch processor
whose exporter discards it, as a receiver that keeps up would). Machine noise matters less
here than in the end-to-end bench: the two are timed alternately in one process.

``python -m bench.tracing [--runs N] [--rounds R] [--off-only]``: prints µs per run for each.
``--off-only`` times tracing off alone and runs on a tree from before tracing existed too (the
paired before/after of the off path: copy this file into that tree's ``bench/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from zope.interface import implementer

from iop.node.adapters.registry import AdapterRegistry
from iop.node.runs import RunManager
from iop.node.store import RunStore, SynchronousExecutor
from iop.runtime import AdapterContext, Capabilities, ExecutionSpec, IProvider, RuntimeEvent, Usage
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_specs

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class _Discard(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@implementer(IProvider)
class _Instant:
    """Answers every run at once: start, 32 deltas, complete with usage."""

    name = "up"
    type = "vllm"

    def capabilities(self) -> Capabilities:
        return Capabilities(max_concurrency=1)

    def execute(self, spec: ExecutionSpec, emit: Callable[[RuntimeEvent], None]) -> Deferred[None]:
        emit(RuntimeEvent.start())
        for i in range(32):
            emit(RuntimeEvent.text(f"tok{i} "))
        emit(RuntimeEvent.complete(Usage(10, 32), {"finish_reason": "stop"}))
        d: Deferred[None] = Deferred()
        d.callback(None)
        return d


def _manager(tracing: Any = None) -> tuple[RunManager, Clock]:
    clock = Clock()
    provider = _Instant()
    config = pb.NodeConfigPayload(
        node_id="n", adapters=[pb.AdapterConfig(name="up", type="vllm", enabled=True)]
    )
    registry = AdapterRegistry.from_specs(
        adapter_specs(config),
        AdapterContext(reactor=clock, http=None),
        {"vllm": lambda spec, ctx: provider},
    )
    store = RunStore(":memory:", clock, SynchronousExecutor())
    store.open()
    if tracing is None:  # (a tree from before tracing existed has no such parameter)
        return RunManager(registry, lambda _: None, store, clock, "n"), clock
    return RunManager(registry, lambda _: None, store, clock, "n", tracing=tracing), clock


def _time(manager: RunManager, clock: Clock, runs: int, offset: int) -> float:
    start = time.perf_counter()
    for i in range(runs):
        manager.submit(
            pb.RunRequest(
                run_id=f"r{offset + i}",
                adapter="up",
                target="m",
                input="hi",
                metadata={"traceparent": TRACEPARENT},
            )
        )
        clock.advance(0)
    return (time.perf_counter() - start) / runs * 1e6


def _summary(values: list[float]) -> str:
    rounds = ", ".join(f"{v:.1f}" for v in values)
    return f"{statistics.median(values):.1f} µs per run (rounds: {rounds})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--off-only", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    off_manager, off_clock = _manager()
    _time(off_manager, off_clock, 200, 10_000_000)
    off: list[float] = []
    if args.off_only:
        for r in range(args.rounds):
            off.append(_time(off_manager, off_clock, args.runs, r * args.runs))
        print(f"tracing off: {_summary(off)}")
        return 0
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from iop.telemetry.tracing import Tracing

    provider = TracerProvider(shutdown_on_exit=False)
    processor = BatchSpanProcessor(_Discard(), max_queue_size=1_000_000)
    provider.add_span_processor(processor)
    on_manager, on_clock = _manager(Tracing(provider.get_tracer("bench")))
    _time(on_manager, on_clock, 200, 10_000_000)
    traced: list[float] = []
    for r in range(args.rounds):
        off.append(_time(off_manager, off_clock, args.runs, r * args.runs))
        traced.append(_time(on_manager, on_clock, args.runs, r * args.runs))
    processor.shutdown()
    print(f"runs per round: {args.runs}, rounds: {args.rounds}")
    print(f"tracing off: {_summary(off)}")
    print(f"tracing on:  {_summary(traced)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
