# -*- test-case-name: iop.test.node.test_link,iop.test.test_taps -*-
"""
The node's links to its Edges: :func:`build` makes, for each Edge of the config (``edge:`` or
``edges:``), its endpoint (:func:`edge_endpoint`: TLS that checks the Edge's workload name,
unless plaintext), its connection factory (whose sessions the handlers of
:func:`iop.node.handlers.make_session_setup` equip) and its
:class:`~iop.node.supervisor.NodeSupervisor`, under one
:class:`~iop.node.edges.EdgeSupervisors` — so the node's composition root only hands the run
store, the adapters' context and the lease keys in and the service to its tree.

What holds no connection is shared by every Edge's sessions: the run store, the adapters'
context (the providers' HTTP client) and the lease keys. Each session's ``TRANSPORT_STATUS``
names its own Edge, then every Edge the node dials.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.python import usage

from iop.config.model import EdgeAddress, NodeDaemonConfig
from iop.node.drain import NodeDrain
from iop.node.edges import EdgeLogger, EdgeSupervisors, SupervisedEdge
from iop.node.handlers import make_session_setup
from iop.node.session import SessionBuilder
from iop.node.store import RunStore
from iop.node.supervisor import NodeSupervisor
from iop.node.transport import EdgeConnectionFactory
from iop.runtime.interfaces import AdapterContext
from iop.security.lease import NodeLeaseKeys
from iop.security.tls import TLSConfigError, client_connection_creator

__all__ = ["build", "edge_endpoint", "edge_endpoints", "tls_setting"]


def edge_endpoint(edge: EdgeAddress, reactor: Any) -> IStreamClientEndpoint:
    """
    TCP to the Edge, wrapped in TLS that checks the Edge's certificate — against the CA file, or
    the pinned CA it presents — and its workload name (unless plaintext).
    """
    endpoint: IStreamClientEndpoint = HostnameEndpoint(reactor, edge.host, edge.port, timeout=10)
    if edge.plaintext or edge.tls is None:
        return endpoint
    return wrapClientTLS(client_connection_creator(edge.tls, edge.name), endpoint)


def edge_endpoints(config: NodeDaemonConfig, reactor: Any) -> list[IStreamClientEndpoint]:
    """
    Each Edge's endpoint, in ``config.edges``' order.

    @raise usage.UsageError: an Edge's TLS files do not make a client context; the message
        names the setting as well as the file (:func:`tls_setting`).
    """
    endpoints: list[IStreamClientEndpoint] = []
    for index, edge in enumerate(config.edges):
        try:
            endpoints.append(edge_endpoint(edge, reactor))
        except TLSConfigError as e:
            setting = tls_setting(config, index, str(e))
            raise usage.UsageError(f"{setting}: {e}" if setting else str(e)) from None
    return endpoints


# The TLS settings of one Edge: node.yaml key and the flag that stands for it.
_TLS_SETTINGS = (
    ("ca_file", "--ca-file"),
    ("cert_file", "--cert-file"),
    ("key_file", "--key-file"),
)


def tls_setting(config: NodeDaemonConfig, index: int, message: str) -> str:
    """
    The setting a TLS error of ``config.edges[index]`` is about, as the operator wrote it: the
    node.yaml path (``edge.ca_file``, ``edges[1].key_file``) or, for a node configured by
    flags, the flag (``--ca-file``); "" when the message names none of them.
    """
    edge = config.edges[index]
    tls = edge.tls
    if tls is None:
        return ""
    from_flags = not config.source_path
    prefix = "edge" if len(config.edges) == 1 else f"edges[{index}]"
    for key, flag in _TLS_SETTINGS:
        value = getattr(tls, key)
        if value and (repr(value) in message or value in message):
            return flag if from_flags else f"{prefix}.{key}"
    if "server_name" in message:
        return "--server-name" if from_flags else f"{prefix}.server_name"
    return ""


def build(
    config: NodeDaemonConfig,
    endpoints: list[IStreamClientEndpoint],
    reactor: Any,
    adapter_context: AdapterContext,
    store: RunStore,
    leases: NodeLeaseKeys | None,
    drain: NodeDrain | None = None,
) -> EdgeSupervisors:
    """
    One supervised session per Edge of ``config`` over its endpoint in ``endpoints``
    (:func:`edge_endpoints`), under the service named ``supervisor`` (built, not started).
    ``drain``: the node's drain, which every session admits its work through and which the
    supervisors wait for before they stop.
    """
    several = len(config.edges) > 1
    supervised: list[SupervisedEdge] = []
    group: list[EdgeSupervisors] = []  # set once every Edge's supervisor exists

    def transport_info_for(index: int) -> Callable[[], Mapping[str, object]]:
        def transport_info() -> Mapping[str, object]:
            # What an Edge's TRANSPORT_STATUS adds: this session's Edge, then every Edge.
            edge = config.edges[index]
            info: dict[str, object] = {
                "edge": edge.name,
                "tls": not (edge.plaintext or edge.tls is None),
            }
            if group:
                edges = group[0].describe()
                info["supervisor_state"] = edges[index]["supervisor_state"]
                info["dials"] = edges[index]["dials"]
                info["edges"] = edges
            return info

        return transport_info

    for index, (edge, endpoint) in enumerate(zip(config.edges, endpoints, strict=True)):
        factory = EdgeConnectionFactory(
            reactor,
            SessionBuilder(
                adapter_context,
                setup=make_session_setup(
                    store,
                    reactor,
                    transport_info_for(index),
                    leases=leases,
                    drain=drain,
                    tracing=adapter_context.tracing,
                ),
            ),
            max_frame_bytes=config.max_frame_bytes,
            log=EdgeLogger(edge.name, "iop.node.transport.EdgeConnectionProtocol", prefix=several),
            lease_support=leases.announcement() if leases is not None else None,
        )
        supervisor = NodeSupervisor(
            endpoint,
            factory,
            config.token,
            config.reconnect,
            reactor,
            handshake_timeout=config.handshake_timeout_sec,
            log=EdgeLogger(edge.name, "iop.node.supervisor.NodeSupervisor", prefix=several),
        )
        supervised.append(
            SupervisedEdge(edge.name, not (edge.plaintext or edge.tls is None), supervisor)
        )
    supervisors = EdgeSupervisors(supervised, drain)
    supervisors.setName("supervisor")
    group.append(supervisors)
    return supervisors
