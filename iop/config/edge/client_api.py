# -*- test-case-name: iop.test.config.test_openai_section -*-
"""
``openai:`` in edge.yaml: the client API listener (OpenAI and Anthropic surfaces) — its
endpoint, deadlines, connection caps, listen backlog and port sharing, the largest request
body, the client keys (``auth``) with their model scopes, browser origins (``cors``) and the
``model_routes`` that send a model id straight to one adapter.

Absent, the Edge serves no client API.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from iop.config.checks import MAX_FRAME_BYTES_LIMIT, check_tcp_endpoint, is_loopback_host
from iop.config.edge import links
from iop.config.errors import Section, as_section
from iop.config.model import (
    DEFAULT_CLIENT_IDLE_TIMEOUT_SEC,
    DEFAULT_CORS_MAX_AGE_SEC,
    DEFAULT_LISTEN_BACKLOG,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_BODY_MIN_RATE,
    DEFAULT_REQUEST_BODY_TIMEOUT_SEC,
    DEFAULT_REQUEST_HEAD_TIMEOUT_SEC,
    ClientAPIConfig,
    ClientKey,
    CorsConfig,
    ModelConfig,
    ModelRoute,
    NodeConfig,
)
from iop.config.secrets import edge_node_token

__all__ = ["client_api_section", "origin_problem"]


def client_api_section(
    top: Section,
    *,
    nodes: tuple[NodeConfig, ...],
    models: tuple[ModelConfig, ...],
    base_dir: str,
    environ: Mapping[str, str],
) -> tuple[tuple[ModelRoute, ...], ClientAPIConfig]:
    """``top.openai``: the model routes and the client API (off when absent)."""
    openai = top.section("openai")
    if openai is None:
        return (), ClientAPIConfig()
    issues = top.issues
    listen = openai.string("listen") or None
    interface: str | None = None
    if listen is not None:
        interface = check_tcp_endpoint(issues, openai.path_of("listen"), listen)
    max_body = openai.integer(
        "max_body_bytes", DEFAULT_MAX_BODY_BYTES, minimum=1024, maximum=MAX_FRAME_BYTES_LIMIT
    )
    limits = _client_limits(openai, listen)
    routes = _model_routes(openai, nodes, models)
    auth = True
    keys: list[ClientKey] = []
    auth_section = openai.section("auth")
    if auth_section is not None:
        auth = auth_section.boolean("enabled", True)
        keys = _keys(auth_section, models, routes, base_dir=base_dir, environ=environ)
        auth_section.finish()
    if listen is not None:
        if not auth and not (interface is not None and is_loopback_host(interface)):
            issues.add(
                "openai.auth.enabled",
                "auth may only be turned off when openai.listen binds a loopback interface",
            )
        if auth and not keys and not issues:
            issues.add("openai.auth.keys", "auth is on: configure at least one key")
    cors = _cors(openai, auth)
    openai.finish()
    return routes, ClientAPIConfig(
        listen=listen,
        auth=auth,
        keys=tuple(keys),
        max_body_bytes=max_body,
        cors=cors,
        **limits,
    )


def _keys(
    auth: Section,
    models: tuple[ModelConfig, ...],
    routes: tuple[ModelRoute, ...],
    *,
    base_dir: str,
    environ: Mapping[str, str],
) -> list[ClientKey]:
    """``auth.keys``: each a unique name, a token (kept as a digest) and a model scope."""
    keys: list[ClientKey] = []
    names: set[str] = set()
    for path, item in auth.items("keys") or ():
        key_section = as_section(auth.issues, path, item)
        if key_section is None:
            continue
        name = key_section.string("name", required=True, nonempty=True)
        if name in names:
            auth.issues.add(key_section.path_of("name"), f"duplicate key name {name!r}")
        names.add(name)
        digest = edge_node_token(key_section, base_dir=base_dir, environ=environ, name="key")
        allowed = tuple(key_section.string_list("models"))
        links.key_models(key_section, allowed, models, routes)
        key_section.finish()
        if digest is not None:
            keys.append(ClientKey(name=name, digest=digest, models=allowed))
    return keys


def _cors(openai: Section, auth: bool) -> CorsConfig | None:
    """``openai.cors``: origins exactly as a browser sends them, or ``*`` alone with auth."""
    section = openai.section("cors")
    if section is None:
        return None
    issues = section.issues
    path = section.path_of("allow_origins")
    given = section.has("allow_origins")
    origins = section.string_list("allow_origins", unique=True)
    max_age = section.integer("max_age_sec", DEFAULT_CORS_MAX_AGE_SEC, minimum=0, maximum=86400)
    section.finish()
    if not given:
        issues.add(path, "list the origins allowed (or remove openai.cors)")
    elif not origins and isinstance(section.data.get("allow_origins"), list):
        issues.add(path, "is empty: list at least one origin (or remove openai.cors)")
    for i, origin in enumerate(origins):
        problem = origin_problem(origin)
        if origin == "*":
            if len(origins) > 1:
                problem = "'*' allows every origin: give it alone"
            elif not auth:
                problem = "'*' needs openai.auth on: without keys any page could use the API"
        if problem is not None:
            issues.add(f"{path}[{i}]", problem)
    return CorsConfig(allow_origins=origins, max_age_sec=max_age)


def _client_limits(openai: Section, listen: str | None) -> dict[str, Any]:
    """The client listener's deadlines, connection caps, listen backlog and port sharing."""
    issues = openai.issues
    limits: dict[str, Any] = {
        "request_head_timeout_sec": openai.number(
            "request_head_timeout_sec", DEFAULT_REQUEST_HEAD_TIMEOUT_SEC, positive=True
        ),
        "request_body_timeout_sec": openai.number(
            "request_body_timeout_sec", DEFAULT_REQUEST_BODY_TIMEOUT_SEC, positive=True
        ),
        "request_body_min_rate": openai.integer(
            "request_body_min_rate", DEFAULT_REQUEST_BODY_MIN_RATE, minimum=1
        ),
        "idle_timeout_sec": openai.number(
            "idle_timeout_sec", DEFAULT_CLIENT_IDLE_TIMEOUT_SEC, positive=True
        ),
    }
    total = openai.integer("max_connections", DEFAULT_MAX_CONNECTIONS, minimum=1, maximum=1_000_000)
    # Not given: a quarter of the served cap, once the Edge knows what it can afford.
    per_peer = (
        openai.integer("max_connections_per_peer", 1, minimum=1, maximum=1_000_000)
        if openai.has("max_connections_per_peer")
        else None
    )
    if per_peer is not None and per_peer > total:
        issues.add(
            openai.path_of("max_connections_per_peer"),
            f"must be <= max_connections ({total})",
        )
    backlog_given = openai.has("listen_backlog")
    backlog = openai.integer("listen_backlog", DEFAULT_LISTEN_BACKLOG, minimum=1, maximum=65535)
    if backlog_given and listen is not None and re.search(r"(?:^|:)backlog=", listen):
        issues.add(
            openai.path_of("listen_backlog"),
            "openai.listen already sets backlog=: give the backlog in one place",
        )
    reuse_port = openai.boolean("reuse_port", False)
    if reuse_port and listen is None:
        issues.add(
            openai.path_of("reuse_port"),
            "shares the client port between Edge processes: set openai.listen too",
        )
    limits.update(
        max_connections=total,
        max_connections_per_peer=per_peer,
        listen_backlog=backlog,
        reuse_port=reuse_port,
    )
    return limits


def _model_routes(
    openai: Section, nodes: tuple[NodeConfig, ...], models: tuple[ModelConfig, ...]
) -> tuple[ModelRoute, ...]:
    """``model_routes``: a model id sent straight to one adapter (on one node, or any)."""
    routes: list[ModelRoute] = []
    seen: dict[str, str] = {}
    for path, item in openai.items("model_routes") or ():
        section = as_section(openai.issues, path, item)
        if section is None:
            continue
        model = section.string("model", required=True, nonempty=True)
        adapter = section.string("adapter", required=True, nonempty=True)
        target = section.string("target", required=True, nonempty=True)
        node_id = section.string("node") or None
        section.finish()
        if model in seen:
            section.issues.add(
                section.path_of("model"), f"duplicate route for {model!r} (also {seen[model]})"
            )
        elif model:
            seen[model] = path
        route = ModelRoute(model=model, adapter=adapter, target=target, node_id=node_id)
        links.route_targets(section, route, nodes, models)
        routes.append(route)
    return tuple(routes)


_ORIGIN = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?"
)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def origin_problem(origin: str) -> str | None:
    """
    Why ``origin`` is not an origin as a browser sends it in ``Origin`` (RFC 6454 §6.2:
    lowercase scheme and host, the port only when it is not the scheme's default, no path),
    or None. ``*`` passes (the caller checks where it may stand); ``null`` never does.
    """
    if origin == "*":
        return None
    if origin.lower() == "null":
        return "'null' is the origin of sandboxed and file: pages: it cannot be allowed safely"
    shape = "must be an origin as browsers send it: scheme://host[:port], no path"
    match = _ORIGIN.fullmatch(origin.lower())
    if match is None:
        return f"{shape} (got {origin!r})"
    if origin != origin.lower():
        return f"browsers send origins in lowercase: write {origin.lower()!r}"
    port = match.group("port")
    if port is not None and _DEFAULT_PORTS.get(match.group("scheme")) == port:
        default = f"{match.group('scheme')}://{match.group('host')}"
        return f"browsers leave the default port out: write {default!r}"
    if port is not None and not 0 < int(port) < 65536:
        return f"port {port} is out of range"
    return None
