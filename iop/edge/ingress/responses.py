# -*- test-case-name: iop.test.edge.ingress.test_responses -*-
"""
The Responses bridge: ``POST /v1/responses`` served by Chat Completions providers (over the
provider tunnel), by normalized runs (Ollama, CLI agents) and by native Messages providers (the
Chat request translated once more, :mod:`.chat_messages`), answered in the exact shapes of the
OpenAI Responses API. Native Responses providers never come here (the raw tunnel serves them).

Pure conversion, no I/O:

- :func:`responses_to_chat`: a ``/v1/responses`` body → a ``/chat/completions`` body (and the
  names of the flattened namespace tools, to map calls back).
- :class:`ResponsesEncoder`: the surface's one encoder, canonical answer events
  (:mod:`.canonical`) → Responses stream events; the same object builds the final
  ``response``, so streamed and whole answers have the same output items. Whatever the source —
  a Chat tunnel's answer (:class:`~.chat_decode.ChatDecoder`), a native Messages answer
  (:class:`~.chat_messages.MessagesDecoder`), a run (:class:`RunEventsToResponses`, through
  :class:`~iop.edge.ingress.canonical.RunDecoder`) — it is decoded into canonical events first.
  :func:`chat_completion_to_response` encodes one whole ``chat.completion`` (a whole run's or
  Messages answer, as the Chat encoder made it).

Request mapping:

- ``input``: a string is one user message. Items: ``message`` (or a bare ``{role, content}``),
  roles ``user``/``assistant``/``system``/``developer`` (``developer`` → ``system``); content a
  string or parts: ``input_text``/``output_text``/``refusal`` → text, ``input_image`` → an
  ``image_url`` part (a ``file_id`` image, ``input_file`` and ``input_audio`` → 400).
  ``function_call`` → an assistant ``tool_calls`` entry (consecutive calls, and the assistant
  text before them, form one assistant message); ``function_call_output`` → a ``tool`` message
  (text; images in it follow as a user message). ``reasoning`` items are dropped (a Chat backend
  cannot replay them). ``item_reference`` and any other item type → 400 naming ``input[i]``.
- ``instructions`` → a leading system message.
- ``tools``: ``function`` tools → Chat's nested function shape; a ``namespace`` tool's functions
  become ``<namespace>__<name>`` (and calls to them come back with ``namespace`` and ``name``).
  Hosted tools (``web_search``, ``file_search``, ``code_interpreter``, ``mcp``, …) are not
  offered to the model: IOP runs no server-side tools. ``custom`` tools → 400.
  ``tool_choice``: ``auto``/``none``/``required`` as they are, ``{"type": "function", "name"}``
  → Chat's ``{"type": "function", "function": {"name"}}``; anything else → 400.
  ``parallel_tool_calls`` passes through.
- ``max_output_tokens`` → ``max_tokens`` (the caller applies the model's policy);
  ``temperature``, ``top_p``, ``user`` pass through; ``text.format`` ``json_schema`` /
  ``json_object`` → ``response_format``; ``stream`` adds ``stream_options.include_usage``.
- ``reasoning.effort`` → ``reasoning_effort`` only when the provider's profile allows reasoning
  (``extensions.thinking``/``reasoning``); otherwise dropped.
- ``store`` is accepted and ignored: IOP keeps no responses (``store: false`` semantics);
  ``previous_response_id``, ``conversation``, ``prompt`` and ``background: true`` → 400.
  ``include``, ``metadata``, ``truncation``, ``service_tier``, ``prompt_cache_key``,
  ``safety_identifier``, ``max_tool_calls``, ``top_logprobs``, ``stream_options`` and unknown
  fields are ignored.

Answer mapping: output items in order — a ``reasoning`` item (``reasoning_text`` content) when
the provider gave reasoning, a ``message`` with one ``output_text`` part when it gave text, one
``function_call`` item per tool call (``call_id`` is the backend's tool-call id). ``status`` is
``completed``, or ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``
(finish ``length``) or ``content_filter``. ``usage``: ``input_tokens``/``output_tokens``/
``total_tokens`` and the cached and reasoning details (0 when not reported). Streamed: every
event has ``sequence_number``; ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its content part / argument events, ``response.output_item.done``
(items never interleave), then ``response.completed`` (``response.incomplete`` when incomplete).
A failure after the stream started is one ``response.failed`` event (``error.code``
``server_error``) and nothing after it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iop.edge.ingress import canonical
from iop.edge.ingress.chat_decode import ChatDecoder
from iop.edge.ingress.errors import ApiError, bad_request, run_error
from iop.edge.ingress.tools import new_call_id
from iop.formats.sse import format_event
from iop.runtime.events import RuntimeEvent, Usage

__all__ = [
    "NAMESPACE_JOIN",
    "Bridged",
    "ResponsesEncoder",
    "RunEventsToResponses",
    "chat_completion_to_response",
    "format_events",
    "responses_to_chat",
]

Event = dict[str, Any]
NAMESPACE_JOIN = "__"
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
REFUSED_FIELDS = {
    "previous_response_id": "IOP keeps no responses: send the whole conversation in 'input'",
    "conversation": "IOP keeps no conversations: send the whole conversation in 'input'",
    "prompt": "stored prompt templates are not supported",
}
INCOMPLETE = ("length", "content_filter")
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "none")


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request -----------------------------------------------------------------------------------


@dataclass
class Bridged:
    """The Chat request, and the flattened namespace tools (Chat name → (namespace, name))."""

    chat: dict[str, Any]
    names: dict[str, tuple[str, str]] = field(default_factory=dict)
    effort: str | None = None


def _text_parts(content: Any, where: str, *, images: bool) -> list[dict[str, Any]] | str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or a list of parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict):
            raise bad_request(f"'{at}' must be an object", param=at)
        if kind in ("input_text", "output_text", "text", "refusal"):
            text = part.get("text") if kind != "refusal" else part.get("refusal")
            if not isinstance(text, str):
                raise bad_request(f"'{at}.text' must be a string", param=at)
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and images:
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise bad_request(
                    f"'{at}': only images given by 'image_url' are supported (no file_id)",
                    param=at,
                )
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise bad_request(f"'{at}.type' {kind!r} is not supported by this model", param=at)
    return parts


def _flat_text(parts: list[dict[str, Any]] | str) -> str:
    if isinstance(parts, str):
        return parts
    return "".join(p["text"] for p in parts if p["type"] == "text")


def _output_text(output: Any, where: str) -> tuple[str, list[dict[str, Any]]]:
    """A function_call_output's output: its text, and image parts (for a following message)."""
    if isinstance(output, str):
        return output, []
    if isinstance(output, list):
        parts = _text_parts(output, where, images=True)
        assert isinstance(parts, list)
        return _flat_text(parts), [p for p in parts if p["type"] == "image_url"]
    return json.dumps(output, ensure_ascii=False), []


def _messages(body: Mapping[str, Any], names: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    inputs = body.get("input")
    if inputs is None:
        raise bad_request("'input' is required", param="input")
    if isinstance(inputs, str):
        out.append({"role": "user", "content": inputs})
        return out
    flat = {value: key for key, value in names.items()}
    for i, item in enumerate(inputs):
        where = f"input[{i}]"
        if isinstance(item, str):
            out.append({"role": "user", "content": item})
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise bad_request(f"'{where}.role' {item.get('role')!r} is not supported", where)
            content = _text_parts(item.get("content"), f"{where}.content", images=role == "user")
            if role == "assistant":
                out.append({"role": "assistant", "content": _flat_text(content)})
            else:
                out.append({"role": role, "content": content})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise bad_request(f"'{where}' needs string 'call_id' and 'name'", param=where)
            namespace = item.get("namespace")
            if isinstance(namespace, str) and namespace:
                name = flat.get((namespace, name), f"{namespace}{NAMESPACE_JOIN}{name}")
            arguments = item.get("arguments")
            call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else "{}",
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"'{where}.call_id' must be a string", param=where)
            text, images = _output_text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
            if images:
                out.append({"role": "user", "content": images})
        elif kind == "reasoning":
            continue
        else:
            raise bad_request(
                f"'{where}.type' {kind!r} is not supported by this model's provider", param=where
            )
    return out


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    if "parameters" not in function:
        function["parameters"] = {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _tools(body: Mapping[str, Any], names: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(tool: Mapping[str, Any], where: str, namespace: str | None) -> None:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"'{where}.name' must be a non-empty string", param=where)
        chat_name = f"{namespace}{NAMESPACE_JOIN}{name}" if namespace else name
        if chat_name in seen:
            raise bad_request(f"'{where}': tool name {chat_name!r} is used twice", param=where)
        seen.add(chat_name)
        if namespace:
            names[chat_name] = (namespace, name)
        out.append(_function(tool, chat_name))

    for i, tool in enumerate(body.get("tools") or []):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind == "function":
            add(tool, where, None)
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not namespace:
                raise bad_request(f"'{where}.name' must be a non-empty string", param=where)
            for j, inner in enumerate(tool.get("tools") or []):
                at = f"{where}.tools[{j}]"
                if not isinstance(inner, dict) or inner.get("type") != "function":
                    raise bad_request(f"'{at}': only function tools are supported", param=at)
                add(inner, at, namespace)
        elif kind == "custom":
            raise bad_request(f"'{where}': custom tools are not supported by this model", where)
        # Hosted tools: not offered (module docstring).
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if choice is None:
        return
    if choice in ("auto", "none", "required"):
        if chat.get("tools"):
            chat["tool_choice"] = choice
        return
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str) and any(
            t["function"]["name"] == name for t in chat.get("tools", [])
        ):
            chat["tool_choice"] = {"type": "function", "function": {"name": name}}
            return
    raise bad_request(
        "'tool_choice' must be auto, none, required or one of the request's function tools",
        param="tool_choice",
    )


def _text_format(text: Any, chat: dict[str, Any]) -> None:
    if not isinstance(text, dict) or not isinstance(text.get("format"), dict):
        return
    fmt = text["format"]
    kind = fmt.get("type")
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind not in (None, "text"):
        raise bad_request(f"'text.format.type' {kind!r} is not supported", param="text")


def responses_to_chat(
    body: Mapping[str, Any], *, target: str, reasoning_allowed: bool, max_tokens: int | None
) -> Bridged:
    """A ``/v1/responses`` body as a Chat request for ``target`` (module docstring)."""
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is not supported: {why}", param=name)
    if body.get("background") is True:
        raise bad_request(
            "'background' is not supported: responses are answered at once", "background"
        )
    names: dict[str, tuple[str, str]] = {}
    tools = _tools(body, names)
    chat: dict[str, Any] = {"model": target, "messages": _messages(body, names)}
    if not chat["messages"]:
        raise bad_request("'input' has no message for the model", param="input")
    if tools:
        chat["tools"] = tools
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    _tool_choice(body.get("tool_choice"), chat)
    for key in ("temperature", "top_p", "user"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    _text_format(body.get("text"), chat)
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None and effort not in EFFORTS:
        raise bad_request(f"'reasoning.effort' must be one of {', '.join(EFFORTS)}", "reasoning")
    if reasoning_allowed and isinstance(effort, str):
        chat["reasoning_effort"] = effort
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return Bridged(chat, names, effort if isinstance(effort, str) else None)


# -- answer ------------------------------------------------------------------------------------


def format_events(events: list[Event]) -> bytes:
    """Events as SSE (each named by its ``type``)."""
    return b"".join(format_event(e, e["type"]) for e in events)


def _response_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class _Item:
    kind: str  # reasoning | message | function_call
    id: str
    index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    done: bool = False

    def snapshot(self, status: str) -> dict[str, Any]:
        if self.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": self.text}] if status != "added" else []
            return {"type": "reasoning", "id": self.id, "summary": [], "content": content}
        if self.kind == "message":
            content = [_output_text_part(self.text)] if status != "added" else []
            return {
                "type": "message",
                "id": self.id,
                "status": "in_progress" if status == "added" else status,
                "role": "assistant",
                "content": content,
            }
        item: dict[str, Any] = {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.text if status != "added" else "",
            "status": "in_progress" if status == "added" else "completed",
        }
        if self.namespace:
            item["namespace"] = self.namespace
        return item


class ResponsesEncoder:
    """
    Canonical answer events (:mod:`.canonical`) in, Responses stream events out
    (:meth:`encode`); :meth:`response` is the response as it stands (the final one once done).
    Tool calls whole or streamed (start, then argument fragments) become a ``function_call``
    item and its ``arguments.delta`` events; a flattened namespace tool's calls come back with
    their ``namespace`` and ``name`` (``names``).
    """

    def __init__(
        self,
        *,
        model: str,
        request: Mapping[str, Any],
        created: int,
        names: Mapping[str, tuple[str, str]] | None = None,
        response_id: str | None = None,
    ) -> None:
        self.id = response_id or _id("resp")
        self._model = model
        self._request = request
        self._created = created
        self._names = dict(names or {})
        self._sequence = 0
        self._started = False
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.done = False

    # -- the response object -----------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        request = self._request
        reasoning = request.get("reasoning") if isinstance(request.get("reasoning"), dict) else {}
        incomplete = None
        if self.status == "incomplete":
            reason = "content_filter" if self._finish == "content_filter" else "max_output_tokens"
            incomplete = {"reason": reason}
        final = self.status != "in_progress"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._created,
            "status": self.status,
            "error": self.error,
            "incomplete_details": incomplete,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "model": self._model,
            "output": [i.snapshot(self._item_status(i)) for i in self._items if i.done]
            if final
            else [],
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {
                "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
                "summary": None,
            },
            "store": False,
            "temperature": request.get("temperature"),
            "text": {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": list(request.get("tools") or []),
            "top_p": request.get("top_p"),
            "truncation": "disabled",
            "usage": self._usage if final else None,
            "metadata": {},
        }

    def _item_status(self, item: _Item) -> str:
        return (
            "incomplete" if self.status == "incomplete" and item.kind == "message" else "completed"
        )

    # -- events ------------------------------------------------------------------------------

    def _event(self, out: list[Event], kind: str, **fields: Any) -> None:
        out.append({"type": kind, "sequence_number": self._sequence, **fields})
        self._sequence += 1

    def start(self) -> list[Event]:
        out: list[Event] = []
        self._start(out)
        return out

    def _start(self, out: list[Event]) -> None:
        if not self._started:
            self._started = True
            self._event(out, "response.created", response=self.response())
            self._event(out, "response.in_progress", response=self.response())

    def _open_item(self, kind: str, out: list[Event], prefix: str, **fields: Any) -> _Item:
        self._close(out)
        item = _Item(kind, _id(prefix), len(self._items), **fields)
        self._items.append(item)
        self._open = item
        self._event(out, "response.output_item.added", output_index=item.index,
                    item=item.snapshot("added"))  # fmt: skip
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            self._event(out, "response.content_part.added", **self._at(item), part=part)
        elif kind == "message":
            part = _output_text_part("")
            self._event(out, "response.content_part.added", **self._at(item), part=part)
        return item

    @staticmethod
    def _at(item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def _close(self, out: list[Event]) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        item.done = True
        cut = self._finish in INCOMPLETE
        status = "incomplete" if cut and item.kind == "message" else "completed"
        final = item.snapshot(status)
        if item.kind == "reasoning":
            self._event(out, "response.reasoning_text.done", **self._at(item), text=item.text)
            self._event(out, "response.content_part.done", **self._at(item),
                        part=final["content"][0])  # fmt: skip
        elif item.kind == "message":
            self._event(out, "response.output_text.done", **self._at(item), text=item.text,
                        logprobs=[])  # fmt: skip
            self._event(out, "response.content_part.done", **self._at(item),
                        part=final["content"][0])  # fmt: skip
        else:
            self._event(out, "response.function_call_arguments.done", item_id=item.id,
                        output_index=item.index, name=item.name, arguments=item.text)  # fmt: skip
        self._event(out, "response.output_item.done", output_index=item.index, item=final)

    def _reasoning(self, text: str, out: list[Event]) -> None:
        item = self._open
        if item is None or item.kind != "reasoning":
            item = self._open_item("reasoning", out, "rs")
        item.text += text
        self._event(out, "response.reasoning_text.delta", **self._at(item), delta=text)

    def _text(self, text: str, out: list[Event]) -> None:
        item = self._open
        if item is None or item.kind != "message":
            item = self._open_item("message", out, "msg")
        item.text += text
        self._event(out, "response.output_text.delta", **self._at(item), delta=text, logprobs=[])

    def _call_start(self, call_id: Any, name: Any, out: list[Event]) -> None:
        if not isinstance(name, str) or not name:
            # A call nobody can run (canonical.tool_call): its fragments go nowhere.
            self._close(out)
            return
        namespace, name = self._names.get(name, (None, name))
        self._open_item(
            "function_call",
            out,
            "fc",
            call_id=call_id if isinstance(call_id, str) and call_id else new_call_id(),
            name=name,
            namespace=namespace,
        )

    def _call_arguments(self, text: str, out: list[Event]) -> None:
        """Argument text for the open function call (none open: dropped)."""
        item = self._open
        if item is None or item.kind != "function_call" or not text:
            return
        item.text += text
        self._event(out, "response.function_call_arguments.delta", item_id=item.id,
                    output_index=item.index, delta=text)  # fmt: skip

    def encode(self, events: Iterable[canonical.Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if self.done:
                break
            kind = event.kind
            if kind == canonical.Kind.REVISED or (
                kind == canonical.Kind.REASONING and not event.text
            ):
                continue
            self._start(out)
            if kind == canonical.Kind.TEXT:
                self._text(event.text, out)
            elif kind == canonical.Kind.TOOL_CALL_DELTA:
                self._call_arguments(event.text, out)
            elif kind == canonical.Kind.REASONING:
                self._reasoning(event.text, out)
            elif kind == canonical.Kind.TOOL_CALL:
                call = canonical.tool_call(event.call)
                if call is not None:
                    function = call["function"]
                    self._call_start(call["id"], function["name"], out)
                    self._call_arguments(function["arguments"], out)
            elif kind == canonical.Kind.TOOL_CALL_START:
                self._call_start(event.call.get("id"), event.call.get("name"), out)
            elif kind == canonical.Kind.FINISH:
                # A cut answer is incomplete even with tool calls (the last one's arguments may
                # be cut too), as the Messages encoder's max_tokens.
                self._finish = event.reason if isinstance(event.reason, str) else None
                if event.usage is not None:
                    self._usage = _response_usage(event.usage)
                out += self.finish()
            elif kind == canonical.Kind.FAILED:
                assert event.terminal is not None
                out += self.fail(run_error(event.terminal).message)
        return out

    def finish(self) -> list[Event]:
        """The provider's stream ended well: close the open item, then the terminal event."""
        out: list[Event] = []
        if self.done:
            return out
        self._start(out)
        incomplete = self._finish in INCOMPLETE
        self._close(out)
        self.status = "incomplete" if incomplete else "completed"
        self.done = True
        kind = "response.incomplete" if incomplete else "response.completed"
        self._event(out, kind, response=self.response())
        return out

    def fail(self, message: str) -> list[Event]:
        """The answer failed: one ``response.failed`` event (after ``created`` if need be)."""
        out: list[Event] = []
        if self.done:
            return out
        self._start(out)
        self.status = "failed"
        self.error = {"code": "server_error", "message": message}
        self.done = True
        self._event(out, "response.failed", response=self.response())
        return out


def chat_completion_to_response(
    completion: Mapping[str, Any],
    *,
    model: str,
    request: Mapping[str, Any],
    created: int,
    names: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A whole ``chat.completion`` (a Chat encoder's, already whole) as a ``response``: decoded
    (:class:`~.chat_decode.ChatDecoder`) and encoded; raises :class:`ApiError` 502 if it is not
    one."""
    decoder = ChatDecoder(fragments=False)
    events = decoder.completion(completion)
    if decoder.failed is not None:
        raise ApiError(502, decoder.failed, code="upstream_error")
    encoder = ResponsesEncoder(model=model, request=request, created=created, names=names)
    encoder.encode(events)
    return encoder.response()


# -- runs --------------------------------------------------------------------------------------


class RunEventsToResponses:
    """A run's events → canonical events (:class:`~.canonical.RunDecoder`, converted once) →
    Responses events (``converter``). ``hold_back``: as the Chat surface's (a streamed request
    with tools)."""

    def __init__(self, converter: ResponsesEncoder, *, hold_back: bool) -> None:
        self.decoder = canonical.RunDecoder(hold_back=hold_back)
        self.converter = converter

    def feed(self, event: RuntimeEvent) -> list[Event]:
        return self.converter.encode(self.decoder.feed(event))
