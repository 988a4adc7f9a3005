# -*- test-case-name: iop.test.edge.test_link,iop.test.edge.test_transport_identity -*-
"""
The node link, the Edge's side of its nodes' connections: :func:`build` makes it from
``edge.yaml`` — the registry (ownership, generations, managed mode's identity and lease checks),
the connection factory (framing, heartbeat, TLS refusals), the dispatchers that send work on a
ready connection (runs, tunnels, node commands) with the handlers of their answers — and
:meth:`NodeLink.listener` its listening service (TLS unless the config asks for loopback
plaintext), so the Edge's composition root only hands the parts to their users.

The registry's observers are told of readiness in the order they joined: the observers given to
:func:`build` first (the pool: fencing returns leases before the dispatchers end that node's runs
and tunnels), then the dispatchers, then whoever registers later (the refresh pusher).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IProtocolFactory
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage

from iop.config.model import EdgeConfig
from iop.edge.commands import NodeCommander
from iop.edge.credentials import CredentialIssuer
from iop.edge.events import EventBus
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.transport import NodeConnectionFactory
from iop.edge.tunnel import TunnelDispatcher
from iop.security.tls import TLSConfigError, server_context_factory

__all__ = ["NodeLink", "build", "check_managed_transport"]


@dataclass(frozen=True)
class NodeLink:
    """The node link's parts, built and not listening."""

    registry: NodeRegistry
    factory: NodeConnectionFactory
    runs: RunDispatcher
    commands: NodeCommander
    tunnels: TunnelDispatcher

    def handle(self, kind: str, handler: Callable[[INodeConnection, Any], None]) -> None:
        """Messages of ``kind`` from a ready node go to ``handler(connection, message)``."""
        self.factory.handlers[kind] = lambda conn, env: handler(conn, getattr(env, kind))

    def listener(self, config: EdgeConfig, reactor: Any) -> StreamServerEndpointService:
        """
        The node listener (named ``nodes``) on ``listen.nodes``: TLS unless the config asks for
        plaintext; it raises at start when its port cannot be had.

        @raise usage.UsageError: the TLS files do not make a server context.
        """
        factory: IProtocolFactory = self.factory
        if config.tls is not None and not config.plaintext_nodes:
            try:
                context_factory = server_context_factory(config.tls)
            except TLSConfigError as e:
                raise usage.UsageError(f"node_transport.tls: {e}") from None
            factory = TLSMemoryBIOFactory(context_factory, False, self.factory)
        nodes = StreamServerEndpointService(
            serverFromString(reactor, config.node_listen_endpoint), factory
        )
        nodes._raiseSynchronously = True
        nodes.setName("nodes")
        return nodes


def build(
    config: EdgeConfig,
    bus: EventBus,
    reactor: Any,
    observers: Iterable[INodeLifecycleObserver] = (),
    credentials: CredentialIssuer | None = None,
) -> NodeLink:
    """
    The node link for ``config``: ``observers`` told of node readiness before the dispatchers;
    with ``credentials`` (managed mode) a registering node must announce the lease keys that
    issuer seals to and signs for.
    """
    registry = NodeRegistry(
        config,
        lambda node: build_node_payload(config, node),
        bus,
        reactor,
        observers,
        lease_check=credentials.lease_support_problem if credentials is not None else None,
    )
    factory = NodeConnectionFactory(
        registry,
        reactor,
        heartbeat_interval=config.heartbeat.interval_sec,
        heartbeat_timeout=config.heartbeat.timeout_sec,
        register_timeout=config.register_timeout_sec,
        max_frame_bytes=config.max_frame_bytes,
    )
    # The dispatchers send on the node connection itself (INodeConnection.send_envelope); each
    # registers as a lifecycle observer, so a fenced node ends its runs and tunnels.
    link = NodeLink(
        registry,
        factory,
        RunDispatcher(config, registry, reactor),
        NodeCommander(registry, reactor),
        TunnelDispatcher(registry, reactor),
    )
    link.handle("run_event", link.runs.run_event)
    link.handle("node_command_response", link.commands.command_response)
    link.handle("cancel_response", link.commands.cancel_response)
    link.handle("provider_tunnel_frame", link.tunnels.frame)
    return link


def check_managed_transport(config: EdgeConfig) -> None:
    """
    Managed mode needs node TLS with a client CA (mTLS); the config loader refuses the rest
    already, this is the service's own guard.

    @raise usage.UsageError: naming what is missing.
    """
    if not config.security.managed:
        return
    if config.tls is None or config.plaintext_nodes:
        raise usage.UsageError(
            "security.mode managed: node_transport.tls is required (plaintext node transport "
            "cannot carry workload identity)"
        )
    if config.tls.client_ca_file is None:
        raise usage.UsageError(
            "security.mode managed: node_transport.tls.client_ca_file is required (mTLS: nodes "
            "prove their workload name with a client certificate from that CA)"
        )
