# -*- test-case-name: iop.test.config.test_logging_section -*-
"""
Tests for the ``logging:`` section of edge.yaml and node.yaml (:mod:`iop.config.logs`), the
``--log-format`` / ``--log-level`` flags of both plugins, and the examples in ``etc/``.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.config.errors import Issues, as_section
from iop.config.logs import log_format_flag, log_level_flag, logging_section
from iop.config.model import LoggingConfig
from iop.config.node import node_config_from_flags
from iop.edge import tap as edge_tap
from iop.node import tap as node_tap
from iop.test.config import test_node_config
from iop.test.config.test_edge_config import (
    EdgeConfigTestMixin,
    assertIssue,
    base_config,
)

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "etc", "iop")


class EdgeLoggingTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def with_logging(self, section: Any) -> dict[str, Any]:
        data = base_config()
        data["logging"] = section
        return data

    def error(self, section: Any) -> ConfigError:
        error: ConfigError = self.assertRaises(ConfigError, self.parse, self.with_logging(section))
        return error

    def test_defaults(self) -> None:
        """No section: text at info, as a ``logging: {}`` section."""
        self.assertEqual(self.parse(base_config()).logging, LoggingConfig("text", "info"))
        self.assertEqual(self.parse(self.with_logging({})).logging, LoggingConfig("text", "info"))

    def test_json(self) -> None:
        config = self.parse(self.with_logging({"format": "json", "level": "debug"}))
        self.assertEqual(config.logging, LoggingConfig("json", "debug"))

    def test_levels(self) -> None:
        for level in ("debug", "info", "warn", "error", "critical"):
            self.assertEqual(self.parse(self.with_logging({"level": level})).logging.level, level)

    def test_level_spellings(self) -> None:
        """``warning`` means ``warn``; level names are case-insensitive."""
        self.assertEqual(self.parse(self.with_logging({"level": "warning"})).logging.level, "warn")
        self.assertEqual(self.parse(self.with_logging({"level": "DEBUG"})).logging.level, "debug")

    def test_bad_format(self) -> None:
        assertIssue(self, self.error({"format": "xml"}), "logging.format", "'json', 'text'")
        assertIssue(self, self.error({"format": 1}), "logging.format", "must be a string")

    def test_bad_level(self) -> None:
        issue = assertIssue(self, self.error({"level": "loud"}), "logging.level", "must be one of")
        self.assertIn("'loud'", issue.message)
        assertIssue(self, self.error({"level": 3}), "logging.level", "must be a string")

    def test_unknown_key(self) -> None:
        assertIssue(self, self.error({"formatt": "json"}), "logging.formatt", "'format'")

    def test_not_a_mapping(self) -> None:
        assertIssue(self, self.error("json"), "logging", "must be a mapping")

    def test_every_problem(self) -> None:
        """One pass reports every problem of the section."""
        error = self.error({"format": "xml", "level": "loud", "colour": True})
        self.assertEqual(
            sorted(issue.path for issue in error.issues),
            ["logging.colour", "logging.format", "logging.level"],
        )


class NodeLoggingTests(test_node_config.NodeConfigTestCase):
    def test_defaults(self) -> None:
        config = self.parse(test_node_config.base_config())
        self.assertEqual(config.logging, LoggingConfig())

    def test_json(self) -> None:
        data = test_node_config.base_config()
        data["logging"] = {"format": "json", "level": "warn"}
        self.assertEqual(self.parse(data).logging, LoggingConfig("json", "warn"))

    def test_bad(self) -> None:
        data = test_node_config.base_config()
        data["logging"] = {"format": "yaml"}
        test_node_config.assertIssue(self, self.fails(data), "logging.format", "must be one of")

    def test_join_flags_take_the_defaults(self) -> None:
        """A node joined with flags and no node.yaml logs as node.yaml's defaults say."""
        config = node_config_from_flags(
            edge="edge.example.net:7443",
            token_file="node.token",
            ca_file="pki/ca.crt",
            base_dir=self.base,
        )
        self.assertEqual(config.logging, LoggingConfig())


class FlagTests(SynchronousTestCase):
    def test_format(self) -> None:
        self.assertEqual(log_format_flag("json"), "json")
        self.assertEqual(log_format_flag("text"), "text")
        self.assertRaises(ValueError, log_format_flag, "xml")

    def test_level(self) -> None:
        self.assertEqual(log_level_flag("debug"), "debug")
        self.assertEqual(log_level_flag("Warning"), "warn")
        self.assertRaises(ValueError, log_level_flag, "loud")

    def test_plugins_refuse_a_bad_value(self) -> None:
        """Both plugins check the flags while parsing their options."""
        for options in (edge_tap.Options(), node_tap.Options()):
            self.assertRaises(usage.UsageError, options.parseOptions, ["--log-format", "xml"])
        for options in (edge_tap.Options(), node_tap.Options()):
            self.assertRaises(usage.UsageError, options.parseOptions, ["--log-level", "loud"])

    def test_node_join_with_flags(self) -> None:
        """The flags go with the one-line join (no node.yaml) too."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        for name in ("ca.crt", "node.token"):
            with open(os.path.join(base, name), "w") as f:
                f.write("x\n")
        options = node_tap.Options()
        cwd = os.getcwd()
        os.chdir(base)
        self.addCleanup(os.chdir, cwd)
        options.parseOptions(
            [
                "--edge",
                "127.0.0.1:7443",
                "--token-file",
                "node.token",
                "--ca-file",
                "ca.crt",
                "--log-format",
                "json",
                "--log-level",
                "warning",
            ]
        )
        self.assertEqual((options["log-format"], options["log-level"]), ("json", "warn"))


class ExampleTests(SynchronousTestCase):
    def test_examples_state_the_defaults(self) -> None:
        """etc/iop's examples have a valid ``logging:`` section, stating the defaults."""
        for name in ("edge.yaml", "node.yaml"):
            path = os.path.join(EXAMPLES, name)
            if not os.path.exists(path):
                raise self.skipTest(f"etc/iop/{name} is not in this tree")
            with open(path) as f:
                data = yaml.safe_load(f)
            issues = Issues()
            top = as_section(issues, "", {"logging": data["logging"]})
            assert top is not None
            self.assertEqual(logging_section(top), LoggingConfig(), name)
            self.assertEqual(list(issues), [], name)
