# -*- test-case-name: iop.test.daemon.test_errors -*-
"""
Why a daemon did not start, in one or two lines a person reads once: ``twistd iop-edge`` and
``twistd iop-node`` report every startup failure — bad flags, a config that does not load or
validate, a file missing or unreadable, a certificate or key that does not make a TLS context,
a port in use or not permitted — as ``<program>: <what, naming the setting>: <the fix>`` on
standard error, exit 1, and print no usage text, no traceback and no Python repr.

twistd itself would print its whole usage text before a flag or config error, and a listener
that cannot bind as a traceback into the log. The mechanism is here, once, for both daemons:

- :class:`DaemonMaker` is the plugins' ``IServiceMaker`` (``twisted/plugins/iop_plugins.py``).
  Its :attr:`~DaemonMaker.options` are the tap's ``Options`` whose ``parseOptions`` turns a
  ``UsageError`` into the line (twistd has not begun logging then: it goes to stderr as is);
  its :meth:`~DaemonMaker.makeService` does the same for the tap's own refusals, and installs
  :func:`excepthook`: a listener that cannot bind when the services start raises out of twistd
  (which removes its pid file and tells a daemonizing parent first), and the hook prints it as
  the line naming the setting (the tap's ``listen_settings(options)``: port → setting path).
- The taps word their refusals with :func:`config_problem` (a config that did not load) and
  raise ``UsageError`` as before: their unit tests and callers other than twistd see that.

A failure this module does not know (a bug) keeps its traceback: hiding it would hide the bug.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import IO, Any

from twisted.application.service import IService, IServiceMaker
from twisted.internet.error import CannotListenError
from twisted.plugin import IPlugin
from twisted.python import usage
from twisted.python.reflect import namedAny
from zope.interface import implementer

from iop.config import ConfigError

__all__ = [
    "DaemonMaker",
    "StartupError",
    "config_problem",
    "excepthook",
    "listen_problem",
    "startup_problem",
]


class StartupError(Exception):
    """A daemon cannot start, for a reason its message says (the setting and the fix)."""


def config_problem(what: str, error: ConfigError, path: str | None = None) -> str:
    """
    ``what`` (``invalid config PATH``, ``invalid flags``) with ``error``'s issues: on one line
    when there is one issue, else a line per issue under it (each names its path). A file
    ``path`` that cannot be read at all says so and which flag names it.
    """
    issues = list(error.issues)
    if len(issues) == 1:
        [issue] = issues
        if path is not None and issue.path in (path, os.path.abspath(path)):
            reason = issue.message.removeprefix("cannot read config file: ")
            return f"cannot read config file {path}: {reason} (--config names the file)"
        return f"{what}: {issue}"
    return "\n  ".join([f"{what} ({len(issues)} problems):", *map(str, issues)])


def listen_problem(error: CannotListenError, setting: str | None) -> str:
    """What a listener that could not bind says: its setting, the address, why, the fix."""
    where = f"{error.interface or '0.0.0.0'}:{error.port}"
    name = setting or "a listener"
    reason = error.socketError
    code = getattr(reason, "errno", None)
    if code == errno.EADDRINUSE:
        return (
            f"{name}: {where} is already in use (another Edge, or another program, listens "
            f"there): stop it, or give {name} another port"
        )
    if code == errno.EACCES:
        return (
            f"{name}: permission denied binding {where} (ports below 1024 need root or "
            f"CAP_NET_BIND_SERVICE): choose a port from 1024 up, or grant the capability"
        )
    if code == errno.EADDRNOTAVAIL:
        return (
            f"{name}: {error.interface} is not an address of this host: "
            f"bind one of its addresses, or 0.0.0.0"
        )
    text = getattr(reason, "strerror", None) or str(reason)
    return f"{name}: cannot listen on {where}: {text}"


def _one_line(program: str, message: str) -> str:
    return f"{program}: {message.strip()}"


def _options_for(base: type[usage.Options], program: str) -> type[usage.Options]:
    """``base`` whose parse errors exit with the line instead of twistd's usage text."""

    class Options(base):  # type: ignore[valid-type,misc]
        def parseOptions(self, options: Any = None) -> None:
            try:
                super().parseOptions(options)
            except usage.UsageError as e:
                message = str(e)
                if message.startswith("option ") or "wrong number of arguments" in message:
                    message += f" (twistd {program} --help lists them)"
                raise SystemExit(_one_line(program, message)) from None

    Options.__name__ = base.__name__
    Options.__qualname__ = base.__qualname__
    Options.__module__ = base.__module__
    return Options


def startup_problem(error: BaseException, settings: Mapping[int, str]) -> str | None:
    """What ``error``, raised while the daemon's services started, says to a person (None: an
    error this module does not know, a bug)."""
    if isinstance(error, StartupError):
        return str(error)
    if isinstance(error, CannotListenError):
        return listen_problem(error, settings.get(error.port))
    return None


def excepthook(
    program: str,
    settings: Mapping[int, str],
    previous: Callable[..., None] | None = None,
    out: IO[str] | None = None,
) -> Callable[..., None]:
    """
    A ``sys.excepthook`` printing a startup failure (:func:`startup_problem`, ``settings``: port
    → the setting that names it) as the one line on ``out`` (default: the process's own standard
    error, which twistd has pointed ``sys.stderr`` away from, at its log), and leaving every
    other exception to ``previous`` (default: the hook it replaces).
    """
    chained = previous if previous is not None else sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        message = startup_problem(value, settings)
        if message is None:
            chained(kind, value, tb)
            return
        stream = out if out is not None else sys.__stderr__
        if stream is not None:
            stream.write(_one_line(program, message) + "\n")
            stream.flush()

    return hook


@implementer(IServiceMaker, IPlugin)
class DaemonMaker:
    """
    A twistd plugin over the tap module ``module`` (its ``Options``, ``makeService`` and, when it
    has one, ``listen_settings(options) -> {port: setting}``) whose startup failures are one or
    two lines (module docstring).
    """

    def __init__(self, name: str, module: str, description: str, tapname: str) -> None:
        self.name = name
        self.module = module
        self.description = description
        self.tapname = tapname

    @property
    def options(self) -> type[usage.Options]:
        return _options_for(namedAny(self.module).Options, self.tapname)

    def makeService(self, options: usage.Options) -> IService:
        tap = namedAny(self.module)
        try:
            service: IService = tap.makeService(options)
        except (usage.UsageError, StartupError) as e:
            raise SystemExit(_one_line(self.tapname, str(e))) from None
        settings_of = getattr(tap, "listen_settings", None)
        settings = settings_of(options) if settings_of is not None else {}
        # The services start after this returns, under twistd's logging: a listener that
        # cannot bind propagates out of twistd, whose last stop is this hook.
        sys.excepthook = excepthook(self.tapname, settings)
        return service
