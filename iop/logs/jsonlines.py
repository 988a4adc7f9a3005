# -*- test-case-name: iop.test.logs.test_jsonlines -*-
"""
One JSON object per log event, one event per line: what ``logging.format: json`` writes.

:func:`json_line` turns a :mod:`twisted.logger` event into::

    {"time": "2026-12-01T14:41:31.123Z", "level": "info", "namespace": "iop.edge.pool",
     "message": "leased provider a-chat ...", "provider_id": "a-chat", ...}

- ``time`` is RFC 3339 in UTC with milliseconds; ``level`` Twisted's level name (``debug``,
  ``info``, ``warn``, ``error``, ``critical``); ``namespace`` the logger's; ``message`` the event
  formatted as the text log shows it; ``system`` the legacy log context (twisted.web's
  ``HTTPChannel,3,127.0.0.1``) when an event has one.
- Then the event's own keys, flattened: ``run_id``, ``status``, a mapping as ``usage.input_tokens``.
  Twisted's bookkeeping (every ``log_*`` key, and a legacy ``log.msg`` event's ``message``,
  ``time``, ``isError``...) is not repeated. A key named like a reserved field (``message``)
  is written with a trailing ``_``.
- Values are JSON-safe: numbers (NaN and infinities as text), booleans, null and strings as
  they are, lists as lists, anything else as its ``str()`` (which is what the text log shows:
  a :class:`~iop.config.model.Secret` prints as ``Secret('***')``).
- A failure (``log.failure``, legacy ``log.err``) adds ``error`` (``Type: message``) and
  ``traceback`` (the whole traceback, one string).
- No secret: every string written goes through :func:`~iop.security.redact.redact_secrets`
  (after a cheap check that it could hold one at all), and the string value of a key named like
  a credential (``token``, ``api_key``, ``authorization``...) is written as ``[redacted]``.

A line is ASCII (``json.dumps``' escapes), so a message's newlines or exotic line separators
never split it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Mapping
from typing import IO, Any, cast

from twisted.logger import FileLogObserver, LogEvent
from twisted.python.failure import Failure

from iop.logs.text import format_message
from iop.security.redact import REDACTED, redact_secrets

__all__ = ["json_file_observer", "json_line", "json_safe"]

# The fields every line has first; an event key of the same name gets a trailing "_".
RESERVED = frozenset({"time", "level", "namespace", "message", "system", "error", "traceback"})
# The keys a legacy ``twisted.python.log.msg``/``err`` event carries for its own machinery.
_LEGACY_KEYS = frozenset(
    {"message", "time", "isError", "system", "failure", "why", "format", "printed", "logLevel"}
)
# How deep nested mappings and lists are followed before a value is written as its str().
_MAX_DEPTH = 4
# A key whose string value is a credential by its name alone.
_CREDENTIAL_KEY = re.compile(
    r"(?:^|[_.-])(?:api_?key|token|secret|password|passwd|authorization|cookie|private_key)"
    r"(?:$|[_.-])",
    re.IGNORECASE,
)
# Lowercase fragments one of which every pattern of redact_secrets needs: a string with none
# of them is left as it is without running the (much slower) patterns.
_SECRET_HINTS = (
    "bearer",
    "basic",
    "digest",
    "token",
    "key",
    "secret",
    "passw",
    "auth",
    "cookie",
    "sk-",
    "sk_",
    "rk-",
    "rk_",
    "pk-",
    "pk_",
)


def redact(text: str) -> str:
    """``text`` through :func:`redact_secrets` when it could hold a credential at all."""
    if len(text) <= _SHORT:
        return _redact_short(text)
    return _redact(text)


def _redact(text: str) -> str:
    lowered = text.lower()
    for hint in _SECRET_HINTS:
        if hint in lowered:
            return redact_secrets(text)
    return text


# Short values (ids, names, models) repeat from event to event: their answer is remembered.
_SHORT = 64
_redact_short = functools.lru_cache(maxsize=4096)(_redact)


@functools.lru_cache(maxsize=1024)
def _credential_key(key: str) -> bool:
    """Whether a key's string value is a credential by the key's name alone."""
    return _CREDENTIAL_KEY.search(key) is not None


class _Clock:
    """RFC 3339 UTC timestamps, the date-and-second part formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def format(self, when: float) -> str:
        second = math.floor(when)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        millis = min(int((when - second) * 1000), 999)
        return f"{self._prefix}.{millis:03d}Z"


_clock = _Clock()


def json_safe(value: object, depth: int = 0) -> object:
    """``value`` as JSON can hold it (see the module docstring); strings redacted."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes):
        return redact(value.decode("utf-8", "backslashreplace"))
    if depth < _MAX_DEPTH:
        if isinstance(value, Mapping):
            flat: dict[str, object] = {}
            _flatten(flat, "", value, depth + 1)
            return flat
        if isinstance(value, list | tuple | set | frozenset):
            return [json_safe(item, depth + 1) for item in value]
    if isinstance(value, Failure):
        return redact(_error_text(value))
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return redact(_text(value))


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<unprintable {type(value).__name__}>"


def _error_text(failure: Failure) -> str:
    kind = getattr(failure.type, "__name__", _text(failure.type))
    return f"{kind}: {_text(failure.value)}"


def _put(out: dict[str, object], key: str, value: object, depth: int) -> None:
    kind = type(value)
    if kind is str:
        out[key] = REDACTED if _credential_key(key) else redact(cast(str, value))
    elif kind is int or kind is bool or value is None:
        out[key] = value
    elif isinstance(value, str) and _credential_key(key):
        out[key] = REDACTED
    elif isinstance(value, Mapping) and depth < _MAX_DEPTH:
        _flatten(out, f"{key}.", value, depth + 1)
    else:
        out[key] = json_safe(value, depth)


def _flatten(out: dict[str, object], prefix: str, mapping: Mapping[Any, Any], depth: int) -> None:
    for key, value in mapping.items():
        _put(out, f"{prefix}{key if isinstance(key, str) else _text(key)}", value, depth)


def _failure(event: LogEvent) -> Failure | None:
    failure = event.get("log_failure")
    if failure is None and event.get("isError") and "message" in event:
        failure = event.get("failure")
    return failure if isinstance(failure, Failure) else None


def json_fields(event: LogEvent) -> dict[str, object]:
    """The object :func:`json_line` writes for ``event``, before encoding."""
    when = event.get("log_time")
    level = getattr(event.get("log_level"), "name", None)
    legacy = "isError" in event and "message" in event
    failure = _failure(event)
    if legacy and failure is not None:
        # A legacy log.err's text is its "why" and the whole traceback: the traceback has its
        # own field here.
        message = _text(event.get("why") or "Unhandled Error")
    else:
        message = format_message(event)
    fields: dict[str, object] = {
        "time": _clock.format(when if isinstance(when, int | float) else time.time()),
        "level": level if isinstance(level, str) else "info",
        "namespace": _text(event.get("log_namespace", "-")),
        "message": redact(message),
    }
    system = event.get("log_system")
    if system is not None and system != "-":
        fields["system"] = redact(_text(system))
    for key, value in event.items():
        if not isinstance(key, str) or key.startswith("log_"):
            continue
        if legacy and key in _LEGACY_KEYS:
            continue
        _put(fields, f"{key}_" if key in RESERVED else key, value, 1)
    if failure is not None:
        fields["error"] = redact(_error_text(failure))
        try:
            traceback = failure.getTraceback()
        except Exception:
            traceback = "(the traceback could not be formatted)"
        fields["traceback"] = redact(traceback)
    return fields


def json_line(event: LogEvent) -> str:
    """``event`` as one line of JSON, with its newline."""
    try:
        return json.dumps(json_fields(event), allow_nan=False) + "\n"
    except Exception as e:  # a last resort: the line is still one JSON object
        return (
            json.dumps(
                {
                    "time": _clock.format(time.time()),
                    "level": "error",
                    "namespace": "iop.logs",
                    "message": f"could not write a log event as JSON: {type(e).__name__}",
                }
            )
            + "\n"
        )


def json_file_observer(out_file: IO[Any]) -> FileLogObserver:
    """An observer writing :func:`json_line` of every event to ``out_file``."""
    return FileLogObserver(out_file, json_line)
