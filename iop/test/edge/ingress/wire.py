# -*- test-case-name: iop.test.edge.ingress.test_channel -*-
"""
Raw bytes to the client listener and back, in memory: :class:`Wire` builds the real
:class:`~iop.edge.ingress.http.ClientSite` over an :class:`~iop.test.edge.ingress.harness.Ingress`
(its clock, its recording resource), opens connections on ``StringTransport`` from a given peer
address, and :func:`parse_responses` reads what came back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from iop.config.model import CorsConfig
from iop.edge.descriptors import ClientCaps
from iop.edge.ingress.http import ClientSite
from iop.test.edge.ingress.harness import Ingress


@dataclass
class Response:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Parsed:
    responses: list[Response] = field(default_factory=list)
    rest: bytes = b""  # bytes that are not (yet) a whole response


def parse_responses(data: bytes) -> Parsed:
    """Every whole HTTP/1.1 response in ``data`` (``1xx`` interim answers skipped)."""
    parsed = Parsed()
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            break
        lines = data[:end].split(b"\r\n")
        version, status, _ = (lines[0].decode("latin-1") + "  ").split(" ", 2)
        if not version.startswith("HTTP/1.") or not status.isdigit():
            raise AssertionError(f"not an HTTP response: {data[:80]!r}")
        headers: dict[str, list[str]] = {}
        for line in lines[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        rest = data[end + 4 :]
        code = int(status)
        if 100 <= code < 200:
            data = rest
            continue
        if "content-length" in headers:
            length = int(headers["content-length"][0])
            if len(rest) < length:
                break
            body, rest = rest[:length], rest[length:]
        elif headers.get("transfer-encoding") == ["chunked"]:
            body = b""
            while True:
                eol = rest.find(b"\r\n")
                if eol < 0:
                    return parsed
                size = int(rest[:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return parsed
                body += rest[eol + 2 : eol + 2 + size]
                rest = rest[eol + 2 + size + 2 :]
                if size == 0:
                    break
        elif rest.startswith(b"HTTP/1."):
            body = b""  # an answer to HEAD: no body, and the next response follows
        else:
            body, rest = rest, b""
        parsed.responses.append(Response(code, headers, body))
        data = rest
    parsed.rest = data
    return parsed


class Connection:
    """One client connection: what it sent, what came back, whether the server closed it."""

    def __init__(self, wire: Wire, peer: str) -> None:
        self.wire = wire
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", peer, 40000))
        self.channel: Any = wire.site.buildProtocol(self.transport.getPeer())
        self.lost = False
        self.channel.makeConnection(self.transport)
        self.settle()

    def send(self, data: bytes) -> None:
        if not self.lost:
            self.channel.dataReceived(data)
        self.wire.edge.flush()
        self.settle()

    def settle(self) -> None:
        """A transport the server asked to close, closes (as a socket would once flushed)."""
        if self.transport.disconnecting and not self.lost:
            self.lost = True
            self.channel.connectionLost(Failure(ConnectionDone()))

    def hang_up(self) -> None:
        """The client goes away."""
        if not self.lost:
            self.lost = True
            self.channel.connectionLost(Failure(ConnectionDone("client went away")))
        self.wire.edge.flush()

    @property
    def closed(self) -> bool:
        return self.lost

    def parsed(self) -> Parsed:
        return parse_responses(self.transport.value())

    def responses(self) -> list[Response]:
        return self.parsed().responses

    def only(self) -> Response:
        """The one response on this connection."""
        responses = self.responses()
        assert len(responses) == 1, responses
        return responses[0]


class Wire:
    """The client listener over an in-memory Edge."""

    def __init__(
        self, cors: CorsConfig | None = None, caps: ClientCaps | None = None, **limits: Any
    ) -> None:
        self.edge = Ingress(cors=cors)
        config = dataclasses.replace(self.edge.config.client_api, **limits)
        self.clock = self.edge.clock
        self.site = ClientSite(
            self.edge.resource,
            config,
            self.clock,
            methods=self.edge.app.methods(),
            allowed_methods=self.edge.app.allowed_methods,
            publish=self.edge.records.append,
            caps=caps,
        )
        self.connections: list[Connection] = []

    def connect(self, peer: str = "192.0.2.1") -> Connection:
        connection = Connection(self, peer)
        self.connections.append(connection)
        return connection

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.edge.flush()
        for connection in self.connections:
            connection.settle()

    def served(self) -> int:
        """How many requests reached the app."""
        return len(self.edge.resource.requests)
