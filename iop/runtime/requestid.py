# -*- test-case-name: iop.test.runtime.test_requestid -*-
"""
A client request's id: the rule that keeps or replaces the one a client sends, the form of a
new one, and the key that carries it across the Edge-Node wire.

Every client answer carries ``x-request-id`` (and, on the Anthropic surface, ``request-id``);
the same id is in the Edge's access log line, the usage ledger, error bodies, ``/status``, the
node's run store and log lines, and the upstream request (docs/observability.md).

**Kept or replaced** (:func:`accepted`): a client's ``x-request-id`` is kept when the request
carries exactly one such header and its value is 1 to 128 characters of ``[A-Za-z0-9._:-]``.
That admits every id format in common use — UUIDs, ULIDs, the providers' own ``req_…`` ids,
W3C trace ids, Envoy's and AWS's ids, ``host:pid:seq`` counters — and nothing that could break
or forge a line in the places the id is written: no space, quote, comma, semicolon, slash,
``=``, control or non-ASCII character, so the id is safe as a header value, in a JSON or text
log line, a SQL value and a shell argument, and 128 characters bound what a client can make
every one of those records cost. Anything else (absent, empty, too long, two headers — which
one would be meant? —, a comma-joined list) is replaced by a new id; the client's value is
never echoed, logged or sent on.

**A new id** (:func:`new_request_id`) is ``req_`` followed by a ULID: 48 bits of milliseconds
since the epoch and 80 random bits in Crockford base32 (26 characters). The ``req_`` prefix is
the one OpenAI's and Anthropic's ids have (an operator sees at once that it is a request id);
the time prefix makes ids sort by arrival, so a grep or an ``ORDER BY request_id`` is also
chronological and an id alone says roughly when the request came; 80 random bits make a
collision between Edges of a cluster negligible without any coordination.

**On the wire** the id rides in the request's existing ``metadata`` map
(``RunRequest.metadata``, ``ProviderTunnelRequest.metadata``) under :data:`REQUEST_ID_KEY`; a
node applies :func:`carried` (the same rule: an id that is not sane is dropped, never used).
:func:`log_context` is what a log line about a request's work adds, on either side (with the
trace's ``trace_id`` and ``span_id`` when the work is traced).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "ANTHROPIC_HEADER",
    "HEADER",
    "MAX_LENGTH",
    "REQUEST_ID_KEY",
    "accepted",
    "carried",
    "is_sane",
    "log_context",
    "new_request_id",
]

# The response (and request) header every surface uses; Anthropic's SDK reads ``request-id``.
HEADER = "x-request-id"
ANTHROPIC_HEADER = "request-id"
# The key in RunRequest.metadata / ProviderTunnelRequest.metadata.
REQUEST_ID_KEY = "request_id"
MAX_LENGTH = 128

_SANE = re.compile(rf"[A-Za-z0-9._:\-]{{1,{MAX_LENGTH}}}\Z")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def is_sane(value: str | bytes) -> bool:
    """Whether ``value`` is an id the gateway keeps (module docstring)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return False
    return _SANE.match(value) is not None


def new_request_id(now: float, entropy: Callable[[int], bytes] = os.urandom) -> str:
    """A new id, ``req_`` + a ULID of ``now`` (seconds since the epoch) and 80 random bits."""
    millis = max(0, int(now * 1000)) & ((1 << 48) - 1)
    number = (millis << 80) | int.from_bytes(entropy(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[number & 31])
        number >>= 5
    return "req_" + "".join(reversed(chars))


def accepted(
    values: Sequence[str | bytes] | None,
    now: float,
    entropy: Callable[[int], bytes] = os.urandom,
) -> str:
    """
    The request's id from the values of its ``x-request-id`` header lines: the client's when
    there is exactly one and it is sane, else a new one (module docstring).
    """
    if values is not None and len(values) == 1 and is_sane(values[0]):
        value = values[0]
        return value.decode("ascii") if isinstance(value, bytes) else value
    return new_request_id(now, entropy)


def carried(metadata: Mapping[str, str]) -> str:
    """The request id a run's or tunnel's metadata carries; "" when none, or not a sane one."""
    value = metadata.get(REQUEST_ID_KEY, "")
    return value if value and is_sane(value) else ""


def log_context(request_id: str, trace: Mapping[str, str] | None = None) -> dict[str, str]:
    """
    The keys a log event about a request's work carries, on the Edge and on a node (a JSON log
    line shows each one): ``request_id`` when there is one, and with ``trace`` (the work's
    span's ids, :func:`iop.telemetry.propagation.log_ids`: ``trace_id``, ``span_id``) those,
    so a log line leads to its trace and back.
    """
    out = {REQUEST_ID_KEY: request_id} if request_id else {}
    if trace:
        out.update(trace)
    return out
