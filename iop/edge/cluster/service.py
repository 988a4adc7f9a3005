# -*- test-case-name: tests.test_cluster_edges -*-
"""
The cluster's part of an Edge's service tree: at start it connects to the cluster's Redis (the
lease connection, then the wake-up subscription on a connection of its own) and starts the
pool's periodic work (lease renewal, waiter re-tries, the cluster view); at stop it ends both.
Nothing waits for Redis: until it answers, grants fail with ``cluster_unavailable``.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList

from iop.config.model import ClusterConfig
from iop.edge.cluster.pool import ClusterPool
from iop.edge.cluster.redis import RedisConnection, WakeSubscription, subscribe

__all__ = ["ClusterService"]


class ClusterService(Service):
    """Runs ``pool``'s cluster side over ``connection`` (built, not started)."""

    def __init__(
        self, config: ClusterConfig, pool: ClusterPool, connection: RedisConnection, reactor: Any
    ) -> None:
        self._config = config
        self._pool = pool
        self._connection = connection
        self._reactor = reactor
        self._wakeups: WakeSubscription | None = None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._connection.when_each_connected(self._pool.reconnected)
        self._connection.start()
        self._wakeups = subscribe(
            self._config,
            self._reactor,
            self._connection.leases.wake_channel,
            self._pool.wake,
        )
        self._pool.start()

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        self._pool.stop()
        closing = [self._connection.close()]
        if self._wakeups is not None:
            closing.append(self._wakeups.close())
            self._wakeups = None
        return DeferredList(closing, consumeErrors=True)
