# -*- test-case-name: iop.test.logs.test_twistd -*-
"""
The log observer a daemon's ``logging:`` section asks for, installed under ``twistd``.

twistd begins logging after the plugin's ``makeService`` has run (``AppLogger.start``): to the
``--logger`` factory if one is given, else to the application's
:class:`~twisted.logger.ILogObserver` component, else to a text observer on ``--logfile``
(stdout under ``--nodaemon``, ``twistd.log`` for a daemon). :func:`for_twistd` wraps the
daemon's service in :class:`TwistdLogging`, which sets that component when twistd parents it
to the application, so:

- the destination is twistd's own: stdout under ``-n``, ``--logfile``/``-l`` (rotated on
  SIGUSR1 as twistd does), ``twistd.log`` for a daemon;
- ``format: text`` writes twistd's own lines (:mod:`iop.logs.text`: the same lines, cheaper),
  ``format: json`` :mod:`iop.logs.jsonlines`' lines;
- events below ``level`` are dropped before anything formats them (:class:`MinimumLevel`); the
  Edge's live config refresh switches the level (:meth:`TwistdLogging.use_logging`);
- an explicit ``--logger`` or ``--syslog`` wins: then nothing is installed and twistd logs as
  it always did, and so does a service that is not run by twistd (tests, embedding).

The flags ``--log-format`` and ``--log-level`` (:data:`LOG_FLAGS`, on both plugins) override
the config file's section; they are how a node joined without node.yaml picks JSON.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from typing import IO, Any, cast

from twisted.application.service import IService, MultiService
from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogEvent,
    LogLevel,
    PredicateResult,
)
from twisted.python import usage
from twisted.python.components import Componentized
from twisted.python.logfile import LogFile
from twisted.python.runtime import platformType
from zope.interface import implementer

from iop.config.logs import log_format_flag, log_level_flag
from iop.config.model import LoggingConfig
from iop.logs.jsonlines import json_file_observer
from iop.logs.text import text_file_observer

__all__ = [
    "LOG_FLAGS",
    "MinimumLevel",
    "TwistdLogging",
    "for_twistd",
    "log_observer",
    "logging_settings",
    "twistd_log_file",
]

# usage.Options parameters for both plugins: [long, short, default, help, coerce].
LOG_FLAGS: list[list[Any]] = [
    [
        "log-format",
        None,
        None,
        "Log format: text or json (overrides logging.format).",
        log_format_flag,
    ],
    [
        "log-level",
        None,
        None,
        "Lowest level logged: debug, info, warn, error or critical (overrides logging.level).",
        log_level_flag,
    ],
]


def logging_settings(config: LoggingConfig, options: Mapping[str, Any]) -> LoggingConfig:
    """The config file's ``logging`` with the ``--log-format``/``--log-level`` flags applied."""
    return LoggingConfig(
        format=options.get("log-format") or config.format,
        level=options.get("log-level") or config.level,
    )


@implementer(ILogFilterPredicate)
class MinimumLevel:
    """
    A :class:`~twisted.logger.FilteringLogObserver` predicate: events below ``level`` are
    dropped (an event without a level counts as ``info``). ``level`` may be changed at any time.
    """

    def __init__(self, level: str) -> None:
        self.level = LogLevel.levelWithName(level)

    def set_level(self, level: str) -> None:
        self.level = LogLevel.levelWithName(level)

    def __call__(self, event: LogEvent) -> Any:
        if event.get("log_level", LogLevel.info) < self.level:
            return PredicateResult.no
        return PredicateResult.maybe


def log_observer(settings: LoggingConfig, out_file: IO[Any]) -> tuple[ILogObserver, MinimumLevel]:
    """The observer ``settings`` describe, writing to ``out_file``, and its level filter."""
    writer = (
        json_file_observer(out_file) if settings.format == "json" else text_file_observer(out_file)
    )
    minimum = MinimumLevel(settings.level)
    return FilteringLogObserver(writer, [minimum]), minimum


def twistd_log_file(server: Mapping[str, Any]) -> IO[Any] | None:
    """
    Where twistd would write its log, given its options (``server``): stdout or a
    :class:`~twisted.python.logfile.LogFile`, opened now. ``None`` when twistd must keep its own
    choice: ``--logger`` or ``--syslog`` given, or ``--logfile -`` for a daemon (which twistd
    refuses with its own message).
    """
    if server.get("logger") or server.get("syslog"):
        return None
    name = server.get("logfile") or ""
    if platformType != "posix":
        if name in ("", "-"):
            return sys.stdout
        return cast(IO[Any], LogFile.fromFullPath(name))
    if name == "-":
        return sys.stdout if server.get("nodaemon") else None
    if not name:
        if server.get("nodaemon"):
            return sys.stdout
        name = "twistd.log"
    log_file = LogFile.fromFullPath(name)
    # As twistd does: SIGUSR1 rotates the file, unless something else handles that signal.
    if not signal.getsignal(signal.SIGUSR1):

        def rotate(signum: int, frame: object) -> None:
            from twisted.internet import reactor

            reactor.callFromThread(log_file.rotate)  # type: ignore[attr-defined]

        signal.signal(signal.SIGUSR1, rotate)
    return cast(IO[Any], log_file)


class TwistdLogging(MultiService):
    """
    The daemon's service, as twistd's application sees it: when parented to the application
    it opens twistd's log destination and sets the configured observer as the application's
    :class:`~twisted.logger.ILogObserver` component, which twistd then begins logging to.
    """

    def __init__(
        self,
        service: IService,
        settings: LoggingConfig,
        server: Mapping[str, Any],
        *,
        pinned_level: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings
        self._server = server
        self._pinned_level = pinned_level
        self.level: MinimumLevel | None = None
        service.setServiceParent(self)

    def use_logging(self, config: LoggingConfig) -> None:
        """
        A refreshed config's ``logging``: its level applies from the next event on (unless
        ``--log-level`` pinned it); a new format waits for a restart.
        """
        if self.level is not None and not self._pinned_level:
            self.level.set_level(config.level)

    def setServiceParent(self, parent: Any) -> None:
        if isinstance(parent, Componentized):
            out_file = twistd_log_file(self._server)
            if out_file is not None:
                observer, self.level = log_observer(self.settings, out_file)
                parent.setComponent(ILogObserver, observer)
        super().setServiceParent(parent)


def for_twistd(service: IService, config: LoggingConfig, options: usage.Options) -> IService:
    """
    ``service`` as ``makeService`` returns it: wrapped in :class:`TwistdLogging` when twistd
    runs it (``options.parent`` is twistd's own options), as it is otherwise.
    """
    server = options.parent
    if server is None:
        return service
    return TwistdLogging(
        service,
        logging_settings(config, options),
        server,
        pinned_level=bool(options.get("log-level")),
    )
