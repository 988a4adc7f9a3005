# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
``node_transport:`` in edge.yaml: how nodes connect to ``listen.nodes`` — TLS (with the CA
that issues node client certificates) or loopback-only plaintext —, the heartbeat, the largest
frame and the registration deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from iop.config.checks import MAX_FRAME_BYTES_LIMIT, optional_file, required_file
from iop.config.edge import links
from iop.config.edge.known import Security
from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_HEARTBEAT_INTERVAL_SEC,
    DEFAULT_HEARTBEAT_TIMEOUT_SEC,
    DEFAULT_MAX_FRAME_BYTES,
    HeartbeatConfig,
    ServerTLS,
)

__all__ = ["DEFAULT_REGISTER_TIMEOUT_SEC", "Transport", "transport_section"]

DEFAULT_REGISTER_TIMEOUT_SEC = 10.0


@dataclass(frozen=True)
class Transport:
    """``node_transport:`` as read."""

    plaintext: bool
    tls: ServerTLS | None
    heartbeat: HeartbeatConfig
    max_frame_bytes: int
    register_timeout_sec: float


def transport_section(
    top: Section, *, nodes_interface: str | None, security: Security, base_dir: str
) -> Transport:
    """
    ``top.node_transport``: TLS is required unless ``plaintext: true`` (then only on a
    loopback ``listen.nodes``, and never in managed mode).
    """
    transport = top.section("node_transport") or Section(top.issues, "node_transport", {})
    plaintext, tls = _security(transport, nodes_interface, base_dir)
    links.managed_transport(transport, security, plaintext, tls)
    heartbeat = _heartbeat(transport)
    max_frame = transport.integer(
        "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1, maximum=MAX_FRAME_BYTES_LIMIT
    )
    register_timeout = transport.number(
        "register_timeout_sec", DEFAULT_REGISTER_TIMEOUT_SEC, positive=True
    )
    transport.finish()
    return Transport(plaintext, tls, heartbeat, max_frame, register_timeout)


def _security(
    transport: Section, nodes_interface: str | None, base_dir: str
) -> tuple[bool, ServerTLS | None]:
    plaintext = transport.boolean("plaintext", False)
    tls_present = transport.has("tls")
    tls_section = transport.section("tls")
    if plaintext:
        if tls_present:
            transport.issues.add(transport.path_of("tls"), "must not be set when plaintext is true")
        links.plaintext_nodes(transport, nodes_interface)
        return True, None
    if not tls_present:
        transport.issues.add(
            transport.path_of("tls"), "is required unless node_transport.plaintext is true"
        )
        return False, None
    if tls_section is None:
        return False, None
    cert = required_file(tls_section, "cert_file", base_dir)
    key = required_file(tls_section, "key_file", base_dir)
    client_ca = optional_file(tls_section, "client_ca_file", base_dir)
    tls_section.finish()
    return False, ServerTLS(cert_file=cert, key_file=key, client_ca_file=client_ca)


def _heartbeat(transport: Section) -> HeartbeatConfig:
    section = transport.section("heartbeat")
    if section is None:
        return HeartbeatConfig()
    interval = section.number("interval_sec", DEFAULT_HEARTBEAT_INTERVAL_SEC, positive=True)
    timeout = section.number("timeout_sec", DEFAULT_HEARTBEAT_TIMEOUT_SEC, positive=True)
    if timeout <= interval:
        section.issues.add(
            section.path_of("timeout_sec"),
            f"must be greater than interval_sec ({interval:g})",
        )
    section.finish()
    return HeartbeatConfig(interval_sec=interval, timeout_sec=timeout)
