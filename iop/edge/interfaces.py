# -*- test-case-name: iop.test.edge.test_runs,iop.test.edge.test_transport -*-
"""
The seams between the Edge's node-facing services: what a node connection offers the services
that use it, and what the registry tells the services that must follow a node's readiness.
"""

from __future__ import annotations

from collections.abc import Callable

from zope.interface import Attribute, Interface

from iop.wire import runtime_pb2 as pb


class INodeConnection(Interface):
    """
    One node socket as the registry, the dispatchers and the commander use it: an identity to
    compare and a way to send. Its lifecycle belongs to the transport; nobody else closes it.
    """

    node_id = Attribute("The node id this connection registered as; None before registration.")

    def send_envelope(envelope: pb.Envelope) -> None:
        """Send one envelope to the node (raises when it cannot be framed or sent)."""


class INodeLifecycleObserver(Interface):
    """
    Authoritative listeners of a node's dispatch-readiness (provider pool, dispatchers,
    commander). Called synchronously by the registry, after the node has been told it is ready.
    """

    def node_ready(node_id: str, generation: int) -> None:
        """``node_id``'s generation ``generation`` became dispatch-ready."""

    def node_fenced(node_id: str, generation: int) -> None:
        """``node_id``'s ready generation ``generation`` is gone: return its resources."""


class INodeDrainObserver(Interface):
    """
    Listeners that also follow a ready node's drain (the provider pool): called synchronously by
    the registry when the node says it stops, before the Edge acknowledges it.
    """

    def node_draining(node_id: str, generation: int) -> None:
        """``node_id``'s ready generation ``generation`` takes no new work; what runs, runs on."""


# How a service sends to a node connection (tests inject a recorder or a failing send).
Send = Callable[[INodeConnection, pb.Envelope], None]


def send_envelope(connection: INodeConnection, envelope: pb.Envelope) -> None:
    """The default :data:`Send`: the connection's own."""
    connection.send_envelope(envelope)


__all__ = [
    "INodeConnection",
    "INodeDrainObserver",
    "INodeLifecycleObserver",
    "Send",
    "send_envelope",
]
