# -*- test-case-name: iop.test.edge.ingress.test_relay -*-
"""
Work on a node, as the relay consumes it: the sources, and what the ingress needs of the gateway.

A source is one tunnel (:class:`TunnelSource`: started by the provider's status and headers,
its items are body bytes) or one run (:class:`RunSource`: started by its first event, its
items are the run's events, the last one terminal). :func:`open_tunnel` and :func:`open_run`
open them for a :class:`~iop.edge.placement.Placement`, turning dispatch failures into client
errors.

Each source reports how its work ended — ``complete``, ``error`` or ``cancelled`` — and the
usage the provider reported to ``ended`` (the request's record), once, when the work ends: this
is how outcome and usage reach the record; the placement stays as it was made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure

from iop.config.model import ModelConfig, ProfileConfig
from iop.edge.errors import TunnelFailed
from iop.edge.ingress.errors import bad_request, client_error
from iop.edge.ingress.http import json_bytes
from iop.edge.placement import Placement
from iop.edge.runs import RunHandle
from iop.edge.tunnel import TunnelOutcome, TunnelStream
from iop.runtime.events import RuntimeEvent, Usage

__all__ = [
    "Ended",
    "Gateway",
    "HeaderList",
    "RunSource",
    "Source",
    "TunnelSource",
    "mapped",
    "open_run",
    "open_tunnel",
]

HeaderList = list[tuple[str, str]]
# Told once how the work ended (complete, error or cancelled) and the usage it reported.
Ended = Callable[[str, Usage | None], object]
# The largest value a run's integer options take on the wire (uint32).
_UINT32_MAX = 2**32 - 1

S_co = TypeVar("S_co", covariant=True)
I_co = TypeVar("I_co", covariant=True)
E_co = TypeVar("E_co", covariant=True)


class Gateway(Protocol):
    """What the client surfaces use of :class:`~iop.edge.gateway.EdgeGateway`."""

    def model_ids(self) -> list[str]: ...

    def model(self, model_id: str) -> ModelConfig | None: ...

    def candidate_profiles(self, model_id: str) -> list[ProfileConfig | None]: ...

    def place(
        self, model_id: str, *, prompt_tokens: int = 0, principal: str = ""
    ) -> Deferred[Placement]: ...

    def run(self, placement: Placement, *, input: str, **options: Any) -> RunHandle: ...

    def tunnel(
        self,
        placement: Placement,
        *,
        operation: str,
        body: bytes,
        stream: bool,
        headers: Iterable[tuple[str, str]] = (),
        method: str = "POST",
        timeout_sec: int = 0,
        metadata: Mapping[str, str] | None = None,
    ) -> TunnelStream: ...


def mapped(error: BaseException) -> BaseException:
    """``error`` as the client sees it (an Edge error → an ApiError), else itself."""
    return client_error(error) or error


class Source(Protocol[S_co, I_co, E_co]):
    """Work on a node, as the relay consumes it: how it started, its items, its ending."""

    @property
    def run_id(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    @property
    def producer(self) -> IPushProducer | None: ...

    def started(self) -> Awaitable[S_co]: ...

    def deliver(self, consumer: Callable[[I_co], None]) -> None: ...

    def done(self) -> Awaitable[E_co]: ...

    def cancel(self, reason: str) -> None: ...

    def abandon(self, reason: str) -> None:
        """Nobody will consume the rest: stop the work, drop what is buffered."""


class TunnelSource:
    """An open tunnel: started by the provider's ``(status, headers)``, items are body bytes."""

    def __init__(self, tunnel: TunnelStream, ended: Ended | None = None) -> None:
        self.tunnel = tunnel
        self.run_id = tunnel.run_id
        self.node_id = tunnel.node_id
        self.producer: IPushProducer | None = tunnel
        if ended is not None:

            def finished(outcome: TunnelOutcome) -> None:
                if outcome.ok:
                    ended("complete", outcome.usage)
                else:
                    cancelled = tunnel.cancel_reason is not None
                    ended("cancelled" if cancelled else "error", outcome.usage)

            def failed(failure: Failure) -> None:
                ended("error", None)

            tunnel.when_done().addCallbacks(finished, failed)

    async def started(self) -> tuple[int, HeaderList]:
        """The response's start; an :class:`ApiError` when the tunnel failed before it."""
        try:
            return await self.tunnel.when_started()
        except TunnelFailed as e:
            raise mapped(e) from None

    def deliver(self, consumer: Callable[[bytes], None]) -> None:
        self.tunnel.deliver_body(consumer)

    def done(self) -> Deferred[TunnelOutcome]:
        return self.tunnel.when_done()

    def cancel(self, reason: str) -> None:
        self.tunnel.cancel(reason)

    def abandon(self, reason: str) -> None:
        self.tunnel.cancel(reason)
        self.tunnel.stopProducing()


class RunSource:
    """A submitted run: started by its first event; items are its events, the last terminal."""

    producer: IPushProducer | None = None

    def __init__(self, handle: RunHandle, ended: Ended | None = None) -> None:
        self.handle = handle
        self.run_id = handle.run_id
        self.node_id = handle.node_id
        self._first: RuntimeEvent | None = None
        self._buffered: list[RuntimeEvent] = []
        self._consumer: Callable[[RuntimeEvent], None] | None = None
        self._waiters: list[Deferred[RuntimeEvent]] = []
        handle.subscribe(self._event)
        if ended is not None:

            def finished(terminal: RuntimeEvent) -> None:
                ended(terminal.type.value, terminal.usage)

            handle.when_done().addCallback(finished)

    def _event(self, event: RuntimeEvent) -> None:
        if self._consumer is not None:
            self._consumer(event)
            return
        self._buffered.append(event)
        if self._first is None:
            self._first = event
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                d.callback(event)

    def started(self) -> Deferred[RuntimeEvent]:
        if self._first is not None:
            return succeed(self._first)

        def forget(d: Deferred[RuntimeEvent]) -> None:
            if d in self._waiters:
                self._waiters.remove(d)

        waiter: Deferred[RuntimeEvent] = Deferred(forget)
        self._waiters.append(waiter)
        return waiter

    def deliver(self, consumer: Callable[[RuntimeEvent], None]) -> None:
        self._consumer = consumer
        buffered, self._buffered = self._buffered, []
        for event in buffered:
            consumer(event)

    def done(self) -> Deferred[RuntimeEvent]:
        return self.handle.when_done()

    def cancel(self, reason: str) -> None:
        self.handle.cancel(reason)

    def abandon(self, reason: str) -> None:
        self.handle.cancel(reason)


def open_tunnel(
    gateway: Gateway,
    placement: Placement,
    operation: str,
    payload: dict[str, Any],
    stream: bool,
    headers: list[tuple[str, str]],
    ended: Ended | None = None,
    metadata: Mapping[str, str] | None = None,
) -> TunnelSource:
    """Open the provider tunnel for ``payload``, turning dispatch failures into client errors.
    ``metadata`` rides in the request to the node (the request's id)."""
    body = json_bytes(payload)
    try:
        tunnel = gateway.tunnel(
            placement,
            operation=operation,
            body=body,
            stream=stream,
            headers=headers,
            metadata=metadata,
        )
    except Exception as e:
        raise mapped(e) from None
    return TunnelSource(tunnel, ended)


def open_run(
    gateway: Gateway,
    placement: Placement,
    *,
    input: str,
    collect: bool = False,
    ended: Ended | None = None,
    metadata: Mapping[str, str] | None = None,
    **options: int,
) -> RunSource:
    """
    Submit the run for ``placement``, turning dispatch failures into client errors. ``collect``:
    the answer is read whole (a :class:`~iop.edge.ingress.relay.RunCollect`), so the adapter
    may ask for one answer.
    """
    for name, value in options.items():
        if not 0 <= value <= _UINT32_MAX:
            raise bad_request(f"the run's {name} ({value}) is out of range")
    try:
        handle = gateway.run(placement, input=input, collect=collect, metadata=metadata, **options)
    except Exception as e:
        raise mapped(e) from None
    return RunSource(handle, ended)
