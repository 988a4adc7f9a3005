# -*- test-case-name: iop.test.edge.ingress.test_tools -*-
"""
Tool calls written as text, for the node's text-tool fallback.

When a backend rejects native tools, the node's ``openai_compat`` adapter retries with an
instruction asking for a reply of exactly this shape
(:data:`iop.node.adapters.openai_compat.TEXT_TOOL_REPLY_SHAPE`)::

    {"tool_calls":[{"name":"<tool name>","arguments":{<arguments>}}]}

and flags its ``complete`` event with ``metadata["openai_text_tool_fallback"] = "true"``. Only then
may a client surface look for tool calls in the text; :func:`parse_text_tool_calls` does that for
both the OpenAI and the Anthropic surface.

What is accepted: the first JSON object in the text whose ``tool_calls`` is a non-empty list of
calls, each ``{"name": str, "arguments": object | JSON string}`` (or the OpenAI
``{"function": {"name", "arguments"}}`` form, which models sometimes echo back). The object may
stand alone, sit inside a Markdown fence (```` ```json ```` … ```` ``` ````) or follow a sentence.
A malformed candidate (bad JSON, a call without a name, arguments that are not an object) makes
the whole candidate plain text: it is never half-parsed.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

__all__ = ["new_call_id", "parse_text_tool_calls", "tool_call_marker_state"]

_ID_ALPHABET = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()
# A Markdown fence around a candidate: ```json\n{...}\n``` (language tag optional).
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n?(?P<body>.*?)\r?\n?[ \t]*```", re.DOTALL)
_KEY = '"tool_calls"'


def new_call_id(prefix: str = "call_") -> str:
    """A fresh, unguessable tool-call id: ``prefix`` and 24 letters/digits."""
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def _arguments(value: Any) -> str | None:
    """Arguments as a JSON object text, or None when they are not an object."""
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        if not value.strip():
            return "{}"
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return value if isinstance(parsed, dict) else None
    return None


def _calls(candidate: Any) -> list[dict[str, Any]] | None:
    """The OpenAI-shaped tool calls of one decoded object, or None when it is not one."""
    if not isinstance(candidate, dict):
        return None
    raw = candidate.get("tool_calls")
    if not isinstance(raw, list) or not raw:
        return None
    calls: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, dict):
            return None
        function = item.get("function")
        source = function if isinstance(function, dict) else item
        name = source.get("name")
        if not isinstance(name, str) or not name.strip():
            return None
        arguments = _arguments(source.get("arguments", source.get("input")))
        if arguments is None:
            return None
        call_id = item.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) and call_id else new_call_id(),
                "type": "function",
                "function": {"name": name.strip(), "arguments": arguments},
            }
        )
    return calls


def _join(before: str, after: str) -> str:
    before, after = before.rstrip(), after.lstrip()
    if before and after:
        return f"{before}\n\n{after}"
    return before or after


def parse_text_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """
    Find a ``{"tool_calls": [...]}`` reply in ``text``.

    Returns ``(remaining text, tool_calls)``: the calls in OpenAI ``message.tool_calls`` shape
    (``{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}``, ids made up
    when the text gave none) and the text with the JSON object (and its fence) removed and
    stripped. Without a valid candidate: ``(text, [])``, the text untouched.
    """
    if _KEY not in text:
        return text, []
    # A fenced candidate first: the fence goes with it.
    for match in _FENCE.finditer(text):
        body = match.group("body").strip()
        if not body.startswith("{"):
            continue
        try:
            decoded, end = _DECODER.raw_decode(body)
        except ValueError:
            continue
        calls = _calls(decoded)
        if calls is not None and not body[end:].strip():
            return _join(text[: match.start()], text[match.end() :]), calls
    # Then any object in the text, earliest first.
    position = text.find("{")
    while position != -1:
        try:
            decoded, end = _DECODER.raw_decode(text, position)
        except ValueError:
            decoded, end = None, position + 1
        calls = _calls(decoded)
        if calls is not None:
            return _join(text[:position], text[end:]), calls
        position = text.find("{", position + 1)
    return text, []


# -- streaming hold-back ----------------------------------------------------------------------

MARKER_NO = "no"
MARKER_PARTIAL = "partial"
MARKER_MATCH = "match"


def tool_call_marker_state(text: str) -> str:
    """
    Whether ``text`` (starting at a ``{`` or a backtick) opens a text tool call.

    :data:`MARKER_MATCH` when it begins with ``{"tool_calls"`` (whitespace allowed, optionally
    inside a ```` ``` ```` fence with a language tag), :data:`MARKER_PARTIAL` when it is a prefix
    of such a beginning (more text could still make it one), else :data:`MARKER_NO`. A streaming
    converter holds back text from a partial or matching position so that a tool-call reply is
    not sent to the client as text before the run says it was one.
    """
    i, n = 0, len(text)
    if text.startswith("`"):
        fence = text[:3]
        if fence != "```"[: len(fence)]:
            return MARKER_NO
        if len(fence) < 3:
            return MARKER_PARTIAL
        i = 3
        while i < n and (text[i].isalnum() or text[i] in "_-"):
            i += 1
    elif not text.startswith("{"):
        return MARKER_NO
    while i < n and text[i].isspace():
        i += 1
    if i == n:
        return MARKER_PARTIAL
    if text[i] != "{":
        return MARKER_NO
    i += 1
    while i < n and text[i].isspace():
        i += 1
    rest = text[i:]
    if rest.startswith(_KEY):
        return MARKER_MATCH
    return MARKER_PARTIAL if _KEY.startswith(rest) else MARKER_NO
