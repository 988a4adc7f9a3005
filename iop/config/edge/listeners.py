# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_admin_section -*-
"""
The Edge's own identity and listeners in edge.yaml: ``edge:`` (its id and how long it drains
when it stops), ``listen:`` (where nodes and the admin API connect) and ``admin:`` (the admin
API's bearer token).

``edge.drain_timeout_sec`` (default 30 s, 0 = cut at once) bounds a stopping Edge's drain: the
client listener closes at once, the work in flight gets this long to finish, what is left is
then cancelled (:mod:`iop.edge.ingress.drain`). A service manager's stop timeout must exceed it
(``TimeoutStopSec`` in the systemd units).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iop.config.checks import check_id, check_tcp_endpoint, endpoint_interface
from iop.config.edge import links
from iop.config.errors import Section
from iop.config.model import DEFAULT_DRAIN_TIMEOUT_SEC, AdminConfig, NodeToken
from iop.config.secrets import edge_node_token

__all__ = [
    "DEFAULT_ADMIN_LISTEN",
    "DEFAULT_EDGE_ID",
    "Identity",
    "Listen",
    "admin_section",
    "identity_section",
    "listen_section",
]

DEFAULT_EDGE_ID = "edge"
DEFAULT_ADMIN_LISTEN = "tcp:8081:interface=127.0.0.1"


@dataclass(frozen=True)
class Listen:
    """``listen:`` as read, with the interfaces its endpoints bind."""

    nodes: str = ""
    admin: str = DEFAULT_ADMIN_LISTEN
    # The interface listen.nodes binds ("" all interfaces; None unknown: already an issue).
    nodes_interface: str | None = None
    # The admin listener's interface ("" all interfaces; None unknown: already an issue).
    admin_interface: str | None = "127.0.0.1"


@dataclass(frozen=True)
class Identity:
    """``edge:`` as read."""

    id: str = DEFAULT_EDGE_ID
    drain_timeout_sec: float = DEFAULT_DRAIN_TIMEOUT_SEC


def identity_section(top: Section) -> Identity:
    """``edge.id`` (``edge`` when absent) and ``edge.drain_timeout_sec`` (>= 0)."""
    identity = top.section("edge")
    if identity is None:
        return Identity()
    edge_id = identity.string("id", DEFAULT_EDGE_ID, nonempty=True)
    check_id(top.issues, identity.path_of("id"), edge_id)
    drain = identity.number("drain_timeout_sec", DEFAULT_DRAIN_TIMEOUT_SEC, minimum=0)
    identity.finish()
    return Identity(edge_id, drain)


def listen_section(top: Section) -> Listen:
    """``listen.nodes`` (a ``tcp:`` endpoint, required) and ``listen.admin``."""
    listen = top.section("listen", required=True)
    if listen is None:
        return Listen()
    issues = top.issues
    interface: str | None = None
    node_listen = listen.string("nodes", required=True)
    if node_listen.strip():
        interface = check_tcp_endpoint(issues, listen.path_of("nodes"), node_listen)
    admin_listen = listen.string("admin", DEFAULT_ADMIN_LISTEN, nonempty=True)
    if admin_listen.startswith("tcp:"):
        admin_interface = check_tcp_endpoint(issues, listen.path_of("admin"), admin_listen)
    else:
        admin_interface = endpoint_interface(admin_listen)
    listen.finish()
    return Listen(node_listen, admin_listen, interface, admin_interface)


def admin_section(
    top: Section, listen: Listen, *, base_dir: str, environ: Mapping[str, str]
) -> AdminConfig:
    """
    ``admin.auth`` (``token: ${ENV}`` / ``token_file`` / ``token_sha256``, kept as a
    digest); required when ``listen.admin`` binds anything but loopback.
    """
    issues = top.issues
    before = len(issues)
    section = top.section("admin")
    auth: NodeToken | None = None
    given = False
    if section is not None:
        auth_section = section.section("auth")
        if auth_section is not None:
            given = True
            auth = edge_node_token(auth_section, base_dir=base_dir, environ=environ)
            auth_section.finish()
        section.finish()
    links.admin_auth(issues, listen.admin_interface, given=given, clean=len(issues) == before)
    return AdminConfig(auth=auth)
