# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
What an agent dialect (:mod:`~iop.node.adapters.cli.claude`, :mod:`~iop.node.adapters.cli.codex`,
:mod:`~iop.node.adapters.cli.gemini`) is given: the :class:`Reporter` it tells what it read (the
run's :class:`~iop.node.adapters.cli.interpreter.StreamInterpreter`), and the helpers for reading
agent JSON leniently.

A dialect offers ``handlers()``: the message ``type`` values it owns, each with its handler.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from iop.runtime.events import Usage

Handler = Callable[[dict[str, Any]], None]


class Reporter(Protocol):
    """What the dialects report to; it keeps the state they share."""

    # Reasons kept for a failure that ends without a terminal message.
    notes: list[str]

    @property
    def text_seen(self) -> bool:
        """Whether any answer text was emitted."""

    def note_session(self, value: object) -> None:
        """A session id the agent named (ignored unless a non-empty string)."""

    def emit_text(self, text: str, key: object, reasoning: bool = False) -> None:
        """Text of the block ``key`` (a new block's text starts with a blank line)."""

    def fresh_key(self) -> int:
        """A block key no other block has."""

    def complete(self, usage: Usage | None) -> None:
        """The agent's terminal: success."""

    def fail(self, reason: str) -> None:
        """The agent's terminal: failure."""


def as_dict(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def error_text(value: object) -> str:
    """The text of an agent's error value: a string, or an object's message/error/type."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("message", "error", "type"):
            text = value.get(key)
            if isinstance(text, str) and text:
                return text
        return json.dumps(value, sort_keys=True)[:500]
    return ""
