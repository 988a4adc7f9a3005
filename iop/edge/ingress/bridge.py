# -*- test-case-name: iop.test.edge.ingress.test_bridge -*-
"""
The Messages bridge's request: an Anthropic Messages request served by an OpenAI Chat
Completions provider (over the provider tunnel) or by a normalized run (Ollama, CLI agents) is
sent as a Chat Completions request (:func:`messages_to_chat`). Its answer comes back through the
canonical answer stream into the Messages encoder (:mod:`.messages_encode`).
:class:`BridgeError` is how every bridge's request translation refuses what it cannot convert
(:mod:`.chat_messages` too).

Pure conversion: no I/O, no reactor.

Request mapping decisions (``messages_to_chat``):

The whole field table (mapped / ignored / refused) is in the README's client API section and
``iop/test/edge/ingress/test_bridge_fields.py`` checks it row by row.

- ``system`` (a string or text blocks) becomes one leading ``system`` message; several text
  blocks (here and in messages) are joined with a blank line. A mid-conversation ``role:
  "system"`` message (Claude Code sends them) becomes a ``system`` message in its place.
  ``cache_control`` is ignored wherever it is.
- A user message's ``tool_result`` blocks become ``role: tool`` messages, in order, ahead of the
  rest of that message (the Messages API puts them first); their content is flattened to text,
  ``is_error`` results are prefixed ``"Error: "``, and images inside a result are moved to the
  user message that follows (a tool message carries only text).
- Images: ``base64`` sources become ``data:`` URLs and ``url`` sources plain URLs, as
  ``image_url`` parts; ``file`` sources are refused. ``document`` blocks are accepted when they
  carry text (``text`` or ``content`` sources) and refused otherwise (a Chat backend has no PDF
  input).
- An assistant message's ``tool_use`` blocks become ``tool_calls`` (``input`` as JSON text); its
  ``thinking``/``redacted_thinking`` blocks are dropped (a Chat backend cannot verify or replay
  them). An assistant turn left with neither text nor tool calls is dropped.
- ``tools`` (custom tools only; server tools are refused) become function tools; ``tool_choice``
  ``auto``/``any``/``tool``/``none`` becomes ``auto``/``required``/``{function}``/``none``, and
  ``disable_parallel_tool_use`` becomes ``parallel_tool_calls: false``.
- ``max_tokens``, ``temperature``, ``top_p`` pass through, ``stop_sequences`` becomes ``stop``,
  ``stream`` adds ``stream_options.include_usage``, ``metadata.user_id`` becomes ``user``,
  ``output_config.format`` / ``output_format`` (``json_schema``) become ``response_format``.
  ``top_k``, ``service_tier``, ``context_management`` and fields nobody here knows are dropped;
  a ``defer_loading`` tool is sent only once a ``tool_reference`` block in a tool result (a
  client-side tool search) has loaded it, as the Messages API does; ``container`` and
  ``mcp_servers`` (Anthropic's own servers' features) are refused.
- Images follow what the provider takes (``images``): any source over the tunnel, base64 only
  on Ollama, none on a CLI agent (a 400 naming the block).
- ``thinking``: ``disabled`` is dropped. ``enabled`` needs the profile's thinking extension
  (:func:`iop.edge.ingress.profiles.thinking_allowed`), else :class:`BridgeError`; its
  ``budget_tokens`` becomes ``reasoning_effort`` (< 4096 ``low``, < 16384 ``medium``, else
  ``high``), the Chat parameter reasoning backends (OpenAI, vLLM, Ollama) understand. ``adaptive``
  (the model decides) sends nothing extra and is accepted without the extension: the answer then
  simply has no thinking blocks. ``output_config.effort`` becomes ``reasoning_effort`` (``max``
  → ``high``) only where thinking is allowed and ``thinking`` did not set it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from iop.edge.ingress.profiles import THINKING_REQUIREMENT
from iop.runtime.kinds import Images

__all__ = [
    "IMAGES_ANY",
    "IMAGES_BASE64",
    "IMAGES_NONE",
    "REFUSED_FIELDS",
    "BridgeError",
    "messages_to_chat",
    "thinking_requested",
]

# thinking.budget_tokens below these → reasoning_effort low / medium; else high.
EFFORT_LOW_BELOW = 4096
EFFORT_MEDIUM_BELOW = 16384

_BLOCK_JOIN = "\n\n"

# What a provider takes as images (messages_to_chat's ``images``).
# What images a provider takes (the provider kind's row says which).
IMAGES_ANY = str(Images.ANY)
IMAGES_BASE64 = str(Images.BASE64)
IMAGES_NONE = str(Images.NONE)

# output_config.effort → reasoning_effort (only where thinking is allowed).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}

# Request fields asking for what only Anthropic's own servers do: refused, naming the field.
REFUSED_FIELDS = {
    "container": "code-execution containers are not available on this model's provider",
    "mcp_servers": "server-side MCP connectors are not available on this model's provider",
}


class BridgeError(Exception):
    """
    A request the bridge cannot convert. ``message`` is safe to show the client;
    ``error_type`` is the Anthropic error type to answer with.
    """

    error_type = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def thinking_requested(body: Mapping[str, Any]) -> bool:
    """Whether a Messages request asks for thinking (``enabled`` or ``adaptive``)."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


# -- request: Messages → Chat ------------------------------------------------------------------


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BridgeError(f"{where}: a text block needs a string 'text'")
    return text


def _system_text(system: Any, where: str = "system") -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = []
        for i, block in enumerate(system):
            block_where = f"{where}[{i}]"
            if not isinstance(block, dict) or block.get("type") != "text":
                raise BridgeError(f"{block_where}: system blocks must be text blocks")
            texts.append(_text_of(block, block_where))
        return _BLOCK_JOIN.join(texts)
    raise BridgeError(f"{where}: must be a string or a list of text blocks")


def _image_part(block: Mapping[str, Any], where: str, images: str) -> dict[str, Any]:
    if images == IMAGES_NONE:
        raise BridgeError(f"{where}: image blocks are not supported by this model's provider")
    source = block.get("source")
    if not isinstance(source, dict):
        raise BridgeError(f"{where}: an image block needs a 'source' object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not media or not isinstance(data, str) or not data:
            raise BridgeError(f"{where}: a base64 image needs 'media_type' and 'data' strings")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        if images == IMAGES_BASE64:
            raise BridgeError(f"{where}: this model's provider takes images only as base64 sources")
        link = source.get("url")
        if not isinstance(link, str) or not link:
            raise BridgeError(f"{where}: a url image needs a 'url' string")
        url = link
    else:
        raise BridgeError(f"{where}: image source type {kind!r} is not supported")
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(block: Mapping[str, Any], where: str) -> str:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if isinstance(source, dict) and kind == "text" and isinstance(source.get("data"), str):
        body: str = source["data"]
    elif isinstance(source, dict) and kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            body = content
        elif isinstance(content, list):
            body = _BLOCK_JOIN.join(
                _text_of(b, f"{where}.source.content[{i}]")
                for i, b in enumerate(content)
                if isinstance(b, dict) and b.get("type") == "text"
            )
        else:
            raise BridgeError(f"{where}: document content must be a string or text blocks")
    else:
        raise BridgeError(
            f"{where}: document source type {kind!r} is not supported (only text documents)"
        )
    title = block.get("title")
    return f"{title}\n\n{body}" if isinstance(title, str) and title else body


def _tool_result(
    block: Mapping[str, Any], where: str, images: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A tool message and the images the result carried."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise BridgeError(f"{where}: a tool_result needs a 'tool_use_id' string")
    content = block.get("content", "")
    texts: list[str] = []
    pictures: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for i, part in enumerate(content):
            part_where = f"{where}.content[{i}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(_text_of(part, part_where))
            elif kind == "image":
                pictures.append(_image_part(part, part_where, images))
                texts.append("[image]")
            elif kind == "document":
                texts.append(_document_text(part, part_where))
            elif kind == "tool_reference" and isinstance(part.get("tool_name"), str):
                texts.append(f"[tool loaded: {part['tool_name']}]")
            else:
                raise BridgeError(
                    f"{part_where}: {kind!r} blocks are not supported in tool results"
                )
    else:
        raise BridgeError(f"{where}: tool_result content must be a string or a list of blocks")
    text = "\n".join(texts)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise BridgeError(f"{where}: 'is_error' must be a boolean")
    if is_error:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}, pictures


def _user_messages(content: Any, where: str, images: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise BridgeError(f"{where}.content: must be a string or a list of content blocks")
    tools: list[dict[str, Any]] = []
    tool_images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        block_where = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(block, dict):
            raise BridgeError(f"{block_where}: must be a content block object")
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, block_where)})
        elif kind == "image":
            parts.append(_image_part(block, block_where, images))
        elif kind == "document":
            parts.append({"type": "text", "text": _document_text(block, block_where)})
        elif kind == "tool_result":
            message, pictures = _tool_result(block, block_where, images)
            tools.append(message)
            tool_images.extend(pictures)
        else:
            raise BridgeError(f"{block_where}: {kind!r} blocks are not supported in user messages")
    out = list(tools)
    all_parts = tool_images + parts
    if all_parts:
        if all(part["type"] == "text" for part in all_parts):
            out.append({"role": "user", "content": _BLOCK_JOIN.join(p["text"] for p in all_parts)})
        else:
            out.append({"role": "user", "content": all_parts})
    elif not tools:
        out.append({"role": "user", "content": ""})
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any] | None:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise BridgeError(f"{where}.content: must be a string or a list of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        block_where = f"{where}.content[{i}]"
        if not isinstance(block, dict):
            raise BridgeError(f"{block_where}: must be a content block object")
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_of(block, block_where))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise BridgeError(f"{block_where}: a tool_use block needs an 'id' string")
            if not isinstance(name, str) or not name:
                raise BridgeError(f"{block_where}: a tool_use block needs a 'name' string")
            if not isinstance(arguments, dict):
                raise BridgeError(f"{block_where}: a tool_use block's 'input' must be an object")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise BridgeError(
                f"{block_where}: {kind!r} blocks are not supported in assistant messages"
            )
    if not texts and not calls:
        return None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": _BLOCK_JOIN.join(texts) if texts else None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def _referenced_tools(messages: list[Any]) -> set[str]:
    """Tool names a ``tool_reference`` block in a tool result loaded (client-side tool search)."""
    names: set[str] = set()
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            for part in inner if isinstance(inner, list) else ():
                if isinstance(part, dict) and part.get("type") == "tool_reference":
                    if isinstance(part.get("tool_name"), str):
                        names.add(part["tool_name"])
    return names


def _tools(tools: Any, loaded: set[str]) -> list[dict[str, Any]]:
    """Custom tools as function tools; a ``defer_loading`` tool only once ``loaded`` names it."""
    if not isinstance(tools, list):
        raise BridgeError("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BridgeError(f"{where}: must be an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise BridgeError(f"{where}: tool type {kind!r} is not supported by this model")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise BridgeError(f"{where}: a tool needs a 'name' string")
        if not isinstance(schema, dict):
            raise BridgeError(f"{where}: a tool needs an 'input_schema' object")
        if tool.get("defer_loading") is True and name not in loaded:
            continue
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, has_tools: bool, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise BridgeError("tool_choice: must be an object")
    kind = choice.get("type")
    mapped: Any
    if kind == "auto":
        mapped = "auto"
    elif kind == "any":
        mapped = "required"
    elif kind == "none":
        mapped = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise BridgeError("tool_choice: type 'tool' needs a 'name' string")
        mapped = {"type": "function", "function": {"name": name}}
    else:
        raise BridgeError(f"tool_choice: unknown type {kind!r}")
    if not has_tools:
        if kind in ("any", "tool"):
            raise BridgeError(f"tool_choice: type {kind!r} needs tools")
        return
    chat["tool_choice"] = mapped
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        chat["parallel_tool_calls"] = False


def _thinking(thinking: Any, allowed: bool, chat: dict[str, Any]) -> None:
    if not isinstance(thinking, dict):
        raise BridgeError("thinking: must be an object")
    kind = thinking.get("type")
    if kind == "disabled" or kind == "adaptive":
        return
    if kind != "enabled":
        raise BridgeError(f"thinking: type {kind!r} is not supported by this model")
    budget = thinking.get("budget_tokens")
    if not _is_int(budget) or budget < 1:
        raise BridgeError("thinking: 'budget_tokens' must be a positive integer")
    if not allowed:
        raise BridgeError(
            "thinking: not supported by this model's provider: its protocol profile needs "
            f"{THINKING_REQUIREMENT} set to true"
        )
    if budget < EFFORT_LOW_BELOW:
        chat["reasoning_effort"] = "low"
    elif budget < EFFORT_MEDIUM_BELOW:
        chat["reasoning_effort"] = "medium"
    else:
        chat["reasoning_effort"] = "high"


def _effort(value: Any, allowed: bool, chat: dict[str, Any]) -> None:
    if not isinstance(value, str) or value not in _EFFORTS:
        raise BridgeError(f"output_config.effort: must be one of {', '.join(_EFFORTS)}")
    if allowed and "reasoning_effort" not in chat:
        chat["reasoning_effort"] = _EFFORTS[value]


def _output_format(value: Any, where: str, chat: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise BridgeError(f"{where}: must be an object")
    kind = value.get("type")
    if kind != "json_schema":
        raise BridgeError(f"{where}.type: {kind!r} is not supported (only 'json_schema')")
    schema = value.get("schema")
    if not isinstance(schema, dict):
        raise BridgeError(f"{where}.schema: must be an object")
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


def _output_config(value: Any, allowed: bool, chat: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise BridgeError("output_config: must be an object")
    if value.get("effort") is not None:
        _effort(value["effort"], allowed, chat)
    if value.get("format") is not None:
        _output_format(value["format"], "output_config.format", chat)


def _metadata(value: Any, chat: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise BridgeError("metadata: must be an object")
    user = value.get("user_id")
    if user is None:
        return
    if not isinstance(user, str):
        raise BridgeError("metadata.user_id: must be a string")
    if user:
        chat["user"] = user


def messages_to_chat(
    body: dict[str, Any],
    *,
    target: str,
    thinking_allowed: bool,
    images: str = IMAGES_ANY,
) -> dict[str, Any]:
    """
    An Anthropic Messages request body as an OpenAI Chat Completions request body for the
    served ``target``. Raises :class:`BridgeError` on a malformed or unconvertible request.
    ``images`` is what the provider takes: :data:`IMAGES_ANY`, :data:`IMAGES_BASE64` (Ollama)
    or :data:`IMAGES_NONE` (a CLI agent).
    """
    if not isinstance(body, dict):
        raise BridgeError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BridgeError("model: required string")
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BridgeError("max_tokens: required positive integer")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BridgeError("messages: required non-empty list")

    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise BridgeError(f"{name}: {REFUSED_FIELDS[name]}")
    chat_messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _system_text(body["system"])
        if system:
            chat_messages.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BridgeError(f"{where}: must be an object")
        role = message.get("role")
        if "content" not in message:
            raise BridgeError(f"{where}: 'content' is required")
        if role == "user":
            chat_messages.extend(_user_messages(message["content"], where, images))
        elif role == "assistant":
            converted = _assistant_message(message["content"], where)
            if converted is not None:
                chat_messages.append(converted)
        elif role == "system":
            # A mid-conversation system message, kept in its place.
            text = _system_text(message["content"], f"{where}.content")
            if text:
                chat_messages.append({"role": "system", "content": text})
        else:
            raise BridgeError(f"{where}.role: must be 'user', 'assistant' or 'system'")

    chat: dict[str, Any] = {"model": target, "messages": chat_messages, "max_tokens": max_tokens}
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if not _is_number(value):
                raise BridgeError(f"{name}: must be a number")
            chat[name] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BridgeError("stop_sequences: must be a list of strings")
        if stops:
            chat["stop"] = list(stops)
    has_tools = False
    if body.get("tools") is not None:
        tools = _tools(body["tools"], _referenced_tools(messages))
        if tools:
            chat["tools"] = tools
            has_tools = True
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], has_tools, chat)
    if body.get("thinking") is not None:
        _thinking(body["thinking"], thinking_allowed, chat)
    if body.get("output_config") is not None:
        _output_config(body["output_config"], thinking_allowed, chat)
    if body.get("output_format") is not None:
        _output_format(body["output_format"], "output_format", chat)
    if body.get("metadata") is not None:
        _metadata(body["metadata"], chat)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BridgeError("stream: must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat
