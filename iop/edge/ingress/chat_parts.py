# -*- test-case-name: iop.test.edge.ingress.test_chat_messages -*-
"""
The parts of a Chat Completions request, read once for the bridges that send it on in another
protocol (:mod:`.chat_messages` to a native Messages provider, :mod:`.chat_responses` to a
native Responses provider): each reader checks a part and hands back its values, and each
bridge writes them in its own protocol's shape. A part that cannot be read raises
:class:`~.bridge.BridgeError` naming its place (``messages[2].tool_calls[0]``), so both bridges
refuse the same request with the same words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from iop.edge.ingress.bridge import BridgeError

__all__ = [
    "FunctionTool",
    "ToolCall",
    "function_tools",
    "image_url",
    "is_number",
    "text_of",
    "tool_call_id",
    "tool_calls_of",
    "tool_choice_name",
]

# Several text parts (or messages) become one text, a blank line apart.
JOIN = "\n\n"


def is_number(value: Any) -> bool:
    """A finite JSON number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def text_of(content: Any, where: str) -> str:
    """A system, developer or tool message's content as text (a string or text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BridgeError(f"{where}.content[{i}]: only text parts are supported here")
            text = part.get("text")
            if not isinstance(text, str):
                raise BridgeError(f"{where}.content[{i}]: a text part needs a string 'text'")
            texts.append(text)
        return JOIN.join(texts)
    raise BridgeError(f"{where}.content: must be a string or a list of parts")


def image_url(part: Mapping[str, Any], where: str) -> tuple[str, str | None]:
    """An ``image_url`` part's URL (a ``data:`` URL or any other) and its ``detail``, if any."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise BridgeError(f"{where}: an image_url part needs a 'url' string")
    detail = image.get("detail") if isinstance(image, dict) else None
    return url, detail if isinstance(detail, str) and detail else None


class ToolCall(NamedTuple):
    """One of an assistant message's ``tool_calls``: its id, function name and arguments as
    the client gave them (JSON text, an object, or None)."""

    id: str
    name: str
    arguments: Any


def tool_calls_of(message: Mapping[str, Any], where: str) -> list[ToolCall]:
    """An assistant message's ``tool_calls``, each with an id and a function name."""
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise BridgeError(f"{where}.tool_calls: must be a list")
    out = []
    for i, call in enumerate(calls or ()):
        call_where = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(function, dict):
            raise BridgeError(f"{call_where}: a tool call needs a 'function' object")
        call_id, name = call.get("id"), function.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise BridgeError(f"{call_where}: a tool call needs an 'id' string")
        if not isinstance(name, str) or not name:
            raise BridgeError(f"{call_where}: a tool call needs a function 'name' string")
        out.append(ToolCall(call_id, name, function.get("arguments")))
    return out


def tool_call_id(message: Mapping[str, Any], where: str) -> str:
    """A ``tool`` message's ``tool_call_id``."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise BridgeError(f"{where}: a tool message needs a 'tool_call_id' string")
    return call_id


class FunctionTool(NamedTuple):
    """A ``function`` tool: its name, its parameters' JSON schema (an empty object schema when
    it gave none), its description ("" when none) and ``strict`` (None when not given)."""

    name: str
    parameters: dict[str, Any]
    description: str
    strict: bool | None


def function_tools(tools: Any) -> list[FunctionTool]:
    """The request's ``tools``: only ``function`` tools are accepted."""
    if not isinstance(tools, list):
        raise BridgeError("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BridgeError(f"{where}: only 'function' tools are supported by this model")
        if not isinstance(function, dict):
            raise BridgeError(f"{where}: a function tool needs a 'function' object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BridgeError(f"{where}.function: needs a 'name' string")
        schema = function.get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise BridgeError(f"{where}.function.parameters: must be an object")
        description = function.get("description")
        strict = function.get("strict")
        out.append(
            FunctionTool(
                name,
                schema,
                description if isinstance(description, str) else "",
                strict if isinstance(strict, bool) else None,
            )
        )
    return out


def tool_choice_name(choice: Mapping[str, Any]) -> str:
    """The function a ``{"type": "function", "function": {"name"}}`` tool choice names."""
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise BridgeError("tool_choice.function: needs a 'name' string")
    return name
