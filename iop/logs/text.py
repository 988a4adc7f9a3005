# -*- test-case-name: iop.test.logs.test_text -*-
"""
Twisted's text log lines, written for less: what ``logging.format: text`` writes.

A line is exactly what :func:`twisted.logger.formatEventAsClassicLogText` makes of the event
(``2026-12-01T14:41:31+0000 [iop.edge.access#info] openai chat ...``), so operators, tests and
tools that read twistd's log see no difference. Twisted formats each message with a
pure-Python :class:`string.Formatter` and each timestamp through ``datetime``; on a gateway that
writes a line per request that was several percent of a core. Here:

- a message's ``log_format`` is parsed once (a bounded cache) into literals and fields; a field
  that is a plain key, with an optional ``!r``/``!s``/``!a`` conversion and a format spec, is
  filled with ``format(event[key], spec)`` — what ``str.format`` does;
- anything else (attribute or index access, Twisted's ``{name()}`` calls, a missing key, a
  flattened or legacy event, a failure, a format that is not text) goes through Twisted's own
  functions, so it formats exactly as it always has;
- the timestamp is formatted once per second (it has second resolution).

:func:`format_message` is also the JSON lines' ``message``.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import IO, Any

from twisted.logger import FileLogObserver, LogEvent, formatEvent, formatTime
from twisted.logger import formatEventAsClassicLogText as _twisted_line

__all__ = ["format_message", "text_file_observer", "text_line"]

# (literal, key, spec, conversion) per part; key None: the format's trailing literal.
_Part = tuple[str, str | None, str, str | None]
_FORMATTER = string.Formatter()
_CONVERSIONS: dict[str, Callable[[object], str]] = {"r": repr, "s": str, "a": ascii}


@functools.lru_cache(maxsize=1024)
def _compiled(log_format: str) -> tuple[_Part, ...] | None:
    """The parts of ``log_format``, or None when it needs Twisted's formatter."""
    try:
        parsed = list(_FORMATTER.parse(log_format))
    except ValueError:
        return None
    parts: list[_Part] = []
    for literal, key, spec, conversion in parsed:
        if key is not None:
            if not key.isidentifier() or "{" in (spec or ""):
                return None
            if conversion is not None and conversion not in _CONVERSIONS:
                return None
        parts.append((literal, key, spec or "", conversion))
    return tuple(parts)


def format_message(event: LogEvent) -> str:
    """The event's message, as :func:`twisted.logger.formatEvent` makes it."""
    log_format = event.get("log_format")
    if "log_flattened" in event or not isinstance(log_format, str):
        return formatEvent(event)
    parts = _compiled(log_format)
    if parts is None:
        return formatEvent(event)
    out: list[str] = []
    try:
        for literal, key, spec, conversion in parts:
            out.append(literal)
            if key is None:
                continue
            value = event[key]
            if conversion is not None:
                value = _CONVERSIONS[conversion](value)
            out.append(format(value, spec))
    except Exception:
        # Twisted says why the event could not be formatted, its own way.
        return formatEvent(event)
    return "".join(out)


class _Stamp:
    """Twisted's default timestamp of a time, formatted once per second."""

    def __init__(self) -> None:
        self._second: int | None = None
        self._text = ""

    def format(self, when: float) -> str:
        second = int(when)
        if second != self._second:
            self._text = formatTime(second)
            self._second = second
        return self._text


_stamp = _Stamp()


def text_line(event: LogEvent) -> str | None:
    """``event`` as twistd's text log line (with its newline), or None for an empty event."""
    when = event.get("log_time")
    if "log_failure" in event or not isinstance(when, int | float) or when != when:
        return _twisted_line(event)
    text = format_message(event)
    if not text:
        return None
    system = event.get("log_system")
    if system is None:
        level = event.get("log_level")
        system = f"{event.get('log_namespace', '-')}#{level.name if level is not None else '-'}"
    elif not isinstance(system, str):
        return _twisted_line(event)
    line = f"{_stamp.format(when)} [{system}] {text}"
    return line.replace("\n", "\n\t") + "\n"


def text_file_observer(out_file: IO[Any]) -> FileLogObserver:
    """An observer writing :func:`text_line` of every event to ``out_file``."""
    return FileLogObserver(out_file, text_line)
