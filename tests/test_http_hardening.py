"""
The client listener against hostile clients, on a real Edge over real sockets: a smuggled request
is refused and never served; slow-header connections are closed at the head deadline while a
normal request is served; at the connection cap new clients get 503 and the admin port answers;
protocol errors (413 and 400 before any body byte, 431, 414, 405 with Allow, a doubled slash)
answer in the surface's JSON shape.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Any

from tests.harness import CLIENT_KEY, Cluster, wait_until

MODELS = (
    f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\r\n"
).encode()


def start(cluster: Cluster, **limits: Any) -> None:
    cluster.write_edge_config(openai=cluster.client_api(**limits))
    cluster.start_edge()


def connect(cluster: Cluster, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(
        ("127.0.0.1", cluster.client_port), timeout=10, source_address=(source, 0)
    )
    return sock


def read_all(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything until the server closes."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def body_of(data: bytes) -> Any:
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def served(cluster: Cluster, what: str) -> int:
    """How many access-log lines the Edge wrote for ``what`` (surface and operation, e.g.
    ``openai models``)."""
    edge = next(d for d in cluster.daemons if d.name == "edge")
    return edge.output().count(f"[iop.edge.access#info] {what} ")


def test_smuggled_request_is_refused_and_never_served(cluster: Cluster) -> None:
    start(cluster)
    smuggling = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {CLIENT_KEY}\r\n"
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n"
    ).encode() + MODELS
    with connect(cluster) as sock:
        sock.sendall(smuggling)
        data = read_all(sock)
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert status_of(data) == 400
    assert "Transfer-Encoding" in body_of(data)["error"]["message"]
    assert b'"object":"list"' not in data
    # The same GET on its own is served, and logged: the smuggled one was not.
    with connect(cluster) as sock:
        sock.sendall(MODELS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        alone = read_all(sock)
    assert status_of(alone) == 200 and b'"object":"list"' in alone
    wait_until(lambda: served(cluster, "openai models") == 1, 5, "the GET in the access log")
    assert served(cluster, "openai chat") == 0
    # The refusal is logged as what it was: refused by the listener, before any route.
    assert served(cluster, "openai unrouted - \N{RIGHTWARDS ARROW} 400 refused") == 1


def test_slowloris_is_closed_at_the_head_deadline(cluster: Cluster) -> None:
    start(cluster, request_head_timeout_sec=2)
    time.sleep(0.5)
    slow = [connect(cluster) for _ in range(300)]
    opened = time.monotonic()
    for sock in slow:
        sock.setblocking(False)
    answers: dict[int, bytes] = {}
    closed_at: dict[int, float] = {}
    normal: bytes | None = None
    sent = 0
    while len(closed_at) < len(slow) and time.monotonic() - opened < 8:
        for i, sock in enumerate(slow):
            if i in closed_at:
                continue
            try:
                if sent < len(MODELS) - 2:  # never the whole head
                    sock.send(MODELS[sent : sent + 1])
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                closed_at[i] = time.monotonic() - opened
                continue
            if chunk:
                answers[i] = answers.get(i, b"") + chunk
            else:
                closed_at[i] = time.monotonic() - opened
        sent += 1
        if normal is None and time.monotonic() - opened > 0.5:
            # A normal client in the same run is served at once.
            with connect(cluster) as sock:
                sock.sendall(MODELS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
                normal = read_all(sock)
        time.sleep(0.2)  # a byte every 0.2 s: each head would take 14 s
    assert normal is not None and status_of(normal) == 200
    assert len(closed_at) == 300, f"{300 - len(closed_at)} slow connections still open"
    # Closed at the deadline: not before it, and soon after it.
    assert min(closed_at.values()) > 1.5, sorted(closed_at.values())[:5]
    assert max(closed_at.values()) < 4, sorted(closed_at.values())[-5:]
    assert len(answers) == 300 and all(status_of(data) == 408 for data in answers.values())
    assert "did not arrive within 2 s" in body_of(answers[0])["error"]["message"]
    for sock in slow:
        sock.close()


def read_one(sock: socket.socket, timeout: float = 10) -> bytes:
    """One whole response (the Edge's answers are chunked) on a connection that stays open."""
    sock.settimeout(timeout)
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def busy(cluster: Cluster, source: str = "127.0.0.1") -> socket.socket:
    """A client connection that has had one request answered and stays open (kept alive): at
    the total cap it is never closed to make room, as one that sent no head may be."""
    sock = connect(cluster, source)
    sock.sendall(MODELS)
    assert status_of(read_one(sock)) == 200
    return sock


def test_connection_cap_answers_503_and_admin_still_answers(cluster: Cluster) -> None:
    start(cluster, max_connections=12, max_connections_per_peer=8, request_head_timeout_sec=30)
    # The harness's probe of the client port counts until the Edge reads its close.
    time.sleep(0.5)
    held = [busy(cluster) for _ in range(8)]
    with connect(cluster) as sock:  # a ninth from the same address
        sock.sendall(MODELS)
        data = read_all(sock)
    assert status_of(data) == 503, data
    assert b"retry-after: 1" in data.lower()
    assert "from this address" in body_of(data)["error"]["message"]
    held += [busy(cluster, "127.0.0.2") for _ in range(4)]
    with connect(cluster, "127.0.0.3") as sock:  # the thirteenth in all
        sock.sendall(MODELS)
        data = read_all(sock)
    assert status_of(data) == 503, data
    assert body_of(data)["error"]["type"] == "server_error"
    # The admin listener is not counted against the client cap.
    with urllib.request.urlopen(cluster.admin + "/status", timeout=5) as response:
        assert response.status == 200
    # A held connection is still served, and a freed slot is a slot again.
    held[0].sendall(MODELS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert status_of(read_all(held[0])) == 200
    held[0].close()

    def served_again() -> bool:
        with connect(cluster) as sock:
            sock.sendall(MODELS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            return status_of(read_all(sock)) == 200

    wait_until(served_again, 5, "a freed slot")
    for sock in held:
        sock.close()


def chat_head(auth: str, length: str) -> bytes:
    return f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}{length}\r\n\r\n".encode()


def exchange(cluster: Cluster, raw: bytes) -> bytes:
    with connect(cluster) as sock:
        sock.sendall(raw)
        return read_all(sock)


def test_protocol_errors_answer_in_the_surface_shape(cluster: Cluster) -> None:
    """Items 2, 4 and 5 of the hardening over a real socket: each refusal is JSON, then a close."""
    start(cluster, max_body_bytes=4096)
    auth = f"Authorization: Bearer {CLIENT_KEY}\r\n"
    started = time.monotonic()
    # A body announced over the limit, or a length that is not a decimal: refused before any
    # body byte is sent (the client here never sends one).
    too_large = exchange(
        cluster,
        chat_head(auth, "Content-Length: 100000"),
    )
    assert status_of(too_large) == 413, too_large
    assert body_of(too_large)["error"]["type"] == "invalid_request_error"
    not_decimal = exchange(
        cluster,
        chat_head(auth, "Content-Length: 1e20"),
    )
    assert status_of(not_decimal) == 400, not_decimal
    assert time.monotonic() - started < 5  # at once, not at a deadline
    # A header over 16 KiB on the Anthropic surface: 431 in its shape.
    huge = exchange(
        cluster,
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 20000}\r\n\r\n".encode(),
    )
    assert status_of(huge) == 431, huge[:200]
    assert body_of(huge)["type"] == "error"
    long_line = exchange(cluster, f"GET /v1/models/{'m' * 20000} HTTP/1.1\r\n\r\n".encode())
    assert status_of(long_line) == 414, long_line[:200]
    # A lowercase method is not GET: 405 with the route's Allow.
    lowercase = exchange(cluster, f"get /v1/models HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    assert status_of(lowercase) == 405, lowercase
    assert b"\r\nAllow: GET" in lowercase or b"\r\nallow: GET" in lowercase.lower(), lowercase
    # A doubled slash is not a route: 404 JSON, never a Location-less redirect.
    doubled = exchange(
        cluster,
        f"POST /v1//chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 2\r\n"
        "Connection: close\r\n\r\n{}".encode(),
    )
    assert status_of(doubled) == 404, doubled
    assert b"location:" not in doubled.lower()
    assert b'"message":"no route for POST /v1//chat/completions"' in doubled
