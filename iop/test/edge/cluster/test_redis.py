"""
The cluster's Redis connection (:mod:`iop.edge.cluster.redis`) without a server: the handshake
(AUTH, SELECT) stops the reconnecting only when Redis *refuses* (an error reply); a handshake
that times out or loses its connection — a Redis hung or restarting — drops that connection and
leaves the factory trying again. And the reconnect backoff's cap follows the lease TTL.
"""

from __future__ import annotations

from typing import Any

import txredisapi
from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.cluster.redis import (
    RECONNECT_INITIAL_DELAY,
    RECONNECT_MAX_DELAY,
    _LeaseProtocol,
    reconnect_max_delay,
)


class _Factory:
    """What the handshake tells its factory."""

    def __init__(self) -> None:
        self.stopped = 0
        self.errors: list[str] = []

    def stopTrying(self) -> Deferred[None]:
        self.stopped += 1
        return succeed(None)

    def connectionError(self, why: str) -> None:
        self.errors.append(why)


class _Transport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = 0

    def abortConnection(self) -> None:
        self.aborted += 1


def handshake(
    password: str | None = "pw", dbid: int | None = 2
) -> tuple[_LeaseProtocol, _Factory, _Transport, list[Deferred[Any]], list[Any]]:
    """A protocol mid-handshake: the AUTH/SELECT replies are the returned Deferreds."""
    protocol = _LeaseProtocol(password=password, dbid=dbid, replyTimeout=None)
    factory = _Factory()
    transport = _Transport()
    protocol.factory = factory
    replies: list[Deferred[Any]] = []

    def command(*args: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        replies.append(d)
        return d

    protocol.auth = command  # type: ignore[method-assign]
    protocol.select = command  # type: ignore[method-assign]
    ready: list[Any] = []
    protocol.whenConnected().addCallback(ready.append)
    protocol.makeConnection(transport)
    return protocol, factory, transport, replies, ready


class HandshakeTests(SynchronousTestCase):
    def test_ready_after_auth_and_select(self) -> None:
        protocol, factory, transport, replies, ready = handshake()
        replies[0].callback("OK")
        self.assertEqual(ready, [])
        replies[1].callback("OK")
        self.assertEqual(ready, [protocol])
        self.assertEqual((factory.stopped, factory.errors, transport.aborted), (0, [], 0))

    def test_no_password_no_db_is_ready_at_once(self) -> None:
        protocol, _, _, replies, ready = handshake(password=None, dbid=None)
        self.assertEqual((replies, ready), ([], [protocol]))

    def test_a_wrong_password_stops_the_reconnecting(self) -> None:
        for refusal in ("raised", "returned"):
            _, factory, transport, replies, ready = handshake()
            error = txredisapi.ResponseError("WRONGPASS invalid username-password pair")
            if refusal == "raised":
                replies[0].errback(error)
            else:
                replies[0].callback(error)
            self.assertEqual(ready, [])
            self.assertEqual(factory.stopped, 1)
            self.assertEqual(len(factory.errors), 1)
            self.assertIn("could not auth: WRONGPASS", factory.errors[0])
            self.assertNotIn("pw", factory.errors[0].replace("WRONGPASS", ""))
            self.assertTrue(transport.disconnecting)

    def test_no_such_db_stops_the_reconnecting(self) -> None:
        _, factory, _, replies, ready = handshake()
        replies[0].callback("OK")
        replies[1].errback(txredisapi.ResponseError("ERR DB index is out of range"))
        self.assertEqual((ready, factory.stopped), ([], 1))
        self.assertIn("could not set dbid=2", factory.errors[0])

    def test_an_auth_timeout_drops_only_this_connection(self) -> None:
        """
        The reconnect's AUTH to a hung Redis times out: this connection is dropped and the
        factory keeps trying (before, it stopped for good: the cluster was down until the
        Edges were restarted).
        """
        for failure in (
            TimeoutError("Not received Redis response in 1.6 seconds"),
            txredisapi.ConnectionError("Lost connection"),
        ):
            _, factory, transport, replies, ready = handshake()
            replies[0].errback(failure)
            self.assertEqual(ready, [])
            self.assertEqual((factory.stopped, factory.errors), (0, []))
            self.assertEqual(transport.aborted, 1)

    def test_a_select_timeout_drops_only_this_connection(self) -> None:
        _, factory, transport, replies, _ = handshake()
        replies[0].callback("OK")
        replies[1].errback(TimeoutError("Not received Redis response in 1.6 seconds"))
        self.assertEqual((factory.stopped, transport.aborted), (0, 1))


class BackoffTests(SynchronousTestCase):
    def test_the_cap_follows_the_lease_ttl(self) -> None:
        """A tenth of the TTL, between the first delay and 1 s: a Redis back within a third of
        the TTL is reconnected to in time to renew."""
        self.assertEqual(reconnect_max_delay(10.0), RECONNECT_MAX_DELAY)
        self.assertEqual(reconnect_max_delay(300.0), RECONNECT_MAX_DELAY)
        self.assertAlmostEqual(reconnect_max_delay(5.25), 0.525)
        self.assertEqual(reconnect_max_delay(0.5), RECONNECT_INITIAL_DELAY)
