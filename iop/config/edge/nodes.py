# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
``nodes:`` in edge.yaml: the nodes allowed to register — each one's id, token (kept as a
digest), alias, agent kind, concurrency, lease recipient key (managed mode), and its
``adapters`` (:mod:`iop.config.edge.adapters`) and ``providers``
(:mod:`iop.config.edge.providers`).
"""

from __future__ import annotations

from collections.abc import Mapping

from iop.config.checks import check_id, optional_file
from iop.config.edge import links
from iop.config.edge.adapters import adapters_list
from iop.config.edge.known import (
    CredentialBinding,
    Profiles,
    ProviderCapacity,
    ProviderIndex,
    Security,
    Slots,
)
from iop.config.edge.providers import providers_list
from iop.config.errors import Section, as_section
from iop.config.model import NodeConfig, NodeToken
from iop.config.secrets import edge_node_token

__all__ = ["nodes_section"]


def nodes_section(
    top: Section,
    *,
    security: Security,
    profiles: Profiles,
    slots: Slots,
    base_dir: str,
    environ: Mapping[str, str],
) -> tuple[tuple[NodeConfig, ...], ProviderIndex]:
    """Every ``nodes[]`` entry, and every node's providers by id (for ``models[]``)."""
    issues = top.issues
    index = ProviderIndex()
    items = top.items("nodes", required=True)
    if not items:
        index.complete = False
    if items is not None and not items:
        issues.add(top.path_of("nodes"), "must list at least one node")
    result: list[NodeConfig] = []
    ids: dict[str, str] = {}
    tokens: dict[bytes, str] = {}
    for path, item in items or ():
        section = as_section(issues, path, item)
        if section is None:
            index.complete = False
            continue
        node_id = section.string("id", required=True)
        check_id(issues, section.path_of("id"), node_id)
        if node_id in ids:
            issues.add(
                section.path_of("id"), f"duplicate node id {node_id!r} (also {ids[node_id]})"
            )
        elif node_id:
            ids[node_id] = path
        alias = section.string("alias")
        agent_kind = section.string("agent_kind")
        concurrency = section.integer("concurrency", 0, minimum=0)
        token = edge_node_token(section, base_dir=base_dir, environ=environ)
        if token is not None:
            if token.sha256 in tokens:
                issues.add(
                    path,
                    f"has the same token as {tokens[token.sha256]}; each node needs its own token",
                )
            else:
                tokens[token.sha256] = path
        recipient_key_file = optional_file(section, "recipient_key_file", base_dir)
        links.managed_node(section, node_id, security)
        adapters = adapters_list(section, node_id, environ=environ)
        bindings: dict[str, list[CredentialBinding]] = {}
        capacities: list[ProviderCapacity] = []
        providers = providers_list(
            section,
            node_id,
            adapters,
            bindings,
            index=index,
            security=security,
            profiles=profiles,
            slots=slots,
            capacities=capacities,
        )
        links.adapter_capacity(issues, adapters, capacities)
        links.adapter_headers(issues, adapters, bindings, security=security, profiles=profiles)
        section.finish()
        result.append(
            NodeConfig(
                id=node_id,
                token=token if token is not None else NodeToken(b""),
                alias=alias,
                agent_kind=agent_kind,
                concurrency=concurrency,
                adapters=tuple(a.config for a in adapters),
                providers=providers,
                recipient_key_file=recipient_key_file,
            )
        )
    return tuple(result), index
