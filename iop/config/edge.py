# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
Load and validate edge.yaml into a frozen :class:`~iop.config.model.EdgeConfig`.

:func:`parse_edge_config` works on already-loaded YAML data; :func:`load_edge_config` reads a
file. Both collect every problem into one :class:`~iop.config.errors.ConfigError`. Relative
file paths resolve against the config file's directory and are stored absolute.

Managed mode (``security.mode: managed``) adds the ``credentials[]`` catalog and its rules:
mTLS node transport, the lease-signing key, each node's recipient key, and credentials that
reach a provider only through its slot and its profile's ``auth_header``. Key files are only
checked to exist and be readable here; the Edge parses them when it starts.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from iop.config.cluster import cluster_section
from iop.config.errors import (
    MISSING,
    Issues,
    Section,
    as_list,
    as_section,
    key_path,
    read_yaml_file,
    type_name,
)
from iop.config.logs import logging_section
from iop.config.model import (
    ADAPTER_TYPES,
    DEFAULT_CLIENT_IDLE_TIMEOUT_SEC,
    DEFAULT_CORS_MAX_AGE_SEC,
    DEFAULT_HEARTBEAT_INTERVAL_SEC,
    DEFAULT_HEARTBEAT_TIMEOUT_SEC,
    DEFAULT_LEASE_TTL_SEC,
    DEFAULT_LISTEN_BACKLOG,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_REQUEST_BODY_MIN_RATE,
    DEFAULT_REQUEST_BODY_TIMEOUT_SEC,
    DEFAULT_REQUEST_HEAD_TIMEOUT_SEC,
    DEFAULT_TRUST_DOMAIN,
    MAX_LEASE_TTL_SEC,
    PROFILE_DRIVERS,
    PROVIDER_CATEGORIES,
    SECURITY_MODES,
    TOKEN_COUNTERS,
    AdapterConfig,
    AdminConfig,
    ClientAPIConfig,
    ClientKey,
    CorsConfig,
    CredentialSlot,
    EdgeConfig,
    EdgeSecurity,
    HeartbeatConfig,
    ModelConfig,
    ModelProviderRef,
    ModelRoute,
    NodeConfig,
    NodeToken,
    ProfileConfig,
    ProviderConfig,
    ServerTLS,
)
from iop.config.secrets import (
    absolute_path,
    credential_secret,
    edge_node_token,
    resolve_references,
)

DEFAULT_EDGE_ID = "edge"
DEFAULT_ADMIN_LISTEN = "tcp:8081:interface=127.0.0.1"
DEFAULT_REGISTER_TIMEOUT_SEC = 10.0
MAX_FRAME_BYTES_LIMIT = 256 * 1024 * 1024

PROFILE_CAPABILITIES = frozenset({"chat", "messages", "streaming", "tools", "count_tokens"})
PROFILE_EXTENSIONS = ("reasoning", "thinking")
ADAPTER_OUTPUT_FORMATS = frozenset({"", "text", "json", "stream-json"})

ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+\Z")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# An HTTP auth-scheme is a token (RFC 9110 §11.1), the same characters as a header name.
_AUTH_SCHEME = _HEADER_NAME
SLOT_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
# One DNS label (RFC 1123), lowercase: trust domains and managed node ids are DNS names.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
# The adapters whose providers are raw tunnels: the only requests a lease can carry a
# credential on (ollama and cli providers are normalized runs).
CREDENTIAL_ADAPTER_TYPES = frozenset({"openai_compat", "vllm"})
# Header names that carry a credential whatever the profiles say; in managed mode no adapter
# may set them (nor any profile's auth_header): a node never holds a provider key.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"}
)
_MANAGED = "security.mode: managed"
_TCP_ARGUMENTS = ("port", "interface", "backlog")
_LEGACY_REJECTED = {
    "name": "not allowed in the legacy adapters mapping; use the list form to name instances",
    "type": "not allowed in the legacy adapters mapping (the key is the type); use the list "
    "form to name instances",
}


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
    config = _EdgeParser(issues, base_dir, environ).parse(data, source_path)
    issues.raise_if_any(source_path)
    assert config is not None
    return config


# ---------------------------------------------------------------------------------------------
# Shared helpers (also used by iop.config.node)


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``::1`` or any 127.0.0.0/8 address."""
    candidate = host.strip().lower()
    if candidate.startswith("[") and candidate.endswith("]"):
        candidate = candidate[1:-1]
    if candidate == "localhost":
        return True
    try:
        return ipaddress.ip_address(candidate).is_loopback
    except ValueError:
        return False


def split_endpoint(description: str) -> tuple[list[str], dict[str, str]]:
    """
    Split a Twisted endpoint string into positional and keyword arguments, with Twisted's
    rules: ``:`` separates arguments, the first ``=`` in one makes it a keyword, and a
    backslash escapes the next character (``interface=\\:\\:1``).
    """
    args: list[str] = []
    kwargs: dict[str, str] = {}
    parts: list[str] = []
    current = ""
    ops = ":="
    chars = iter(description)
    for ch in chars:
        if ch in ops:
            parts.append(current)
            current = ""
            if ch == ":":
                _add_endpoint_part(parts, args, kwargs)
                parts = []
                ops = ":="
            else:
                ops = ":"
        elif ch == "\\":
            current += next(chars, "")
        else:
            current += ch
    parts.append(current)
    _add_endpoint_part(parts, args, kwargs)
    return args, kwargs


def _add_endpoint_part(parts: list[str], args: list[str], kwargs: dict[str, str]) -> None:
    if len(parts) == 1:
        args.append(parts[0])
    else:
        kwargs[parts[0]] = parts[1]


def check_tcp_endpoint(issues: Issues, path: str, description: str) -> str | None:
    """
    Validate a ``tcp:PORT[:interface=ADDR][:backlog=N]`` server endpoint string; return its
    interface (``""`` for all interfaces) or ``None`` if it is invalid.
    """
    if re.search(r"(?<!\\)::", description):
        issues.add(path, "escape the ':' of an IPv6 address with '\\', e.g. interface=\\:\\:1")
        return None
    args, kwargs = split_endpoint(description)
    if args[0] != "tcp":
        issues.add(path, "must be a Twisted server endpoint string starting with 'tcp:'")
        return None
    if len(args) > 1 + len(_TCP_ARGUMENTS):
        issues.add(path, "too many ':'-separated arguments for a tcp endpoint")
        return None
    values = dict(zip(_TCP_ARGUMENTS, args[1:], strict=False))
    ok = True
    for name, value in kwargs.items():
        if name not in _TCP_ARGUMENTS:
            allowed = ", ".join(_TCP_ARGUMENTS)
            issues.add(path, f"unknown tcp endpoint option {name!r} (allowed: {allowed})")
            ok = False
        elif name in values:
            issues.add(path, f"tcp endpoint option {name!r} is given twice")
            ok = False
        else:
            values[name] = value
    port = values.get("port")
    if port is None:
        issues.add(path, "tcp endpoint needs a port, e.g. 'tcp:7443:interface=127.0.0.1'")
        ok = False
    elif not (port.isascii() and port.isdigit() and int(port) <= 65535):
        issues.add(path, "tcp endpoint port must be an integer from 0 to 65535")
        ok = False
    backlog = values.get("backlog")
    if backlog is not None and not (backlog.isascii() and backlog.isdigit() and int(backlog)):
        issues.add(path, "tcp endpoint backlog must be a positive integer")
        ok = False
    return values.get("interface", "") if ok else None


def endpoint_interface(description: str) -> str | None:
    """
    The network interface a (non-``tcp:``) server endpoint string binds: ``unix:`` sockets are
    local (``127.0.0.1`` for the loopback rule), otherwise its ``interface=`` (``""``: all).
    """
    args, kwargs = split_endpoint(description)
    if args[0] == "unix":
        return "127.0.0.1"
    return kwargs.get("interface", "")


def existing_file(issues: Issues, path: str, value: str, base_dir: str) -> str:
    """``value`` resolved against ``base_dir``; an issue unless it is a readable file."""
    resolved = absolute_path(base_dir, value)
    if not os.path.exists(resolved):
        issues.add(path, f"file {resolved} does not exist")
    elif not os.path.isfile(resolved):
        issues.add(path, f"{resolved} is not a regular file")
    elif not os.access(resolved, os.R_OK):
        issues.add(path, f"file {resolved} is not readable")
    return resolved


def required_file(section: Section, key: str, base_dir: str) -> str:
    value = section.string(key, required=True)
    if not value.strip():
        return ""
    return existing_file(section.issues, section.path_of(key), value, base_dir)


def optional_file(section: Section, key: str, base_dir: str) -> str | None:
    if not section.has(key):
        section.raw(key)
        return None
    return required_file(section, key, base_dir) or None


def check_id(issues: Issues, path: str, value: str) -> None:
    if value and not ID_PATTERN.match(value):
        issues.add(path, "must contain only letters, digits, '.', '_' and '-'")


def dns_name_problem(name: str) -> str | None:
    """
    Why ``name`` is not a lowercase DNS name (dot-separated RFC 1123 labels, at most 253
    characters, no trailing dot), or None.
    """
    if not name:
        return "must not be empty"
    if name != name.lower():
        return f"DNS names are compared in lowercase: write {name.lower()!r}"
    if len(name) > 253:
        return "a DNS name is at most 253 characters"
    for label in name.split("."):
        if not _DNS_LABEL.match(label):
            return (
                "must be a DNS name: dot-separated labels of 1-63 lowercase letters, digits "
                "and '-', not starting or ending with '-'"
            )
    return None


# ---------------------------------------------------------------------------------------------
# The parser


@dataclass
class _Adapter:
    config: AdapterConfig
    # False if the entry had issues (references to it are not checked further).
    ok: bool
    # (header name, config path) of each ``headers`` entry, for the managed-mode checks.
    header_paths: tuple[tuple[str, str], ...] = ()


@dataclass
class _ProviderInfo:
    path: str
    # None when the provider's models list was invalid (model targets are not checked then).
    models: tuple[str, ...] | None


@dataclass(frozen=True)
class _Binding:
    """An enabled provider bound to a credential slot, on its resolved adapter instance."""

    provider_id: str
    slot: str
    # The profile's auth_header, lowercase: the header the lease's credential goes in.
    header: str


@dataclass
class _EdgeParser:
    issues: Issues
    base_dir: str
    environ: Mapping[str, str]
    profile_names: set[str] = field(default_factory=set)
    # Profiles by name, with their config path (the first one of a duplicated name).
    profiles: dict[str, tuple[str, ProfileConfig]] = field(default_factory=dict)
    providers: dict[str, _ProviderInfo] = field(default_factory=dict)
    security: EdgeSecurity = field(default_factory=EdgeSecurity)
    slot_names: set[str] = field(default_factory=set)
    slots: dict[str, CredentialSlot] = field(default_factory=dict)
    # False when an entry could not be read far enough to learn its name/id: references that
    # do not resolve may then point at it, so they are not reported (no cascades).
    profiles_complete: bool = True
    providers_complete: bool = True
    credentials_complete: bool = True
    # False when security.mode (or trust_domain) could not be read: the checks that depend
    # on it are skipped rather than guessed.
    mode_known: bool = True
    trust_domain_ok: bool = True

    def parse(self, data: object, source_path: str) -> EdgeConfig | None:
        top = as_section(self.issues, "", data)
        if top is None:
            return None

        identity = top.section("edge")
        edge_id = DEFAULT_EDGE_ID
        if identity is not None:
            edge_id = identity.string("id", DEFAULT_EDGE_ID, nonempty=True)
            check_id(self.issues, identity.path_of("id"), edge_id)
            identity.finish()

        listen = top.section("listen", required=True)
        node_listen = ""
        admin_listen = DEFAULT_ADMIN_LISTEN
        # The admin listener's interface ("" all interfaces; None unknown: already an issue).
        admin_interface: str | None = "127.0.0.1"
        interface: str | None = None
        if listen is not None:
            node_listen = listen.string("nodes", required=True)
            if node_listen.strip():
                interface = check_tcp_endpoint(self.issues, listen.path_of("nodes"), node_listen)
            admin_listen = listen.string("admin", DEFAULT_ADMIN_LISTEN, nonempty=True)
            if admin_listen.startswith("tcp:"):
                admin_interface = check_tcp_endpoint(
                    self.issues, listen.path_of("admin"), admin_listen
                )
            else:
                admin_interface = endpoint_interface(admin_listen)
            listen.finish()
        admin = self._admin(top, admin_interface)

        # Read first: the mode decides what the rest of the file must hold.
        self.security = self._security(top)
        transport = top.section("node_transport") or Section(self.issues, "node_transport", {})
        plaintext, tls = self._transport_security(transport, interface)
        if self.security.managed:
            self._managed_transport(transport, plaintext, tls)
        heartbeat = self._heartbeat(transport)
        max_frame = transport.integer(
            "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1, maximum=MAX_FRAME_BYTES_LIMIT
        )
        register_timeout = transport.number(
            "register_timeout_sec", DEFAULT_REGISTER_TIMEOUT_SEC, positive=True
        )
        transport.finish()

        profiles = self._profiles(top)
        credentials = self._credentials(top)
        nodes = self._nodes(top)
        models = self._models(top)
        routes, client_api = self._client_api(top, nodes, models)
        logging = logging_section(top)
        cluster = cluster_section(
            top,
            edge_id=edge_id,
            base_dir=self.base_dir,
            environ=self.environ,
            heartbeat_timeout_sec=heartbeat.timeout_sec,
        )
        top.finish()

        if self.issues:
            return None
        return EdgeConfig(
            id=edge_id,
            node_listen=node_listen,
            admin_listen=admin_listen,
            tls=tls,
            plaintext_nodes=plaintext,
            heartbeat=heartbeat,
            max_frame_bytes=max_frame,
            register_timeout_sec=register_timeout,
            nodes=nodes,
            models=models,
            protocol_profiles=profiles,
            model_routes=routes,
            client_api=client_api,
            security=self.security,
            credentials=credentials,
            admin=admin,
            logging=logging,
            cluster=cluster,
            source_path=source_path,
        )

    # -- admin -------------------------------------------------------------------------------

    def _admin(self, top: Section, interface: str | None) -> AdminConfig:
        """
        ``admin.auth`` (``token: ${ENV}`` / ``token_file`` / ``token_sha256``, kept as a
        digest); required when ``listen.admin`` binds anything but loopback.
        """
        before = len(self.issues)
        section = top.section("admin")
        auth: NodeToken | None = None
        given = False
        if section is not None:
            auth_section = section.section("auth")
            if auth_section is not None:
                given = True
                auth = edge_node_token(auth_section, base_dir=self.base_dir, environ=self.environ)
                auth_section.finish()
            section.finish()
        exposed = interface is not None and not is_loopback_host(interface)
        if exposed and not given and len(self.issues) == before:
            shown = f"interface {interface}" if interface else "all interfaces"
            self.issues.add(
                "listen.admin",
                f"binds {shown}, not loopback: set admin.auth (token: ${{ENV_VAR}}, token_file "
                "or token_sha256) so that every admin request needs a bearer token, or bind "
                "the admin listener to 127.0.0.1",
            )
        return AdminConfig(auth=auth)

    # -- security ----------------------------------------------------------------------------

    def _security(self, top: Section) -> EdgeSecurity:
        before = len(self.issues)
        section = top.section("security")
        if section is None:
            self.mode_known = len(self.issues) == before
            return EdgeSecurity()
        mode = section.choice("mode", SECURITY_MODES, "legacy")
        if mode not in SECURITY_MODES or len(self.issues) > before:
            self.mode_known = False
        before = len(self.issues)
        trust_domain = section.string("trust_domain", DEFAULT_TRUST_DOMAIN)
        problem = dns_name_problem(trust_domain) if len(self.issues) == before else None
        if problem is not None:
            self.issues.add(section.path_of("trust_domain"), problem)
        self.trust_domain_ok = len(self.issues) == before
        managed = mode == "managed"
        lease = section.section("lease")
        signing_key_file: str | None = None
        ttl = DEFAULT_LEASE_TTL_SEC
        if lease is not None:
            signing_key_file = optional_file(lease, "signing_key_file", self.base_dir)
            ttl = lease.number("ttl_sec", DEFAULT_LEASE_TTL_SEC, positive=True)
            if ttl > MAX_LEASE_TTL_SEC:
                self.issues.add(lease.path_of("ttl_sec"), f"must be <= {MAX_LEASE_TTL_SEC:g}")
                ttl = DEFAULT_LEASE_TTL_SEC
            lease.finish()
        given = lease is not None and lease.has("signing_key_file")
        if managed and signing_key_file is None and not given:
            self.issues.add(
                "security.lease.signing_key_file",
                f"is required with {_MANAGED}: the Edge signs every credential lease with "
                "this private key (create it with `iop keys issuer`)",
            )
        section.finish()
        return EdgeSecurity(
            mode=mode,
            trust_domain=trust_domain,
            signing_key_file=signing_key_file,
            lease_ttl_sec=ttl,
        )

    def _managed_transport(
        self, transport: Section, plaintext: bool, tls: ServerTLS | None
    ) -> None:
        """Managed mode: nodes connect over TLS and prove their workload with a certificate."""
        if plaintext:
            self.issues.add(
                transport.path_of("plaintext"),
                f"plaintext node connections are refused with {_MANAGED}: nodes prove their "
                "identity with a TLS client certificate (set node_transport.tls with "
                "client_ca_file)",
            )
        elif tls is not None and tls.client_ca_file is None:
            self.issues.add(
                "node_transport.tls.client_ca_file",
                f"is required with {_MANAGED}: the CA that issues node client certificates "
                "(mTLS; `iop pki init`, `iop pki issue-node NODE_ID`)",
            )

    # -- credentials -------------------------------------------------------------------------

    def _credentials(self, top: Section) -> tuple[CredentialSlot, ...]:
        items = top.items("credentials")
        if items is None and top.has("credentials"):
            self.credentials_complete = False
        if items and self.mode_known and not self.security.managed:
            # Refused rather than ignored: secrets loaded for nothing, and a config that looks
            # protected while every adapter still sends its own headers.
            self.issues.add(
                "credentials",
                f"credentials need {_MANAGED}: in legacy mode no lease carries them (remove "
                "the catalog, or switch the Edge and its nodes to managed mode)",
            )
        result: list[CredentialSlot] = []
        seen: dict[str, str] = {}
        for path, item in items or ():
            section = as_section(self.issues, path, item)
            if section is None:
                self.credentials_complete = False
                continue
            name = section.string("name", required=True)
            if not name.strip():
                self.credentials_complete = False
            elif not SLOT_NAME_PATTERN.match(name):
                self.issues.add(
                    section.path_of("name"),
                    "must start with a lowercase letter or digit and hold only lowercase "
                    "letters, digits, '.', '_' and '-'",
                )
            elif name in seen:
                self.issues.add(
                    section.path_of("name"),
                    f"duplicate credential slot {name!r} (also {seen[name]})",
                )
            else:
                seen[name] = path
            if name:
                self.slot_names.add(name)
            secret = credential_secret(section, base_dir=self.base_dir, environ=self.environ)
            revision = section.integer("revision", 1, minimum=1, maximum=2**64 - 1)
            enabled = section.boolean("enabled", True)
            section.finish()
            if secret is not None:
                slot = CredentialSlot(name=name, secret=secret, revision=revision, enabled=enabled)
                self.slots.setdefault(name, slot)
                result.append(slot)
        return tuple(result)

    # -- node_transport ----------------------------------------------------------------------

    def _transport_security(
        self, transport: Section, interface: str | None
    ) -> tuple[bool, ServerTLS | None]:
        plaintext = transport.boolean("plaintext", False)
        tls_present = transport.has("tls")
        tls_section = transport.section("tls")
        if plaintext:
            if tls_present:
                self.issues.add(transport.path_of("tls"), "must not be set when plaintext is true")
            # interface None: listen.nodes is missing or invalid, already reported.
            if interface is not None and not is_loopback_host(interface):
                binds = f"it binds {interface!r}" if interface else "it binds all interfaces"
                self.issues.add(
                    transport.path_of("plaintext"),
                    "plaintext is only allowed when listen.nodes binds a loopback interface "
                    f"(interface=127.0.0.1, ::1 or localhost); {binds}",
                )
            return True, None
        if not tls_present:
            self.issues.add(
                transport.path_of("tls"), "is required unless node_transport.plaintext is true"
            )
            return False, None
        if tls_section is None:
            return False, None
        cert = required_file(tls_section, "cert_file", self.base_dir)
        key = required_file(tls_section, "key_file", self.base_dir)
        client_ca = optional_file(tls_section, "client_ca_file", self.base_dir)
        tls_section.finish()
        return False, ServerTLS(cert_file=cert, key_file=key, client_ca_file=client_ca)

    def _heartbeat(self, transport: Section) -> HeartbeatConfig:
        section = transport.section("heartbeat")
        if section is None:
            return HeartbeatConfig()
        interval = section.number("interval_sec", DEFAULT_HEARTBEAT_INTERVAL_SEC, positive=True)
        timeout = section.number("timeout_sec", DEFAULT_HEARTBEAT_TIMEOUT_SEC, positive=True)
        if timeout <= interval:
            self.issues.add(
                section.path_of("timeout_sec"),
                f"must be greater than interval_sec ({interval:g})",
            )
        section.finish()
        return HeartbeatConfig(interval_sec=interval, timeout_sec=timeout)

    # -- protocol_profiles -------------------------------------------------------------------

    def _profiles(self, top: Section) -> tuple[ProfileConfig, ...]:
        items = top.items("protocol_profiles")
        if items is None and top.has("protocol_profiles"):
            self.profiles_complete = False
        result: list[ProfileConfig] = []
        seen: dict[str, str] = {}
        for path, item in items or ():
            section = as_section(self.issues, path, item)
            if section is None:
                self.profiles_complete = False
                continue
            name = section.string("name", required=True)
            if not name:
                self.profiles_complete = False
            if name:
                if name in seen:
                    self.issues.add(
                        section.path_of("name"),
                        f"duplicate profile name {name!r} (also {seen[name]})",
                    )
                else:
                    seen[name] = path
                self.profile_names.add(name)
            driver = section.choice("driver", PROFILE_DRIVERS, required=True)
            operations: list[tuple[str, str]] = []
            for op_path, op_name, op_value in section.string_map("operations"):
                if not op_value.startswith("/"):
                    self.issues.add(op_path, "must be a request path starting with '/'")
                operations.append((op_name, op_value))
            capabilities = section.string_list("capabilities", unique=True)
            for i, capability in enumerate(capabilities):
                if capability not in PROFILE_CAPABILITIES:
                    shown = ", ".join(sorted(PROFILE_CAPABILITIES))
                    self.issues.add(
                        f"{section.path_of('capabilities')}[{i}]",
                        f"unknown capability {capability!r} (one of: {shown})",
                    )
            extensions: list[tuple[str, bool]] = []
            ext = section.section("extensions")
            if ext is not None:
                for ext_name in PROFILE_EXTENSIONS:
                    extensions.append((ext_name, ext.boolean(ext_name, False)))
                ext.finish()
            auth_header = section.string("auth_header")
            if auth_header and not _HEADER_NAME.match(auth_header):
                self.issues.add(section.path_of("auth_header"), "must be an HTTP header name")
            auth_scheme = self._auth_scheme(section, auth_header)
            section.finish()
            profile = ProfileConfig(
                name=name,
                driver=driver,
                operations=tuple(operations),
                capabilities=capabilities,
                extensions=tuple(extensions),
                auth_header=auth_header,
                auth_scheme=auth_scheme,
            )
            if name and name not in self.profiles:
                self.profiles[name] = (path, profile)
            result.append(profile)
        return tuple(result)

    def _auth_scheme(self, section: Section, auth_header: str) -> str:
        """
        ``auth_scheme``: the scheme before the credential in ``auth_header``. Default
        ``Bearer`` for ``Authorization`` (any case), else none (``x-api-key: <secret>``).
        """
        default = "Bearer" if auth_header.strip().lower() == "authorization" else ""
        if not section.has("auth_scheme"):
            section.raw("auth_scheme")
            return default
        scheme = section.string("auth_scheme")
        path = section.path_of("auth_scheme")
        if not auth_header:
            self.issues.add(path, "needs auth_header: the scheme goes in front of the credential")
        elif scheme and not _AUTH_SCHEME.match(scheme):
            self.issues.add(path, "must be an HTTP auth scheme token, e.g. Bearer")
        return scheme

    # -- nodes -------------------------------------------------------------------------------

    def _nodes(self, top: Section) -> tuple[NodeConfig, ...]:
        items = top.items("nodes", required=True)
        if not items:
            self.providers_complete = False
        if items is not None and not items:
            self.issues.add(top.path_of("nodes"), "must list at least one node")
        result: list[NodeConfig] = []
        ids: dict[str, str] = {}
        tokens: dict[bytes, str] = {}
        for path, item in items or ():
            section = as_section(self.issues, path, item)
            if section is None:
                self.providers_complete = False
                continue
            node_id = section.string("id", required=True)
            check_id(self.issues, section.path_of("id"), node_id)
            if node_id in ids:
                self.issues.add(
                    section.path_of("id"), f"duplicate node id {node_id!r} (also {ids[node_id]})"
                )
            elif node_id:
                ids[node_id] = path
            alias = section.string("alias")
            agent_kind = section.string("agent_kind")
            concurrency = section.integer("concurrency", 0, minimum=0)
            token = edge_node_token(section, base_dir=self.base_dir, environ=self.environ)
            if token is not None:
                if token.sha256 in tokens:
                    self.issues.add(
                        path,
                        f"has the same token as {tokens[token.sha256]}; "
                        "each node needs its own token",
                    )
                else:
                    tokens[token.sha256] = path
            recipient_key_file = optional_file(section, "recipient_key_file", self.base_dir)
            if self.security.managed:
                self._managed_node(section, node_id)
            adapters = self._adapters(section, node_id)
            bindings: dict[str, list[_Binding]] = {}
            providers = self._providers(section, node_id, adapters, bindings)
            self._adapter_credential_headers(adapters, bindings)
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
        return tuple(result)

    def _managed_node(self, section: Section, node_id: str) -> None:
        """A managed node: its recipient key, and an id that fits in its workload DNS-ID."""
        if not section.has("recipient_key_file"):
            self.issues.add(
                section.path_of("recipient_key_file"),
                f"is required with {_MANAGED}: the node's lease recipient public key (create "
                f"the pair with `iop keys recipient {node_id or 'NODE_ID'}` and keep the private "
                "key on the node)",
            )
        if node_id and ID_PATTERN.match(node_id) and self.trust_domain_ok:
            workload = self.security.node_workload(node_id)
            if dns_name_problem(workload) is not None:
                self.issues.add(
                    section.path_of("id"),
                    f"with {_MANAGED} a node id is part of its certificate's DNS name "
                    f"(<id>.node.{self.security.trust_domain}): use lowercase letters, digits, "
                    "'-' and '.', each part starting and ending with a letter or digit",
                )

    def _adapter_credential_headers(
        self, adapters: list[_Adapter], bindings: Mapping[str, list[_Binding]]
    ) -> None:
        """
        Managed mode: no adapter's ``headers`` carry a credential. The header a slot-bound
        provider's lease fills is named with its provider; any other credential header
        (``Authorization``, ``x-api-key``, any profile's ``auth_header``...) is refused too.
        """
        if not self.security.managed:
            return
        credential_headers = set(CREDENTIAL_HEADERS)
        credential_headers.update(
            p.auth_header.strip().lower() for _, p in self.profiles.values() if p.auth_header
        )
        for adapter in adapters:
            bound = {b.header: b for b in bindings.get(adapter.config.name, ())}
            for header, path in adapter.header_paths:
                lowered = header.lower()
                binding = bound.get(lowered)
                if binding is not None:
                    self.issues.add(
                        path,
                        f"provider {binding.provider_id!r} gets this header from credential slot "
                        f"{binding.slot!r}; an adapter's headers must not carry a credential "
                        f"with {_MANAGED}",
                    )
                elif lowered in credential_headers:
                    self.issues.add(
                        path,
                        f"an adapter's headers must not carry a credential with {_MANAGED}: "
                        "put the key in credentials[] and name its slot in the provider's "
                        "`credential` (the node then gets it per request, sealed in a lease)",
                    )

    # -- adapters ----------------------------------------------------------------------------

    def _adapters(self, node: Section, node_id: str) -> list[_Adapter]:
        raw = node.raw("adapters")
        path = node.path_of("adapters")
        if raw is MISSING:
            return []
        result: list[_Adapter] = []
        # Stands for an entry that could not be read at all (see _resolveAdapter).
        unreadable = _Adapter(AdapterConfig(name="", type=""), ok=False)
        if isinstance(raw, Mapping):
            # Legacy single-instance form: {type: settings}; each becomes an instance named
            # after its type.
            legacy = as_section(self.issues, path, raw)
            if legacy is None:
                return [unreadable]
            for adapter_type, value in legacy.data.items():
                entry_path = legacy.path_of(adapter_type)
                if adapter_type not in ADAPTER_TYPES:
                    shown = ", ".join(sorted(ADAPTER_TYPES))
                    self.issues.add(
                        entry_path, f"unknown adapter type {adapter_type!r} (one of: {shown})"
                    )
                    result.append(unreadable)
                    continue
                entry = Section(self.issues, entry_path, {})
                if value is not None:
                    checked = as_section(self.issues, entry_path, value)
                    if checked is None:
                        result.append(unreadable)
                        continue
                    entry = checked
                before = len(self.issues)
                config = self._adapter_fields(
                    entry, adapter_type, adapter_type, rejected=_LEGACY_REJECTED
                )
                result.append(_Adapter(config, len(self.issues) == before, _header_paths(entry)))
            return result

        items = as_list(self.issues, path, raw)
        if items is None:
            return [unreadable]
        names: dict[str, str] = {}
        for item_path, item in items:
            entry_ = as_section(self.issues, item_path, item)
            if entry_ is None:
                result.append(unreadable)
                continue
            before = len(self.issues)
            type_ = entry_.choice("type", ADAPTER_TYPES, required=True)
            name = entry_.string("name", type_, nonempty=True)
            if name in names:
                self.issues.add(
                    entry_.path_of("name") if entry_.has("name") else item_path,
                    f"duplicate adapter instance name {name!r} on node {node_id!r} "
                    f"(also {names[name]}); give each instance a unique name",
                )
            elif name:
                names[name] = item_path
            config = self._adapter_fields(entry_, name, type_)
            result.append(_Adapter(config, len(self.issues) == before, _header_paths(entry_)))
        return result

    def _adapter_fields(
        self,
        section: Section,
        name: str,
        type_: str,
        rejected: Mapping[str, str] | None = None,
    ) -> AdapterConfig:
        enabled = section.boolean("enabled", True)
        base_url = section.string("base_url")
        if base_url:
            parts = urlsplit(base_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                hint = (
                    " (${...} references are only resolved in headers, env and tokens)"
                    if "${" in base_url
                    else ""
                )
                self.issues.add(
                    section.path_of("base_url"), f"must be an http:// or https:// URL{hint}"
                )
        headers: list[tuple[str, str]] = []
        for path, key, value in section.string_map("headers"):
            if not _HEADER_NAME.match(key):
                self.issues.add(path, "is not a valid HTTP header name")
            resolved = resolve_references(self.issues, path, value, self.environ)
            if any(ch in resolved for ch in "\r\n\0"):
                self.issues.add(
                    path, "must not contain a line break or NUL (after ${...} resolution)"
                )
            headers.append((key, resolved))
        env: list[tuple[str, str]] = []
        for path, key, value in section.string_map("env"):
            if "=" in key or "\0" in key:
                self.issues.add(path, "is not a valid environment variable name")
            env.append((key, resolve_references(self.issues, path, value, self.environ)))
        config = AdapterConfig(
            name=name,
            type=type_,
            enabled=enabled,
            base_url=base_url,
            headers=tuple(headers),
            request_timeout_ms=section.integer("request_timeout_ms", 0, minimum=0),
            idle_timeout_ms=section.integer("idle_timeout_ms", 0, minimum=0),
            max_concurrency=section.integer("max_concurrency", 1, minimum=1),
            command=section.string("command"),
            args=section.string_list("args", scalars=True),
            env=tuple(env),
            workspace=section.string("workspace"),
            mode=section.string("mode"),
            resume_args=section.string_list("resume_args", scalars=True),
            output_format=section.choice("output_format", ADAPTER_OUTPUT_FORMATS),
            prompt_placement=section.string("prompt_placement"),
            context_size=section.integer("context_size", 0, minimum=0),
            settings=tuple((key, value) for _, key, value in section.string_map("settings")),
        )
        section.finish(rejected)
        return config

    # -- providers ---------------------------------------------------------------------------

    def _providers(
        self,
        node: Section,
        node_id: str,
        adapters: list[_Adapter],
        bindings: dict[str, list[_Binding]],
    ) -> tuple[ProviderConfig, ...]:
        result: list[ProviderConfig] = []
        items = node.items("providers")
        if items is None and node.has("providers"):
            self.providers_complete = False
        for path, item in items or ():
            section = as_section(self.issues, path, item)
            if section is None:
                self.providers_complete = False
                continue
            provider = self._provider(section, node_id, adapters)
            if provider is not None:
                result.append(provider)
                if provider.credential and provider.enabled and provider.adapter_instance:
                    found = self.profiles.get(provider.profile)
                    if found is not None and found[1].auth_header:
                        bindings.setdefault(provider.adapter_instance, []).append(
                            _Binding(
                                provider.id,
                                provider.credential,
                                found[1].auth_header.strip().lower(),
                            )
                        )
        return tuple(result)

    def _provider(
        self, section: Section, node_id: str, adapters: list[_Adapter]
    ) -> ProviderConfig | None:
        provider_id = section.string("id", required=True)
        if not provider_id.strip():
            self.providers_complete = False
        if provider_id in self.providers:
            self.issues.add(
                section.path_of("id"),
                f"duplicate provider id {provider_id!r} (also "
                f"{self.providers[provider_id].path}); provider ids are unique across the "
                "whole config",
            )
        adapter_ref = section.string("adapter", required=True)
        category = section.choice("category", PROVIDER_CATEGORIES, required=True)
        explicit_type = section.choice("type", ADAPTER_TYPES)
        models_before = len(self.issues)
        models = section.string_list("models", unique=True)
        if section.has("models"):
            if not models and len(self.issues) == models_before:
                self.issues.add(section.path_of("models"), "must list at least one model")
        else:
            section.require("models")
        for i, model in enumerate(models):
            if not model.strip():
                self.issues.add(f"{section.path_of('models')}[{i}]", "must not be empty")
        models_ok = len(self.issues) == models_before
        enabled = section.boolean("enabled", True)
        priority = section.integer("priority", 0, minimum=0)
        capacity = section.integer("capacity", 1, minimum=1)
        long_threshold = section.integer("long_context_threshold", 0, minimum=0)
        long_capacity = section.integer("long_capacity", 0, minimum=0)
        if long_capacity > capacity:
            self.issues.add(section.path_of("long_capacity"), f"must be <= capacity ({capacity})")
        max_queue = section.integer("max_queue", 0, minimum=0)
        queue_timeout = section.number("queue_timeout_sec", 0.0, minimum=0)
        profile = section.string("profile")
        if profile and profile not in self.profile_names and self.profiles_complete:
            defined = ", ".join(sorted(self.profile_names)) or "none"
            self.issues.add(
                section.path_of("profile"),
                f"unknown protocol profile {profile!r} (protocol_profiles defines: {defined})",
            )
        usage_attribution = section.string("usage_attribution")
        credential = section.string("credential", nonempty=True)
        section.finish()

        if provider_id and provider_id not in self.providers:
            self.providers[provider_id] = _ProviderInfo(section.path, models if models_ok else None)

        instance = ""
        type_ = explicit_type
        if adapter_ref and enabled:
            resolved = self._resolve_adapter(section, node_id, adapter_ref, adapters)
            if resolved is not None:
                instance = resolved.name
                if explicit_type in ADAPTER_TYPES and explicit_type != resolved.type:
                    self.issues.add(
                        section.path_of("type"),
                        f"is {explicit_type!r} but adapter {resolved.name!r} is of type "
                        f"{resolved.type!r}",
                    )
                type_ = resolved.type
                if category == "cli" and resolved.type != "cli":
                    self.issues.add(
                        section.path_of("category"),
                        f"category cli needs an enabled cli adapter, but {resolved.name!r} "
                        f"is of type {resolved.type!r}",
                    )
        elif adapter_ref and not explicit_type:
            # Disabled: the reference is not checked, but a type is inferred when possible.
            type_ = _infer_type(adapter_ref, adapters)
        if not enabled and category == "cli" and explicit_type and explicit_type != "cli":
            self.issues.add(
                section.path_of("category"),
                f"category cli needs a cli adapter, but type is {explicit_type!r}",
            )
        if credential.strip():
            self._provider_credential(section, credential, profile, type_)

        return ProviderConfig(
            id=provider_id,
            adapter=adapter_ref,
            category=category,
            adapter_instance=instance,
            type=type_,
            models=models,
            enabled=enabled,
            priority=priority,
            capacity=capacity,
            long_context_threshold=long_threshold,
            long_capacity=long_capacity,
            max_queue=max_queue,
            queue_timeout_sec=queue_timeout,
            profile=profile,
            usage_attribution=usage_attribution,
            credential=credential,
        )

    def _provider_credential(self, section: Section, slot: str, profile: str, type_: str) -> None:
        """``providers[].credential``: a known slot, in managed mode, carried by a profile."""
        path = section.path_of("credential")
        if self.mode_known and not self.security.managed:
            self.issues.add(
                path,
                f"credentials need {_MANAGED}: only a managed Edge sends a provider its "
                "credential (sealed in a lease)",
            )
        if slot not in self.slot_names and self.credentials_complete:
            defined = ", ".join(sorted(self.slot_names)) or "none"
            self.issues.add(
                path, f"unknown credential slot {slot!r} (credentials defines: {defined})"
            )
        if type_ and type_ not in CREDENTIAL_ADAPTER_TYPES:
            self.issues.add(
                path,
                f"{type_} providers serve normalized runs, which carry no credential; only "
                f"{' and '.join(sorted(CREDENTIAL_ADAPTER_TYPES))} providers (raw tunnels) do",
            )
        if not profile:
            self.issues.add(
                path,
                "needs the provider's `profile`: the protocol profile's auth_header names the "
                "header that carries the credential",
            )
            return
        found = self.profiles.get(profile)
        if found is None:
            return
        profile_path, profile_config = found
        if not profile_config.auth_header:
            self.issues.add(
                path,
                f"profile {profile!r} ({profile_path}) has no auth_header to carry the credential",
            )
            return
        scheme = profile_config.auth_scheme
        bound = self.slots.get(slot)
        if scheme and bound is not None:
            # A key pasted with its scheme would be sent as "Bearer Bearer <key>". Says only
            # that the secret starts with the scheme, never any of the key itself.
            if bound.secret.reveal()[: len(scheme) + 1].lower() == f"{scheme.lower()} ":
                self.issues.add(
                    path,
                    f"the secret of credential slot {slot!r} starts with {scheme!r}: give the "
                    f"bare key, profile {profile!r} adds the scheme itself",
                )

    def _resolve_adapter(
        self, section: Section, node_id: str, ref: str, adapters: list[_Adapter]
    ) -> AdapterConfig | None:
        """
        The adapter instance ``ref`` names: an exact instance name first, else a legacy type
        name with exactly one enabled instance of that type. ``None`` after an issue, or if
        the named instance had issues of its own.
        """
        path = section.path_of("adapter")
        exact = [a for a in adapters if a.config.name == ref]
        if exact:
            adapter = exact[0]
            if not adapter.ok:
                return None
            if not adapter.config.enabled:
                self.issues.add(
                    path,
                    f"no enabled adapter instance {ref!r} on node {node_id!r}: it is disabled",
                )
                return None
            return adapter.config
        of_type = [a for a in adapters if a.config.type == ref and a.config.enabled]
        if len(of_type) == 1:
            return None if not of_type[0].ok else of_type[0].config
        if len(of_type) > 1:
            names = ", ".join(a.config.name for a in of_type)
            self.issues.add(
                path,
                f"ambiguous: {len(of_type)} enabled instances of type {ref!r}; "
                f"name one of: {names}",
            )
            return None
        if any(not a.ok for a in adapters):
            # An entry with issues of its own may be the one meant; don't pile on.
            return None
        if ref in ADAPTER_TYPES:
            self.issues.add(
                path, f"no enabled adapter instance of type {ref!r} on node {node_id!r}"
            )
        else:
            names = ", ".join(a.config.name for a in adapters) or "none"
            self.issues.add(
                path,
                f"no enabled adapter instance {ref!r} on node {node_id!r} "
                f"(configured instances: {names})",
            )
        return None

    # -- models ------------------------------------------------------------------------------

    def _models(self, top: Section) -> tuple[ModelConfig, ...]:
        result: list[ModelConfig] = []
        ids: dict[str, str] = {}
        for path, item in top.items("models") or ():
            section = as_section(self.issues, path, item)
            if section is None:
                continue
            model_id = section.string("id", required=True)
            if model_id in ids:
                self.issues.add(
                    section.path_of("id"), f"duplicate model id {model_id!r} (also {ids[model_id]})"
                )
            elif model_id:
                ids[model_id] = path
            display_name = section.string("display_name")
            refs = self._model_providers(section, model_id)
            default_max = section.optional_integer("default_max_tokens", minimum=1)
            min_max = section.optional_integer("min_max_tokens", minimum=1)
            if default_max is not None and min_max is not None and min_max > default_max:
                self.issues.add(
                    section.path_of("min_max_tokens"),
                    f"must be <= default_max_tokens ({default_max})",
                )
            thinking = section.optional_integer("default_thinking_token_budget", minimum=0)
            counter = section.string("token_counter")
            if counter and counter not in TOKEN_COUNTERS:
                self.issues.add(
                    section.path_of("token_counter"),
                    f"unknown token counter {counter!r} (one of: {_names(TOKEN_COUNTERS)})",
                )
            section.finish()
            result.append(
                ModelConfig(
                    id=model_id,
                    providers=refs,
                    display_name=display_name,
                    default_max_tokens=default_max,
                    min_max_tokens=min_max,
                    default_thinking_token_budget=thinking,
                    token_counter=counter,
                )
            )
        return tuple(result)

    def _client_api(
        self, top: Section, nodes: tuple[NodeConfig, ...], models: tuple[ModelConfig, ...]
    ) -> tuple[tuple[ModelRoute, ...], ClientAPIConfig]:
        openai = top.section("openai")
        if openai is None:
            return (), ClientAPIConfig()
        listen = openai.string("listen") or None
        interface: str | None = None
        if listen is not None:
            interface = check_tcp_endpoint(self.issues, openai.path_of("listen"), listen)
        max_body = openai.integer(
            "max_body_bytes", DEFAULT_MAX_BODY_BYTES, minimum=1024, maximum=MAX_FRAME_BYTES_LIMIT
        )
        limits = self._client_limits(openai, listen)
        routes = self._model_routes(openai, nodes, models)
        known = {m.id for m in models} | {r.model for r in routes}
        auth = True
        keys: list[ClientKey] = []
        auth_section = openai.section("auth")
        if auth_section is not None:
            auth = auth_section.boolean("enabled", True)
            names: set[str] = set()
            for path, item in auth_section.items("keys") or ():
                key_section = as_section(self.issues, path, item)
                if key_section is None:
                    continue
                name = key_section.string("name", required=True, nonempty=True)
                if name in names:
                    self.issues.add(key_section.path_of("name"), f"duplicate key name {name!r}")
                names.add(name)
                digest = edge_node_token(
                    key_section, base_dir=self.base_dir, environ=self.environ, name="key"
                )
                allowed = tuple(key_section.string_list("models"))
                for i, model in enumerate(allowed):
                    if model not in known:
                        self.issues.add(
                            f"{key_section.path_of('models')}[{i}]", f"unknown model {model!r}"
                        )
                key_section.finish()
                if digest is not None:
                    keys.append(ClientKey(name=name, digest=digest, models=allowed))
            auth_section.finish()
        if listen is not None:
            if not auth and not (interface is not None and is_loopback_host(interface)):
                self.issues.add(
                    "openai.auth.enabled",
                    "auth may only be turned off when openai.listen binds a loopback interface",
                )
            if auth and not keys and not self.issues:
                self.issues.add("openai.auth.keys", "auth is on: configure at least one key")
        cors = self._cors(openai, auth)
        openai.finish()
        return routes, ClientAPIConfig(
            listen=listen,
            auth=auth,
            keys=tuple(keys),
            max_body_bytes=max_body,
            cors=cors,
            **limits,
        )

    def _cors(self, openai: Section, auth: bool) -> CorsConfig | None:
        """``openai.cors``: origins exactly as a browser sends them, or ``*`` alone with auth."""
        section = openai.section("cors")
        if section is None:
            return None
        path = section.path_of("allow_origins")
        given = section.has("allow_origins")
        origins = section.string_list("allow_origins", unique=True)
        max_age = section.integer("max_age_sec", DEFAULT_CORS_MAX_AGE_SEC, minimum=0, maximum=86400)
        section.finish()
        if not given:
            self.issues.add(path, "list the origins allowed (or remove openai.cors)")
        elif not origins and isinstance(section.data.get("allow_origins"), list):
            self.issues.add(path, "is empty: list at least one origin (or remove openai.cors)")
        for i, origin in enumerate(origins):
            problem = origin_problem(origin)
            if origin == "*":
                if len(origins) > 1:
                    problem = "'*' allows every origin: give it alone"
                elif not auth:
                    problem = "'*' needs openai.auth on: without keys any page could use the API"
            if problem is not None:
                self.issues.add(f"{path}[{i}]", problem)
        return CorsConfig(allow_origins=origins, max_age_sec=max_age)

    def _client_limits(self, openai: Section, listen: str | None) -> dict[str, Any]:
        """The client listener's deadlines, connection caps, listen backlog and port sharing."""
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
        total = openai.integer(
            "max_connections", DEFAULT_MAX_CONNECTIONS, minimum=1, maximum=1_000_000
        )
        # Not given: a quarter of the served cap, once the Edge knows what it can afford.
        per_peer = (
            openai.integer("max_connections_per_peer", 1, minimum=1, maximum=1_000_000)
            if openai.has("max_connections_per_peer")
            else None
        )
        if per_peer is not None and per_peer > total:
            self.issues.add(
                openai.path_of("max_connections_per_peer"),
                f"must be <= max_connections ({total})",
            )
        backlog_given = openai.has("listen_backlog")
        backlog = openai.integer("listen_backlog", DEFAULT_LISTEN_BACKLOG, minimum=1, maximum=65535)
        if backlog_given and listen is not None and re.search(r"(?:^|:)backlog=", listen):
            self.issues.add(
                openai.path_of("listen_backlog"),
                "openai.listen already sets backlog=: give the backlog in one place",
            )
        reuse_port = openai.boolean("reuse_port", False)
        if reuse_port and listen is None:
            self.issues.add(
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
        self, openai: Section, nodes: tuple[NodeConfig, ...], models: tuple[ModelConfig, ...]
    ) -> tuple[ModelRoute, ...]:
        routes: list[ModelRoute] = []
        seen: dict[str, str] = {}
        model_ids = {m.id for m in models}
        by_id = {n.id: n for n in nodes}
        for path, item in openai.items("model_routes") or ():
            section = as_section(self.issues, path, item)
            if section is None:
                continue
            model = section.string("model", required=True, nonempty=True)
            adapter = section.string("adapter", required=True, nonempty=True)
            target = section.string("target", required=True, nonempty=True)
            node_id = section.string("node") or None
            section.finish()
            if model in seen:
                self.issues.add(
                    section.path_of("model"), f"duplicate route for {model!r} (also {seen[model]})"
                )
            elif model:
                seen[model] = path
            if model and model in model_ids:
                self.issues.add(
                    section.path_of("model"),
                    f"{model!r} is also a models[] id; a model id routes one way only",
                )
            candidates = [by_id[node_id]] if node_id in by_id else []
            if node_id is not None and node_id not in by_id:
                self.issues.add(section.path_of("node"), f"unknown node {node_id!r}")
            elif node_id is None:
                candidates = list(nodes)
            if (
                adapter
                and candidates
                and not any(_route_adapter_exists(n, adapter) for n in candidates)
            ):
                where = f"node {node_id!r}" if node_id else "any node"
                self.issues.add(
                    section.path_of("adapter"), f"no enabled adapter {adapter!r} on {where}"
                )
            routes.append(ModelRoute(model=model, adapter=adapter, target=target, node_id=node_id))
        return tuple(routes)

    def _model_providers(self, model: Section, model_id: str) -> tuple[ModelProviderRef, ...]:
        items = model.items("providers", required=True)
        if items is not None and not items:
            self.issues.add(model.path_of("providers"), "must list at least one provider")
        refs: list[ModelProviderRef] = []
        seen: set[str] = set()
        for path, item in items or ():
            provider_id = ""
            explicit_target: str | None = None
            id_path = path
            if isinstance(item, str):
                provider_id = item
            elif isinstance(item, Mapping):
                entry = as_section(self.issues, path, item)
                if entry is None:
                    continue
                provider_id = entry.string("id", required=True)
                id_path = entry.path_of("id")
                if entry.has("target"):
                    explicit_target = entry.string("target", required=True)
                else:
                    entry.raw("target")
                entry.finish()
            else:
                self.issues.add(
                    path,
                    "must be a provider id or a mapping {id: ..., target: ...}, "
                    f"got {type_name(item)}",
                )
                continue
            if not provider_id:
                if isinstance(item, str):
                    self.issues.add(path, "must not be empty")
                continue
            if provider_id in seen:
                self.issues.add(id_path, f"duplicate provider {provider_id!r} in this model")
                continue
            seen.add(provider_id)
            info = self.providers.get(provider_id)
            if info is None:
                if not self.providers_complete:
                    continue
                self.issues.add(
                    id_path, f"unknown provider {provider_id!r} (not in any nodes[].providers)"
                )
                continue
            target = self._served_target(
                path if explicit_target is None else f"{path}.target",
                model_id,
                provider_id,
                explicit_target,
                info,
            )
            if target is not None:
                refs.append(ModelProviderRef(provider_id=provider_id, target=target))
        return tuple(refs)

    def _served_target(
        self,
        path: str,
        model_id: str,
        provider_id: str,
        explicit: str | None,
        info: _ProviderInfo,
    ) -> str | None:
        if info.models is None or (explicit is None and not model_id):
            return None
        served = ", ".join(info.models)
        if explicit is not None:
            if explicit and explicit not in info.models:
                self.issues.add(
                    path,
                    f"{explicit!r} is not one of provider {provider_id!r} models ({served})",
                )
                return None
            return explicit or None
        if model_id in info.models:
            return model_id
        if len(info.models) == 1:
            return info.models[0]
        self.issues.add(
            path,
            f"provider {provider_id!r} serves several models ({served}) and none is "
            f"{model_id!r}; give an explicit target: {{id: {provider_id}, target: ...}}",
        )
        return None


def _names(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def _header_paths(adapter: Section) -> tuple[tuple[str, str], ...]:
    """``(header name, path)`` of each entry of an adapter's ``headers`` (already read)."""
    headers = adapter.data.get("headers")
    if not isinstance(headers, Mapping):
        return ()
    return tuple(
        (name, key_path(adapter.path_of("headers"), name))
        for name in headers
        if isinstance(name, str)
    )


def _route_adapter_exists(node: NodeConfig, ref: str) -> bool:
    """A route's adapter: an enabled instance name, or a type with one enabled instance."""
    enabled = [a for a in node.adapters if a.enabled]
    if any(a.name == ref for a in enabled):
        return True
    return len([a for a in enabled if a.type == ref]) == 1


def _infer_type(ref: str, adapters: list[_Adapter]) -> str:
    """Best-effort type of a disabled provider's adapter reference; ``""`` if unknown."""
    for adapter in adapters:
        if adapter.config.name == ref:
            return adapter.config.type if adapter.config.type in ADAPTER_TYPES else ""
    return ref if ref in ADAPTER_TYPES else ""


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
