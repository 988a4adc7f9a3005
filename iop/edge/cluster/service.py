# -*- test-case-name: tests.test_cluster_edges -*-
"""
The cluster's part of an Edge: :func:`build` makes it from ``edge.yaml`` — the connection to the
cluster's Redis, the lease table the Edge's pool grants from, the quota table its keys' limits
and budgets are counted in (:mod:`~iop.edge.cluster.quota`), and the service that runs them —
so the Edge's composition root only hands the tables to their users and the service to its
tree.

At start the service connects to the cluster's Redis (the lease connection, then the wake-up
subscription on a connection of its own) and starts the tables' periodic work (lease and
quota slot renewal, waiter re-tries, the cluster view); at stop it ends it. Nothing waits for
Redis: until it answers, grants and reservations fail with ``cluster_unavailable``.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList

from iop.config.model import ClusterConfig, EdgeConfig
from iop.edge.cluster.quota import ClusterQuotaTable
from iop.edge.cluster.redis import RedisConnection, WakeSubscription, prepare, subscribe
from iop.edge.cluster.table import ClusterLeaseTable

__all__ = ["ClusterService", "build"]


def build(config: EdgeConfig, reactor: Any) -> ClusterService | None:
    """
    The cluster's service for ``config`` (named ``cluster``; its :attr:`~ClusterService.table`
    is the lease table for the Edge's pool), built and not started; ``None`` without a
    ``cluster:`` section.
    """
    if config.cluster is None:
        return None
    connection = prepare(config.cluster, reactor)
    table = ClusterLeaseTable(
        connection.leases,
        reactor,
        edge_id=config.cluster.edge_id,
        lease_ttl_sec=config.cluster.lease_ttl_sec,
        provider_ids=[p.id for node in config.nodes for p in node.providers],
    )
    quota = ClusterQuotaTable(
        connection.leases,
        reactor,
        edge_id=config.cluster.edge_id,
        ttl_sec=config.cluster.lease_ttl_sec,
    )
    service = ClusterService(config.cluster, table, connection, reactor, quota=quota)
    service.setName("cluster")
    return service


class ClusterService(Service):
    """Runs ``table``'s cluster side over ``connection`` (built, not started)."""

    def __init__(
        self,
        config: ClusterConfig,
        table: ClusterLeaseTable,
        connection: RedisConnection,
        reactor: Any,
        *,
        quota: ClusterQuotaTable | None = None,
    ) -> None:
        self._config = config
        #: The lease table the Edge's pool grants from.
        self.table = table
        #: The quota table the client keys' limits and budgets are counted in.
        self.quota = quota
        self._connection = connection
        self._reactor = reactor
        self._wakeups: WakeSubscription | None = None

    def view(self) -> dict[str, Any]:
        """The cluster seen from this Edge, for ``/status``
        (:meth:`~iop.edge.cluster.table.ClusterLeaseTable.view`)."""
        return self.table.view()

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._connection.when_each_connected(self.table.reconnected)
        if self.quota is not None:
            self._connection.when_each_connected(self.quota.reconnected)
        self._connection.start()
        self._wakeups = subscribe(
            self._config,
            self._reactor,
            self._connection.leases.wake_channel,
            self.table.wake,
        )
        self.table.start()
        if self.quota is not None:
            self.quota.start()

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        self.table.stop()
        if self.quota is not None:
            self.quota.stop()
        closing = [self._connection.close()]
        if self._wakeups is not None:
            closing.append(self._wakeups.close())
            self._wakeups = None
        return DeferredList(closing, consumeErrors=True)
