# -*- test-case-name: tests.test_bench -*-
"""
``python -m bench.floor``: the floor under IOP's performance goals — the cheapest pipeline of the
shape the product fixes, with none of IOP's logic, measured the way :mod:`bench.run` measures IOP.

The shape: client HTTP → ``twisted.web`` (process A, "edge") → length-prefixed frames
(``Int32StringReceiver``, no protobuf) over one TLS connection → process B ("node") → Twisted's
``Agent`` with a persistent ``HTTPConnectionPool`` → the fake OpenAI upstream
(:mod:`iop.testing.fake_openai`, the one ``make bench`` uses) → back the same way.

A frame is ``request id (4 bytes) | kind (1 byte) | payload``. A → B: ``R`` (the client's
request body). B → A: ``W`` (a whole answer), ``S`` (a piece of a streamed answer: whatever
one ``dataReceived`` of the upstream response delivered), ``E`` (the stream ended), ``F`` (the
upstream failed: A answers 502). Many requests share the one link, as in IOP. B dials A, as a
Node dials its Edge; the link's TLS options are IOP's own (:mod:`iop.security.tls`); every
socket has ``TCP_NODELAY``; A writes no access log.

Variants (each its own processes, all started once, then driven in turn):

- ``direct``: the load generator calls the upstream itself (the baseline of "added p50");
- ``a-alone``: A answering a fixed body (the upstream's own answer, fetched once at start);
- ``b-alone``: B's half alone: a closed loop of ``Agent`` requests to the upstream in one
  process (c in flight), streamed answers read by a ``Protocol``; it measures itself;
- ``link-tls``: A → TLS → B, B answering the fixed body without calling the upstream (A + the
  link, no ``Agent``);
- ``tcp``: the whole pipeline with plain TCP between A and B;
- ``tls``: the whole pipeline, TLS between A and B (the product's shape);
- ``tls-turn``: ``tls``, but B sends the pieces one reactor turn delivered as one frame (the
  first at once, the rest at the turn's end), as IOP's Node does; the same as ``tls`` for a
  whole answer.

Per variant, mode (``stream``: 32 SSE chunks written at once; ``non-stream``: one JSON) and
concurrency level, ``--rounds`` runs (the variants interleaved in each round), each a fresh
:mod:`bench.loadgen` process (closed loop, warm-up first). Per run, as :mod:`bench.run` does:
CPU seconds of A + B from ``/proc`` over the run (warm-up included) ÷ requests handled, per
streamed chunk ÷ 32 more; p50 latency minus ``direct``'s in the same round. The figures are the
median of the rounds. Results: ``<out>/<date>-<alias>-<label>.json`` and a Markdown table on
stdout. ``--profile-dir DIR`` runs A and B under ``cProfile`` and adds, per process, its busy
time by area (:func:`profile_summary`).

Roles (what the harness starts): ``python -m bench.floor edge|node|agent-loop ...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import JSON, SSE, percentile
from bench.procs import BenchError, Child, Children, cpu_seconds, port_open, sample, wait_until
from bench.run import HOST_ALIAS, NON_STREAM, STREAM, Target, chat_body, run_loadgen
from bench.systems import OPENAI_MODEL, base_env

BENCH_DIR = Path(__file__).resolve().parent
TOKENS = 32
VARIANTS = ("direct", "a-alone", "b-alone", "link-tls", "tcp", "tls", "tls-turn")
# The processes whose CPU counts, per variant (b-alone measures itself).
SERVERS: dict[str, tuple[str, ...]] = {
    "direct": (),
    "a-alone": ("a-fixed",),
    "b-alone": (),
    "link-tls": ("a-echo", "b-echo"),
    "tcp": ("a-tcp", "b-tcp"),
    "tls": ("a-tls", "b-tls"),
    "tls-turn": ("a-turn", "b-turn"),
}
CHAT_PATH = "/v1/chat/completions"
READY_PATH = b"/_floor/ready"
HEADER = struct.Struct(">IB")
REQUEST, WHOLE, PIECE, END, FAILED = b"R", b"W", b"S", b"E", b"F"
MAX_FRAME = 16 * 2**20


# -- the two processes ---------------------------------------------------------------------------
# Twisted is imported inside the role functions: the harness itself never starts a reactor.


def _no_delay(transport: Any) -> None:
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_no_delay is not None:
        set_no_delay(True)


def _fetch_answers(upstream_port: int) -> dict[bool, bytes]:
    """The upstream's own answers (streamed and whole), for the fixed-body variants."""
    answers: dict[bool, bytes] = {}
    for stream in (True, False):
        request = urllib.request.Request(
            f"http://127.0.0.1:{upstream_port}{CHAT_PATH}",
            data=json.dumps(chat_body(OPENAI_MODEL, stream)).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answers[stream] = response.read()
    return answers


def _is_stream(body: bytes) -> bool:
    return b'"stream": true' in body or b'"stream":true' in body


def _tls_paths(tls_dir: str) -> tuple[str, str, str]:
    return (
        os.path.join(tls_dir, "ca.crt"),
        os.path.join(tls_dir, "edge.crt"),
        os.path.join(tls_dir, "edge.key"),
    )


def serve_edge(args: argparse.Namespace) -> int:
    """Process A: twisted.web in front of one framed link (or a fixed body)."""
    from twisted.internet import endpoints, reactor
    from twisted.internet.protocol import Factory
    from twisted.logger import globalLogBeginner, textFileLogObserver
    from twisted.protocols.basic import Int32StringReceiver
    from twisted.web.http import HTTPChannel
    from twisted.web.resource import Resource
    from twisted.web.server import NOT_DONE_YET, Request, Site

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    fixed = _fetch_answers(args.upstream_port) if args.fixed else {}
    pending: dict[int, Request] = {}
    links: list[Link] = []
    ids = iter(range(1, 2**32))

    class Link(Int32StringReceiver):
        MAX_LENGTH = MAX_FRAME

        def connectionMade(self) -> None:
            _no_delay(self.transport)
            links.append(self)

        def connectionLost(self, reason: Any = None) -> None:
            links.remove(self)

        def stringReceived(self, string: bytes) -> None:
            rid, kind = HEADER.unpack_from(string)
            request = pending.get(rid)
            if request is None:
                return
            payload = string[HEADER.size :]
            if kind == 0x57:  # W
                del pending[rid]
                request.setHeader(b"content-type", b"application/json")
                request.setHeader(b"content-length", b"%d" % len(payload))
                request.write(payload)
                request.finish()
            elif kind == 0x53:  # S
                if not request.startedWriting:
                    request.setHeader(b"content-type", b"text/event-stream")
                request.write(payload)
            elif kind == 0x45:  # E
                del pending[rid]
                request.finish()
            else:
                del pending[rid]
                request.setResponseCode(502)
                request.finish()

    class Chat(Resource):
        isLeaf = True

        def render_GET(self, request: Request) -> bytes:
            if request.path == READY_PATH and (links or fixed):
                return b"ready"
            request.setResponseCode(503)
            return b""

        def render_POST(self, request: Request) -> bytes | int:
            assert request.content is not None
            body = request.content.read()
            if fixed:
                stream = _is_stream(body)
                request.setHeader(
                    b"content-type", b"text/event-stream" if stream else b"application/json"
                )
                return fixed[stream]
            if not links:
                request.setResponseCode(503)
                return b""
            rid = next(ids)
            pending[rid] = request
            request.notifyFinish().addErrback(lambda _: pending.pop(rid, None))
            links[0].sendString(HEADER.pack(rid, REQUEST[0]) + body)
            return NOT_DONE_YET

    class Channel(HTTPChannel):
        def connectionMade(self) -> None:
            _no_delay(self.transport)
            super().connectionMade()

    class QuietSite(Site):
        noisy = False

        def log(self, request: Any) -> None:
            pass

    site = QuietSite(Chat())
    site.protocol = Channel  # type: ignore[assignment]
    site.displayTracebacks = False
    endpoints.TCP4ServerEndpoint(reactor, args.http_port, interface="127.0.0.1").listen(site)
    if not args.fixed:
        link_factory = Factory.forProtocol(Link)
        link_factory.noisy = False
        if args.tls_dir:
            from iop.config.model import ServerTLS
            from iop.security.tls import server_context_factory

            _, cert, key = _tls_paths(args.tls_dir)
            options = server_context_factory(ServerTLS(cert_file=cert, key_file=key))
            endpoints.SSL4ServerEndpoint(
                reactor, args.link_port, options, interface="127.0.0.1"
            ).listen(link_factory)
        else:
            endpoints.TCP4ServerEndpoint(reactor, args.link_port, interface="127.0.0.1").listen(
                link_factory
            )
    reactor.run()  # type: ignore[attr-defined]
    return 0


def _agent(reactor: Any, connections: int) -> Any:
    """An ``Agent`` on a persistent pool, straight TCP to loopback (no name lookup), no Nagle."""
    from twisted.internet import endpoints
    from twisted.web.client import Agent, HTTPConnectionPool

    class NoDelayEndpoint:
        def __init__(self, host: str, port: int) -> None:
            self._inner = endpoints.TCP4ClientEndpoint(reactor, host, port)

        def connect(self, factory: Any) -> Any:
            def connected(protocol: Any) -> Any:
                _no_delay(protocol.transport)
                return protocol

            return self._inner.connect(factory).addCallback(connected)

    class Endpoints:
        def __init__(self) -> None:
            self._cache: dict[tuple[bytes, int], NoDelayEndpoint] = {}

        def endpointForURI(self, uri: Any) -> NoDelayEndpoint:
            key = (uri.host, uri.port)
            if key not in self._cache:
                self._cache[key] = NoDelayEndpoint(uri.host.decode(), uri.port)
            return self._cache[key]

    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = connections
    pool.cachedConnectionTimeout = 3600
    pool.retryAutomatically = True
    return Agent.usingEndpointFactory(reactor, Endpoints(), pool=pool)


def _upstream_call(
    agent: Any, url: bytes, headers: Any, body: bytes, on_piece: Callable[[bytes], None]
) -> Any:
    """
    One upstream request. A streamed answer (``text/event-stream``) goes to ``on_piece`` as each
    ``dataReceived`` delivers it, and the Deferred fires with ``(status, None)``; any other
    answer is collected and it fires with ``(status, body)``.
    """
    from twisted.internet.defer import Deferred
    from twisted.internet.protocol import Protocol

    # The Node's own body producer: the bytes written with the headers, no cooperator turn.
    from iop.node.adapters.http_client import bytes_producer

    class Reader(Protocol):
        def __init__(self, done: Deferred[Any], status: int, stream: bool) -> None:
            self.done = done
            self.status = status
            self.stream = stream
            self.parts: list[bytes] = []

        def dataReceived(self, data: bytes) -> None:
            if self.stream:
                on_piece(data)
            else:
                self.parts.append(data)

        def connectionLost(self, reason: Any = None) -> None:
            self.done.callback((self.status, None if self.stream else b"".join(self.parts)))

    def answered(response: Any) -> Any:
        content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
        stream = response.code == 200 and content_type.startswith(b"text/event-stream")
        done: Deferred[Any] = Deferred()
        response.deliverBody(Reader(done, response.code, stream))
        return done

    return agent.request(b"POST", url, headers, bytes_producer(body)).addCallback(answered)


def _upstream_headers(port: int) -> Any:
    from twisted.web.http_headers import Headers

    return Headers(
        {
            b"host": [b"127.0.0.1:%d" % port],
            b"content-type": [b"application/json"],
            b"accept": [b"*/*"],
        }
    )


def serve_node(args: argparse.Namespace) -> int:
    """Process B: the framed link's far end; per request frame one upstream call (or echo)."""
    from twisted.internet import endpoints, reactor
    from twisted.internet.protocol import Factory
    from twisted.logger import globalLogBeginner, textFileLogObserver
    from twisted.protocols.basic import Int32StringReceiver

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    fixed = _fetch_answers(args.upstream_port) if args.echo else {}
    agent = _agent(reactor, args.connections)
    url = b"http://127.0.0.1:%d%s" % (args.upstream_port, CHAT_PATH.encode())
    headers = _upstream_headers(args.upstream_port)

    class Link(Int32StringReceiver):
        MAX_LENGTH = MAX_FRAME

        def connectionMade(self) -> None:
            _no_delay(self.transport)

        def connectionLost(self, reason: Any = None) -> None:
            if reactor.running:  # type: ignore[attr-defined]
                reactor.stop()  # type: ignore[attr-defined]

        def stringReceived(self, string: bytes) -> None:
            rid, _ = HEADER.unpack_from(string)
            body = string[HEADER.size :]
            if fixed:
                if _is_stream(body):
                    self.sendString(HEADER.pack(rid, PIECE[0]) + fixed[True])
                    self.sendString(HEADER.pack(rid, END[0]))
                else:
                    self.sendString(HEADER.pack(rid, WHOLE[0]) + fixed[False])
                return

            held: list[bytes] = []
            timer: list[Any] = []

            def flush() -> None:
                if timer:
                    if timer[0].active():
                        timer[0].cancel()
                    timer.clear()
                if held:
                    self.sendString(HEADER.pack(rid, PIECE[0]) + b"".join(held))
                    held.clear()

            def piece(data: bytes) -> None:
                if not args.coalesce:
                    self.sendString(HEADER.pack(rid, PIECE[0]) + data)
                elif timer:
                    # Later pieces of the same reactor turn wait for its end: one frame.
                    held.append(data)
                else:
                    # A turn's first piece goes out at once (never delayed), as IOP does.
                    self.sendString(HEADER.pack(rid, PIECE[0]) + data)
                    timer.append(reactor.callLater(0, flush))  # type: ignore[attr-defined]

            def done(result: tuple[int, bytes | None]) -> None:
                status, whole = result
                flush()
                if status != 200:
                    self.sendString(HEADER.pack(rid, FAILED[0]))
                elif whole is None:
                    self.sendString(HEADER.pack(rid, END[0]))
                else:
                    self.sendString(HEADER.pack(rid, WHOLE[0]) + whole)

            def failed(failure: Any) -> None:
                failure.printTraceback(sys.stderr)
                self.sendString(HEADER.pack(rid, FAILED[0]))

            _upstream_call(agent, url, headers, body, piece).addCallbacks(done, failed)

    link_factory = Factory.forProtocol(Link)
    link_factory.noisy = False
    if args.tls_dir:
        from iop.config.model import ClientTLS
        from iop.security.tls import client_connection_creator
        from iop.testing.pki import DEFAULT_EDGE_NAME

        ca, _, _ = _tls_paths(args.tls_dir)
        creator = client_connection_creator(ClientTLS(ca_file=ca, server_name=DEFAULT_EDGE_NAME))
        endpoint: Any = endpoints.SSL4ClientEndpoint(reactor, "127.0.0.1", args.link_port, creator)
    else:
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", args.link_port)

    def not_connected(failure: Any) -> None:
        failure.printTraceback(sys.stderr)
        reactor.stop()  # type: ignore[attr-defined]

    endpoint.connect(link_factory).addErrback(not_connected)
    reactor.run()  # type: ignore[attr-defined]
    return 0


def agent_loop(args: argparse.Namespace) -> int:
    """
    B's half alone: ``concurrency`` closed-loop workers calling the upstream with the ``Agent``
    (streamed answers read piece by piece). Prints one JSON object: requests, CPU seconds of this
    process from ``/proc`` over warm-up + timed requests, rps and p50 of the timed part.
    """
    from twisted.internet import defer, reactor, task
    from twisted.logger import globalLogBeginner, textFileLogObserver

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    agent = _agent(reactor, args.concurrency)
    url = b"http://127.0.0.1:%d%s" % (args.upstream_port, CHAT_PATH.encode())
    headers = _upstream_headers(args.upstream_port)
    body = json.dumps(chat_body(OPENAI_MODEL, args.stream)).encode()
    out: dict[str, Any] = {}
    pieces = [0]

    def piece(data: bytes) -> None:
        pieces[0] += 1

    async def worker(budget: list[int], times: list[float], errors: list[int]) -> None:
        while budget[0] > 0:
            budget[0] -= 1
            start = time.perf_counter()
            status, _ = await _upstream_call(agent, url, headers, body, piece)
            times.append(time.perf_counter() - start)
            if status != 200:
                errors.append(status)

    async def phase(count: int) -> tuple[list[float], list[int], float]:
        budget, times, errors = [count], list[float](), list[int]()
        started = time.perf_counter()
        await defer.gatherResults(
            [
                defer.Deferred.fromCoroutine(worker(budget, times, errors))
                for _ in range(args.concurrency)
            ]
        )
        return times, errors, time.perf_counter() - started

    async def main() -> None:
        me = os.getpid()
        cpu_start = cpu_seconds(me)
        warm, warm_errors, _ = await phase(max(args.warmup, args.concurrency))
        pieces[0] = 0
        times, errors, elapsed = await phase(args.requests)
        cpu = cpu_seconds(me) - cpu_start
        out.update(
            requests=len(times),
            warmup_requests=len(warm),
            errors=len(errors) + len(warm_errors),
            cpu_seconds=round(cpu, 3),
            elapsed_s=round(elapsed, 4),
            rps=round(len(times) / max(elapsed, 1e-9), 2),
            p50_ms=round(percentile([t * 1000 for t in times], 50), 3),
            pieces_per_request=round(pieces[0] / max(len(times), 1), 2),
        )
        print(json.dumps(out), flush=True)

    def run(_: Any) -> Any:
        return defer.Deferred.fromCoroutine(main())

    task.react(lambda r: run(r))  # exits the process
    return 0  # pragma: no cover


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Floor:
    """The running processes of every variant."""

    children: Children = field(default_factory=Children)
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    upstream_port: int = 0

    def check(self) -> None:
        for child in self.children.items:
            child.check()


def _log(message: str) -> None:
    print(f"[floor {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    from iop.testing.ports import free_port

    return free_port()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{READY_PATH.decode()}", timeout=1
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _role(role: str, *args: str, profile: Path | None = None) -> list[str]:
    """The command line of one role; under ``cProfile`` (stats written at exit) with ``profile``."""
    if profile is not None:
        return [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(profile),
            "-m",
            "bench.floor",
            role,
            *args,
        ]
    return [sys.executable, "-m", "bench.floor", role, *args]


# Where a profiled process spends its time, by the file a function is in.
PROFILE_AREAS = (
    (
        "twisted.web http.py, server.py (server side; the chunked decoder)",
        ("twisted/web/http.py", "twisted/web/server.py", "twisted/web/resource.py"),
    ),
    (
        "twisted.web client (Agent, _newclient, pool)",
        ("twisted/web/client.py", "twisted/web/_newclient.py"),
    ),
    (
        "HTTP headers and chunked coding",
        ("twisted/web/http_headers.py", "twisted/web/_abnf.py", "twisted/web/_http2.py"),
    ),
    (
        "TLS (twisted.protocols.tls, pyOpenSSL, cffi)",
        ("twisted/protocols/tls.py", "OpenSSL/", "_cffi_backend", "cryptography/"),
    ),
    ("framing (Int32StringReceiver)", ("twisted/protocols/basic.py",)),
    ("Deferreds", ("twisted/internet/defer.py",)),
    (
        "reactor, TCP transport, logging context",
        ("twisted/internet/", "twisted/python/", "twisted/logger/"),
    ),
    (
        "socket and epoll syscalls",
        ("method 'send'", "method 'recv'", "method 'poll'", "method 'sendmsg'"),
    ),
    ("the floor's own code", ("bench/floor.py",)),
)


# Not per-request work: waiting in epoll (wall time while idle) and the start's imports.
_PROFILE_IDLE = ("method 'poll' of 'select.epoll'",)
_PROFILE_STARTUP = ("<frozen importlib", "builtins.compile", "__build_class__", "marshal.loads")


def profile_summary(path: Path, top: int = 12) -> dict[str, Any]:
    """
    Own time (tottime) by area and the functions with the most of it, from one profile, as
    shares of the busy time: without the wait in ``epoll`` and the imports at start.
    """
    import pstats

    stats: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    areas: dict[str, float] = {}
    functions: list[tuple[float, str]] = []
    idle = startup = 0.0
    for (filename, line, name), entry in stats.items():
        own = entry[2]
        where = f"{filename}:{line}({name})"
        if any(n in where for n in _PROFILE_IDLE):
            idle += own
            continue
        if any(n in where for n in _PROFILE_STARTUP):
            startup += own
            continue
        functions.append((own, where))
        area = next(
            (label for label, needles in PROFILE_AREAS if any(n in where for n in needles)),
            "other",
        )
        areas[area] = areas.get(area, 0.0) + own
    busy = sum(areas.values()) or 1e-9
    functions.sort(reverse=True)
    return {
        "busy_s": round(busy, 3),
        "idle_in_epoll_s": round(idle, 3),
        "startup_imports_s": round(startup, 3),
        "areas_percent": {
            k: round(v * 100 / busy, 1) for k, v in sorted(areas.items(), key=lambda kv: -kv[1])
        },
        "top_functions": [
            {"percent": round(own * 100 / busy, 1), "function": where.split("site-packages/")[-1]}
            for own, where in functions[:top]
        ],
    }


def start_floor(
    scratch: Path, variants: Sequence[str], connections: int, profile: Path | None = None
) -> Floor:
    from iop.testing.pki import create_dev_pki

    floor = Floor()
    env = base_env()
    root = BENCH_DIR.parent
    port = _free_port()
    upstream = floor.children.start(
        "upstream",
        [
            sys.executable,
            "-m",
            "iop.testing.fake_openai",
            "--port",
            str(port),
            "--tokens",
            str(TOKENS),
            "--delay-ms",
            "0",
            "--chunk-tokens",
            "1",
        ],
        env,
        scratch / "upstream.log",
        root,
    )
    wait_until(lambda: port_open(port) or not upstream.running(), 30, "the fake upstream")
    upstream.check()
    floor.upstream_port = port
    floor.pids["upstream"] = upstream.pid
    tls_dir = scratch / "pki"
    create_dev_pki(tls_dir, node_names=[])

    def edge(name: str, *extra: str) -> tuple[Child, int, int]:
        http_port, link_port = _free_port(), _free_port()
        child = floor.children.start(
            name,
            _role(
                "edge",
                "--http-port",
                str(http_port),
                "--link-port",
                str(link_port),
                "--upstream-port",
                str(port),
                *extra,
                profile=profile / f"{name}.prof" if profile else None,
            ),
            env,
            scratch / f"{name}.log",
            root,
        )
        floor.pids[name] = child.pid
        floor.ports[name] = http_port
        return child, http_port, link_port

    def node(name: str, link_port: int, *extra: str) -> Child:
        child = floor.children.start(
            name,
            _role(
                "node",
                "--link-port",
                str(link_port),
                "--upstream-port",
                str(port),
                "--connections",
                str(connections),
                *extra,
                profile=profile / f"{name}.prof" if profile else None,
            ),
            env,
            scratch / f"{name}.log",
            root,
        )
        floor.pids[name] = child.pid
        return child

    pairs = {
        "link-tls": ("a-echo", "b-echo", ["--tls-dir", str(tls_dir)], ["--echo"]),
        "tcp": ("a-tcp", "b-tcp", [], []),
        "tls": ("a-tls", "b-tls", ["--tls-dir", str(tls_dir)], []),
        "tls-turn": ("a-turn", "b-turn", ["--tls-dir", str(tls_dir)], ["--coalesce"]),
    }
    waits: list[tuple[str, Child, int]] = []
    if "a-alone" in variants:
        child, http_port, _ = edge("a-fixed", "--fixed")
        waits.append(("a-fixed", child, http_port))
    for variant, (a_name, b_name, tls, node_extra) in pairs.items():
        if variant not in variants:
            continue
        child, http_port, link_port = edge(a_name, *tls)
        wait_until(
            lambda p=link_port, c=child: port_open(p) or not c.running(),  # type: ignore[misc]
            30,
            f"{a_name}'s link",
        )
        child.check()
        node(b_name, link_port, *tls, *node_extra)
        waits.append((a_name, child, http_port))
    for name, child, http_port in waits:
        wait_until(
            lambda p=http_port, c=child: _ready(p) or not c.running(),  # type: ignore[misc]
            30,
            f"{name} to be ready",
        )
        floor.check()
    return floor


def _target(variant: str, mode: str, port: int) -> Target:
    stream = mode == STREAM
    return Target(
        variant,
        mode,
        TOKENS,
        TOKENS,
        port,
        CHAT_PATH,
        chat_body(OPENAI_MODEL, stream),
        SSE if stream else JSON,
        list(SERVERS[variant]),
        None if variant == "direct" else "direct",
    )


def _one_run(
    floor: Floor, variant: str, mode: str, level: int, requests: int, warmup: int
) -> dict[str, Any]:
    """One load-generator run of one variant: its figures."""
    if variant == "b-alone":
        argv = _role(
            "agent-loop",
            "--upstream-port",
            str(floor.upstream_port),
            "--concurrency",
            str(level),
            "--requests",
            str(requests),
            "--warmup",
            str(warmup),
            *(["--stream"] if mode == STREAM else []),
        )
        import subprocess

        done = subprocess.run(
            argv, cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise BenchError(f"agent loop failed ({done.returncode}): {done.stderr[-2000:]}")
        own = json.loads(done.stdout.strip().splitlines()[-1])
        handled = own["requests"] + own["warmup_requests"]
        cpu_s = own["cpu_seconds"]
        result = {
            "ok": own["requests"] - own["errors"],
            "errors": own["errors"],
            "rps": own["rps"],
            "p50_ms": own["p50_ms"],
            "handled": handled,
            "wall_s": None,
            "pieces_per_request": own["pieces_per_request"],
        }
    else:
        port = floor.upstream_port if variant == "direct" else floor.ports[SERVERS[variant][0]]
        servers = SERVERS[variant]
        before = {name: sample(floor.pids[name]).cpu_seconds for name in servers}
        summary = run_loadgen(_target(variant, mode, port), level, requests, warmup)
        after = {name: sample(floor.pids[name]).cpu_seconds for name in servers}
        handled = summary["requests"] + summary["warmup"]["requests"]
        cpu_s = sum(after[n] - before[n] for n in servers)
        result = {
            "ok": summary["ok"],
            "errors": summary["errors"],
            "rps": summary["rps"],
            "p50_ms": summary["total_ms"]["p50"],
            "handled": handled,
            "wall_s": round(summary["elapsed_s"] + summary["warmup"]["elapsed_s"], 3),
            "cpu_by_process": {n: round(after[n] - before[n], 3) for n in servers},
        }
    cpu_ms = cpu_s * 1000 / max(handled, 1)
    result |= {
        "variant": variant,
        "mode": mode,
        "concurrency": level,
        "cpu_seconds": round(cpu_s, 3),
        "cpu_ms_per_request": round(cpu_ms, 4),
        "cpu_us_per_chunk": round(cpu_ms * 1000 / TOKENS, 2),
        "cores": round(cpu_s / result["wall_s"], 2) if result["wall_s"] else None,
    }
    return result


def measure(
    floor: Floor,
    variants: Sequence[str],
    modes: Sequence[str],
    levels: Sequence[int],
    rounds: int,
    requests: int,
    warmup: int,
) -> list[dict[str, Any]]:
    """Every run: per mode and level, ``rounds`` passes over the variants (``direct`` first)."""
    runs: list[dict[str, Any]] = []
    order = ["direct", *(v for v in variants if v != "direct")]
    for mode in modes:
        for level in levels:
            for index in range(rounds):
                direct_p50: float | None = None
                for variant in order:
                    floor.check()
                    run = _one_run(floor, variant, mode, level, requests, warmup)
                    run["round"] = index
                    # How busy the (shared) machine was: CPU per request rises with it.
                    run["load_average_1m"] = round(os.getloadavg()[0], 2)
                    if variant == "direct":
                        direct_p50 = run["p50_ms"]
                    run["added_p50_ms"] = (
                        round(run["p50_ms"] - direct_p50, 3)
                        if direct_p50 is not None and variant not in ("direct", "b-alone")
                        else None
                    )
                    runs.append(run)
                    _log(
                        f"{mode:<10} c={level:<3} round {index} {variant:<9} "
                        f"{run['rps']:>8.1f} req/s  p50 {run['p50_ms']:>7.2f} ms  "
                        f"CPU {run['cpu_ms_per_request']:.3f} ms/req "
                        f"({run['cpu_us_per_chunk']:.1f} µs/chunk)  errors {run['errors']}"
                    )
    return runs


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant, mode and level: the median of the rounds' figures."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["variant"], run["mode"], run["concurrency"]), []).append(run)
    out: list[dict[str, Any]] = []
    for (variant, mode, level), group in cells.items():
        entry: dict[str, Any] = {
            "variant": variant,
            "mode": mode,
            "concurrency": level,
            "rounds": len(group),
            "errors": sum(r["errors"] for r in group),
        }
        for key in ("rps", "p50_ms", "added_p50_ms", "cpu_ms_per_request", "cpu_us_per_chunk"):
            entry[key] = _median([r[key] for r in group])
        entry["cores"] = _median([r["cores"] for r in group])
        entry["load_average_1m"] = _median([r.get("load_average_1m") for r in group])
        out.append(entry)
    return out


def _fmt(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(cells: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | c | variant | A+B CPU ms/request | A+B CPU µs/chunk | req/s | p50 ms | "
        "added p50 ms | cores | errors |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    order = {v: i for i, v in enumerate(VARIANTS)}
    for e in sorted(
        cells,
        key=lambda e: (e["mode"] != NON_STREAM, e["concurrency"], order.get(e["variant"], 99)),
    ):
        stream = e["mode"] == STREAM
        lines.append(
            f"| {e['mode']} | {e['concurrency']} | {e['variant']} | "
            f"{_fmt(e['cpu_ms_per_request'], 3) if e['variant'] != 'direct' else '-'} | "
            f"{_fmt(e['cpu_us_per_chunk'], 1) if stream and e['variant'] != 'direct' else '-'} | "
            f"{_fmt(e['rps'], 0)} | {_fmt(e['p50_ms'], 2)} | {_fmt(e['added_p50_ms'], 2)} | "
            f"{_fmt(e['cores'], 2)} | {e['errors']} |"
        )
    return "\n".join(lines)


def _environment() -> dict[str, Any]:
    import subprocess

    import twisted

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=BENCH_DIR.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "host_alias": HOST_ALIAS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "twisted": twisted.__version__,
        "commit": commit or None,
    }


def run_harness(args: argparse.Namespace) -> int:
    variants = [v for v in VARIANTS if v in args.variants]
    scratch = Path(tempfile.mkdtemp(prefix="iop-floor-"))
    floor = Floor()
    started = time.monotonic()
    try:
        _log(f"starting {', '.join(variants)}")
        if args.profile_dir is not None:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
        floor = start_floor(scratch, variants, max(args.levels) + 16, args.profile_dir)
        runs = measure(
            floor, variants, args.modes, args.levels, args.rounds, args.requests, args.warmup
        )
    except BenchError as e:
        _log(f"FAILED: {e}")
        for child in floor.children.items:
            if not child.running():
                _log(f"{child.name}:\n{child.tail()}")
        return 1
    finally:
        try:
            floor.children.stop_all()
        except (OSError, BenchError):
            pass
        shutil.rmtree(scratch, ignore_errors=True)
    cells = medians(runs)
    profiles = {}
    if args.profile_dir is not None:
        for path in sorted(args.profile_dir.glob("*.prof")):
            profiles[path.stem] = profile_summary(path)
            print(f"## {path.stem}\n```\n{json.dumps(profiles[path.stem], indent=1)}\n```")
    results = {
        "kind": "iop-floor",
        "date": datetime.date.today().isoformat(),
        "settings": {
            "variants": variants,
            "modes": list(args.modes),
            "levels": list(args.levels),
            "rounds": args.rounds,
            "requests_per_run": args.requests,
            "warmup_per_run": args.warmup,
            "tokens_per_answer": TOKENS,
            "chunk_tokens": 1,
            "upstream_delay_ms": 0,
        },
        "environment": _environment(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "cells": cells,
        "runs": runs,
        **({"profiles": profiles} if profiles else {}),
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{results['date']}-{HOST_ALIAS}-{args.label}"
        path = args.out / f"{stem}.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        _log(f"wrote {path.name}")
    print(markdown_table(cells), flush=True)
    failed = [c for c in cells if c["errors"]]
    return 1 if failed else 0


# -- command line --------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers, comma-separated")
    return values


def _names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = sorted(set(names) - set(choices))
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
        return names

    return parse


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor",
        description="The minimal pipeline of IOP's shape, measured like IOP (see the docstring).",
    )
    sub = parser.add_subparsers(dest="role")
    edge = sub.add_parser("edge", help="process A (started by the harness)")
    edge.add_argument("--http-port", type=int, required=True)
    edge.add_argument("--link-port", type=int, required=True)
    edge.add_argument("--upstream-port", type=int, required=True)
    edge.add_argument("--tls-dir", default="")
    edge.add_argument("--fixed", action="store_true", help="answer the upstream's fixed body")
    node = sub.add_parser("node", help="process B (started by the harness)")
    node.add_argument("--link-port", type=int, required=True)
    node.add_argument("--upstream-port", type=int, required=True)
    node.add_argument("--tls-dir", default="")
    node.add_argument("--connections", type=int, default=64)
    node.add_argument("--echo", action="store_true", help="answer a fixed body, no upstream")
    node.add_argument(
        "--coalesce", action="store_true", help="one frame per reactor turn's pieces, not per piece"
    )
    loop = sub.add_parser("agent-loop", help="B's upstream half alone (started by the harness)")
    loop.add_argument("--upstream-port", type=int, required=True)
    loop.add_argument("--concurrency", type=int, required=True)
    loop.add_argument("--requests", type=int, required=True)
    loop.add_argument("--warmup", type=int, default=50)
    loop.add_argument("--stream", action="store_true")
    parser.add_argument("--levels", type=_ints, default=[1, 10, 50])
    parser.add_argument("--modes", type=_names((STREAM, NON_STREAM)), default=[NON_STREAM, STREAM])
    parser.add_argument("--variants", type=_names(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell (median taken)")
    parser.add_argument("--requests", type=int, default=600, help="timed requests per run")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up requests per run")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--no-write", dest="out", action="store_const", const=None)
    parser.add_argument("--label", default="floor", help="the result file's name suffix")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="run A and B under cProfile, their stats here (figures inflated: shares only)",
    )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.role == "edge":
        return serve_edge(args)
    if args.role == "node":
        return serve_node(args)
    if args.role == "agent-loop":
        return agent_loop(args)
    return run_harness(args)


if __name__ == "__main__":
    raise SystemExit(main())
