"""
What tracing costs a client request on the Edge, in process (no sockets, no other process): one
``POST /v1/chat/completions`` through the client app (authenticate, decode, the key's
reservation, placement, a tunnel to a scripted node, the answer relayed, the record published),
timed with tracing off (no ``telemetry:``) and on (sampling 1.0, every span handed to a batch
processor whose exporter discards it), alternately in one process.

``python -m bench.edge_tracing [--requests N] [--rounds R] [--off-only]``: prints µs per request.
``--off-only`` times tracing off alone, so it also runs on a tree from before the Edge made
spans (copy this file into that tree's ``bench/``): the paired before/after of the off path.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from iop.test.edge.ingress.harness import CHAT, END, Ingress, body, start, usage


def _tracing() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from iop.telemetry.tracing import Tracing

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))
    return Tracing(provider.get_tracer("bench"))


def _edge(on: bool) -> Ingress:
    if on:
        return Ingress(tracing=_tracing())  # type: ignore[call-arg,unused-ignore]
    return Ingress()


def _time(edge: Ingress, requests: int) -> float:
    """µs per request for ``requests`` whole requests on ``edge``."""
    began = time.perf_counter()
    for _ in range(requests):
        d = edge.post("/v1/chat/completions", CHAT, headers={"traceparent": _PARENT})
        edge.flush()
        sent = edge.tunnel_request()
        edge.frames(sent.run_id, start(), body(b'{"id":"x"}'), usage(5, 3), END)
        edge.sent.clear()
        d.addCallback(lambda response: response.content())
        edge.flush()
    return (time.perf_counter() - began) / requests * 1e6


_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--off-only", action="store_true")
    args = parser.parse_args()
    modes = ("off",) if args.off_only else ("off", "on")
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            edge = _edge(mode == "on")
            _time(edge, 100)  # warm-up
            results[mode].append(_time(edge, args.requests))
    for mode, rounds in results.items():
        text = ", ".join(f"{r:.1f}" for r in rounds)
        print(f"tracing {mode}: {statistics.median(rounds):.1f} µs per request ({text})")


if __name__ == "__main__":
    main()
