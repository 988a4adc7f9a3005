# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_admin_section -*-
"""
The Edge's own identity and listeners in edge.yaml: ``edge:`` (its id), ``listen:`` (where
nodes and the admin API connect) and ``admin:`` (the admin API's bearer token).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iop.config.checks import check_id, check_tcp_endpoint, endpoint_interface
from iop.config.edge import links
from iop.config.errors import Section
from iop.config.model import AdminConfig, NodeToken
from iop.config.secrets import edge_node_token

__all__ = [
    "DEFAULT_ADMIN_LISTEN",
    "DEFAULT_EDGE_ID",
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


def identity_section(top: Section) -> str:
    """``edge.id`` (``edge`` when absent)."""
    identity = top.section("edge")
    edge_id = DEFAULT_EDGE_ID
    if identity is not None:
        edge_id = identity.string("id", DEFAULT_EDGE_ID, nonempty=True)
        check_id(top.issues, identity.path_of("id"), edge_id)
        identity.finish()
    return edge_id


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
