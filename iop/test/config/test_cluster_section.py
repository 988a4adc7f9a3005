# -*- test-case-name: iop.test.config.test_cluster_section -*-
"""
Tests for the ``cluster:`` section of edge.yaml (:mod:`iop.config.edge.cluster`; the address
forms are :mod:`iop.config.cluster`'s): the Redis address forms, the password's sources (never
shown), the defaults and each field's path-named errors.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, load_edge_config
from iop.config.cluster import min_lease_ttl, parse_redis_address, redis_address
from iop.config.model import ClusterConfig, RedisAddress, Secret
from iop.test.config.test_edge_config import (
    ENVIRON,
    EXAMPLE_DIR,
    EdgeConfigTestMixin,
    assertIssue,
    base_config,
)

REDIS_PASSWORD = "redis-pass-not-in-errors-7f3a"
CLUSTER_ENVIRON = {**ENVIRON, "REDIS_PASSWORD": REDIS_PASSWORD}


class ClusterSectionTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def with_cluster(self, section: Any, heartbeat: Any = None) -> dict[str, Any]:
        data = base_config()
        data["cluster"] = section
        if heartbeat is not None:
            data.setdefault("node_transport", {})["heartbeat"] = heartbeat
        return data

    def cluster(self, section: Any, heartbeat: Any = None) -> ClusterConfig:
        config = self.parse(self.with_cluster(section, heartbeat), CLUSTER_ENVIRON)
        assert config.cluster is not None
        return config.cluster

    def error(self, section: Any, heartbeat: Any = None) -> ConfigError:
        error: ConfigError = self.assertRaises(
            ConfigError, self.parse, self.with_cluster(section, heartbeat), CLUSTER_ENVIRON
        )
        self.assertNotIn(REDIS_PASSWORD, str(error))
        self.assertNotIn("hunter2", str(error))
        return error

    def test_absent(self) -> None:
        """No section: no cluster (the Edge is alone, as before)."""
        self.assertIsNone(self.parse(base_config()).cluster)

    def test_defaults(self) -> None:
        """Only ``redis``: edge_id is edge.id, TTL 10 s, prefix ``iop``, no password."""
        self.assertEqual(
            self.cluster({"redis": "redis://10.0.0.5:6379/2"}),
            ClusterConfig(redis="redis://10.0.0.5:6379/2", edge_id="edge-1"),
        )

    def test_a_relative_socket_is_resolved_against_the_files_directory(self) -> None:
        cluster = self.cluster({"redis": "unix:var/redis.sock?db=1"})
        expected = os.path.join(os.path.abspath(self.base), "var", "redis.sock")
        self.assertEqual(cluster.redis, f"unix://{expected}?db=1")
        self.assertEqual(redis_address(cluster), RedisAddress(path=expected, db=1))
        self.assertIn("three slashes", str(self.error({"redis": "unix://var/redis.sock"})))

    def test_every_field(self) -> None:
        cluster = self.cluster(
            {
                "redis": "unix:///run/redis/redis.sock?db=3",
                "edge_id": "edge-b",
                "password": "${REDIS_PASSWORD}",
                "lease_ttl_sec": 4,
                "key_prefix": "prod:iop",
            },
            heartbeat={"interval_sec": 0.5, "timeout_sec": 2},
        )
        self.assertEqual(
            cluster,
            ClusterConfig(
                redis="unix:///run/redis/redis.sock?db=3",
                edge_id="edge-b",
                password=Secret(REDIS_PASSWORD),
                lease_ttl_sec=4.0,
                key_prefix="prod:iop",
            ),
        )
        self.assertNotIn(REDIS_PASSWORD, repr(cluster))
        self.assertEqual(redis_address(cluster), RedisAddress(path="/run/redis/redis.sock", db=3))

    def test_password_file(self) -> None:
        self.write("redis.pass", f"{REDIS_PASSWORD}\n")
        cluster = self.cluster({"redis": "redis://cache", "password_file": "redis.pass"})
        self.assertEqual(cluster.password, Secret(REDIS_PASSWORD))

    def test_password_problems(self) -> None:
        """A literal password, both sources, an unset variable, a missing file: path-named."""
        error = self.error({"redis": "redis://cache", "password": "hunter2"})
        assertIssue(self, error, "cluster.password", "literal passwords are not allowed")
        error = self.error(
            {"redis": "redis://cache", "password": "${REDIS_PASSWORD}", "password_file": "x"}
        )
        assertIssue(self, error, "cluster", "only one of password or password_file")
        error = self.error({"redis": "redis://cache", "password": "${NOT_SET}"})
        assertIssue(self, error, "cluster.password", "NOT_SET is not set")
        error = self.error({"redis": "redis://cache", "password_file": "missing.pass"})
        assertIssue(self, error, "cluster.password_file", "does not exist")

    def test_password_in_url(self) -> None:
        """A password in the address is refused without echoing it."""
        for url in ("redis://:hunter2@cache:6379/0", "redis://ops:hunter2@cache/0"):
            error = self.error({"redis": url})
            assertIssue(self, error, "cluster.redis", "must not hold a password")

    def test_bad_addresses(self) -> None:
        rows = [
            ("http://cache:6379", "must start with redis:// or unix://"),
            ("rediss://cache:6379", "not supported yet"),
            ("redis://", "must name a host"),
            ("redis://cache:0", "port must be 1-65535"),
            ("redis://cache:70000", "is not a valid address"),
            ("redis://cache/zero", "must be the db number"),
            ("redis://cache/0?timeout=1", "takes no ?parameters"),
            ("unix://run/redis.sock", "three slashes"),
            ("unix:///", "absolute path"),
            ("unix:///run/redis.sock?db=x", "db must be a whole number"),
            ("unix:///run/redis.sock?timeout=1", "unknown parameter 'timeout'"),
        ]
        for url, fragment in rows:
            assertIssue(self, self.error({"redis": url}), "cluster.redis", fragment)

    def test_required_and_types(self) -> None:
        assertIssue(self, self.error({}), "cluster.redis", "is required")
        assertIssue(self, self.error({"redis": 6379}), "cluster.redis", "must be a string")
        assertIssue(self, self.error("redis://cache"), "cluster", "must be a mapping")

    def test_field_problems(self) -> None:
        rows: list[tuple[dict[str, Any], str, str]] = [
            ({"edge_id": "edge 1"}, "cluster.edge_id", "may only contain"),
            ({"edge_id": ""}, "cluster.edge_id", "must not be empty"),
            ({"lease_ttl_sec": 0}, "cluster.lease_ttl_sec", "must be > 0"),
            ({"lease_ttl_sec": 0.5}, "cluster.lease_ttl_sec", "between 1 and 300"),
            ({"lease_ttl_sec": 301}, "cluster.lease_ttl_sec", "between 1 and 300"),
            ({"lease_ttl_sec": "ten"}, "cluster.lease_ttl_sec", "must be a number"),
            ({"key_prefix": "{iop}"}, "cluster.key_prefix", "no braces"),
            ({"key_prefix": ""}, "cluster.key_prefix", "must not be empty"),
            ({"redis_url": "redis://x"}, "cluster.redis_url", "unknown key"),
        ]
        for extra, path, fragment in rows:
            assertIssue(self, self.error({"redis": "redis://cache", **extra}), path, fragment)

    def test_lease_ttl_covers_the_node_heartbeat(self) -> None:
        """
        The TTL must let a node cancel a stopped Edge's work (at its heartbeat timeout) before
        that Edge's leases can expire: two thirds of it at least the timeout plus 0.5 s.
        """
        self.assertEqual(min_lease_ttl(5.0), 8.25)
        self.assertEqual(min_lease_ttl(3.0), 5.25)
        self.assertEqual(min_lease_ttl(0.1), 1.0)  # never under the absolute floor
        # The defaults (heartbeat timeout 5 s, TTL 10 s) hold it.
        self.assertEqual(self.cluster({"redis": "redis://cache"}).lease_ttl_sec, 10.0)
        error = self.error({"redis": "redis://cache", "lease_ttl_sec": 8})
        assertIssue(self, error, "cluster.lease_ttl_sec", "must be at least 8.25 seconds")
        self.assertIn("node_transport.heartbeat.timeout_sec 5", str(error))
        # A shorter heartbeat timeout admits a shorter TTL.
        fast = {"interval_sec": 1, "timeout_sec": 3}
        self.assertEqual(
            self.cluster({"redis": "redis://c", "lease_ttl_sec": 5.25}, fast).lease_ttl_sec, 5.25
        )
        error = self.error({"redis": "redis://cache", "lease_ttl_sec": 5}, fast)
        assertIssue(self, error, "cluster.lease_ttl_sec", "must be at least 5.25 seconds")

    def test_loaded_file(self) -> None:
        """Through load_edge_config: a relative password_file is read beside edge.yaml."""
        self.write("redis.pass", "s3cret\n")
        data = self.with_cluster({"redis": "redis://cache/1", "password_file": "redis.pass"})
        del data["edge"]
        path = self.write("edge.yaml", yaml.safe_dump(data))
        config = load_edge_config(path, environ=ENVIRON)
        assert config.cluster is not None
        self.assertEqual(config.cluster.password, Secret("s3cret"))
        self.assertEqual(config.cluster.edge_id, "edge")

    def test_example_file_documents_the_section(self) -> None:
        """etc/iop/edge.yaml shows the section (commented out: the demo runs one Edge)."""
        with open(os.path.join(EXAMPLE_DIR, "edge.yaml"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("# cluster:", text)
        self.assertIn("#   redis: redis://", text)


class RedisAddressTests(SynchronousTestCase):
    def test_tcp(self) -> None:
        self.assertEqual(parse_redis_address("redis://cache"), RedisAddress(host="cache"))
        self.assertEqual(
            parse_redis_address("redis://ops@10.0.0.5:6380/4"),
            RedisAddress(host="10.0.0.5", port=6380, db=4, username="ops"),
        )
        self.assertEqual(
            parse_redis_address("redis://[::1]:6380/1"), RedisAddress(host="::1", port=6380, db=1)
        )

    def test_unix(self) -> None:
        self.assertEqual(
            parse_redis_address("unix:///run/redis.sock"), RedisAddress(path="/run/redis.sock")
        )
        address = parse_redis_address("unix:///run/redis.sock?db=2")
        self.assertEqual(address, RedisAddress(path="/run/redis.sock", db=2))
        assert isinstance(address, RedisAddress)
        self.assertTrue(address.unix)

    def test_str_never_has_a_password(self) -> None:
        """``str()`` (for logs) is the canonical address; a username is not shown either."""
        self.assertEqual(
            str(RedisAddress(host="cache", port=6380, db=1, username="ops")),
            "redis://cache:6380/1",
        )
        self.assertEqual(str(RedisAddress(host="::1")), "redis://[::1]:6379/0")
        self.assertEqual(str(RedisAddress(path="/run/r.sock", db=2)), "unix:///run/r.sock?db=2")

    def test_redis_address_of_a_bad_config(self) -> None:
        self.assertRaises(ValueError, redis_address, ClusterConfig(redis="http://x", edge_id="e"))
