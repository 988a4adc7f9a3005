# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
OpenAI Codex's ``exec --json`` events (0.44 and later): ``thread.started`` (the session),
``item.completed`` (whole agent messages and reasoning; ``error`` items are warnings),
``turn.completed`` / ``turn.failed`` (the terminal) and non-fatal ``error`` events.

Codex reports the thread's cumulative usage, so a resumed session's ``complete`` carries the
difference from the last snapshot this adapter saw (:func:`usage_since`).
"""

from __future__ import annotations

from typing import Any

from iop.formats.usage import token_count
from iop.node.adapters.cli.dialect import Handler, Reporter, as_dict, error_text
from iop.runtime.events import Usage


def codex_usage(raw: object) -> Usage | None:
    usage = as_dict(raw)
    if not usage:
        return None
    return Usage(
        input_tokens=token_count(usage.get("input_tokens")) or 0,
        output_tokens=token_count(usage.get("output_tokens")) or 0,
        reasoning_tokens=token_count(usage.get("reasoning_output_tokens")),
        cached_input_tokens=token_count(usage.get("cached_input_tokens")),
    )


def usage_since(current: Usage, baseline: Usage | None) -> Usage:
    """``current - baseline`` for cumulative counters; ``current`` when it is not cumulative."""
    if baseline is None:
        return current

    def minus(a: int | None, b: int | None) -> int | None:
        if a is None:
            return None
        return a - (b or 0)

    diff = Usage(
        input_tokens=current.input_tokens - baseline.input_tokens,
        output_tokens=current.output_tokens - baseline.output_tokens,
        reasoning_tokens=minus(current.reasoning_tokens, baseline.reasoning_tokens),
        cached_input_tokens=minus(current.cached_input_tokens, baseline.cached_input_tokens),
    )
    counts = (
        diff.input_tokens,
        diff.output_tokens,
        diff.reasoning_tokens or 0,
        diff.cached_input_tokens or 0,
    )
    return current if min(counts) < 0 else diff


class CodexDialect:
    def __init__(self, out: Reporter, usage_baseline: Usage | None) -> None:
        self._out = out
        # The last cumulative usage snapshot, to diff the next one against.
        self.cumulative_usage: Usage | None = usage_baseline

    def handlers(self) -> dict[str, Handler]:
        return {
            "thread.started": self._thread_started,
            "item.completed": self._item_completed,
            "turn.completed": self._turn_completed,
            "turn.failed": self._turn_failed,
            # Codex and Gemini: a non-fatal warning, kept for the reason if no terminal follows.
            "error": self._error,
        }

    def _thread_started(self, message: dict[str, Any]) -> None:
        self._out.note_session(message.get("thread_id"))

    def _item_completed(self, message: dict[str, Any]) -> None:
        item = as_dict(message.get("item"))
        kind = item.get("type", item.get("item_type"))
        text = item.get("text")
        key = ("item", item.get("id", self._out.fresh_key()))
        if kind in ("agent_message", "assistant_message") and isinstance(text, str):
            self._out.emit_text(text, key)
        elif kind == "reasoning" and isinstance(text, str):
            self._out.emit_text(text, key, reasoning=True)
        elif kind == "error":
            self._out.notes.append(error_text(item.get("message")))

    def _turn_completed(self, message: dict[str, Any]) -> None:
        current = codex_usage(message.get("usage"))
        usage = None
        if current is not None:
            usage = usage_since(current, self.cumulative_usage)
            self.cumulative_usage = current
        self._out.complete(usage)

    def _turn_failed(self, message: dict[str, Any]) -> None:
        self._out.fail(error_text(message.get("error")))

    def _error(self, message: dict[str, Any]) -> None:
        note = error_text(message.get("message")) or error_text(message.get("error"))
        if note:
            self._out.notes.append(note)
