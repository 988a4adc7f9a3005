# -*- test-case-name: iop.test.logs.test_twistd -*-
"""
Tests for :mod:`iop.logs.twistd`: the level filter, the observer per format, twistd's log
destination, and the application component twistd begins logging to.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys
from typing import Any, cast

import yaml
from twisted.application.service import Application, IService, MultiService, Service
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, LogEvent, Logger, LogLevel, textFileLogObserver
from twisted.python import usage
from twisted.python.logfile import LogFile
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import LoggingConfig
from iop.edge import tap as edge_tap
from iop.heap import FrozenStartup
from iop.logs import twistd
from iop.logs.twistd import (
    MinimumLevel,
    TwistdLogging,
    for_twistd,
    log_observer,
    logging_settings,
    twistd_log_file,
)
from iop.node import tap as node_tap
from iop.testing.pki import create_dev_pki

WHEN = 1796136091.25


def events(*levels: LogLevel) -> list[LogEvent]:
    out: list[LogEvent] = []
    log = Logger(namespace="iop.test", observer=cast(ILogObserver, out.append))
    for level in levels:
        log.emit(level, "at {name}", name=level.name)
    for event in out:
        event["log_time"] = WHEN
    return out


class MinimumLevelTests(SynchronousTestCase):
    def test_filters_below(self) -> None:
        out = io.StringIO()
        observer, _ = log_observer(LoggingConfig("json", "warn"), out)
        for event in events(*LogLevel.iterconstants()):
            observer(event)
        levels = [json.loads(line)["level"] for line in out.getvalue().splitlines()]
        self.assertEqual(levels, ["warn", "error", "critical"])

    def test_no_level_counts_as_info(self) -> None:
        self.assertEqual(MinimumLevel("info")({}).name, "maybe")
        self.assertEqual(MinimumLevel("warn")({}).name, "no")

    def test_set_level(self) -> None:
        minimum = MinimumLevel("info")
        [debug] = events(LogLevel.debug)
        self.assertEqual(minimum(debug).name, "no")
        minimum.set_level("debug")
        self.assertEqual(minimum(debug).name, "maybe")


class ObserverTests(SynchronousTestCase):
    def test_text_is_twistds(self) -> None:
        """``format: text`` writes exactly what twistd's own observer writes."""
        ours, theirs = io.StringIO(), io.StringIO()
        observer, _ = log_observer(LoggingConfig("text", "debug"), ours)
        plain = textFileLogObserver(theirs)
        for event in events(LogLevel.debug, LogLevel.info, LogLevel.error):
            observer(event)
            plain(event)
        self.assertEqual(ours.getvalue(), theirs.getvalue())
        self.assertEqual(len(ours.getvalue().splitlines()), 3)

    def test_json(self) -> None:
        out = io.StringIO()
        observer, _ = log_observer(LoggingConfig("json", "info"), out)
        for event in events(LogLevel.debug, LogLevel.info):
            observer(event)
        [line] = out.getvalue().splitlines()
        self.assertEqual(json.loads(line)["message"], "at info")


class DestinationTests(SynchronousTestCase):
    def setUp(self) -> None:
        # twistd_log_file installs a SIGUSR1 handler (rotation) when there is none.
        previous = signal.getsignal(signal.SIGUSR1)
        self.addCleanup(signal.signal, signal.SIGUSR1, previous)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    def test_command_line_wins(self) -> None:
        """--logger and --syslog are twistd's to honour: nothing of ours."""
        self.assertIsNone(twistd_log_file({"logger": object(), "nodaemon": True}))
        self.assertIsNone(twistd_log_file({"syslog": True, "nodaemon": True}))

    def test_stdout(self) -> None:
        """-n with no logfile or ``--logfile -`` is stdout (as twistd, at call time)."""
        self.assertIs(twistd_log_file({"nodaemon": True, "logfile": None}), sys.stdout)
        self.assertIs(twistd_log_file({"nodaemon": True, "logfile": "-"}), sys.stdout)

    def test_daemon_to_stdout_is_twistds_refusal(self) -> None:
        self.assertIsNone(twistd_log_file({"nodaemon": False, "logfile": "-"}))

    def test_logfile(self) -> None:
        path = os.path.abspath(self.mktemp())
        out = twistd_log_file({"nodaemon": True, "logfile": path})
        assert isinstance(out, LogFile)
        self.addCleanup(out.close)
        self.assertEqual(out.path, path)
        self.assertNotEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL)

    def test_daemon_default_file(self) -> None:
        """A daemon with no --logfile writes twistd.log in its working directory."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        cwd = os.getcwd()
        os.chdir(base)
        self.addCleanup(os.chdir, cwd)
        out = twistd_log_file({"nodaemon": False, "logfile": None})
        assert isinstance(out, LogFile)
        self.addCleanup(out.close)
        self.assertEqual(out.path, os.path.join(base, "twistd.log"))

    def test_rotation_handler_kept(self) -> None:
        """Someone else's SIGUSR1 handler is left alone."""

        def mine(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGUSR1, mine)
        out = twistd_log_file({"logfile": os.path.abspath(self.mktemp())})
        assert isinstance(out, LogFile)
        self.addCleanup(out.close)
        self.assertIs(signal.getsignal(signal.SIGUSR1), mine)


class Plugin(usage.Options):
    optParameters = twistd.LOG_FLAGS


class Server(usage.Options):
    """Stands in for twistd's ServerOptions: the options a plugin's Options has as parent."""

    optFlags = [["nodaemon", "n", ""], ["syslog", None, ""]]
    optParameters = [["logfile", "l", None, ""], ["logger", None, None, ""]]
    subCommands = [["iop-test", None, Plugin, ""]]


def parsed(*argv: str) -> Plugin:
    server = Server()
    server.parseOptions(list(argv))
    options = server.subOptions
    assert isinstance(options, Plugin) and options.parent is server
    return options


class InstallTests(SynchronousTestCase):
    def test_not_under_twistd(self) -> None:
        """A plugin's Options parsed on their own (tests, embedding): the service as it is."""
        service = MultiService()
        self.assertIs(for_twistd(service, LoggingConfig("json"), Plugin()), service)

    def test_flags_override(self) -> None:
        config = LoggingConfig("text", "warn")
        self.assertEqual(logging_settings(config, {}), config)
        self.assertEqual(
            logging_settings(config, {"log-format": "json", "log-level": None}),
            LoggingConfig("json", "warn"),
        )
        self.assertEqual(
            logging_settings(config, {"log-format": None, "log-level": "debug"}),
            LoggingConfig("text", "debug"),
        )

    def test_application_component(self) -> None:
        """
        Parented to twistd's application, the wrapper gives it the configured observer as its
        ILogObserver (what twistd's AppLogger begins logging to), writing to --logfile.
        """
        path = os.path.abspath(self.mktemp())
        previous = signal.getsignal(signal.SIGUSR1)
        self.addCleanup(signal.signal, signal.SIGUSR1, previous)
        inner = Service()
        top: Any = for_twistd(
            inner, LoggingConfig("json", "info"), parsed("-n", "-l", path, "iop-test")
        )
        self.assertIsInstance(top, TwistdLogging)
        application = Application("iop-test")
        top.setServiceParent(application)
        self.assertIs(inner.parent, top)
        self.assertIn(top, list(cast(MultiService, IService(application))))
        observer = application.getComponent(ILogObserver)
        assert observer is not None and top.level is not None
        for event in events(LogLevel.debug, LogLevel.info, LogLevel.warn):
            observer(event)
        with open(path) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual([line["message"] for line in lines], ["at info", "at warn"])

    def test_flags_reach_the_observer(self) -> None:
        out = io.StringIO()
        self.patch(twistd, "twistd_log_file", lambda server: out)
        top: Any = for_twistd(
            Service(),
            LoggingConfig("text", "info"),
            parsed("-n", "iop-test", "--log-format", "json", "--log-level", "debug"),
        )
        application = Application("iop-test")
        top.setServiceParent(application)
        application.getComponent(ILogObserver)(events(LogLevel.debug)[0])
        self.assertEqual(json.loads(out.getvalue())["level"], "debug")

    def test_command_line_logger(self) -> None:
        """With --logger (twistd's own choice) the application gets no component of ours."""
        top = for_twistd(
            Service(), LoggingConfig("json"), parsed("-n", "--logger", "x.y", "iop-test")
        )
        application = Application("iop-test")
        top.setServiceParent(application)
        self.assertIsNone(application.getComponent(ILogObserver))

    def test_other_parent(self) -> None:
        """Parented to an ordinary service collection, the wrapper is only a MultiService."""
        top = for_twistd(Service(), LoggingConfig("json"), parsed("-n", "iop-test"))
        parent = MultiService()
        top.setServiceParent(parent)
        self.assertEqual(list(parent), [top])


class RefreshTests(SynchronousTestCase):
    def parented(self, *argv: str) -> tuple[TwistdLogging, io.StringIO]:
        out = io.StringIO()
        self.patch(twistd, "twistd_log_file", lambda server: out)
        top = for_twistd(Service(), LoggingConfig("json", "info"), parsed(*argv))
        assert isinstance(top, TwistdLogging)
        top.setServiceParent(Application("iop-test"))
        return top, out

    def test_level_switched(self) -> None:
        top, _ = self.parented("-n", "iop-test")
        assert top.level is not None
        top.use_logging(LoggingConfig("json", "debug"))
        self.assertEqual(top.level.level, LogLevel.debug)
        top.use_logging(LoggingConfig("text", "error"))
        self.assertEqual(top.level.level, LogLevel.error)

    def test_flag_pins_the_level(self) -> None:
        top, _ = self.parented("-n", "iop-test", "--log-level", "warn")
        assert top.level is not None
        top.use_logging(LoggingConfig("json", "debug"))
        self.assertEqual(top.level.level, LogLevel.warn)

    def test_before_parenting(self) -> None:
        """Nothing to switch yet (not parented to twistd's application): no error."""
        top = for_twistd(Service(), LoggingConfig(), parsed("-n", "iop-test"))
        assert isinstance(top, TwistdLogging)
        top.use_logging(LoggingConfig("text", "debug"))
        self.assertIsNone(top.level)


class DaemonServer(usage.Options):
    """twistd's options with the two real plugins as subcommands."""

    optFlags = [["nodaemon", "n", ""]]
    optParameters = [["logfile", "l", None, ""]]
    subCommands = [
        ["iop-edge", None, edge_tap.Options, ""],
        ["iop-node", None, node_tap.Options, ""],
    ]


class TapTests(SynchronousTestCase):
    """The two plugins under twistd: their service wrapped, the Edge's level refreshed live."""

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        create_dev_pki(os.path.join(self.dir, "pki"), node_names=["node-a"])
        with open(os.path.join(self.dir, "node.token"), "w") as f:
            f.write("tap-token")
        self.out = io.StringIO()
        self.patch(twistd, "twistd_log_file", lambda server: self.out)

    def write(self, name: str, data: dict[str, Any]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            yaml.safe_dump(data, f)
        return path

    def test_edge_level_follows_a_refresh(self) -> None:
        path = self.write(
            "edge.yaml",
            {
                "listen": {"nodes": "tcp:17443:interface=127.0.0.1"},
                "node_transport": {
                    "tls": {"cert_file": "pki/edge.crt", "key_file": "pki/edge.key"}
                },
                "nodes": [{"id": "node-a", "token_file": "node.token"}],
                "logging": {"format": "json"},
            },
        )
        server = DaemonServer()
        server.parseOptions(["-n", "iop-edge", "--config", path])
        top = edge_tap.makeService(server.subOptions, MemoryReactorClock())
        assert isinstance(top, TwistdLogging)
        [edge] = list(top)
        assert isinstance(edge, edge_tap.EdgeService)
        # Under twistd the heap is frozen once the Edge's services have started.
        self.assertIsInstance(edge.getServiceNamed("frozen-startup"), FrozenStartup)
        self.assertIsInstance(list(edge)[-1], FrozenStartup)
        top.setServiceParent(Application("iop-edge"))
        assert top.level is not None
        self.assertEqual(top.level.level, LogLevel.info)
        config = edge.config
        edge.applier.apply(dataclasses.replace(config, logging=LoggingConfig("json", "debug")))
        self.assertEqual(top.level.level, LogLevel.debug)
        edge.applier.apply(config)
        self.assertEqual(top.level.level, LogLevel.info)

    def test_node_wrapped(self) -> None:
        path = self.write(
            "node.yaml",
            {
                "edge": {
                    "host": "127.0.0.1",
                    "port": 17443,
                    "ca_file": "pki/ca.crt",
                    "server_name": "edge.iop.internal",
                },
                "token_file": "node.token",
                "logging": {"format": "json", "level": "warn"},
            },
        )
        server = DaemonServer()
        server.parseOptions(["-n", "iop-node", "--config", path])
        top = node_tap.makeService(server.subOptions, MemoryReactorClock())
        assert isinstance(top, TwistdLogging)
        self.assertEqual(top.settings, LoggingConfig("json", "warn"))
        [inner] = list(top)
        assert isinstance(inner, MultiService)
        self.assertIsInstance(list(inner)[-1], FrozenStartup)
