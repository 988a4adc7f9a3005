"""
The refresh classification table: every config field, changed alone, gives exactly one report
with its edge.yaml path (at the candidate's positions) and its class per seed 001 (or the
project's documented decision); list entries are matched by id, secrets never shown.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Callable
from typing import Any
from unittest import SkipTest

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

import iop
from iop.config import model as config_model
from iop.config.model import (
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
    NodeToken,
    Price,
    ProfileConfig,
    ProviderConfig,
    Secret,
    ServerTLS,
    Team,
    TelemetryConfig,
    UsageConfig,
)
from iop.edge.refresh.classify import RULES, candidate_result, classify, markdown_table
from iop.edge.refresh.report import ABSENT, SECRET_CHANGED, ChangeReport
from iop.test.config.test_edge_config import (
    ENVIRON,
    EdgeConfigTestMixin,
    Mutation,
    drop,
    put,
)
from iop.test.config.test_edge_config import base_config as yaml_config
from iop.test.edge.fixtures import TOKENS, edge_config, provider

LIVE = "live"
RESTART = "restart_required"

CLIENT_KEY = "client-key-team-a-plaintext"
CREDENTIAL_SECRET = "sk-credential-secret-value-0001"
HEADER_SECRET = "Bearer sk-header-secret-value-0002"
ENV_SECRET = "env-secret-value-0003"
# What `_other` puts in a secret field; never shown either.
OTHER_SECRET = "another-secret-value-0004"

SECRETS = [
    *TOKENS.values(),
    *(NodeToken.from_plaintext(t).sha256.hex() for t in TOKENS.values()),
    CLIENT_KEY,
    NodeToken.from_plaintext(CLIENT_KEY).sha256.hex(),
    CREDENTIAL_SECRET,
    "otlp-header-value-0007",
    HEADER_SECRET,
    ENV_SECRET,
    OTHER_SECRET,
    NodeToken.from_plaintext(OTHER_SECRET).sha256.hex(),
    "spare-secret-value-0005",
    "ops-key-plaintext",
    NodeToken.from_plaintext("ops-key-plaintext").sha256.hex(),
]


def base_config() -> EdgeConfig:
    """The fixtures' config with every optional section filled, so every field can change."""
    config = edge_config()
    node_a, node_b = config.nodes
    adapter = AdapterConfig(
        name="fake",
        type="openai_compat",
        base_url="http://127.0.0.1:1/v1",
        headers=(("Authorization", HEADER_SECRET),),
        env=(("AGENT_KEY", ENV_SECRET),),
        command="agent",
        args=("--print",),
        resume_args=("--resume",),
        output_format="text",
        settings=(("keep_alive", "5m"),),
    )
    cli = AdapterConfig(name="coder", type="cli", command="coding-agent")
    b_chat = dataclasses.replace(
        node_b.providers[0],
        profile="openai-chat",
        credential="openai-main",
        usage_attribution="team-b",
        long_context_threshold=1000,
        max_queue=4,
        queue_timeout_sec=5.0,
    )
    b_spare = provider("b-spare")
    return dataclasses.replace(
        config,
        tls=ServerTLS("edge.crt", "edge.key", "ca.crt"),
        nodes=(
            dataclasses.replace(
                node_a, agent_kind="gpu", concurrency=2, recipient_key_file="a.pub"
            ),
            dataclasses.replace(node_b, adapters=(adapter, cli), providers=(b_chat, b_spare)),
        ),
        models=(
            config.models[0],
            ModelConfig(
                id="solo",
                providers=(ModelProviderRef("b-chat", "demo-model"),),
                display_name="Solo",
                default_max_tokens=1024,
                min_max_tokens=16,
                default_thinking_token_budget=0,
                token_counter="approximate",
                price=Price(3_000_000, 15_000_000, 300_000, 3_750_000, 15_000_000),
            ),
        ),
        protocol_profiles=(
            ProfileConfig(
                name="anthropic",
                driver="anthropic_messages",
                operations=(("messages", "/v1/messages"),),
                capabilities=("messages",),
                auth_header="x-api-key",
            ),
            ProfileConfig(
                name="openai-chat",
                driver="openai_chat",
                operations=(("chat_completions", "/chat/completions"),),
                capabilities=("chat", "streaming"),
                extensions=(("thinking", False),),
                auth_header="Authorization",
                auth_scheme="Bearer",
            ),
        ),
        model_routes=(
            ModelRoute("direct-a", "fake", "demo-model", "node-a"),
            ModelRoute("direct", "fake", "demo-model", None),
        ),
        client_api=ClientAPIConfig(
            listen="tcp:0:interface=127.0.0.1",
            keys=(
                ClientKey("ops", NodeToken.from_plaintext("ops-key-plaintext")),
                ClientKey(
                    "team-a",
                    NodeToken.from_plaintext(CLIENT_KEY),
                    ("pool",),
                    team="backend",
                    limits=Limits(requests_per_minute=60),
                    budgets=(Budget("day", tokens=1000),),
                ),
            ),
            cors=CorsConfig(("https://app.example.com",)),
            teams=(Team("frontend"), Team("backend", Limits(concurrent_requests=4))),
        ),
        security=EdgeSecurity(mode="managed", signing_key_file="issuer.key"),
        credentials=(
            CredentialSlot("spare", Secret("spare-secret-value-0005")),
            CredentialSlot("openai-main", Secret(CREDENTIAL_SECRET), revision=3),
        ),
        cluster=ClusterConfig(
            redis="redis://127.0.0.1:6379/0",
            edge_id="edge-1",
            password=Secret("redis-password-value-0006"),
        ),
        usage=UsageConfig(ledger=LedgerConfig("/var/lib/iop/usage.sqlite3")),
        telemetry=TelemetryConfig(
            "http://collector:4318/v1/traces",
            headers=(("authorization", Secret("otlp-header-value-0007")),),
        ),
        source_path="edge.yaml",
    )


def _other(value: Any, hint: Any) -> Any:
    """A different value of the same type as ``value`` (``hint``: the field's type)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, NodeToken):
        return NodeToken.from_plaintext(OTHER_SECRET)
    if isinstance(value, Secret):
        return Secret(OTHER_SECRET)
    if isinstance(value, Limits):
        return dataclasses.replace(value, tokens_per_minute=(value.tokens_per_minute or 0) + 1)
    if value is None:
        args = typing.get_args(hint)
        return 7 if int in args else "set-now"
    if isinstance(value, tuple):
        if value and isinstance(value[0], ModelProviderRef):
            return (*value, ModelProviderRef("a-chat", "demo-model"))
        if value and isinstance(value[0], tuple):
            return (*value, ("x-extra", "extra"))
        return (*value, "extra")
    raise AssertionError(f"no other value for {value!r}")


# -- where each config dataclass lives in the base config, and how to replace it there ------

Change = Callable[[Any], Any]
Locator = Callable[[EdgeConfig, Change], EdgeConfig]


def _nth(items: tuple[Any, ...], index: int, change: Change) -> tuple[Any, ...]:
    return (*items[:index], change(items[index]), *items[index + 1 :])


def _in_node(index: int, change: Callable[[Any, Change], Any]) -> Locator:
    return lambda c, f: dataclasses.replace(c, nodes=_nth(c.nodes, index, lambda n: change(n, f)))


LOCATORS: dict[type, Locator] = {
    EdgeConfig: lambda c, f: f(c),
    ServerTLS: lambda c, f: dataclasses.replace(c, tls=f(c.tls)),
    HeartbeatConfig: lambda c, f: dataclasses.replace(c, heartbeat=f(c.heartbeat)),
    # node-b (position 1) is the one with every kind of entry.
    NodeConfig: lambda c, f: dataclasses.replace(c, nodes=_nth(c.nodes, 1, f)),
    AdapterConfig: _in_node(
        1, lambda n, f: dataclasses.replace(n, adapters=_nth(n.adapters, 0, f))
    ),
    ProviderConfig: _in_node(
        1, lambda n, f: dataclasses.replace(n, providers=_nth(n.providers, 0, f))
    ),
    ModelConfig: lambda c, f: dataclasses.replace(c, models=_nth(c.models, 1, f)),
    ModelProviderRef: lambda c, f: dataclasses.replace(
        c,
        models=_nth(
            c.models, 1, lambda m: dataclasses.replace(m, providers=_nth(m.providers, 0, f))
        ),
    ),
    ProfileConfig: lambda c, f: dataclasses.replace(
        c, protocol_profiles=_nth(c.protocol_profiles, 1, f)
    ),
    ModelRoute: lambda c, f: dataclasses.replace(c, model_routes=_nth(c.model_routes, 1, f)),
    ClientAPIConfig: lambda c, f: dataclasses.replace(c, client_api=f(c.client_api)),
    ClientKey: lambda c, f: dataclasses.replace(
        c,
        client_api=dataclasses.replace(c.client_api, keys=_nth(c.client_api.keys, 1, f)),
    ),
    CorsConfig: lambda c, f: dataclasses.replace(
        c, client_api=dataclasses.replace(c.client_api, cors=f(c.client_api.cors))
    ),
    Team: lambda c, f: dataclasses.replace(
        c,
        client_api=dataclasses.replace(c.client_api, teams=_nth(c.client_api.teams, 1, f)),
    ),
    EdgeSecurity: lambda c, f: dataclasses.replace(c, security=f(c.security)),
    CredentialSlot: lambda c, f: dataclasses.replace(c, credentials=_nth(c.credentials, 1, f)),
    AdminConfig: lambda c, f: dataclasses.replace(c, admin=f(c.admin)),
    LoggingConfig: lambda c, f: dataclasses.replace(c, logging=f(c.logging)),
    ClusterConfig: lambda c, f: dataclasses.replace(c, cluster=f(c.cluster)),
    TelemetryConfig: lambda c, f: dataclasses.replace(c, telemetry=f(c.telemetry)),
    Price: lambda c, f: dataclasses.replace(
        c, models=_nth(c.models, 1, lambda m: dataclasses.replace(m, price=f(m.price)))
    ),
    UsageConfig: lambda c, f: dataclasses.replace(c, usage=f(c.usage)),
    LedgerConfig: lambda c, f: dataclasses.replace(
        c, usage=dataclasses.replace(c.usage, ledger=f(c.usage.ledger))
    ),
}

N = "nodes[1]"
P = "nodes[1].providers[0]"
A = "nodes[1].adapters[0]"
M = "models[1]"
PR = "protocol_profiles[1]"
R = "openai.model_routes[1]"
K = "openai.auth.keys[1]"
T = "openai.auth.teams[1]"
# The client keys' rows: live (the pipeline follows the running config).
AUTH = LIVE
C = "credentials[1]"

# (dataclass, field) → the reports changing that field alone gives: (path, class) each.
# A key field (the id a list matches by) is another entry: removed, then added.
TABLE: dict[tuple[type, str], list[tuple[str, str]]] = {
    # Edge identity, listeners, bootstrap, control plane: restart (seed).
    (EdgeConfig, "id"): [("edge.id", RESTART)],
    (EdgeConfig, "drain_timeout_sec"): [("edge.drain_timeout_sec", RESTART)],
    (EdgeConfig, "node_listen"): [("listen.nodes", RESTART)],
    (EdgeConfig, "admin_listen"): [("listen.admin", RESTART)],
    (EdgeConfig, "plaintext_nodes"): [("node_transport.plaintext", RESTART)],
    (EdgeConfig, "max_frame_bytes"): [("node_transport.max_frame_bytes", RESTART)],
    (EdgeConfig, "register_timeout_sec"): [("node_transport.register_timeout_sec", RESTART)],
    # Not a setting: where the file was read from.
    (EdgeConfig, "source_path"): [],
    (ServerTLS, "cert_file"): [("node_transport.tls.cert_file", RESTART)],
    (ServerTLS, "key_file"): [("node_transport.tls.key_file", RESTART)],
    (ServerTLS, "client_ca_file"): [("node_transport.tls.client_ca_file", RESTART)],
    (HeartbeatConfig, "interval_sec"): [("node_transport.heartbeat.interval_sec", RESTART)],
    (HeartbeatConfig, "timeout_sec"): [("node_transport.heartbeat.timeout_sec", RESTART)],
    # Nodes: token/alias/agent kind restart, legacy concurrency live (seed).
    (NodeConfig, "id"): [("nodes[1]", RESTART), ("nodes[1]", RESTART)],
    (NodeConfig, "token"): [(f"{N}.token", RESTART)],
    (NodeConfig, "alias"): [(f"{N}.alias", RESTART)],
    (NodeConfig, "agent_kind"): [(f"{N}.agent_kind", RESTART)],
    (NodeConfig, "concurrency"): [(f"{N}.concurrency", LIVE)],
    (NodeConfig, "recipient_key_file"): [(f"{N}.recipient_key_file", RESTART)],
    # Adapter settings: restart (seed), whatever the field, but max_concurrency: the node
    # resizes its gate live (project: a capacity change must be able to move it).
    (AdapterConfig, "name"): [(A, RESTART), (A, RESTART)],
    **{
        (AdapterConfig, f.name): [(f"{A}.{f.name}", RESTART)]
        for f in dataclasses.fields(AdapterConfig)
        if f.name not in ("name", "max_concurrency")
    },
    (AdapterConfig, "max_concurrency"): [(f"{A}.max_concurrency", LIVE)],
    # Provider catalog and execution fields restart, pool fields live (seed); the project's
    # additions as the README table decides.
    # A new id is one provider removed and another added, on an adapter the node runs: live.
    (ProviderConfig, "id"): [(P, LIVE), (P, LIVE)],
    (ProviderConfig, "adapter"): [(f"{P}.adapter", RESTART)],
    (ProviderConfig, "adapter_instance"): [(f"{P}.adapter", RESTART)],
    (ProviderConfig, "category"): [(f"{P}.category", RESTART)],
    (ProviderConfig, "type"): [(f"{P}.type", RESTART)],
    (ProviderConfig, "models"): [(f"{P}.models", RESTART)],
    (ProviderConfig, "enabled"): [(f"{P}.enabled", LIVE)],
    (ProviderConfig, "priority"): [(f"{P}.priority", LIVE)],
    (ProviderConfig, "capacity"): [(f"{P}.capacity", LIVE)],
    (ProviderConfig, "long_context_threshold"): [(f"{P}.long_context_threshold", LIVE)],
    (ProviderConfig, "long_capacity"): [(f"{P}.long_capacity", LIVE)],
    (ProviderConfig, "max_queue"): [(f"{P}.max_queue", LIVE)],
    (ProviderConfig, "queue_timeout_sec"): [(f"{P}.queue_timeout_sec", LIVE)],
    (ProviderConfig, "profile"): [(f"{P}.profile", RESTART)],
    (ProviderConfig, "usage_attribution"): [(f"{P}.usage_attribution", LIVE)],
    (ProviderConfig, "credential"): [(f"{P}.credential", RESTART)],
    # models[]: display / provider list / generation policy live (seed).
    (ModelConfig, "id"): [(M, LIVE), (M, LIVE)],
    (ModelConfig, "providers"): [(f"{M}.providers", LIVE)],
    (ModelConfig, "display_name"): [(f"{M}.display_name", LIVE)],
    (ModelConfig, "default_max_tokens"): [(f"{M}.default_max_tokens", LIVE)],
    (ModelConfig, "min_max_tokens"): [(f"{M}.min_max_tokens", LIVE)],
    (ModelConfig, "default_thinking_token_budget"): [(f"{M}.default_thinking_token_budget", LIVE)],
    (ModelConfig, "token_counter"): [(f"{M}.token_counter", LIVE)],
    (ModelProviderRef, "provider_id"): [(f"{M}.providers", LIVE)],
    (ModelProviderRef, "target"): [(f"{M}.providers", LIVE)],
    # Protocol profiles reach nodes with their adapters: restart.
    (ProfileConfig, "name"): [(PR, RESTART), (PR, RESTART)],
    **{
        (ProfileConfig, f.name): [(f"{PR}.{f.name}", RESTART)]
        for f in dataclasses.fields(ProfileConfig)
        if f.name != "name"
    },
    # The openai section, all of it: restart (seed).
    (ModelRoute, "model"): [(R, RESTART), (R, RESTART)],
    (ModelRoute, "adapter"): [(f"{R}.adapter", RESTART)],
    (ModelRoute, "target"): [(f"{R}.target", RESTART)],
    (ModelRoute, "node_id"): [(f"{R}.node", RESTART)],
    (ClientAPIConfig, "listen"): [("openai.listen", RESTART)],
    (ClientAPIConfig, "auth"): [("openai.auth.enabled", RESTART)],
    (ClientAPIConfig, "max_body_bytes"): [("openai.max_body_bytes", RESTART)],
    (ClientAPIConfig, "request_head_timeout_sec"): [("openai.request_head_timeout_sec", RESTART)],
    (ClientAPIConfig, "request_body_timeout_sec"): [("openai.request_body_timeout_sec", RESTART)],
    (ClientAPIConfig, "request_body_min_rate"): [("openai.request_body_min_rate", RESTART)],
    (ClientAPIConfig, "idle_timeout_sec"): [("openai.idle_timeout_sec", RESTART)],
    (ClientAPIConfig, "max_connections"): [("openai.max_connections", RESTART)],
    (ClientAPIConfig, "max_connections_per_peer"): [("openai.max_connections_per_peer", RESTART)],
    (ClientAPIConfig, "listen_backlog"): [("openai.listen_backlog", RESTART)],
    (ClientAPIConfig, "reuse_port"): [("openai.reuse_port", RESTART)],
    # Client keys and their lifecycle (AUTH: see classify's _AUTH_CLASS); limits, budgets and
    # teams are the accounting's: live.
    (ClientAPIConfig, "default_limits"): [("openai.auth.default_limits", LIVE)],
    (ClientAPIConfig, "default_budgets"): [("openai.auth.default_budgets", LIVE)],
    (ClientKey, "name"): [(K, AUTH), (K, AUTH)],
    (ClientKey, "digest"): [(f"{K}.key", AUTH)],
    (ClientKey, "models"): [(f"{K}.models", AUTH)],
    (ClientKey, "previous_digest"): [(f"{K}.previous_key", AUTH)],
    (ClientKey, "previous_valid_until"): [(f"{K}.previous_valid_until", AUTH)],
    (ClientKey, "disabled"): [(f"{K}.disabled", AUTH)],
    (ClientKey, "team"): [(f"{K}.team", LIVE)],
    (ClientKey, "limits"): [(f"{K}.limits", LIVE)],
    (ClientKey, "budgets"): [(f"{K}.budgets", LIVE)],
    (Team, "name"): [(T, LIVE), (T, LIVE)],
    (Team, "limits"): [(f"{T}.limits", LIVE)],
    (Team, "budgets"): [(f"{T}.budgets", LIVE)],
    (CorsConfig, "allow_origins"): [("openai.cors.allow_origins", RESTART)],
    (CorsConfig, "max_age_sec"): [("openai.cors.max_age_sec", RESTART)],
    # Managed-mode security: fixed at start.
    (EdgeSecurity, "mode"): [("security.mode", RESTART)],
    (EdgeSecurity, "trust_domain"): [("security.trust_domain", RESTART)],
    (EdgeSecurity, "signing_key_file"): [("security.lease.signing_key_file", RESTART)],
    (EdgeSecurity, "lease_ttl_sec"): [("security.lease.ttl_sec", RESTART)],
    # Credential slots: rotation and revocation are live.
    (CredentialSlot, "name"): [(C, LIVE), (C, LIVE)],
    (CredentialSlot, "secret"): [(f"{C}.secret", LIVE)],
    (CredentialSlot, "revision"): [(f"{C}.revision", LIVE)],
    (CredentialSlot, "enabled"): [(f"{C}.enabled", LIVE)],
    # The admin bearer token: the admin listener is wrapped at start.
    (AdminConfig, "auth"): [("admin.auth", RESTART)],
    # The log observer is installed once, when twistd starts logging; its level filter is live.
    (LoggingConfig, "format"): [("logging.format", RESTART)],
    (LoggingConfig, "level"): [("logging.level", LIVE)],
    # Joining the cluster (its Redis lease table) happens at start.
    (ClusterConfig, "redis"): [("cluster.redis", RESTART)],
    (ClusterConfig, "edge_id"): [("cluster.edge_id", RESTART)],
    (ClusterConfig, "password"): [("cluster.password", RESTART)],
    (ClusterConfig, "lease_ttl_sec"): [("cluster.lease_ttl_sec", RESTART)],
    (ClusterConfig, "key_prefix"): [("cluster.key_prefix", RESTART)],
    # The trace exporter (thread, queue, credentials) is built at start.
    **{
        (TelemetryConfig, name): [(f"telemetry.{name}", RESTART)]
        for name in (
            "endpoint",
            "headers",
            "sampling_ratio",
            "service_name",
            "capture_content",
            "queue_size",
            "export_timeout_sec",
            "shutdown_timeout_sec",
        )
    },
    # Prices are read when a finished request is priced: live.
    **{(Price, f.name): [(f"{M}.price.{f.name}", LIVE)] for f in dataclasses.fields(Price)},
    # The currency labels the ledger's rows and the budgets' totals; the ledger opens at start.
    (UsageConfig, "currency"): [("usage.currency", RESTART)],
    (LedgerConfig, "path"): [("usage.ledger.path", RESTART)],
    (LedgerConfig, "retention_days"): [("usage.ledger.retention_days", RESTART)],
    (LedgerConfig, "enabled"): [("usage.ledger.enabled", RESTART)],
}

# Whole sub-records and lists, walked by their own dataclass's rows (and the entry tests).
CONTAINERS = {
    (EdgeConfig, name)
    for name in (
        "tls",
        "heartbeat",
        "nodes",
        "models",
        "protocol_profiles",
        "model_routes",
        "client_api",
        "security",
        "credentials",
        "admin",
        "logging",
        "telemetry",
        "cluster",
        "usage",
    )
} | {
    (ModelConfig, "price"),
    (UsageConfig, "ledger"),
    (NodeConfig, "adapters"),
    (NodeConfig, "providers"),
    (ClientAPIConfig, "keys"),
    (ClientAPIConfig, "cors"),
    (ClientAPIConfig, "teams"),
}


# Compared as one value (a secret's digest), not walked field by field.
ATOMIC = {NodeToken, Limits, Budget}


def config_dataclasses() -> set[type]:
    """Every dataclass reachable from EdgeConfig through its fields' types."""
    found: set[type] = set()
    todo: list[Any] = [EdgeConfig]
    while todo:
        hint = todo.pop()
        if hint in ATOMIC:
            continue
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            if hint in found:
                continue
            found.add(hint)
            todo += typing.get_type_hints(hint, vars(config_model)).values()
        else:
            todo += typing.get_args(hint)
    return found


def change_field(config: EdgeConfig, type_: type, name: str) -> EdgeConfig:
    """``config`` with field ``name`` of its ``type_`` record (see LOCATORS) given another value."""
    hint = typing.get_type_hints(type_, vars(config_model))[name]

    def change(record: Any) -> Any:
        return dataclasses.replace(record, **{name: _other(getattr(record, name), hint)})

    return LOCATORS[type_](config, change)


# Rows that compose: one report each, on a field no other row reports under.
COMPOSABLE = sorted(
    (
        row
        for row, expected in TABLE.items()
        if len(expected) == 1
        and row
        not in {
            (ProviderConfig, "adapter_instance"),
            (ModelProviderRef, "provider_id"),
            (ModelProviderRef, "target"),
        }
    ),
    key=str,
)


def assert_no_secret(test: SynchronousTestCase, reports: list[ChangeReport]) -> None:
    text = json.dumps(candidate_result("dry_run", reports).as_dict())
    text += repr(reports) + "".join(r.describe() for r in reports)
    for secret in SECRETS:
        test.assertNotIn(secret, text)


class ClassificationTableTests(SynchronousTestCase):
    def test_every_field_has_a_row(self) -> None:
        """
        Every field of every config dataclass is either a row of the table or a container
        walked by its own rows: a field added later without a row fails here.
        """
        types = config_dataclasses()
        self.assertEqual(types, set(LOCATORS))
        self.assertEqual(types, set(RULES))
        missing = [
            f"{t.__name__}.{f.name}"
            for t in types
            for f in dataclasses.fields(t)
            if (t, f.name) not in TABLE and (t, f.name) not in CONTAINERS
        ]
        self.assertEqual(missing, [])
        for t in types:
            self.assertEqual(set(RULES[t]), {f.name for f in dataclasses.fields(t)}, t)

    def test_each_field_alone(self) -> None:
        """Each row: change only that field; exactly its reports, path and class."""
        base = base_config()
        for (type_, name), expected in sorted(TABLE.items(), key=lambda i: str(i[0])):
            candidate = change_field(base, type_, name)
            reports = classify(base, candidate)
            got = [(r.path, r.change_class) for r in reports]
            self.assertEqual(got, expected, f"{type_.__name__}.{name}")
            assert_no_secret(self, reports)

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(st.lists(st.sampled_from(COMPOSABLE), unique=True, max_size=12))
    def test_changes_together(self, rows: list[tuple[type, str]]) -> None:
        """
        Any set of fields changed at once gives exactly the union of their rows' reports, and
        the candidate's outcome is the strictest of their classes.
        """
        base = base_config()
        candidate = base
        for type_, name in rows:
            candidate = change_field(candidate, type_, name)
        reports = classify(base, candidate)
        expected = sorted(report for row in rows for report in TABLE[row])
        self.assertEqual(sorted((r.path, r.change_class) for r in reports), expected)
        classes = {change_class for _, change_class in expected}
        outcome = "restart_required" if RESTART in classes else "applied"
        self.assertEqual(candidate_result("apply", reports).result, outcome)
        assert_no_secret(self, reports)

    def test_no_op(self) -> None:
        """The same config (or an equal one built again): no report, four empty lists."""
        self.assertEqual(classify(base_config(), base_config()), [])
        document = candidate_result("dry_run", classify(base_config(), base_config())).as_dict()
        self.assertEqual(document["result"], "applied")
        for key in ("changed_nodes", "changed_providers", "changed_models", "reports"):
            self.assertEqual(document[key], [], key)

    def test_readme_table(self) -> None:
        """The README's "Config refresh" table is the rules written out, row for row."""
        readme = os.path.join(os.path.dirname(iop.__file__), os.pardir, "README.md")
        if not os.path.exists(readme):
            raise SkipTest("README.md is not in this tree")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text.split("### Config refresh", 1)[1].split("\n## ", 1)[0]
        self.assertIn("\n" + markdown_table() + "\n", section)


class ValueTests(SynchronousTestCase):
    def test_old_and_new(self) -> None:
        """Reports show old → new as edge.yaml spells them."""
        base = base_config()
        candidate = LOCATORS[ProviderConfig](base, lambda p: dataclasses.replace(p, capacity=5))
        [report] = classify(base, candidate)
        self.assertEqual((report.old, report.new), ("2", "5"))
        self.assertEqual(report.describe().split(":")[0], "nodes[1].providers[0].capacity")
        candidate = LOCATORS[ProviderConfig](base, lambda p: dataclasses.replace(p, enabled=False))
        [report] = classify(base, candidate)
        self.assertEqual((report.old, report.new), ("true", "false"))
        candidate = LOCATORS[ModelConfig](
            base, lambda m: dataclasses.replace(m, default_max_tokens=None, display_name="")
        )
        self.assertEqual(
            [(r.path, r.old, r.new) for r in classify(base, candidate)],
            [
                ("models[1].display_name", "Solo", '""'),
                ("models[1].default_max_tokens", "1024", ABSENT),
            ],
        )

    def test_lists_and_mappings(self) -> None:
        """A list reads [a, b]; a mapping reads {key: value}, empty or not."""
        base = base_config()
        candidate = LOCATORS[AdapterConfig](
            base,
            lambda a: dataclasses.replace(a, args=(), settings=(), resume_args=("--resume", "x")),
        )
        self.assertEqual(
            [(r.path, r.old, r.new) for r in classify(base, candidate)],
            [
                (f"{A}.args", "[--print]", "[]"),
                (f"{A}.resume_args", "[--resume]", "[--resume, x]"),
                (f"{A}.settings", "{keep_alive: 5m}", "{}"),
            ],
        )

    def test_mapping_order(self) -> None:
        """A YAML map's order means nothing: reordered headers or settings are no change."""
        base = base_config()
        adapter = base.nodes[1].adapters[0]
        wider = LOCATORS[AdapterConfig](
            base,
            lambda a: dataclasses.replace(
                a,
                headers=(*a.headers, ("X-Team", "b")),
                settings=(*a.settings, ("kill_grace_ms", "500")),
            ),
        )
        reordered = LOCATORS[AdapterConfig](
            wider,
            lambda a: dataclasses.replace(a, headers=a.headers[::-1], settings=a.settings[::-1]),
        )
        self.assertEqual(classify(wider, reordered), [])
        self.assertNotEqual(adapter, reordered.nodes[1].adapters[0])

    def test_model_providers(self) -> None:
        """A model's provider list is one value; its order counts (round-robin follows it)."""
        base = base_config()
        candidate = dataclasses.replace(
            base,
            models=_nth(
                base.models,
                0,
                lambda m: dataclasses.replace(m, providers=tuple(reversed(m.providers))),
            ),
        )
        [report] = classify(base, candidate)
        self.assertEqual(report.path, "models[0].providers")
        self.assertEqual(report.old, "[a-chat (demo-model), b-chat (demo-model)]")
        self.assertEqual(report.new, "[b-chat (demo-model), a-chat (demo-model)]")
        self.assertEqual(report.change_class, LIVE)
        self.assertEqual(report.model, "pool")

    def test_adapter_instance_folded(self) -> None:
        """A provider's adapter reference and the instance it resolves to are one report."""
        base = base_config()
        candidate = LOCATORS[ProviderConfig](
            base, lambda p: dataclasses.replace(p, adapter="coder", adapter_instance="coder")
        )
        [report] = classify(base, candidate)
        self.assertEqual((report.path, report.old, report.new), (f"{P}.adapter", "fake", "coder"))
        candidate = LOCATORS[ProviderConfig](
            base, lambda p: dataclasses.replace(p, adapter_instance="coder")
        )
        [report] = classify(base, candidate)
        self.assertEqual((report.old, report.new), ("fake", "fake"))
        self.assertIn("adapter_instance: fake → coder", report.detail)

    def test_disabled_provider_instance(self) -> None:
        """
        A disabled provider's adapter reference is not resolved (no instance): toggling
        ``enabled`` is the one live report, not an adapter change.
        """
        base = base_config()
        off = LOCATORS[ProviderConfig](
            base, lambda p: dataclasses.replace(p, enabled=False, adapter_instance="")
        )
        for running, candidate in ((base, off), (off, base)):
            self.assertEqual(
                [(r.path, r.change_class) for r in classify(running, candidate)],
                [(f"{P}.enabled", LIVE)],
            )

    def test_optional_records(self) -> None:
        """node_transport.tls and openai.cors set or unset: one report on the section."""
        base = base_config()
        for candidate, path in [
            (dataclasses.replace(base, tls=None), "node_transport.tls"),
            (
                dataclasses.replace(
                    base, client_api=dataclasses.replace(base.client_api, cors=None)
                ),
                "openai.cors",
            ),
        ]:
            self.assertEqual(
                [(r.path, r.old, r.new, r.change_class) for r in classify(base, candidate)],
                [(path, "set", ABSENT, RESTART)],
            )
            self.assertEqual(
                [(r.path, r.old, r.new) for r in classify(candidate, base)],
                [(path, ABSENT, "set")],
            )
        bare = dataclasses.replace(base, tls=None)
        self.assertEqual(classify(bare, bare), [])

    def test_values_redacted(self) -> None:
        """A non-secret value that carries a credential anyway is shown redacted."""
        base = base_config()
        candidate = LOCATORS[AdapterConfig](
            base,
            lambda a: dataclasses.replace(
                a, base_url="http://127.0.0.1:1/v1?api_key=sk-in-a-url-0123456789abcdef"
            ),
        )
        [report] = classify(base, candidate)
        self.assertNotIn("sk-in-a-url", report.new)
        self.assertIn("[redacted]", report.new)


class SecretTests(SynchronousTestCase):
    def assertSecretReport(self, base: EdgeConfig, candidate: EdgeConfig, path: str) -> None:
        [report] = classify(base, candidate)
        self.assertEqual(
            (report.path, report.old, report.new), (path, SECRET_CHANGED, SECRET_CHANGED)
        )
        assert_no_secret(self, [report])

    def test_node_token(self) -> None:
        base = base_config()
        candidate = LOCATORS[NodeConfig](
            base, lambda n: dataclasses.replace(n, token=NodeToken.from_plaintext(OTHER_SECRET))
        )
        self.assertSecretReport(base, candidate, f"{N}.token")
        # The same token, a new object: no change.
        same = LOCATORS[NodeConfig](
            base,
            lambda n: dataclasses.replace(n, token=NodeToken.from_plaintext(TOKENS["node-b"])),
        )
        self.assertEqual(classify(base, same), [])

    def test_client_key(self) -> None:
        base = base_config()
        candidate = LOCATORS[ClientKey](
            base, lambda k: dataclasses.replace(k, digest=NodeToken.from_plaintext(OTHER_SECRET))
        )
        self.assertSecretReport(base, candidate, f"{K}.key")

    def test_credential_secret(self) -> None:
        """A rotated secret: live, shown only as changed; the same secret re-read: no change."""
        base = base_config()
        candidate = LOCATORS[CredentialSlot](
            base, lambda s: dataclasses.replace(s, secret=Secret(OTHER_SECRET))
        )
        self.assertSecretReport(base, candidate, f"{C}.secret")
        self.assertEqual(classify(base, candidate)[0].change_class, LIVE)
        same = LOCATORS[CredentialSlot](
            base, lambda s: dataclasses.replace(s, secret=Secret(CREDENTIAL_SECRET))
        )
        self.assertEqual(classify(base, same), [])

    def test_headers_and_env(self) -> None:
        """Adapter headers and env carry secrets: only the changed names are shown."""
        base = base_config()
        candidate = LOCATORS[AdapterConfig](
            base,
            lambda a: dataclasses.replace(
                a,
                headers=(("Authorization", f"Bearer {OTHER_SECRET}"),),
                env=(("AGENT_KEY", ENV_SECRET), ("OTHER", OTHER_SECRET)),
            ),
        )
        reports = classify(base, candidate)
        self.assertEqual([r.path for r in reports], [f"{A}.headers", f"{A}.env"])
        self.assertEqual({(r.old, r.new) for r in reports}, {(SECRET_CHANGED, SECRET_CHANGED)})
        self.assertIn("Authorization (changed)", reports[0].detail)
        self.assertIn("OTHER (added)", reports[1].detail)
        assert_no_secret(self, reports)


class EntryTests(SynchronousTestCase):
    """List entries matched by id: moved is no change; added or removed is."""

    def test_moved_entries(self) -> None:
        base = base_config()
        node_b = base.nodes[1]
        moved = dataclasses.replace(
            base,
            nodes=(
                dataclasses.replace(node_b, providers=tuple(reversed(node_b.providers))),
                base.nodes[0],
            ),
            models=tuple(reversed(base.models)),
            protocol_profiles=tuple(reversed(base.protocol_profiles)),
            model_routes=tuple(reversed(base.model_routes)),
            credentials=tuple(reversed(base.credentials)),
            client_api=dataclasses.replace(
                base.client_api, keys=tuple(reversed(base.client_api.keys))
            ),
        )
        self.assertEqual(classify(base, moved), [])

    def test_path_at_candidate_position(self) -> None:
        """A changed entry that also moved is named where the candidate has it."""
        base = base_config()
        node_b = base.nodes[1]
        spare = dataclasses.replace(node_b.providers[1], capacity=9)
        candidate = dataclasses.replace(
            base,
            nodes=(
                dataclasses.replace(node_b, providers=(spare, node_b.providers[0])),
                base.nodes[0],
            ),
        )
        [report] = classify(base, candidate)
        self.assertEqual(report.path, "nodes[0].providers[0].capacity")
        result = candidate_result("dry_run", [report])
        self.assertEqual(
            (result.changed_nodes, result.changed_providers, result.changed_models),
            (["node-b"], ["b-spare"], []),
        )
        self.assertEqual(result.result, "applied")

    def test_added_and_removed(self) -> None:
        base = base_config()
        node_a, node_b = base.nodes
        slot = CredentialSlot("new-slot", Secret(OTHER_SECRET))
        cases: list[tuple[EdgeConfig, list[tuple[str, str, str, str]]]] = [
            (
                dataclasses.replace(base, nodes=(node_a,)),
                [("nodes[1]", "node-b", ABSENT, RESTART)],
            ),
            (
                dataclasses.replace(
                    base,
                    nodes=(
                        node_a,
                        node_b,
                        dataclasses.replace(node_a, id="node-c", providers=()),
                    ),
                ),
                [("nodes[2]", ABSENT, "node-c", RESTART)],
            ),
            (
                LOCATORS[NodeConfig](
                    base,
                    lambda n: dataclasses.replace(n, providers=(*n.providers, provider("b-new"))),
                ),
                [("nodes[1].providers[2]", ABSENT, "b-new", LIVE)],
            ),
            (
                LOCATORS[NodeConfig](
                    base, lambda n: dataclasses.replace(n, providers=n.providers[1:])
                ),
                [("nodes[1].providers[0]", "b-chat", ABSENT, LIVE)],
            ),
            (
                LOCATORS[NodeConfig](
                    base, lambda n: dataclasses.replace(n, adapters=n.adapters[:1])
                ),
                [("nodes[1].adapters[1]", "coder", ABSENT, RESTART)],
            ),
            (
                dataclasses.replace(base, models=base.models[:1]),
                [("models[1]", "solo", ABSENT, LIVE)],
            ),
            (
                dataclasses.replace(
                    base,
                    models=(
                        ModelConfig("fresh", (ModelProviderRef("a-chat", "demo-model"),)),
                        *base.models,
                    ),
                ),
                [("models[0]", ABSENT, "fresh", LIVE)],
            ),
            (
                dataclasses.replace(base, protocol_profiles=base.protocol_profiles[1:]),
                [("protocol_profiles[0]", "anthropic", ABSENT, RESTART)],
            ),
            (
                dataclasses.replace(base, model_routes=base.model_routes[:1]),
                [("openai.model_routes[1]", "direct", ABSENT, RESTART)],
            ),
            (
                dataclasses.replace(base, client_api=dataclasses.replace(base.client_api, keys=())),
                [
                    ("openai.auth.keys[0]", "ops", ABSENT, AUTH),
                    ("openai.auth.keys[1]", "team-a", ABSENT, AUTH),
                ],
            ),
            (
                dataclasses.replace(base, credentials=(*base.credentials, slot)),
                [("credentials[2]", ABSENT, "new-slot", LIVE)],
            ),
            (
                dataclasses.replace(base, credentials=base.credentials[1:]),
                [("credentials[0]", "spare", ABSENT, LIVE)],
            ),
        ]
        for candidate, expected in cases:
            reports = classify(base, candidate)
            self.assertEqual([(r.path, r.old, r.new, r.change_class) for r in reports], expected)
            assert_no_secret(self, reports)

    def test_changed_lists(self) -> None:
        """changed_nodes/providers/models name every entry a report is under, once each."""
        base = base_config()
        node_a, node_b = base.nodes
        candidate = dataclasses.replace(
            base,
            nodes=(
                dataclasses.replace(node_a, concurrency=5),
                dataclasses.replace(
                    node_b,
                    providers=tuple(
                        dataclasses.replace(p, capacity=7, priority=1) for p in node_b.providers
                    ),
                ),
            ),
            models=(dataclasses.replace(base.models[0], display_name="Pool"), base.models[1]),
            credentials=base.credentials[1:],
        )
        result = candidate_result("apply", classify(base, candidate))
        self.assertEqual(result.result, "applied")
        self.assertEqual(result.changed_nodes, ["node-a", "node-b"])
        self.assertEqual(result.changed_providers, ["b-chat", "b-spare"])
        self.assertEqual(result.changed_models, ["pool"])
        self.assertEqual(len(result.reports), 7)

    def test_credential_slot_with_its_provider(self) -> None:
        """A slot added with a provider that starts using it: the provider's change blocks."""
        base = base_config()
        slot = CredentialSlot("new-slot", Secret(OTHER_SECRET))
        candidate = LOCATORS[ProviderConfig](
            dataclasses.replace(base, credentials=(*base.credentials, slot)),
            lambda p: dataclasses.replace(p, credential="new-slot"),
        )
        result = candidate_result("dry_run", classify(base, candidate))
        self.assertEqual(result.result, "restart_required")
        self.assertEqual(
            [(r.path, r.change_class) for r in result.blocking], [(f"{P}.credential", RESTART)]
        )


class FromYamlTests(SynchronousTestCase, EdgeConfigTestMixin):
    """The same rules on configs loaded from YAML: paths as the file spells them."""

    def setUp(self) -> None:
        self.make_base(self)

    def load(self, *mutations: Mutation, environ: dict[str, str] | None = None) -> EdgeConfig:
        data = yaml_config()
        for mutate in mutations:
            mutate(data)
        return self.parse(data, {**ENVIRON, **(environ or {})})

    def test_reloaded_is_no_change(self) -> None:
        """The same file loaded twice (secrets read again, legacy adapters normalized)."""
        self.assertEqual(classify(self.load(), self.load()), [])

    def test_edits(self) -> None:
        running = self.load()
        swap_nodes = put("nodes", list(reversed(yaml_config()["nodes"])))
        cases: list[tuple[list[Mutation], dict[str, str], list[tuple[str, str]]]] = [
            (
                [put("nodes.1.providers.0.capacity", 3)],
                {},
                [("nodes[1].providers[0].capacity", LIVE)],
            ),
            (
                [put("nodes.0.providers.0.enabled", False)],
                {},
                [("nodes[0].providers[0].enabled", LIVE)],
            ),
            ([swap_nodes], {}, []),
            (
                [swap_nodes, put("nodes.0.providers.0.priority", 2)],
                {},
                [("nodes[0].providers[0].priority", LIVE)],
            ),
            (
                [put("models.1.providers", [{"id": "b-chat", "target": "m2"}, "a-chat"])],
                {},
                [("models[1].providers", LIVE)],
            ),
            ([put("models.0.display_name", "Model one")], {}, [("models[0].display_name", LIVE)]),
            (
                [put("models.0.default_max_tokens", 512)],
                {},
                [("models[0].default_max_tokens", LIVE)],
            ),
            ([put("nodes.0.concurrency", 4)], {}, [("nodes[0].concurrency", LIVE)]),
            ([put("nodes.0.alias", "A")], {}, [("nodes[0].alias", RESTART)]),
            (
                [put("nodes.1.adapters.ollama.base_url", "http://127.0.0.1:11435")],
                {},
                [("nodes[1].adapters[0].base_url", RESTART)],
            ),
            (
                [put("listen.admin", "tcp:9091:interface=127.0.0.1")],
                {},
                [("listen.admin", RESTART)],
            ),
            (
                [
                    put(
                        "openai",
                        {"listen": "tcp:8080:interface=127.0.0.1", "auth": {"enabled": False}},
                    )
                ],
                {},
                [("openai.listen", RESTART), ("openai.auth.enabled", RESTART)],
            ),
            ([], {"TOKEN_A": "rotated-token"}, [("nodes[0].token", RESTART)]),
            ([], {"UPSTREAM_KEY": OTHER_SECRET}, [("nodes[0].adapters[0].headers", RESTART)]),
            ([drop("nodes.0.providers.1")], {}, [("nodes[0].providers[1]", LIVE)]),
        ]
        for mutations, environ, expected in cases:
            candidate = self.load(*mutations, environ=environ)
            reports = classify(running, candidate)
            self.assertEqual([(r.path, r.change_class) for r in reports], expected)
            text = json.dumps(candidate_result("apply", reports).as_dict())
            for secret in ("rotated-token", OTHER_SECRET, "upstream-key-value", "token-for-node-a"):
                self.assertNotIn(secret, text)
