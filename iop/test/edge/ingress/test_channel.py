# -*- test-case-name: iop.test.edge.ingress.test_channel -*-
"""
The client connection (:mod:`iop.edge.ingress.channel`) fed raw bytes: framing that could
smuggle a request, sizes, methods, deadlines on the clock, connection caps, JSON errors.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.descriptors import ClientCaps
from iop.edge.ingress.channel import ABORT_AFTER_SEC, EVICT_AFTER_SEC, ConnectionCounter
from iop.test.edge.ingress.harness import BODY_LIMIT, KEY
from iop.test.edge.ingress.wire import Connection, Response, Wire, parse_responses

AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"


def post(path: str, headers: bytes, body: bytes = b"") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode() + AUTH + headers + b"\r\n" + body


def chat(headers: bytes, body: bytes = b"") -> bytes:
    return post("/v1/chat/completions", b"Content-Type: application/json\r\n" + headers, body)


class ChannelCase(SynchronousTestCase):
    limits: dict[str, Any] = {}

    def setUp(self) -> None:
        self.wire = Wire(**self.limits)

    def exchange(self, data: bytes, peer: str = "192.0.2.1") -> Connection:
        connection = self.wire.connect(peer)
        connection.send(data)
        return connection

    def assertRefused(
        self, connection: Connection, status: int, fragment: str = "", surface: str = "openai"
    ) -> Response:
        """One JSON error answer in ``surface``'s shape, then the connection closed."""
        response = connection.only()
        self.assertEqual(response.status, status, response)
        self.assertEqual(response.header("content-type"), "application/json")
        self.assertEqual(response.header("connection"), "close")
        body = response.json()
        # The request's id, in the body and the headers (a new one: these send none).
        self.assertEqual(response.header("x-request-id"), body["request_id"])
        self.assertTrue(body["request_id"].startswith("req_"), body)
        if surface == "openai":
            self.assertEqual(set(body), {"error", "request_id"})
            self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
            message = body["error"]["message"]
        else:
            self.assertEqual(set(body), {"type", "error", "request_id"})
            self.assertEqual(response.header("request-id"), body["request_id"])
            message = body["error"]["message"]
        self.assertIn(fragment, message)
        self.assertTrue(connection.closed)
        self.assertEqual(connection.parsed().rest, b"")
        return response


class SmugglingTests(ChannelCase):
    def test_two_transfer_encoding_lines_hide_nothing(self) -> None:
        hidden = MODELS
        connection = self.exchange(
            chat(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", b"0\r\n\r\n")
            + hidden
        )
        self.assertRefused(connection, 400, "more than once")
        self.assertEqual(self.wire.served(), 0)

    def test_transfer_codings_other_than_chunked(self) -> None:
        for value in (
            b"identity",
            b"gzip, chunked",
            b"chunked, chunked",
            b"chunked;x",
            b"xchunked",
            b"",
            b"chunked\x0b",
        ):
            connection = self.exchange(chat(b"Transfer-Encoding: " + value + b"\r\n", b"0\r\n\r\n"))
            self.assertRefused(connection, 400, "", "openai")
        self.assertEqual(self.wire.served(), 0)

    def test_transfer_encoding_with_content_length(self) -> None:
        for headers in (
            b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        ):
            connection = self.exchange(chat(headers, b"0\r\n\r\n" + MODELS))
            self.assertRefused(connection, 400, "together")
        self.assertEqual(self.wire.served(), 0)

    def test_transfer_encoding_on_http_1_0(self) -> None:
        data = chat(b"Transfer-Encoding: chunked\r\n", b"0\r\n\r\n").replace(
            b"HTTP/1.1", b"HTTP/1.0"
        )
        self.assertRefused(self.exchange(data), 400, "HTTP/1.1")

    def test_whitespace_before_the_colon(self) -> None:
        connection = self.exchange(chat(b"Transfer-Encoding : chunked\r\n", b"0\r\n\r\n" + MODELS))
        self.assertRefused(connection, 400, "malformed header")
        self.assertEqual(self.wire.served(), 0)

    def test_content_length_not_a_plain_decimal(self) -> None:
        for value in (b"1e20", b"+5", b"5, 5", b"-1", b"0x10", b"5 5", b"", "\u0665".encode()):
            connection = self.exchange(chat(b"Content-Length: " + value + b"\r\n", b"{}"))
            self.assertRefused(connection, 400, "Content-Length")
        self.assertEqual(self.wire.served(), 0)

    def test_repeated_content_length(self) -> None:
        for second in (b"2", b"3"):
            headers = b"Content-Length: 2\r\nContent-Length: " + second + b"\r\n"
            self.assertRefused(self.exchange(chat(headers, b"{}")), 400, "more than once")
        self.assertEqual(self.wire.served(), 0)

    def test_chunked_alone_is_served(self) -> None:
        body = json.dumps(
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
        ).encode()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        connection = self.exchange(chat(b"Transfer-Encoding: Chunked\r\n", chunked))
        self.assertEqual([r.status for r in connection.responses()], [404])
        self.assertEqual(self.wire.served(), 1)


class BodyLimitTests(ChannelCase):
    def test_declared_length_over_the_limit_at_once(self) -> None:
        for length in (b"%d" % (BODY_LIMIT + 1), b"1" + b"0" * 20, b"9" * 5000):
            connection = self.exchange(chat(b"Content-Length: " + length + b"\r\n"))
            self.assertRefused(connection, 413, str(BODY_LIMIT))
        self.assertEqual(self.wire.served(), 0)
        # Leading zeros are still a decimal.
        body = b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}'
        connection = self.exchange(
            chat(b"Content-Length: %s\r\n" % (b"0" * 50 + b"%d" % len(body)), body)
        )
        self.assertEqual([r.status for r in connection.responses()], [404])

    def test_no_100_continue_for_a_body_refused(self) -> None:
        connection = self.exchange(
            chat(b"Expect: 100-continue\r\nContent-Length: %d\r\n" % (BODY_LIMIT + 1))
        )
        self.assertNotIn(b"100 Continue", connection.transport.value())
        self.assertRefused(connection, 413)

    def test_a_chunk_size_over_the_limit_before_its_data(self) -> None:
        connection = self.exchange(chat(b"Transfer-Encoding: chunked\r\n", b"FFFFFFFFFF\r\n"))
        self.assertRefused(connection, 413)

    def test_chunks_adding_up_over_the_limit(self) -> None:
        chunk = b"x" * 4096
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))
        connection = self.exchange(chat(b"Transfer-Encoding: chunked\r\n", chunks + b"0\r\n\r\n"))
        self.assertRefused(connection, 413)
        self.assertEqual(self.wire.served(), 0)

    def test_at_the_limit_is_read(self) -> None:
        start = b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]'
        body = start + b" " * (BODY_LIMIT - len(start) - 1) + b"}"
        self.assertEqual(len(body), BODY_LIMIT)
        connection = self.exchange(chat(b"Content-Length: %d\r\n" % len(body), body))
        self.assertEqual([r.status for r in connection.responses()], [404])

    def test_malformed_chunks(self) -> None:
        for chunks in (b"zz\r\n", b"5\r\nabcdeXX", b"-5\r\n"):
            connection = self.exchange(chat(b"Transfer-Encoding: chunked\r\n", chunks))
            self.assertRefused(connection, 400, "malformed")


class SizeTests(ChannelCase):
    def test_request_line_too_long(self) -> None:
        line = b"GET /v1/models?" + b"a" * 20000 + b" HTTP/1.1\r\n"
        self.assertRefused(self.exchange(line), 414, "request line")
        # Not even a line end yet.
        self.assertRefused(self.exchange(b"GET /" + b"a" * 17000), 414)

    def test_header_line_too_long(self) -> None:
        data = b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n"
        self.assertRefused(self.exchange(data), 431, "header")

    def test_headers_too_large_together(self) -> None:
        headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(20))
        self.assertRefused(self.exchange(b"GET /v1/models HTTP/1.1\r\n" + headers + b"\r\n"), 431)

    def test_too_many_header_fields(self) -> None:
        headers = b"".join(b"X: %d\r\n" % i for i in range(600))
        self.assertRefused(self.exchange(b"GET /v1/models HTTP/1.1\r\n" + headers + b"\r\n"), 431)

    def test_malformed_heads(self) -> None:
        for data in (
            b"GET /v1/models\r\n\r\n",
            b"GET /v1/models HTTP/2.0\r\n\r\n",
            b"GET  /v1/models HTTP/1.1\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nX: a\x00b\r\n\r\n",
            b"\r\n\r\n",
        ):
            self.assertRefused(self.exchange(data), 400, "malformed")
        self.assertEqual(self.wire.served(), 0)

    def test_the_anthropic_shape(self) -> None:
        self.assertRefused(
            self.exchange(b"POST /v1/messages HTTP/1.1\r\nbad\r\n\r\n"), 400, "", "anthropic"
        )
        data = b"GET /v1/models HTTP/1.1\r\nanthropic-version: 2023-06-01\r\nX: \x00\r\n\r\n"
        self.assertRefused(self.exchange(data), 400, "", "anthropic")
        data = b"GET /v1/models HTTP/1.1\r\nanthropic-version: 1\r\nX: " + b"a" * 17000
        self.assertRefused(self.exchange(data), 431, "", "anthropic")


class MethodTests(ChannelCase):
    def test_405_names_the_allowed_methods(self) -> None:
        connection = self.exchange(b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        response = connection.only()
        self.assertEqual((response.status, response.header("allow")), (405, "POST"))
        self.assertEqual(set(response.json()), {"error", "request_id"})
        connection = self.exchange(b"POST /v1/models HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        response = connection.only()
        self.assertEqual((response.status, response.header("allow")), (405, "GET, HEAD"))
        connection = self.exchange(b"DELETE /v1/messages HTTP/1.1\r\n\r\n")
        response = connection.only()
        self.assertEqual((response.status, response.header("allow")), (405, "POST"))
        self.assertEqual(response.json()["type"], "error")

    def test_a_lowercase_or_unknown_method_is_not_served(self) -> None:
        for method in (b"get", b"Get", b"BREW", b"OPTIONS", b"PUT"):
            connection = self.exchange(
                method + b" /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
            )
            response = self.assertRefused(connection, 405)
            self.assertEqual(response.header("allow"), "GET, HEAD")
        self.assertRefused(self.exchange(b"get /nope HTTP/1.1\r\n\r\n"), 404, "no route")
        self.assertEqual(self.wire.served(), 0)

    def test_request_targets(self) -> None:
        for target in (b"*", b"edge:443", b"v1/models"):
            connection = self.exchange(b"OPTIONS " + target + b" HTTP/1.1\r\n\r\n")
            self.assertRefused(connection, 400, "must be a path")
        connection = self.exchange(MODELS.replace(b"/v1/models", b"http://edge/v1/models"))
        self.assertEqual([r.status for r in connection.responses()], [200])

    def test_merged_slashes_are_not_found(self) -> None:
        connection = self.exchange(
            chat(b"Content-Length: 2\r\n", b"{}").replace(b"/v1/chat", b"/v1//chat")
        )
        response = connection.only()
        self.assertEqual(response.status, 404)
        self.assertIsNone(response.header("location"))
        self.assertIn("no route", response.json()["error"]["message"])

    def test_pipelined_requests_are_served_in_turn(self) -> None:
        connection = self.exchange(MODELS * 3)
        self.assertEqual([r.status for r in connection.responses()], [200, 200, 200])
        self.assertFalse(connection.closed)


class DeadlineTests(ChannelCase):
    limits = {"request_head_timeout_sec": 10.0, "request_body_timeout_sec": 10.0,
              "request_body_min_rate": 1000, "idle_timeout_sec": 60.0}  # fmt: skip

    def test_a_silent_connection_is_timed_out(self) -> None:
        connection = self.wire.connect()
        self.wire.advance(9.9)
        self.assertFalse(connection.closed)
        self.wire.advance(0.2)
        self.assertRefused(connection, 408, "10 s")
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_a_head_one_byte_a_second(self) -> None:
        connection = self.wire.connect()
        for byte in MODELS[:15]:
            connection.send(bytes([byte]))
            self.wire.advance(1)
        self.assertRefused(connection, 408, "head")
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])
        self.assertEqual(self.wire.served(), 0)

    def test_a_kept_alive_connection_gets_a_fresh_head_deadline(self) -> None:
        connection = self.exchange(MODELS)
        self.assertEqual(len(connection.responses()), 1)
        self.wire.advance(30)  # idle, under the idle timeout: no head deadline yet
        self.assertFalse(connection.closed)
        connection.send(MODELS[:10])
        self.wire.advance(9)
        connection.send(MODELS[10:])
        self.assertEqual([r.status for r in connection.responses()], [200, 200])
        # Idle past the idle timeout: closed without an answer.
        self.wire.advance(60.1)
        self.assertTrue(connection.closed)
        self.assertEqual(len(connection.responses()), 2)
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_a_body_that_stops(self) -> None:
        connection = self.exchange(chat(b"Content-Length: 5000\r\n", b"x" * 1000))
        # 10 s, plus one second per 1000 bytes received.
        self.wire.advance(10.9)
        self.assertFalse(connection.closed)
        self.wire.advance(0.2)
        self.assertRefused(connection, 408, "too slowly")
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_a_body_at_the_minimum_rate_is_read(self) -> None:
        body = (
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]' + b" " * 7000 + b"}"
        )
        connection = self.exchange(chat(b"Content-Length: %d\r\n" % len(body)))
        for offset in range(0, len(body), 1000):
            self.wire.advance(0.99)
            connection.send(body[offset : offset + 1000])
        self.assertEqual([r.status for r in connection.responses()], [404])

    def test_a_body_trickling(self) -> None:
        connection = self.exchange(chat(b"Transfer-Encoding: chunked\r\n"))
        for _ in range(30):
            connection.send(b"1\r\nx\r\n")
            self.wire.advance(1)
        self.assertRefused(connection, 408)

    def test_a_client_that_does_not_go_away_is_aborted(self) -> None:
        connection = self.wire.connect()
        self.wire.clock.advance(10)
        self.assertTrue(connection.transport.disconnecting)
        self.wire.clock.advance(ABORT_AFTER_SEC)
        self.assertTrue(connection.transport.disconnected)  # abortConnection
        connection.settle()
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_the_app_time_is_not_limited(self) -> None:
        import json as _json

        body = _json.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        connection = self.exchange(chat(b"Content-Length: %d\r\n" % len(body), body))
        self.wire.advance(25)  # the run is on the node: no head/body/idle deadline applies
        self.assertFalse(connection.closed)
        self.assertEqual(connection.responses(), [])
        connection.hang_up()


class ConnectionCapTests(ChannelCase):
    limits = {"max_connections": 3, "max_connections_per_peer": 2}

    def test_caps(self) -> None:
        a1, a2 = self.wire.connect("192.0.2.1"), self.wire.connect("192.0.2.1")
        a3 = self.wire.connect("192.0.2.1")
        response = self.assertRefused(a3, 503, "from this address")
        self.assertEqual(response.header("retry-after"), "1")
        self.assertEqual(response.json()["error"]["type"], "server_error")
        b1 = self.wire.connect("198.51.100.7")
        c1 = self.wire.connect("203.0.113.9")
        self.assertRefused(c1, 503, "limit")
        self.assertEqual(self.wire.site.connections.total, 3)
        for connection in (a1, a2, b1):
            self.assertFalse(connection.closed)
        # A slot freed is a slot again.
        a1.hang_up()
        a4 = self.wire.connect("192.0.2.1")
        a4.send(MODELS)
        self.assertEqual([r.status for r in a4.responses()], [200])
        for connection in (a2, b1, a4):
            connection.hang_up()
        self.assertEqual(
            (self.wire.site.connections.total, self.wire.site.connections.by_peer), (0, {})
        )
        self.wire.advance(ABORT_AFTER_SEC)
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_counter(self) -> None:
        counter = ConnectionCounter(2, 1)
        self.assertIsNone(counter.acquire("a"))
        self.assertIsNotNone(counter.acquire("a"))
        self.assertIsNone(counter.acquire("b"))
        self.assertIsNotNone(counter.acquire("c"))
        counter.release("a")
        self.assertEqual(counter.by_peer, {"b": 1})


class HalfClosable(StringTransport):
    """A transport that can send its FIN and keep reading, as TCP's can."""

    write_closed = False
    reading = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True

    def resumeProducing(self) -> None:
        self.reading = True


class LingeringCloseTests(ChannelCase):
    def connect(self) -> tuple[object, HalfClosable]:
        transport = HalfClosable(peerAddress=IPv4Address("TCP", "192.0.2.1", 40000))
        channel: Any = self.wire.site.buildProtocol(transport.getPeer())
        channel.makeConnection(transport)
        return channel, transport

    def test_answer_fin_then_read_until_the_client_closes(self) -> None:
        channel: Any
        channel, transport = self.connect()
        channel.dataReceived(b"GET / HTTP/1.1\r\nbad\r\n\r\nmore bytes the client sent")
        self.assertTrue(transport.write_closed)
        self.assertTrue(transport.reading)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(parse_responses(transport.value()).responses[0].status, 400)
        channel.dataReceived(b"still more")  # read and dropped
        channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])
        self.assertEqual(self.wire.site.connections.total, 0)

    def test_a_client_that_never_closes_is_aborted(self) -> None:
        channel: Any
        channel, transport = self.connect()
        self.wire.clock.advance(10)  # the head deadline
        self.assertTrue(transport.write_closed)
        self.wire.clock.advance(ABORT_AFTER_SEC)
        self.assertTrue(transport.disconnected)
        channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])


class Port:
    """The listening port's reading switch, as the counter uses it."""

    connected = True
    disconnecting = False

    def __init__(self) -> None:
        self.reading = True
        self.switches: list[bool] = []

    def stopReading(self) -> None:
        self.reading = False
        self.switches.append(False)

    def startReading(self) -> None:
        self.reading = True
        self.switches.append(True)


class DescriptorCapTests(ChannelCase):
    """At most ``descriptors`` connections held, served or being refused; at the total cap a
    connection that never sent a whole head makes room for a new one."""

    def setUp(self) -> None:
        self.wire = Wire(caps=ClientCaps(4, 2, 2))
        self.port = Port()
        self.wire.site.listening(self.port)
        self.counter = self.wire.site.connections

    def open(self, peer: str) -> tuple[Any, HalfClosable]:
        transport = HalfClosable(peerAddress=IPv4Address("TCP", peer, 40000))
        channel: Any = self.wire.site.buildProtocol(transport.getPeer())
        self.assertIsNotNone(channel)
        channel.makeConnection(transport)
        return channel, transport

    def status(self, transport: HalfClosable) -> list[int]:
        return [r.status for r in parse_responses(transport.value()).responses]

    def test_refusals_hold_descriptors_and_the_port_pauses_at_the_cap(self) -> None:
        a1, _ = self.open("192.0.2.1")
        a2, _ = self.open("192.0.2.1")
        a3, t3 = self.open("192.0.2.1")  # past the per-peer cap
        b1, t4 = self.open("198.51.100.7")  # past the total cap, nobody to evict yet
        self.assertEqual((self.status(t3), self.status(t4)), ([503], [503]))
        self.assertIn(b"from this address", t3.value())
        self.assertEqual((self.counter.total, self.counter.descriptors), (2, 4))
        # Both refusals linger (answer, FIN, read until the client closes): still held. The
        # next accepted socket is closed at once, unanswered, and the port stops reading.
        transport = HalfClosable(peerAddress=IPv4Address("TCP", "203.0.113.9", 40000))
        self.assertIsNone(self.wire.site.buildProtocol(transport.getPeer()))
        self.assertIsNone(self.wire.site.buildProtocol(transport.getPeer()))
        self.assertEqual(self.port.switches, [False])
        self.assertEqual(self.counter.descriptors, 4)
        # A refused client goes away: the port reads again.
        a3.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.port.switches, [False, True])
        self.assertEqual(self.counter.descriptors, 3)
        self.wire.clock.advance(ABORT_AFTER_SEC)  # the other refusal is aborted
        self.assertTrue(t4.disconnected)
        b1.connectionLost(Failure(ConnectionDone()))
        for channel in (a1, a2):
            channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual((self.counter.total, self.counter.descriptors), (0, 0))
        self.assertEqual(self.counter.waiting, {})
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_a_port_stopped_while_paused_stays_stopped(self) -> None:
        channels = [self.open("192.0.2.1")[0], self.open("192.0.2.1")[0]]
        channels += [self.open("192.0.2.2")[0], self.open("192.0.2.3")[0]]  # refused, held
        self.assertIsNone(self.wire.site.buildProtocol(IPv4Address("TCP", "192.0.2.4", 1)))
        self.port.disconnecting = True  # the service stops: stopListening
        for channel in channels:
            channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.port.switches, [False])
        self.assertEqual(self.counter.descriptors, 0)

    def test_a_connection_without_a_head_makes_room_at_the_total_cap(self) -> None:
        slow, slow_t = self.open("192.0.2.1")
        slow.dataReceived(MODELS[:10])  # a partial head: still evictable
        kept, kept_t = self.open("192.0.2.2")
        kept.dataReceived(MODELS)  # answered, kept alive: no longer evictable
        self.wire.edge.flush()
        self.assertEqual(self.status(kept_t), [200])
        self.wire.clock.advance(EVICT_AFTER_SEC)
        fresh, fresh_t = self.open("198.51.100.7")
        # The oldest connection without a whole head is answered 503 and gives up its slot.
        self.assertEqual(self.status(slow_t), [503])
        self.assertIn(b"connection limit", slow_t.value())
        self.assertTrue(slow_t.write_closed)
        self.assertEqual(self.counter.by_peer, {"192.0.2.2": 1, "198.51.100.7": 1})
        fresh.dataReceived(MODELS)
        self.wire.edge.flush()
        self.assertEqual(self.status(fresh_t), [200])
        # With no connection left waiting for its head, the next one is refused.
        self.wire.clock.advance(EVICT_AFTER_SEC)
        late, late_t = self.open("203.0.113.9")
        self.assertEqual(self.status(late_t), [503])
        self.assertIn(b"client connections, its limit", late_t.value())
        self.assertEqual(self.status(kept_t), [200])
        for channel in (slow, kept, fresh, late):
            channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual((self.counter.total, self.counter.descriptors), (0, 0))
        self.assertEqual(self.wire.clock.getDelayedCalls(), [])

    def test_a_young_connection_is_not_evicted(self) -> None:
        first, _ = self.open("192.0.2.1")
        second, _ = self.open("192.0.2.2")
        self.wire.clock.advance(EVICT_AFTER_SEC / 2)
        third, third_t = self.open("192.0.2.3")
        self.assertEqual(self.status(third_t), [503])
        self.assertEqual(self.counter.total, 2)
        for channel in (first, second, third):
            channel.connectionLost(Failure(ConnectionDone()))
        self.wire.clock.advance(ABORT_AFTER_SEC)
        self.assertEqual(self.counter.descriptors, 0)


class RecordedRefusalTests(ChannelCase):
    limits = {"request_head_timeout_sec": 10.0, "idle_timeout_sec": 60.0, "max_body_bytes": 100}

    def test_each_refusal_is_recorded_once_and_an_idle_close_is_not(self) -> None:
        self.exchange(MODELS + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
        self.wire.advance(60.1)  # idle after two answers: closed, not a refusal
        self.exchange(chat(b"Content-Length: 101\r\n"))
        slow = self.wire.connect()
        slow.send(MODELS[:5])
        self.wire.advance(2)
        self.wire.advance(9)
        self.exchange(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
        )
        records = self.wire.edge.records
        self.assertEqual([r.operation for r in records[:2]], ["models", "models"])
        refusals = records[2:]
        self.assertEqual(
            [(r.surface, r.operation, r.status, r.outcome, r.error_code) for r in refusals],
            [
                ("openai", "unrouted", 413, "refused", "request_too_large"),
                ("openai", "unrouted", 408, "refused", "request_timeout"),
                ("anthropic", "unrouted", 400, "refused", "bad_request"),
            ],
        )
        self.assertAlmostEqual(refusals[1].duration, 11.0)


class FormBodyTests(ChannelCase):
    def test_a_form_body_is_not_parsed_and_gets_the_surface_error(self) -> None:
        for content_type in (
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
        ):
            body = b"not a multipart body"
            headers = b"Content-Type: " + content_type + b"\r\nContent-Length: %d\r\n" % len(body)
            connection = self.exchange(post("/v1/chat/completions", headers, body))
            [response] = connection.responses()
            self.assertEqual(response.status, 400, content_type)
            error = response.json()["error"]
            # The app's answer (the body is not JSON), not a refusal before it.
            self.assertEqual(error["code"], "invalid_json", content_type)
