# -*- test-case-name: iop.test.edge.ingress.test_chat_messages -*-
"""
Chat Completions over a native Anthropic Messages provider: the bridge the other way round.

Pure conversion, no I/O. Two directions:

- :func:`chat_to_messages`: a ``/v1/chat/completions`` request body → a ``/v1/messages`` request
  body for the served target (the inverse of :func:`~.bridge.messages_to_chat`'s rules).
- :class:`MessagesDecoder`: the provider's answer — Anthropic stream events, or one ``message``
  (:meth:`MessagesDecoder.message`) — → the canonical answer stream (:mod:`.canonical`), which
  the Chat surface encodes with its one encoder (:class:`~.openai.ChatEncoder`). There is no
  direct Messages → Chat converter: any surface's encoder can read these events.

Request mapping (``chat_to_messages``):

- ``system`` and ``developer`` messages (anywhere in the conversation) become the top-level
  ``system``, joined with a blank line, in order.
- ``user`` content: a string, or parts: ``text`` → text blocks, ``image_url`` → image blocks
  (a ``data:`` URL → a ``base64`` source, any other URL → a ``url`` source); other parts
  (audio, files) are refused.
- ``assistant``: its text → a text block, each ``tool_calls`` entry → a ``tool_use`` block
  (``arguments`` must be a JSON object's text); an assistant turn with neither is dropped.
- ``tool`` messages → ``tool_result`` blocks (``tool_call_id`` → ``tool_use_id``) in a user
  turn. Consecutive turns of one role become one turn (the Messages API alternates roles).
- ``tools`` (``function`` tools) → ``{name, description, input_schema}``; ``tool_choice``
  ``auto``/``required``/``none``/``{function}`` → ``auto``/``any``/``none``/``tool``;
  ``parallel_tool_calls: false`` → ``disable_parallel_tool_use``.
- ``max_tokens`` is the limit the caller gives (the request's ``max_completion_tokens`` or
  ``max_tokens`` under the model's policy, else the model's default, else
  :data:`DEFAULT_MAX_TOKENS`: the Messages API requires one); ``temperature``, ``top_p`` pass
  through; ``stop`` (a string or a list) → ``stop_sequences``; ``user`` → ``metadata.user_id``;
  ``response_format`` ``json_schema`` → ``output_config.format``; ``stream`` passes through.
  ``n`` other than 1 is refused; ``stream_options``, ``reasoning_effort``, ``logprobs``,
  ``seed`` and fields nobody here knows are dropped.

Answer mapping (``MessagesDecoder``): ``message_start`` → start; ``text_delta`` → text;
``thinking_delta`` → reasoning; a ``tool_use`` block → a tool call, streamed as it comes
(``fragments``: its start with id and name, then each ``input_json_delta`` as an argument
fragment) or whole at its ``content_block_stop``; ``message_delta`` carries the
``stop_reason`` (``end_turn``/``stop_sequence`` → ``stop``, ``max_tokens`` → ``length``,
``tool_use`` → ``tool_calls``, ``refusal`` → ``content_filter``) and the usage, read with
:func:`~iop.formats.usage.anthropic_usage` (cache reads and writes counted into the prompt);
``message_stop`` → finish; an ``error`` event → failed. A stream that ends before
``message_stop`` fails (:meth:`MessagesDecoder.end`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from iop.edge.ingress.bridge import BridgeError
from iop.edge.ingress.canonical import Decoding, Event, Kind
from iop.edge.ingress.chat_parts import (
    JOIN,
    function_tools,
    image_url,
    is_number,
    text_of,
    tool_call_id,
    tool_calls_of,
    tool_choice_name,
)
from iop.formats.errors import error_message
from iop.formats.usage import anthropic_usage

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "STOP_REASONS",
    "MessagesDecoder",
    "chat_to_messages",
]

# The Messages API requires max_tokens; a Chat request with no limit and a model with no
# default gets this one.
DEFAULT_MAX_TOKENS = 4096
# Anthropic stop_reason → OpenAI finish_reason.
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


# -- request: Chat → Messages ------------------------------------------------------------------


def _image_block(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    url, _ = image_url(part, where)
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        media, _, encoding = head.partition(";")
        if encoding != "base64" or not media or not data:
            raise BridgeError(f"{where}: a data URL image must be base64 with a media type")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BridgeError(f"{where}.content: must be a string or a list of parts")
    blocks: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        part_where = f"{where}.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict):
            raise BridgeError(f"{part_where}: must be a content part object")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise BridgeError(f"{part_where}: a text part needs a string 'text'")
            blocks.append({"type": "text", "text": text})
        elif kind == "image_url":
            blocks.append(_image_block(part, part_where))
        else:
            raise BridgeError(f"{part_where}: {kind!r} parts are not supported by this model")
    return blocks


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind != "refusal":
                raise BridgeError(f"{where}.content[{i}]: {kind!r} parts are not supported")
        content = "".join(texts)
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    elif content is not None and not isinstance(content, str):
        raise BridgeError(f"{where}.content: must be a string, a list of parts or null")
    for i, call in enumerate(tool_calls_of(message, where)):
        call_where = f"{where}.tool_calls[{i}]"
        arguments = call.arguments
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise BridgeError(f"{call_where}: the arguments must be a JSON object")
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": parsed})
    return blocks


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": tool_call_id(message, where),
        "content": text_of(message.get("content"), where),
    }


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in function_tools(tools):
        converted: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters}
        if tool.description:
            converted["description"] = tool.description
        out.append(converted)
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    mapped: dict[str, Any]
    if choice is None:
        if parallel is not False:
            return None
        mapped = {"type": "auto"}
    elif choice == "auto":
        mapped = {"type": "auto"}
    elif choice == "required":
        mapped = {"type": "any"}
    elif choice == "none":
        return {"type": "none"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        mapped = {"type": "tool", "name": tool_choice_name(choice)}
    else:
        raise BridgeError("tool_choice: must be 'auto', 'required', 'none' or a function")
    if parallel is False:
        mapped["disable_parallel_tool_use"] = True
    return mapped


def _response_format(value: Any, messages: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise BridgeError("response_format: must be an object")
    kind = value.get("type")
    if kind == "text":
        return
    schema = value.get("json_schema")
    schema = schema.get("schema") if isinstance(schema, dict) else None
    if kind != "json_schema" or not isinstance(schema, dict):
        raise BridgeError(
            f"response_format: type {kind!r} is not supported by this model "
            "(only 'text' and 'json_schema' with a schema)"
        )
    messages["output_config"] = {"format": {"type": "json_schema", "schema": schema}}


def _turn(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add ``blocks`` as a ``role`` turn, merged into the last turn when it has that role."""
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


def chat_to_messages(body: Mapping[str, Any], *, target: str, max_tokens: int) -> dict[str, Any]:
    """
    A Chat Completions request body (checked by :mod:`.validate`) as a Messages request body
    for the served ``target``; raises :class:`~.bridge.BridgeError` on what cannot be sent.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BridgeError("messages: required non-empty list")
    if body.get("n") not in (None, 1):
        raise BridgeError("n: other than 1 is not supported by this model's provider")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BridgeError(f"{where}: must be an object")
        role = message.get("role")
        if role in ("system", "developer"):
            text = text_of(message.get("content"), where)
            if text:
                system.append(text)
        elif role == "user":
            _turn(turns, "user", _user_blocks(message.get("content"), where))
        elif role == "assistant":
            blocks = _assistant_blocks(message, where)
            if blocks:
                _turn(turns, "assistant", blocks)
        elif role == "tool":
            _turn(turns, "user", [_tool_result(message, where)])
        else:
            raise BridgeError(f"{where}.role: {role!r} is not supported by this model")
    if not turns:
        raise BridgeError("messages: needs at least one user or assistant message")
    out: dict[str, Any] = {"model": target, "max_tokens": max_tokens, "messages": turns}
    if system:
        out["system"] = JOIN.join(system)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if not is_number(value):
                raise BridgeError(f"{name}: must be a number")
            out[name] = value
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BridgeError("stop: must be a string or a list of strings")
        if stop:
            out["stop_sequences"] = stop
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    if body.get("response_format") is not None:
        _response_format(body["response_format"], out)
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    if body.get("stream") is True:
        out["stream"] = True
    return out


# -- answers: Messages → canonical events ------------------------------------------------------


class MessagesDecoder(Decoding):
    """
    A Messages answer in, canonical events out. Streamed: :meth:`feed` each event's data (the
    parsed ``data:`` object), then :meth:`end`; whole: :meth:`message`. ``fragments``: a tool
    call goes out as it streams (``TOOL_CALL_START``, ``TOOL_CALL_DELTA`` …; the Chat encoder),
    else whole at its block's end (``TOOL_CALL``). After a finish or a failure nothing more.
    """

    def __init__(self, *, fragments: bool = True) -> None:
        super().__init__()
        self._fragments = fragments
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        # The open tool_use block: its index, id, name, the argument text so far.
        self._tool: tuple[Any, str, str] | None = None
        self._arguments = ""

    def feed(self, data: Any) -> list[Event]:
        out: list[Event] = []
        if self.done:
            return out
        if not isinstance(data, Mapping):
            self._fail("the provider sent a malformed stream event", out)
            return out
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
                self._usage.update(message["usage"])
            self._start(out)
        elif kind == "content_block_start":
            self._start(out)
            self._block_start(data.get("content_block"), data.get("index"), out)
        elif kind == "content_block_delta":
            self._start(out)
            self._delta(data.get("delta"), out)
        elif kind == "content_block_stop":
            self._block_stop(out)
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, Mapping) and delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), Mapping):
                self._usage.update(data["usage"])
        elif kind == "message_stop":
            self._finish(out)
        elif kind == "error":
            self._fail(error_message(data) or "the provider failed", out)
        # ping and event types this side does not know are skipped, as the SDKs do.
        return out

    def end(self) -> list[Event]:
        """The provider's body ended: a stream that did not finish has failed."""
        out: list[Event] = []
        if not self.done:
            self._fail("the provider's stream ended before the message did", out)
        return out

    def _block_start(self, block: Any, index: Any, out: list[Event]) -> None:
        self._block_stop(out)
        if not isinstance(block, Mapping):
            return
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str) and block["text"]:
            out.append(Event(Kind.TEXT, block["text"]))
        elif kind == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"]:
            out.append(Event(Kind.REASONING, block["thinking"]))
        elif kind == "tool_use":
            call_id = str(block["id"]) if isinstance(block.get("id"), str) else ""
            name = str(block["name"]) if isinstance(block.get("name"), str) else ""
            self._tool = (index, call_id, name)
            self._arguments = ""
            if self._fragments:
                out.append(Event(Kind.TOOL_CALL_START, call={"id": call_id, "name": name}))
            given = block.get("input")
            if isinstance(given, Mapping) and given:
                self._arguments_fragment(json.dumps(given, ensure_ascii=False), out)

    def _arguments_fragment(self, fragment: str, out: list[Event]) -> None:
        if not fragment:
            return
        self._arguments += fragment
        if self._fragments:
            out.append(Event(Kind.TOOL_CALL_DELTA, fragment))

    def _delta(self, delta: Any, out: list[Event]) -> None:
        if not isinstance(delta, Mapping):
            return
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            if delta["text"]:
                out.append(Event(Kind.TEXT, delta["text"]))
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            out.append(Event(Kind.REASONING, delta["thinking"]))
        elif kind == "input_json_delta" and self._tool is not None:
            partial = delta.get("partial_json")
            if isinstance(partial, str):
                self._arguments_fragment(partial, out)

    def _block_stop(self, out: list[Event]) -> None:
        if self._tool is None:
            return
        _, call_id, name = self._tool
        self._tool = None
        if self._fragments:
            if not self._arguments:
                out.append(Event(Kind.TOOL_CALL_DELTA, "{}"))
            return
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": self._arguments or "{}"},
        }
        out.append(Event(Kind.TOOL_CALL, call=call))

    def _finish(self, out: list[Event]) -> None:
        self._start(out)
        self._block_stop(out)
        self.done = True
        reason = STOP_REASONS.get(self._stop_reason, "stop")
        out.append(Event(Kind.FINISH, reason=reason, usage=anthropic_usage(self._usage)))

    def whole(self, data: Any) -> list[Event]:
        """The provider's whole answer (parsed JSON, or None when it was not JSON) as events:
        :meth:`message` (the relay's name for it, every decoder alike)."""
        return self.message(data)

    def message(self, message: Any) -> list[Event]:
        """A whole ``message`` as events (a failure when it is not one)."""
        out: list[Event] = []
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            self._fail("the provider's answer is not a message", out)
            return out
        self._start(out)
        for index, block in enumerate(message["content"]):
            self._block_start(block, index, out)
        if isinstance(message.get("usage"), Mapping):
            self._usage.update(message["usage"])
        self._stop_reason = message.get("stop_reason")
        self._finish(out)
        return out
