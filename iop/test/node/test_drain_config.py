"""
The settings around a node's drain and its TLS files: node.yaml ``drain_timeout_sec`` and
``--drain-timeout``; a TLS file the node cannot use named by its setting as well as its path.
"""

from __future__ import annotations

import os

import yaml
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config.errors import ConfigError
from iop.config.node import load_node_config
from iop.node import link
from iop.node.tap import Options

TOKEN = "node-token-value"


class DrainSettingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.token_file = self.write("node.token", TOKEN + "\n")

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def node_yaml(self, **extra: object) -> str:
        document = {
            "edge": {"host": "127.0.0.1", "port": 17443, "plaintext": True},
            "token_file": "node.token",
            **extra,
        }
        return self.write("node.yaml", yaml.safe_dump(document))

    def options(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_default_30(self) -> None:
        self.assertEqual(load_node_config(self.node_yaml()).drain_timeout_sec, 30.0)

    def test_node_yaml(self) -> None:
        self.assertEqual(load_node_config(self.node_yaml(drain_timeout_sec=0)).drain_timeout_sec, 0)
        self.assertEqual(
            load_node_config(self.node_yaml(drain_timeout_sec=12.5)).drain_timeout_sec, 12.5
        )

    def test_negative_names_the_setting(self) -> None:
        error = self.assertRaises(
            ConfigError, load_node_config, self.node_yaml(drain_timeout_sec=-1)
        )
        self.assertIn("drain_timeout_sec", str(error))

    def test_flag_over_node_yaml(self) -> None:
        options = self.options(
            "--config", self.node_yaml(drain_timeout_sec=10), "--drain-timeout", "0"
        )
        self.assertEqual(options.node_config.drain_timeout_sec, 0)

    def test_flag_with_edge(self) -> None:
        options = self.options(
            "--edge", "127.0.0.1:17443", "--token-file", self.token_file, "--ca-file", __file__,
            "--drain-timeout", "45",
        )  # fmt: skip
        self.assertEqual(options.node_config.drain_timeout_sec, 45)

    def test_bad_flag(self) -> None:
        for value in ("-1", "soon", "inf"):
            error = self.assertRaises(
                usage.UsageError,
                self.options,
                "--config",
                self.node_yaml(),
                "--drain-timeout",
                value,
            )
            self.assertIn("--drain-timeout", str(error))


class TLSSettingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.bad = os.path.join(self.dir, "ca.crt")
        with open(self.bad, "w") as f:
            f.write("not a certificate\n")
        with open(os.path.join(self.dir, "node.token"), "w") as f:
            f.write(TOKEN + "\n")

    def test_node_yaml_setting_named(self) -> None:
        path = os.path.join(self.dir, "node.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(
                {
                    "edge": {"host": "edge.example.net", "port": 7443, "ca_file": "ca.crt"},
                    "token_file": "node.token",
                },
                f,
            )
        config = load_node_config(path)
        error = self.assertRaises(
            usage.UsageError, link.edge_endpoints, config, MemoryReactorClock()
        )
        message = str(error)
        self.assertTrue(message.startswith("edge.ca_file: "), message)
        self.assertIn(self.bad, message)

    def test_flag_named(self) -> None:
        options = Options()
        options.parseOptions(
            [
                "--edge", "edge.example.net:7443",
                "--token-file", os.path.join(self.dir, "node.token"),
                "--ca-file", self.bad,
            ]
        )  # fmt: skip
        error = self.assertRaises(
            usage.UsageError, link.edge_endpoints, options.node_config, MemoryReactorClock()
        )
        self.assertTrue(str(error).startswith("--ca-file: "), str(error))
