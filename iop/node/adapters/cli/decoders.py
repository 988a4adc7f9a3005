# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
An agent's stdout, by ``output_format``: ``text`` (every chunk a delta), ``json`` (one document
at exit) and ``stream-json`` (NDJSON, read leniently). The JSON ones hand each message to the
run's :class:`~iop.node.adapters.cli.interpreter.StreamInterpreter`.
"""

from __future__ import annotations

import codecs
import json
from typing import Protocol

from iop.formats.ndjson import LineFramer
from iop.node.adapters.cli.interpreter import OutputSink, StreamInterpreter


class OutputDecoder(Protocol):
    """Turns one output format's stdout into sink calls."""

    def feed(self, data: bytes) -> None: ...

    def finish(self, exit_code: int | None) -> None:
        """stdout ended; ``exit_code`` is None when the process died of a signal."""


class TextDecoder:
    """``text``: every chunk is a delta (trailing newlines held back); exit 0 completes."""

    def __init__(self, sink: OutputSink) -> None:
        self.sink = sink
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held_newlines = ""

    def feed(self, data: bytes) -> None:
        self._text(self._decoder.decode(data))

    def _text(self, text: str) -> None:
        if not text:
            return
        text = self._held_newlines + text
        body = text.rstrip("\r\n")
        self._held_newlines = text[len(body) :]
        if body:
            self.sink.text(body)

    def finish(self, exit_code: int | None) -> None:
        self._text(self._decoder.decode(b"", final=True))
        if exit_code == 0:
            self.sink.complete(None)


class JsonDecoder:
    """``json``: the whole stdout is one JSON document, read at exit."""

    def __init__(self, interpreter: StreamInterpreter, max_bytes: int, sink: OutputSink) -> None:
        self.interpreter = interpreter
        self.max_bytes = max_bytes
        self.sink = sink
        self._buffer = bytearray()
        self._overflowed = False

    def feed(self, data: bytes) -> None:
        if self._overflowed:
            return
        self._buffer += data
        if len(self._buffer) > self.max_bytes:
            self._overflowed = True
            self._buffer.clear()
            self.sink.abort(f"agent output exceeds {self.max_bytes} bytes")

    def finish(self, exit_code: int | None) -> None:
        if self._overflowed:
            return
        raw = bytes(self._buffer).strip()
        if not raw:
            return
        try:
            document = json.loads(raw)
        except ValueError:
            # Some CLIs print log lines before the document; try its last line alone.
            try:
                document = json.loads(raw.rsplit(b"\n", 1)[-1])
            except ValueError:
                self.interpreter.notes.append("agent output is not valid JSON")
                return
        self.interpreter.feed_json_document(document)


class StreamJsonDecoder:
    """
    ``stream-json``: NDJSON, read leniently: lines not starting with ``{`` and lines that are not
    JSON are skipped (agents print log lines); a line over ``max_bytes`` aborts the run.
    """

    def __init__(self, interpreter: StreamInterpreter, max_bytes: int, sink: OutputSink) -> None:
        self.interpreter = interpreter
        self.sink = sink
        self.framer = LineFramer(max_bytes)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"{"):
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        self.interpreter.feed(message)

    def feed(self, data: bytes) -> None:
        if self.framer.overflow is not None:
            return
        for line in self.framer.feed(data):
            self._line(line)
        if self.framer.overflow is not None:
            self.sink.abort(f"agent output line exceeds {self.framer.max_line_length} bytes")

    def finish(self, exit_code: int | None) -> None:
        line = self.framer.finish()
        if line:
            self._line(line)
