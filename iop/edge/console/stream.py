# -*- test-case-name: iop.test.edge.test_console -*-
"""
``GET /events``: the Edge's event bus as Server-Sent Events (``text/event-stream``).

Each open stream is its own bus subscription, removed when the client goes away (or its
transport stops the producer). The stream starts with ``retry:`` and one ``event: snapshot``
(:meth:`~iop.edge.console.memory.ConsoleMemory.snapshot`: what the Edge remembers), then one
event per bus event (``event: node`` / ``event: request``, :mod:`iop.edge.console.payload`), and
a comment line every :data:`HEARTBEAT_SEC` so that proxies keep an idle stream open.

What a slow console can cost is bounded twice: the bus drops events for a subscriber that falls
far behind, and the stream is the transport's push producer — while the transport is paused
(its write buffer is full) events are dropped, not buffered, and counted; on resume the stream
says so with ``event: dropped`` (``{"dropped": n}``). At most :data:`MAX_STREAMS` streams are
open at once; one more is answered 503.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from iop.edge.console.memory import ConsoleMemory
from iop.edge.console.payload import console_event, shown

HEARTBEAT_SEC = 15.0
MAX_STREAMS = 16
RETRY_MS = 2000

Subscribe = Callable[[Callable[[Any], object]], Callable[[], None]]


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event: its name and its data, a single line of JSON."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


class ConsoleEvents:
    """
    The Edge's console stream: builds one :class:`EventStream` per ``GET /events`` from the
    bus's ``subscribe``; keeps the :class:`~iop.edge.console.memory.ConsoleMemory` subscribed.
    """

    log = Logger()

    def __init__(
        self,
        subscribe: Subscribe,
        clock: IReactorTime,
        heartbeat_sec: float = HEARTBEAT_SEC,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        self._subscribe = subscribe
        self._clock = clock
        self._heartbeat_sec = heartbeat_sec
        self._max_streams = max_streams
        self._streams: set[EventStream] = set()
        self._encoded: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
        self.memory = ConsoleMemory()
        subscribe(self.memory.observe)

    def encoded(self, event: object) -> bytes:
        """
        The SSE bytes of ``event`` (one the console shows), encoded once however many streams
        send it: each stream's subscription reaches the same event object on its own turn.
        """
        try:
            cached = self._encoded.get(event)
        except TypeError:  # not weakly referenceable or not hashable: encode it each time
            cached = None
        if cached is None:
            named = console_event(event)
            cached = sse_event(*named) if named is not None else b""
            with contextlib.suppress(TypeError):
                self._encoded[event] = cached
        return cached

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def resource(self) -> IResource:
        """What ``GET /events`` renders: a new stream, or 503 when enough are open."""
        if len(self._streams) >= self._max_streams:
            return _TooManyStreams(self._max_streams)
        return EventStream(self)

    def _opened(self, stream: EventStream) -> None:
        self._streams.add(stream)
        self.log.info("console event stream opened ({count} open)", count=len(self._streams))

    def _closed(self, stream: EventStream) -> None:
        if stream in self._streams:
            self._streams.discard(stream)
            self.log.info("console event stream closed ({count} open)", count=len(self._streams))


@implementer(IPushProducer)
class EventStream(Resource):
    """One client's SSE stream: a leaf resource that stays open, and the transport's producer."""

    isLeaf = True

    def __init__(self, events: ConsoleEvents) -> None:
        super().__init__()
        self._events = events
        self._request: IRequest | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._heartbeat: IDelayedCall | None = None
        self.paused = False
        self.dropped = 0
        self._unreported = 0

    def render_GET(self, request: IRequest) -> int:
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-content-type-options", b"nosniff")
        # Tell buffering reverse proxies (nginx) to pass each event on at once.
        request.setHeader(b"x-accel-buffering", b"no")
        self._request = request
        request.registerProducer(self, True)  # type: ignore[attr-defined]
        request.notifyFinish().addBoth(self._finished)  # type: ignore[attr-defined]
        events = self._events
        events._opened(self)
        self._unsubscribe = events._subscribe(self.send)
        request.write(f"retry: {RETRY_MS}\n\n".encode())
        request.write(sse_event("snapshot", events.memory.snapshot()))
        self._schedule_heartbeat()
        return NOT_DONE_YET

    def send(self, event: object) -> None:
        """The bus subscriber: one SSE event per event the console shows; dropped while paused."""
        if self._request is None or not shown(event):
            return
        if self.paused:
            self.dropped += 1
            self._unreported += 1
            return
        self._request.write(self._events.encoded(event))

    # IPushProducer: the transport pauses us when its write buffer is full.
    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        if self._unreported and self._request is not None:
            self._request.write(sse_event("dropped", {"dropped": self._unreported}))
            self._unreported = 0

    def stopProducing(self) -> None:
        self._close()

    def _schedule_heartbeat(self) -> None:
        self._heartbeat = self._events._clock.callLater(self._events._heartbeat_sec, self._beat)

    def _beat(self) -> None:
        self._heartbeat = None
        if self._request is None:
            return
        if not self.paused:
            self._request.write(b": keepalive\n\n")
        self._schedule_heartbeat()

    def _finished(self, result: Failure | None) -> None:
        # The client went away (or the response was finished): the subscription ends here.
        self._close()

    def _close(self) -> None:
        self._request = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._heartbeat is not None and self._heartbeat.active():
            self._heartbeat.cancel()
        self._heartbeat = None
        self._events._closed(self)


class _TooManyStreams(Resource):
    isLeaf = True

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit

    def render(self, request: IRequest) -> bytes:
        message = f"too many console event streams are open (at most {self._limit})"
        request.setResponseCode(503)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"retry-after", b"5")
        return json.dumps({"error": {"message": message, "code": 503}}).encode() + b"\n"
