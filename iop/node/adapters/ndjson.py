# -*- test-case-name: iop.test.node.adapters.test_ndjson -*-
"""
An incremental NDJSON (newline-delimited JSON) framer: bytes in, one parsed JSON value per line out.

Bytes may arrive split anywhere, even inside a UTF-8 sequence. Lines end with ``\\n`` (a ``\\r``
before it is dropped); blank lines are skipped. A line longer than ``max_line_length`` bytes, or a
line that is not UTF-8 JSON, raises :class:`NDJSONError` and leaves the decoder failed: a stream
that went wrong once is not resynchronised.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

DEFAULT_MAX_LINE_LENGTH = 1024 * 1024


class NDJSONError(ValueError):
    """The stream is not valid NDJSON. The message names the line and never quotes it whole."""


class LineTooLong(NDJSONError):
    """A line exceeded the decoder's ``max_line_length``."""


class NDJSONDecoder:
    """
    Feed bytes with :meth:`feed`; each call returns the values of the lines it completed. At the
    end of the stream call :meth:`finish` for a last line that had no newline.
    """

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> None:
        if max_line_length <= 0:
            raise ValueError("max_line_length must be positive")
        self.max_line_length = max_line_length
        self._buffer = bytearray()
        # Where to resume looking for a newline: the buffer before it has none.
        self._scanned = 0
        self._line_number = 0
        self._failed: NDJSONError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held back."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Any]:
        self._check()
        self._buffer += data
        values: list[Any] = []
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(self._buffer)
                if self._scanned > self.max_line_length:
                    self._fail(
                        LineTooLong(
                            f"NDJSON line {self._line_number + 1} exceeds "
                            f"{self.max_line_length} bytes"
                        )
                    )
                return values
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            self._scanned = 0
            value = self._line(line)
            if value is not _BLANK:
                values.append(value)

    def finish(self) -> list[Any]:
        """End of stream: the value of a trailing unterminated line, if there is one."""
        self._check()
        line = bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        value = self._line(line)
        return [] if value is _BLANK else [value]

    def _line(self, line: bytes) -> Any:
        self._line_number += 1
        if len(line) > self.max_line_length:
            self._fail(
                LineTooLong(f"NDJSON line {self._line_number} exceeds {self.max_line_length} bytes")
            )
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
        self._buffer.clear()
        raise error


_BLANK = object()
