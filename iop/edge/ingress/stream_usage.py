# -*- test-case-name: iop.test.edge.ingress.test_stream_usage -*-
"""
A Chat Completions stream passed through with the usage the Edge asked for on the client's
behalf.

A key's tokens and budgets are settled with the usage the provider reports, and the ledger
records it; a streamed Chat answer reports usage only when the request asks for it
(``stream_options.include_usage``), which most clients do not. Without it, a stream's usage is
unknown and its reservation stays charged at its worst case (its prompt plus its whole
``max_tokens``). So the Chat surface asks for the usage itself (:func:`ask_for_usage`) when the
client did not, and :class:`HiddenUsage` passes the provider's stream through unchanged but for
the one chunk the client did not ask for: the final usage chunk (``"choices": []`` with a
``usage`` object), which the node has observed on its way (the ``USAGE`` frame).

Only events that mention a usage object are parsed (one byte search per piece, as the node's
observer does); every other byte goes out as it came, at event boundaries (an incomplete event
waits for its end, which a client could not use earlier anyway). A stream with CR line ends,
an error answer or anything but an event stream is passed through untouched — the worst that
can happen is that the client sees a usage chunk it did not ask for, which every OpenAI client
reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from iop.edge.ingress.relay import Head, PassThrough
from iop.edge.tunnel import HeaderList, TunnelOutcome

__all__ = ["HiddenUsage", "ask_for_usage"]

_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_BOUNDARY = b"\n\n"


def ask_for_usage(payload: dict[str, Any]) -> None:
    """Ask the provider for a streamed answer's usage (``stream_options.include_usage``)."""
    options = payload.get("stream_options")
    payload["stream_options"] = {**(options if isinstance(options, Mapping) else {})}
    payload["stream_options"]["include_usage"] = True


def _usage_only(event: bytes) -> bool:
    """Whether one SSE event is a Chat usage chunk: ``choices`` empty, ``usage`` an object."""
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    )
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(chunk, dict)
        and chunk.get("choices") == []
        and isinstance(chunk.get("usage"), dict)
    )


class HiddenUsage:
    """:class:`~.relay.PassThrough` less the usage chunk the client did not ask for."""

    def __init__(self) -> None:
        self._pass = PassThrough()
        self._pending = b""
        # False: pass every byte through as it comes (not an event stream, or CR line ends).
        self._filtering = False

    def head(self, start: tuple[int, HeaderList]) -> Head:
        head = self._pass.head(start)
        content_type = (head.content_type or "").lower()
        self._filtering = 200 <= head.status < 300 and content_type.startswith("text/event-stream")
        return head

    def feed(self, item: bytes) -> bytes:
        if not self._filtering:
            return item
        data = self._pending + item
        if b"\r" in data:
            # Not the LF-only framing providers send: no filtering from here on.
            self._filtering, self._pending = False, b""
            return data
        cut = data.rfind(_BOUNDARY)
        if cut < 0:
            self._pending = data
            return b""
        ready, self._pending = data[: cut + 2], data[cut + 2 :]
        if _USAGE_OBJECT.search(ready) is None:
            return ready
        events = ready.split(_BOUNDARY)
        kept = [event for event in events[:-1] if not _usage_only(event)]
        return b"".join(event + _BOUNDARY for event in kept)

    def end(self, ending: TunnelOutcome) -> bytes:
        tail, self._pending = self._pending, b""
        return tail + self._pass.end(ending)
