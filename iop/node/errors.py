# -*- test-case-name: iop.test.node.test_supervisor -*-
"""
The two kinds of failure a Node can meet while dialling and registering with its Edge.

The supervisor's policy hangs on this split: a :class:`RetryableError` costs one attempt of the
reconnect budget, a :class:`FatalError` ends the daemon with exit code 1 at once. A
:class:`NotAnEdgeError` is fatal until the node has once been ready with that Edge (see there).
And :func:`failure_message`: the text a failure is reported with to the Edge;
:func:`connection_lost_error`: which of them a connection lost before ready is, with a line a
person reads (the TLS refusals of :mod:`iop.security.tls`, in their own words).
"""

from __future__ import annotations

from OpenSSL import SSL
from twisted.python.failure import Failure

from iop.security.tls import edge_refusal, not_tls_answer


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


class NotAnEdgeError(NodeError):
    """
    What answered is not an IOP Edge node listener: it answered TLS with something else (an
    HTTP listener's error page), or accepted the connection and never answered the TLS
    handshake. Fatal while the node has never been ready with that Edge (the address is wrong:
    retrying cannot fix it); once it has, the Edge was there and a silent port is more likely the
    Edge restarting, so then it is retryable like any lost connection.
    """


def not_an_edge(peer: str, detail: str) -> NotAnEdgeError:
    """The one line a node gives up with when ``peer`` is not an Edge node listener."""
    return NotAnEdgeError(
        f"{peer} is not an IOP Edge node listener ({detail}): is it listen.admin or the client "
        "port? Dial the Edge's listen.nodes address"
    )


def connection_lost_error(transport: object, reason: Failure, peer: str) -> NodeError:
    """
    What a connection lost before ready means for the supervisor: this node refused the Edge's
    certificate (fatal — a wrong pin, name or CA — or retryable when it is expired or not yet
    valid), the peer answered TLS with something that is not TLS (:class:`NotAnEdgeError`), or
    anything else (retryable, as the connection may come back).
    """
    refusal = edge_refusal(transport, reason)
    if refusal is not None:
        return RetryableError(str(refusal)) if refusal.retryable else FatalError(str(refusal))
    if isinstance(reason.value, SSL.Error) and not_tls_answer(reason.value):
        return not_an_edge(peer, "it did not answer TLS")
    return RetryableError(f"connection lost during the handshake: {reason.getErrorMessage()}")


def failure_message(failure: Failure) -> str:
    """A failure's message, or its type's name when it has none (what the Edge is told)."""
    message = failure.getErrorMessage()
    if not message or message == "None":
        return failure.type.__name__ if failure.type is not None else "unknown failure"
    return message
