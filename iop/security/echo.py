# -*- test-case-name: iop.test.security.test_echo,iop.test.security.test_echo_properties -*-
"""
One secret out of a byte stream an upstream sends back: what a managed node's tunnel relays.

A provider (or a proxy in front of it) may reflect the request's credential — ``Incorrect API
key: Bearer sk-…`` in a 401, a debug dump of the request headers in a 500, a header, even a
streamed body. In managed mode that credential was never the client's to see, so the node
removes the lease's secret from everything it relays: :class:`EchoRedactor` replaces every
occurrence with :data:`~iop.security.redact.REDACTED` (the marker IOP's own error texts use)
and counts them.

- **What is looked for**: the secret's bytes, which also covers the whole header value
  (``Bearer <secret>`` becomes ``Bearer [redacted]``); and, when they differ from the raw bytes,
  the secret as a JSON string escapes it (``\\"``, ``\\\\``, ``\\u00XX``; once more with ``\\/``)
  and percent-encoded (a proxy echoing a URL). For the usual keys (letters, digits, ``-``,
  ``_``) those are the same bytes and cost nothing. Out of scope: base64 (``Basic`` of
  ``user:secret``, or the secret inside a base64 blob, which has three alignments) and any
  partial or masked form (``sk-…abcd``: that is the provider masking it on purpose).
- **Across chunks**: an occurrence split between two chunks is found. At the end of a chunk,
  the longest tail that is a proper prefix of a form (at most ``len(form) - 1`` bytes) is held
  back until the next chunk shows whether it completes; nothing else is ever held. A header
  value has no LF, so the secret never starts with one: an SSE stream, whose events end in
  ``\\n\\n``, is never held back at all. :meth:`EchoRedactor.finish` flushes the held tail at a
  clean end of the stream (it is not the secret: the stream ended before it completed);
  :meth:`EchoRedactor.discard` drops it when the stream is cut, so a body cut mid-echo does not
  hand out the secret's first bytes.
- **Equivalence**: the output of any chunking equals :func:`redact_all` of the whole stream
  (leftmost, non-overlapping occurrences, form after form). A secret shorter than
  :data:`MIN_SECRET_BYTES` is not looked for (it would match ordinary text), and a secret
  containing ``[`` or ``]`` could in principle be rebuilt around the marker by an upstream that
  tried: no provider key has either.
- **The secret's lifetime**: the forms are ``bytearray`` copies, zeroed by :meth:`forget`.

The count travels to the Edge in the tunnel's last frame, under :data:`ECHOES_METADATA_KEY`.
"""

from __future__ import annotations

from iop.security.redact import REDACTED

__all__ = [
    "ECHOES_METADATA_KEY",
    "MIN_SECRET_BYTES",
    "REDACTED_BYTES",
    "EchoRedactor",
    "echo_forms",
    "redact_all",
]

REDACTED_BYTES = REDACTED.encode("ascii")
# Shorter secrets are not looked for (the same floor as an adapter's own redaction).
MIN_SECRET_BYTES = 8
# The metadata key of a tunnel's END/ERROR frame: how many echoes the node removed (decimal).
ECHOES_METADATA_KEY = "secret_echoes_redacted"

# RFC 3986 unreserved characters: left as they are by percent-encoding.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = b"0123456789ABCDEF"
_JSON_HEX = b"0123456789abcdef"


def _json_escaped(secret: bytes | bytearray, slash: bool) -> bytearray:
    out = bytearray()
    for byte in secret:
        if byte == 0x22:
            out += b'\\"'
        elif byte == 0x5C:
            out += b"\\\\"
        elif byte == 0x2F and slash:
            out += b"\\/"
        elif byte < 0x20 or byte >= 0x7F:
            out += b"\\u00"
            out.append(_JSON_HEX[byte >> 4])
            out.append(_JSON_HEX[byte & 15])
        else:
            out.append(byte)
    return out


def _percent_encoded(secret: bytes | bytearray) -> bytearray:
    out = bytearray()
    for byte in secret:
        if byte in _UNRESERVED:
            out.append(byte)
        else:
            out += b"%"
            out.append(_HEX[byte >> 4])
            out.append(_HEX[byte & 15])
    return out


def echo_forms(secret: bytes | bytearray) -> list[bytearray]:
    """
    The forms of ``secret`` an upstream may echo, each a fresh ``bytearray``: the raw bytes,
    then the JSON-escaped (with and without ``\\/``) and percent-encoded forms where they differ.
    None for a secret shorter than :data:`MIN_SECRET_BYTES`.
    """
    if len(secret) < MIN_SECRET_BYTES:
        return []
    forms = [bytearray(secret)]
    for form in (
        _json_escaped(secret, False),
        _json_escaped(secret, True),
        _percent_encoded(secret),
    ):
        if form in forms:
            form[:] = bytes(len(form))
        else:
            forms.append(form)
    return forms


def _replace(data: bytes, needle: bytearray) -> tuple[bytes, int, int]:
    """
    ``data`` with the leftmost non-overlapping occurrences of ``needle`` replaced, how many,
    and where the bytes after the last one start in the result.
    """
    found = data.find(needle)
    if found < 0:
        return data, 0, 0
    size = len(needle)
    pieces: list[bytes] = []
    start = 0
    count = 0
    while found >= 0:
        pieces.append(data[start:found])
        pieces.append(REDACTED_BYTES)
        count += 1
        start = found + size
        found = data.find(needle, start)
    done = sum(len(piece) for piece in pieces)
    pieces.append(data[start:])
    return b"".join(pieces), count, done


def _prefix_tail(data: bytes, needle: bytearray, start: int) -> int:
    """
    Where the longest tail of ``data[start:]`` that is a proper prefix of ``needle`` begins
    (``len(data)`` when there is none).
    """
    end = len(data)
    size = len(needle)
    if end <= start or needle.find(data[-1], 0, size - 1) < 0:
        # Such a tail ends with the last byte, which the needle has nowhere before its end (an
        # SSE event's LF, a JSON document's brace): the usual case, decided at once.
        return end
    first = needle[0]
    at = data.find(first, max(start, end - size + 1))
    while at >= 0:
        if needle.startswith(data[at:]):
            return at
        at = data.find(first, at + 1)
    return end


class _Form:
    """One form of the secret over one stream: the held tail and the count."""

    __slots__ = ("count", "needle", "tail")

    def __init__(self, needle: bytearray) -> None:
        self.needle = needle
        self.tail = b""
        self.count = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self.tail + chunk if self.tail else chunk
        out, count, done = _replace(data, self.needle)
        self.count += count
        cut = _prefix_tail(out, self.needle, done)
        if cut == len(out):
            self.tail = b""
            return out
        self.tail = out[cut:]
        return out[:cut]


def redact_all(data: bytes, secret: bytes | bytearray) -> tuple[bytes, int]:
    """
    The one-shot rule over a whole value: every form of ``secret`` (:func:`echo_forms`, in that
    order) replaced by ``[redacted]``, leftmost and non-overlapping; and how many were.
    """
    total = 0
    for form in echo_forms(secret):
        data, count, _ = _replace(data, form)
        total += count
        form[:] = bytes(len(form))
    return data, total


class EchoRedactor:
    """
    Removes one secret from one stream (:meth:`feed` each chunk, then :meth:`finish` or
    :meth:`discard`) and from whole values (:meth:`redact`, for headers), counting every
    occurrence removed (:attr:`count`). Never raises on its input.
    """

    def __init__(self, secret: bytes | bytearray) -> None:
        self._forms = [_Form(form) for form in echo_forms(secret)]
        # Echoes removed from whole values (headers), and by forms already forgotten.
        self._values = 0

    @property
    def active(self) -> bool:
        """Whether anything is looked for (a secret long enough, not yet forgotten)."""
        return bool(self._forms)

    @property
    def count(self) -> int:
        """Occurrences removed so far, from the stream and from whole values."""
        return sum(form.count for form in self._forms) + self._values

    @property
    def held(self) -> int:
        """Bytes held back now (each form's tail: a proper prefix of it)."""
        return sum(len(form.tail) for form in self._forms)

    def contains(self, name: bytes) -> bool:
        """
        Whether ``name`` (a header name: case does not matter, and HTTP libraries change it)
        holds any form of the secret, letters of either case.
        """
        folded = name.lower()
        for form in self._forms:
            lowered = form.needle.lower()
            try:
                if lowered in folded:
                    return True
            finally:
                lowered[:] = bytes(len(lowered))
        return False

    def redact(self, data: bytes) -> bytes:
        """A whole value (a header's) with every form replaced, counted."""
        for form in self._forms:
            data, count, _ = _replace(data, form.needle)
            self._values += count
        return data

    def note(self, count: int = 1) -> None:
        """Count ``count`` echoes removed some other way (a header dropped)."""
        self._values += count

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (and of the held tail) that can go now, redacted."""
        for form in self._forms:
            chunk = form.feed(chunk)
        return chunk

    def finish(self) -> bytes:
        """The stream ended cleanly: what is still held, in order (it holds no occurrence)."""
        out = b""
        for form in self._forms:
            # What the forms before this one flushed goes through it; then its own tail.
            flushed = form.feed(out) if out else b""
            out = flushed + form.tail
            form.tail = b""
        return out

    def discard(self) -> int:
        """The stream was cut: the held bytes are dropped; how many."""
        held = self.held
        for form in self._forms:
            form.tail = b""
        return held

    def forget(self) -> None:
        """Zero the secret's copies; nothing is looked for after this (the count stays)."""
        self._values = self.count
        for form in self._forms:
            form.needle[:] = bytes(len(form.needle))
            form.tail = b""
        self._forms = []
