# -*- test-case-name: iop.test.cli -*-
"""
Running C{iop} in a test: L{run} calls L{iop.cli.main.main} with stdout/stderr captured;
L{assert_no_key_material} checks that what it printed holds no key; L{CommandAssertions} holds
the exit-code checks every command's tests share.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from twisted.trial.unittest import SynchronousTestCase

from iop.cli.main import main


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def run(argv: Sequence[str]) -> Result:
    """Run C{iop argv} and return its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Result(code, out.getvalue(), err.getvalue())


class CommandAssertions(SynchronousTestCase):
    """Exit-code assertions for C{iop} commands (a base for their test cases)."""

    def assertOK(self, result: Result) -> None:
        self.assertEqual((result.code, result.err), (0, ""))

    def assertUserError(self, result: Result, *fragments: str) -> None:
        """Exit code 1, one line on stderr naming each fragment, nothing on stdout."""
        self.assertEqual(result.code, 1, result)
        self.assertEqual(result.out, "")
        self.assertTrue(result.err.startswith("iop: error: "), result.err)
        self.assertEqual(len(result.err.splitlines()), 1, result.err)
        for fragment in fragments:
            self.assertIn(fragment, result.err)


def assert_no_key_material(case: SynchronousTestCase, result: Result, *paths: str) -> None:
    """Nothing PEM-armoured, and no line of any file in C{paths}, appears in the output."""
    text = result.out + result.err
    case.assertNotIn("-----BEGIN", text)
    case.assertNotIn("PRIVATE KEY", text)
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("-----"):
                    case.assertNotIn(line, text, path)


def assert_setting(
    case: SynchronousTestCase, result: Result, config: str, key: str, value: str
) -> None:
    """The report says that C{config}'s C{key} takes C{value} (whatever the alignment)."""
    pattern = rf"^  {re.escape(config)}  {re.escape(key)}: +{re.escape(value)}(  \(|$)"
    case.assertTrue(
        re.search(pattern, result.out, re.MULTILINE),
        f"{config} {key}: {value} not in:\n{result.out}",
    )
