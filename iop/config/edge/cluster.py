# -*- test-case-name: iop.test.config.test_cluster_section -*-
"""
``cluster:`` in edge.yaml: several Edges sharing one provider lease table on Redis.

Absent, the Edge is alone and keeps everything in process. Present::

    cluster:
      redis: redis://10.0.0.5:6379/0      # or unix:///run/redis/redis.sock?db=0
      password: ${IOP_REDIS_PASSWORD}     # or password_file: redis.pass (optional)
      edge_id: edge-1                     # defaults to edge.id
      lease_ttl_sec: 10
      key_prefix: iop

The address forms are :mod:`iop.config.cluster`'s. A password is never part of the address
(tracked config holds no credential): it comes from ``password: ${ENV_VAR}`` or
``password_file``, and no issue raised here shows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from iop.config.cluster import (
    MIN_CLUSTER_LEASE_TTL_SEC,
    PASSWORD_HINT,
    parse_redis_address,
    relative_socket,
)
from iop.config.edge import links
from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_CLUSTER_KEY_PREFIX,
    DEFAULT_CLUSTER_LEASE_TTL_SEC,
    MAX_LEASE_TTL_SEC,
    ClusterConfig,
    Secret,
)
from iop.config.secrets import absolute_path, read_token_file, resolve_token_reference

__all__ = ["cluster_section"]

# Keys are ``{prefix}:...`` (a Redis Cluster hash tag): no braces, no blanks.
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._:-]+\Z")
_ID = re.compile(r"[A-Za-z0-9._-]+\Z")


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
    lease TTL must outlive the nodes' heartbeat timeout (``heartbeat_timeout_sec``:
    :func:`iop.config.edge.links.lease_outlives_nodes`).
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
    else:
        links.lease_outlives_nodes(section, ttl, heartbeat_timeout_sec)
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
            section.issues, path, value, environ, PASSWORD_HINT, kind="password"
        )
    elif not isinstance(value, str) or not value.strip():
        section.issues.add(path, "must be a file path")
        return None
    else:
        text = read_token_file(section.issues, path, absolute_path(base_dir, value), "password")
    return None if text is None else Secret(text)
