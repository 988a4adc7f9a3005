"""
The load generator: its own process, so that its CPU use is never the gateway's.

``python -m bench.loadgen --port P --path /v1/chat/completions --body JSON --concurrency C
--requests N [--warmup W] [--format sse|ndjson|json]`` sends ``max(W, C)`` untimed warm-up
requests (so every connection is open before timing starts; none when ``W`` is 0), then ``N``
timed requests with ``C`` in flight at all times, each worker on its own keep-alive HTTP/1.1
connection (asyncio streams, no client library), and prints one JSON object with the results.

Streamed answers (``sse``, ``ndjson``): per request it times the first streamed event
(``ttfb``: the first SSE ``data:`` line, or the first NDJSON line), the first event carrying
answer text (``ttft``: a non-empty ``content``) and the end of the response body (``total``).
A request counts as an error when the connection fails, the status is not 200, the stream ends
without its terminator (``data: [DONE]`` for SSE, a ``"done": true`` line for NDJSON) or it
exceeds ``--timeout``.

Whole answers (``json``, a ``"stream": false`` request): ``ttfb`` is the first byte of the body,
``ttft`` = ``total`` the end of it (the answer text arrives all at once). A request is ok when
the status is 200 and the body is one JSON object that is an answer: an OpenAI
``chat.completion`` (a non-empty ``choices`` list) or an Ollama ``/api/chat`` object
(``"done": true`` and a ``message`` object).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SSE = "sse"
NDJSON = "ndjson"
JSON = "json"
FORMATS = (SSE, NDJSON, JSON)


class ProtocolError(Exception):
    """The server's response is not what a streaming request expects."""


@dataclass
class Outcome:
    ok: bool
    ttfb: float = math.nan
    ttft: float = math.nan
    total: float = math.nan
    body_bytes: int = 0
    error: str = ""


@dataclass
class Results:
    outcomes: list[Outcome] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


class Connection:
    """One keep-alive HTTP/1.1 connection; reopened when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, limit=1 << 20
            )
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def build_request(host: str, port: int, path: str, body: bytes, auth: str, fmt: str = SSE) -> bytes:
    accept = {SSE: "text/event-stream", NDJSON: "application/x-ndjson", JSON: "application/json"}
    headers = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Accept: {accept[fmt]}",
        f"Content-Length: {len(body)}",
    ]
    if auth:
        headers.append(f"Authorization: Bearer {auth}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


# A streamed event that carries answer text: a non-empty ``"content"`` string (OpenAI
# ``delta.content``, Ollama ``message.content``). The role-only first chunk has ``"content": ""``.
_CONTENT = re.compile(rb'"content"\s*:\s*"(?!")')


class EventScanner:
    """
    Splits a streamed body into lines and times, from ``start``: the first event (``ttfb``) and
    the first event with answer text (``ttft``); notes the stream terminator. For a whole
    (``json``) answer it keeps the body and times its first byte.
    """

    def __init__(self, fmt: str, start: float) -> None:
        self.fmt = fmt
        self.start = start
        self.buffer = b""
        self.ttfb = math.nan
        self.ttft = math.nan
        self.terminated = False

    def feed(self, data: bytes) -> None:
        if self.fmt == JSON:
            if data and math.isnan(self.ttfb):
                self.ttfb = time.perf_counter() - self.start
            self.buffer += data
            return
        self.buffer += data
        if b"\n" not in self.buffer:
            return
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            if self.fmt == SSE:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.terminated = True
            else:
                payload = line
                if b'"done":true' in payload.replace(b" ", b""):
                    self.terminated = True
            if math.isnan(self.ttfb):
                self.ttfb = time.perf_counter() - self.start
            if math.isnan(self.ttft) and _CONTENT.search(payload):
                self.ttft = time.perf_counter() - self.start

    def end(self) -> None:
        """The body is complete: flush the last line, or judge the whole answer."""
        if self.fmt != JSON:
            self.feed(b"\n")
            return
        self.terminated = is_answer(self.buffer)
        self.buffer = b""


def is_answer(body: bytes) -> bool:
    """Whether ``body`` is a whole chat answer: OpenAI ``chat.completion`` or Ollama's object."""
    try:
        value = json.loads(body)
    except ValueError:
        return False
    if not isinstance(value, dict):
        return False
    choices = value.get("choices")
    if isinstance(choices, list) and choices:
        return True
    return value.get("done") is True and isinstance(value.get("message"), dict)


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ProtocolError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return int(parts[1]), headers


async def read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], scanner: EventScanner
) -> int:
    """Read a whole body, feeding ``scanner``; return its size."""
    size = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await reader.readuntil(b"\r\n")
            length = int(line.split(b";", 1)[0].strip(), 16)
            if length == 0:
                # Trailers (none expected), then the blank line.
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            data = await reader.readexactly(length)
            size += len(data)
            scanner.feed(data)
            await reader.readexactly(2)
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 1 << 16))
            if not data:
                raise ProtocolError("connection closed inside the body")
            remaining -= len(data)
            size += len(data)
            scanner.feed(data)
    else:
        while data := await reader.read(1 << 16):
            size += len(data)
            scanner.feed(data)
        headers["connection"] = "close"
    scanner.end()
    return size


async def one_request(conn: Connection, request: bytes, fmt: str, timeout: float) -> Outcome:
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await conn.open()
            writer.write(request)
            try:
                status, headers = await read_head(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                # A keep-alive connection the server had just closed: one fresh retry.
                conn.close()
                start = time.perf_counter()
                reader, writer = await conn.open()
                writer.write(request)
                status, headers = await read_head(reader)
            scanner = EventScanner(fmt, start)
            size = await read_body(reader, headers, scanner)
            total = time.perf_counter() - start
            if headers.get("connection", "").lower() == "close":
                conn.close()
    except TimeoutError:
        conn.close()
        return Outcome(False, error=f"timeout after {timeout:g} s")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        conn.close()
        return Outcome(False, error=f"{type(e).__name__}: {e}")
    except ProtocolError as e:
        conn.close()
        return Outcome(False, error=str(e))
    if status != 200:
        return Outcome(False, body_bytes=size, error=f"HTTP {status}")
    if not scanner.terminated:
        if fmt == JSON:
            return Outcome(False, body_bytes=size, error="body is not a whole chat answer")
        return Outcome(False, body_bytes=size, error="stream ended without its terminator")
    # A whole answer's text arrives with its end.
    ttft = total if fmt == JSON else scanner.ttft
    return Outcome(True, ttfb=scanner.ttfb, ttft=ttft, total=total, body_bytes=size)


async def drive(
    host: str,
    port: int,
    request: bytes,
    fmt: str,
    concurrency: int,
    count: int,
    timeout: float,
    conns: list[Connection],
) -> Results:
    results = Results()
    remaining = [count]

    async def worker(conn: Connection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            results.outcomes.append(await one_request(conn, request, fmt, timeout))

    while len(conns) < concurrency:
        conns.append(Connection(host, port))
    results.started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns[:concurrency]))
    results.finished = time.perf_counter()
    return results


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean of values in milliseconds."""
    return {f"p{q}": round(percentile(values, q), 3) for q in (50, 90, 99)} | {
        "mean": round(sum(values) / len(values), 3) if values else math.nan
    }


def summarize(results: Results, concurrency: int, raw: bool = False) -> dict[str, Any]:
    ok = [o for o in results.outcomes if o.ok]
    errors = [o for o in results.outcomes if not o.ok]
    elapsed = max(results.finished - results.started, 1e-9)
    messages: dict[str, int] = {}
    for o in errors:
        messages[o.error] = messages.get(o.error, 0) + 1
    ttfb = [o.ttfb * 1000 for o in ok]
    ttft = [o.ttft * 1000 for o in ok if not math.isnan(o.ttft)]
    total = [o.total * 1000 for o in ok]
    body = sum(o.body_bytes for o in ok)
    summary: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": len(results.outcomes),
        "ok": len(ok),
        "errors": len(errors),
        "error_kinds": dict(sorted(messages.items(), key=lambda kv: -kv[1])[:5]),
        "elapsed_s": round(elapsed, 4),
        "rps": round(len(ok) / elapsed, 2),
        "bytes": body,
        "bytes_per_s": round(body / elapsed, 1),
        "body_bytes_mean": round(body / len(ok), 1) if ok else 0,
        "ttfb_ms": _ms(ttfb),
        "ttft_ms": _ms(ttft),
        "total_ms": _ms(total),
    }
    if raw:
        summary["samples"] = {
            "ttfb_ms": [round(v, 3) for v in ttfb],
            "ttft_ms": [round(v, 3) for v in ttft],
            "total_ms": [round(v, 3) for v in total],
        }
    return summary


def combine(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """
    Pool several summaries of the same target and level (made with ``raw``): counts and times
    add up, percentiles come from all samples together; ``rounds`` keeps each part's rate.
    """
    ttfb = [v for p in parts for v in p["samples"]["ttfb_ms"]]
    ttft = [v for p in parts for v in p["samples"]["ttft_ms"]]
    total = [v for p in parts for v in p["samples"]["total_ms"]]
    elapsed = sum(p["elapsed_s"] for p in parts)
    ok = sum(p["ok"] for p in parts)
    body = sum(p["bytes"] for p in parts)
    kinds: dict[str, int] = {}
    for p in parts:
        for kind, n in p["error_kinds"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    return {
        "concurrency": parts[0]["concurrency"],
        "requests": sum(p["requests"] for p in parts),
        "ok": ok,
        "errors": sum(p["errors"] for p in parts),
        "error_kinds": kinds,
        "elapsed_s": round(elapsed, 4),
        "rps": round(ok / max(elapsed, 1e-9), 2),
        "rps_by_round": [p["rps"] for p in parts],
        "bytes": body,
        "bytes_per_s": round(body / max(elapsed, 1e-9), 1),
        "body_bytes_mean": round(body / ok, 1) if ok else 0,
        "ttfb_ms": _ms(ttfb),
        "ttft_ms": _ms(ttft),
        "total_ms": _ms(total),
        "warmup": {
            "requests": sum(p["warmup"]["requests"] for p in parts),
            "errors": sum(p["warmup"]["errors"] for p in parts),
            "elapsed_s": round(sum(p["warmup"].get("elapsed_s", 0.0) for p in parts), 4),
        },
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    body = args.body.encode()
    request = build_request(args.host, args.port, args.path, body, args.auth, args.format)
    conns: list[Connection] = []
    warm = Results()
    if args.warmup > 0:
        warm = await drive(
            args.host,
            args.port,
            request,
            args.format,
            args.concurrency,
            # At least one request per worker: every connection is open before the timed part.
            max(args.warmup, args.concurrency),
            args.timeout,
            conns,
        )
    results = await drive(
        args.host,
        args.port,
        request,
        args.format,
        args.concurrency,
        args.requests,
        args.timeout,
        conns,
    )
    for conn in conns:
        conn.close()
    summary = summarize(results, args.concurrency, raw=args.raw)
    summary["warmup"] = {
        "requests": len(warm.outcomes),
        "errors": sum(1 for o in warm.outcomes if not o.ok),
        "elapsed_s": round(warm.finished - warm.started, 4),
    }
    return summary


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen", description="Drive chat requests at one concurrency level."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--body", required=True, help="the JSON request body")
    parser.add_argument(
        "--format", choices=FORMATS, default=SSE, help="streamed SSE or NDJSON, or a whole JSON"
    )
    parser.add_argument("--auth", default="", help="a bearer token to send, if any")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed requests first (0: none; else at least one per worker)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--raw", action="store_true", help="include every request's timings")
    args = parser.parse_args(list(argv))
    if args.concurrency < 1 or args.requests < 1 or args.warmup < 0:
        parser.error("--concurrency and --requests must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    summary = asyncio.run(run(args))
    json.dump(summary, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
