# -*- test-case-name: iop.test.node.test_tunnel,iop.test.node.test_tunnel_properties -*-
"""
The Node's provider raw tunnel: one ``ProviderTunnelRequest`` becomes one HTTP request to an
OpenAI-compatible provider, and its response goes back to the Edge as ordered
``ProviderTunnelFrame``s, bytes untouched (in managed mode, but for the lease's secret: below).

::

    ProviderTunnelRequest ─▶ adapter ─▶ ITunnelProvider? ─▶ operation → URL ─▶ gate.try_acquire()
                               │             │                    │                  │
                               └─ unknown ───┴─ not HTTP ─────────┴─ no path ────────┴─ full
                                  disabled                                  ▼
                                                          one ERROR frame (nothing queued)

    open ─┬─ response ─▶ RESPONSE_START(status, headers) ─▶ BODY… ─┬─ body complete ─▶ [USAGE] END
          │                                                        └─ connection broke ─▶ ERROR
          ├─ connect failure (no response) ───────────────────────────────────────────────▶ ERROR
          ├─ CANCEL_RUN ──────────────▶ ERROR "cancelled…"   (request aborted / connection closed)
          ├─ idle / overall timeout ──▶ ERROR "upstream idle…" / "request timed out…"  (aborted,
          │                              error_code upstream_timeout)
          └─ edge session lost ───────▶ aborted; nothing can be sent
                                         │
                           ended: timers stopped, slot released, exactly once

Frames per run id carry ``sequence`` 1, 2, 3…: at most one ``RESPONSE_START``, first;
``BODY`` frames only after it, each at most :data:`BODY_FRAME_BYTES`, concatenating to exactly
the bytes the upstream sent (managed mode: with its echoes of the lease's secret replaced; a
turn's first chunk at once, the rest of that turn's in one frame);
then exactly one ``END`` or ``ERROR``, and nothing after it. An upstream non-2xx answer is not
an error: it is passed through (``RESPONSE_START`` with its status, its body, ``END``).
``USAGE`` is observation only: the body is read on the side (SSE events or one JSON document)
for the usage the provider reported, and one ``USAGE`` frame goes out before ``END`` when there
was any. The body itself is never parsed into anything else, re-encoded or held back beyond the
end of its reactor turn.

Admission goes through the adapter instance's :class:`~iop.node.adapters.capacity.CapacityGate`,
the same gate normalized runs use, on the same path (:class:`~iop.node.work.WorkManager`); an
at-capacity ERROR frame carries ``metadata[error_code] = provider_at_capacity``. The slot is
released before the last frame goes out, so an Edge that dispatches the next request on seeing
``END``/``ERROR`` finds it free.

Credentials: the adapter's configured headers are sent upstream and appear nowhere else (not in
frames, errors or logs); a request's own headers pass only through an allow-list and can never
replace a configured header or carry credentials of their own.

Managed mode (the manager has a :class:`~iop.security.lease.LeaseVerifier`): every tunnel must
carry ``credential_lease`` and ``credential_binding`` (else one ERROR ``lease_missing``, before
admission). After admission — the capacity slot taken — and immediately before the provider
call, the binding is checked against the request itself (its ``target`` and ``profile``) and
against the adapter instance that would receive it (its configured profile, its name, and the
origin of its ``base_url``: a lease minted for another adapter or upstream on this node is
refused, ``lease_binding_mismatch``), the lease is verified and opened
(:meth:`~iop.security.lease.LeaseVerifier.open`), and ``<auth_header>: <auth_scheme> <secret>``
is put on that one upstream request only; the plaintext ``bytearray`` is zeroed as soon as the
request has been handed to the HTTP client. What the upstream sends back may echo that secret (a
401 quoting the header, a debug 500, a proxy): for the rest of the tunnel an
:class:`~iop.security.echo.EchoRedactor` holds a copy, replaces every occurrence in the
response headers and body chunks (one split across chunks too) with ``[redacted]``, and is
zeroed when the tunnel ends; the count goes to the Edge in the last frame's metadata
(:data:`~iop.security.echo.ECHOES_METADATA_KEY`) and into one warning. The body bytes are then
the upstream's except for those replacements, and a chunk's tail that may still become the
secret waits for the next chunk. Any lease failure ends the tunnel with one ERROR
frame whose text starts with the failure class (``lease_expired: …``) and whose ``error_code``
metadata is that class; nothing reaches the upstream. A legacy node (no verifier) refuses any
request carrying a lease: it cannot verify one, and fails closed.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from iop.formats.sse import DEFAULT_MAX_EVENT_BYTES, SSEError, SSEParser
from iop.formats.usage import anthropic_usage, openai_chat_usage, openai_responses_usage
from iop.node.adapters.capacity import Slot
from iop.node.adapters.http_client import PreparedURL, prepared_url
from iop.node.adapters.http_stream import ended_cleanly, read_body
from iop.node.adapters.openai_compat import describe_failure
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.work import CONNECTION_LOST_REASON, Refusal, WorkManager
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.events import Usage
from iop.runtime.interfaces import ITunnelProvider
from iop.runtime.spec import RuntimeProfile
from iop.security.echo import ECHOES_METADATA_KEY, EchoRedactor
from iop.security.lease import (
    LEASE_BINDING_MISMATCH,
    LEASE_MALFORMED,
    LEASE_MISSING,
    LeaseError,
    LeaseVerifier,
    upstream_origin,
    zero,
)
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import usage_to_proto

__all__ = [
    "BODY_FRAME_BYTES",
    "DEFAULT_OPERATION_PATHS",
    "TunnelFrames",
    "TunnelManager",
    "UsageObserver",
    "filter_response_headers",
    "upstream_request_headers",
]

# At most this many dropped request header names are logged per tunnel.
_LOGGED_HEADER_NAMES = 16

# A BODY frame carries at most this many bytes; larger upstream chunks are split.
BODY_FRAME_BYTES = 256 * 1024
DEFAULT_IDLE_TIMEOUT = 120.0
# A non-streaming body larger than this is still passed through, but not parsed for usage.
USAGE_JSON_LIMIT = 32 * 1024 * 1024
CANCELLED = "cancelled"

# Provider paths of the named operations, when the adapter's profile does not name them.
DEFAULT_OPERATION_PATHS: Mapping[str, str] = {
    "chat_completions": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
    "count_tokens": "/messages/count_tokens",
    "models": "/models",
}
# Operations whose answers report token usage (an empty operation: tell by the body's shape).
USAGE_OPERATIONS = frozenset({"chat_completions", "responses", "messages", ""})

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# Request headers of the Edge's request that may reach the provider. Everything else is dropped.
FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "content-type",
        "accept",
        "user-agent",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "x-request-id",
        "idempotency-key",
    }
)
# Never taken from the request, whatever the allow-list says: credentials are the adapter's.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
)
# Response headers that describe one hop (or the body's framing) and are not passed back.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


# An event that may report usage: a "usage" key whose value is an object (content deltas have
# none, or ``"usage": null``).
_USAGE_OBJECT = re.compile(r'"usage"\s*:\s*\{')
_USAGE_OBJECT_BYTES = re.compile(rb'"usage"\s*:\s*\{')


def _seconds(value: float) -> str:
    return f"{value:g}"


# -- headers ----------------------------------------------------------------------------------


def _clean(value: str) -> bool:
    return "\r" not in value and "\n" not in value and "\0" not in value


def upstream_request_headers(
    configured: Mapping[str, str],
    requested: Iterable[pb.Header],
    auth_header: str = "",
    has_body: bool = True,
) -> tuple[Headers, list[str]]:
    """
    The headers of the provider request: the adapter's ``configured`` headers (credentials),
    plus those of ``requested`` whose names are on :data:`FORWARDED_REQUEST_HEADERS` and are not
    configured, not the profile's ``auth_header`` and not a credential header. A body without a
    content type is sent as ``application/json``. Also returns the names of the dropped request
    headers (for a debug log: names only, never values).
    """
    blocked = {name.strip().lower() for name in configured} | CREDENTIAL_HEADERS
    if auth_header:
        blocked.add(auth_header.strip().lower())
    out: dict[str, list[str]] = {}
    dropped: list[str] = []
    for header in requested:
        name = header.name.strip().lower()
        if name in FORWARDED_REQUEST_HEADERS and name not in blocked and _clean(header.value):
            out.setdefault(name, []).append(header.value)
        else:
            dropped.append(name)
    if has_body and "content-type" not in out and "content-type" not in blocked:
        out["content-type"] = ["application/json"]
    for name, value in configured.items():
        out[name] = [value]
    return Headers(out), dropped


def filter_response_headers(
    headers: Headers,
    redact: Callable[[str], str] = lambda text: text,
    echo: EchoRedactor | None = None,
) -> list[tuple[str, str]]:
    """
    The provider's response headers to pass back: without hop-by-hop and length headers (and
    any named by ``Connection``), each value through ``redact``. With ``echo`` (managed mode:
    the lease's secret), a header whose name holds the secret is dropped and every value has
    it replaced, each counted by ``echo``.
    """
    named = {
        token.strip().lower()
        for value in headers.getRawHeaders(b"connection", [])
        for token in value.decode("latin-1").split(",")
    }
    out: list[tuple[str, str]] = []
    for raw_name, values in headers.getAllRawHeaders():
        name = raw_name.decode("latin-1")
        lowered = name.lower()
        if lowered in HOP_BY_HOP_HEADERS or lowered in named:
            continue
        if echo is not None and echo.contains(raw_name):
            # A name cannot carry the marker (no brackets in a header name): the header goes.
            echo.note(len(values))
            continue
        for value in values:
            if echo is not None:
                value = echo.redact(value)
            out.append((name, redact(value.decode("latin-1"))))
    return out


# -- usage observation ------------------------------------------------------------------------


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


# -- frames -----------------------------------------------------------------------------------


class _FrameState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    ENDED = "ended"


class TunnelFrames:
    """
    The frames of one tunnel, in an order that is always valid: every method sends its frame
    only when it may come next (and says whether it did), so no caller can produce
    ``BODY`` before ``RESPONSE_START``, a second ``RESPONSE_START``, or anything after
    ``END``/``ERROR``. Sequences are 1, 2, 3…; a ``BODY`` larger than ``body_frame_bytes`` is
    split over several frames.
    """

    log = Logger()

    def __init__(
        self,
        run_id: str,
        send: Callable[[pb.ProviderTunnelFrame], None],
        body_frame_bytes: int = BODY_FRAME_BYTES,
    ) -> None:
        if body_frame_bytes < 1:
            raise ValueError("body_frame_bytes must be at least 1")
        self.run_id = run_id
        self._send = send
        self._body_frame_bytes = body_frame_bytes
        self._state = _FrameState.NEW
        self.sequence = 0
        self.body_bytes = 0
        self.status_code: int | None = None

    @property
    def started(self) -> bool:
        return self._state is not _FrameState.NEW

    @property
    def ended(self) -> bool:
        return self._state is _FrameState.ENDED

    def start(self, status_code: int, headers: Sequence[tuple[str, str]]) -> bool:
        if not self._expect(_FrameState.NEW, "RESPONSE_START"):
            return False
        self._state = _FrameState.STARTED
        self.status_code = status_code
        self._emit(
            pb.ProviderTunnelFrame(
                kind=pb.RESPONSE_START,
                status_code=status_code,
                headers=[pb.Header(name=name, value=value) for name, value in headers],
            )
        )
        return True

    def body(self, data: bytes) -> bool:
        if not self._expect(_FrameState.STARTED, "BODY"):
            return False
        step = self._body_frame_bytes
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            self.body_bytes += len(piece)
            self._emit(pb.ProviderTunnelFrame(kind=pb.BODY, body=piece))
        return True

    def usage(self, usage: Usage) -> bool:
        if not self._expect(_FrameState.STARTED, "USAGE"):
            return False
        self._emit(pb.ProviderTunnelFrame(kind=pb.USAGE, usage=usage_to_proto(usage)))
        return True

    def end(self, metadata: Mapping[str, str] | None = None) -> bool:
        """The last frame of a complete response: END, with ``metadata`` if given."""
        if not self._expect(_FrameState.STARTED, "END"):
            return False
        self._state = _FrameState.ENDED
        self._emit(pb.ProviderTunnelFrame(kind=pb.END, end=True, metadata=metadata))
        return True

    def error(self, message: str, metadata: Mapping[str, str] | None = None) -> bool:
        """The last frame: ERROR ``message``, with ``metadata`` (an error code) if given."""
        if self._state is _FrameState.ENDED:
            self._dropped("ERROR")
            return False
        self._state = _FrameState.ENDED
        self._emit(
            pb.ProviderTunnelFrame(kind=pb.ERROR, end=True, error=message, metadata=metadata)
        )
        return True

    def _expect(self, state: _FrameState, kind: str) -> bool:
        if self._state is state:
            return True
        self._dropped(kind)
        return False

    def _dropped(self, kind: str) -> None:
        self.log.warn(
            "not sending {kind} frame of tunnel {run_id}: the tunnel is {state}",
            kind=kind,
            run_id=self.run_id,
            state=self._state.value,
        )

    def _emit(self, frame: pb.ProviderTunnelFrame) -> None:
        self.sequence += 1
        frame.run_id = self.run_id
        frame.sequence = self.sequence
        self._send(frame)


# -- one tunnel -------------------------------------------------------------------------------


class _Tunnel:
    """One admitted tunnel: its timers, its upstream exchange, and its single end."""

    def __init__(
        self,
        manager: TunnelManager,
        request: pb.ProviderTunnelRequest,
        instance: AdapterInstance,
        provider: ITunnelProvider,
        slot: Slot,
        method: str,
        url: PreparedURL,
        path: str,
        headers: Headers,
    ) -> None:
        self.manager = manager
        self.run_id = request.run_id
        self.instance = instance
        self.provider = provider
        self.target = request.target
        self.operation = request.operation
        self.stream = request.stream
        self.timeout_sec = float(request.timeout_sec)
        self.method = method
        self.path = path
        self._url = url
        self._headers = headers
        self._body = request.body
        self._slot = slot
        self._request = request if manager.leases is not None else None
        self.started_at = manager.clock.seconds()
        # For the one log line at the end: the gate's occupancy when admitted, the request
        # header names not forwarded (a bounded number, each clipped).
        self.gate_in_use = instance.gate.in_use
        self.dropped_headers: list[str] = []
        self.frames = TunnelFrames(self.run_id, manager._send_frame, manager.body_frame_bytes)
        self.over = False
        self._inner: Deferred[None] | None = None
        self._idle_call: IDelayedCall | None = None
        self._last_data = 0.0
        self._bound_call: IDelayedCall | None = None
        self._idle = float(provider.idle_timeout or DEFAULT_IDLE_TIMEOUT)
        # Body bytes of this reactor turn, not yet in a frame (:meth:`_held_body`).
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_call: IDelayedCall | None = None
        # Managed mode: the lease's secret, removed from everything relayed back (status line,
        # headers, body) until the tunnel ends.
        self._echo: EchoRedactor | None = None

    @property
    def adapter(self) -> str:
        return self.instance.name

    def start(self) -> None:
        self._arm()
        self._inner = Deferred.fromCoroutine(self._main())
        self._inner.addErrback(self._failed)

    def abort(self, reason: str, metadata: Mapping[str, str] | None = None) -> bool:
        """
        End now with ERROR ``reason`` (and ``metadata``) and abort the upstream exchange;
        False if over.
        """
        if self.over:
            return False
        self._end(reason, metadata)
        inner = self._inner
        if inner is not None and not inner.called:
            inner.cancel()
        return True

    # -- the exchange ------------------------------------------------------------------------

    async def _main(self) -> None:
        provider = self.provider
        headers = self._headers
        secret: bytearray | None = None
        if self._request is not None:
            try:
                secret = self.manager._open_lease(self._request, self.instance, provider)
                slot = self._request.credential_binding.slot
                headers = _with_credential(headers, provider.profile, slot, secret)
                redactor = EchoRedactor(secret)
                self._echo = redactor if redactor.active else None
            except LeaseError as e:
                if secret is not None:
                    zero(secret)
                self.manager.log.warn(
                    "tunnel {run_id} on adapter {adapter}: credential lease refused: {error}",
                    run_id=self.run_id,
                    adapter=self.adapter,
                    error=str(e),
                    error_code=e.code,
                    node_id=self.manager._node_id,
                )
                self._end(str(e), {ERROR_CODE_KEY: e.code})
                return
            finally:
                self._request = None
        try:
            sent = provider.http.request(
                self.method,
                self._url,
                headers=headers,
                data=self._body if self._body else None,
                unbuffered=True,
                allow_redirects=False,
                reactor=provider.clock,
            )
        finally:
            # The request (and its headers) is the HTTP client's now: the plaintext goes.
            if secret is not None:
                zero(secret)
            del headers
        response: IResponse = await sent
        if self.over:
            return
        self._touch()
        # Only the status code goes back (the Edge writes its own reason phrase): the
        # upstream's status line, which may echo too, is not relayed at all.
        echo = self._echo
        self.frames.start(
            response.code, filter_response_headers(response.headers, provider.redact, echo)
        )
        observer = self._observer(response)

        def on_data(data: bytes) -> None:
            if observer is not None:
                observer.feed(data)
            if echo is not None:
                # At most a tail that may still become the secret is held back here.
                data = echo.feed(data)
                if not data:
                    self._touch()
                    return
            self._held_body(data)

        reason = await read_body(response, on_data)
        if self.over:
            return
        if echo is not None:
            if ended_cleanly(reason):
                # What was held could not become the secret: the body ended first.
                tail = echo.finish()
                if tail:
                    self._held_body(tail)
            else:
                # A body cut mid-echo: the secret's first bytes are not handed out.
                echo.discard()
        self._send_held_body()
        if not ended_cleanly(reason):
            self._end(
                f"upstream connection lost after {self.frames.body_bytes} body bytes: "
                f"{describe_failure(reason)}"
            )
            return
        usage = observer.finish() if observer is not None else None
        if usage is not None:
            self.frames.usage(usage)
        self._end(None)

    # -- body frames -------------------------------------------------------------------------

    def _held_body(self, data: bytes) -> None:
        """
        The first chunk of a reactor turn goes out at once; the chunks that follow it in the
        same turn (a burst of SSE events in one TCP read) are held and go out together, as
        one ``BODY`` frame, when the turn ends. A token stream's chunks, one per turn, are
        never delayed; a burst costs two frames, not one per chunk. Bytes and order are
        untouched.
        """
        if self._flush_call is None:
            # Data arrived: the idle timer restarts (once per turn is enough).
            self._touch()
            self._flush_call = self.manager.clock.callLater(0, self._send_held_body)
            self.frames.body(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= self.manager.body_frame_bytes:
            self._send_held_body()

    def _send_held_body(self) -> None:
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held = []
        self._held_bytes = 0
        self.frames.body(data)

    def _observer(self, response: IResponse) -> UsageObserver | None:
        if self.operation not in USAGE_OPERATIONS or not 200 <= response.code < 300:
            return None
        content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0].lower()
        if content_type.startswith(b"text/event-stream"):
            return UsageObserver(sse=True)
        if b"json" in content_type:
            return UsageObserver(sse=False)
        return UsageObserver(sse=self.stream)

    def _failed(self, failure: Failure) -> None:
        if self.over:
            return
        why = describe_failure(failure.value) if failure.value is not None else "unknown failure"
        if self.frames.started:
            self._end(f"upstream connection lost after {self.frames.body_bytes} body bytes: {why}")
        else:
            self._end(f"upstream request failed: {why}")

    # -- time bounds -------------------------------------------------------------------------

    def _arm(self) -> None:
        clock = self.manager.clock
        if self.timeout_sec > 0:
            self._bound_call = clock.callLater(
                self.timeout_sec,
                self._expired,
                f"request timed out after {_seconds(self.timeout_sec)}s",
            )
        self._last_data = clock.seconds()
        self._idle_call = clock.callLater(self._idle, self._idle_check)

    def _touch(self) -> None:
        # Only the time is noted: the idle timer looks at it when it fires (no timer reset
        # per chunk).
        self._last_data = self.manager.clock.seconds()

    def _idle_check(self) -> None:
        left = self._last_data + self._idle - self.manager.clock.seconds()
        if left > 0:
            self._idle_call = self.manager.clock.callLater(left, self._idle_check)
        else:
            self._idle_call = None
            self._expired(f"upstream idle for {_seconds(self._idle)}s")

    def _disarm(self) -> None:
        for call in (self._idle_call, self._bound_call):
            if call is not None and call.active():
                call.cancel()
        self._idle_call = self._bound_call = None

    def _expired(self, reason: str) -> None:
        self.manager._timed_out(self, reason)

    # -- the one end -------------------------------------------------------------------------

    def _end(self, error: str | None, metadata: Mapping[str, str] | None = None) -> None:
        """
        Stop timers, release the slot, send END (``error`` None) or ERROR (with ``metadata``),
        exactly once.
        """
        if self.over:
            return
        # What the upstream sent before the end goes first.
        self._send_held_body()
        self.over = True
        self._request = None
        self._disarm()
        self._slot.release()
        self.manager._forget(self)
        echoes = self._forget_secret()
        if echoes:
            metadata = {**(metadata or {}), ECHOES_METADATA_KEY: str(echoes)}
        if error is None:
            self.frames.end(metadata)
        else:
            self.frames.error(self.provider.redact(error), metadata)
        self.manager._ended(self, error)

    def _forget_secret(self) -> int:
        """Zero the lease secret's copies; how many echoes of it were removed (logged once)."""
        echo, self._echo = self._echo, None
        if echo is None:
            return 0
        echo.discard()
        echo.forget()
        if echo.count:
            self.manager.log.warn(
                "tunnel {run_id} on adapter {adapter}: the upstream echoed the leased credential;"
                " {echoes} occurrence(s) redacted from the response",
                run_id=self.run_id,
                adapter=self.adapter,
                echoes=echo.count,
                status_code=self.frames.status_code,
                node_id=self.manager._node_id,
            )
        return echo.count


def _valid_header_value(value: bytearray) -> bool:
    """Visible characters and spaces only (no CR, LF, NUL or other controls)."""
    return bool(value) and all(b >= 0x20 and b != 0x7F for b in value) and value.strip() == value


def _with_credential(
    headers: Headers, profile: RuntimeProfile | None, slot: str, secret: bytearray
) -> Headers:
    """
    A copy of ``headers`` with ``<auth_header>: <auth_scheme> <secret>`` (the bare secret
    without a scheme), replacing any value of that header. The header's value is necessarily an
    immutable copy, held by the request until it is written; ``secret`` itself is zeroed by the
    caller. A lease bound to no credential ``slot`` (a provider that takes none) authorizes the
    request and carries an empty secret: ``headers`` go as they are.
    """
    if not slot:
        if secret:
            raise LeaseError(LEASE_MALFORMED, "a lease bound to no credential carries a secret")
        return headers
    assert profile is not None and profile.auth_header  # checked at admission
    if not _valid_header_value(secret):
        raise LeaseError(LEASE_MALFORMED, "the leased credential is not a valid header value")
    scheme = profile.auth_scheme.strip()
    value = (scheme.encode("latin-1") + b" " if scheme else b"") + bytes(secret)
    out = headers.copy()
    out.setRawHeaders(profile.auth_header.strip().encode("latin-1"), [value])
    return out


# -- the manager ------------------------------------------------------------------------------


class _Plan(NamedTuple):
    """What admission found out about a tunnel request."""

    provider: ITunnelProvider
    method: str
    path: str


class TunnelManager(WorkManager[pb.ProviderTunnelRequest, _Plan, _Tunnel]):
    """
    Serves the Edge's ``ProviderTunnelRequest``s of one session on the adapters of
    ``registry``.

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge.
    :param clock: idle and overall timeouts.
    :param node_id: for logs.
    :param body_frame_bytes: the largest body a ``BODY`` frame carries.
    :param leases: managed mode: the verifier of this node's credential leases (None: legacy,
        leases refused).
    """

    log = Logger()
    noun: ClassVar[str] = "provider tunnel"
    request_noun: ClassVar[str] = "provider tunnel request"
    active_noun: ClassVar[str] = "tunnel"
    lost_message: ClassVar[str] = "edge connection lost; aborting {count} provider tunnel(s)"

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        clock: IReactorTime,
        node_id: str = "",
        body_frame_bytes: int = BODY_FRAME_BYTES,
        leases: LeaseVerifier | None = None,
    ) -> None:
        super().__init__(registry, send, clock, node_id)
        self.body_frame_bytes = body_frame_bytes
        self.leases = leases
        self._counts = {"completed": 0, "error": 0, "cancelled": 0, "rejected": 0}

    # -- envelope handlers (install these on the session) -------------------------------------

    def tunnel_request_received(self, envelope: pb.Envelope) -> None:
        """The ``provider_tunnel_request`` handler."""
        self.submit(envelope.provider_tunnel_request)

    def cancel_request_received(self, envelope: pb.Envelope) -> None:
        """
        A ``CANCEL_RUN`` for a tunnel: abort it (its ERROR frame goes out) and answer with a
        ``CancelResponse``.
        """
        request = envelope.cancel_request
        ok = request.kind == pb.CANCEL_RUN and self.cancel(request.run_id, request.reason)
        self._safe_send(
            pb.Envelope(
                cancel_response=pb.CancelResponse(
                    kind=request.kind,
                    run_id=request.run_id,
                    session_id=request.session_id,
                    ok=ok,
                    reason="" if ok else f"no active tunnel {request.run_id!r} on this node",
                )
            ),
            request.run_id,
        )

    # -- tunnels -----------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Abort an open tunnel: the upstream is disconnected, its ERROR says ``cancelled``."""
        tunnel = self._active.get(run_id)
        if tunnel is None:
            return False
        message = f"{CANCELLED}: {reason}" if reason else CANCELLED
        self.log.info(
            "cancelling tunnel {run_id} on adapter {adapter}: {reason}",
            run_id=run_id,
            adapter=tunnel.adapter,
            reason=reason or "cancelled by edge",
            node_id=self._node_id,
        )
        return tunnel.abort(message)

    # -- admission (the shared skeleton's hooks) ---------------------------------------------

    def _check(self, request: pb.ProviderTunnelRequest, instance: AdapterInstance) -> _Plan:
        provider = ITunnelProvider(instance.provider, None)
        if provider is None:
            raise Refusal(
                f"adapter {instance.name!r} (type {instance.type}) cannot serve provider tunnels;"
                " only HTTP providers (openai_compat, vllm) can"
            )
        self._check_lease_presence(request, instance, provider)
        method = (request.method or "POST").upper()
        if method not in ALLOWED_METHODS:
            raise Refusal(f"method {request.method!r} is not allowed for provider tunnels")
        path, problem = self._path(request, instance, provider)
        if problem:
            raise Refusal(problem)
        return _Plan(provider, method, path)

    def _check_lease_presence(
        self,
        request: pb.ProviderTunnelRequest,
        instance: AdapterInstance,
        provider: ITunnelProvider,
    ) -> None:
        has_lease = bool(request.credential_lease)
        has_binding = request.HasField("credential_binding")
        if self.leases is None:
            if has_lease or has_binding:
                # Fail closed: this node cannot verify a managed credential lease.
                raise Refusal("managed credential leases are not supported by this node")
            return
        if not has_lease:
            raise Refusal(
                f"{LEASE_MISSING}: this node runs in managed mode and every provider tunnel"
                " needs a credential lease",
                code=ErrorCode.LEASE_MISSING,
                adapter=instance.name,
            )
        if not has_binding:
            raise Refusal(
                f"{LEASE_MALFORMED}: a credential lease without its credential_binding",
                code=ErrorCode.LEASE_MALFORMED,
                adapter=instance.name,
            )
        profile = provider.profile
        needs_header = bool(request.credential_binding.slot)
        if needs_header and (profile is None or not profile.auth_header.strip()):
            raise Refusal(
                f"adapter {instance.name!r} has no protocol profile naming an auth_header:"
                " a leased credential has no header to go in",
                adapter=instance.name,
            )

    def _open_lease(
        self,
        request: pb.ProviderTunnelRequest,
        instance: AdapterInstance,
        provider: ITunnelProvider,
    ) -> bytearray:
        """
        The binding against the request itself and against the adapter that would receive it
        (its instance name, and the origin of the URL the credential would go to), then the
        lease opened: the secret (zero it), or :class:`LeaseError`.
        """
        assert self.leases is not None
        binding = request.credential_binding
        profile = provider.profile
        try:
            origin = upstream_origin(provider.base_url)
        except ValueError:
            origin = ""  # matches no lease: the Edge binds only an http(s) origin
        mismatched = [
            name
            for name, same in (
                ("target", binding.target == request.target),
                ("profile", binding.profile == request.profile),
                ("adapter profile", binding.profile == (profile.name if profile else "")),
                ("adapter", binding.adapter == instance.name),
                ("upstream origin", bool(origin) and binding.upstream_origin == origin),
            )
            if not same
        ]
        if mismatched:
            raise LeaseError(
                LEASE_BINDING_MISMATCH,
                f"the credential binding does not match the request's {', '.join(mismatched)}",
            )
        return self.leases.open(request.credential_lease, binding, self.clock.seconds())

    def _open(
        self,
        request: pb.ProviderTunnelRequest,
        instance: AdapterInstance,
        plan: _Plan,
        slot: Slot,
    ) -> _Tunnel:
        provider = plan.provider
        profile = provider.profile
        headers, dropped = upstream_request_headers(
            provider.configured_headers(),
            request.headers,
            auth_header=profile.auth_header if profile is not None else "",
            has_body=bool(request.body),
        )
        tunnel = _Tunnel(
            self,
            request,
            instance,
            provider,
            slot,
            plan.method,
            prepared_url(provider.base_url + plan.path),
            plan.path,
            headers,
        )
        if dropped:
            # Names the Edge sent (a client's, really): a bounded number, each clipped.
            names = sorted(set(dropped))
            tunnel.dropped_headers = [name[:64] for name in names[:_LOGGED_HEADER_NAMES]]
        return tunnel

    def _start(self, tunnel: _Tunnel, request: pb.ProviderTunnelRequest) -> None:
        tunnel.start()

    def _refused(self, request: pb.ProviderTunnelRequest, refusal: Refusal) -> None:
        self._counts["rejected"] += 1
        TunnelFrames(request.run_id, self._send_frame).error(refusal.reason, refusal.metadata)

    def _lose(self, tunnel: _Tunnel, reason: str) -> None:
        tunnel.abort(reason)

    # -- status ------------------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        """Open tunnels (identities and progress only) and counters of ended ones."""
        return {
            "active": [
                {
                    "run_id": tunnel.run_id,
                    "adapter": tunnel.adapter,
                    "operation": tunnel.operation,
                    "started_unix_ms": int(tunnel.started_at * 1000),
                    "status_code": tunnel.frames.status_code,
                    "body_bytes": tunnel.frames.body_bytes,
                }
                for tunnel in self._active.values()
            ],
            **self._counts,
        }

    # -- internals ---------------------------------------------------------------------------

    def _path(
        self,
        request: pb.ProviderTunnelRequest,
        instance: AdapterInstance,
        provider: ITunnelProvider,
    ) -> tuple[str, str]:
        """The provider path of the request, or a reason it has none."""
        operation = request.operation
        if operation:
            profile = provider.profile
            path = profile.operations.get(operation, "") if profile is not None else ""
            path = path or DEFAULT_OPERATION_PATHS.get(operation, "")
            if not path:
                return "", f"adapter {instance.name!r} has no path for operation {operation!r}"
            return (path if path.startswith("/") else "/" + path), ""
        path = request.path
        if not path:
            return "", "provider tunnel request without an operation or a path"
        if not path.startswith("/") or path.startswith("//") or not _clean(path) or " " in path:
            return "", "provider tunnel path must be a relative path starting with '/'"
        return path, ""

    def _send_frame(self, frame: pb.ProviderTunnelFrame) -> None:
        self._safe_send(pb.Envelope(provider_tunnel_frame=frame), frame.run_id)

    def _timed_out(self, tunnel: _Tunnel, reason: str) -> None:
        self.log.warn(
            "tunnel {run_id} on adapter {adapter}: {error}",
            run_id=tunnel.run_id,
            adapter=tunnel.adapter,
            error=reason,
            node_id=self._node_id,
        )
        tunnel.abort(reason, {ERROR_CODE_KEY: ErrorCode.UPSTREAM_TIMEOUT.value})

    def _ended(self, tunnel: _Tunnel, error: str | None) -> None:
        if error is None:
            outcome = "completed"
        elif error.startswith(CANCELLED) or error == CONNECTION_LOST_REASON:
            outcome = "cancelled"
        else:
            outcome = "error"
        self._counts[outcome] += 1
        # The tunnel's one log line: what it was, how it ended, how much and how long.
        self.log.info(
            "tunnel {run_id} {adapter}/{target} {method} {path} ended: {outcome}{detail},"
            " status {status_code}, {body_bytes} bytes in {duration_sec} s",
            run_id=tunnel.run_id,
            adapter=tunnel.adapter,
            target=tunnel.target,
            operation=tunnel.operation or "path",
            method=tunnel.method,
            path=tunnel.path,
            stream=tunnel.stream,
            outcome=outcome,
            detail=f" ({tunnel.provider.redact(error)})" if error else "",
            status_code=tunnel.frames.status_code,
            body_bytes=tunnel.frames.body_bytes,
            frames=tunnel.frames.sequence,
            duration_sec=round(self.clock.seconds() - tunnel.started_at, 3),
            in_use=tunnel.gate_in_use,
            limit=tunnel.instance.gate.limit,
            dropped_headers=tunnel.dropped_headers or None,
            node_id=self._node_id,
        )
