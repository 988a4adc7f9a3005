# -*- test-case-name: iop.test.edge.ingress.test_chat_decode -*-
"""
A Chat Completions answer read once: :class:`ChatDecoder` turns a provider's
``chat.completion.chunk`` stream (:meth:`ChatDecoder.feed`, :meth:`ChatDecoder.end`) or one
whole ``chat.completion`` (:meth:`ChatDecoder.completion`) into the canonical answer stream
(:mod:`.canonical`). It serves every surface that is not Chat over an ``openai_chat`` provider:
Anthropic Messages (:class:`~.messages_encode.MessagesEncoder`) and Responses
(:class:`~.responses.ResponsesEncoder`). A Chat client on a Chat provider needs none of it: the
tunnel passes the provider's bytes through.

Mapping (only the choice with ``index`` 0 is read: the bridges never ask for ``n`` > 1):

- The first chunk → start. ``delta.content`` (a string, or text parts) → text;
  ``delta.refusal`` → text marked :data:`~.canonical.REFUSAL`; ``delta.reasoning_content``, else
  ``delta.reasoning`` (the newer vLLM name) → reasoning.
- ``delta.tool_calls`` → tool calls by ``index`` (its position in the list when it has none), as
  OpenAI servers stream them: a call starts (``TOOL_CALL_START`` with its id and name) at its
  first fragment that names it, argument text that came before is sent with the start, every
  later fragment is a ``TOOL_CALL_DELTA``; ``arguments`` given as an object are sent as its
  JSON text. With ``fragments=False`` each call is one ``TOOL_CALL`` at its end instead.
- ``finish_reason`` → the finish's ``reason``; vLLM's ``stop_reason`` (the stop string that
  matched; a stop token's id is not a string and is ignored) → the finish's ``stop``; the last
  ``usage`` object in the stream (OpenAI sends it in a final chunk with no choices;
  some servers repeat it, cumulative, in every chunk) → its usage, read by
  :func:`~iop.formats.usage.openai_chat_usage`.
- The finish comes at ``data: [DONE]`` or at the body's clean end (some servers send no
  ``[DONE]``), so a usage chunk after ``finish_reason`` is still read.
- Failed: a chunk with an ``error`` object and no choices (the provider's own failure mid-stream,
  its message redacted), a chunk that is not a JSON object; and (the relay's part,
  :class:`~.relay.DecodedStream`) a body that is not SSE or is cut before its end.

Decisions where the two converters this replaced (one per surface) disagreed or said nothing;
both surfaces now do the same:

- A call that never gets a name is left out (as :func:`~.canonical.tool_call` leaves one out of
  every other answer): nobody can run it, and a client would answer it with a tool result
  nothing asked for. (The Messages converter sent it with an empty name.)
- A fragment for a call that has ended (another call, text or reasoning came since) is dropped:
  the client has already been told the call is whole. No known server sends one.
- A call whose arguments stayed empty gets ``{}``, as a Messages provider's does
  (:class:`~.chat_messages.MessagesDecoder`), so no client sees ``""`` for an object.
- Text after a tool call is text: it ends the call and follows it, in the order given.
- ``reasoning_content`` wins when a chunk carries both names (both converters agreed).
- Both ``content`` and ``refusal``, in that order, are text. A refusal with no tool calls makes
  the Messages ``stop_reason`` ``refusal`` (streamed or whole; the whole converter did so only
  when there was no content, even with tool calls); Responses shows it as text in a completed
  response, as before.
- A chunk whose choices are empty, null or missing is read for its usage only, and still starts
  the answer; an ``error`` object next to choices is ignored.
- A whole answer with no choice or a choice with no ``message`` object fails (Responses
  answered an empty response for the latter); one whose body is an error object with no choices
  fails with that error's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from iop.edge.ingress.canonical import REFUSAL, Decoding, Event, Kind
from iop.formats.errors import error_message
from iop.formats.usage import openai_chat_usage
from iop.runtime.events import Usage

__all__ = ["ChatDecoder"]


class _Call:
    """One streamed tool call: pending (no name yet: its argument text held), open, or ended."""

    __slots__ = ("arguments", "ended", "id", "name", "open")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments = ""
        self.open = False
        self.ended = False


class ChatDecoder(Decoding):
    """
    A Chat Completions answer in, canonical events out. Streamed: :meth:`feed` each SSE event's
    data (the parsed ``data:`` object), then :meth:`end` at ``[DONE]`` or the body's end; whole:
    :meth:`completion`. ``fragments``: a tool call goes out as it streams (``TOOL_CALL_START``,
    ``TOOL_CALL_DELTA`` …), else whole at its end (``TOOL_CALL``). After a finish or a failure
    nothing more; :attr:`failed` is the failure's message.
    """

    def __init__(self, *, fragments: bool = True) -> None:
        super().__init__()
        self._fragments = fragments
        self._calls: dict[int, _Call] = {}
        self._open: _Call | None = None
        self._reason: Any = None
        self._stop: str | None = None
        self._usage: Usage | None = None

    def feed(self, data: Any) -> list[Event]:
        """One ``chat.completion.chunk`` (anything else fails the answer)."""
        out: list[Event] = []
        if self.done:
            return out
        if not isinstance(data, Mapping):
            self._fail("the provider sent a malformed stream chunk", out)
            return out
        choices = data.get("choices")
        if data.get("error") is not None and not choices:
            self._fail(error_message(data) or "the provider failed", out)
            return out
        self._start(out)
        self._read_usage(data)
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, Mapping) and choice.get("index") in (0, None):
                self._choice(choice, choice.get("delta"), out)
        return out

    def end(self) -> list[Event]:
        """The stream ended well (``[DONE]``, or the body's clean end): the finish."""
        out: list[Event] = []
        if not self.done:
            self._finish(out)
        return out

    def whole(self, data: Any) -> list[Event]:
        """The provider's whole answer (parsed JSON, or None when it was not JSON) as events:
        :meth:`completion` (the relay's name for it, every decoder alike)."""
        return self.completion(data)

    def completion(self, data: Any) -> list[Event]:
        """A whole ``chat.completion`` as events (a failure when it is not one)."""
        out: list[Event] = []
        if self.done:
            return out
        if not isinstance(data, Mapping):
            self._fail("the provider's answer is not a JSON object", out)
            return out
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, Mapping):
            self._fail(error_message(data) or "the provider's answer has no choices", out)
            return out
        message = choice.get("message")
        if not isinstance(message, Mapping):
            self._fail("the provider's answer has no message", out)
            return out
        self._start(out)
        self._read_usage(data)
        self._choice(choice, message, out)
        self._finish(out)
        return out

    # -- the parts of a choice ------------------------------------------------------------------

    def _read_usage(self, data: Mapping[str, Any]) -> None:
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            self._usage = openai_chat_usage(usage)

    def _choice(self, choice: Mapping[str, Any], source: Any, out: list[Event]) -> None:
        """A choice's ``delta`` (or whole ``message``) and its finish."""
        if isinstance(source, Mapping):
            reasoning = _reasoning_text(source)
            if reasoning:
                self._end_call(out)
                out.append(Event(Kind.REASONING, reasoning))
            text = _content_text(source.get("content"))
            if text:
                self._end_call(out)
                out.append(Event(Kind.TEXT, text))
            refusal = source.get("refusal")
            if isinstance(refusal, str) and refusal:
                self._end_call(out)
                out.append(Event(Kind.TEXT, refusal, reason=REFUSAL))
            calls = source.get("tool_calls")
            for position, fragment in enumerate(calls if isinstance(calls, list) else ()):
                self._tool_fragment(position, fragment, out)
        if choice.get("finish_reason") is not None:
            self._reason = choice["finish_reason"]
        if isinstance(choice.get("stop_reason"), str):
            self._stop = choice["stop_reason"]

    def _tool_fragment(self, position: int, fragment: Any, out: list[Event]) -> None:
        if not isinstance(fragment, Mapping):
            return
        index = fragment.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = position
        call = self._calls.setdefault(index, _Call())
        if call.ended:
            return
        function = fragment.get("function")
        if not isinstance(function, Mapping):
            function = {}
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments, ensure_ascii=False)
        piece = arguments if isinstance(arguments, str) else ""
        if call.open:
            self._arguments(call, piece, out)
            return
        call_id = fragment.get("id")
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        call.arguments += piece
        name = function.get("name")
        if isinstance(name, str) and name:
            call.name = name
            self._open_call(call, out)

    def _open_call(self, call: _Call, out: list[Event]) -> None:
        self._end_call(out)
        self._open = call
        call.open = True
        held, call.arguments = call.arguments, ""
        if self._fragments:
            out.append(Event(Kind.TOOL_CALL_START, call={"id": call.id, "name": call.name}))
        self._arguments(call, held, out)

    def _arguments(self, call: _Call, piece: str, out: list[Event]) -> None:
        if piece:
            call.arguments += piece
            if self._fragments:
                out.append(Event(Kind.TOOL_CALL_DELTA, piece))

    def _end_call(self, out: list[Event]) -> None:
        """The open call (if any) is whole: nothing more goes to it."""
        call, self._open = self._open, None
        if call is None:
            return
        call.open, call.ended = False, True
        if self._fragments:
            if not call.arguments:
                out.append(Event(Kind.TOOL_CALL_DELTA, "{}"))
            return
        function = {"name": call.name, "arguments": call.arguments or "{}"}
        whole = {"id": call.id, "type": "function", "function": function}
        out.append(Event(Kind.TOOL_CALL, call=whole))

    def _finish(self, out: list[Event]) -> None:
        self._start(out)
        self._end_call(out)
        self.done = True
        out.append(Event(Kind.FINISH, reason=self._reason, usage=self._usage, stop=self._stop))


def _reasoning_text(source: Mapping[str, Any]) -> str:
    for key in ("reasoning_content", "reasoning"):
        value = source.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""
