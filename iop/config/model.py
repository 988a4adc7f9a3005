# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
Frozen, typed configuration objects for ``iop-edge`` (edge.yaml) and ``iop-node`` (node.yaml).

The loaders in :mod:`iop.config.edge` and :mod:`iop.config.node` build these from YAML, apply
defaults, resolve secret references and validate; nothing else constructs them from raw data.
Secrets are held in :class:`Secret`, whose ``repr`` never shows the value.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field
from enum import Enum

PROVIDER_CATEGORIES = frozenset({"api", "cli", "local_inference"})

DEFAULT_HEARTBEAT_INTERVAL_SEC = 2.0
DEFAULT_HEARTBEAT_TIMEOUT_SEC = 5.0
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
DEFAULT_RECONNECT_MAX_ATTEMPTS = 10
DEFAULT_RECONNECT_INTERVAL_SEC = 10.0
DEFAULT_STORE_PATH = "file:iop.db?cache=shared&mode=rwc"
# edge.drain_timeout_sec: a stopping Edge's work in flight gets this long to finish.
DEFAULT_DRAIN_TIMEOUT_SEC = 30.0

# Managed mode (``security:`` in edge.yaml and node.yaml).
SECURITY_MODES = frozenset({"legacy", "managed"})
# A node's workload DNS-ID is ``<node-id>.node.<trust domain>``.
DEFAULT_TRUST_DOMAIN = "iop.internal"
DEFAULT_LEASE_TTL_SEC = 30.0
MAX_LEASE_TTL_SEC = 300.0
DEFAULT_LEASE_CLOCK_SKEW_SEC = 5.0

# ``logging:`` in edge.yaml and node.yaml: how a daemon writes its log under twistd.
LOG_FORMATS = ("text", "json")
# Twisted's level names, lowest first; an event below the configured level is dropped.
LOG_LEVELS = ("debug", "info", "warn", "error", "critical")
DEFAULT_LOG_FORMAT = "text"
DEFAULT_LOG_LEVEL = "info"


class Secret:
    """
    A secret string (token, API key). ``repr``/``str`` never reveal it; compare with
    :meth:`matches`, which is constant-time.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def matches(self, candidate: str) -> bool:
        return hmac.compare_digest(self._value.encode(), candidate.encode())

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(
            self._value.encode(), other._value.encode()
        )

    def __hash__(self) -> int:
        return hash(("Secret", hashlib.sha256(self._value.encode()).digest()))


@dataclass(frozen=True)
class NodeToken:
    """
    How the Edge recognises a node's token: the sha256 digest of the token (the only form
    kept in memory), computed from a plaintext token, ``token_file`` or ``token_sha256``.
    """

    sha256: bytes = field(repr=False)

    @classmethod
    def from_plaintext(cls, token: str) -> NodeToken:
        return cls(hashlib.sha256(token.encode()).digest())

    def matches(self, token: str) -> bool:
        """Constant-time check of a presented token."""
        return hmac.compare_digest(self.sha256, hashlib.sha256(token.encode()).digest())

    def __repr__(self) -> str:
        return "NodeToken(sha256='***')"


# ---------------------------------------------------------------------------------------------
# TLS


@dataclass(frozen=True)
class ServerTLS:
    """Edge listener TLS material (PEM files)."""

    cert_file: str
    key_file: str
    # Client-certificate CA for managed mode (mTLS); unused until then.
    client_ca_file: str | None = None


@dataclass(frozen=True)
class ClientTLS:
    """How a node verifies its Edge."""

    # The CA that issued the Edge's certificate ("" when ca_pin stands for it).
    ca_file: str
    # The workload name the Edge's certificate must carry (DNS-ID), e.g. "edge.iop.internal".
    server_name: str
    cert_file: str | None = None
    key_file: str | None = None
    # Instead of ca_file: "sha256:<hex>" of the Edge CA's SubjectPublicKeyInfo; the CA comes in
    # the chain the Edge presents (a join string's pin, node.yaml edge.ca_sha256).
    ca_pin: str | None = None
    # When server_name was left to its default: the dialled host, accepted as the Edge's name too
    # (node.yaml's server_name once defaulted to it).
    host_name: str | None = None


# ---------------------------------------------------------------------------------------------
# Edge


@dataclass(frozen=True)
class HeartbeatConfig:
    interval_sec: float = DEFAULT_HEARTBEAT_INTERVAL_SEC
    timeout_sec: float = DEFAULT_HEARTBEAT_TIMEOUT_SEC


@dataclass(frozen=True)
class ProfileConfig:
    """A protocol profile from the top-level ``protocol_profiles`` catalog."""

    name: str
    driver: str
    operations: tuple[tuple[str, str], ...] = ()
    capabilities: tuple[str, ...] = ()
    extensions: tuple[tuple[str, bool], ...] = ()
    auth_header: str = ""
    # The credential's scheme in ``auth_header`` ("Bearer" → ``Authorization: Bearer <secret>``;
    # "" → the bare secret, as ``x-api-key`` takes it).
    auth_scheme: str = ""
    # Whether a tunnel's upstream request carries the client request's id as ``x-request-id``
    # (an OpenAI-compatible server such as vLLM logs it); None: by the driver (sends_request_id).
    send_request_id: bool | None = None

    @property
    def sends_request_id(self) -> bool:
        """``send_request_id``, by default on but for the anthropic_messages driver (Anthropic's
        API documents no such request header; its answer's ``request-id`` is its own)."""
        if self.send_request_id is not None:
            return self.send_request_id
        return self.driver != "anthropic_messages"


@dataclass(frozen=True)
class AdapterConfig:
    """
    One named adapter instance on a node. A legacy single-instance adapter (configured by type)
    is normalized at load to an instance whose ``name`` is its ``type``.
    """

    name: str
    type: str
    enabled: bool = True
    base_url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    request_timeout_ms: int = 0
    idle_timeout_ms: int = 0
    # None: the node's gate follows the enabled providers' capacities (their sum, at least 1);
    # set: a ceiling those capacities must fit under (checked at load).
    max_concurrency: int | None = None
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    workspace: str = ""
    mode: str = ""
    resume_args: tuple[str, ...] = ()
    output_format: str = ""
    prompt_placement: str = ""
    context_size: int = 0
    settings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ProviderConfig:
    """A provider (resource) under a node: ``nodes[].providers[]``."""

    id: str
    adapter: str
    category: str
    # The adapter instance ``adapter`` resolved to (exact instance name, or the one enabled
    # instance of a legacy type name). Empty for a disabled provider whose reference was not
    # checked.
    adapter_instance: str
    type: str
    models: tuple[str, ...]
    enabled: bool = True
    priority: int = 0
    capacity: int = 1
    long_context_threshold: int = 0
    long_capacity: int = 0
    max_queue: int = 0
    queue_timeout_sec: float = 0.0
    profile: str = ""
    usage_attribution: str = ""
    # Managed mode: the ``credentials[]`` slot whose secret a lease carries to this provider.
    credential: str = ""


@dataclass(frozen=True)
class NodeConfig:
    """One configured node: ``nodes[]``."""

    id: str
    token: NodeToken
    alias: str = ""
    agent_kind: str = ""
    concurrency: int = 0
    adapters: tuple[AdapterConfig, ...] = ()
    providers: tuple[ProviderConfig, ...] = ()
    # Managed mode: the node's lease recipient public key (written by ``iop keys recipient``).
    recipient_key_file: str | None = None


@dataclass(frozen=True)
class ModelProviderRef:
    provider_id: str
    # The served target on that provider for this model key.
    target: str


@dataclass(frozen=True)
class ModelConfig:
    """A canonical routing key: ``models[]``."""

    id: str
    providers: tuple[ModelProviderRef, ...]
    display_name: str = ""
    default_max_tokens: int | None = None
    min_max_tokens: int | None = None
    default_thinking_token_budget: int | None = None
    # A local token counter answering Anthropic count_tokens without a provider ("" = none).
    token_counter: str = ""
    # What its tokens cost (None: no price, cost unknown).
    price: Price | None = None


@dataclass(frozen=True)
class ModelRoute:
    """
    ``openai.model_routes[]``: an external model id mapped straight to an adapter instance and
    served target, on one node or (``node_id`` None) on the single ready node.
    """

    model: str
    adapter: str
    target: str
    node_id: str | None = None


# Per-key and per-team limits and budgets (``openai.auth``; enforced by iop.edge.quota).
# Budget periods are calendar periods in UTC: ``week`` is the ISO week (Monday 00:00 UTC).
BUDGET_PERIODS = ("day", "week", "month", "total")
# Costs are integer micro-units of ``usage.currency`` everywhere in accounting: 1.0 = 1_000_000.
MICROS_PER_UNIT = 1_000_000


@dataclass(frozen=True)
class Limits:
    """
    Rate and concurrency limits of one key or team; ``None`` = unlimited. The two per-minute
    limits are a sliding window over the last 60 s; tokens are input + output (the worst case
    reserved at admission, the reported usage once settled).
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_requests is None
        )


@dataclass(frozen=True)
class Budget:
    """
    A budget over one calendar ``period`` (``BUDGET_PERIODS``, UTC): at most ``tokens`` and/or
    ``cost_micros`` (micro-units of the usage currency) in it; ``None`` = no cap on that one.
    """

    period: str
    tokens: int | None = None
    cost_micros: int | None = None


@dataclass(frozen=True)
class Team:
    """``openai.auth.teams[]``: a named group of keys whose usage adds up against its own
    ``limits`` and ``budgets`` (on top of each key's)."""

    name: str
    limits: Limits = Limits()
    budgets: tuple[Budget, ...] = ()


@dataclass(frozen=True)
class ClientKey:
    """
    A client API key, held only as its sha256 digest; ``models`` empty = every model.

    Rotation: ``previous_digest`` (the key being replaced) is accepted too until
    ``previous_valid_until`` (seconds since the epoch, UTC). ``disabled``: refused at once.
    ``team``: the team whose limits and budgets the key's usage also counts against ("": none).
    ``limits`` and ``budgets`` are the key's own, or the ``default_limits`` /
    ``default_budgets`` of ``openai.auth`` when the key sets none (resolved at load).
    """

    name: str
    digest: NodeToken
    models: tuple[str, ...] = ()
    previous_digest: NodeToken | None = None
    previous_valid_until: float | None = None
    disabled: bool = False
    team: str = ""
    limits: Limits = Limits()
    budgets: tuple[Budget, ...] = ()

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def matches(self, presented: str, now: float) -> bool:
        """
        Whether ``presented`` is this key (or, until ``previous_valid_until``, the key it
        replaced), at ``now`` (seconds since the epoch). Both digests are always compared, so
        the time taken says nothing about which matched. A disabled key matches nothing.
        """
        current = self.digest.matches(presented)
        previous = False
        if self.previous_digest is not None:
            previous = self.previous_digest.matches(presented)
            if self.previous_valid_until is None or now >= self.previous_valid_until:
                previous = False
        return (current or previous) and not self.disabled


DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
# The client listener's defaults (``openai:``): see etc/iop/edge.yaml for the reasoning.
DEFAULT_REQUEST_HEAD_TIMEOUT_SEC = 10.0
DEFAULT_REQUEST_BODY_TIMEOUT_SEC = 10.0
DEFAULT_REQUEST_BODY_MIN_RATE = 1024
DEFAULT_CLIENT_IDLE_TIMEOUT_SEC = 60.0
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_LISTEN_BACKLOG = 1024
# How long a browser may cache a CORS preflight answer (Chromium caps it at 7200).
DEFAULT_CORS_MAX_AGE_SEC = 600


@dataclass(frozen=True)
class CorsConfig:
    """
    ``openai.cors``: the web origins whose pages may call the client API from a browser.
    ``allow_origins`` holds serialized origins (``https://app.example.com``) or ``*`` alone
    (any origin; only with auth on). ``max_age_sec``: how long a preflight answer is cached.
    """

    allow_origins: tuple[str, ...]
    max_age_sec: int = DEFAULT_CORS_MAX_AGE_SEC

    @property
    def any_origin(self) -> bool:
        return self.allow_origins == ("*",)

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.allow_origins


def with_backlog(endpoint: str, backlog: int) -> str:
    """A server endpoint string with ``backlog=`` added unless it sets one (Twisted's is 50)."""
    if re.search(r"(?:^|:)backlog=", endpoint):
        return endpoint
    return f"{endpoint}:backlog={backlog}"


@dataclass(frozen=True)
class ClientAPIConfig:
    """
    ``openai:``: the client HTTP listener serving the OpenAI- and Anthropic-compatible APIs.
    ``listen`` None = no client listener. ``auth`` False only on a loopback listener.

    The listener's limits: a request head must arrive whole within ``request_head_timeout_sec``
    of the connection opening (or of its first byte, on a kept-alive connection); a body gets
    ``request_body_timeout_sec`` plus one second per ``request_body_min_rate`` bytes received;
    a connection with nothing to do is closed after ``idle_timeout_sec``. At most
    ``max_connections`` client connections at once, ``max_connections_per_peer`` from one
    address (503 past either; None = a quarter of ``max_connections``); the Edge clamps both to
    what its open-file limit affords (:mod:`iop.edge.descriptors`). ``listen_backlog`` is the
    listen queue unless ``listen`` sets ``backlog=`` itself (:attr:`listen_endpoint`).
    ``cors`` None = no cross-origin access.
    ``reuse_port``: the listening socket has ``SO_REUSEPORT`` (Linux), so that several Edge
    processes on one host share the client port (:mod:`iop.edge.ingress.listen`).
    ``teams``: ``openai.auth.teams``; ``default_limits`` / ``default_budgets``: what a key that
    sets no ``limits`` / ``budgets`` gets (already resolved into each :class:`ClientKey`; kept
    here for the refresh report and for display).
    """

    listen: str | None = None
    auth: bool = True
    keys: tuple[ClientKey, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_head_timeout_sec: float = DEFAULT_REQUEST_HEAD_TIMEOUT_SEC
    request_body_timeout_sec: float = DEFAULT_REQUEST_BODY_TIMEOUT_SEC
    request_body_min_rate: int = DEFAULT_REQUEST_BODY_MIN_RATE
    idle_timeout_sec: float = DEFAULT_CLIENT_IDLE_TIMEOUT_SEC
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int | None = None
    listen_backlog: int = DEFAULT_LISTEN_BACKLOG
    cors: CorsConfig | None = None
    reuse_port: bool = False
    teams: tuple[Team, ...] = ()
    default_limits: Limits = Limits()
    default_budgets: tuple[Budget, ...] = ()

    @property
    def listen_endpoint(self) -> str | None:
        """``listen`` with ``backlog=listen_backlog`` added when it does not set one."""
        if self.listen is None:
            return None
        return with_backlog(self.listen, self.listen_backlog)

    def key_for(self, presented: str, now: float | None = None) -> ClientKey | None:
        """
        The key ``presented`` is, at ``now`` (seconds since the epoch; default: the wall
        clock): its current digest, or its previous one until ``previous_valid_until``; never
        a disabled key. Constant-time over all keys: every digest is compared, whatever
        matches.
        """
        when = time.time() if now is None else now
        found: ClientKey | None = None
        for key in self.keys:
            if key.matches(presented, when) and found is None:
                found = key
        return found

    def why_refused(self, presented: str, now: float | None = None) -> str | None:
        """
        For a key :meth:`key_for` did not accept, why, when it is one of ours: ``"disabled"``
        (a disabled key's digest) or ``"rotated"`` (a replaced key past its
        ``previous_valid_until``); ``None`` for a key unknown here. Only for the 401's message:
        whoever presents the key holds it already, so saying which is safe.
        """
        when = time.time() if now is None else now
        for key in self.keys:
            if key.digest.matches(presented):
                return "disabled" if key.disabled else None
            if key.previous_digest is not None and key.previous_digest.matches(presented):
                if key.disabled:
                    return "disabled"
                valid = key.previous_valid_until is not None and when < key.previous_valid_until
                return None if valid else "rotated"
        return None

    def team(self, name: str) -> Team | None:
        """The team called ``name``, if any."""
        for team in self.teams:
            if team.name == name:
                return team
        return None


TOKEN_COUNTERS = frozenset({"approximate"})


@dataclass(frozen=True)
class CredentialSlot:
    """
    ``credentials[]``: a provider credential held on the Edge only. ``secret`` comes by
    reference (``${ENV}`` or a file); ``revision`` is bound into every lease, so changing it
    invalidates leases in flight; a disabled slot issues none (its requests fail closed).
    """

    name: str
    secret: Secret
    revision: int = 1
    enabled: bool = True


@dataclass(frozen=True)
class EdgeSecurity:
    """
    ``security:`` in edge.yaml. ``legacy``: no leases, adapters carry their own headers.
    ``managed``: nodes prove their workload name (``<node-id>.node.<trust_domain>``) with a
    client certificate, and tunnel requests carry a lease signed with ``signing_key_file``
    (Ed25519, ``iop keys issuer``) valid ``lease_ttl_sec``.
    """

    mode: str = "legacy"
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    signing_key_file: str | None = None
    lease_ttl_sec: float = DEFAULT_LEASE_TTL_SEC

    @property
    def managed(self) -> bool:
        return self.mode == "managed"

    def node_workload(self, node_id: str) -> str:
        """The DNS-ID a node's client certificate must carry."""
        return f"{node_id}.node.{self.trust_domain}"


# ``cluster:`` in edge.yaml: several Edges sharing the provider leases on Redis.
DEFAULT_CLUSTER_LEASE_TTL_SEC = 10.0
DEFAULT_CLUSTER_KEY_PREFIX = "iop"
DEFAULT_REDIS_PORT = 6379


@dataclass(frozen=True)
class RedisAddress:
    """
    Where the cluster's Redis listens, parsed from ``cluster.redis``: TCP ``host``/``port`` or
    a unix socket ``path`` (exactly one of the two), the logical database ``db`` and the ACL
    ``username`` (the password is never part of the address: ``cluster.password``).
    """

    host: str = ""
    port: int = DEFAULT_REDIS_PORT
    path: str = ""
    db: int = 0
    username: str | None = None

    @property
    def unix(self) -> bool:
        return bool(self.path)

    def __str__(self) -> str:
        if self.unix:
            return f"unix://{self.path}?db={self.db}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/{self.db}"


@dataclass(frozen=True)
class ClusterConfig:
    """
    ``cluster:`` in edge.yaml (absent: one Edge, everything in process). ``redis``: the
    ``redis://host:port/db`` or ``unix:///path?db=N`` address as written (never with a
    password); ``password``: from ``password: ${ENV}`` or ``password_file``; ``edge_id``: this
    Edge's name among the cluster's Edges (defaults to ``edge.id``); ``lease_ttl_sec``: how long
    a lease outlives its Edge's last renewal; ``key_prefix``: the namespace of every key.
    :func:`iop.config.cluster.redis_address` parses ``redis``.
    """

    redis: str
    edge_id: str
    password: Secret | None = None
    lease_ttl_sec: float = DEFAULT_CLUSTER_LEASE_TTL_SEC
    key_prefix: str = DEFAULT_CLUSTER_KEY_PREFIX


@dataclass(frozen=True)
class LoggingConfig:
    """
    ``logging:`` in edge.yaml and node.yaml. ``format``: ``text`` (twistd's classic lines) or
    ``json`` (one JSON object per line, for log shippers). ``level``: the lowest level written
    (one of :data:`LOG_LEVELS`); events below it are dropped before they are formatted.
    """

    format: str = DEFAULT_LOG_FORMAT
    level: str = DEFAULT_LOG_LEVEL


# ``telemetry:`` in edge.yaml and node.yaml (iop.config.telemetry, iop.telemetry).
DEFAULT_TELEMETRY_SAMPLING_RATIO = 1.0
DEFAULT_TELEMETRY_QUEUE_SIZE = 2048
DEFAULT_TELEMETRY_EXPORT_TIMEOUT_SEC = 10.0
DEFAULT_TELEMETRY_SHUTDOWN_TIMEOUT_SEC = 5.0
EDGE_SERVICE_NAME = "iop-edge"
NODE_SERVICE_NAME = "iop-node"


@dataclass(frozen=True)
class TelemetryConfig:
    """
    ``telemetry:`` in edge.yaml and node.yaml: where the daemon's traces go (OTLP over HTTP).

    ``endpoint``: the OTLP/HTTP traces URL (``…/v1/traces``; a bare base URL has it appended).
    ``headers``: sent with every export (a collector's or a vendor's credentials), each value a
    :class:`Secret` (never in a repr, a log or an error). ``sampling_ratio``: the share of new
    traces recorded, parent-based (a sampled incoming ``traceparent`` is always followed).
    ``service_name``: the ``service.name`` resource (empty: the daemon's default, ``iop-edge``
    or ``iop-node``). ``capture_content``: the GenAI conventions' opt-in to record message
    contents (off: never). ``queue_size``: spans held for export before new ones are dropped
    (and counted). ``export_timeout_sec``: one export's bound; ``shutdown_timeout_sec``: how
    long a stopping daemon waits for the last spans to go.
    """

    endpoint: str
    headers: tuple[tuple[str, Secret], ...] = ()
    sampling_ratio: float = DEFAULT_TELEMETRY_SAMPLING_RATIO
    service_name: str = ""
    capture_content: bool = False
    queue_size: int = DEFAULT_TELEMETRY_QUEUE_SIZE
    export_timeout_sec: float = DEFAULT_TELEMETRY_EXPORT_TIMEOUT_SEC
    shutdown_timeout_sec: float = DEFAULT_TELEMETRY_SHUTDOWN_TIMEOUT_SEC


@dataclass(frozen=True)
class AdminConfig:
    """
    ``admin:`` in edge.yaml. ``auth``: the digest of the admin bearer token (from ``token:
    ${ENV}``, ``token_file`` or ``token_sha256``); when set, every request to the admin listener
    must carry ``Authorization: Bearer <token>``. Required when ``listen.admin`` is not loopback.
    """

    auth: NodeToken | None = None


@dataclass(frozen=True)
class EdgeConfig:
    """The whole edge.yaml."""

    id: str
    node_listen: str
    admin_listen: str
    tls: ServerTLS | None
    # True only when explicitly configured and the node listener is loopback.
    plaintext_nodes: bool
    heartbeat: HeartbeatConfig
    max_frame_bytes: int
    register_timeout_sec: float
    nodes: tuple[NodeConfig, ...]
    models: tuple[ModelConfig, ...] = ()
    protocol_profiles: tuple[ProfileConfig, ...] = ()
    model_routes: tuple[ModelRoute, ...] = ()
    client_api: ClientAPIConfig = ClientAPIConfig()
    security: EdgeSecurity = EdgeSecurity()
    credentials: tuple[CredentialSlot, ...] = ()
    admin: AdminConfig = AdminConfig()
    logging: LoggingConfig = LoggingConfig()
    telemetry: TelemetryConfig | None = None
    cluster: ClusterConfig | None = None
    usage: UsageConfig = field(default_factory=lambda: UsageConfig())
    source_path: str = ""
    # edge.drain_timeout_sec: how long a stopping Edge lets its work in flight finish.
    drain_timeout_sec: float = DEFAULT_DRAIN_TIMEOUT_SEC

    @property
    def node_listen_endpoint(self) -> str:
        """The node listener, with a listen queue for reconnect bursts unless it sets one."""
        return with_backlog(self.node_listen, DEFAULT_LISTEN_BACKLOG)

    @property
    def admin_listen_endpoint(self) -> str:
        """The admin listener, with the same listen queue unless it sets one."""
        return with_backlog(self.admin_listen, DEFAULT_LISTEN_BACKLOG)

    def node(self, node_id: str) -> NodeConfig | None:
        for n in self.nodes:
            if n.id == node_id:
                return n
        return None

    def credential(self, name: str) -> CredentialSlot | None:
        """The ``credentials[]`` slot called ``name`` (a provider's ``credential``), if any."""
        for slot in self.credentials:
            if slot.name == name:
                return slot
        return None

    def model(self, model_id: str) -> ModelConfig | None:
        """The ``models[]`` entry ``model_id``, if any."""
        for m in self.models:
            if m.id == model_id:
                return m
        return None


# ---------------------------------------------------------------------------------------------
# Node


class ReconnectMode(Enum):
    FINITE = "finite"
    UNLIMITED = "unlimited"


@dataclass(frozen=True)
class ReconnectPolicy:
    """
    ``reconnect.max_attempts``: omitted = 10, 0 = unlimited until local shutdown, positive =
    exact limit of consecutive failed attempts. ``interval_sec`` between attempts (default 10).
    """

    max_attempts: int = DEFAULT_RECONNECT_MAX_ATTEMPTS
    interval_sec: float = DEFAULT_RECONNECT_INTERVAL_SEC

    @property
    def unlimited(self) -> bool:
        return self.max_attempts == 0


@dataclass(frozen=True)
class NodeSecurity:
    """
    ``security:`` in node.yaml. ``managed``: the node presents its client certificate
    (``edge.cert_file``/``key_file``), opens leases with its recipient private key
    (``recipient_key_file``) and accepts only leases signed by ``issuer_key_file`` (the Edge's
    public signing key), allowing ``clock_skew_sec`` on expiry.
    """

    mode: str = "legacy"
    recipient_key_file: str | None = None
    issuer_key_file: str | None = None
    clock_skew_sec: float = DEFAULT_LEASE_CLOCK_SKEW_SEC

    @property
    def managed(self) -> bool:
        return self.mode == "managed"


@dataclass(frozen=True)
class EdgeAddress:
    """
    One Edge a node dials: node.yaml's ``edge:`` or one entry of ``edges:``. ``tls`` is None
    exactly when ``plaintext`` (allowed only to a loopback host).
    """

    host: str
    port: int
    tls: ClientTLS | None
    plaintext: bool = False

    @property
    def name(self) -> str:
        """``host:port`` (``[v6]:port`` for an IPv6 literal): how logs and status name it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class NodeDaemonConfig:
    """
    The whole node.yaml: only what a node needs to find and prove itself to its Edges.

    ``edges`` lists every Edge the node dials (one session each), never empty: built from
    ``edge_host``/``edge_port``/``tls``/``plaintext`` when not given. Those four fields are the
    first Edge's view (what a one-Edge node has always had).
    """

    edge_host: str
    edge_port: int
    token: Secret
    tls: ClientTLS | None
    # True only when explicitly configured and the edge host is loopback.
    plaintext: bool
    reconnect: ReconnectPolicy
    store_path: str = DEFAULT_STORE_PATH
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    handshake_timeout_sec: float = 10.0
    security: NodeSecurity = NodeSecurity()
    logging: LoggingConfig = LoggingConfig()
    telemetry: TelemetryConfig | None = None
    source_path: str = ""
    edges: tuple[EdgeAddress, ...] = ()
    # A stopping node's drain bound (iop.node.drain): 0 closes its sessions at once.
    drain_timeout_sec: float = 30.0

    def __post_init__(self) -> None:
        if not self.edges:
            first = EdgeAddress(self.edge_host, self.edge_port, self.tls, self.plaintext)
            object.__setattr__(self, "edges", (first,))


# ---------------------------------------------------------------------------------------------
# Prices and usage (``models[].price``, ``usage:`` in edge.yaml)

#: Costs are integer micro-units of ``usage.currency`` everywhere (1 USD = 1_000_000).
MICROS_PER_UNIT = 1_000_000
DEFAULT_CURRENCY = "USD"
DEFAULT_LEDGER_PATH = "usage.sqlite3"
DEFAULT_LEDGER_RETENTION_DAYS = 90


@dataclass(frozen=True)
class Price:
    """
    ``models[].price``: what one million tokens of each kind cost, held as integer micro-units
    of ``usage.currency`` (edge.yaml's ``3.75`` per million is ``3_750_000`` here, so one token
    costs this many *millionths* of a micro-unit and a cost is exact integer arithmetic).
    ``cached_input`` (prompt tokens read from a cache) and ``cache_write`` (written to one)
    default to ``input``, ``reasoning`` to ``output``; the loader fills them in.
    """

    input: int
    output: int
    cached_input: int
    cache_write: int
    reasoning: int


@dataclass(frozen=True)
class LedgerConfig:
    """
    ``usage.ledger``: the SQLite file of one record per finished request on this Edge
    (``path`` absolute once loaded) and how many days of records it keeps (0 = forever).
    ``enabled`` False: no ledger (``GET /usage`` answers 503).
    """

    path: str
    retention_days: int = DEFAULT_LEDGER_RETENTION_DAYS
    enabled: bool = True


@dataclass(frozen=True)
class UsageConfig:
    """``usage:`` in edge.yaml: the currency prices and cost budgets are in (a label, an ISO
    4217 code) and the usage ledger."""

    currency: str = DEFAULT_CURRENCY
    ledger: LedgerConfig | None = None
