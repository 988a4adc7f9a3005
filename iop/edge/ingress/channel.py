# -*- test-case-name: iop.test.edge.ingress.test_channel -*-
"""
The client listener's HTTP/1.1 connection: ``twisted.web``'s ``HTTPChannel`` held to what a
gateway facing the internet needs.

``HTTPChannel`` parses; :class:`ClientChannel` refuses what it must not let through, answers
each refusal with the surface's JSON error (OpenAI shape, Anthropic shape when the path starts
with ``/v1/messages`` or an ``anthropic-version`` header was seen) and closes the connection:

- **framing (RFC 9112 §6)**: a ``Transfer-Encoding`` other than exactly ``chunked``, two
  ``Transfer-Encoding`` lines, ``Transfer-Encoding`` with ``Content-Length``, a transfer coding
  on HTTP/1.0, two ``Content-Length`` lines or one that is not a plain decimal: 400, so no
  request can hide in another's body. A ``Content-Length`` or a sum of chunk sizes over
  ``openai.max_body_bytes``: 413 at once (at the end of the head), before the bytes are read;
- **sizes**: a request line over the head limit (16 KiB): 414; a header line, all the headers or
  their count over the limit: 431; any other malformed head or chunk framing: 400;
- **targets and methods**: a request target that is not a path (``*``, ``host:port``): 400; the
  absolute form (``http://host/path``) is served as its path; a method the API does not serve
  (``get`` is not ``GET``): 405 with ``Allow``;
- **time**: the head must arrive whole within ``request_head_timeout_sec`` of the connection
  opening (of its first byte on a kept-alive connection); a body gets
  ``request_body_timeout_sec`` plus one second per ``request_body_min_rate`` bytes received
  (the model of Apache's ``mod_reqtimeout``: a client sending at the minimum rate never times
  out, one trickling bytes does): 408 past either; ``idle_timeout_sec`` without a byte closes;
- **connections** (:class:`ConnectionCounter`, its caps from :mod:`iop.edge.descriptors`): at
  most ``max_connections`` served at once and ``max_connections_per_peer`` from one address. At
  the total cap, the oldest connection that has not sent a whole request head in
  :data:`EVICT_AFTER_SEC` is answered 503 and closed to make room (a slow-header client loses
  its place to a new one, never a kept-alive or busy connection); with none, and past the
  per-peer cap, the new one is answered 503 and closed. Served and refused connections together
  hold at most ``descriptors``: at that cap the site accepts nothing more (each connection
  already accepted is closed at once, unanswered) and the listening port stops reading until
  one closes, so the client listener never takes the descriptors the node and admin listeners
  need (``EMFILE`` on their ``accept()``).

Every refusal carries the request's id (``x-request-id``, and ``request-id`` on the Anthropic
surface, and in its body: :mod:`.requestid`): the client's when its head had one sane
``x-request-id`` line before the refusal, else a new one.

With ``openai.cors``, a refusal to a request from an allowed origin carries the
``Access-Control-*`` headers (:mod:`.cors`), so a page can read why it was refused.

**Draining** (the Edge stops, :mod:`.drain`): :meth:`ClientChannel.drain` closes a kept-alive
connection with no request at once; a request already read, or still arriving, is served to
its end and answered with ``Connection: close`` (a response already started gets no header:
the connection closes after it), so no request the Edge has read is refused, and a client's
next request opens a connection that lands on another Edge. :meth:`ClientChannel.cut` aborts
the connection when the drain's bound has passed (the work is cancelled as when a client goes
away).

Every deadline runs on the site's clock (``callLater``). A refusal is a lingering close: the
answer and a FIN are sent, what the client still sends is read and dropped, and a client that
has not closed :data:`ABORT_AFTER_SEC` later is aborted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import (
    RESPONSES,
    HTTPChannel,
    _ChunkedTransferDecoder,
)

from iop.config.model import ClientAPIConfig
from iop.edge.descriptors import refusal_room
from iop.edge.events import RequestFinished
from iop.edge.ingress.cors import CorsPolicy
from iop.edge.ingress.errors import ANTHROPIC, OPENAI, ApiError, error_types
from iop.edge.ingress.record import Publish, bounded_code
from iop.edge.ingress.requestid import response_headers
from iop.runtime.requestid import accepted

__all__ = [
    "ABORT_AFTER_SEC",
    "EVICT_AFTER_SEC",
    "ClientChannel",
    "ConnectionCounter",
    "peer_key",
]

_CLOSED = Failure(ConnectionDone())

# Seconds a connection may take to go away after the Edge answered and closed it.
ABORT_AFTER_SEC = 2.0
# At the total cap, a connection that has not sent a whole request head this long after it
# opened may be closed to make room (a client's head takes one round trip).
EVICT_AFTER_SEC = 2.0

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_DIGITS = re.compile(rb"[0-9]+\Z")

# Where a connection is in its current request.
_IDLE = "idle"  # between requests on a kept-alive connection
_HEAD = "head"  # reading a request head (from the connection opening, or its first byte)
_BODY = "body"  # reading a request body
_HANDLING = "handling"  # the app has the request


def peer_key(address: Any) -> str:
    """What the per-peer cap counts by: the IP address (any other address kind counts as one)."""
    if isinstance(address, IPv4Address | IPv6Address):
        return address.host
    return type(address).__name__


class _Evictable(Protocol):
    def evict(self) -> None:
        """Answer 503, close, and give up the served slot now."""


class ConnectionCounter:
    """
    Client connections against their caps: those served, in total and per peer address
    (:meth:`acquire`, :meth:`release`), and the descriptors every open one holds, served or
    being refused (:meth:`open`, :meth:`close`). At ``max_descriptors`` the listening
    :attr:`port` (set once listening) stops reading until a connection closes.
    """

    log = Logger()

    def __init__(
        self,
        max_total: int,
        max_per_peer: int,
        max_descriptors: int | None = None,
        clock: IReactorTime | None = None,
    ) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self.max_descriptors = (
            max_descriptors if max_descriptors is not None else max_total + refusal_room(max_total)
        )
        self.total = 0
        self.by_peer: dict[str, int] = {}
        self.descriptors = 0
        # Connections that have not sent a whole request head yet, oldest first: when each opened.
        self.waiting: dict[_Evictable, float] = {}
        self.port: Any = None
        self.paused = False
        self._clock = clock
        self._refused_unanswered = 0
        self._last_warned: float | None = None

    # -- descriptors ---------------------------------------------------------------------------

    def open(self) -> bool:
        """One more connection accepted: True if it may have its descriptor; False at the cap
        (the caller closes it; the port stops reading)."""
        if self.descriptors >= self.max_descriptors:
            self._refused_unanswered += 1
            self._pause()
            return False
        self.descriptors += 1
        return True

    def close(self) -> None:
        """A connection that :meth:`open` admitted has closed."""
        self.descriptors -= 1
        if self.paused and self.descriptors < self.max_descriptors:
            self.paused = False
            port = self.port
            # (A port stopped meanwhile, as at shutdown, stays stopped.)
            if getattr(port, "connected", False) and not getattr(port, "disconnecting", False):
                port.startReading()

    def _pause(self) -> None:
        if not self.paused:
            stop = getattr(self.port, "stopReading", None)
            if stop is not None:
                stop()
                self.paused = True
        now = self._clock.seconds() if self._clock is not None else None
        if now is None or self._last_warned is None or now - self._last_warned >= 10:
            self._last_warned = now
            self.log.warn(
                "client listener at its descriptor cap ({descriptors} connections open, "
                "{served} served): not accepting until one closes; {refused} closed "
                "unanswered so far",
                descriptors=self.descriptors,
                served=self.total,
                refused=self._refused_unanswered,
            )

    # -- served --------------------------------------------------------------------------------

    def acquire(self, peer: str, now: float | None = None) -> str | None:
        """Count one more connection from ``peer``; or, over a cap, say which (not counted).
        At the total cap, the oldest connection :attr:`waiting` since before
        ``now - EVICT_AFTER_SEC`` is evicted to make room."""
        count = self.by_peer.get(peer, 0)
        if count >= self.max_per_peer:
            return f"too many connections from this address ({count}, the limit)"
        if self.total >= self.max_total:
            oldest = next(iter(self.waiting.items()), None)
            if now is None or oldest is None or now - oldest[1] < EVICT_AFTER_SEC:
                return f"the Edge has {self.total} client connections, its limit"
            oldest[0].evict()
            if self.total >= self.max_total:  # (an evicted connection releases its slot)
                return f"the Edge has {self.total} client connections, its limit"
        self.total += 1
        self.by_peer[peer] = count + 1
        return None

    def release(self, peer: str) -> None:
        self.total -= 1
        left = self.by_peer[peer] - 1
        if left:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]


class _BodyTooLarge(Exception):
    """The chunk sizes announced so far add up to more than the body limit."""


class _LimitedChunkedDecoder(_ChunkedTransferDecoder):
    """Twisted's chunked decoder, refusing a chunk whose size takes the body past ``limit``."""

    def __init__(
        self,
        limit: int,
        data_callback: Callable[[bytes], None],
        finish_callback: Callable[[bytes], None],
    ) -> None:
        super().__init__(data_callback, finish_callback)
        self._limit = limit
        self._announced = 0

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        done = super()._dataReceived_CHUNK_LENGTH()
        if done and self.state == "BODY":
            self._announced += self.length
            if self._announced > self._limit:
                raise _BodyTooLarge()
        return done


class ClientChannel(HTTPChannel):
    """
    One client connection (see the module docstring). The
    :class:`~iop.edge.ingress.http.ClientSite` sets :attr:`config`, :attr:`clock`,
    :attr:`counter`, :attr:`cors`, :attr:`methods` and :attr:`allowed_methods` on each.
    """

    config: ClientAPIConfig = ClientAPIConfig()
    clock: IReactorTime
    counter: ConnectionCounter | None = None
    # With ``openai.cors``: a refusal to an allowed origin carries its Access-Control-* headers.
    cors: CorsPolicy | None = None
    # Every method the app serves, and those it serves at a path ([] = no route there).
    methods: frozenset[bytes] = frozenset({b"GET", b"HEAD", b"POST"})
    allowed_methods: Callable[[str], Sequence[str]] = staticmethod(lambda path: ())

    _peer: str | None = None
    # Set by the site: this connection holds one of the counter's descriptors until it is lost.
    holds_descriptor = False
    # In the counter's ``waiting``: no whole request head yet (evictable at the total cap).
    _waiting = False
    _phase = _HEAD
    _in_head = False
    _closing = False
    _anthropic = False
    _origin: bytes | None = None
    # The x-request-id header lines of the request being read (None: none seen).
    _client_ids: list[bytes] | None = None
    _transfer_encoding = False
    _content_length = False
    _declared_too_large = False
    _body_start = 0.0
    _body_received = 0
    _deadline: IDelayedCall | None = None
    _abort: IDelayedCall | None = None
    # Where each refusal here is reported (the Edge's event bus; None: not reported), and when
    # the request being read began.
    publish: Publish | None = None
    _request_start = 0.0
    # The Edge is stopping: every response closes its connection (:meth:`drain`).
    draining = False
    # The site's set of open connections (what a drain waits on); None: not tracked.
    live: set[ClientChannel] | None = None

    # -- connection ----------------------------------------------------------------------------

    def connectionMade(self) -> None:
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            # Streams are many small writes: send each at once rather than wait on ACKs.
            set_no_delay(True)
        super().connectionMade()
        self._request_start = self.clock.seconds()
        if self.counter is not None:
            peer = peer_key(self.transport.getPeer())  # type: ignore[union-attr]
            refused = self.counter.acquire(peer, self._request_start)
            if refused is not None:
                self._too_many(refused)
                return
            self._peer = peer
            self.counter.waiting[self] = self._request_start
            self._waiting = True
        self._start_head()

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._cancel_deadline()
        if self._abort is not None and self._abort.active():
            self._abort.cancel()
        self._abort = None
        self._release_slot()
        if self.holds_descriptor and self.counter is not None:
            self.holds_descriptor = False
            self.counter.close()
        if self.live is not None:
            self.live.discard(self)
        super().connectionLost(reason)

    # -- draining ------------------------------------------------------------------------------

    def drain(self) -> None:
        """The Edge stops taking work: close now if no request is on this connection, else
        close once the one being read or served is answered (module docstring)."""
        self.draining = True
        if self._closing:
            return
        if self._phase == _IDLE:
            # Between requests: nothing to lose. (A request crossing this close on the wire
            # fails as a connection error, which clients retry on a new connection.)
            self.loseConnection()
            return
        for request in self.requests:
            if not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        if self._phase != _HEAD:
            # A request already has its head: close after its answer. (One still in its head
            # is told at its end, by checkPersistence.)
            self.persistent = False

    def cut(self) -> None:
        """The drain's bound passed: abort this connection (its work is cancelled as when the
        client goes away)."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        if self.draining:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return bool(super().checkPersistence(request, version))

    def evict(self) -> None:
        """The counter makes room at its total cap: this connection, which has sent no whole
        request head, gives up its slot now and is answered 503."""
        self._release_slot()
        self._too_many("the Edge is at its client connection limit")

    def _release_slot(self) -> None:
        self._stop_waiting()
        if self._peer is not None and self.counter is not None:
            self.counter.release(self._peer)
            self._peer = None

    def _stop_waiting(self) -> None:
        if self._waiting and self.counter is not None:
            self._waiting = False
            self.counter.waiting.pop(self, None)

    def _too_many(self, message: str) -> None:
        self._answer_and_close(
            503, message, code="too_many_connections", headers=[("Retry-After", "1")]
        )

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if self._phase == _IDLE and data:
            self._start_head()
        super().dataReceived(data)

    # -- the head ------------------------------------------------------------------------------

    def lineReceived(self, line: bytes) -> None:
        if self._closing:
            return
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._head_too_large()
            return
        if not self._in_head and line:
            self._in_head = True
        elif line[:18].lower() == b"anthropic-version:":
            # Seen here, not in headerReceived: Twisted holds each header line until the next
            # (continuations), and an answer to that next line is due in this shape already.
            self._anthropic = True
        elif line[:7].lower() == b"origin:":
            self._origin = line[7:].strip(b" \t")
        elif line[:13].lower() == b"x-request-id:":
            # The client's id, for a refusal before the app has the request (judged then).
            if self._client_ids is None:
                self._client_ids = []
            self._client_ids.append(line[13:].strip(b" \t"))
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._head_too_large()

    def headerReceived(self, line: bytes) -> bool:
        if self._closing:
            return False
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            return self._bad("malformed header field")
        if self._receivedHeaderCount >= self.maxHeaders:
            self._answer_and_close(431, f"more than {self.maxHeaders} header fields")
            return False
        key = name.lower()
        value = value.strip(b" \t")
        if key == b"transfer-encoding":
            if self._transfer_encoding:
                return self._bad("Transfer-Encoding is given more than once")
            self._transfer_encoding = True
            if value.lower() != b"chunked":
                return self._bad("the only transfer coding accepted is 'chunked'")
            if self._content_length:
                return self._bad("Transfer-Encoding and Content-Length together")
            if getattr(self, "_version", b"") != b"HTTP/1.1":
                return self._bad("Transfer-Encoding needs HTTP/1.1")
        elif key == b"content-length":
            if self._content_length:
                return self._bad("Content-Length is given more than once")
            self._content_length = True
            if not _DIGITS.match(value):
                return self._bad("Content-Length must be a non-negative decimal integer")
            if self._transfer_encoding:
                return self._bad("Transfer-Encoding and Content-Length together")
            digits = value.lstrip(b"0")
            # Longer than any limit (and int() refuses over 4300 digits): too large, refused
            # once the head is complete (so the refusal knows the request's Origin), unread.
            if len(digits) > 18 or int(digits or b"0") > self.config.max_body_bytes:
                self._declared_too_large = True
                return True
        return bool(super().headerReceived(line))

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))
        decoder = self._transferDecoder
        if (
            chosen
            and isinstance(decoder, _ChunkedTransferDecoder)
            and not isinstance(decoder, _LimitedChunkedDecoder)
        ):
            self._transferDecoder = _LimitedChunkedDecoder(
                self.config.max_body_bytes, decoder.dataCallback, decoder.finishCallback
            )
        return chosen

    def allHeadersReceived(self) -> None:
        if self._closing:
            return
        self._stop_waiting()
        self._cancel_deadline()
        self._in_head = False
        if self._declared_too_large:
            self._too_large()
            return
        target: bytes = self._path
        if target[:8].lower().startswith((b"http://", b"https://")):
            # The absolute form (RFC 9112 §3.2.2): served as its path.
            authority_and_path = target.split(b"//", 1)[1]
            slash = authority_and_path.find(b"/")
            self._path = authority_and_path[slash:] if slash >= 0 else b"/"
        elif not target.startswith(b"/"):
            self._bad("the request target must be a path")
            return
        method: bytes = self._command
        if method not in self.methods:
            self._method_not_allowed(method)
            return
        super().allHeadersReceived()
        if self.length != 0 and not self._closing:
            self._phase = _BODY
            self._body_start = self.clock.seconds()
            self._body_received = 0
            self._deadline = self.callLater(
                self.config.request_body_timeout_sec, self._body_timed_out
            )

    # -- the body ------------------------------------------------------------------------------

    def rawDataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if self._phase == _BODY:
            self._body_progress(len(data))
        try:
            super().rawDataReceived(data)
        except _BodyTooLarge:
            self._too_large()

    def allContentReceived(self) -> None:
        if self._closing:
            return
        self._cancel_deadline()
        self._phase = _HANDLING
        self._transfer_encoding = self._content_length = self._anthropic = False
        self._origin = None
        self._client_ids = None
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        if self.persistent:
            # Anything pipelined behind this request is parsed now, under a new head deadline.
            self._phase = _IDLE
        super().requestDone(request)

    # -- refusals ------------------------------------------------------------------------------

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._bad("malformed HTTP request")

    def timeoutConnection(self) -> None:
        if self._phase == _IDLE:
            # A kept-alive connection with no next request: just close it.
            super().timeoutConnection()
            return
        self._answer_and_close(408, "the connection was idle too long", code="request_timeout")

    def _bad(self, message: str) -> bool:
        self._answer_and_close(400, message, code="bad_request")
        return False

    def _too_large(self) -> bool:
        limit = self.config.max_body_bytes
        self._answer_and_close(
            413, f"request body is larger than {limit} bytes", code="request_too_large"
        )
        return False

    def _head_too_large(self) -> None:
        if self._in_head:
            self._answer_and_close(431, "request header fields too large")
        else:
            self._answer_and_close(414, "request line too long")

    def _method_not_allowed(self, method: bytes) -> None:
        path = self._path.split(b"?", 1)[0].decode("latin-1")
        allowed = list(self.allowed_methods(path))
        shown = method.decode("latin-1")
        if not allowed:
            self._answer_and_close(404, f"no route for {shown} {path}")
            return
        self._answer_and_close(
            405, f"no route for {shown} {path}", headers=[("Allow", ", ".join(allowed))]
        )

    def _surface(self) -> str:
        path = getattr(self, "_path", b"") or b""
        if self._anthropic or path.startswith(b"/v1/messages"):
            return ANTHROPIC
        return OPENAI

    def _answer_and_close(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Write ``status`` with the surface's JSON error, close, abort if that does not end it."""
        if self._closing:
            return
        self._closing = True
        self._stop_waiting()
        self._cancel_deadline()
        self.setTimeout(None)
        if self.cors is not None:
            headers = [*headers, *self.cors.answer_headers(self._origin)]
        surface = self._surface()
        now = self.clock.seconds()
        # The request's id, by the rule the app applies (:mod:`.requestid`) to what arrived.
        request_id = accepted(self._client_ids, now)
        headers = [*headers, *response_headers(request_id, surface)]
        error = ApiError(status, message, code=code, headers=headers)
        body = json.dumps(error.body(surface, request_id), separators=(",", ":")).encode()
        if self.publish is not None and self._phase != _HANDLING:
            # (A request the app has is recorded by the app.)
            self.publish(
                RequestFinished(
                    surface,
                    "unrouted",
                    status,
                    "refused",
                    now - self._request_start,
                    error_code=bounded_code(code or error_types(status)[0]),
                    at=now,
                    request_id=request_id,
                )
            )
        head = [
            b"HTTP/1.1 %d %s" % (status, RESPONSES.get(status, b"Error")),
            b"Content-Type: application/json",
            b"Cache-Control: no-store",
            b"Connection: close",
            b"Content-Length: %d" % len(body),
        ]
        head.extend(f"{name}: {value}".encode("latin-1") for name, value in error.headers)
        transport = self.transport
        assert transport is not None
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        lose_write = getattr(transport, "loseWriteConnection", None)
        if lose_write is None:
            self.loseConnection()
        else:
            # A lingering close: send the answer and a FIN, and read (dropping it) whatever the
            # client still sends until it closes. Closing with its bytes unread would send a
            # reset, and the client could lose the answer before reading it.
            self._networkProducer.unregisterProducer()  # type: ignore[attr-defined]
            lose_write()
            transport.resumeProducing()  # type: ignore[attr-defined]
        self._abort = self.callLater(ABORT_AFTER_SEC, self._abort_now)

    def _abort_now(self) -> None:
        self._abort = None
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- deadlines -----------------------------------------------------------------------------

    def _start_head(self) -> None:
        self._request_start = self.clock.seconds()
        self._cancel_deadline()
        self._phase = _HEAD
        self._deadline = self.callLater(self.config.request_head_timeout_sec, self._head_timed_out)

    def _body_progress(self, received: int) -> None:
        self._body_received += received
        if self._deadline is None or not self._deadline.active():
            return
        deadline = (
            self._body_start
            + self.config.request_body_timeout_sec
            + self._body_received / self.config.request_body_min_rate
        )
        self._deadline.reset(max(deadline - self.clock.seconds(), 0.0))

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        timeout = self.config.request_head_timeout_sec
        self._answer_and_close(
            408, f"the request head did not arrive within {timeout:g} s", code="request_timeout"
        )

    def _body_timed_out(self) -> None:
        self._deadline = None
        self._answer_and_close(
            408,
            "the request body arrived too slowly (at least "
            f"{self.config.request_body_min_rate} bytes/s)",
            code="request_timeout",
        )
