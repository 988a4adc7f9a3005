# -*- test-case-name: iop.test.edge.ingress.test_chat_responses -*-
"""
Chat Completions over a native OpenAI Responses provider: the Responses bridge the other way
round (and, behind the Messages ⇄ Chat bridge, Anthropic Messages over it too).

Pure conversion, no I/O. Two directions:

- :func:`chat_to_responses`: a ``/v1/chat/completions`` request body → a ``/v1/responses``
  request body for the served target (the inverse of :func:`~.responses.responses_to_chat`).
- :class:`ResponsesDecoder`: the provider's answer — Responses stream events, or one
  ``response`` (:meth:`ResponsesDecoder.response`) — → the canonical answer stream
  (:mod:`.canonical`), which the Chat surface encodes with :class:`~.openai.ChatEncoder` and
  the Messages surface with :class:`~.bridge.MessagesEncoder`.

Request mapping (``chat_to_responses``):

- The leading ``system`` and ``developer`` messages become ``instructions``, joined with a
  blank line; one later in the conversation stays where it is, a ``message`` item with its role
  (the Responses API takes both roles in ``input``). So ``instructions`` round-trip through
  :func:`~.responses.responses_to_chat`, which makes them the leading system message.
- ``user`` content: a string stays a string; parts: ``text`` → ``input_text``, ``image_url`` →
  ``input_image`` (the URL, ``data:`` URLs too, and its ``detail``, ``auto`` when none),
  ``file`` → ``input_file`` (``file_data``/``file_id``/``filename``); ``input_audio`` and other
  parts are refused.
- ``assistant``: its text (``refusal`` parts count as text) → a ``message`` item with the text
  as its content; each ``tool_calls`` entry → a ``function_call`` item (``id`` → ``call_id``,
  arguments as JSON text, ``{}`` when empty). Reasoning the client replays is dropped (a
  Responses provider only takes its own, encrypted, reasoning back).
- ``tool`` messages → ``function_call_output`` items (``tool_call_id`` → ``call_id``, the text).
- ``tools`` (``function`` tools only) → Responses' flat function tools; ``strict`` is what the
  Chat tool said, else ``false`` (Chat's default — the Responses API's own default is ``true``,
  which would reject the many schemas strict mode does not allow). ``tool_choice``
  ``auto``/``none``/``required`` as they are, ``{"type": "function", "function": {name}}`` →
  ``{"type": "function", "name"}``; ``parallel_tool_calls`` passes through. A request without
  tools sends neither choice nor tools.
- The output limit (``max_completion_tokens``/``max_tokens`` under the model's policy, given by
  the caller) → ``max_output_tokens``; ``temperature``, ``top_p``, ``user``, ``service_tier``,
  ``prompt_cache_key`` and ``safety_identifier`` pass through (both APIs have them);
  ``response_format`` ``json_schema`` / ``json_object`` → ``text.format``; ``verbosity`` →
  ``text.verbosity``; ``reasoning_effort`` → ``reasoning.effort``; ``stream`` passes.
- ``store`` is always ``false``: IOP keeps nothing, and asks the provider to keep nothing.
- ``stop`` is **refused** (400) when it names any sequence: the Responses API has no stop
  sequences, and an answer that runs past the caller's stop would be silently wrong. ``n``
  other than 1 is refused. ``stream_options``, ``logprobs``, ``seed``, penalties, ``metadata``
  and fields nobody here knows are dropped.

Answer mapping (``ResponsesDecoder``): ``response.created`` → start; ``output_text.delta`` (and
``refusal.delta``) → text; ``reasoning_text.delta`` and ``reasoning_summary_text.delta`` →
reasoning (summary parts after the first are set apart by a blank line); a ``function_call``
item → a tool call (``call_id`` is its id), streamed as it comes (``fragments``: its start at
``output_item.added``, each ``function_call_arguments.delta`` as an argument fragment) or whole
at its ``output_item.done``; an item whose text or arguments came only in its ``done`` event
is read from there. ``response.completed`` → finish (``stop``, ``tool_calls`` when there were
calls); ``response.incomplete`` → finish ``length`` (``incomplete_details.reason``
``content_filter`` → ``content_filter``); the usage with
:func:`~iop.formats.usage.openai_responses_usage` (cached and reasoning tokens where
reported). ``response.failed`` and an ``error`` event fail (the message redacted). A stream
that ends before a terminal event fails (:meth:`ResponsesDecoder.end`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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
from iop.formats.usage import openai_responses_usage

__all__ = ["INCOMPLETE_REASONS", "ResponsesDecoder", "chat_to_responses"]

# Responses ``incomplete_details.reason`` → OpenAI finish_reason (any other: ``length``).
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}
# Fields both APIs have, with the same meaning: passed as they are.
PASSED = ("temperature", "top_p", "user", "service_tier", "prompt_cache_key", "safety_identifier")


# -- request: Chat → Responses -----------------------------------------------------------------


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BridgeError(f"{where}.content: must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict):
            raise BridgeError(f"{at}: must be an object")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise BridgeError(f"{at}: a text part needs a string 'text'")
            parts.append({"type": "input_text", "text": text})
        elif kind == "image_url":
            url, detail = image_url(part, at)
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        elif kind == "file":
            given = part.get("file")
            if not isinstance(given, dict):
                raise BridgeError(f"{at}: a file part needs a 'file' object")
            fields = {
                name: given[name]
                for name in ("file_data", "file_id", "filename")
                if isinstance(given.get(name), str) and given[name]
            }
            if "file_data" not in fields and "file_id" not in fields:
                raise BridgeError(f"{at}: a file part needs 'file_data' or 'file_id'")
            parts.append({"type": "input_file", **fields})
        else:
            raise BridgeError(f"{at}: {kind!r} parts are not supported by this model's provider")
    return parts


def _assistant_items(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(kind) if kind == "refusal" else part.get("text")  # type: ignore[union-attr]
            if kind not in ("text", "refusal") or not isinstance(text, str):
                raise BridgeError(f"{where}.content[{i}]: {kind!r} parts are not supported")
            texts.append(text)
        content = "".join(texts)
    if isinstance(content, str) and content:
        items.append({"type": "message", "role": "assistant", "content": content})
    elif content is not None and not isinstance(content, str):
        raise BridgeError(f"{where}.content: must be a string, a list of parts or null")
    for call in tool_calls_of(message, where):
        arguments = call.arguments
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str) or not arguments.strip():
            arguments = "{}"
        items.append(
            {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": arguments}
        )
    return items


def _call_output(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": tool_call_id(message, where),
        "output": text_of(message.get("content"), where),
    }


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in function_tools(tools):
        # Responses defaults to strict schemas, which refuse many ordinary ones: strict only
        # when the Chat tool asked for it.
        converted: dict[str, Any] = {
            "type": "function",
            "name": tool.name,
            "parameters": tool.parameters,
            "strict": bool(tool.strict),
        }
        if tool.description:
            converted["description"] = tool.description
        out.append(converted)
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": tool_choice_name(choice)}
    raise BridgeError("tool_choice: must be 'auto', 'required', 'none' or a function")


def _text_format(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        raise BridgeError("response_format: must be an object")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema = value.get("json_schema")
    if kind != "json_schema" or not isinstance(schema, dict):
        raise BridgeError(
            f"response_format: type {kind!r} is not supported by this model "
            "(only 'text', 'json_object' and 'json_schema')"
        )
    name = schema.get("name")
    out: dict[str, Any] = {
        "type": "json_schema",
        "name": name if isinstance(name, str) and name else "response",
    }
    for key in ("schema", "strict", "description"):
        if schema.get(key) is not None:
            out[key] = schema[key]
    return out


def chat_to_responses(
    body: Mapping[str, Any], *, target: str, max_output_tokens: int | None
) -> dict[str, Any]:
    """
    A Chat Completions request body (checked by :mod:`.validate`, or made by the Messages
    bridge) as a Responses request body for the served ``target``; raises
    :class:`~.bridge.BridgeError` on what cannot be sent (module docstring).
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BridgeError("messages: required non-empty list")
    if body.get("n") not in (None, 1):
        raise BridgeError("n: other than 1 is not supported by this model's provider")
    stop = body.get("stop")
    if stop:
        raise BridgeError(
            "stop: stop sequences are not supported by this model's provider "
            "(the Responses API has none)"
        )
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BridgeError(f"{where}: must be an object")
        role = message.get("role")
        if role in ("system", "developer"):
            text = text_of(message.get("content"), where)
            if text and not items:
                instructions.append(text)
            elif text:
                items.append({"type": "message", "role": role, "content": text})
        elif role == "user":
            content = _user_content(message.get("content"), where)
            items.append({"type": "message", "role": "user", "content": content})
        elif role == "assistant":
            items.extend(_assistant_items(message, where))
        elif role == "tool":
            items.append(_call_output(message, where))
        else:
            raise BridgeError(f"{where}.role: {role!r} is not supported by this model")
    if not items:
        raise BridgeError("messages: needs at least one user or assistant message")
    out: dict[str, Any] = {"model": target, "input": items, "store": False}
    if instructions:
        out["instructions"] = JOIN.join(instructions)
    if max_output_tokens is not None:
        out["max_output_tokens"] = max_output_tokens
    for name in PASSED:
        value = body.get(name)
        if value is None:
            continue
        if name in ("temperature", "top_p") and not is_number(value):
            raise BridgeError(f"{name}: must be a number")
        out[name] = value
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    shape: dict[str, Any] = {}
    if body.get("response_format") is not None:
        fmt = _text_format(body["response_format"])
        if fmt is not None:
            shape["format"] = fmt
    if isinstance(body.get("verbosity"), str):
        shape["verbosity"] = body["verbosity"]
    if shape:
        out["text"] = shape
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        out["reasoning"] = {"effort": effort}
    if body.get("stream") is True:
        out["stream"] = True
    return out


# -- answers: Responses → canonical events -----------------------------------------------------


@dataclass
class _Call:
    """The function call being streamed: its item's id, the call's id and name, and whether
    any argument text was given yet."""

    item_id: Any
    call_id: str
    name: str
    arguments: str = ""


def _parts_text(content: Any, kinds: tuple[str, ...], join: str = "") -> str:
    """The text of an item's ``content`` (or ``summary``) parts of the given kinds."""
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in kinds:
            continue
        text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if isinstance(text, str) and text:
            texts.append(text)
    return join.join(texts)


class ResponsesDecoder(Decoding):
    """
    A Responses answer in, canonical events out. Streamed: :meth:`feed` each event's data (the
    parsed ``data:`` object), then :meth:`end`; whole: :meth:`response`. ``fragments``: a
    function call goes out as it streams (``TOOL_CALL_START``, ``TOOL_CALL_DELTA`` …; the Chat
    encoder), else whole at its item's end (``TOOL_CALL``). After a finish or a failure nothing
    more.
    """

    def __init__(self, *, fragments: bool = True) -> None:
        super().__init__()
        self._fragments = fragments
        self._call: _Call | None = None
        self._calls = 0
        # The items whose text came as deltas (None: a delta that named no item).
        self._streamed: set[Any] = set()

    def feed(self, data: Any) -> list[Event]:
        out: list[Event] = []
        if self.done:
            return out
        if not isinstance(data, Mapping):
            self._fail("the provider sent a malformed stream event", out)
            return out
        kind = data.get("type")
        delta = data.get("delta")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self._start(out)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            self._start(out)
            self._streamed.add(data.get("item_id"))
            if isinstance(delta, str) and delta:
                out.append(Event(Kind.TEXT, delta))
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            self._start(out)
            self._streamed.add(data.get("item_id"))
            if isinstance(delta, str):
                out.append(Event(Kind.REASONING, delta))
        elif kind == "response.reasoning_summary_part.added":
            index = data.get("summary_index")
            if isinstance(index, int) and index > 0:
                out.append(Event(Kind.REASONING, JOIN))
        elif kind == "response.output_item.added":
            self._start(out)
            item = data.get("item")
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                self._open_call(item, out)
        elif kind == "response.function_call_arguments.delta":
            call = self._call
            if call is not None and data.get("item_id") in (None, call.item_id):
                if isinstance(delta, str):
                    self._arguments(delta, out)
        elif kind == "response.function_call_arguments.done":
            call = self._call
            if (
                call is not None
                and not call.arguments
                and data.get("item_id")
                in (
                    None,
                    call.item_id,
                )
            ):
                arguments = data.get("arguments")
                if isinstance(arguments, str):
                    self._arguments(arguments, out)
        elif kind == "response.output_item.done":
            self._start(out)
            if isinstance(data.get("item"), Mapping):
                self._item_done(data["item"], out)
        elif kind in ("response.completed", "response.incomplete"):
            self._finish(data.get("response"), kind == "response.incomplete", out)
        elif kind == "response.failed":
            response = data.get("response")
            self._fail(_failure(response if isinstance(response, Mapping) else {}), out)
        elif kind == "error":
            self._fail(error_message(data) or "the provider failed", out)
        # Part and done events whose content the deltas already gave, and event types this
        # side does not know, are skipped, as the SDKs do.
        return out

    def end(self) -> list[Event]:
        """The provider's body ended: a stream that did not finish has failed."""
        out: list[Event] = []
        if not self.done:
            self._fail("the provider's stream ended before the response did", out)
        return out

    def _open_call(self, item: Mapping[str, Any], out: list[Event]) -> None:
        self._close_call(out)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return  # read whole at its done, if it has a name by then
        call_id = item.get("call_id") or item.get("id")
        self._call = _Call(item.get("id"), call_id if isinstance(call_id, str) else "", name)
        self._calls += 1
        if self._fragments:
            out.append(Event(Kind.TOOL_CALL_START, call={"id": self._call.call_id, "name": name}))
        given = item.get("arguments")
        if isinstance(given, str):
            self._arguments(given, out)

    def _arguments(self, fragment: str, out: list[Event]) -> None:
        call = self._call
        if call is None or not fragment:
            return
        call.arguments += fragment
        if self._fragments:
            out.append(Event(Kind.TOOL_CALL_DELTA, fragment))

    def _close_call(self, out: list[Event]) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        if self._fragments:
            if not call.arguments:
                out.append(Event(Kind.TOOL_CALL_DELTA, "{}"))
            return
        whole = {
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments or "{}"},
        }
        out.append(Event(Kind.TOOL_CALL, call=whole))

    def _item_done(self, item: Mapping[str, Any], out: list[Event]) -> None:
        """An output item as it ended: what its deltas did not already give."""
        kind = item.get("type")
        if kind == "function_call":
            call = self._call
            if call is None or call.item_id != item.get("id"):
                self._open_call(item, out)
            elif not call.arguments and isinstance(item.get("arguments"), str):
                self._arguments(item["arguments"], out)
            self._close_call(out)
            return
        streamed = item.get("id") in self._streamed or None in self._streamed
        if kind == "message" and not streamed:
            text = _parts_text(item.get("content"), ("output_text", "refusal"))
            if text:
                out.append(Event(Kind.TEXT, text))
        elif kind == "reasoning" and not streamed:
            text = _parts_text(item.get("content"), ("reasoning_text",))
            text = text or _parts_text(item.get("summary"), ("summary_text",), JOIN)
            if text:
                out.append(Event(Kind.REASONING, text))

    def _finish(self, response: Any, incomplete: bool, out: list[Event]) -> None:
        self._start(out)
        self._close_call(out)
        self.done = True
        response = response if isinstance(response, Mapping) else {}
        if incomplete or response.get("status") == "incomplete":
            details = response.get("incomplete_details")
            why = details.get("reason") if isinstance(details, Mapping) else None
            reason = INCOMPLETE_REASONS.get(why, "length")  # type: ignore[arg-type]
        else:
            reason = "tool_calls" if self._calls else "stop"
        usage = response.get("usage")
        reported = openai_responses_usage(usage) if isinstance(usage, Mapping) else None
        out.append(Event(Kind.FINISH, reason=reason, usage=reported))

    def whole(self, data: Any) -> list[Event]:
        """The provider's whole answer (parsed JSON, or None when it was not JSON) as events:
        :meth:`response` (the relay's name for it, every decoder alike)."""
        return self.response(data)

    def response(self, response: Any) -> list[Event]:
        """A whole ``response`` as events (a failure when it is not one, or did not end well)."""
        out: list[Event] = []
        if not isinstance(response, Mapping) or not isinstance(response.get("output"), list):
            self._fail("the provider's answer is not a response", out)
            return out
        status = response.get("status")
        if status == "failed":
            self._fail(_failure(response), out)
            return out
        if status not in (None, "completed", "incomplete"):
            self._fail(f"the provider's response did not end (status {status!r})", out)
            return out
        self._start(out)
        for item in response["output"]:
            if isinstance(item, Mapping):
                self._item_done(item, out)
        self._finish(response, status == "incomplete", out)
        return out


def _failure(response: Mapping[str, Any]) -> str:
    """What a failed response says went wrong."""
    error = response.get("error")
    message = error_message({"error": error}) if isinstance(error, Mapping) else None
    return message or "the provider's response failed"
