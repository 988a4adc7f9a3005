# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
Claude Code's ``stream-json`` / ``json`` messages: ``system`` (``init`` names the session),
``stream_event`` (raw Messages-API deltas), ``assistant`` (whole content blocks) and ``result``.

Whole ``assistant`` blocks are used only for blocks that streamed no deltas (keyed by message id
and running block index: Claude prints one ``assistant`` line per block, same id), and messages
of sub-agents (``parent_tool_use_id`` set) are not part of the answer. ``is_error`` wins over
``subtype`` (an API error can end ``success`` with ``is_error: true``).
"""

from __future__ import annotations

from typing import Any

from iop.formats.usage import anthropic_usage
from iop.node.adapters.cli.dialect import Handler, Reporter, as_dict, error_text
from iop.runtime.events import Usage


def claude_usage(raw: object) -> Usage | None:
    """Claude ``usage`` (Anthropic's shape): cache reads and writes are part of the input."""
    usage = as_dict(raw)
    return anthropic_usage(usage) if usage else None


def _index(value: object) -> int:
    """A content block index (0 when absent or not a non-negative integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class ClaudeDialect:
    def __init__(self, out: Reporter) -> None:
        self._out = out
        self._stream_message_id = ""
        self._streamed: set[tuple[str, int]] = set()
        self._assistant_blocks: dict[str, int] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "system": self._system,
            "stream_event": self._stream_event,
            "assistant": self._assistant,
        }

    def _system(self, message: dict[str, Any]) -> None:
        if message.get("subtype") == "init":
            self._out.note_session(message.get("session_id"))

    def _stream_event(self, message: dict[str, Any]) -> None:
        if message.get("parent_tool_use_id"):
            return
        event = as_dict(message.get("event"))
        kind = event.get("type")
        if kind == "message_start":
            message_id = as_dict(event.get("message")).get("id")
            self._stream_message_id = message_id if isinstance(message_id, str) else ""
        elif kind == "content_block_delta":
            index = _index(event.get("index"))
            delta = as_dict(event.get("delta"))
            key = (self._stream_message_id, index)
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self._streamed.add(key)
                self._out.emit_text(delta["text"], key)
            elif delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
                self._streamed.add(key)
                self._out.emit_text(delta["thinking"], key, reasoning=True)

    def _assistant(self, message: dict[str, Any]) -> None:
        if message.get("parent_tool_use_id"):
            return
        body = as_dict(message.get("message"))
        error = message.get("error")
        if isinstance(error, str) and error:
            self._out.notes.append(error)
        raw_id = body.get("id")
        message_id = raw_id if isinstance(raw_id, str) else ""
        content = body.get("content")
        if not isinstance(content, list):
            return
        for block in content:
            index = self._assistant_blocks.get(message_id, 0)
            self._assistant_blocks[message_id] = index + 1
            key = (message_id, index)
            if key in self._streamed:
                continue
            if ("", index) in self._streamed:  # streamed without a message_start to name it
                self._streamed.discard(("", index))
                continue
            block = as_dict(block)
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                self._out.emit_text(block["text"], key)
            elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
                self._out.emit_text(block["thinking"], key, reasoning=True)

    def result(self, message: dict[str, Any]) -> None:
        out = self._out
        out.note_session(message.get("session_id"))
        subtype = message.get("subtype")
        if message.get("is_error") is True or (
            isinstance(subtype, str) and subtype not in ("", "success")
        ):
            errors = message.get("errors")
            parts = [error_text(e) for e in errors] if isinstance(errors, list) else []
            reason = "; ".join(p for p in parts if p)
            if not reason and isinstance(message.get("result"), str):
                reason = message["result"]
            if not reason:
                reason = subtype if isinstance(subtype, str) and subtype else "error"
            status = message.get("api_error_status")
            if status is not None:
                reason = f"{reason} (api_error_status {status})"
            out.fail(reason)
            return
        result = message.get("result")
        if not out.text_seen and isinstance(result, str):
            out.emit_text(result, ("result",))
        out.complete(claude_usage(message.get("usage")))
