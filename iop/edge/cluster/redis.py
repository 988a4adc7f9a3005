# -*- test-case-name: tests.test_cluster_leases -*-
"""
The Edge's connection to the cluster's Redis (``cluster.redis``), with txredisapi: Twisted-native,
so the Edge keeps its reactor; EVALSHA / SCRIPT LOAD, unix sockets, AUTH (with an ACL username)
and SELECT of the db are all it needs.

One connection (commands are pipelined on it; Redis runs them one at a time anyway), kept up by
txredisapi's ClientService: when it is lost the store fails at once (:class:`ClusterUnavailable`)
while it reconnects, backing off from 0.1 s to at most 2 s, so the Edge serves again soon after
Redis returns. A wrong password stops the reconnecting (txredisapi's rule): every operation then
fails, and the log says why.
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

__all__ = ["RedisConnection", "WakeSubscription", "connect", "prepare", "subscribe"]

# Reconnect backoff (seconds): first retry, then multiplied by e up to the cap.
RECONNECT_INITIAL_DELAY = 0.1
RECONNECT_MAX_DELAY = 2.0
# The client's reply timeout, as a share of the store's timeout.
REPLY_TIMEOUT_SHARE = 0.8
# How often when_connected looks.
_POLL_SEC = 0.02


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
    factory = txredisapi.RedisFactory(
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
    factory.maxDelay = RECONNECT_MAX_DELAY
    connection = RedisConnection(factory, address, reactor, config.key_prefix, timeout)
    # Fires once: with the handler when first connected, or with why Redis refused us (AUTH,
    # SELECT), after which txredisapi stops trying.
    factory.deferred.addCallbacks(lambda _: None, connection._refused)
    return connection


class _WakeProtocol(txredisapi.SubscriberProtocol):  # type: ignore[misc]
    factory: _WakeFactory

    def messageReceived(self, pattern: Any, channel: Any, message: Any) -> None:
        self.factory.on_wake()


class _WakeFactory(txredisapi.RedisFactory):  # type: ignore[misc]
    """Each connection it builds subscribes to the channel once it is ready (also after every
    reconnect) and reports then, since wake-ups published while it was down are lost."""

    protocol = _WakeProtocol

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
    factory.maxDelay = RECONNECT_MAX_DELAY
    factory.deferred.addErrback(lambda f: None)
    factory.startConnecting(_endpoint(reactor, address, timeout))
    return WakeSubscription(factory)


def _endpoint(reactor: Any, address: RedisAddress, timeout: float) -> IStreamClientEndpoint:
    if address.unix:
        endpoint: IStreamClientEndpoint = UNIXClientEndpoint(reactor, address.path, timeout=timeout)
        return endpoint
    return HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)
