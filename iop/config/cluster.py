# -*- test-case-name: iop.test.config.test_cluster_section -*-
"""
The ``cluster:`` section of edge.yaml: several Edges sharing one provider lease table on Redis.

Absent, the Edge is alone and keeps everything in process. Present::

    cluster:
      redis: redis://10.0.0.5:6379/0      # or unix:///run/redis/redis.sock?db=0
      password: ${IOP_REDIS_PASSWORD}     # or password_file: redis.pass (optional)
      edge_id: edge-1                     # defaults to edge.id
      lease_ttl_sec: 10
      key_prefix: iop

``redis`` names a TCP address (``redis://[username@]host[:port][/db]``, port 6379 and db 0 by
default) or a unix socket (``unix:///absolute/path[?db=N]``, or ``unix:relative/path`` resolved
against this file's directory). A password is never part of the
address (tracked config holds no credential): it comes from ``password: ${ENV_VAR}`` or
``password_file``, and no issue raised here shows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_CLUSTER_KEY_PREFIX,
    DEFAULT_CLUSTER_LEASE_TTL_SEC,
    DEFAULT_REDIS_PORT,
    MAX_LEASE_TTL_SEC,
    ClusterConfig,
    RedisAddress,
    Secret,
)
from iop.config.secrets import absolute_path, read_token_file, resolve_token_reference

__all__ = [
    "MIN_CLUSTER_LEASE_TTL_SEC",
    "cluster_section",
    "min_lease_ttl",
    "parse_redis_address",
    "redis_address",
    "relative_socket",
]

# A lease is renewed well inside its TTL; below a second a busy Edge could miss a renewal.
MIN_CLUSTER_LEASE_TTL_SEC = 1.0
# What a node takes, beyond its heartbeat timeout, to cancel the work of an Edge it stopped
# hearing from (close the upstream connection): generous for a loaded host.
NODE_CANCEL_SLACK_SEC = 0.5
# Keys are ``{prefix}:...`` (a Redis Cluster hash tag): no braces, no blanks.
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._:-]+\Z")
_ID = re.compile(r"[A-Za-z0-9._-]+\Z")
_PASSWORD_HINT = "use cluster.password: ${ENV_VAR} or cluster.password_file"
_FORMS = "redis://host:port/db or unix:///path?db=N"


def parse_redis_address(text: str) -> RedisAddress | str:
    """
    ``cluster.redis`` parsed, or the problem with it (a message that never repeats a password
    the value may hold).
    """
    value = text.strip()
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return f"is not a valid address: expected {_FORMS}"
    scheme = parts.scheme.lower()
    if scheme == "rediss":
        return "TLS to Redis (rediss://) is not supported yet: use redis:// or a unix socket"
    if scheme not in ("redis", "unix"):
        return f"must start with redis:// or unix:// ({_FORMS})"
    if parts.password is not None:
        return f"must not hold a password; {_PASSWORD_HINT}"
    if parts.fragment:
        return "must not have a #fragment"
    username = unquote(parts.username) if parts.username else None
    db = 0
    if scheme == "unix":
        if parts.netloc:
            return "a unix socket address is unix:///absolute/path (three slashes)"
        path = unquote(parts.path)
        if not path.startswith("/") or path == "/":
            return "must name the socket's absolute path: unix:///path/to/redis.sock"
        query = parse_qsl(parts.query, keep_blank_values=True)
        for key, given in query:
            if key != "db":
                return f"unknown parameter {key!r} (only db=N)"
            number = _db_number(given)
            if number is None:
                return "db must be a whole number >= 0"
            db = number
        return RedisAddress(path=path, db=db, username=username)
    if parts.query:
        return "a redis:// address takes no ?parameters: write the db as its path (/0)"
    host = parts.hostname or ""
    if not host:
        return f"must name a host: {_FORMS}"
    if port is None:
        port = DEFAULT_REDIS_PORT
    elif port == 0:
        return "port must be 1-65535"
    path = parts.path.strip("/")
    if path:
        number = _db_number(path)
        if number is None:
            return "the path must be the db number (redis://host:6379/0)"
        db = number
    return RedisAddress(host=host, port=port, db=db, username=username)


def relative_socket(text: str, base_dir: str) -> str:
    """
    ``unix:relative/path.sock[?db=N]`` (no slashes after ``unix:``) as the ``unix:///`` address
    of that socket, resolved against the config file's directory like every other path in it;
    anything else unchanged.
    """
    value = text.strip()
    if not value.lower().startswith("unix:") or value[5:].startswith("/") or not value[5:]:
        return text
    path, mark, query = value[5:].partition("?")
    return f"unix://{absolute_path(base_dir, path)}{mark}{query}"


def redis_address(config: ClusterConfig) -> RedisAddress:
    """A loaded config's ``cluster.redis`` parsed (it was validated when loaded)."""
    address = parse_redis_address(config.redis)
    if isinstance(address, str):
        raise ValueError(f"cluster.redis {address}")
    return address


def _db_number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def min_lease_ttl(heartbeat_timeout_sec: float) -> float:
    """
    The shortest ``cluster.lease_ttl_sec`` that keeps a provider's capacity exact when an Edge
    stops (frozen, hung, cut off) while its requests run: such an Edge's work goes on at the
    node until the node's heartbeat times out and cancels it (``heartbeat_timeout_sec`` plus
    :data:`NODE_CANCEL_SLACK_SEC`), while its leases — last renewed up to a third of the TTL
    before it stopped — expire two thirds of a TTL after that at the earliest, and only then can
    another Edge be granted the slot. So two thirds of the TTL must cover the node's part.
    """
    return (
        MIN_CLUSTER_LEASE_TTL_SEC
        if heartbeat_timeout_sec <= 0
        else max(MIN_CLUSTER_LEASE_TTL_SEC, 1.5 * (heartbeat_timeout_sec + NODE_CANCEL_SLACK_SEC))
    )


def cluster_section(
    top: Section,
    *,
    edge_id: str,
    base_dir: str,
    environ: Mapping[str, str],
    heartbeat_timeout_sec: float = 0.0,
) -> ClusterConfig | None:
    """
    ``top.cluster`` as a :class:`ClusterConfig`; ``None`` when absent (or unreadable). The
    lease TTL must be at least :func:`min_lease_ttl` of the nodes' heartbeat timeout
    (``node_transport.heartbeat.timeout_sec``).
    """
    section = top.section("cluster")
    if section is None:
        return None
    issues = section.issues
    before = len(issues)
    redis = relative_socket(section.string("redis", required=True), base_dir)
    if redis.strip():
        problem = parse_redis_address(redis)
        if isinstance(problem, str):
            issues.add(section.path_of("redis"), problem)
    own_id = section.string("edge_id", edge_id, nonempty=True)
    if section.has("edge_id") and own_id.strip() and not _ID.match(own_id):
        issues.add(section.path_of("edge_id"), "may only contain letters, digits, '.', '_', '-'")
    ttl = section.number("lease_ttl_sec", DEFAULT_CLUSTER_LEASE_TTL_SEC, positive=True)
    if not MIN_CLUSTER_LEASE_TTL_SEC <= ttl <= MAX_LEASE_TTL_SEC:
        issues.add(
            section.path_of("lease_ttl_sec"),
            f"must be between {MIN_CLUSTER_LEASE_TTL_SEC:g} and {MAX_LEASE_TTL_SEC:g} seconds",
        )
    elif ttl < (floor := min_lease_ttl(heartbeat_timeout_sec)):
        issues.add(
            section.path_of("lease_ttl_sec"),
            f"must be at least {floor:g} seconds with node_transport.heartbeat.timeout_sec "
            f"{heartbeat_timeout_sec:g}: a node cancels the work of an Edge it no longer hears "
            "from only at its heartbeat timeout, and a lease must outlive that by its renewal "
            "period (1.5 x (timeout + 0.5 s)), or a stopped Edge's slot is granted again while "
            "its work still runs",
        )
    prefix = section.string("key_prefix", DEFAULT_CLUSTER_KEY_PREFIX, nonempty=True)
    if prefix.strip() and not _KEY_PREFIX.match(prefix):
        issues.add(
            section.path_of("key_prefix"),
            "may only contain letters, digits, '.', '_', ':', '-' (no braces: the prefix "
            "becomes the keys' hash tag)",
        )
    password = _password(section, base_dir, environ)
    section.finish()
    if len(issues) > before:
        return None
    return ClusterConfig(
        redis=redis.strip(),
        edge_id=own_id,
        password=password,
        lease_ttl_sec=ttl,
        key_prefix=prefix,
    )


def _password(section: Section, base_dir: str, environ: Mapping[str, str]) -> Secret | None:
    """``password: ${ENV}`` or ``password_file`` (at most one); ``None`` when neither."""
    given = [key for key in ("password", "password_file") if section.has(key)]
    section.raw("password")
    section.raw("password_file")
    if not given:
        return None
    if len(given) == 2:
        section.issues.add(section.path, "set only one of password or password_file")
        return None
    key = given[0]
    path = section.path_of(key)
    value = section.raw(key)
    if key == "password":
        text = resolve_token_reference(
            section.issues, path, value, environ, _PASSWORD_HINT, kind="password"
        )
    elif not isinstance(value, str) or not value.strip():
        section.issues.add(path, "must be a file path")
        return None
    else:
        text = read_token_file(section.issues, path, absolute_path(base_dir, value), "password")
    return None if text is None else Secret(text)
