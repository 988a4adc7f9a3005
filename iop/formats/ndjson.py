# -*- test-case-name: iop.test.formats.test_ndjson -*-
"""
Newline-delimited streams, incrementally: bytes in, lines (:class:`LineFramer`) or one parsed
JSON value per line (:class:`NDJSONDecoder`) out.

Bytes may arrive split anywhere, even inside a UTF-8 sequence: only complete lines are handed
on. Lines end with ``\\n``. A line longer than ``max_line_length`` bytes ends the stream with
:class:`LineTooLong`: a stream that went wrong once is not resynchronised.

:class:`NDJSONDecoder` is the strict reader (Ollama's ``/api/chat``): a ``\\r`` before the newline
is dropped, blank lines are skipped, and a line that is not UTF-8 JSON raises
:class:`NDJSONError`. A lenient reader (a CLI agent's ``stream-json`` stdout, where stray log
lines are skipped) frames with :class:`LineFramer` and parses what it wants itself.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

DEFAULT_MAX_LINE_LENGTH = 1024 * 1024


class NDJSONError(ValueError):
    """The stream is not valid NDJSON. The message names the line and never quotes it whole."""


class LineTooLong(NDJSONError):
    """A line exceeded the framer's ``max_line_length``."""


class LineFramer:
    """
    Feed bytes with :meth:`feed`; each call returns the lines it completed (without their
    ``\\n``), in order. At the end of the stream :meth:`finish` returns a last line that had no
    newline.

    A line over ``max_line_length`` ends framing: :meth:`feed` still returns the complete lines
    before it, then :attr:`overflow` holds the :class:`LineTooLong` (naming the line by number),
    the buffer is dropped and every later call returns nothing.
    """

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> None:
        if max_line_length <= 0:
            raise ValueError("max_line_length must be positive")
        self.max_line_length = max_line_length
        self.overflow: LineTooLong | None = None
        self._buffer = bytearray()
        # Where to resume looking for a newline: the buffer before it has none.
        self._scanned = 0
        self._lines = 0

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held back."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        if self.overflow is not None:
            return lines
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(self._buffer)
                if self._scanned > self.max_line_length:
                    self._overflow()
                return lines
            if newline > self.max_line_length:
                self._overflow()
                return lines
            lines.append(bytes(self._buffer[:newline]))
            del self._buffer[: newline + 1]
            self._scanned = 0
            self._lines += 1

    def finish(self) -> bytes:
        """End of stream: a trailing unterminated line (``b""`` when there is none)."""
        line = bytes(self._buffer)
        self.clear()
        if line:
            self._lines += 1
        return line

    def clear(self) -> None:
        """Drop whatever is buffered."""
        self._buffer.clear()
        self._scanned = 0

    def _overflow(self) -> None:
        self.overflow = LineTooLong(
            f"NDJSON line {self._lines + 1} exceeds {self.max_line_length} bytes"
        )
        self.clear()


class NDJSONDecoder:
    """
    Feed bytes with :meth:`feed`; each call returns the values of the lines it completed. At the
    end of the stream call :meth:`finish` for a last line that had no newline.
    """

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> None:
        self._framer = LineFramer(max_line_length)
        self._line_number = 0
        self._failed: NDJSONError | None = None

    @property
    def max_line_length(self) -> int:
        return self._framer.max_line_length

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held back."""
        return self._framer.buffered

    def feed(self, data: bytes) -> list[Any]:
        self._check()
        values: list[Any] = []
        for line in self._framer.feed(data):
            value = self._line(line)
            if value is not _BLANK:
                values.append(value)
        if self._framer.overflow is not None:
            self._fail(self._framer.overflow)
        return values

    def finish(self) -> list[Any]:
        """End of stream: the value of a trailing unterminated line, if there is one."""
        self._check()
        value = self._line(self._framer.finish())
        return [] if value is _BLANK else [value]

    def _line(self, line: bytes) -> Any:
        self._line_number += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return _BLANK
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            self._fail(NDJSONError(f"NDJSON line {self._line_number} is not UTF-8: {e.reason}"))
        try:
            return json.loads(text)
        except ValueError as e:
            self._fail(NDJSONError(f"NDJSON line {self._line_number} is not JSON: {e}"))

    def _check(self) -> None:
        if self._failed is not None:
            raise NDJSONError(f"NDJSON stream already failed: {self._failed}")

    def _fail(self, error: NDJSONError) -> NoReturn:
        self._failed = error
        self._framer.clear()
        raise error


_BLANK = object()
