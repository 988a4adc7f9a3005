# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
Load and validate edge.yaml into a frozen :class:`~iop.config.model.EdgeConfig`.

:func:`parse_edge_config` works on already-loaded YAML data; :func:`load_edge_config` reads a
file. Both collect every problem into one :class:`~iop.config.errors.ConfigError`. Relative
file paths resolve against the config file's directory and are stored absolute.

Each top-level section has a module of its own, read in the order :func:`_edge_config` lists
(a section may depend on the ones before it, never on one after): ``edge``/``listen``/``admin``
(:mod:`.listeners`), ``security``, ``node_transport`` (:mod:`.transport`),
``protocol_profiles`` (:mod:`.profiles`), ``credentials``, ``nodes`` (with :mod:`.adapters` and
:mod:`.providers`), ``models``, ``openai`` (:mod:`.client_api`), ``logging``
(:mod:`iop.config.logs`, shared with node.yaml), ``telemetry`` (:mod:`iop.config.telemetry`,
shared with node.yaml), ``cluster`` and ``usage`` (:mod:`.usage`).
Every check that ties one section to another is in :mod:`.links`; what a section makes known to
later ones is in :mod:`.known`.

Managed mode (``security.mode: managed``) adds the ``credentials[]`` catalog and its rules:
mTLS node transport, the lease-signing key, each node's recipient key, and credentials that
reach a provider only through its slot and its profile's ``auth_header``. Key files are only
checked to exist and be readable here; the Edge parses them when it starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# The shared value checks, importable from here as they always were.
from iop.config.checks import (
    ID_PATTERN,
    MAX_FRAME_BYTES_LIMIT,
    is_loopback_host,
    optional_file,
    required_file,
    split_endpoint,
)
from iop.config.edge import links
from iop.config.edge.client_api import client_api_section
from iop.config.edge.cluster import cluster_section
from iop.config.edge.credentials import credentials_section
from iop.config.edge.listeners import (
    admin_section,
    identity_section,
    listen_section,
)
from iop.config.edge.models import models_section
from iop.config.edge.nodes import nodes_section
from iop.config.edge.profiles import profiles_section
from iop.config.edge.security import security_section
from iop.config.edge.transport import transport_section
from iop.config.edge.usage import usage_section
from iop.config.errors import Issues, as_section, read_yaml_file
from iop.config.logs import logging_section
from iop.config.model import EdgeConfig
from iop.config.telemetry import telemetry_section

__all__ = [
    "ID_PATTERN",
    "MAX_FRAME_BYTES_LIMIT",
    "is_loopback_host",
    "load_edge_config",
    "optional_file",
    "parse_edge_config",
    "required_file",
    "split_endpoint",
]


def load_edge_config(path: str, environ: Mapping[str, str] = os.environ) -> EdgeConfig:
    """
    Read, validate and build the Edge configuration in the YAML file ``path``.

    @raise ConfigError: listing every problem found.
    """
    source = os.path.abspath(path)
    data = read_yaml_file(path)
    return parse_edge_config(
        data, base_dir=os.path.dirname(source), environ=environ, source_path=source
    )


def parse_edge_config(
    data: object, *, base_dir: str, environ: Mapping[str, str], source_path: str = ""
) -> EdgeConfig:
    """
    Validate and build the Edge configuration from loaded YAML ``data``. Relative paths
    resolve against ``base_dir``; ``${VAR}`` references resolve from ``environ``.

    @raise ConfigError: listing every problem found.
    """
    issues = Issues()
    config = _edge_config(issues, data, base_dir, environ, source_path)
    issues.raise_if_any(source_path)
    assert config is not None
    return config


def _edge_config(
    issues: Issues, data: object, base_dir: str, environ: Mapping[str, str], source_path: str
) -> EdgeConfig | None:
    """The sections in reading order; ``None`` if any of them had an issue."""
    top = as_section(issues, "", data)
    if top is None:
        return None
    identity = identity_section(top)
    edge_id = identity.id
    listen = listen_section(top)
    admin = admin_section(top, listen, base_dir=base_dir, environ=environ)
    # Read first: the mode decides what the rest of the file must hold.
    security = security_section(top, base_dir=base_dir)
    transport = transport_section(
        top, nodes_interface=listen.nodes_interface, security=security, base_dir=base_dir
    )
    profiles = profiles_section(top)
    slots = credentials_section(top, security=security, base_dir=base_dir, environ=environ)
    nodes, providers = nodes_section(
        top,
        security=security,
        profiles=profiles,
        slots=slots,
        base_dir=base_dir,
        environ=environ,
    )
    models = models_section(top, providers)
    routes, client_api = client_api_section(
        top, nodes=nodes, models=models, base_dir=base_dir, environ=environ
    )
    links.cost_budgets_priced(issues, top.data.get("openai"), models, routes)
    logging = logging_section(top)
    telemetry = telemetry_section(top, base_dir=base_dir, environ=environ)
    cluster = cluster_section(
        top,
        edge_id=edge_id,
        base_dir=base_dir,
        environ=environ,
        heartbeat_timeout_sec=transport.heartbeat.timeout_sec,
    )
    usage = usage_section(top, base_dir=base_dir)
    top.finish()

    if issues:
        return None
    return EdgeConfig(
        id=edge_id,
        drain_timeout_sec=identity.drain_timeout_sec,
        node_listen=listen.nodes,
        admin_listen=listen.admin,
        tls=transport.tls,
        plaintext_nodes=transport.plaintext,
        heartbeat=transport.heartbeat,
        max_frame_bytes=transport.max_frame_bytes,
        register_timeout_sec=transport.register_timeout_sec,
        nodes=nodes,
        models=models,
        protocol_profiles=profiles.configs,
        model_routes=routes,
        client_api=client_api,
        security=security.config,
        credentials=slots.configs,
        admin=admin,
        logging=logging,
        telemetry=telemetry,
        cluster=cluster,
        usage=usage,
        source_path=source_path,
    )
