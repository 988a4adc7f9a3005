# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
One run's JSON messages (NDJSON lines, or the objects of a ``json`` output) → calls on its
:class:`OutputSink`.

:class:`StreamInterpreter` routes each message by its ``type`` to the dialect that owns it
(:mod:`~iop.node.adapters.cli.claude`, :mod:`~iop.node.adapters.cli.codex`,
:mod:`~iop.node.adapters.cli.gemini`) and is the :class:`~iop.node.adapters.cli.dialect.Reporter`
they tell what they read: it keeps what they share (the session id, the one terminal, the notes
kept for a failure reason, how text of successive blocks is joined) and calls the sink.
"""

from __future__ import annotations

from typing import Any, Protocol

from iop.node.adapters.cli.claude import ClaudeDialect
from iop.node.adapters.cli.codex import CodexDialect
from iop.node.adapters.cli.dialect import Handler
from iop.node.adapters.cli.gemini import GeminiDialect
from iop.runtime.events import Usage


class OutputSink(Protocol):
    """What the interpreters report to (the run)."""

    def session(self, session_id: str) -> None: ...

    def text(self, delta: str) -> None: ...

    def reasoning(self, delta: str) -> None: ...

    def complete(self, usage: Usage | None) -> None: ...

    def fail(self, reason: str) -> None:
        """The agent reported a failure (it will exit by itself)."""

    def abort(self, reason: str) -> None:
        """The output is unusable: fail the run and stop the process."""


class StreamInterpreter:
    """
    Claude, Codex and Gemini are told apart by the message types themselves; ``result`` is
    Claude's when it has ``subtype``/``is_error`` and Gemini's when it has ``status``. Unknown
    types are ignored; after a terminal message everything is. Text from successive blocks or
    messages is separated by a blank line.

    ``usage_baseline`` is the last cumulative usage snapshot seen for the session being resumed
    (Codex reports thread totals; see :attr:`cumulative_usage`).
    """

    def __init__(self, sink: OutputSink, usage_baseline: Usage | None = None) -> None:
        self.sink = sink
        self.session_id = ""
        self.finished = False
        self.notes: list[str] = []
        # Old Codex (before 0.44) printed ``{"id", "msg"}`` lines, which this does not read.
        self.legacy = False
        self._last_key: dict[str, object] = {}
        self._text_seen = False
        self._counter = 0
        self._claude = ClaudeDialect(self)
        self._codex = CodexDialect(self, usage_baseline)
        self._gemini = GeminiDialect(self)
        self._handlers: dict[str, Handler] = {
            **self._claude.handlers(),
            **self._codex.handlers(),
            **self._gemini.handlers(),
            "result": self._result,
        }

    @property
    def cumulative_usage(self) -> Usage | None:
        """The last cumulative usage snapshot (Codex), to diff the next one against."""
        return self._codex.cumulative_usage

    @property
    def text_seen(self) -> bool:
        """Whether any answer text was emitted."""
        return self._text_seen

    # -- entry points -------------------------------------------------------------------------

    def feed(self, message: object) -> None:
        if self.finished or not isinstance(message, dict):
            return
        kind = message.get("type")
        if not isinstance(kind, str):
            if "msg" in message:
                self.legacy = True
            return
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(message)

    def feed_json_document(self, document: object) -> None:
        """A whole ``json`` output: a Claude result, a Claude array, or a Gemini object."""
        if isinstance(document, list):
            for message in document:
                self.feed(message)
        elif isinstance(document, dict) and isinstance(document.get("type"), str):
            self.feed(document)
        elif isinstance(document, dict):
            self._gemini.json_document(document)

    def _result(self, message: dict[str, Any]) -> None:
        if "status" in message and "subtype" not in message and "is_error" not in message:
            self._gemini.result(message)
        else:
            self._claude.result(message)

    # -- what the dialects report -------------------------------------------------------------

    def note_session(self, value: object) -> None:
        """A session id the agent named (reported to the sink when it changes)."""
        if isinstance(value, str) and value and value != self.session_id:
            self.session_id = value
            self.sink.session(value)

    def emit_text(self, text: str, key: object, reasoning: bool = False) -> None:
        """
        Answer (or reasoning) text of the block ``key``; text of a new block starts with a
        blank line.
        """
        if not text:
            return
        channel = "reasoning" if reasoning else "text"
        last = self._last_key.get(channel)
        if last is not None and last != key:
            text = "\n\n" + text
        self._last_key[channel] = key
        if reasoning:
            self.sink.reasoning(text)
        else:
            self._text_seen = True
            self.sink.text(text)

    def fresh_key(self) -> int:
        """A block key no other block has."""
        self._counter += 1
        return self._counter

    def complete(self, usage: Usage | None) -> None:
        self.finished = True
        self.sink.complete(usage)

    def fail(self, reason: str) -> None:
        self.finished = True
        self.sink.fail(reason or "the agent reported an error")
