# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
Gemini CLI's output: ``stream-json`` events (``init`` names the session, ``message`` deltas,
``tool_use`` / ``tool_result``, ``result`` with ``status`` and ``stats``) and the ``json``
document (``{session_id, response, stats: {models: {...: {tokens}}}, error?}``).
"""

from __future__ import annotations

from typing import Any

from iop.formats.usage import token_count
from iop.node.adapters.cli.dialect import Handler, Reporter, as_dict, error_text
from iop.runtime.events import Usage


def gemini_stream_usage(raw: object) -> Usage | None:
    stats = as_dict(raw)
    if not stats:
        return None
    return Usage(
        input_tokens=token_count(stats.get("input_tokens")) or 0,
        output_tokens=token_count(stats.get("output_tokens")) or 0,
        cached_input_tokens=token_count(stats.get("cached")),
    )


def gemini_json_usage(raw: object) -> Usage | None:
    """Gemini ``json`` ``stats.models.*.tokens`` summed over models."""
    models = as_dict(as_dict(raw).get("models"))
    if not models:
        return None
    totals: dict[str, int | None] = {"prompt": 0, "candidates": 0, "cached": None, "thoughts": None}
    for model in models.values():
        tokens = as_dict(as_dict(model).get("tokens"))
        for key in totals:
            value = token_count(tokens.get(key))
            if value is not None:
                totals[key] = (totals[key] or 0) + value
    return Usage(
        input_tokens=totals["prompt"] or 0,
        output_tokens=totals["candidates"] or 0,
        reasoning_tokens=totals["thoughts"],
        cached_input_tokens=totals["cached"],
    )


class GeminiDialect:
    def __init__(self, out: Reporter) -> None:
        self._out = out
        self._turn = 0

    def handlers(self) -> dict[str, Handler]:
        return {
            "init": self._init,
            "message": self._message,
            "tool_use": self._tool,
            "tool_result": self._tool,
        }

    def _init(self, message: dict[str, Any]) -> None:
        self._out.note_session(message.get("session_id"))

    def _message(self, message: dict[str, Any]) -> None:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str):
            # Deltas of one reply share a key; a whole (non-delta) message is its own block.
            turn = self._turn if message.get("delta") else self._out.fresh_key()
            self._out.emit_text(content, ("gemini", turn))

    def _tool(self, message: dict[str, Any]) -> None:
        # Text after a tool call belongs to a new block.
        self._turn = self._out.fresh_key()

    def result(self, message: dict[str, Any]) -> None:
        self._out.note_session(message.get("session_id"))
        if message.get("status") == "success":
            self._out.complete(gemini_stream_usage(message.get("stats")))
        else:
            reason = error_text(message.get("error")) or f"status {message.get('status')}"
            self._out.fail(reason)

    def json_document(self, document: dict[str, Any]) -> None:
        self._out.note_session(document.get("session_id"))
        error = document.get("error")
        if error:
            self._out.fail(error_text(error))
            return
        response = document.get("response")
        if isinstance(response, str):
            self._out.emit_text(response, ("response",))
        self._out.complete(gemini_json_usage(document.get("stats")))
