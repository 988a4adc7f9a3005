# -*- test-case-name: iop.test.node.test_tunnel -*-
"""
A provider tunnel's usage observation: the token usage the provider reported, found by reading
a copy of the response body on the side (SSE events or one JSON document).

Observation only: the body is never parsed into anything else, changed or held back for it, and
a body the observer cannot read just has no usage. On a stream, only whole events that mention
a usage object are decoded (content deltas are skipped by one byte search), so the per-chunk
cost stays a scan. The tunnel sends what was found as one ``USAGE`` frame before ``END``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from twisted.logger import Logger
from twisted.web.iweb import IResponse

from iop.formats.sse import DEFAULT_MAX_EVENT_BYTES, SSEError, SSEParser
from iop.formats.usage import anthropic_usage, openai_chat_usage, openai_responses_usage
from iop.runtime.events import Usage
from iop.runtime.kinds import GENERATE_OPERATIONS

__all__ = ["USAGE_JSON_LIMIT", "USAGE_OPERATIONS", "UsageObserver", "usage_observer"]

# A non-streaming body larger than this is still passed through, but not parsed for usage.
USAGE_JSON_LIMIT = 32 * 1024 * 1024
# Operations whose answers report token usage: every protocol driver's generating operation (an
# empty operation: tell by the body's shape).
USAGE_OPERATIONS = GENERATE_OPERATIONS | {""}

# An event that may report usage: a "usage" key whose value is an object (content deltas have
# none, or ``"usage": null``).
_USAGE_OBJECT = re.compile(r'"usage"\s*:\s*\{')
_USAGE_OBJECT_BYTES = re.compile(rb'"usage"\s*:\s*\{')


class UsageObserver:
    """
    Reads a copy of a response body on the side and finds the usage the provider reported in
    it; never changes the body and never raises (a body it cannot read just has no usage).

    ``sse=True``: Server-Sent Events — OpenAI Chat chunks with ``usage`` (the last one wins),
    OpenAI Responses ``response.completed`` (``response.usage``), Anthropic ``message_start``
    (``message.usage``) merged with ``message_delta`` (``usage``). Otherwise one JSON document:
    a Chat completion, a Responses ``response`` or an Anthropic ``message``.
    """

    log = Logger()

    def __init__(self, sse: bool, json_limit: int = USAGE_JSON_LIMIT) -> None:
        self._sse = sse
        self._parser = SSEParser() if sse else None
        # SSE with LF line ends (what providers send): the bytes since the last event boundary.
        # Only whole events that mention a usage object are parsed; a CR anywhere hands the
        # rest of the stream to the full parser (``_pending`` None).
        self._pending: bytes | None = b""
        self._json_limit = json_limit
        self._parts: list[bytes] = []
        self._size = 0
        self._broken = False
        self._chat: Mapping[str, Any] | None = None
        self._responses: Mapping[str, Any] | None = None
        self._anthropic: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            if self._parser is not None and self._pending is not None:
                self._scan(data)
            elif self._parser is not None:
                for event in self._parser.feed(data):
                    self._event(event.data)
            else:
                self._size += len(data)
                if self._size > self._json_limit:
                    self._stop("the body is too large to look for usage in")
                    return
                self._parts.append(data)
        except Exception as e:
            self._stop(f"{type(e).__name__}: {e}")

    def finish(self) -> Usage | None:
        """The usage found in the whole body, or None."""
        if self._broken:
            return None
        try:
            if self._parser is not None:
                if self._pending:
                    # The last event without its blank line: the parser dispatches it at the end.
                    for event in self._parser.feed(self._pending):
                        self._event(event.data)
                for event in self._parser.finish():
                    self._event(event.data)
            else:
                self._document(b"".join(self._parts))
        except Exception as e:
            self._stop(f"{type(e).__name__}: {e}")
            return None
        if self._anthropic is not None:
            return anthropic_usage(self._anthropic)
        if self._responses is not None:
            return openai_responses_usage(self._responses)
        if self._chat is not None:
            return openai_chat_usage(self._chat)
        return None

    def _scan(self, data: bytes) -> None:
        assert self._parser is not None and self._pending is not None
        if b"\r" in data:
            pending, self._pending = self._pending, None
            for event in self._parser.feed(pending + data):
                self._event(event.data)
            return
        buffer = self._pending + data if self._pending else data
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            if len(buffer) > DEFAULT_MAX_EVENT_BYTES:
                raise SSEError("an event is larger than the limit")
            self._pending = buffer
            return
        whole, self._pending = buffer[: cut + 2], buffer[cut + 2 :]
        if _USAGE_OBJECT_BYTES.search(whole) is None:
            # No event here reports usage: nothing to parse. (The parser has seen nothing but
            # whole events, so it is at a boundary and can take the next ones.)
            return
        for event in self._parser.feed(whole):
            self._event(event.data)

    def _stop(self, why: str) -> None:
        self._broken = True
        self._parts = []
        self.log.debug("not observing tunnel usage: {why}", why=why)

    def _event(self, data: str) -> None:
        # Most events are content deltas without a usage object: not decoded at all.
        if _USAGE_OBJECT.search(data) is None:
            return
        try:
            value = json.loads(data)
        except ValueError:
            return
        if not isinstance(value, dict):
            return
        kind = value.get("type")
        if kind == "message_start":
            message = value.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._anthropic = dict(usage)
        elif kind == "message_delta":
            usage = value.get("usage")
            if isinstance(usage, dict):
                merged = dict(self._anthropic or {})
                merged.update({k: v for k, v in usage.items() if v is not None})
                self._anthropic = merged
        elif isinstance(kind, str) and kind.startswith("response."):
            response = value.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                self._responses = usage
        elif isinstance(value.get("usage"), dict):
            self._chat = value["usage"]

    def _document(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            value = json.loads(raw)
        except ValueError:
            return
        if not isinstance(value, dict) or not isinstance(value.get("usage"), dict):
            return
        usage = value["usage"]
        if value.get("type") == "message":
            self._anthropic = dict(usage)
        elif value.get("object") == "response":
            self._responses = usage
        elif "prompt_tokens" in usage or "completion_tokens" in usage:
            self._chat = usage


def usage_observer(operation: str, stream: bool, response: IResponse) -> UsageObserver | None:
    """
    The observer for a tunnel's response, or None when it is not looked at: an operation that
    reports no usage, or a non-2xx answer. SSE or JSON by the response's content type, else by
    whether the request asked for a stream.
    """
    if operation not in USAGE_OPERATIONS or not 200 <= response.code < 300:
        return None
    content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0].lower()
    if content_type.startswith(b"text/event-stream"):
        return UsageObserver(sse=True)
    if b"json" in content_type:
        return UsageObserver(sse=False)
    return UsageObserver(sse=stream)
