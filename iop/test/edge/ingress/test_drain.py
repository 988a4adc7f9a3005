"""
The client API's drain when the Edge stops (iop.edge.ingress.drain): the listener closes after
accepting what it had queued, idle connections close, a request being served finishes with
``Connection: close``, and at the bound what is left is cut with its work cancelled.
"""

from __future__ import annotations

import json

from twisted.internet.testing import EventLoggingObserver
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.drain import CUT_GRACE_SEC, POLL_SEC, Drain
from iop.edge.tunnel import CANCEL_GRACE_SEC
from iop.test.edge.ingress.harness import END, KEY, body, start
from iop.test.edge.ingress.wire import Connection, Wire

AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: edge\r\n" + AUTH + b"\r\n"


def chat_request(stream: bool = False) -> bytes:
    data = json.dumps(
        {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
        + AUTH
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
    ) + data


class FakePort:
    """A listening port whose accept queue holds ``queued`` connections."""

    def __init__(self, wire: Wire, queued: int) -> None:
        self.wire = wire
        self.queued = queued
        self.connected = True
        self.disconnecting = False
        self.calls: list[str] = []
        self.accepted: list[Connection] = []

    def doRead(self) -> None:
        self.calls.append("accept")
        while self.queued:
            self.queued -= 1
            self.accepted.append(self.wire.connect("192.0.2.9"))

    def stopListening(self) -> None:
        self.calls.append("close")
        self.connected = False
        self.disconnecting = True

    def startReading(self) -> None:
        pass


class DrainCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.wire = Wire()
        self.edge = self.wire.edge
        self.drain = Drain(self.wire.clock, lambda: self.edge.app.active)
        self.drain.attach(self.wire.site)
        self.port = FakePort(self.wire, 0)
        self.wire.site.listening(self.port)
        self.logged = EventLoggingObserver()
        globalLogPublisher.addObserver(self.logged)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged)

    def run_drain(self, timeout: float = 30.0) -> list[object]:
        fired: list[object] = []
        self.drain.run(timeout).addCallback(fired.append)
        return fired

    def lines(self) -> list[str]:
        return [
            e["log_format"].split(":")[0]
            for e in self.logged
            if e.get("log_namespace") == "iop.edge.ingress.drain.Drain"
        ]

    def advance(self, seconds: float) -> None:
        self.wire.advance(seconds)


class DrainTests(DrainCase):
    def test_nothing_in_flight(self) -> None:
        """No connection: the listener closes and the drain is done at once."""
        fired = self.run_drain()
        self.assertEqual(fired, [None])
        self.assertEqual(self.port.calls, ["accept", "close"])
        self.assertEqual(self.lines(), ["draining", "drained in {elapsed"])

    def test_queued_connections_are_accepted_then_served(self) -> None:
        """What the kernel queued on the closing listener is accepted before it closes, and
        its request is served with Connection: close."""
        self.port.queued = 2
        fired = self.run_drain()
        self.assertEqual(self.port.calls, ["accept", "accept", "close"])
        self.assertEqual(len(self.port.accepted), 2)
        self.assertEqual(fired, [])
        first, second = self.port.accepted
        first.send(MODELS)
        [response] = first.responses()
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header("connection"), "close")
        self.assertTrue(first.closed)
        second.hang_up()
        self.advance(POLL_SEC)
        self.assertEqual(fired, [None])

    def test_an_idle_kept_alive_connection_closes_at_once(self) -> None:
        connection = self.wire.connect()
        connection.send(MODELS)
        self.assertEqual(connection.only().status, 200)
        self.assertFalse(connection.closed)
        fired = self.run_drain()
        connection.settle()
        self.assertTrue(connection.closed)
        self.advance(POLL_SEC)
        self.assertEqual(fired, [None])

    def test_a_request_not_answered_yet_is_answered_with_close(self) -> None:
        """A request waiting on its node when the drain starts is answered, then closed."""
        connection = self.wire.connect()
        connection.send(chat_request())
        run_id = self.edge.tunnel_request().run_id
        fired = self.run_drain()
        self.advance(1.0)
        self.assertEqual(fired, [])
        self.assertFalse(connection.closed)
        self.edge.frames(run_id, start(), body(b'{"id":"x","choices":[]}'), END)
        connection.settle()
        response = connection.only()
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header("connection"), "close")
        self.assertTrue(connection.closed)
        self.advance(POLL_SEC)
        self.assertEqual(fired, [None])
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(self.lines(), ["draining", "drained in {elapsed"])

    def test_a_stream_in_flight_finishes(self) -> None:
        """A stream already started is carried to its end, then its connection closes."""
        connection = self.wire.connect()
        connection.send(chat_request(stream=True))
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(content_type="text/event-stream"), body(b"data: {}\n\n"))
        fired = self.run_drain()
        self.advance(10.0)
        self.assertEqual(fired, [])
        self.edge.frames(run_id, body(b"data: [DONE]\n\n"), END)
        connection.settle()
        self.assertTrue(connection.closed)
        self.assertIn(b"data: [DONE]", connection.transport.value())
        self.advance(POLL_SEC)
        self.assertEqual(fired, [None])
        self.assertEqual(self.edge.cancels(), [])

    def test_at_the_bound_what_is_left_is_cut_and_cancelled(self) -> None:
        connection = self.wire.connect()
        connection.send(chat_request(stream=True))
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(content_type="text/event-stream"), body(b"data: {}\n\n"))
        self.assertEqual(self.edge.in_flight(), 1)
        fired = self.run_drain(timeout=5.0)
        self.advance(5.0)
        self.assertTrue(connection.transport.disconnected)  # aborted
        connection.settle()
        self.advance(POLL_SEC)
        self.assertEqual(self.edge.cancels(), [run_id])
        self.assertEqual(fired, [])
        # The node never answers the cancel: the Edge ends the work after the cancel's grace.
        self.advance(CANCEL_GRACE_SEC)
        self.advance(POLL_SEC)
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(fired, [None])
        [done] = [e for e in self.logged if e.get("log_format", "").startswith("drained")]
        self.assertEqual(done["log_level"], LogLevel.warn)
        self.assertEqual((done["cut"], done["requests"]), (1, 1))

    def test_a_handler_that_never_ends_is_given_up_on(self) -> None:
        """After the cut the drain waits CUT_GRACE_SEC for handlers, no longer."""
        connection = self.wire.connect()
        connection.send(chat_request(stream=True))
        self.edge.app.active += 1  # a handler stuck somewhere
        fired = self.run_drain(timeout=1.0)
        self.advance(1.0)
        connection.settle()
        self.advance(CUT_GRACE_SEC)
        self.advance(POLL_SEC)
        self.assertEqual(fired, [None])

    def test_a_second_run_shares_the_first(self) -> None:
        connection = self.wire.connect()
        connection.send(chat_request())
        first, second = self.run_drain(), self.run_drain()
        self.assertEqual((first, second), ([], []))
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(), body(b'{"id":"x","choices":[]}'), END)
        connection.settle()
        self.advance(POLL_SEC)
        self.assertEqual((first, second), ([None], [None]))
        self.assertEqual(self.run_drain(), [None])

    def test_without_a_listener(self) -> None:
        drain = Drain(self.wire.clock, lambda: 0)
        fired: list[object] = []
        drain.run(30).addCallback(fired.append)
        self.assertEqual(fired, [None])
