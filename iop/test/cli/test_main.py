# -*- test-case-name: iop.test.cli.test_main -*-
"""
Tests for L{iop.cli.main}: the command groups, help, and the exit codes (0 done, 1 a user
error on one stderr line, 2 a usage error).
"""

from __future__ import annotations

import argparse
import errno
import io
import types
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import main as cli_main
from iop.cli.command import CommandError, Report
from iop.test.cli.support import run


def _group(run_command: Any) -> types.SimpleNamespace:
    """A command group with one subcommand, C{iop try}, running C{run_command}."""

    def register(subparsers: Any) -> None:
        parser = subparsers.add_parser("try", help="a test command")
        parser.set_defaults(run=run_command)

    return types.SimpleNamespace(register=register)


class MainTests(SynchronousTestCase):
    def test_help(self) -> None:
        """C{iop --help} lists every command group and exits 0."""
        result = run(["--help"])
        self.assertEqual(result.code, 0)
        for group in ("pki", "keys"):
            self.assertIn(group, result.out)
        self.assertEqual(result.err, "")

    def test_groupHelp(self) -> None:
        result = run(["pki", "--help"])
        self.assertEqual(result.code, 0)
        for command in ("init", "issue-edge", "issue-node"):
            self.assertIn(command, result.out)
        result = run(["keys", "--help"])
        self.assertEqual(result.code, 0)
        for command in ("issuer", "recipient"):
            self.assertIn(command, result.out)

    def test_noCommand(self) -> None:
        """No command, or a group without its subcommand: a usage error (2)."""
        for argv in ([], ["pki"], ["keys"]):
            result = run(argv)
            self.assertEqual(result.code, 2, argv)
            self.assertIn("usage:", result.err)
            self.assertEqual(result.out, "")

    def test_unknownCommand(self) -> None:
        for argv in (["nope"], ["pki", "nope"], ["pki", "init", "--nope"]):
            result = run(argv)
            self.assertEqual(result.code, 2, argv)

    def test_groups(self) -> None:
        """Every group is a module with register(subparsers)."""
        for group in cli_main.GROUPS:
            self.assertTrue(callable(group.register), group)
        parser = cli_main.build_parser()
        self.assertIsInstance(parser, argparse.ArgumentParser)
        self.assertEqual(parser.prog, "iop")

    def test_userError(self) -> None:
        """A CommandError: its message on one stderr line, exit code 1, nothing on stdout."""

        def fail(args: argparse.Namespace, report: Report) -> None:
            report.wrote("x", "not printed: the command failed")
            raise CommandError("that did not work")

        self.patch(cli_main, "GROUPS", (_group(fail),))
        result = run(["try"])
        self.assertEqual(result.code, 1)
        self.assertEqual(result.err, "iop: error: that did not work\n")
        self.assertEqual(result.out, "")

    def test_osError(self) -> None:
        """An OSError is a user error too: the file and the reason, no traceback."""

        def fail(args: argparse.Namespace, report: Report) -> None:
            raise PermissionError(errno.EACCES, "Permission denied", "pki/ca.key")

        self.patch(cli_main, "GROUPS", (_group(fail),))
        result = run(["try"])
        self.assertEqual(result.code, 1)
        self.assertEqual(result.err, "iop: error: 'pki/ca.key': Permission denied\n")


class ReportTests(SynchronousTestCase):
    def test_layout(self) -> None:
        """What was written, then the config keys with their values, aligned, then notes."""
        out = io.StringIO()
        report = Report(out)
        report.wrote("pki/ca.crt", "CA certificate")
        report.goes("edge.yaml", "node_transport.tls.client_ca_file", "pki/ca.crt", "mTLS")
        report.goes("node.yaml", "edge.ca_file", "pki/ca.crt")
        report.note("Next: more.")
        report.finish()
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "wrote pki/ca.crt: CA certificate")
        self.assertEqual(lines[1], "")
        self.assertIn("Where it goes", lines[2])
        self.assertEqual(
            lines[3], "  edge.yaml  node_transport.tls.client_ca_file: pki/ca.crt  (mTLS)"
        )
        self.assertEqual(lines[4], "  node.yaml  edge.ca_file:                      pki/ca.crt")
        self.assertEqual(lines[5:], ["", "Next: more."])
        self.assertEqual(
            [(s.config, s.key) for s in report.settings],
            [("edge.yaml", "node_transport.tls.client_ca_file"), ("node.yaml", "edge.ca_file")],
        )
