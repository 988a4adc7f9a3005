"""Every program's ``--version`` (:mod:`iop.version`): iop, twistd iop-edge and iop-node."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout

from twisted.trial.unittest import SynchronousTestCase

from iop import __version__
from iop.cli.main import main
from iop.edge.tap import Options as EdgeOptions
from iop.node.tap import Options as NodeOptions
from iop.version import version_line

LINE = re.compile(r"\A(?P<program>[\w-]+) (?P<version>\S+) \(Python [\d.]+\w*, Twisted \S+\)\Z")


class VersionTests(SynchronousTestCase):
    def test_the_line(self) -> None:
        match = LINE.match(version_line("iop"))
        assert match is not None
        self.assertEqual(match["version"], __version__)

    def test_iop_version(self) -> None:
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(main(["--version"]), 0)
        self.assertEqual(out.getvalue().strip(), version_line("iop"))

    def test_plugins_version_without_a_config(self) -> None:
        for options, program in ((EdgeOptions(), "iop-edge"), (NodeOptions(), "iop-node")):
            out = io.StringIO()
            with redirect_stdout(out), self.assertRaises(SystemExit) as exited:
                options.parseOptions(["--version"])
            self.assertEqual(exited.exception.code, 0)
            self.assertEqual(out.getvalue().strip(), version_line(program))
