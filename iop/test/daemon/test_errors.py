"""
Startup failures as one or two lines (iop.daemon.errors): the wording for each kind, the plugin's
options and service maker, and the excepthook that prints a listener's failure.
"""

from __future__ import annotations

import errno
import io
import sys
from typing import Any

from twisted.internet.error import CannotListenError
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config.errors import ConfigError, ConfigIssue
from iop.daemon.errors import (
    DaemonMaker,
    StartupError,
    config_problem,
    excepthook,
    listen_problem,
    startup_problem,
)


def cannot_listen(code: int, interface: str = "127.0.0.1", port: int = 7443) -> CannotListenError:
    return CannotListenError(interface, port, OSError(code, "x"))


class WordingTests(SynchronousTestCase):
    def test_port_in_use_names_the_setting(self) -> None:
        self.assertEqual(
            listen_problem(cannot_listen(errno.EADDRINUSE), "listen.nodes"),
            "listen.nodes: 127.0.0.1:7443 is already in use (another Edge, or another program, "
            "listens there): stop it, or give listen.nodes another port",
        )

    def test_permission_denied(self) -> None:
        message = listen_problem(cannot_listen(errno.EACCES, "", 443), "openai.listen")
        self.assertEqual(
            message,
            "openai.listen: permission denied binding 0.0.0.0:443 (ports below 1024 need root or "
            "CAP_NET_BIND_SERVICE): choose a port from 1024 up, or grant the capability",
        )

    def test_not_an_address_here(self) -> None:
        message = listen_problem(cannot_listen(errno.EADDRNOTAVAIL, "192.0.2.1"), "listen.admin")
        self.assertEqual(
            message,
            "listen.admin: 192.0.2.1 is not an address of this host: bind one of its addresses, "
            "or 0.0.0.0",
        )

    def test_an_unknown_port(self) -> None:
        message = listen_problem(cannot_listen(errno.EADDRINUSE), None)
        self.assertTrue(message.startswith("a listener: 127.0.0.1:7443 is already in use"))

    def test_config_problems(self) -> None:
        one = ConfigError([ConfigIssue("listen.nodes", "is required")])
        self.assertEqual(
            config_problem("invalid config e.yaml", one),
            "invalid config e.yaml: listen.nodes: is required",
        )
        missing = ConfigError(
            [ConfigIssue("/x/e.yaml", "cannot read config file: No such file or directory")]
        )
        self.assertEqual(
            config_problem("invalid config /x/e.yaml", missing, "/x/e.yaml"),
            "cannot read config file /x/e.yaml: No such file or directory"
            " (--config names the file)",
        )
        two = ConfigError([ConfigIssue("a", "one"), ConfigIssue("b", "two")])
        self.assertEqual(
            config_problem("invalid flags", two), "invalid flags (2 problems):\n  a: one\n  b: two"
        )

    def test_startup_problem_knows_only_its_own(self) -> None:
        self.assertEqual(startup_problem(StartupError("x: y"), {}), "x: y")
        self.assertIn(
            "listen.nodes",
            startup_problem(cannot_listen(errno.EADDRINUSE), {7443: "listen.nodes"}) or "",
        )
        self.assertIsNone(startup_problem(ValueError("a bug"), {}))


class HookTests(SynchronousTestCase):
    def test_a_listener_failure_is_one_line(self) -> None:
        out = io.StringIO()
        chained: list[Any] = []
        hook = excepthook("iop-edge", {7443: "listen.nodes"}, lambda *a: chained.append(a), out)
        error = cannot_listen(errno.EADDRINUSE)
        hook(CannotListenError, error, None)
        self.assertEqual(out.getvalue().count("\n"), 1)
        self.assertTrue(
            out.getvalue().startswith("iop-edge: listen.nodes: 127.0.0.1:7443 is already in use")
        )
        self.assertEqual(chained, [])

    def test_a_bug_keeps_its_traceback(self) -> None:
        out = io.StringIO()
        chained: list[Any] = []
        hook = excepthook("iop-edge", {}, lambda *a: chained.append(a), out)
        hook(ValueError, ValueError("bug"), None)
        self.assertEqual(out.getvalue(), "")
        self.assertEqual(len(chained), 1)


class FakeTap:
    """A tap module: Options that refuse, makeService that refuses or serves."""

    class Options(usage.Options):
        optParameters = [["config", "c", None, "Path."]]

        def postOptions(self) -> None:
            if self["config"] == "bad":
                raise usage.UsageError("invalid config bad: listen.nodes: is required")

    refuse = False

    @staticmethod
    def makeService(options: Any) -> Any:
        if FakeTap.refuse:
            raise usage.UsageError("node_transport.tls: TLS certificate file 'x': no valid PEM")
        return "service"

    @staticmethod
    def listen_settings(options: Any) -> dict[int, str]:
        return {7443: "listen.nodes"}


class MakerTests(SynchronousTestCase):
    def setUp(self) -> None:
        # (namedAny finds the class as it would a tap module.)
        self.maker = DaemonMaker("Fake", f"{__name__}.FakeTap", "a fake", "iop-fake")
        hook = sys.excepthook
        self.addCleanup(setattr, sys, "excepthook", hook)

    def test_options_refuse_in_one_line(self) -> None:
        options = self.maker.options()
        e = self.assertRaises(SystemExit, options.parseOptions, ["--config", "bad"])
        self.assertEqual(str(e), "iop-fake: invalid config bad: listen.nodes: is required")

    def test_an_unknown_flag_says_where_the_flags_are(self) -> None:
        options = self.maker.options()
        e = self.assertRaises(SystemExit, options.parseOptions, ["--bogus"])
        self.assertEqual(
            str(e), "iop-fake: option --bogus not recognized (twistd iop-fake --help lists them)"
        )

    def test_make_service_refuses_in_one_line(self) -> None:
        FakeTap.refuse = True
        self.addCleanup(setattr, FakeTap, "refuse", False)
        e = self.assertRaises(SystemExit, self.maker.makeService, self.maker.options())
        self.assertEqual(
            str(e), "iop-fake: node_transport.tls: TLS certificate file 'x': no valid PEM"
        )

    def test_make_service_installs_the_hook(self) -> None:
        self.assertEqual(self.maker.makeService(self.maker.options()), "service")
        self.assertIsNot(sys.excepthook, sys.__excepthook__)
