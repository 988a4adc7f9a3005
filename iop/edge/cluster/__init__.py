# -*- test-case-name: tests.test_cluster_leases -*-
"""
Several Edges, one gateway: the state the Edges of a cluster share on Redis (docs/cluster.md).

:func:`~iop.edge.cluster.service.build` makes the subsystem from ``edge.yaml``: the lease table
an Edge's pool grants from (:mod:`~iop.edge.cluster.table`: renewal, lost leases, wake-ups, the
cluster view) and the service that connects and runs it (:mod:`~iop.edge.cluster.service`).
Beneath them, :mod:`~iop.edge.cluster.leases` is the shared lease table (exact provider capacity
across every Edge, by server-side scripts from :mod:`~iop.edge.cluster.scripts`);
:mod:`~iop.edge.cluster.redis` connects to the ``cluster.redis`` address;
:mod:`~iop.edge.cluster.errors` is the one failure a caller handles (:class:`ClusterUnavailable`:
fail closed).
"""
