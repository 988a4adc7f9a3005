# -*- test-case-name: iop.test.edge.ingress.test_canonical -*-
"""
The one answer stream every surface encodes: :class:`Event`, and a run's events converted to it
exactly once (:class:`RunDecoder`).

A source's answer, whatever wire carried it, becomes a sequence of canonical events:

==============  ============================================================================
``START``       the answer started (a surface's opening event: ``message_start``, the role
                chunk, ``response.created``)
``TEXT``        answer text (``text``); ``reason`` is :data:`REFUSAL` when the text is the
                model's refusal (OpenAI's ``refusal`` field): shown as text, and the Messages
                surface's ``stop_reason`` is ``refusal``
``REASONING``   reasoning text (``text``, may be empty: a surface decides what it shows)
``TOOL_CALL``   one whole tool call (``call``: the provider's object, its ``id``, ``name`` and
                ``arguments`` as given — each surface normalises them its own way)
``REVISED``     the text so far is really ``text`` (a text tool-call reply parsed out of an
                answer that was not held back: a whole-body encoder reads it; a stream has
                already sent what it sent)
``FINISH``      the answer ended well: the provider's ``reason`` (OpenAI's finish reasons, as
                reported, or None), its ``usage``, and ``stop``: the stop string that ended it
                when the provider names it (vLLM's ``stop_reason``; Messages'
                ``stop_sequence``), else None
``FAILED``      the answer failed: ``terminal`` is the failing run event
==============  ============================================================================

A tool call may also stream as it comes: ``TOOL_CALL_START`` (``call``: its ``id``, possibly
empty, and ``name``), then ``TOOL_CALL_DELTA`` events (``text``: the next argument fragment);
the call ends where the next call, text, reasoning or the finish begins. A decoder sends no
fragment for a call that has ended.

Each surface has a stream encoder and a whole-body encoder over these events
(:class:`~.openai.ChatEncoder`, :class:`~.messages_encode.MessagesEncoder`,
:class:`~.responses.ResponsesEncoder`), and each reads every kind: a whole ``TOOL_CALL`` is
encoded as a start and its arguments in one fragment. The decoders: :class:`RunDecoder` (a
normalized run), :class:`~.chat_decode.ChatDecoder` (a Chat Completions answer through the
tunnel, for the Messages and Responses surfaces), :class:`~.chat_messages.MessagesDecoder` (a
native Messages answer, for the Chat and Responses surfaces) and
:class:`~.chat_responses.ResponsesDecoder` (a native Responses answer, for the Chat and
Messages surfaces). No code converts one wire's answer into another's directly.

:class:`RunDecoder` is the one place a normalized run's events are read: ``delta`` → text,
``reasoning_delta`` → reasoning, ``complete`` → tool calls (``metadata["openai_tool_calls"]``,
and text tool calls when ``metadata["openai_text_tool_fallback"] == "true"``) and the finish,
``error``/``cancelled`` → failed. With ``hold_back`` (a streamed request with tools), text that
may open a text tool-call reply is held until the run completes, so it never reaches the
client as text; this is the only copy of that rule.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any, NamedTuple

from iop.edge.ingress.tools import (
    MARKER_MATCH,
    MARKER_NO,
    new_call_id,
    parse_text_tool_calls,
    tool_call_marker_state,
)
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.security.redact import redact_secrets

__all__ = [
    "FINISH_REASONS",
    "REFUSAL",
    "START",
    "Event",
    "Kind",
    "RunDecoder",
    "finish_reason",
    "tool_call",
]

# Where a text tool-call reply may begin: a JSON object or a code fence.
_CANDIDATE = re.compile(r"[{`]")
# The finish reasons an answer reports as they are (OpenAI's vocabulary).
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
# The ``reason`` of a TEXT event that is the model's refusal.
REFUSAL = "refusal"


def finish_reason(reported: Any, *, tool_calls: bool) -> str:
    """How an answer finished: ``tool_calls`` when it has calls, else the provider's reason
    when it is one of :data:`FINISH_REASONS`, else ``stop``."""
    if tool_calls:
        return "tool_calls"
    if reported in FINISH_REASONS:
        return str(reported)
    return "stop"


def tool_call(call: Any, *, prefix: str = "call_") -> dict[str, Any] | None:
    """One tool call in the canonical shape, OpenAI's ``message.tool_calls`` entry (a name, the
    arguments as JSON text, an id made up with ``prefix`` when it has none), or None when it
    has no name: a call nobody can run is left out, on every surface."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    source = function if isinstance(function, dict) else call
    name = source.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = source.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = call.get("id")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else new_call_id(prefix),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class Kind(enum.Enum):
    START = "start"
    TEXT = "text"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_DELTA = "tool_call_delta"
    REVISED = "revised"
    FINISH = "finish"
    FAILED = "failed"


class Event(NamedTuple):
    """One canonical answer event (module docstring); a tuple: cheap to make, per delta."""

    kind: Kind
    text: str = ""
    call: Any = None
    reason: Any = None
    usage: Usage | None = None
    terminal: RuntimeEvent | None = None
    stop: str | None = None


START = Event(Kind.START)


class Decoding:
    """
    What every decoder of a provider's answer keeps (:class:`~.chat_decode.ChatDecoder`,
    :class:`~.chat_messages.MessagesDecoder`, :class:`~.chat_responses.ResponsesDecoder`):
    whether the answer started (one ``START``), whether it is ``done``, and why it ``failed``
    (IOP's own message, redacted: it often carries the provider's text).
    """

    def __init__(self) -> None:
        self._started = False
        self.done = False
        self.failed: str | None = None

    def _start(self, out: list[Event]) -> None:
        if not self._started:
            self._started = True
            out.append(START)

    def _fail(self, message: str, out: list[Event]) -> None:
        self.done = True
        message = redact_secrets(message)
        self.failed = message
        out.append(Event(Kind.FAILED, terminal=RuntimeEvent.failed(message)))


class RunDecoder:
    """
    A normalized run's events in, canonical events out (:meth:`feed`); after the terminal event
    nothing more. ``hold_back``: text that may open a text tool-call reply is held until the
    run completes. ``release_on_reasoning``: held text (not yet surely a tool call) goes out
    before reasoning, keeping the order of the answer's parts (Messages' content blocks).
    """

    def __init__(self, *, hold_back: bool, release_on_reasoning: bool = False) -> None:
        self._hold_back = hold_back
        self._release_on_reasoning = release_on_reasoning
        self._held = ""
        self._locked = False
        # All text sent, when nothing is held back (a fallback reply is parsed out of it).
        self._text = ""
        self._started = False
        self.terminal: RuntimeEvent | None = None

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def feed(self, event: RuntimeEvent) -> list[Event]:
        out: list[Event] = []
        if self.terminal is not None:
            return out
        kind = event.type
        if kind == EventType.DELTA:
            if not self._started:
                self._start(out)
            self._delta(event.delta, out)
        elif kind == EventType.START:
            self._start(out)
        elif kind == EventType.REASONING_DELTA:
            if self._release_on_reasoning and event.delta and not self._locked:
                self._release(out)
            out.append(Event(Kind.REASONING, event.delta))
        elif kind == EventType.COMPLETE:
            self.terminal = event
            self._complete(event, out)
        else:
            self.terminal = event
            out.append(Event(Kind.FAILED, terminal=event))
        return out

    def _start(self, out: list[Event]) -> None:
        # Every encoder's start is idempotent: one START is enough.
        if not self._started:
            self._started = True
            out.append(START)

    def _emit(self, text: str, out: list[Event]) -> None:
        if text:
            if not self._hold_back:
                self._text += text
            out.append(Event(Kind.TEXT, text))

    def _release(self, out: list[Event]) -> None:
        held, self._held = self._held, ""
        self._emit(held, out)

    def _delta(self, delta: str, out: list[Event]) -> None:
        if not self._hold_back:
            self._emit(delta, out)
            return
        if self._locked:
            self._held += delta
            return
        pending, self._held = self._held + delta, ""
        search = 0
        while True:
            match = _CANDIDATE.search(pending, search)
            if match is None:
                self._emit(pending, out)
                return
            position = match.start()
            state = tool_call_marker_state(pending[position:])
            if state == MARKER_NO:
                search = position + 1
                continue
            self._emit(pending[:position], out)
            self._held = pending[position:]
            self._locked = state == MARKER_MATCH
            return

    def _complete(self, event: RuntimeEvent, out: list[Event]) -> None:
        self._start(out)
        metadata = event.metadata
        calls: list[Any] = []
        raw = metadata.get("openai_tool_calls")
        if raw:
            try:
                decoded = json.loads(raw)
            except ValueError:
                decoded = None
            if isinstance(decoded, list):
                calls.extend(decoded)
        held, self._held, self._locked = self._held, "", False
        if metadata.get("openai_text_tool_fallback") == "true":
            # The fallback's reply is the whole text; parse what was held, or all of it when
            # nothing was (an answer not held back).
            source = held if held else (self._text if not self._hold_back else "")
            remaining, parsed = parse_text_tool_calls(source)
            if parsed:
                calls.extend(parsed)
                if held:
                    held = remaining
                else:
                    self._text = remaining
                    out.append(Event(Kind.REVISED, remaining))
        self._emit(held, out)
        out.extend(Event(Kind.TOOL_CALL, call=call) for call in calls)
        out.append(Event(Kind.FINISH, reason=metadata.get("finish_reason"), usage=event.usage))
