# -*- test-case-name: iop.test.node.test_tap -*-
"""
Tests for :class:`iop.node.tap.Options`: node.yaml (``--config``) or the one-line join flags
(``--edge HOST:PORT --token-file F --ca-file F``...), never both; and the service of a node
that dials several Edges.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config.node import DEFAULT_JOIN_SERVER_NAME
from iop.node.edges import EdgeSupervisors
from iop.node.tap import Options, makeService

TOKEN = "join-token-value"


class JoinFlagTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.token_file = os.path.join(self.dir, "node.token")
        self.ca_file = os.path.join(self.dir, "ca.crt")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        with open(self.ca_file, "w") as f:
            f.write("not parsed until the node starts\n")

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def join_flags(self, *extra: str) -> list[str]:
        return [
            "--edge",
            "edge.example.net:7443",
            "--token-file",
            self.token_file,
            "--ca-file",
            self.ca_file,
            *extra,
        ]

    def test_join_without_node_yaml(self) -> None:
        config = self.parse(*self.join_flags()).node_config
        self.assertEqual((config.edge_host, config.edge_port), ("edge.example.net", 7443))
        self.assertEqual(config.token.reveal(), TOKEN)
        assert config.tls is not None
        self.assertEqual(config.tls.ca_file, self.ca_file)
        self.assertEqual(config.tls.server_name, DEFAULT_JOIN_SERVER_NAME)
        self.assertEqual(config.source_path, "")

    def test_optional_flags(self) -> None:
        config = self.parse(
            *self.join_flags("--server-name", "gw.example.net", "--store", "file:x.db")
        ).node_config
        assert config.tls is not None
        self.assertEqual(config.tls.server_name, "gw.example.net")
        self.assertEqual(config.store_path, "file:x.db")

    def test_config_and_edge_is_a_usage_error(self) -> None:
        e = self.assertRaises(
            usage.UsageError, self.parse, "--config", "node.yaml", *self.join_flags()
        )
        self.assertIn("--config", str(e))
        self.assertIn("--edge", str(e))

    def test_join_flag_without_edge_is_a_usage_error(self) -> None:
        e = self.assertRaises(usage.UsageError, self.parse, "--token-file", self.token_file)
        self.assertIn("--token-file", str(e))
        self.assertIn("--edge", str(e))

    def test_missing_token_file_names_the_flag(self) -> None:
        missing = os.path.join(self.dir, "absent.token")
        e = self.assertRaises(
            usage.UsageError,
            self.parse,
            "--edge",
            "edge.example.net:7443",
            "--token-file",
            missing,
            "--ca-file",
            self.ca_file,
        )
        self.assertIn(f"--token-file: token file {missing} does not exist", str(e))

    def test_token_never_in_errors(self) -> None:
        e = self.assertRaises(
            usage.UsageError, self.parse, *self.join_flags("--cert-file", self.ca_file)
        )
        self.assertIn("--key-file", str(e))
        self.assertNotIn(TOKEN, str(e))

    def test_config_still_loads_node_yaml(self) -> None:
        e = self.assertRaises(
            usage.UsageError, self.parse, "--config", os.path.join(self.dir, "none.yaml")
        )
        self.assertIn("none.yaml", str(e))


class SeveralEdgesTests(SynchronousTestCase):
    """``--edge`` repeated or comma-separated, and node.yaml ``edges:``: one dial per Edge."""

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.token_file = os.path.join(self.dir, "node.token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")

    def node_yaml(self, *ports: int) -> str:
        path = os.path.join(self.dir, "node.yaml")
        edges = [{"host": "127.0.0.1", "port": port, "plaintext": True} for port in ports]
        with open(path, "w") as f:
            yaml.safe_dump(
                {
                    "edges": edges,
                    "token_file": "node.token",
                    "reconnect": {"max_attempts": 0, "interval_sec": 1},
                    "store": {"path": "file:edges?mode=memory&cache=shared"},
                },
                f,
            )
        return path

    def test_repeated_and_comma_separated_flags(self) -> None:
        for argv in (
            ["--edge", "127.0.0.1:17443", "--edge", "127.0.0.1:17444"],
            ["--edge", "127.0.0.1:17443,127.0.0.1:17444"],
        ):
            options = Options()
            options.parseOptions([*argv, "--token-file", self.token_file, "--ca-file", __file__])
            self.assertEqual(
                [e.name for e in options.node_config.edges], ["127.0.0.1:17443", "127.0.0.1:17444"]
            )

    def test_one_dial_per_edge(self) -> None:
        options = Options()
        options.parseOptions(["--config", self.node_yaml(17443, 17444)])
        reactor = MemoryReactorClock()
        service: Any = makeService(options, reactor)
        service.startService()
        reactor.advance(0)
        self.assertEqual(
            sorted((h, p) for h, p, *_ in reactor.tcpClients),
            [("127.0.0.1", 17443), ("127.0.0.1", 17444)],
        )
        supervisors = service.getServiceNamed("node").supervisor
        self.assertIsInstance(supervisors, EdgeSupervisors)
        self.assertEqual(
            [(d["edge"], d["tls"], d["supervisor_state"]) for d in supervisors.describe()],
            [("127.0.0.1:17443", False, "connecting"), ("127.0.0.1:17444", False, "connecting")],
        )
        # Each Edge its own supervisor and connection factory, one adapter context for all.
        factories = []
        for client in sorted(reactor.tcpClients, key=lambda c: c[1]):
            factory: Any = client[2]
            # Down the endpoint's wrappers to the (proxied) EdgeConnectionFactory.
            while not hasattr(factory, "sessions"):
                factory = getattr(factory, "_wrappedFactory", None) or factory.wrappedFactory
            factories.append(factory)
        self.assertIsNot(factories[0], factories[1])
        self.assertIs(factories[0].sessions.adapter_context, factories[1].sessions.adapter_context)
        self.assertEqual(
            [f.connection_log.edge for f in factories], ["127.0.0.1:17443", "127.0.0.1:17444"]
        )
        self.successResultOf(service.stopService())
        self.assertEqual(self.successResultOf(supervisors.when_finished()), 0)
