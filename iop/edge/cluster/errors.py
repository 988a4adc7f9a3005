# -*- test-case-name: tests.test_cluster_leases -*-
"""
The cluster's failure: Redis cannot be used right now, so the Edge refuses new work (fail
closed) instead of granting leases it cannot account for.
"""

from __future__ import annotations

__all__ = ["ClusterUnavailable"]


class ClusterUnavailable(Exception):
    """
    The cluster's Redis did not answer (not connected, connection lost, no reply within the
    store's timeout) or refused the command (authentication, read-only replica, out of
    memory...). The message says which, never with a credential. Whether a command that timed
    out ran on the server is unknown: a lease it may have granted expires with its TTL.
    """
