# -*- test-case-name: iop.test.edge.ingress.test_messages_encode -*-
"""
The Messages surface's one answer encoder: canonical answer events (:mod:`.canonical`) in,
Anthropic Messages stream events and the whole ``message`` out, in the exact shapes of the
Messages API (:class:`MessagesEncoder`). Whatever served the request, its answer was decoded
into canonical events first: a Chat provider's through the tunnel by
:class:`~iop.edge.ingress.chat_decode.ChatDecoder` (streamed or whole), a normalized run's
(Ollama, CLI agents) by :class:`RunEventsToMessages` / :func:`run_events_to_message` through the
one run conversion (:class:`~iop.edge.ingress.canonical.RunDecoder`). A native Messages
provider's answer is passed through and never comes here.

Pure conversion: no I/O, no reactor.

Stream events are ``(event_name, data)`` tuples in the order of the Messages streaming API:
``message_start``; per content block ``content_block_start``, ``content_block_delta`` …,
``content_block_stop`` (blocks never interleave: one is closed before the next opens);
``message_delta`` (``stop_reason``, cumulative ``usage``); ``message_stop``. A failure is one
``error`` event and nothing after it. :func:`format_sse` renders an event as SSE bytes. No
``ping`` events are produced (:data:`PING` is there for a caller's keep-alive).

Answer mapping decisions:

- Content order: a ``thinking`` block (from ``reasoning_content`` or ``reasoning``, only when
  thinking is allowed; its ``signature`` is empty, there being nothing to sign), then text, then
  ``tool_use`` blocks. Callers should pass ``thinking_allowed=profiles.thinking_allowed(profile)
  and bridge.thinking_requested(body)`` so that a client that did not ask for thinking never
  sees a thinking block, as with the real API.
- ``stop_reason``: ``length`` → ``max_tokens``, ``content_filter`` → ``refusal``, any tool call →
  ``tool_use``, a refusal (text marked :data:`~.canonical.REFUSAL`) → ``refusal``, a stop string
  reported by the backend (vLLM's ``stop_reason``, the finish's ``stop``) → ``stop_sequence``,
  anything else → ``end_turn``.
- Usage (the finish's): ``input_tokens`` is the prompt's tokens minus the cached ones and
  ``cache_read_input_tokens`` the cached ones when reported (a Chat provider's
  ``prompt_tokens_details.cached_tokens``), as Anthropic counts them; ``output_tokens`` is the
  completion's. Nothing is estimated: ``message_start`` carries ``input_tokens`` 0 (or the
  caller's figure) and the final ``message_delta`` the reported totals.
- Tool arguments that are not a JSON object become ``{"raw_arguments": "<text>"}`` rather than
  being lost (an empty string is ``{}``).
- Tool-call ids pass through unchanged, so a ``tool_result`` refers to the same id the backend
  issued; a missing id gets a fresh ``toolu_…``; a call with no name is left out
  (:func:`~.canonical.tool_call`).
- Streamed tool calls (``TOOL_CALL_START`` / ``TOOL_CALL_DELTA``) are relayed as they come: the
  block opens with the call's id and name, each argument fragment is an ``input_json_delta``,
  and the whole ``message`` parses the fragments joined (by the rule above). A whole call's
  arguments go out as one ``input_json_delta`` of the normalised input.
- Normalized runs: ``metadata["openai_tool_calls"]`` become ``tool_use`` blocks; only when
  ``metadata["openai_text_tool_fallback"] == "true"`` are tool calls also parsed out of the text
  (:func:`iop.edge.ingress.tools.parse_text_tool_calls`). Text from a ``{`` or ```` ``` ````
  that could open such a ``{"tool_calls": …}`` reply is held back until the run completes
  (:class:`~iop.edge.ingress.canonical.RunDecoder`), so a tool-call reply never reaches the
  client as text; text that turns out not to be one is sent in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from iop.edge.ingress import canonical
from iop.edge.ingress.tools import new_call_id
from iop.formats.sse import format_event
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.security.redact import redact_secrets

__all__ = [
    "PING",
    "Event",
    "MessagesEncoder",
    "RunEventsToMessages",
    "UpstreamError",
    "anthropic_error",
    "format_sse",
    "new_message_id",
    "run_events_to_message",
    "stop_reason_for",
]

Event = tuple[str, dict[str, Any]]
PING: Event = ("ping", {"type": "ping"})


class UpstreamError(Exception):
    """A run that failed, was cancelled or ended without a result: ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def anthropic_error(message: str, error_type: str = "api_error") -> dict[str, Any]:
    """An Anthropic error body (also the data of a stream ``error`` event)."""
    return {"type": "error", "error": {"type": error_type, "message": message}}


def format_sse(event_name: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``event: <name>``, ``data: <compact JSON>``, a blank line."""
    return format_event(data, event_name)


def new_message_id() -> str:
    return new_call_id("msg_")


def new_tool_use_id() -> str:
    return new_call_id("toolu_")


# -- answers: canonical events → Messages ------------------------------------------------------


def stop_reason_for(finish_reason: Any, *, tool_calls: bool) -> str:
    """An Anthropic ``stop_reason`` for an OpenAI ``finish_reason``."""
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "content_filter":
        return "refusal"
    if tool_calls:
        return "tool_use"
    return "end_turn"


def _tool_input(arguments: str) -> dict[str, Any]:
    """Tool-call arguments (JSON text) as a ``tool_use`` input object."""
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
        if isinstance(parsed, str):
            parsed = json.loads(parsed)
    except ValueError:
        return {"raw_arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"raw_arguments": arguments}


def _message_usage(usage: Usage | None, input_tokens: int) -> dict[str, Any]:
    """A message's ``usage``: Anthropic counts input without the cache reads; ``input_tokens``
    (the caller's figure) stands in when nothing was reported."""
    if usage is None:
        return {"input_tokens": input_tokens, "output_tokens": 0}
    cached = usage.cached_input_tokens
    out: dict[str, Any] = {
        "input_tokens": max(0, usage.input_tokens - (cached or 0)),
        "output_tokens": usage.output_tokens,
    }
    if cached is not None:
        out["cache_read_input_tokens"] = cached
    return out


def _delta_usage(usage: Usage | None) -> dict[str, Any]:
    """The final ``message_delta``'s cumulative ``usage`` (only what was reported)."""
    if usage is None:
        return {"output_tokens": 0}
    return _message_usage(usage, 0)


def _run_failure(event: RuntimeEvent) -> str:
    if event.type == EventType.CANCELLED:
        return f"the run was cancelled: {event.error or 'cancelled'}"
    return event.error or "the run failed"


class MessagesEncoder:
    """
    Canonical answer events (:mod:`.canonical`) in, Anthropic stream events out
    (:meth:`encode`); the same object keeps the message as streamed, :meth:`message`, the whole
    ``message`` once finished.

    Blocks open lazily and never interleave (opening one closes the one before): text, thinking
    (only when ``thinking_allowed``), each tool call a ``tool_use`` block — opened with its id
    (a fresh ``toolu_…`` when it has none) and name, its arguments as ``input_json_delta``
    events, a whole call's as one (its input normalised), a streamed call's fragment by fragment
    as they come (the whole message parses them joined). The finish is ``message_delta`` +
    ``message_stop``, a failure one ``error`` event; nothing after either.
    """

    def __init__(
        self,
        *,
        model: str,
        thinking_allowed: bool,
        message_id: str | None = None,
        input_tokens: int = 0,
    ) -> None:
        self.message_id = message_id or new_message_id()
        self.model = model
        self._thinking = thinking_allowed
        self._input_tokens = input_tokens
        self._started = False
        self.done = False
        # The error message, once the answer failed.
        self.failed: str | None = None
        self._content: list[dict[str, Any]] = []
        # The argument text of each tool_use block (by its index).
        self._tool_json: dict[int, str] = {}
        # The open block's type, if a block is open.
        self._open: str | None = None
        self._refused = False
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self._usage: Usage | None = None

    def start(self) -> list[Event]:
        """``message_start`` now (else it goes out with the answer's first event)."""
        out: list[Event] = []
        self._start(out)
        return out

    def encode(self, events: Iterable[canonical.Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if self.done:
                break
            kind = event.kind
            if kind == canonical.Kind.TEXT:
                self._text(event.text, out)
                if event.reason == canonical.REFUSAL and event.text:
                    self._refused = True
            elif kind == canonical.Kind.TOOL_CALL_DELTA:
                self._tool_json_delta(event.text, out)
            elif kind == canonical.Kind.START:
                self._start(out)
            elif kind == canonical.Kind.REASONING:
                self._start(out)
                if self._thinking and event.text:
                    self._thinking_delta(event.text, out)
            elif kind == canonical.Kind.TOOL_CALL:
                call = canonical.tool_call(event.call, prefix="toolu_")
                if call is not None:
                    function = call["function"]
                    self._open_tool(call["id"], function["name"], out)
                    normalised = _tool_input(function["arguments"])
                    self._tool_json_delta(json.dumps(normalised, ensure_ascii=False), out)
            elif kind == canonical.Kind.TOOL_CALL_START:
                self._open_tool(event.call.get("id"), event.call.get("name"), out)
            elif kind == canonical.Kind.FINISH:
                self._finish(event, out)
            elif kind == canonical.Kind.FAILED:
                assert event.terminal is not None
                self._fail(_run_failure(event.terminal), "api_error", out)
        return out

    def fail(self, message: str, error_type: str = "api_error") -> list[Event]:
        """The answer is lost (say, its node went away): one ``error`` event."""
        out: list[Event] = []
        self._fail(message, error_type, out)
        return out

    def message(self) -> dict[str, Any]:
        """The message as streamed so far (complete once the stream finished)."""
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [self._snapshot(i, block) for i, block in enumerate(self._content)],
            "stop_reason": self._stop_reason,
            "stop_sequence": self._stop_sequence,
            "usage": _message_usage(self._usage, self._input_tokens),
        }

    # -- the event sequence ----------------------------------------------------------------------

    def _start(self, out: list[Event]) -> None:
        if self._started or self.done:
            return
        self._started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        out.append(("message_start", {"type": "message_start", "message": message}))

    def _close(self, out: list[Event]) -> None:
        if self._open is None:
            return
        self._open = None
        index = len(self._content) - 1
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))

    def _begin(self, block: dict[str, Any], out: list[Event]) -> None:
        self._close(out)
        self._start(out)
        self._content.append(block)
        index = len(self._content) - 1
        self._open = block["type"]
        started = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": started},
            )
        )

    def _delta(self, delta: dict[str, Any], out: list[Event]) -> None:
        index = len(self._content) - 1
        out.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )

    def _text(self, text: str, out: list[Event]) -> None:
        if not text:
            return
        if self._open != "text":
            self._begin({"type": "text", "text": ""}, out)
        self._content[-1]["text"] += text
        self._delta({"type": "text_delta", "text": text}, out)

    def _thinking_delta(self, text: str, out: list[Event]) -> None:
        if self._open != "thinking":
            self._begin({"type": "thinking", "thinking": "", "signature": ""}, out)
        self._content[-1]["thinking"] += text
        self._delta({"type": "thinking_delta", "thinking": text}, out)

    def _open_tool(self, call_id: Any, name: Any, out: list[Event]) -> None:
        if not isinstance(name, str) or not name:
            # A call nobody can run (canonical.tool_call): none of its fragments may reach the
            # block before it.
            self._close(out)
            return
        call_id = call_id if isinstance(call_id, str) and call_id else new_tool_use_id()
        self._begin({"type": "tool_use", "id": call_id, "name": name, "input": {}}, out)
        self._tool_json[len(self._content) - 1] = ""

    def _tool_json_delta(self, partial: str, out: list[Event]) -> None:
        """Argument text for the open tool block (none open: dropped)."""
        if not partial or self._open != "tool_use":
            return
        self._tool_json[len(self._content) - 1] += partial
        self._delta({"type": "input_json_delta", "partial_json": partial}, out)

    def _finish(self, event: canonical.Event, out: list[Event]) -> None:
        self._start(out)
        self._close(out)
        has_calls = bool(self._tool_json)
        stop_reason = stop_reason_for(event.reason, tool_calls=has_calls)
        stop_sequence = None
        if self._refused and not has_calls:
            stop_reason = "refusal"
        elif event.reason == "stop" and not has_calls and event.stop is not None:
            stop_reason, stop_sequence = "stop_sequence", event.stop
        self.done = True
        self._stop_reason, self._stop_sequence, self._usage = (
            stop_reason,
            stop_sequence,
            event.usage,
        )
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": _delta_usage(event.usage)},
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))

    def _fail(self, message: str, error_type: str, out: list[Event]) -> None:
        if self.done:
            return
        self.done = True
        # The message often carries an upstream's or a node's text: IOP's own error event.
        message = redact_secrets(message)
        self.failed = message
        out.append(("error", anthropic_error(message, error_type)))

    def _snapshot(self, index: int, block: dict[str, Any]) -> dict[str, Any]:
        if index in self._tool_json:
            return {**block, "input": _tool_input(self._tool_json[index])}
        return dict(block)


class RunEventsToMessages(MessagesEncoder):
    """
    Normalized run events in (:meth:`feed`), Anthropic stream events out: the run's one
    conversion (:class:`~.canonical.RunDecoder`, holding back text that may open a text
    tool-call reply) and the Messages encoder.
    """

    def __init__(
        self,
        *,
        model: str,
        thinking_allowed: bool,
        message_id: str | None = None,
        input_tokens: int = 0,
    ) -> None:
        super().__init__(
            model=model,
            thinking_allowed=thinking_allowed,
            message_id=message_id,
            input_tokens=input_tokens,
        )
        self.decoder = canonical.RunDecoder(hold_back=True, release_on_reasoning=thinking_allowed)

    def feed(self, event: RuntimeEvent) -> list[Event]:
        if self.done:
            return []
        return self.encode(self.decoder.feed(event))


def run_events_to_message(
    events: Iterable[RuntimeEvent], *, model: str, thinking_allowed: bool
) -> dict[str, Any]:
    """
    A whole run's events as one Anthropic ``message``. Raises :class:`UpstreamError` when the
    run failed, was cancelled or ended without a terminal event.
    """
    converter = RunEventsToMessages(model=model, thinking_allowed=thinking_allowed)
    for event in events:
        converter.feed(event)
        if converter.done:
            break
    if converter.failed is not None:
        raise UpstreamError(converter.failed)
    if not converter.done:
        raise UpstreamError("the run ended without a result")
    return converter.message()
