# -*- test-case-name: tests.test_cluster_leases -*-
"""
Several Edges, one gateway: the state the Edges of a cluster share on Redis.

:mod:`~iop.edge.cluster.leases` is the shared lease table (exact provider capacity across every
Edge, by server-side scripts from :mod:`~iop.edge.cluster.scripts`); :mod:`~iop.edge.cluster.redis`
connects to the ``cluster.redis`` address; :mod:`~iop.edge.cluster.errors` is the one failure a
caller handles (:class:`ClusterUnavailable`: fail closed). The pool does not use them yet.
"""
