# -*- test-case-name: iop.test.config.test_openai_section -*-
"""
``openai:`` in edge.yaml: the client API listener (OpenAI and Anthropic surfaces) — its
endpoint, deadlines, connection caps, listen backlog and port sharing, the largest request
body, the client keys (``auth``) with their model scopes, browser origins (``cors``) and the
``model_routes`` that send a model id straight to one adapter.

Absent, the Edge serves no client API.

Limits and budgets (``openai.auth``; enforced by :mod:`iop.edge.quota`): each key may set
``limits`` (``requests_per_minute``, ``tokens_per_minute``, ``concurrent_requests``) and
``budgets`` (a list, one entry per ``period`` — ``day``, ``week``, ``month``, ``total``,
calendar periods in UTC — with ``tokens`` and/or ``cost``), and belong to a ``team``
(``openai.auth.teams[]``: a name, its own ``limits`` and ``budgets``; the team's usage is the
sum of its keys'). A key that sets no ``limits`` (no ``budgets``) gets ``default_limits``
(``default_budgets``); ``limits: {}`` / ``budgets: []`` say "unlimited" explicitly. Every
number must be positive; a field left out is unlimited. ``cost`` is a decimal in the usage
currency, kept as integer micro-units (rounded half up to 0.000001).

Key lifecycle: ``disabled: true`` refuses the key at once (401); rotation gives the new key as
``key``/``key_file``/``key_sha256`` and the old one as ``previous_key``/``previous_key_file``/
``previous_key_sha256`` with ``previous_valid_until`` (an ISO 8601 time with its zone, e.g.
``2026-12-10T00:00:00Z``): both are accepted until then, only the new one after.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from iop.config.checks import MAX_FRAME_BYTES_LIMIT, check_tcp_endpoint, is_loopback_host
from iop.config.edge import links
from iop.config.errors import MISSING, Section, as_section, type_name
from iop.config.model import (
    BUDGET_PERIODS,
    DEFAULT_CLIENT_IDLE_TIMEOUT_SEC,
    DEFAULT_CORS_MAX_AGE_SEC,
    DEFAULT_LISTEN_BACKLOG,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_BODY_MIN_RATE,
    DEFAULT_REQUEST_BODY_TIMEOUT_SEC,
    DEFAULT_REQUEST_HEAD_TIMEOUT_SEC,
    MICROS_PER_UNIT,
    Budget,
    ClientAPIConfig,
    ClientKey,
    CorsConfig,
    Limits,
    ModelConfig,
    ModelRoute,
    NodeConfig,
    NodeToken,
    Team,
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
    teams: tuple[Team, ...] = ()
    default_limits = Limits()
    default_budgets: tuple[Budget, ...] = ()
    auth_section = openai.section("auth")
    if auth_section is not None:
        auth = auth_section.boolean("enabled", True)
        teams = _teams(auth_section)
        default_limits = _limits(auth_section, "default_limits") or Limits()
        default_budgets = _budgets(auth_section, "default_budgets") or ()
        keys = _keys(
            auth_section,
            models,
            routes,
            teams,
            (default_limits, default_budgets),
            base_dir=base_dir,
            environ=environ,
        )
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
        teams=teams,
        default_limits=default_limits,
        default_budgets=default_budgets,
        **limits,
    )


def _keys(
    auth: Section,
    models: tuple[ModelConfig, ...],
    routes: tuple[ModelRoute, ...],
    teams: tuple[Team, ...],
    defaults: tuple[Limits, tuple[Budget, ...]],
    *,
    base_dir: str,
    environ: Mapping[str, str],
) -> list[ClientKey]:
    """
    ``auth.keys``: each a unique name, a token (kept as a digest), a model scope, and its
    lifecycle (rotation, ``disabled``), team, limits and budgets (``defaults`` when unset).
    """
    keys: list[ClientKey] = []
    names: set[str] = set()
    team_names = {team.name for team in teams}
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
        previous, until = _previous_key(key_section, base_dir=base_dir, environ=environ)
        if previous is not None and digest is not None and previous == digest:
            given = next(k for k in _PREVIOUS if key_section.has(k))
            auth.issues.add(
                key_section.path_of(given),
                "is the same key as the current one: give the key being replaced",
            )
        disabled = key_section.boolean("disabled", False)
        team = key_section.string("team", nonempty=True)
        if team and team not in team_names:
            known = ", ".join(repr(t) for t in sorted(team_names)) or "none"
            auth.issues.add(
                key_section.path_of("team"),
                f"no team {team!r} in openai.auth.teams (teams: {known})",
            )
        key_limits = _limits(key_section, "limits")
        key_budgets = _budgets(key_section, "budgets")
        key_section.finish()
        if digest is not None:
            keys.append(
                ClientKey(
                    name=name,
                    digest=digest,
                    models=allowed,
                    previous_digest=previous,
                    previous_valid_until=until,
                    disabled=disabled,
                    team=team,
                    limits=defaults[0] if key_limits is None else key_limits,
                    budgets=defaults[1] if key_budgets is None else key_budgets,
                )
            )
    return keys


_PREVIOUS = ("previous_key", "previous_key_file", "previous_key_sha256")


def _previous_key(
    section: Section, *, base_dir: str, environ: Mapping[str, str]
) -> tuple[NodeToken | None, float | None]:
    """A rotated key's ``previous_key*`` and ``previous_valid_until`` (both or neither)."""
    given = [key for key in _PREVIOUS if section.has(key)]
    until = _utc_time(section, "previous_valid_until")
    if not given:
        if until is not None:
            section.issues.add(
                section.path_of("previous_valid_until"),
                "has no previous key: give previous_key, previous_key_file or "
                "previous_key_sha256 (or remove it)",
            )
        for key in _PREVIOUS:
            section.raw(key)  # an explicit null is no previous key, not an unknown key
        return None, None
    previous = edge_node_token(section, base_dir=base_dir, environ=environ, name="previous_key")
    if until is None and not section.has("previous_valid_until"):
        section.issues.add(
            section.path_of("previous_valid_until"),
            "is required with a previous key: until when the replaced key stays valid "
            "(e.g. 2026-12-10T00:00:00Z)",
        )
    return previous, until


def _utc_time(section: Section, key: str) -> float | None:
    """An ISO 8601 time with its zone (YAML's timestamp or a string), as epoch seconds."""
    value = section.raw(key)
    if value is MISSING:
        return None
    path = section.path_of(key)
    shape = "must be a time with its zone, e.g. 2026-12-10T00:00:00Z"
    when: datetime.datetime | None = None
    if isinstance(value, datetime.datetime):
        when = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            when = datetime.datetime.fromisoformat(text)
        except ValueError:
            section.issues.add(path, f"{shape} (got {value!r})")
            return None
    else:
        section.issues.add(path, f"{shape}, got {type_name(value)}")
        return None
    if when.tzinfo is None or when.utcoffset() is None:
        section.issues.add(path, f"{shape}: add the zone (Z for UTC)")
        return None
    return when.timestamp()


def _teams(auth: Section) -> tuple[Team, ...]:
    """``auth.teams``: each a unique name with its own limits and budgets."""
    teams: list[Team] = []
    names: set[str] = set()
    for path, item in auth.items("teams") or ():
        section = as_section(auth.issues, path, item)
        if section is None:
            continue
        name = section.string("name", required=True, nonempty=True)
        if name in names:
            auth.issues.add(section.path_of("name"), f"duplicate team name {name!r}")
        names.add(name)
        limits = _limits(section, "limits") or Limits()
        budgets = _budgets(section, "budgets") or ()
        section.finish()
        teams.append(Team(name=name, limits=limits, budgets=budgets))
    return tuple(teams)


def _limits(parent: Section, key: str) -> Limits | None:
    """``parent.<key>``: a :class:`Limits` (each field a positive integer, absent =
    unlimited); ``None`` when the key is absent."""
    section = parent.section(key)
    if section is None:
        return None
    limits = Limits(
        requests_per_minute=_positive(section, "requests_per_minute"),
        tokens_per_minute=_positive(section, "tokens_per_minute"),
        concurrent_requests=_positive(section, "concurrent_requests"),
    )
    section.finish()
    return limits


def _budgets(parent: Section, key: str) -> tuple[Budget, ...] | None:
    """``parent.<key>``: a list of budgets, at most one per period; ``None`` when absent."""
    items = parent.items(key)
    if items is None:
        return None
    budgets: list[Budget] = []
    periods: dict[str, str] = {}
    for path, item in items:
        section = as_section(parent.issues, path, item)
        if section is None:
            continue
        period = section.choice("period", BUDGET_PERIODS, required=True)
        tokens = _positive(section, "tokens")
        cost = _cost(section, "cost")
        section.finish()
        if (
            tokens is None
            and cost is None
            and not section.has("tokens")
            and not section.has("cost")
        ):
            parent.issues.add(path, "a budget needs tokens, cost or both")
        if period in periods:
            parent.issues.add(
                section.path_of("period"),
                f"a second {period!r} budget (also {periods[period]}): give tokens and cost "
                "in one entry",
            )
        elif period:
            periods[period] = path
        budgets.append(Budget(period=period, tokens=tokens, cost_micros=cost))
    return tuple(budgets)


def _positive(section: Section, key: str) -> int | None:
    """An optional integer >= 1."""
    if not section.has(key):
        section.raw(key)
        return None
    return section.optional_integer(key, minimum=1)


def _cost(section: Section, key: str) -> int | None:
    """An optional positive decimal amount of the currency, as integer micro-units."""
    value = section.raw(key)
    if value is MISSING:
        return None
    path = section.path_of(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        section.issues.add(path, f"must be a number, got {type_name(value)}")
        return None
    if isinstance(value, float) and not math.isfinite(value):
        section.issues.add(path, "must be a finite number")
        return None
    micros = int(
        (Decimal(str(value)) * MICROS_PER_UNIT).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    )
    if micros <= 0:
        section.issues.add(path, "must be > 0 (at least 0.000001)")
        return None
    return micros


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
