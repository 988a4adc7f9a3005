# -*- test-case-name: tests.test_cluster_leases -*-
"""
The Edge's connection to the cluster's Redis (``cluster.redis``), with txredisapi: Twisted-native,
so the Edge keeps its reactor; EVALSHA / SCRIPT LOAD, unix sockets, AUTH (with an ACL username)
and SELECT of the db are all it needs.

One connection (commands are pipelined on it; Redis runs them one at a time anyway), kept up by
txredisapi's ClientService: when it is lost the store fails at once (:class:`ClusterUnavailable`)
while it reconnects, backing off from 0.1 s to at most a tenth of the lease TTL (never more than
1 s), so the Edge serves again soon after Redis returns — in time to renew the leases it holds
when Redis was away for less than a third of the TTL.

The handshake (AUTH, SELECT) is ours (:class:`RecoveringHandshake`), not txredisapi's: txredisapi
stops reconnecting for good on *any* failure of it, so a Redis that hung long enough for a
reconnect's AUTH to time out stopped the cluster until the Edges were restarted. Here only a
refusal (an error reply: wrong password, no such db) is final — every operation then fails and
the log says why; a timeout or a connection lost mid-handshake (a Redis hung or restarting) drops
that connection and the next attempt follows with the usual backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import txredisapi
from twisted.internet import task
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import HostnameEndpoint, UNIXClientEndpoint
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.config.cluster import redis_address
from iop.config.model import ClusterConfig, RedisAddress
from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.leases import DEFAULT_TIMEOUT_SEC, RedisLeaseStore

__all__ = [
    "RecoveringHandshake",
    "RedisConnection",
    "WakeSubscription",
    "connect",
    "prepare",
    "reconnect_max_delay",
    "subscribe",
]

# Reconnect backoff (seconds): first retry, then multiplied by e up to the cap
# (:func:`reconnect_max_delay`).
RECONNECT_INITIAL_DELAY = 0.1
RECONNECT_MAX_DELAY = 1.0
# The cap as a share of the lease TTL: a Redis back within a third of the TTL is reconnected to
# (and the leases renewed) well before any lease could be lost.
RECONNECT_TTL_SHARE = 0.1
# The client's reply timeout, as a share of the store's timeout.
REPLY_TIMEOUT_SHARE = 0.8
# How often when_connected looks.
_POLL_SEC = 0.02


def reconnect_max_delay(lease_ttl_sec: float) -> float:
    """The reconnect backoff's cap for a cluster whose leases live ``lease_ttl_sec``."""
    share = lease_ttl_sec * RECONNECT_TTL_SHARE
    return max(RECONNECT_INITIAL_DELAY, min(RECONNECT_MAX_DELAY, share))


class RecoveringHandshake:
    """
    ``connectionMade`` for txredisapi's protocols (mixed in before them): AUTH and SELECT as
    txredisapi sends them, but only Redis's *refusal* (an error reply) stops the factory for
    good. A handshake that times out or loses its connection (Redis hung or restarting) aborts
    this connection, and the factory's ClientService tries again after its backoff.
    """

    # What txredisapi's protocol provides (annotations only: the protocol's own attributes).
    password: str | None
    username: str | None
    dbid: int | None
    factory: Any
    transport: Any
    connected: int
    _ready: bool
    _waiting_for_connect: list[Deferred[Any]]

    def connectionMade(self) -> None:
        Deferred.fromCoroutine(self._handshake()).addErrback(
            lambda f: RedisConnection.log.failure("cluster: the Redis handshake failed", f)
        )

    async def _handshake(self) -> None:
        redis: Any = self  # txredisapi's protocol: auth(), select()
        steps: list[tuple[str, Callable[[], Deferred[Any]]]] = []
        if self.password is not None:
            password = self.password
            steps.append(("could not auth", lambda: redis.auth(password, self.username)))
        if self.dbid is not None:
            dbid = self.dbid
            steps.append((f"could not set dbid={dbid}", lambda: redis.select(dbid)))
        for what, step in steps:
            try:
                reply = await step()
            except txredisapi.ResponseError as e:
                self._refused(f"{what}: {e}")
                return
            except Exception:
                # No answer in time, or the connection went: not a refusal. The factory's
                # ClientService reconnects (with its backoff) once this connection is gone.
                self.transport.abortConnection()
                return
            if isinstance(reply, txredisapi.ResponseError):
                self._refused(f"{what}: {reply}")
                return
        self.connected = 1
        self._ready = True
        self._waiting_for_connect, waiting = [], self._waiting_for_connect
        for d in waiting:
            d.callback(self)

    def _refused(self, why: str) -> None:
        self.factory.stopTrying()
        self.transport.loseConnection()
        self.factory.connectionError(f"Redis error: {why}")


class _LeaseProtocol(RecoveringHandshake, txredisapi.RedisProtocol):  # type: ignore[misc]
    """The lease connection's protocol."""


class _LeaseFactory(txredisapi.RedisFactory):  # type: ignore[misc]
    """The lease connection's factory: says when a connection joins its pool (usable)."""

    protocol = _LeaseProtocol
    # No "Starting factory <... at 0x...>" line at every (re)connect.
    noisy = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_connected: Callable[[], None] = lambda: None

    def addConnection(self, conn: Any) -> None:
        before = self.size
        super().addConnection(conn)
        if self.size > before:
            self.on_connected()


class RedisConnection:
    """The cluster's Redis connection and the lease store on it."""

    log = Logger()

    def __init__(
        self,
        factory: Any,
        address: RedisAddress,
        clock: IReactorTime,
        key_prefix: str,
        timeout: float,
    ) -> None:
        self._factory = factory
        self._clock = clock
        self._timeout = timeout
        self.address = address
        # Why Redis refused the connection for good (wrong password, no such db), if it did.
        self.refused: str | None = None
        self._on_connected: list[Callable[[], None]] = []
        factory.on_connected = self._connected
        self.leases = RedisLeaseStore(
            factory.handler,
            clock,
            key_prefix=key_prefix,
            timeout=timeout,
            connected=self.connected,
        )

    def _refused(self, failure: Failure) -> None:
        self.refused = failure.getErrorMessage()
        self.log.error(
            "cluster: Redis at {address} refused this Edge: {why}",
            address=str(self.address),
            why=self.refused,
        )

    def _refusal(self) -> ClusterUnavailable:
        return ClusterUnavailable(f"Redis at {self.address} refused this Edge: {self.refused}")

    def connected(self) -> bool:
        """Whether a connection to Redis is up (authenticated, db selected) now."""
        return bool(self._factory.size)

    def when_each_connected(self, call: Callable[[], None]) -> None:
        """Call ``call()`` each time a connection comes up (the first and every reconnect)."""
        self._on_connected.append(call)

    def _connected(self) -> None:
        for call in list(self._on_connected):
            try:
                call()
            except Exception:
                self.log.failure("cluster: a reconnection observer failed")

    def when_connected(self, timeout: float) -> Deferred[None]:
        """Fires once connected; :class:`ClusterUnavailable` after ``timeout`` seconds."""
        if self.connected():
            return succeed(None)
        if self.refused is not None:
            return fail(self._refusal())
        waited = 0.0
        done: Deferred[None] = Deferred()

        def poll() -> None:
            nonlocal waited
            if self.connected():
                loop.stop()
                done.callback(None)
            elif self.refused is not None:
                loop.stop()
                done.errback(self._refusal())
            elif waited >= timeout:
                loop.stop()
                done.errback(
                    ClusterUnavailable(f"no connection to Redis at {self.address} in {timeout:g}s")
                )
            waited += _POLL_SEC

        loop = task.LoopingCall(poll)
        loop.clock = self._clock
        loop.start(_POLL_SEC, now=False)
        return done

    def start(self) -> None:
        """Connect (and keep reconnecting) in the background."""
        self._factory.startConnecting(_endpoint(self._clock, self.address, self._timeout))
        self.log.info("cluster: connecting to Redis at {address}", address=str(self.address))

    def close(self) -> Deferred[None]:
        """Stop reconnecting and close the connection."""
        d: Deferred[None] = self._factory.disconnect()
        return d


def connect(
    config: ClusterConfig, reactor: Any, *, timeout: float = DEFAULT_TIMEOUT_SEC
) -> RedisConnection:
    """
    Start connecting to ``config``'s Redis (in the background: operations fail with
    :class:`ClusterUnavailable` until a connection is up; :meth:`RedisConnection.when_connected`
    waits for it).
    """
    connection = prepare(config, reactor, timeout=timeout)
    connection.start()
    return connection


def prepare(
    config: ClusterConfig, reactor: Any, *, timeout: float = DEFAULT_TIMEOUT_SEC
) -> RedisConnection:
    """The connection to ``config``'s Redis, not yet connecting (:meth:`RedisConnection.start`)."""
    address = redis_address(config)
    password = config.password.reveal() if config.password is not None else None
    factory = _LeaseFactory(
        str(address),
        address.db,
        1,
        isLazy=True,
        handler=txredisapi.ConnectionHandler,
        password=password,
        # A little inside the store's own bound: a hung server's connection is dropped (and
        # the next operations fail at once) by the time the caller hears of the timeout.
        replyTimeout=timeout * REPLY_TIMEOUT_SHARE,
        convertNumbers=False,
        username=address.username,
    )
    factory.reconnect = True
    factory.initialDelay = RECONNECT_INITIAL_DELAY
    factory.maxDelay = reconnect_max_delay(config.lease_ttl_sec)
    connection = RedisConnection(factory, address, reactor, config.key_prefix, timeout)
    # Fires once: with the handler when first connected, or with why Redis refused us (AUTH,
    # SELECT: an error reply), after which the factory stops trying.
    factory.deferred.addCallbacks(lambda _: None, connection._refused)
    return connection


class _WakeProtocol(RecoveringHandshake, txredisapi.SubscriberProtocol):  # type: ignore[misc]
    factory: _WakeFactory

    def messageReceived(self, pattern: Any, channel: Any, message: Any) -> None:
        self.factory.on_wake()


class _WakeFactory(txredisapi.RedisFactory):  # type: ignore[misc]
    """Each connection it builds subscribes to the channel once it is ready (also after every
    reconnect) and reports then, since wake-ups published while it was down are lost."""

    protocol = _WakeProtocol
    # No "Starting factory <... at 0x...>" line at every (re)connect.
    noisy = False

    def __init__(self, channel: str, on_wake: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.channel = channel
        self.on_wake = on_wake

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.whenConnected().addCallback(self._subscribe)
        return protocol

    def _subscribe(self, protocol: _WakeProtocol) -> None:
        d = protocol.subscribe(self.channel)
        d.addCallbacks(lambda _: self.on_wake(), lambda f: None)


class WakeSubscription:
    """The cluster's wake-up channel, on a connection of its own (a subscribed connection can
    run no other command); reconnects like the lease connection."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory

    def connected(self) -> bool:
        return bool(self._factory.size)

    def close(self) -> Deferred[None]:
        d: Deferred[None] = self._factory.disconnect()
        return d


def subscribe(
    config: ClusterConfig,
    reactor: Any,
    channel: str,
    on_wake: Callable[[], None],
    *,
    timeout: float = DEFAULT_TIMEOUT_SEC,
) -> WakeSubscription:
    """
    Subscribe to ``channel`` on ``config``'s Redis and call ``on_wake()`` for every message and
    after every (re)subscription, in the background (reconnecting as :func:`connect` does).
    """
    address = redis_address(config)
    password = config.password.reveal() if config.password is not None else None
    factory = _WakeFactory(
        channel,
        on_wake,
        uuid=str(address),
        dbid=address.db,
        poolsize=1,
        isLazy=True,
        handler=txredisapi.ConnectionHandler,
        password=password,
        replyTimeout=None,
        convertNumbers=False,
        username=address.username,
    )
    factory.reconnect = True
    factory.initialDelay = RECONNECT_INITIAL_DELAY
    factory.maxDelay = reconnect_max_delay(config.lease_ttl_sec)
    factory.deferred.addErrback(lambda f: None)
    factory.startConnecting(_endpoint(reactor, address, timeout))
    return WakeSubscription(factory)


def _endpoint(reactor: Any, address: RedisAddress, timeout: float) -> IStreamClientEndpoint:
    if address.unix:
        endpoint: IStreamClientEndpoint = UNIXClientEndpoint(reactor, address.path, timeout=timeout)
        return endpoint
    return HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)
