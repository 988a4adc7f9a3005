# -*- test-case-name: iop.test.edge.ingress.test_relay -*-
"""
From a placement to an HTTP response: the one relay the client surfaces and the admin API use.

Placement (:func:`with_placement`)
    Waits for the gateway's :class:`~iop.edge.gateway.Placement` (in the provider queue if need
    be: a client that goes away while queued withdraws the request, because Klein cancels the
    handler), then awaits the caller's ``answer(placement)``. The capacity lease is released
    there, in one ``finally``, whatever ``answer`` returns or raises; nothing else releases a
    placement.

Relay (:func:`relay`)
    Sends one source — an open tunnel (:class:`TunnelSource`) or run (:class:`RunSource`) — to
    the client through a transform. The transform's ``head`` sees how the source started (the
    provider's status and headers; a run's first event) and starts the response now (a
    stream), or returns None (the answer is built at the end: collected), or refuses with an
    :class:`~iop.edge.ingress.errors.ApiError` (nothing sent); ``feed`` converts each item
    (raising :class:`Stop` to write a last piece and stop the source); ``end`` sees the ending
    and returns the tail or the whole body (raising :class:`Cut` when the stream failed after
    it started: the client must see a truncated body, not a clean end). While a tunnel streams
    it is the response's producer (backpressure); a client that goes away cancels the source.
    :func:`relay` returns or raises only once its source has ended, however it got there, so a
    placement's lease lives exactly as long as the work on the node.

Transforms here: :class:`PassThrough` (tunnel bytes untouched), :class:`Collect` (a tunnel's
whole body, for a caller that converts it), :class:`DecodedStream` (a tunnel's SSE in another
protocol than the client's, decoded into canonical events and encoded for the client: Messages
or Responses over a Chat provider, Chat or Responses over a native Messages provider),
:class:`RunStream` (each run event converted) and :class:`RunCollect` (all of a run's events,
one answer). The admin NDJSON stream is defined where it is used.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from twisted.internet.defer import CancelledError
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from iop.config.model import ClientKey
from iop.edge.errors import DispatchError, PoolError
from iop.edge.ingress import canonical
from iop.edge.ingress.chat_decode import ChatDecoder
from iop.edge.ingress.errors import ApiError, run_error, upstream_error
from iop.edge.ingress.record import RequestRecord
from iop.edge.ingress.requestid import request_id_of
from iop.edge.ingress.sources import (
    Ended,
    Gateway,
    HeaderList,
    RunSource,
    Source,
    TunnelSource,
    mapped,
    open_run,
    open_tunnel,
)
from iop.edge.ingress.trace import PLACE, RequestTrace
from iop.edge.placement import Placement
from iop.edge.tunnel import TunnelOutcome
from iop.formats.sse import SSEError, SSEEvent, SSEParser
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.requestid import HEADER, REQUEST_ID_KEY, log_context
from iop.security.redact import redact_secrets

__all__ = [
    "CLIENT_GONE",
    "MAX_COLLECTED_BYTES",
    "PASSTHROUGH_HEADERS",
    "UPSTREAM_REQUEST_ID",
    "Collect",
    "Cut",
    "DecodedStream",
    "Exchange",
    "Gateway",
    "Head",
    "PassThrough",
    "RunCollect",
    "RunSource",
    "RunStream",
    "Stop",
    "TunnelSource",
    "Work",
    "await_placement",
    "json_headers",
    "open_run",
    "open_tunnel",
    "relay",
    "with_placement",
]

# A non-streaming upstream answer the Edge must read whole (to convert it) may be this large.
MAX_COLLECTED_BYTES = 32 * 1024 * 1024
# Upstream response headers a passthrough keeps (besides its status and body).
PASSTHROUGH_HEADERS = frozenset(
    {"content-type", "retry-after", "x-should-retry", "request-id", "x-request-id"}
)
# The provider's own request id (``request-id``, ``x-request-id``) is kept as this header: the
# answer's ``x-request-id``/``request-id`` are the gateway's (:mod:`.requestid`), the one every
# record of the request names; the provider's is what its support asks for.
UPSTREAM_REQUEST_ID = "x-upstream-request-id"
_REQUEST_ID_HEADERS = frozenset({"request-id", "x-request-id"})
# The cancel reason when the client goes away.
CLIENT_GONE = "client disconnected"

T = TypeVar("T")
S = TypeVar("S")
I = TypeVar("I")  # noqa: E741
E = TypeVar("E")
S_contra = TypeVar("S_contra", contravariant=True)
I_contra = TypeVar("I_contra", contravariant=True)
E_contra = TypeVar("E_contra", contravariant=True)


# -- the exchange with one client --------------------------------------------------------------


class Exchange:
    """
    One client request/response: writes that stop once the client is gone, and callbacks for
    when it goes (the cancel of the request's run or tunnel).
    """

    log = Logger()

    def __init__(self, request: IRequest, record: RequestRecord | None = None) -> None:
        self.request = request
        # What this request did, for its metrics and access line (None: not recorded).
        self.record = record
        # Its spans when the Edge traces (:mod:`.trace`; None: not traced).
        self.trace: RequestTrace | None = None
        self.gone = False
        self.started = False
        self._on_gone: list[Callable[[], object]] = []
        request.notifyFinish().addErrback(self._lost)  # type: ignore[attr-defined]

    def on_gone(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the client disconnects (at once if it already has)."""
        if self.gone:
            callback()
        else:
            self._on_gone.append(callback)

    def _lost(self, failure: Failure) -> None:
        self.gone = True
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                self.log.failure("cancelling the work of a departed client failed")

    def start(
        self,
        status: int,
        content_type: str | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Send the status line and headers now (a stream's first bytes may come later)."""
        request = self.request
        request.setResponseCode(status)
        if content_type is not None:
            request.setHeader(b"content-type", content_type.encode("latin-1"))
        request.setHeader(b"cache-control", b"no-store")
        for name, value in headers:
            request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
        self.started = True
        if self.record is not None:
            self.record.streaming(content_type)
        if not self.gone:
            request.write(b"")

    def write(self, data: bytes) -> None:
        if not self.gone and data:
            if self.record is not None:
                self.record.body_written()
            self.request.write(data)

    def work_ended(self, outcome: str, usage: Usage | None) -> None:
        """The work this request placed has ended (a source tells): noted on its record (and
        its trace)."""
        if self.record is not None:
            self.record.ended(outcome, usage)
        if self.trace is not None:
            self.trace.work_ended(outcome, usage)

    def log_context(self) -> dict[str, str]:
        """What a log line about this request's work carries: its id and, traced, the server
        span's ``trace_id`` and ``span_id``."""
        trace = self.trace
        return log_context(
            request_id_of(self.request), trace.log_ids() if trace is not None else None
        )

    def abort(self) -> None:
        """Cut the connection: a client must see a truncated body, not a clean end."""
        transport = getattr(self.request, "transport", None)
        if transport is not None and not self.gone:
            getattr(transport, "abortConnection", transport.loseConnection)()


# -- placement ---------------------------------------------------------------------------------


async def await_placement(
    gateway: Gateway, model: str, prompt_tokens: int, principal: str = ""
) -> Placement:
    """
    Where ``model`` runs for ``principal`` (waiting in the provider queue if need be), as an
    :class:`ApiError` when it cannot. Cancelling this (the client went away) withdraws the
    request from the queue.
    """
    try:
        waiting = gateway.place(model, prompt_tokens=prompt_tokens, principal=principal)
    except Exception as e:
        raise mapped(e) from None
    try:
        return await waiting
    except (PoolError, DispatchError) as e:
        raise mapped(e) from None


async def with_placement(
    gateway: Gateway,
    exchange: Exchange,
    model: str,
    prompt_tokens: int,
    answer: Callable[[Placement], Awaitable[T]],
    principal: ClientKey | None = None,
) -> T:
    """
    Place the request for ``principal`` (the authenticated client key: the placement is made
    for it), then ``answer`` it.
    The placement is released here, exactly once, however ``answer`` ends: a run or tunnel it
    opened is relayed by :func:`relay`, which returns only once that work has ended on its node.
    """
    record = exchange.record
    trace = exchange.trace
    name = principal.name if principal is not None else ""
    if trace is not None:
        placement = await _traced_placement(trace, gateway, model, prompt_tokens, name, record)
    elif record is None:
        placement = await await_placement(gateway, model, prompt_tokens, name)
    else:
        if gateway.model(model) is not None:
            record.model = model
        asked = record.clock.seconds()
        placement = await await_placement(gateway, model, prompt_tokens, name)
        waited = record.clock.seconds() - asked if placement.lease is not None else None
        record.placed(placement, waited)
    if placement.lease is not None:
        # A cluster lease that can no longer be renewed: its slot may go to another request,
        # so this one ends now (the client sees its connection cut, the work is cancelled).
        placement.lease.when_lost(exchange.abort)
    closing = False
    try:
        if exchange.gone:
            raise CancelledError("the client went away")
        return await answer(placement)
    except GeneratorExit:
        # Garbage collected, with everything it waited on: running pool code from a finalizer
        # would resume other collected coroutines.
        closing = True
        raise
    finally:
        if not closing:
            placement.release()


async def _traced_placement(
    trace: RequestTrace,
    gateway: Gateway,
    model: str,
    prompt_tokens: int,
    principal: str,
    record: RequestRecord | None,
) -> Placement:
    """:func:`await_placement` inside the request's ``iop.edge.place`` span (the queue wait,
    its outcome, where it was placed), noted on ``record`` as :func:`with_placement` does."""
    if record is not None and gateway.model(model) is not None:
        record.model = model
    clock = trace.clock
    span = trace.child(PLACE)
    asked = clock.seconds()
    try:
        placement = await await_placement(gateway, model, prompt_tokens, principal)
    except ApiError as e:
        waited = clock.seconds() - asked
        trace.place_ended(span, waited, None, "refused", e.code or str(e.status))
        raise
    except BaseException:
        trace.place_ended(span, clock.seconds() - asked, None, "cancelled")
        raise
    waited = clock.seconds() - asked
    trace.place_ended(span, waited, placement, "placed")
    if record is not None:
        record.placed(placement, waited if placement.lease is not None else None)
    return placement


# -- the relay ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """The start of a streamed response: status, content type (None: not set), headers."""

    status: int
    content_type: str | None
    headers: Sequence[tuple[str, str]] = ()


class Stop(Exception):
    """Raised by a transform's ``feed``: write ``last``, then stop the source (``reason``)."""

    def __init__(self, reason: str, last: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.last = last


class Cut(Exception):
    """Raised by a transform's ``end``: the stream failed after it started (``error``)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class Transform(Protocol[S_contra, I_contra, E_contra]):
    """How :func:`relay` turns one source into the client's response (module docstring)."""

    def head(self, start: S_contra) -> Head | None: ...

    def feed(self, item: I_contra) -> bytes: ...

    def end(self, ending: E_contra) -> bytes: ...


class _Feed(Generic[I]):
    """The consumer :func:`relay` gives a source: each item through ``feed`` to the client."""

    log = Logger()

    def __init__(
        self, exchange: Exchange, source: Source[Any, I, Any], transform: Transform[Any, I, Any]
    ) -> None:
        self._exchange = exchange
        self._source = source
        self._transform = transform
        self.stopped = False
        self.failure: BaseException | None = None

    def __call__(self, item: I) -> None:
        if self.stopped:
            return
        try:
            data = self._transform.feed(item)
        except Stop as e:
            self.stopped = True
            self._exchange.write(e.last)
            self._source.cancel(e.reason)
            return
        except Exception as e:
            self.log.failure(
                "relaying {run_id} failed",
                None,
                LogLevel.critical,
                run_id=self._source.run_id,
                node_id=self._source.node_id,
                **self._exchange.log_context(),
            )
            self.stopped = True
            self.failure = e
            self._source.cancel("the answer could not be relayed")
            return
        self._exchange.write(data)


log = Logger()


async def relay(
    exchange: Exchange, transform: Transform[S, I, E], source: Source[S, I, E]
) -> bytes:
    """
    Send ``source`` to the client through ``transform`` (module docstring); the body for Klein
    to write last. ``transform`` comes first so that it exists before the source is opened
    (``relay(exchange, PassThrough(), open_tunnel(...))``).
    """
    exchange.on_gone(lambda: source.cancel(CLIENT_GONE))
    registered = False
    ended = False

    def unregister() -> None:
        nonlocal registered
        if registered:
            registered = False
            if not exchange.gone:
                exchange.request.unregisterProducer()  # type: ignore[attr-defined]

    try:
        head = transform.head(await source.started())
        if head is not None:
            exchange.start(head.status, head.content_type, head.headers)
            if source.producer is not None and not exchange.gone:
                exchange.request.registerProducer(source.producer, True)  # type: ignore[attr-defined]
                registered = True
        feed = _Feed(exchange, source, transform)
        source.deliver(feed)
        ending = await source.done()
        ended = True
        unregister()
        if feed.failure is not None:
            raise feed.failure
        try:
            tail = transform.end(ending)
        except Cut as e:
            if not exchange.gone:
                log.warn(
                    "{run_id} failed after its response started: {error}",
                    run_id=source.run_id,
                    node_id=source.node_id,
                    error=redact_secrets(e.error),
                    **exchange.log_context(),
                )
                exchange.abort()
            return b""
        if head is None:
            return tail
        exchange.write(tail)
        return b""
    except GeneratorExit:
        # The coroutine is being closed (garbage collected with its source): nothing to wait for.
        ended = True
        raise
    finally:
        unregister()
        if not ended:
            # Leaving early (the client went away, a refusal, a failure): the work must end
            # before whoever holds its placement releases it.
            source.abandon("the request ended")
            await source.done()


# -- a placed call's work ---------------------------------------------------------------------


def json_headers(stream: bool) -> list[tuple[str, str]]:
    """The request headers of a JSON body whose answer streams (SSE) or not."""
    return [
        ("content-type", "application/json"),
        ("accept", "text/event-stream" if stream else "application/json"),
    ]


class Work:
    """A placed call's way to the node: open a source (reporting to the request's record) and
    relay it to the client through an encoder."""

    def __init__(self, gateway: Gateway, exchange: Exchange, placement: Placement) -> None:
        self.gateway = gateway
        self.exchange = exchange
        self.placement = placement
        # A source was opened: the work reached its node (what a key's reservation settles).
        self.opened = False

    @property
    def request(self) -> IRequest:
        return self.exchange.request

    def metadata(self) -> dict[str, str]:
        """What the run or tunnel request carries to the node besides the call: the request's
        id (:mod:`.requestid`; the node's run store and log lines name it, and it may go on to
        the provider)."""
        request_id = request_id_of(self.exchange.request)
        return {REQUEST_ID_KEY: request_id} if request_id else {}

    def upstream_headers(self) -> list[tuple[str, str]]:
        """What a tunnel's upstream request carries of the client's request: its id as
        ``x-request-id``, where the provider's profile says so (``send_request_id``: on but for
        the Anthropic driver), so an OpenAI-compatible server's own logs (vLLM's) name it. The
        node forwards it (an allowed request header), never over a header the adapter sets."""
        request_id = request_id_of(self.exchange.request)
        profile = self.placement.profile
        if not request_id or (profile is not None and not profile.sends_request_id):
            return []
        return [(HEADER, request_id)]

    def dispatched(self, metadata: dict[str, str]) -> Ended:
        """
        The work is dispatched now: the record notes when (the Edge→provider leg's start) and,
        traced, the ``iop.edge.dispatch`` span starts, its context written into ``metadata``
        (the node's span joins it). Returns what the source tells when the work ends.
        """
        self.opened = True
        exchange = self.exchange
        if exchange.record is not None:
            exchange.record.dispatched()
        trace = exchange.trace
        if trace is None:
            return exchange.work_ended
        span = trace.dispatch(self.placement, metadata)

        def ended(outcome: str, usage: Usage | None) -> None:
            exchange.work_ended(outcome, usage)
            trace.dispatch_ended(span, outcome, usage)

        return ended

    def tunnel(
        self, operation: str, payload: dict[str, Any], stream: bool, headers: list[tuple[str, str]]
    ) -> TunnelSource:
        metadata = self.metadata()
        ended = self.dispatched(metadata)
        return open_tunnel(
            self.gateway,
            self.placement,
            operation,
            payload,
            stream,
            [*headers, *self.upstream_headers()],
            ended,
            metadata,
        )

    def run(self, *, input: str, collect: bool = False, **options: int) -> RunSource:
        metadata = self.metadata()
        ended = self.dispatched(metadata)
        return open_run(
            self.gateway,
            self.placement,
            input=input,
            collect=collect,
            ended=ended,
            metadata=metadata,
            **options,
        )

    def relay_run(
        self,
        stream: bool,
        feed: Callable[[RuntimeEvent], bytes],
        whole: Callable[[list[RuntimeEvent]], bytes],
        *,
        input: str,
        **options: int,
    ) -> Coroutine[Any, Any, bytes]:
        """
        Submit the run and answer it through the surface's encoders: streamed (each event
        through ``feed``, the response started by the first), or whole (``whole`` of all the
        events once the run ended; the adapter is told it may answer at once).
        """
        transform: RunStream | RunCollect = RunStream(feed) if stream else RunCollect(whole)
        return self.relay(transform, self.run(input=input, collect=not stream, **options))

    def relay_decoded(
        self,
        operation: str,
        payload: dict[str, Any],
        headers: list[tuple[str, str]],
        stream: bool,
        decoder: Callable[[], CanonicalDecoder],
        encode: Callable[[list[canonical.Event]], bytes],
        whole: Callable[[list[canonical.Event]], bytes],
    ) -> Coroutine[Any, Any, bytes]:
        """
        Send ``payload`` through the provider tunnel's ``operation`` and answer in the client's
        surface, whatever protocol the provider speaks: its answer decoded once by a fresh
        ``decoder()`` (:class:`~.chat_decode.ChatDecoder`,
        :class:`~.chat_messages.MessagesDecoder`, :class:`~.chat_responses.ResponsesDecoder`)
        and its canonical events encoded — streamed, each SSE batch's events through ``encode``
        (:class:`DecodedStream`); whole, all the answer's events through ``whole`` for the
        response body. An upstream error status is answered with that status in the surface's
        shape; a whole answer the decoder cannot read is a 502 ``upstream_error``.
        """
        transform: DecodedStream | Collect
        if stream:
            transform = DecodedStream(decoder(), encode)
        else:

            def answer(status: int, headers: HeaderList, data: bytes) -> bytes:
                if not 200 <= status < 300:
                    raise upstream_error(status, data)
                try:
                    parsed = json.loads(data)
                except ValueError:
                    parsed = None
                reader = decoder()
                events = reader.whole(parsed)
                if reader.failed is not None:
                    raise ApiError(
                        502,
                        f"the provider's answer could not be converted: {reader.failed}",
                        code="upstream_error",
                    )
                return whole(events)

            transform = Collect(answer)
        return self.relay(transform, self.tunnel(operation, payload, stream, headers))

    def relay_chat(
        self,
        chat: dict[str, Any],
        stream: bool,
        encode: Callable[[list[canonical.Event]], bytes],
        whole: Callable[[list[canonical.Event]], bytes],
    ) -> Coroutine[Any, Any, bytes]:
        """:meth:`relay_decoded` over the provider's Chat Completions tunnel (a whole answer's
        tool calls come whole)."""
        return self.relay_decoded(
            "chat_completions",
            chat,
            json_headers(stream),
            stream,
            lambda: ChatDecoder(fragments=stream),
            encode,
            whole,
        )

    def relay(
        self, transform: Transform[Any, Any, Any], source: Source[Any, Any, Any]
    ) -> Coroutine[Any, Any, bytes]:
        """:func:`~.relay.relay` for this request (its coroutine itself: no extra frame)."""
        return relay(self.exchange, transform, source)


# -- transforms --------------------------------------------------------------------------------


class PassThrough:
    """A tunnel's response as the provider sent it: status, kept headers, body bytes."""

    def __init__(
        self,
        *,
        keep: frozenset[str] = PASSTHROUGH_HEADERS,
        default_type: str | None = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._keep = keep
        self._default_type = default_type
        self._headers = tuple(headers)

    def head(self, start: tuple[int, HeaderList]) -> Head:
        status, headers = start
        kept = [(n, v) for n, v in headers if n.lower() in self._keep]
        content_type = next((v for n, v in kept if n.lower() == "content-type"), self._default_type)
        others: list[tuple[str, str]] = []
        upstream_id: str | None = None
        for name, value in kept:
            lowered = name.lower()
            if lowered in _REQUEST_ID_HEADERS:
                upstream_id = upstream_id or value
            elif lowered != "content-type":
                others.append((name, value))
        if upstream_id is not None:
            others.append((UPSTREAM_REQUEST_ID, upstream_id))
        return Head(status, content_type, [*others, *self._headers])

    def feed(self, item: bytes) -> bytes:
        return item

    def end(self, ending: TunnelOutcome) -> bytes:
        if not ending.ok:
            raise Cut(ending.error)
        return b""


_UNCONVERTIBLE = "the provider's stream could not be converted"


class CanonicalDecoder(Protocol):
    """A provider's answer in, canonical events out — stream events (:meth:`feed`,
    :meth:`end`) or one whole answer (:meth:`whole`); ``failed`` says why it could not be read
    (:class:`~.chat_decode.ChatDecoder`, :class:`~.chat_messages.MessagesDecoder`,
    :class:`~.chat_responses.ResponsesDecoder`)."""

    failed: str | None

    @property
    def done(self) -> bool: ...

    def whole(self, data: Any) -> list[canonical.Event]: ...

    def feed(self, data: Any) -> list[canonical.Event]: ...

    def end(self) -> list[canonical.Event]: ...


class DecodedStream:
    """
    A provider's SSE answer through a tunnel in another protocol than the client's: each event's
    data decoded into canonical events (``decoder``) and encoded for the client's surface
    (``encode``: the events as the response's bytes). An upstream error status is collected and
    answered with that status in the surface's shape. A stream that cannot be parsed, or whose
    answer failed (an error event or chunk, data that is not JSON), ends with the encoder's
    failure and stops the provider; a body cut before its end fails the same way. ``data:
    [DONE]`` (OpenAI's end of a stream) ends the answer as the body's clean end does
    (``decoder.end()``: a Chat answer finishes; a Messages answer that did not finish fails).
    """

    def __init__(
        self,
        decoder: CanonicalDecoder,
        encode: Callable[[list[canonical.Event]], bytes],
    ) -> None:
        self._decoder = decoder
        self._encode = encode
        self._parser = SSEParser()
        self._status = 0
        self._error: list[bytes] | None = None

    def head(self, start: tuple[int, HeaderList]) -> Head | None:
        self._status, _ = start
        if not 200 <= self._status < 300:
            self._error = []
            return None
        return Head(200, "text/event-stream")

    def _failed(self, message: str) -> list[canonical.Event]:
        return [canonical.Event(canonical.Kind.FAILED, terminal=RuntimeEvent.failed(message))]

    def feed(self, item: bytes) -> bytes:
        if self._error is not None:
            self._error.append(item)
            return b""
        decoder = self._decoder
        if decoder.done:
            return b""
        try:
            events = self._parser.feed(item)
        except SSEError as e:
            failed = self._failed(f"the provider's stream is malformed: {e}")
            raise Stop(_UNCONVERTIBLE, self._encode(failed)) from None
        out = self._decode(events)
        if any(event.kind == canonical.Kind.FAILED for event in out):
            raise Stop(_UNCONVERTIBLE, self._encode(out))
        return self._encode(out)

    def end(self, ending: TunnelOutcome) -> bytes:
        if self._error is not None:
            raise upstream_error(self._status, b"".join(self._error))
        decoder = self._decoder
        if decoder.done:
            return b""
        try:
            out = self._decode(self._parser.finish())
        except SSEError as e:
            out = self._failed(f"the provider's stream is malformed: {e}")
        if not decoder.done and not any(e.kind == canonical.Kind.FAILED for e in out):
            if ending.ok:
                out += decoder.end()
            else:
                out += self._failed(f"the provider's stream failed: {ending.error}")
        return self._encode(out)

    def _decode(self, events: list[SSEEvent]) -> list[canonical.Event]:
        out: list[canonical.Event] = []
        decoder = self._decoder
        for event in events:
            if decoder.done:
                break
            if event.is_done:
                out += decoder.end()
                break
            try:
                data = json.loads(event.data)
            except ValueError:
                data = None
            out += decoder.feed(data)
        return out


class Collect:
    """
    A tunnel's whole response, handed to ``answer(status, headers, body)`` for the response
    body. A tunnel that fails (before or after its start) or an answer past ``limit`` bytes is
    a 502 :class:`ApiError`.
    """

    def __init__(
        self,
        answer: Callable[[int, HeaderList, bytes], bytes],
        limit: int = MAX_COLLECTED_BYTES,
    ) -> None:
        self._answer = answer
        self._limit = limit
        self._status = 0
        self._headers: HeaderList = []
        self._chunks: list[bytes] = []
        self._size = 0

    def head(self, start: tuple[int, HeaderList]) -> None:
        self._status, self._headers = start

    def feed(self, item: bytes) -> bytes:
        self._size += len(item)
        if self._size > self._limit:
            raise Stop("the provider's answer is too large")
        self._chunks.append(item)
        return b""

    def end(self, ending: TunnelOutcome) -> bytes:
        if not ending.ok:
            raise ApiError(
                502, f"the provider's answer failed: {ending.error}", code="upstream_error"
            )
        return self._answer(self._status, self._headers, b"".join(self._chunks))


class RunStream:
    """
    A run streamed: the response starts (200, ``content_type``) with the run's first event,
    unless that event already ends it with an error (an :class:`ApiError` before anything was
    sent); then each event through ``convert``.
    """

    def __init__(
        self, convert: Callable[[RuntimeEvent], bytes], content_type: str = "text/event-stream"
    ) -> None:
        self._convert = convert
        self._content_type = content_type

    def head(self, start: RuntimeEvent) -> Head:
        if start.terminal and start.type != EventType.COMPLETE:
            raise run_error(start)
        return Head(200, self._content_type)

    def feed(self, item: RuntimeEvent) -> bytes:
        return self._convert(item)

    def end(self, ending: RuntimeEvent) -> bytes:
        return b""


class RunCollect:
    """A run answered whole: ``answer(events)`` once it ended gives the response body."""

    def __init__(self, answer: Callable[[list[RuntimeEvent]], bytes]) -> None:
        self._answer = answer
        self._events: list[RuntimeEvent] = []

    def head(self, start: RuntimeEvent) -> None:
        return None

    def feed(self, item: RuntimeEvent) -> bytes:
        self._events.append(item)
        return b""

    def end(self, ending: RuntimeEvent) -> bytes:
        return self._answer(self._events)
