# -*- test-case-name: iop.test.edge.ingress.test_head_fuzz -*-
"""
Whatever bytes a client sends, the client listener answers well or closes, and leaks nothing.

Request heads drawn and mutated (request lines, header names and values, every
``Content-Length``/``Transfer-Encoding`` combination, chunked bodies, pipelined requests, bytes
cut at random places) go to the real :class:`~iop.edge.ingress.http.ClientSite` protocol over
``StringTransport``, in front of a real ``ClientApp`` and ``EdgeGateway`` with a scripted node
(which fails whatever reaches it). The clock then runs past every deadline. The property: what
came back is a sequence of well-formed HTTP responses, each 4xx/5xx with a JSON error body,
none a 500 or a redirect; the connection is closed; no delayed call is left; the connection
count, the pool's in-flight and queued counts and the active runs and tunnels are all back to 0;
nothing was logged as a failure (trial fails a test that logs one).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.events import RuntimeEvent
from iop.test import examples
from iop.test.edge.ingress.harness import KEY, error
from iop.test.edge.ingress.wire import Wire, parse_responses

PROVIDERS = ("p-chat", "p-native", "p-resp", "p-plain", "p-bare", "p-llama")
PATHS = [
    "/v1/models",
    "/v1/models/chat",
    "/v1/chat/completions",
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1//chat/completions",
    "/v1/models/%2F0",
    "/nope",
    "*",
    "http://edge/v1/models",
    "/v1/models?x=1",
]
METHODS = ["GET", "POST", "HEAD", "get", "post", "PUT", "OPTIONS", "BREW", "CONNECT"]
VERSIONS = [
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/1.2",
    "http/1.1",
    "",
]
BODIES = [
    {"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "bare", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "cli", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "resp", "input": "hi"},
    {"model": "native", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "nope", "messages": []},
]
LENGTH_VALUES = ["0", "2", "5", "17", "99999999", "1e20", "+5", "5, 5", "-1", " 3 ", "0x10", "",
                 "9" * 5000, "0" * 30 + "7"]  # fmt: skip
CODING_VALUES = ["chunked", "Chunked", "identity", "gzip, chunked", "chunked, identity", "x"]

octets = st.binary(max_size=24)
token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789!#$%&'*+.^_`|~", min_size=1,
                max_size=12)  # fmt: skip
header_value = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
    octets.map(lambda b: b.decode("latin-1")),
)


@st.composite
def body(draw: Any) -> tuple[str, bytes]:
    """``(kind, bytes)``: a JSON body as it is, chunked, raw octets or none."""
    kind = draw(st.sampled_from(["json", "json", "chunked", "raw", "none"]))
    data = json.dumps(draw(st.sampled_from(BODIES))).encode()
    if kind == "json":
        return kind, data
    if kind == "chunked":
        cut = draw(st.integers(0, len(data)))
        parts = [p for p in (data[:cut], data[cut:]) if p]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
        end = draw(
            st.sampled_from([b"0\r\n\r\n", b"0\r\n\r\n", b"0\r\nX: y\r\n\r\n", b"", b"0\r\n"])
        )
        return kind, chunked + end
    if kind == "raw":
        return kind, draw(octets)
    return kind, b""


@st.composite
def framing(draw: Any, kind: str, data: bytes) -> list[bytes]:
    """The Content-Length and Transfer-Encoding lines: mostly right for the body, or not."""
    lines: list[bytes] = []
    right = draw(st.integers(0, 3)) > 0
    if right and kind == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
    elif right and data:
        lines.append(b"Content-Length: %d" % len(data))
    for _ in range(0 if right else draw(st.integers(0, 2))):
        lines.append(f"Content-Length: {draw(st.sampled_from(LENGTH_VALUES))}".encode())
    for _ in range(0 if right else draw(st.integers(0, 2))):
        lines.append(f"Transfer-Encoding: {draw(st.sampled_from(CODING_VALUES))}".encode())
    return lines


@st.composite
def headers(draw: Any) -> list[bytes]:
    lines: list[bytes] = []
    if draw(st.integers(0, 3)):
        lines.append(b"Host: edge")
    if draw(st.integers(0, 5)):
        lines.append(f"Authorization: Bearer {KEY}".encode())
    if draw(st.integers(0, 3)):
        lines.append(b"Content-Type: application/json")
    if draw(st.booleans()):
        lines.append(b"anthropic-version: 2023-06-01")
    if draw(st.integers(0, 3)) == 0:
        lines.append(draw(st.sampled_from([b"Expect: 100-continue", b"Connection: close"])))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        name = draw(st.one_of(token, token, st.sampled_from(["X", " X", "X ", "", "a b", "\x00"])))
        lines.append(f"{name}: {draw(header_value)}".encode("latin-1", errors="replace"))
    return lines


@st.composite
def request(draw: Any) -> bytes:
    method = draw(
        st.one_of(st.sampled_from(["GET", "POST", "POST", "POST"]), st.sampled_from(METHODS), token)
    )
    path = draw(st.one_of(st.sampled_from(PATHS), token.map(lambda t: "/" + t)))
    version = draw(st.one_of(st.just("HTTP/1.1"), st.just("HTTP/1.1"), st.sampled_from(VERSIONS)))
    line = f"{method} {path} {version}".encode()
    kind, data = draw(body())
    assert isinstance(data, bytes)
    lines = draw(st.permutations([*draw(headers()), *draw(framing(kind, data))]))
    head = b"\r\n".join([line, *lines]) + b"\r\n\r\n"
    return head + data


@st.composite
def mutated(draw: Any) -> bytes:
    data = bytearray(b"".join(draw(st.lists(request(), min_size=1, max_size=3))))
    for _ in range(draw(st.one_of(st.just(0), st.just(0), st.integers(1, 4)))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "delete", "insert", "lf", "dup", "cut"]))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[at]
        elif op == "insert":
            data[at:at] = draw(st.sampled_from([b"\r\n", b" ", b":", b"\x00", b"\r", b"\t", b"0"]))
        elif op == "lf":
            data[:] = data.replace(b"\r\n", b"\n", 1)
        elif op == "dup":
            end = data.find(b"\r\n", at)
            if end > 0:
                start = data.rfind(b"\r\n", 0, at) + 2
                data[end:end] = b"\r\n" + data[start:end]
        else:
            del data[at:]
    return bytes(data)


def json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


@st.composite
def framed(draw: Any) -> bytes:
    """A well-formed request whose framing lines (and body) are drawn: the layer a smuggler uses."""
    method = draw(st.sampled_from(["POST", "POST", "GET", "HEAD"]))
    path = draw(st.sampled_from(PATHS[:8]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
    _, data = draw(body())
    assert isinstance(data, bytes)
    lengths = [
        f"Content-Length: {v}".encode()
        for v in draw(st.lists(st.sampled_from([*LENGTH_VALUES, str(len(data))]), max_size=2))
    ]
    codings = [
        f"Transfer-Encoding: {v}".encode()
        for v in draw(st.lists(st.sampled_from(CODING_VALUES), max_size=2))
    ]
    base = [b"Host: edge", f"Authorization: Bearer {KEY}".encode()]
    if draw(st.booleans()):
        base.append(b"Expect: 100-continue")
    lines = draw(st.permutations([*base, *lengths, *codings]))
    head = b"\r\n".join([f"{method} {path} {version}".encode(), *lines]) + b"\r\n\r\n"
    behind: bytes = draw(st.sampled_from([b"", b"GET /v1/models HTTP/1.1\r\n\r\n"]))
    return head + data + behind


class HeadFuzz(SynchronousTestCase):
    def run_bytes(self, data: bytes, pieces: list[int]) -> None:
        wire = Wire()
        edge = wire.edge
        connection = wire.connect()
        at = 0
        for size in pieces:
            connection.send(data[at : at + size])
            at += size
        connection.send(data[at:])
        answered: set[str] = set()
        for _ in range(20):
            tunnels = [
                t for t in edge.requests("provider_tunnel_request") if t.run_id not in answered
            ]
            runs = [r for r in edge.requests("run_request") if r.run_id not in answered]
            if not tunnels and not runs:
                if connection.closed:
                    break
                wire.advance(11)  # past a head or body deadline, or the idle timeout in turn
                continue
            for t in tunnels:
                answered.add(t.run_id)
                edge.frames(t.run_id, error("connection refused"))
            for r in runs:
                answered.add(r.run_id)
                edge.events(r.run_id, RuntimeEvent.failed("model not found"))
            connection.settle()
        wire.advance(200)
        self.check(wire, connection, data)

    def check(self, wire: Wire, connection: Any, data: bytes) -> None:
        head = b"HEAD " in data  # a HEAD request may have been served: no body in its answer
        edge = wire.edge
        self.assertTrue(connection.closed, connection.transport.value()[-200:])
        parsed = parse_responses(connection.transport.value())
        self.assertEqual(parsed.rest, b"", parsed)
        # Nothing is answered after a response that closes the connection.
        closing = [r.header("connection") == "close" for r in parsed.responses]
        self.assertNotIn(True, closing[:-1], parsed)
        for response in parsed.responses:
            self.assertNotEqual(response.status, 500, response)
            self.assertFalse(300 <= response.status < 400, response)  # the API never redirects
            if response.status >= 400 and (response.body or not head):
                self.assertIn("error", json_or_none(response.body) or {}, (data, response))
        for provider in PROVIDERS:
            counters = edge.pool.counters("node-a", provider)
            self.assertEqual(
                (counters["in_flight"], counters["long_in_flight"], counters["queued"]),
                (0, 0, 0),
                provider,
            )
        self.assertEqual(edge.tunnels.active(), [])
        self.assertEqual(edge.runs.active(), [])
        self.assertEqual(wire.site.connections.total, 0)
        self.assertEqual(wire.clock.getDelayedCalls(), [])

    @settings(
        max_examples=examples(150),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutated(), st.lists(st.integers(1, 40), max_size=4))
    def test_any_head_gets_an_answer_or_a_close(self, data: bytes, pieces: list[int]) -> None:
        self.run_bytes(data, pieces)

    @settings(
        max_examples=examples(100),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(framed(), st.lists(st.integers(1, 40), max_size=3))
    def test_any_framing_gets_an_answer_or_a_close(self, data: bytes, pieces: list[int]) -> None:
        self.run_bytes(data, pieces)

    def test_known_cases(self) -> None:
        # Examples worth keeping whatever the search finds.
        for data in (
            b"",
            b"\r\n",
            b"GET /v1/models HTTP/1.1\r\n\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n",
            b"HEAD /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n",
            b"HEAD /v1/nope HTTP/1.1\r\n\r\n",
        ):
            self.run_bytes(data, [])
