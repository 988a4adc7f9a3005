# -*- test-case-name: iop.test.node.test_supervisor -*-
"""
The two kinds of failure a Node can meet while dialling and registering with its Edge.

The supervisor's policy hangs on this split: a :class:`RetryableError` costs one attempt of the
reconnect budget, a :class:`FatalError` ends the daemon with exit code 1 at once. And
:func:`failure_message`: the text a failure is reported with to the Edge.
"""

from __future__ import annotations

from twisted.python.failure import Failure


class NodeError(Exception):
    """Base class for Node connection failures. Messages never carry a secret."""


class FatalError(NodeError):
    """
    A local configuration or credential error that retrying cannot fix: a missing or unreadable
    token, bad local TLS material, or the Edge rejecting our token
    (``REGISTER_REJECT_UNKNOWN_TOKEN``), our client certificate
    (``REGISTER_REJECT_WORKLOAD_IDENTITY``) or our credential lease support
    (``REGISTER_REJECT_LEASE_SUPPORT``: a legacy node, or other lease keys, on a managed Edge).
    """


class RetryableError(NodeError):
    """
    A remote failure that may heal by itself: refused connection, duplicate-connection or
    payload-build rejection, ``ready=false``, handshake timeout, a config payload that does not
    apply (the Edge's config may be fixed), or the connection lost during the handshake.
    """


def failure_message(failure: Failure) -> str:
    """A failure's message, or its type's name when it has none (what the Edge is told)."""
    message = failure.getErrorMessage()
    if not message or message == "None":
        return failure.type.__name__ if failure.type is not None else "unknown failure"
    return message
