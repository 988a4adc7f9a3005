# -*- test-case-name: iop.test.runtime.test_codes -*-
"""
Machine-readable error codes a node attaches to a failure, so the Edge matches on a code and
never on the wording of a message.

A node puts the code in the ``metadata`` map of the terminal ``RunEvent`` or of the error
``ProviderTunnelFrame``, under :data:`ERROR_CODE_KEY`. A failure without a code is a plain
upstream failure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["ERROR_CODE_KEY", "ErrorCode", "error_code"]

ERROR_CODE_KEY = "error_code"


class ErrorCode(enum.StrEnum):
    # The node's own gate for the adapter instance is full: try later or elsewhere (503).
    PROVIDER_AT_CAPACITY = "provider_at_capacity"
    # The node is draining (it stops): it admits no new work; nothing was sent upstream (503).
    NODE_DRAINING = "node_draining"
    # The node gave up on the upstream: the request's timeout or the adapter's idle timeout.
    UPSTREAM_TIMEOUT = "upstream_timeout"
    # Managed mode: the tunnel's credential lease was refused (iop.security.lease's classes).
    # Fail closed: never retried on another route, provider or credential.
    LEASE_MISSING = "lease_missing"
    LEASE_MALFORMED = "lease_malformed"
    LEASE_BAD_SIGNATURE = "lease_bad_signature"
    LEASE_WRONG_RECIPIENT = "lease_wrong_recipient"
    LEASE_EXPIRED = "lease_expired"
    LEASE_BINDING_MISMATCH = "lease_binding_mismatch"
    LEASE_REPLAY_CACHE_FULL = "lease_replay_cache_full"
    LEASE_REPLAYED = "lease_replayed"
    LEASE_UNOPENABLE = "lease_unopenable"


def error_code(metadata: Mapping[str, str]) -> ErrorCode | None:
    """The code in ``metadata``, or None (absent or unknown to this version)."""
    value = metadata.get(ERROR_CODE_KEY)
    if value is None:
        return None
    try:
        return ErrorCode(value)
    except ValueError:
        return None
