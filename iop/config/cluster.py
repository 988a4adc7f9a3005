# -*- test-case-name: iop.test.config.test_cluster_section -*-
"""
The Redis address forms of edge.yaml's ``cluster:`` section, and the shortest lease TTL that
keeps a provider's capacity exact: shared by the section's reader
(:mod:`iop.config.edge.cluster`) and the Edge's cluster service.

``cluster.redis`` names a TCP address (``redis://[username@]host[:port][/db]``, port 6379 and db
0 by default) or a unix socket (``unix:///absolute/path[?db=N]``, or ``unix:relative/path``
resolved against the config file's directory). A password is never part of the address
(tracked config holds no credential): it comes from ``cluster.password: ${ENV_VAR}`` or
``cluster.password_file``, and no message here shows it.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

from iop.config.model import DEFAULT_REDIS_PORT, ClusterConfig, RedisAddress
from iop.config.secrets import absolute_path

__all__ = [
    "MIN_CLUSTER_LEASE_TTL_SEC",
    "PASSWORD_HINT",
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
PASSWORD_HINT = "use cluster.password: ${ENV_VAR} or cluster.password_file"
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
        return f"must not hold a password; {PASSWORD_HINT}"
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
