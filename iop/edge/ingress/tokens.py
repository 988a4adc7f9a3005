# -*- test-case-name: iop.test.edge.ingress.test_tokens -*-
"""
A local, deterministic **estimate** of a request's prompt tokens.

It answers ``/v1/messages/count_tokens`` for a model configured with ``token_counter:
approximate`` (no provider is asked), and classifies requests as long-context for the provider
pool. It is not any model's tokenizer and must never be reported as provider usage.

The rule:

- a piece of text costs ``ceil(ascii_chars / 4)`` plus one token per non-ASCII character
  (scripts such as Hangul or CJK take about a token a character, English about four characters a
  token);
- structured data (tool inputs, tool schemas, unknown blocks) is counted as its compact JSON text;
- an image costs :data:`IMAGE_TOKENS`, a document that is not plain text :data:`DOCUMENT_TOKENS`;
- each message adds :data:`MESSAGE_OVERHEAD`, each tool definition :data:`TOOL_OVERHEAD`, each
  tool call or result :data:`TOOL_CALL_OVERHEAD`, and the request :data:`REQUEST_OVERHEAD`.

Malformed parts are counted leniently (as their JSON text) rather than rejected: validation
belongs to the surfaces.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "count_tokens",
    "estimate_prompt_tokens_messages",
    "estimate_prompt_tokens_openai",
    "text_tokens",
]

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4
TOOL_OVERHEAD = 8
TOOL_CALL_OVERHEAD = 4
REQUEST_OVERHEAD = 3
IMAGE_TOKENS = 1600
DOCUMENT_TOKENS = 1600


def text_tokens(text: str) -> int:
    """The estimate for one piece of text."""
    if not text:
        return 0
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return math.ceil(ascii_chars / CHARS_PER_TOKEN) + (len(text) - ascii_chars)


def _json_tokens(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return text_tokens(value)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError):
        text = str(value)
    return text_tokens(text)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# -- Anthropic Messages ------------------------------------------------------------------------


def _messages_content(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):
        return sum(_messages_block(block) for block in content)
    return _json_tokens(content)


def _messages_block(block: Any) -> int:
    if not isinstance(block, dict):
        return _json_tokens(block)
    kind = block.get("type")
    if kind == "text":
        return text_tokens(_str(block.get("text")))
    if kind == "image":
        return IMAGE_TOKENS
    if kind == "document":
        extra = text_tokens(_str(block.get("title"))) + text_tokens(_str(block.get("context")))
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "text":
            return extra + text_tokens(_str(source.get("data")))
        if isinstance(source, dict) and source.get("type") == "content":
            return extra + _messages_content(source.get("content"))
        return extra + DOCUMENT_TOKENS
    if kind in ("tool_use", "server_tool_use"):
        return (
            TOOL_CALL_OVERHEAD
            + text_tokens(_str(block.get("name")))
            + _json_tokens(block.get("input", {}))
        )
    if kind == "tool_result":
        return TOOL_CALL_OVERHEAD + _messages_content(block.get("content", ""))
    if kind == "thinking":
        return text_tokens(_str(block.get("thinking")))
    if kind == "redacted_thinking":
        return text_tokens(_str(block.get("data")))
    return _json_tokens({k: v for k, v in block.items() if k != "cache_control"})


def _tool_definitions(tools: Any, *, openai: bool) -> int:
    if not isinstance(tools, list):
        return 0
    total = 0
    for tool in tools:
        total += TOOL_OVERHEAD
        if not isinstance(tool, dict):
            total += _json_tokens(tool)
            continue
        if openai:
            function = tool.get("function")
            source = function if isinstance(function, dict) else tool
            schema = source.get("parameters")
        else:
            source = tool
            schema = tool.get("input_schema")
        if not isinstance(source.get("name"), str) or (schema is None and not openai):
            # A server tool or something unknown: its definition as JSON.
            total += _json_tokens({k: v for k, v in tool.items() if k != "cache_control"})
            continue
        total += text_tokens(_str(source.get("name")))
        total += text_tokens(_str(source.get("description")))
        total += _json_tokens(schema)
    return total


def estimate_prompt_tokens_messages(body: dict[str, Any]) -> int:
    """The estimate for an Anthropic Messages (or count_tokens) request body."""
    total = REQUEST_OVERHEAD
    system = body.get("system")
    if system is not None:
        total += _messages_content(system)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        total += MESSAGE_OVERHEAD
        if isinstance(message, dict):
            total += _messages_content(message.get("content", ""))
        else:
            total += _json_tokens(message)
    total += _tool_definitions(body.get("tools"), openai=False)
    return total


def count_tokens(body: dict[str, Any]) -> int:
    """``input_tokens`` for ``/v1/messages/count_tokens`` under ``token_counter: approximate``."""
    return estimate_prompt_tokens_messages(body)


# -- OpenAI Chat Completions / Responses -------------------------------------------------------


def _openai_content(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):
        return sum(_openai_part(part) for part in content)
    return _json_tokens(content)


def _openai_part(part: Any) -> int:
    if not isinstance(part, dict):
        return _json_tokens(part)
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text", "refusal"):
        return text_tokens(_str(part.get("text", part.get("refusal"))))
    if kind in ("image_url", "input_image"):
        return IMAGE_TOKENS
    if kind in ("file", "input_file", "input_audio"):
        return DOCUMENT_TOKENS
    return _json_tokens(part)


def _openai_tool_calls(calls: Any) -> int:
    total = 0
    for call in calls if isinstance(calls, list) else ():
        total += TOOL_CALL_OVERHEAD
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            total += text_tokens(_str(function.get("name")))
            total += _json_tokens(function.get("arguments"))
        else:
            total += _json_tokens(call)
    return total


def _openai_items(items: Iterable[Any]) -> int:
    total = 0
    for item in items:
        total += MESSAGE_OVERHEAD
        if not isinstance(item, dict):
            total += _json_tokens(item)
            continue
        kind = item.get("type")
        if kind == "function_call":
            total += text_tokens(_str(item.get("name"))) + _json_tokens(item.get("arguments"))
        elif kind == "function_call_output":
            total += _openai_content(item.get("output", ""))
        elif "content" in item or "role" in item:
            total += _openai_content(item.get("content") or "")
            total += text_tokens(_str(item.get("name")))
            total += _openai_tool_calls(item.get("tool_calls"))
            reasoning = item.get("reasoning_content")
            total += text_tokens(_str(reasoning))
        else:
            total += _json_tokens(item)
    return total


def estimate_prompt_tokens_openai(body: dict[str, Any]) -> int:
    """
    The estimate for an OpenAI request body: Chat Completions (``messages``, ``tools``) or
    Responses (``instructions``, ``input`` as a string or a list of items, ``tools``).
    """
    total = REQUEST_OVERHEAD
    messages = body.get("messages")
    if isinstance(messages, list):
        total += _openai_items(messages)
    total += text_tokens(_str(body.get("instructions")))
    inputs = body.get("input")
    if isinstance(inputs, str):
        total += MESSAGE_OVERHEAD + text_tokens(inputs)
    elif isinstance(inputs, list):
        total += _openai_items(inputs)
    total += _tool_definitions(body.get("tools"), openai=True)
    return total
