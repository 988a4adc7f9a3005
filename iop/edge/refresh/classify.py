# -*- test-case-name: iop.test.edge.refresh.test_classify -*-
"""
Diff a candidate :class:`~iop.config.model.EdgeConfig` against the running one and classify
every change: ``live`` (applied without a restart), ``restart_required`` (the running Edge keeps
the old value until it restarts) or ``rejected``.

One rule per field of every config dataclass (:data:`RULES`) says where the field lives in
edge.yaml, its class and why; the README's "Config refresh" table is
:func:`classification_table` written out. List entries are matched by their id or name, never
by position: an entry that only moved is no change, one that appeared or disappeared is. Paths
are in the YAML's own form at the candidate's positions (``nodes[1].providers[0].capacity``); a
removed entry is named at its position in the running config.

Secrets (node tokens, client keys, credential secrets, adapter headers and env) are compared
with their own equality and shown only as ``<secret changed>``; every other value shown goes
through :func:`~iop.security.redact.redact_secrets`.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Literal

from iop.config.model import (
    MICROS_PER_UNIT,
    AdapterConfig,
    AdminConfig,
    Budget,
    ClientAPIConfig,
    ClientKey,
    ClusterConfig,
    CorsConfig,
    CredentialSlot,
    EdgeConfig,
    EdgeSecurity,
    HeartbeatConfig,
    LedgerConfig,
    Limits,
    LoggingConfig,
    ModelConfig,
    ModelProviderRef,
    ModelRoute,
    NodeConfig,
    Price,
    ProfileConfig,
    ProviderConfig,
    ServerTLS,
    Team,
    TelemetryConfig,
    UsageConfig,
)
from iop.edge.refresh.catalog import restart_reasons
from iop.edge.refresh.report import (
    ABSENT,
    MODES,
    SECRET_CHANGED,
    ChangeClass,
    ChangeReport,
    RefreshResult,
)
from iop.security.redact import redact_secrets

__all__ = ["RULES", "candidate_result", "classification_table", "classify", "markdown_table"]

LIVE: ChangeClass = "live"
RESTART: ChangeClass = "restart_required"


# ---------------------------------------------------------------------------------------------
# The rules


@dataclass(frozen=True)
class Leaf:
    """
    A field compared as one value at ``key``. ``secret``: shown only as ``<secret changed>``
    (``"map"``: a name → secret mapping, whose changed names the detail lists). ``folds``: other
    fields of the same record compared with this one (when set on both sides: a disabled
    provider's adapter instance is not resolved) and reported under its key.
    """

    key: str
    change_class: ChangeClass
    why: str
    secret: Literal["", "value", "map"] = ""
    folds: tuple[str, ...] = ()
    origin: str = "seed"


@dataclass(frozen=True)
class Record:
    """A nested config record at ``key``; ``None`` on one side only is one report at ``key``."""

    key: str
    type: type
    change_class: ChangeClass = RESTART
    why: str = ""
    origin: str = "seed"


@dataclass(frozen=True)
class Keyed:
    """
    A list of records at ``key`` matched by ``id_field``; an entry added or removed is one report
    of ``change_class``. ``scope`` names what the entry is in the result's changed lists.
    """

    key: str
    type: type
    id_field: str
    change_class: ChangeClass
    why: str
    scope: Literal["", "node", "provider", "model"] = ""
    origin: str = "seed"


@dataclass(frozen=True)
class Key:
    """The field a :class:`Keyed` list matches its entries by: a new value is another entry."""


@dataclass(frozen=True)
class Folded:
    """Compared as part of another field (``into``), never reported on its own."""

    into: str
    why: str


@dataclass(frozen=True)
class Ignored:
    """Not a setting (never compared)."""

    why: str


Rule = Leaf | Record | Keyed | Key | Folded | Ignored

# Where a rule comes from: seed 001 names the field (or its section), or this project decided.
SEED = "seed"
PROJECT = "project"

_IDENTITY = "Edge identity"
_LISTENER = "a listener is bound once, at start"
_DRAIN = "the drain on stop is set up with the client listener, at start"
_BOOTSTRAP = "TLS/bootstrap: certificates and keys are loaded at start"
_TRANSPORT = "control plane: node connections are built with it"
_OPENAI = "the openai section: the client listener, its keys and routes are built at start"
_SECURITY = "the security mode and the lease signing key are fixed at start"
_NODE_ID = "node token/alias/agent kind: fixed at registration"
_ADAPTER = "adapter settings: the node builds its adapters from them"
_EXECUTION = "a provider execution field: the node's adapter runs with it"
_CATALOG = "provider type/category/adapter/models: the node's resource catalog"
_PROVIDER_ENTRY = (
    "on an adapter the node runs: the pool, status, lease table and credential issuer take it "
    "at once, in-flight work on a removed one finishes (restart: an adapter new on the node, "
    "a move between nodes, an adapter's protocol profile changed)"
)
_POOL = "the provider pool applies it to the next dispatch"
_LONG = "a pool capacity like capacity: the provider pool applies it to the next dispatch"
_MODEL = "models[] display/provider mapping: the Edge's routing, for the next dispatch"
_POLICY = "models[] generation policy, applied per request"
_PROFILE = "delivered to nodes with their adapters (an adapter setting)"
_PLACED_PROFILE = "the Edge's placements carry the profiles it started with"
_LOGGING = "the log observer (its format) is installed when twistd starts logging"
_TELEMETRY = "the trace exporter (its thread, queue and credentials) is built when the Edge starts"
_CLUSTER = "the Edge joins the cluster (its Redis lease table) when it starts"
_CREDENTIAL = "rotation and revocation without a restart: the credential issuer re-binds"
# Client keys and their lifecycle: the client pipeline authenticates against the running
# config's keys (iop.edge.ingress.pipeline.Pipeline.use_config, a refresh listener). Limits,
# budgets and teams are the accounting's (iop.edge.quota.QuotaGate.use_config): live too.
_AUTH = "the client pipeline authenticates against the running config's keys, from the next request"
_AUTH_CLASS: ChangeClass = LIVE
_QUOTA = (
    "the accounting takes the running config: new requests see it, running ones end as admitted"
)
_PRICE = "models[].price: read when a finished request's usage is priced"
_LEDGER = "the usage ledger's file is opened, and its pruning scheduled, when the Edge starts"
_CURRENCY = "the label written beside every cost; cost budgets' running totals are in it"

RULES: dict[type, dict[str, Rule]] = {
    EdgeConfig: {
        "id": Leaf("edge.id", RESTART, _IDENTITY),
        "drain_timeout_sec": Leaf("edge.drain_timeout_sec", RESTART, _DRAIN, origin=PROJECT),
        "node_listen": Leaf("listen.nodes", RESTART, _LISTENER),
        "admin_listen": Leaf("listen.admin", RESTART, _LISTENER),
        "tls": Record("node_transport.tls", ServerTLS, RESTART, _BOOTSTRAP),
        "plaintext_nodes": Leaf("node_transport.plaintext", RESTART, _BOOTSTRAP),
        "heartbeat": Record("node_transport.heartbeat", HeartbeatConfig),
        "max_frame_bytes": Leaf("node_transport.max_frame_bytes", RESTART, _TRANSPORT),
        "register_timeout_sec": Leaf("node_transport.register_timeout_sec", RESTART, _TRANSPORT),
        "nodes": Keyed("nodes", NodeConfig, "id", RESTART, "node add/remove", "node"),
        "models": Keyed(
            "models",
            ModelConfig,
            "id",
            LIVE,
            "a routing key the Edge alone serves; its waiters are re-evaluated",
            "model",
            PROJECT,
        ),
        "protocol_profiles": Keyed(
            "protocol_profiles", ProfileConfig, "name", RESTART, _PROFILE, origin=PROJECT
        ),
        "model_routes": Keyed("openai.model_routes", ModelRoute, "model", RESTART, _OPENAI),
        "client_api": Record("openai", ClientAPIConfig),
        "security": Record("security", EdgeSecurity),
        "credentials": Keyed(
            "credentials",
            CredentialSlot,
            "name",
            LIVE,
            "the issuer re-binds; a provider naming the slot is its own (restart) change",
            origin=PROJECT,
        ),
        "admin": Record("admin", AdminConfig),
        "logging": Record("logging", LoggingConfig),
        "telemetry": Record("telemetry", TelemetryConfig, RESTART, _TELEMETRY, origin=PROJECT),
        "cluster": Record("cluster", ClusterConfig, RESTART, _CLUSTER, origin=PROJECT),
        "usage": Record("usage", UsageConfig, RESTART, _LEDGER, origin=PROJECT),
        "source_path": Ignored("where the file was read from; a refresh reads the same file"),
    },
    ServerTLS: {
        "cert_file": Leaf("cert_file", RESTART, _BOOTSTRAP),
        "key_file": Leaf("key_file", RESTART, _BOOTSTRAP),
        "client_ca_file": Leaf("client_ca_file", RESTART, _BOOTSTRAP),
    },
    HeartbeatConfig: {
        "interval_sec": Leaf("interval_sec", RESTART, _TRANSPORT),
        "timeout_sec": Leaf("timeout_sec", RESTART, _TRANSPORT),
    },
    NodeConfig: {
        "id": Key(),
        "token": Leaf("token", RESTART, _NODE_ID, secret="value"),
        "alias": Leaf("alias", RESTART, _NODE_ID),
        "agent_kind": Leaf("agent_kind", RESTART, _NODE_ID),
        "concurrency": Leaf(
            "concurrency", LIVE, "legacy node runtime concurrency metadata; pushed to the node"
        ),
        "adapters": Keyed("adapters", AdapterConfig, "name", RESTART, _ADAPTER),
        "providers": Keyed(
            "providers",
            ProviderConfig,
            "id",
            LIVE,
            _PROVIDER_ENTRY,
            "provider",
            PROJECT,
        ),
        "recipient_key_file": Leaf("recipient_key_file", RESTART, _BOOTSTRAP, origin=PROJECT),
    },
    AdapterConfig: {
        "name": Key(),
        "type": Leaf("type", RESTART, _ADAPTER),
        "enabled": Leaf("enabled", RESTART, _ADAPTER),
        "base_url": Leaf("base_url", RESTART, _EXECUTION),
        "headers": Leaf("headers", RESTART, _EXECUTION, secret="map"),
        "request_timeout_ms": Leaf("request_timeout_ms", RESTART, _EXECUTION),
        "idle_timeout_ms": Leaf("idle_timeout_ms", RESTART, _ADAPTER),
        "max_concurrency": Leaf(
            "max_concurrency",
            LIVE,
            "pushed to the node, which resizes the adapter's gate in place (nothing rebuilt); "
            "left out, it follows the providers' capacity",
            origin=PROJECT,
        ),
        "command": Leaf("command", RESTART, _EXECUTION),
        "args": Leaf("args", RESTART, _EXECUTION),
        "env": Leaf("env", RESTART, _EXECUTION, secret="map"),
        "workspace": Leaf("workspace", RESTART, _ADAPTER),
        "mode": Leaf("mode", RESTART, _EXECUTION),
        "resume_args": Leaf("resume_args", RESTART, _EXECUTION),
        "output_format": Leaf("output_format", RESTART, _EXECUTION),
        "prompt_placement": Leaf("prompt_placement", RESTART, _ADAPTER),
        "context_size": Leaf("context_size", RESTART, _EXECUTION),
        "settings": Leaf("settings", RESTART, _ADAPTER),
    },
    ProviderConfig: {
        "id": Key(),
        "adapter": Leaf("adapter", RESTART, _CATALOG, folds=("adapter_instance",)),
        "category": Leaf("category", RESTART, _CATALOG),
        "adapter_instance": Folded("adapter", "the adapter instance `adapter` resolves to"),
        "type": Leaf("type", RESTART, _CATALOG),
        "models": Leaf("models", RESTART, _CATALOG),
        "enabled": Leaf("enabled", LIVE, _POOL),
        "priority": Leaf("priority", LIVE, _POOL),
        "capacity": Leaf("capacity", LIVE, _POOL),
        "long_context_threshold": Leaf("long_context_threshold", LIVE, _LONG, origin=PROJECT),
        "long_capacity": Leaf("long_capacity", LIVE, _LONG, origin=PROJECT),
        "max_queue": Leaf("max_queue", LIVE, _POOL),
        "queue_timeout_sec": Leaf("queue_timeout_sec", LIVE, _POOL),
        "profile": Leaf("profile", RESTART, _PROFILE, origin=PROJECT),
        "usage_attribution": Leaf(
            "usage_attribution",
            LIVE,
            "a label the Edge records with usage, read per request",
            origin=PROJECT,
        ),
        "credential": Leaf("credential", RESTART, _EXECUTION, origin=PROJECT),
    },
    ModelConfig: {
        "id": Key(),
        "providers": Leaf("providers", LIVE, _MODEL),
        "display_name": Leaf("display_name", LIVE, _MODEL),
        "default_max_tokens": Leaf("default_max_tokens", LIVE, _POLICY),
        "min_max_tokens": Leaf("min_max_tokens", LIVE, _POLICY),
        "default_thinking_token_budget": Leaf("default_thinking_token_budget", LIVE, _POLICY),
        "token_counter": Leaf("token_counter", LIVE, _POLICY, origin=PROJECT),
        "price": Record("price", Price, LIVE, _PRICE, origin=PROJECT),
    },
    Price: {
        "input": Leaf("input", LIVE, _PRICE, origin=PROJECT),
        "output": Leaf("output", LIVE, _PRICE, origin=PROJECT),
        "cached_input": Leaf("cached_input", LIVE, _PRICE, origin=PROJECT),
        "cache_write": Leaf("cache_write", LIVE, _PRICE, origin=PROJECT),
        "reasoning": Leaf("reasoning", LIVE, _PRICE, origin=PROJECT),
    },
    UsageConfig: {
        "currency": Leaf("currency", RESTART, _CURRENCY, origin=PROJECT),
        "ledger": Record("ledger", LedgerConfig, RESTART, _LEDGER, origin=PROJECT),
    },
    LedgerConfig: {
        "path": Leaf("path", RESTART, _LEDGER, origin=PROJECT),
        "retention_days": Leaf("retention_days", RESTART, _LEDGER, origin=PROJECT),
        "enabled": Leaf("enabled", RESTART, _LEDGER, origin=PROJECT),
    },
    ModelProviderRef: {
        "provider_id": Folded("providers", "an entry of models[].providers"),
        "target": Folded("providers", "an entry of models[].providers"),
    },
    ProfileConfig: {
        "name": Key(),
        "driver": Leaf("driver", RESTART, _PROFILE, origin=PROJECT),
        "operations": Leaf("operations", RESTART, _PROFILE, origin=PROJECT),
        "capabilities": Leaf("capabilities", RESTART, _PROFILE, origin=PROJECT),
        "extensions": Leaf("extensions", RESTART, _PROFILE, origin=PROJECT),
        "auth_header": Leaf("auth_header", RESTART, _PROFILE, origin=PROJECT),
        "auth_scheme": Leaf("auth_scheme", RESTART, _PROFILE, origin=PROJECT),
        "send_request_id": Leaf("send_request_id", RESTART, _PLACED_PROFILE, origin=PROJECT),
    },
    ModelRoute: {
        "model": Key(),
        "adapter": Leaf("adapter", RESTART, _OPENAI),
        "target": Leaf("target", RESTART, _OPENAI),
        "node_id": Leaf("node", RESTART, _OPENAI),
    },
    ClientAPIConfig: {
        "listen": Leaf("listen", RESTART, _OPENAI),
        "auth": Leaf("auth.enabled", RESTART, _OPENAI),
        "keys": Keyed("auth.keys", ClientKey, "name", _AUTH_CLASS, _AUTH),
        "max_body_bytes": Leaf("max_body_bytes", RESTART, _OPENAI),
        "request_head_timeout_sec": Leaf("request_head_timeout_sec", RESTART, _OPENAI),
        "request_body_timeout_sec": Leaf("request_body_timeout_sec", RESTART, _OPENAI),
        "request_body_min_rate": Leaf("request_body_min_rate", RESTART, _OPENAI),
        "idle_timeout_sec": Leaf("idle_timeout_sec", RESTART, _OPENAI),
        "max_connections": Leaf("max_connections", RESTART, _OPENAI),
        "max_connections_per_peer": Leaf("max_connections_per_peer", RESTART, _OPENAI),
        "listen_backlog": Leaf("listen_backlog", RESTART, _OPENAI),
        "reuse_port": Leaf("reuse_port", RESTART, _OPENAI),
        "cors": Record("cors", CorsConfig, RESTART, _OPENAI),
        "teams": Keyed("auth.teams", Team, "name", LIVE, _QUOTA, origin=PROJECT),
        "default_limits": Leaf("auth.default_limits", LIVE, _QUOTA, origin=PROJECT),
        "default_budgets": Leaf("auth.default_budgets", LIVE, _QUOTA, origin=PROJECT),
    },
    ClientKey: {
        "name": Key(),
        "digest": Leaf("key", _AUTH_CLASS, _AUTH, secret="value"),
        "models": Leaf("models", _AUTH_CLASS, _AUTH),
        "previous_digest": Leaf("previous_key", _AUTH_CLASS, _AUTH, secret="value", origin=PROJECT),
        "previous_valid_until": Leaf("previous_valid_until", _AUTH_CLASS, _AUTH, origin=PROJECT),
        "disabled": Leaf("disabled", _AUTH_CLASS, _AUTH, origin=PROJECT),
        "team": Leaf("team", LIVE, _QUOTA, origin=PROJECT),
        "limits": Leaf("limits", LIVE, _QUOTA, origin=PROJECT),
        "budgets": Leaf("budgets", LIVE, _QUOTA, origin=PROJECT),
    },
    Team: {
        "name": Key(),
        "limits": Leaf("limits", LIVE, _QUOTA, origin=PROJECT),
        "budgets": Leaf("budgets", LIVE, _QUOTA, origin=PROJECT),
    },
    CorsConfig: {
        "allow_origins": Leaf("allow_origins", RESTART, _OPENAI),
        "max_age_sec": Leaf("max_age_sec", RESTART, _OPENAI),
    },
    EdgeSecurity: {
        "mode": Leaf("mode", RESTART, _SECURITY, origin=PROJECT),
        "trust_domain": Leaf("trust_domain", RESTART, _SECURITY, origin=PROJECT),
        "signing_key_file": Leaf("lease.signing_key_file", RESTART, _SECURITY, origin=PROJECT),
        "lease_ttl_sec": Leaf("lease.ttl_sec", RESTART, _SECURITY, origin=PROJECT),
    },
    AdminConfig: {
        "auth": Leaf(
            "auth",
            RESTART,
            "the admin listener's bearer-token check is set up at start",
            secret="value",
            origin=PROJECT,
        ),
    },
    LoggingConfig: {
        "format": Leaf("format", RESTART, _LOGGING, origin=PROJECT),
        "level": Leaf(
            "level",
            LIVE,
            "the log level filter is switched with the config (unless --log-level pins it)",
            origin=PROJECT,
        ),
    },
    TelemetryConfig: {
        "endpoint": Leaf("endpoint", RESTART, _TELEMETRY, origin=PROJECT),
        "headers": Leaf("headers", RESTART, _TELEMETRY, secret="value", origin=PROJECT),
        "sampling_ratio": Leaf("sampling_ratio", RESTART, _TELEMETRY, origin=PROJECT),
        "service_name": Leaf("service_name", RESTART, _TELEMETRY, origin=PROJECT),
        "capture_content": Leaf("capture_content", RESTART, _TELEMETRY, origin=PROJECT),
        "queue_size": Leaf("queue_size", RESTART, _TELEMETRY, origin=PROJECT),
        "export_timeout_sec": Leaf("export_timeout_sec", RESTART, _TELEMETRY, origin=PROJECT),
        "shutdown_timeout_sec": Leaf("shutdown_timeout_sec", RESTART, _TELEMETRY, origin=PROJECT),
    },
    ClusterConfig: {
        "redis": Leaf("redis", RESTART, _CLUSTER, origin=PROJECT),
        "edge_id": Leaf("edge_id", RESTART, _CLUSTER, origin=PROJECT),
        "password": Leaf("password", RESTART, _CLUSTER, secret="value", origin=PROJECT),
        "lease_ttl_sec": Leaf("lease_ttl_sec", RESTART, _CLUSTER, origin=PROJECT),
        "key_prefix": Leaf("key_prefix", RESTART, _CLUSTER, origin=PROJECT),
    },
    CredentialSlot: {
        "name": Key(),
        "secret": Leaf("secret", LIVE, _CREDENTIAL, secret="value", origin=PROJECT),
        "revision": Leaf("revision", LIVE, _CREDENTIAL, origin=PROJECT),
        "enabled": Leaf("enabled", LIVE, _CREDENTIAL, origin=PROJECT),
    },
}


# ---------------------------------------------------------------------------------------------
# The diff


@dataclass(frozen=True)
class _Scope:
    node: str = ""
    provider: str = ""
    model: str = ""

    def within(self, scope: str, entry_id: str) -> _Scope:
        if scope == "node":
            return _Scope(node=entry_id)
        if scope == "provider":
            return _Scope(node=self.node, provider=entry_id)
        if scope == "model":
            return _Scope(model=entry_id)
        return self


def classify(running: EdgeConfig, candidate: EdgeConfig) -> list[ChangeReport]:
    """Every change from ``running`` to ``candidate``, in config order, each with its class."""
    reports: list[ChangeReport] = []
    _diff(reports, "", running, candidate, EdgeConfig, _Scope())
    return _providers_added_or_removed(reports, restart_reasons(running, candidate))


def _providers_added_or_removed(
    reports: list[ChangeReport], reasons: dict[tuple[str, str], str]
) -> list[ChangeReport]:
    """
    A provider added or removed is live unless :func:`~iop.edge.refresh.catalog.restart_reasons`
    says why not: then its own report is ``restart_required`` and says so.
    """
    if not reasons:
        return reports
    out: list[ChangeReport] = []
    for r in reports:
        reason = reasons.get((r.node, r.provider))
        entry = r.path.endswith("]") and ABSENT in (r.old, r.new)
        if reason and entry and r.change_class == LIVE:
            what = "added" if r.old == ABSENT else "removed (position in the running config)"
            r = replace(r, change_class=RESTART, detail=f"{what}; {reason}")
        out.append(r)
    return out


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _diff(
    out: list[ChangeReport], prefix: str, old: Any, new: Any, type_: type, scope: _Scope
) -> None:
    rules = RULES[type_]
    for f in fields(type_):
        rule = rules[f.name]
        if isinstance(rule, Leaf):
            _leaf(out, prefix, old, new, f.name, rule, scope)
        elif isinstance(rule, Record):
            _record(
                out,
                _join(prefix, rule.key),
                getattr(old, f.name),
                getattr(new, f.name),
                rule,
                scope,
            )
        elif isinstance(rule, Keyed):
            _keyed(
                out,
                _join(prefix, rule.key),
                getattr(old, f.name),
                getattr(new, f.name),
                rule,
                scope,
            )


def _leaf(
    out: list[ChangeReport],
    prefix: str,
    old: Any,
    new: Any,
    name: str,
    rule: Leaf,
    scope: _Scope,
) -> None:
    names = (name, *rule.folds)
    before = tuple(getattr(old, n) for n in names)
    after = tuple(getattr(new, n) for n in names)
    # A mapping (headers, env, settings...) is a YAML map: its order means nothing.
    mapping = (type(new), name) in _MAPPINGS
    same = dict(before[0]) == dict(after[0]) if mapping else before[0] == after[0]
    if same and all(_same_fold(b, a) for b, a in zip(before[1:], after[1:], strict=True)):
        return
    detail = rule.why
    if rule.secret == "value":
        shown_old = shown_new = SECRET_CHANGED
    elif rule.secret == "map":
        shown_old = shown_new = SECRET_CHANGED
        detail = f"{_changed_names(before[0], after[0])}; {rule.why}"
    else:
        shown_old, shown_new = _show(before[0], mapping), _show(after[0], mapping)
        folded = [
            f"{n}: {_show(b)} → {_show(a)}"
            for n, b, a in zip(names[1:], before[1:], after[1:], strict=True)
            if not _same_fold(b, a)
        ]
        if folded:
            detail = f"{'; '.join(folded)}; {rule.why}"
    out.append(
        _report(_join(prefix, rule.key), shown_old, shown_new, rule.change_class, detail, scope)
    )


def _same_fold(old: object, new: object) -> bool:
    """A folded field counts only when set on both sides ("" = not resolved, e.g. disabled)."""
    return old == new or old in ("", None) or new in ("", None)


def _record(
    out: list[ChangeReport], path: str, old: Any, new: Any, rule: Record, scope: _Scope
) -> None:
    if old is None and new is None:
        return
    if old is None or new is None:
        shown_old = ABSENT if old is None else "set"
        shown_new = ABSENT if new is None else "set"
        out.append(_report(path, shown_old, shown_new, rule.change_class, rule.why, scope))
        return
    _diff(out, path, old, new, rule.type, scope)


def _keyed(
    out: list[ChangeReport],
    path: str,
    old: Iterable[Any],
    new: Iterable[Any],
    rule: Keyed,
    scope: _Scope,
) -> None:
    running = {getattr(item, rule.id_field): (i, item) for i, item in enumerate(old)}
    present: set[str] = set()
    for i, item in enumerate(new):
        entry_id = getattr(item, rule.id_field)
        present.add(entry_id)
        inner = scope.within(rule.scope, entry_id)
        if entry_id in running:
            _diff(out, f"{path}[{i}]", running[entry_id][1], item, rule.type, inner)
        else:
            out.append(
                _report(
                    f"{path}[{i}]",
                    ABSENT,
                    _show(entry_id),
                    rule.change_class,
                    f"added; {rule.why}",
                    inner,
                )
            )
    for entry_id, (i, _) in running.items():
        if entry_id not in present:
            inner = scope.within(rule.scope, entry_id)
            out.append(
                _report(
                    f"{path}[{i}]",
                    _show(entry_id),
                    ABSENT,
                    rule.change_class,
                    f"removed (position in the running config); {rule.why}",
                    inner,
                )
            )


def _report(
    path: str, old: str, new: str, change_class: ChangeClass, detail: str, scope: _Scope
) -> ChangeReport:
    return ChangeReport(
        path=path,
        old=old,
        new=new,
        change_class=change_class,
        detail=detail,
        node=scope.node,
        provider=scope.provider,
        model=scope.model,
    )


def _changed_names(old: tuple[tuple[str, Any], ...], new: tuple[tuple[str, Any], ...]) -> str:
    """Which names of a secret mapping changed (names only; the values stay unseen)."""
    before, after = dict(old), dict(new)
    parts: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            parts.append(f"{name} (removed)")
        elif name not in before:
            parts.append(f"{name} (added)")
        elif before[name] != after[name]:
            parts.append(f"{name} (changed)")
    return "changed: " + ", ".join(redact_secrets(p) for p in parts)


def _pairs(hint: object) -> bool:
    """``tuple[tuple[K, V], ...]``: a mapping kept as ``(key, value)`` pairs."""
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and bool(args) and typing.get_origin(args[0]) is tuple


# The fields holding a mapping as pairs (shown ``{key: value}``).
_MAPPINGS = frozenset(
    (t, name) for t in RULES for name, hint in typing.get_type_hints(t).items() if _pairs(hint)
)


def _show(value: object, mapping: bool = False) -> str:
    """A display string for a non-secret config value, as edge.yaml would spell it."""
    if mapping and isinstance(value, tuple):
        return "{" + ", ".join(f"{_show(k)}: {_show(v)}" for k, v in value) + "}"
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return redact_secrets(value) if value else '""'
    if isinstance(value, ModelProviderRef):
        return f"{value.provider_id} ({redact_secrets(value.target)})"
    if isinstance(value, Limits | Budget):
        return _show_record(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if is_dataclass(value):
        return "set"
    return redact_secrets(str(value))


# ---------------------------------------------------------------------------------------------
# The dry-run outcome


def candidate_result(mode: str, reports: list[ChangeReport]) -> RefreshResult:
    """
    The outcome of a classified candidate: ``rejected`` if any report is (or ``mode`` is not
    ``dry_run``/``apply``), else ``restart_required`` if any report is, else ``applied`` (in
    ``dry_run`` mode: would apply). The changed lists name every node, provider and model a
    report is under, in report order.
    """
    result = RefreshResult(
        result="applied",
        mode=mode,
        changed_nodes=_unique(r.node for r in reports),
        changed_providers=_unique(r.provider for r in reports),
        changed_models=_unique(r.model for r in reports),
        reports=list(reports),
    )
    classes = {r.change_class for r in reports}
    if mode not in MODES:
        result.result = "rejected"
        result.errors.append(f"unknown refresh mode {mode!r}: use {' or '.join(MODES)}")
    elif "rejected" in classes:
        result.result = "rejected"
    elif RESTART in classes:
        result.result = "restart_required"
    return result


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


# ---------------------------------------------------------------------------------------------
# The table (README, "Config refresh")


def classification_table() -> list[tuple[str, str, str, str]]:
    """
    ``(edge.yaml path, class, origin, why)`` for every compared field and every keyed list's
    entries; origin is ``seed`` (seed 001 names it) or ``project`` (decided here).
    """
    return list(_rows("", EdgeConfig))


def _rows(prefix: str, type_: type) -> Iterator[tuple[str, str, str, str]]:
    for f in fields(type_):
        rule = RULES[type_][f.name]
        if isinstance(rule, Leaf):
            yield _join(prefix, rule.key), rule.change_class, rule.origin, rule.why
        elif isinstance(rule, Record):
            path = _join(prefix, rule.key)
            if rule.why:
                yield f"{path} (set or unset)", rule.change_class, rule.origin, rule.why
            yield from _rows(path, rule.type)
        elif isinstance(rule, Keyed):
            path = _join(prefix, rule.key) + "[]"
            added = f"{path} (entry added or removed)"
            yield added, rule.change_class, rule.origin, rule.why
            yield from _rows(path, rule.type)


def markdown_table() -> str:
    """The README's classification table: one row per :func:`classification_table` entry."""
    lines = ["| edge.yaml path | class | origin | why |", "|---|---|---|---|"]
    for path, change_class, origin, why in classification_table():
        shown, _, qualifier = path.partition(" ")
        qualifier = f" {qualifier}" if qualifier else ""
        lines.append(f"| `{shown}`{qualifier} | {change_class} | {origin} | {why} |")
    return "\n".join(lines) + "\n"


def _show_record(value: Limits | Budget) -> str:
    """Limits or a budget as edge.yaml spells them (cost in the currency, not micro-units)."""
    parts: list[str] = []
    for f in fields(value):
        item = getattr(value, f.name)
        if item is None:
            continue
        if f.name == "cost_micros":
            parts.append(f"cost: {item / MICROS_PER_UNIT:g}")
        else:
            parts.append(f"{f.name}: {item}")
    return "{" + ", ".join(parts) + "}"
