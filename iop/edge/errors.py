# -*- test-case-name: iop.test.edge.test_pool,iop.test.edge.test_runs -*-
"""
Every error the Edge raises about a request it could not place: the one module to import them
from.

Messages are safe to show a client: they name the model, node or run asked for, never a token,
key or endpoint.

- :class:`DispatchError` and its kinds: a run, tunnel or command could not be sent
  (:class:`NoRoute`, :class:`NodeUnavailable`, :class:`TunnelFailed`,
  :class:`CredentialRefused`, :class:`LeaseRequired`).
- :class:`PoolError` and its kinds: an acquire on the provider pool produced no lease
  (:class:`UnknownModel`, :class:`Unavailable`, :class:`Overloaded`, :class:`QueueTimeout`,
  :class:`CapacityUnknown`);
  ``code`` is a stable machine name.
- :class:`CommandFailed`: a node command answered ``ok=false`` or lost its node.
"""

from __future__ import annotations

from typing import ClassVar

from iop.runtime.codes import ErrorCode


class DispatchError(Exception):
    """A run could not be submitted; the message says why (no secrets, safe for clients)."""


class NoRoute(DispatchError):
    """No route or node for the request."""


class NodeUnavailable(DispatchError):
    """The chosen node is not dispatch-ready."""


class TunnelFailed(DispatchError):
    """
    A tunnel ended before the provider's response started; the message says why, ``code`` (when
    the node gave one) what kind of failure it was.
    """

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class CredentialRefused(DispatchError):
    """
    Managed mode: a tunnel's credential binding does not hold (slot disabled or unknown, no
    recipient key for the node, binding stale by send time). Nothing was sent; no fallback.
    """


class LeaseRequired(DispatchError):
    """
    Managed mode: a normalized run (or a debug tunnel without a lease) on an adapter that is
    reached only through a provider tunnel carrying a credential lease (``openai_compat``,
    ``vllm``). Refused before anything is sent; the client API's tunnels are the way there.
    """


class PoolError(Exception):
    """
    An acquire that produced no lease. The message is safe to show a client (it names the
    requested model, never a node, token or endpoint); ``code`` is a stable machine name.
    """

    code: ClassVar[str] = "pool_error"

    def __init__(self, message: str, model_id: str) -> None:
        super().__init__(message)
        self.model_id = model_id

    @property
    def message(self) -> str:
        return str(self.args[0])


class UnknownModel(PoolError):
    """The model key is not in ``models[]``."""

    code = "model_not_found"

    def __init__(self, model_id: str) -> None:
        super().__init__(f"model {model_id!r} is not configured", model_id)


class Unavailable(PoolError):
    """No live candidate: every provider of the model is disabled or its node is not ready."""

    code = "unavailable"

    def __init__(self, model_id: str) -> None:
        super().__init__(f"no provider is available for model {model_id!r}", model_id)


class Overloaded(PoolError):
    """The model group's queue is full."""

    code = "overloaded"

    def __init__(self, model_id: str, limit: int) -> None:
        super().__init__(
            f"model {model_id!r} is overloaded: {limit} requests are already waiting", model_id
        )
        self.limit = limit


class QueueTimeout(PoolError):
    """No provider freed up within the model group's queue timeout."""

    code = "queue_timeout"

    def __init__(self, model_id: str, timeout: float) -> None:
        super().__init__(
            f"timed out after {timeout:g}s waiting for a provider for model {model_id!r}",
            model_id,
        )
        self.timeout = timeout


class CapacityUnknown(PoolError):
    """
    In a cluster: the shared lease table on Redis cannot be reached, so no Edge can know the
    provider's free capacity; the request is refused rather than risk over-committing it.
    """

    code = "cluster_unavailable"

    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"no capacity can be granted for model {model_id!r} right now: the gateway's "
            "cluster state is unreachable",
            model_id,
        )


class CommandFailed(Exception):
    """The node answered ok=false, or the node went away before answering."""


__all__ = [
    "CommandFailed",
    "CredentialRefused",
    "DispatchError",
    "LeaseRequired",
    "NoRoute",
    "NodeUnavailable",
    "Overloaded",
    "PoolError",
    "QueueTimeout",
    "TunnelFailed",
    "Unavailable",
    "UnknownModel",
]
