# -*- test-case-name: iop.test.formats.test_sse -*-
"""
An incremental Server-Sent Events parser: bytes in, events out.

It follows the WHATWG event-stream rules: lines end in ``\\r\\n``, ``\\n`` or ``\\r`` (a ``\\r`` at
the end of one chunk waits to see whether ``\\n`` follows); ``:`` lines are comments; ``data:``
lines accumulate (joined by ``\\n``) until a blank line dispatches the event; one space after the
colon is dropped; a leading byte-order mark is ignored. Bytes may be split anywhere, including
inside a UTF-8 sequence: only complete lines are decoded.

``SSEParser.feed`` returns the events completed by a chunk; ``SSEParser.finish`` is called at end
of stream and returns a final event whose lines were complete but whose blank line never came
(a server that closes right after ``data: [DONE]\\n``). An unterminated last line is dropped, as
the standard says.

The other direction: :func:`format_event` writes one event whose data is a JSON value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"

# A line (or an event's accumulated data) larger than this is a broken or hostile upstream.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024


def format_event(data: Any, event: str = "") -> bytes:
    """
    One event as bytes: ``event: <event>`` (when named), ``data: <compact JSON>`` (non-ASCII
    kept as UTF-8; JSON never spans lines) and the blank line that dispatches it.
    """
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class SSEError(ValueError):
    """The stream cannot be parsed (for now: a line or event beyond the size limit)."""


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event. ``event`` is empty when the stream named no type ("message")."""

    data: str
    event: str = ""
    id: str | None = None
    retry: int | None = None

    @property
    def is_done(self) -> bool:
        """The OpenAI end-of-stream sentinel, ``data: [DONE]``."""
        return self.data.strip() == DONE


class SSEParser:
    """Feed it bytes as they arrive; it hands back whole events."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_event_bytes = max_event_bytes
        self._buffer = b""
        self._started = False
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._pending = False  # a field line arrived since the last dispatch

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk``; return the events it completed, in order."""
        events: list[SSEEvent] = []
        buffer = self._buffer + chunk
        if not self._started and buffer:
            if len(buffer) < 3 and b"\xef\xbb\xbf".startswith(buffer):
                self._buffer = buffer
                return events
            if buffer.startswith(b"\xef\xbb\xbf"):
                buffer = buffer[3:]
            self._started = True
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == length:
                    # "\r" at the very end: it may be the first half of "\r\n".
                    break
                end, next_start = cr, cr + 2 if buffer[cr + 1 : cr + 2] == b"\n" else cr + 1
            else:
                end, next_start = lf, lf + 1
            event = self._line(buffer[start:end])
            if event is not None:
                events.append(event)
            start = next_start
        self._buffer = buffer[start:]
        if len(self._buffer) > self._max_event_bytes:
            raise SSEError(f"SSE line longer than {self._max_event_bytes} bytes")
        return events

    def finish(self) -> list[SSEEvent]:
        """
        End of stream. A trailing ``\\r`` ends its line; a final event that never got its blank
        line is dispatched; an unterminated last line is discarded.
        """
        events: list[SSEEvent] = []
        if self._buffer.endswith(b"\r"):
            event = self._line(self._buffer[:-1])
            if event is not None:
                events.append(event)
        self._buffer = b""
        if self._pending:
            event = self._dispatch()
            if event is not None:
                events.append(event)
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            return self._dispatch()
        if raw.startswith(b":"):
            return None  # a comment (keep-alive)
        line = raw.decode("utf-8", errors="replace")
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        self._pending = True
        if name == "data":
            self._data_size += len(value) + 1
            if self._data_size > self._max_event_bytes:
                raise SSEError(f"SSE event larger than {self._max_event_bytes} bytes")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
        # Any other field name is ignored, as the standard says.
        return None

    def _dispatch(self) -> SSEEvent | None:
        self._pending = False
        data, event = self._data, self._event
        self._data, self._data_size, self._event = [], 0, ""
        if not data:
            return None
        return SSEEvent(data="\n".join(data), event=event, id=self._id, retry=self._retry)
