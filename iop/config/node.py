# -*- test-case-name: iop.test.config.test_node_config -*-
"""
Load and validate node.yaml into a frozen :class:`~iop.config.model.NodeDaemonConfig`.

node.yaml says only how to find and prove the node to its Edge; adapters and providers are
configured on the Edge and arrive in the registration payload. In managed mode
(``security.mode: managed``) the node also needs its client certificate, its lease recipient
private key and the Edge's lease-issuer public key; those files are only checked to exist and
be readable here (the node parses them when it starts).

:func:`node_config_from_flags` builds the same configuration from ``twistd iop-node``'s
one-line join flags (``--join STRING``, or ``--edge HOST:PORT --token-file F --ca-file F``...):
the flags become the node.yaml document they stand for and go through :func:`parse_node_config`,
so defaults and validation are node.yaml's; every issue is reported under the flag that caused
it. A join string (:mod:`iop.config.join`) stands for ``edge:``/``edges:``, the token and
``edge.ca_sha256``, the pin of the Edge's CA, which node.yaml also takes instead of
``ca_file``.

The Edge's workload name defaults to :data:`DEFAULT_JOIN_SERVER_NAME` (``edge.iop.internal``)
whichever way the node is configured. node.yaml used to default it to ``host``; a node whose name
is left to its default accepts a certificate naming the dialled host as well
(``ClientTLS.host_name``), so a node.yaml written for the old default keeps working, while the
flags, a join string and node.yaml now agree on one default.

``drain_timeout_sec`` (default 30, 0 = close at once; ``--drain-timeout`` with the flags) bounds
a stopping node's drain (:mod:`iop.node.drain`): the systemd unit's ``TimeoutStopSec`` must
exceed it.

A node dials one Edge (``edge:``) or several (``edges:``, a list of 1..16 mappings with
``edge:``'s keys, each checked the same way; repeated or comma-separated ``--edge``). Exactly one
of the two; every listed Edge gets the same token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from iop.config.checks import (
    MAX_FRAME_BYTES_LIMIT,
    is_loopback_host,
    optional_file,
    required_file,
)
from iop.config.errors import (
    ROOT,
    ConfigError,
    ConfigIssue,
    Issues,
    Section,
    as_section,
    read_yaml_file,
)
from iop.config.join import DEFAULT_SERVER_NAME, JoinString, check_pin
from iop.config.logs import logging_section
from iop.config.model import (
    DEFAULT_LEASE_CLOCK_SKEW_SEC,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_RECONNECT_INTERVAL_SEC,
    DEFAULT_RECONNECT_MAX_ATTEMPTS,
    DEFAULT_STORE_PATH,
    SECURITY_MODES,
    ClientTLS,
    EdgeAddress,
    NodeDaemonConfig,
    NodeSecurity,
    ReconnectPolicy,
    Secret,
)
from iop.config.secrets import node_daemon_token
from iop.config.telemetry import telemetry_section

DEFAULT_HANDSHAKE_TIMEOUT_SEC = 10.0
# How long a stopping node lets its work in flight finish (drain_timeout_sec, --drain-timeout).
DEFAULT_NODE_DRAIN_TIMEOUT_SEC = 30.0
# The most Edges one node dials (node.yaml edges:, repeated --edge).
MAX_EDGES = 16
# The most a node forgives a lease's expiry for clock drift between it and its Edge.
MAX_LEASE_CLOCK_SKEW_SEC = 60.0
_MANAGED = "security.mode: managed"

_ON_THE_EDGE = (
    "{key} are configured on the Edge (edge.yaml nodes[].{key}) and sent to the node when it "
    "registers; node.yaml only says how to reach the Edge"
)
_EDGE_ONLY_KEYS = {
    "adapters": _ON_THE_EDGE.format(key="adapters"),
    "providers": _ON_THE_EDGE.format(key="providers"),
    "models": "models are configured on the Edge (edge.yaml models[])",
    "token_sha256": "token_sha256 is for edge.yaml; the node needs the token itself "
    "(token: ${ENV_VAR} or token_file)",
}


# The Edge workload name a node checks unless --server-name or edge.server_name says otherwise,
# the same for node.yaml, the flags and a join string: `edge.` and the default trust domain, the
# name the examples give the Edge's certificate (`iop pki issue-edge edge.iop.internal`). That
# certificate names the Edge's workload, not the DNS host or address a node dials. node.yaml once
# defaulted to `host`: so that such configs keep working, a node whose server name is defaulted
# also accepts a certificate naming the host it dials (ClientTLS.host_name).
DEFAULT_JOIN_SERVER_NAME = DEFAULT_SERVER_NAME

# node.yaml path -> the join flag that sets it.
_FLAG_OF_PATH = {
    "edge": "--edge",
    "edge.host": "--edge",
    "edge.port": "--edge",
    "edge.server_name": "--server-name",
    "edge.ca_file": "--ca-file",
    "edge.ca_sha256": "--join",
    "edge.cert_file": "--cert-file",
    "edge.key_file": "--key-file",
    "token_file": "--token-file",
    "store": "--store",
    "store.path": "--store",
}


_EDGES_ITEM = re.compile(r"^edges\[\d+\]")


def _flag_of(path: str) -> str:
    """The join flag that sets node.yaml ``path`` (``edges[1].ca_file`` → ``--ca-file``)."""
    if path == "edges":
        return "--edge"
    return _FLAG_OF_PATH.get(_EDGES_ITEM.sub("edge", path), path)


def split_host_port(value: str) -> tuple[str, str]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 literal) as ``(host, port)``; ValueError if not."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(text)
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(text)
    if not host or not port:
        raise ValueError(text)
    return host, port


# The environment variable a join string's token is handed to node.yaml's `token: ${VAR}` under
# (only in the mapping node_config_from_flags parses with, never in the process's environment).
_JOIN_TOKEN_VAR = "IOP_JOIN_TOKEN"


def node_config_from_flags(
    *,
    edge: str | Sequence[str] | None,
    token_file: str | None,
    ca_file: str | None,
    server_name: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    store: str | None = None,
    join: JoinString | None = None,
    base_dir: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> NodeDaemonConfig:
    """
    The node daemon configuration the one-line join flags describe, everything else defaulted
    as in node.yaml. ``edge`` is one ``HOST:PORT`` or several (a sequence, or comma-separated):
    several become ``edges:``, each with the same TLS flags. ``join`` (a decoded ``--join``
    string) stands for ``--edge``, the token and the CA: its Edges, its token and its CA pin
    (``edge.ca_sha256``); ``--server-name`` still overrides its name. The server name defaults
    to :data:`DEFAULT_JOIN_SERVER_NAME`, as in node.yaml. Relative file names resolve against
    ``base_dir`` (the working directory by default).

    @raise ConfigError: listing every problem found, each under its flag (``--token-file: ...``).
    """
    issues = Issues()
    given = [] if edge is None else [edge] if isinstance(edge, str) else list(edge)
    addresses = [part.strip() for value in given for part in value.split(",")]
    common: dict[str, object] = {}
    name = server_name
    if join is not None:
        if addresses:
            issues.add("--edge", "give either --join (it names the Edge) or --edge, not both")
        for flag, value in (("--token-file", token_file), ("--ca-file", ca_file)):
            if value is not None:
                issues.add(flag, "does not go with --join: the join string carries it")
        addresses = list(join.edges)
        common["ca_sha256"] = join.ca_pin
        if name is None:
            name = join.server_name
    if name is not None:
        common["server_name"] = name
    for key, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        if value is not None and not (join is not None and key == "ca_file"):
            common[key] = value
    sections: list[dict[str, object]] = []
    have_edge = bool(addresses)
    source = "--join" if join is not None else "--edge"
    for address in addresses:
        try:
            host, port_text = split_host_port(address)
        except ValueError:
            have_edge = False
            shown = f" (got {address!r})" if len(addresses) > 1 else ""
            issues.add(
                source,
                "must be HOST:PORT (the Edge's listen.nodes address), e.g. "
                f"edge.example.net:7443{shown}",
            )
            continue
        port = int(port_text) if port_text.isdigit() else port_text
        sections.append({"host": host, "port": port, **common})
    if not addresses:
        issues.add("--edge", "must name at least one HOST:PORT")
    edge_section: object = sections[0] if len(sections) == 1 else dict(common)
    document: dict[str, object] = (
        {"edges": sections} if len(sections) > 1 else {"edge": edge_section}
    )
    if join is not None:
        document["token"] = f"${{{_JOIN_TOKEN_VAR}}}"
        environ = {**environ, _JOIN_TOKEN_VAR: join.token}
    elif token_file is None:
        issues.add("--token-file", "is required with --edge: the file holding this node's token")
    else:
        document["token_file"] = token_file
    if store is not None:
        document["store"] = {"path": store}
    try:
        config = parse_node_config(
            document,
            base_dir=base_dir if base_dir is not None else os.getcwd(),
            environ=environ,
        )
    except ConfigError as e:
        for issue in _as_flag_issues(e.issues, have_edge=have_edge):
            path = issue.path
            if join is not None and path == "--edge":
                path = "--join"
            issues.add(path, issue.message)
        issues.raise_if_any()
        raise  # pragma: no cover - every issue maps to a flag
    issues.raise_if_any()
    return config


def reconnect_attempts(value: str) -> int:
    """
    ``--reconnect``'s value as ``reconnect.max_attempts``: ``forever`` (0: retry until stopped),
    ``off`` (1: one attempt, no retry) or N (N consecutive failed attempts, N >= 1).

    @raise ValueError: anything else, with the message to show.
    """
    text = value.strip().lower()
    if text == "forever":
        return 0
    if text == "off":
        return 1
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(
        "must be forever, off or a number of attempts (at least 1), as node.yaml "
        "reconnect.max_attempts"
    )


def _as_flag_issues(issues: tuple[ConfigIssue, ...], *, have_edge: bool) -> list[ConfigIssue]:
    """node.yaml issues renamed to the flags that set those paths (duplicates dropped)."""
    mapped: list[ConfigIssue] = []
    for issue in issues:
        if issue.path == ROOT and "token_file" in issue.message:
            continue  # no --token-file: already reported under that flag
        if not have_edge and issue.path in ("edge.host", "edge.port"):
            continue  # --edge was unusable: already reported
        flag = _flag_of(issue.path)
        message = issue.message
        if message.startswith("is required unless plaintext is true"):
            message = "is required with --edge"
        renamed = ConfigIssue(flag, message)
        if renamed not in mapped:
            mapped.append(renamed)
    return mapped


def load_node_config(path: str, environ: Mapping[str, str] = os.environ) -> NodeDaemonConfig:
    """
    Read, validate and build the node daemon configuration in the YAML file ``path``.

    @raise ConfigError: listing every problem found.
    """
    source = os.path.abspath(path)
    data = read_yaml_file(path)
    return parse_node_config(
        data, base_dir=os.path.dirname(source), environ=environ, source_path=source
    )


def parse_node_config(
    data: object, *, base_dir: str, environ: Mapping[str, str], source_path: str = ""
) -> NodeDaemonConfig:
    """
    Validate and build the node daemon configuration from loaded YAML ``data``. Relative
    paths resolve against ``base_dir``; ``${VAR}`` references resolve from ``environ``.

    @raise ConfigError: listing every problem found.
    """
    issues = Issues()
    top = as_section(issues, "", data)
    if top is None:
        raise ConfigError(issues, source_path)

    security = _security(top, base_dir)
    edges = _edges(top, base_dir, security.managed)
    first = edges[0] if edges else EdgeAddress("", 0, None)
    token = node_daemon_token(top, base_dir=base_dir, environ=environ)
    reconnect = _reconnect(top)
    store = top.section("store")
    store_path = DEFAULT_STORE_PATH
    if store is not None:
        store_path = store.string("path", DEFAULT_STORE_PATH, nonempty=True)
        store.finish()
    max_frame = top.integer(
        "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1, maximum=MAX_FRAME_BYTES_LIMIT
    )
    handshake_timeout = top.number(
        "handshake_timeout_sec", DEFAULT_HANDSHAKE_TIMEOUT_SEC, positive=True
    )
    drain_timeout = top.number("drain_timeout_sec", DEFAULT_NODE_DRAIN_TIMEOUT_SEC, minimum=0)
    logging = logging_section(top)
    telemetry = telemetry_section(top, base_dir=base_dir, environ=environ)
    top.finish(_EDGE_ONLY_KEYS)

    issues.raise_if_any(source_path)
    return NodeDaemonConfig(
        edge_host=first.host,
        edge_port=first.port,
        token=token if token is not None else Secret(""),
        tls=first.tls,
        plaintext=first.plaintext,
        reconnect=reconnect,
        store_path=store_path,
        max_frame_bytes=max_frame,
        handshake_timeout_sec=handshake_timeout,
        security=security,
        logging=logging,
        telemetry=telemetry,
        source_path=source_path,
        edges=tuple(edges),
        drain_timeout_sec=drain_timeout,
    )


def _security(top: Section, base_dir: str) -> NodeSecurity:
    section = top.section("security")
    if section is None:
        return NodeSecurity()
    mode = section.choice("mode", SECURITY_MODES, "legacy")
    recipient = optional_file(section, "recipient_key_file", base_dir)
    issuer = optional_file(section, "issuer_key_file", base_dir)
    skew = section.number("clock_skew_sec", DEFAULT_LEASE_CLOCK_SKEW_SEC, minimum=0)
    if skew > MAX_LEASE_CLOCK_SKEW_SEC:
        section.issues.add(
            section.path_of("clock_skew_sec"), f"must be <= {MAX_LEASE_CLOCK_SKEW_SEC:g}"
        )
        skew = DEFAULT_LEASE_CLOCK_SKEW_SEC
    if mode == "managed":
        needs = {
            "recipient_key_file": "this node's lease recipient private key (from `iop keys "
            "recipient NODE_ID`; the Edge holds the public half)",
            "issuer_key_file": "the Edge's lease-issuer public key (from `iop keys issuer`): "
            "the node accepts only leases it signed",
        }
        for key, what in needs.items():
            if not section.has(key):
                section.issues.add(section.path_of(key), f"is required with {_MANAGED}: {what}")
    section.finish()
    return NodeSecurity(
        mode=mode, recipient_key_file=recipient, issuer_key_file=issuer, clock_skew_sec=skew
    )


def _edges(top: Section, base_dir: str, managed: bool) -> list[EdgeAddress]:
    """``edge:`` (one Edge) or ``edges:`` (a list of them); exactly one of the two."""
    if not top.has("edges"):
        edge = top.section("edge", required=True)
        return [] if edge is None else [_edge(edge, base_dir, managed)]
    if top.has("edge"):
        top.raw("edge")
        top.issues.add(
            top.path_of("edges"),
            "give either edge: (one Edge) or edges: (a list of Edges), not both",
        )
    items = top.items("edges")
    if items is None:
        return []
    if not items:
        top.issues.add(top.path_of("edges"), "must list at least one Edge")
    elif len(items) > MAX_EDGES:
        top.issues.add(top.path_of("edges"), f"lists {len(items)} Edges; at most {MAX_EDGES}")
    edges: list[EdgeAddress] = []
    seen: dict[tuple[str, int], str] = {}
    for path, item in items:
        section = as_section(top.issues, path, item)
        if section is None:
            continue
        address = _edge(section, base_dir, managed)
        key = (address.host.lower(), address.port)
        if address.host and address.port and key in seen:
            top.issues.add(path, f"dials {address.name} again (already {seen[key]})")
        seen.setdefault(key, path)
        edges.append(address)
    return edges


def _edge(edge: Section, base_dir: str, managed: bool) -> EdgeAddress:
    """One Edge's address and TLS (``edge:`` or an ``edges[]`` entry), issues at its path."""
    host = edge.string("host", required=True).strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal written URL-style
    if "/" in host or any(ch.isspace() for ch in host):
        edge.issues.add(edge.path_of("host"), "must be a host name or IP address, not a URL")
    port = edge.integer("port", 0, minimum=1, maximum=65535, required=True)
    named = edge.has("server_name")
    server_name = edge.string("server_name", DEFAULT_SERVER_NAME, nonempty=True)
    plaintext = edge.boolean("plaintext", False)
    tls_keys = [key for key in ("ca_file", "ca_sha256", "cert_file", "key_file") if edge.has(key)]
    tls: ClientTLS | None = None
    if plaintext and managed:
        edge.issues.add(
            edge.path_of("plaintext"),
            f"plaintext is refused with {_MANAGED}: the node proves its identity with a TLS "
            f"client certificate (set {edge.path_of('ca_file')}, cert_file and key_file)",
        )
    if plaintext:
        for key in tls_keys:
            edge.raw(key)
            edge.issues.add(edge.path_of(key), "must not be set when plaintext is true")
        if host and not is_loopback_host(host):
            edge.issues.add(
                edge.path_of("plaintext"),
                f"plaintext is only allowed when {edge.path_of('host')} is a loopback address "
                "(127.x.x.x, ::1 or localhost)",
            )
    else:
        ca_file = ""
        ca_pin: str | None = None
        if edge.has("ca_sha256"):
            pin_text = edge.string("ca_sha256")
            try:
                ca_pin = check_pin(pin_text)
            except ValueError as e:
                edge.issues.add(edge.path_of("ca_sha256"), str(e))
            if edge.has("ca_file"):
                edge.raw("ca_file")
                edge.issues.add(
                    edge.path_of("ca_file"),
                    "give either ca_file (the CA certificate) or ca_sha256 (its pin), not both",
                )
        elif not edge.has("ca_file"):
            edge.raw("ca_file")
            edge.issues.add(
                edge.path_of("ca_file"),
                "is required unless plaintext is true (or ca_sha256, the pin of the Edge's CA)",
            )
        else:
            ca_file = required_file(edge, "ca_file", base_dir)
        cert_file = optional_file(edge, "cert_file", base_dir)
        key_file = optional_file(edge, "key_file", base_dir)
        if (cert_file is None) != (key_file is None):
            missing = "key_file" if key_file is None else "cert_file"
            edge.issues.add(edge.path_of(missing), "cert_file and key_file must be given together")
        elif managed and cert_file is None and not edge.has("cert_file"):
            for key in ("cert_file", "key_file"):
                edge.issues.add(
                    edge.path_of(key),
                    f"is required with {_MANAGED}: the node's client certificate and key, "
                    "naming its workload <node-id>.node.<trust domain> (`iop pki issue-node "
                    "NODE_ID`)",
                )
        tls = ClientTLS(
            ca_file=ca_file,
            server_name=server_name.strip(),
            cert_file=cert_file,
            key_file=key_file,
            ca_pin=ca_pin,
            host_name=None if named else host,
        )
    edge.finish()
    return EdgeAddress(host, port, tls, plaintext)


def _reconnect(top: Section) -> ReconnectPolicy:
    section = top.section("reconnect")
    if section is None:
        return ReconnectPolicy()
    max_attempts = section.integer("max_attempts", DEFAULT_RECONNECT_MAX_ATTEMPTS, minimum=0)
    # Always positive: unlimited retries need a pause, and a zero interval with a finite
    # limit would only burn the attempts in a busy loop.
    interval = section.number("interval_sec", DEFAULT_RECONNECT_INTERVAL_SEC, positive=True)
    section.finish()
    return ReconnectPolicy(max_attempts=max_attempts, interval_sec=interval)
