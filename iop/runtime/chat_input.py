# -*- test-case-name: iop.test.runtime.test_chat_input -*-
"""
Interpretation of ``ExecutionSpec.input`` shared by the adapters.

The input is either a plain prompt, or a JSON object in OpenAI chat shape with ``messages`` and
optional ``tools``, ``tool_choice`` and generation options. A plain prompt is one user message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Generation options passed through to chat-style providers when present in a JSON input.
PASSTHROUGH_OPTIONS = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
)


class InputError(ValueError):
    """The run input is JSON-looking but not a valid chat request."""


@dataclass(frozen=True)
class ChatInput:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    def prompt(self) -> str:
        """The text of the last user message (what a CLI agent is asked)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return content_text(message.get("content"))
        return ""


def content_text(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "input_text")
        )
    return ""


def parse_chat_input(raw: str) -> ChatInput:
    stripped = raw.strip()
    if not stripped.startswith("{"):
        return ChatInput(messages=[{"role": "user", "content": raw}])
    try:
        data = json.loads(stripped)
    except ValueError as e:
        raise InputError(f"input is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError("input JSON must be an object")
    return chat_input_from(data)


def chat_input_from(data: Mapping[str, Any]) -> ChatInput:
    """The :class:`ChatInput` of an already decoded chat object (what :func:`parse_chat_input`
    makes of its JSON text)."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError("input JSON needs a non-empty 'messages' list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f"messages[{i}] needs a 'role'")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InputError("'tools' must be a list")
    options = {k: data[k] for k in PASSTHROUGH_OPTIONS if k in data}
    return ChatInput(
        messages=messages, tools=tools, tool_choice=data.get("tool_choice"), options=options
    )
