# -*- test-case-name: iop.test.edge.test_tunnel -*-
"""
Provider raw tunnels from the Edge: the request-bound stream of an OpenAI-compatible provider
response, relayed by a node.

``TunnelDispatcher.open`` sends a ``ProviderTunnelRequest`` on a ready node's connection and
returns a :class:`TunnelStream`: the provider's status and headers
(:meth:`TunnelStream.when_started`), its body bytes in order (:meth:`TunnelStream.deliver_body`),
and how it ended
(:meth:`TunnelStream.when_done`, with the usage the node observed). The body is the passthrough
source of truth: it goes to the one consumer and nowhere else (never to the event bus).

It mirrors :class:`~iop.edge.runs.RunDispatcher` and shares its in-flight table
(:class:`~iop.edge.inflight.InFlightTable`): frames count only from the connection the tunnel was
sent on, in strictly increasing ``sequence`` (anything else is dropped and logged).
Every tunnel ends exactly once on the Edge side, whatever happens: the node's ``END`` or
``ERROR``, a send failure, the node's disconnect (its generation fenced by the registry, in the
authoritative path), or a cancel the node never answered (ended here after ``cancel_grace``).

Backpressure: a stream is an ``IPushProducer``, so an HTTP response can register it. While the
consumer is paused, body bytes are buffered up to ``max_buffered_bytes``; past that bound the
tunnel is cancelled with the error ``client too slow`` instead of growing without limit.
``stopProducing`` (the consumer went away) cancels the tunnel.

Each end is counted once per node by kind (:data:`TUNNEL_TERMINALS`,
:meth:`TunnelDispatcher.stats`): ``complete`` (the node's ``END`` after the response started),
``error`` (the node's ``ERROR`` without a code this Edge acts on, or an ``END`` with no
response), ``at_capacity`` (the node's own gate refused it), ``timeout`` (the node gave up on
the upstream: the request's or the idle timeout), ``lease_refused`` (managed mode: the node
refused the credential lease), ``cancelled`` (the caller or the consumer gave up, whatever the
node then said or if it said nothing), ``node_lost`` (the node's generation was fenced) and
``send_failed``. A clean end is not logged (the access log has the request); every other end is,
with why.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.edge.errors import NodeUnavailable, TunnelFailed
from iop.edge.inflight import InFlightTable, TerminalCounts
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver, Send, send_envelope
from iop.edge.registry import NodeRegistry
from iop.runtime.codes import ErrorCode, error_code
from iop.runtime.events import Usage
from iop.runtime.requestid import carried
from iop.security.echo import ECHOES_METADATA_KEY
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import usage_from_proto

__all__ = [
    "CANCEL_GRACE_SEC",
    "CLIENT_TOO_SLOW",
    "MAX_BUFFERED_BYTES",
    "TUNNEL_TERMINALS",
    "TunnelDispatcher",
    "TunnelOutcome",
    "TunnelStream",
]

# How long a cancelled tunnel waits for the node's own end before ending locally.
CANCEL_GRACE_SEC = 10.0
# Body bytes buffered for a paused (or not yet attached) consumer before the tunnel is cancelled.
MAX_BUFFERED_BYTES = 8 * 1024 * 1024
CLIENT_TOO_SLOW = "client too slow"
CONSUMER_GONE = "client went away"
TUNNEL_TERMINALS = (
    "complete",
    "error",
    "at_capacity",
    "timeout",
    "lease_refused",
    "cancelled",
    "node_lost",
    "send_failed",
)

T = TypeVar("T")
HeaderList = list[tuple[str, str]]
BodyWriter = Callable[[bytes], None]


@dataclass(frozen=True)
class TunnelOutcome:
    """
    How a tunnel ended. ``ok``: the node sent ``END`` after the whole body (whatever the HTTP
    status: a provider 4xx/5xx is a passthrough, not an error). Otherwise ``error`` says why.
    ``usage`` is what the node observed in the body, when the provider reported any.
    """

    ok: bool
    error: str = ""
    code: ErrorCode | None = None
    usage: Usage | None = None
    status_code: int | None = None
    body_bytes: int = 0


def _waiter(waiters: list[Deferred[T]]) -> Deferred[T]:
    """A fresh Deferred in ``waiters``; cancelling it just takes it out."""

    def forget(d: Deferred[T]) -> None:
        if d in waiters:
            waiters.remove(d)

    d: Deferred[T] = Deferred(forget)
    waiters.append(d)
    return d


@implementer(IPushProducer)
class TunnelStream:
    """
    One open tunnel as its caller sees it. Its identity is ``run_id`` (also the cancel key on
    the node), with the node, adapter, target and operation it was sent to.
    """

    log = Logger()

    def __init__(
        self,
        run_id: str,
        node_id: str,
        adapter: str,
        target: str,
        operation: str,
        dispatcher: TunnelDispatcher,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
    ) -> None:
        self.run_id = run_id
        self.node_id = node_id
        self.adapter = adapter
        self.target = target
        self.operation = operation
        # The client request's id this tunnel serves ("" for a debug tunnel without one).
        self.request_id = ""
        self._dispatcher = dispatcher
        self._max_buffered = max_buffered_bytes
        self.status_code: int | None = None
        self.headers: HeaderList = []
        self.usage: Usage | None = None
        self.outcome: TunnelOutcome | None = None
        self.body_bytes = 0
        self.cancel_reason: str | None = None
        self._start_waiters: list[Deferred[tuple[int, HeaderList]]] = []
        self._done_waiters: list[Deferred[TunnelOutcome]] = []
        self._write: BodyWriter | None = None
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._paused = False
        self._discarding = False

    def __repr__(self) -> str:
        return f"<TunnelStream {self.run_id} node={self.node_id} adapter={self.adapter}>"

    @property
    def started(self) -> bool:
        return self.status_code is not None

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

    # -- the caller's API --------------------------------------------------------------------

    def when_started(self) -> Deferred[tuple[int, HeaderList]]:
        """
        A fresh Deferred firing with the provider's ``(status_code, headers)``, or failing with
        :class:`TunnelFailed` when the tunnel ended before the response started.
        """
        if self.status_code is not None:
            return succeed((self.status_code, list(self.headers)))
        if self.outcome is not None:
            return fail(
                TunnelFailed(
                    self.outcome.error or "tunnel ended without a response", self.outcome.code
                )
            )
        return _waiter(self._start_waiters)

    def deliver_body(self, write: BodyWriter) -> None:
        """
        Send the body to ``write``, in order: the bytes that already arrived first, then each
        chunk as it arrives. One consumer per stream.
        """
        if self._write is not None:
            raise RuntimeError(f"tunnel {self.run_id} already has a body consumer")
        self._write = write
        self._flush()
        self._maybe_done()

    def when_done(self) -> Deferred[TunnelOutcome]:
        """
        A fresh Deferred firing with the :class:`TunnelOutcome` once the tunnel has ended and its
        consumer has been given every byte (a paused consumer is waited for).
        """
        if self.outcome is not None and self._drained():
            return succeed(self.outcome)
        return _waiter(self._done_waiters)

    def cancel(self, reason: str = "cancelled by caller") -> None:
        """
        Ask the node to cancel (``CancelRequest(CANCEL_RUN)``); idempotent. No more body bytes
        are delivered; the tunnel ends with the error ``reason`` when the node confirms, or here
        after the grace period.
        """
        self._dispatcher.cancel(self.run_id, reason)

    # -- IPushProducer -----------------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._flush()
        self._maybe_done()

    def stopProducing(self) -> None:
        """The consumer is gone: drop what is buffered and cancel the tunnel."""
        self._discard()
        self.cancel(CONSUMER_GONE)
        self._maybe_done()

    # -- fed by the dispatcher ---------------------------------------------------------------

    def _started(self, status_code: int, headers: HeaderList) -> None:
        self.status_code = status_code
        self.headers = headers
        waiters, self._start_waiters = self._start_waiters, []
        for d in waiters:
            d.callback((status_code, list(headers)))

    def _body(self, data: bytes) -> None:
        self.body_bytes += len(data)
        if self._discarding or not data:
            return
        if self._write is not None and not self._paused and not self._pending:
            self._deliver(data)
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > self._max_buffered:
            self.log.warn(
                "tunnel {run_id}: consumer too slow ({buffered} bytes buffered); cancelling",
                run_id=self.run_id,
                node_id=self.node_id,
                buffered=self._pending_bytes,
            )
            self._discard()
            self.cancel(CLIENT_TOO_SLOW)

    def _cancelling(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self._discard()

    def _finish(self, outcome: TunnelOutcome) -> None:
        self.outcome = outcome
        if self.status_code is None:
            error = TunnelFailed(outcome.error or "tunnel ended without a response", outcome.code)
            waiters, self._start_waiters = self._start_waiters, []
            for d in waiters:
                d.errback(error)
        self._maybe_done()

    # -- internals ---------------------------------------------------------------------------

    def _deliver(self, data: bytes) -> None:
        assert self._write is not None
        try:
            self._write(data)
        except Exception:
            self.log.failure(
                "tunnel {run_id}: the body consumer failed",
                run_id=self.run_id,
                node_id=self.node_id,
            )
            self._discard()
            self.cancel("client write failed")

    def _flush(self) -> None:
        while self._pending and self._write is not None and not self._paused:
            data = self._pending.popleft()
            self._pending_bytes -= len(data)
            self._deliver(data)

    def _discard(self) -> None:
        self._discarding = True
        self._pending.clear()
        self._pending_bytes = 0

    def _drained(self) -> bool:
        return not self._pending or self._write is None

    def _maybe_done(self) -> None:
        if self.outcome is None or not self._drained():
            return
        outcome = self.outcome
        waiters, self._done_waiters = self._done_waiters, []
        for d in waiters:
            d.callback(outcome)


@implementer(INodeLifecycleObserver)
class TunnelDispatcher:
    """
    Opens provider tunnels on ready nodes and relays their frames.

    :param registry: who owns which node (ready connections, generations); the dispatcher
        registers itself as a lifecycle observer so a fenced node ends its tunnels at once.
    :param clock: the cancel grace timer.
    :param send: ``send(connection, envelope)``; by default the connection's ``send_envelope``.
    :param cancel_grace: seconds a cancelled tunnel waits for the node's end.
    :param max_buffered_bytes: body bytes buffered for a paused consumer before cancelling.
    """

    log = Logger()

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        send: Send = send_envelope,
        cancel_grace: float = CANCEL_GRACE_SEC,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
    ) -> None:
        self._registry = registry
        self._send = send
        self._max_buffered = max_buffered_bytes
        self._tunnels: InFlightTable[TunnelStream] = InFlightTable(
            clock, cancel_grace, "tunnel", "frame"
        )
        self._terminals = TerminalCounts(TUNNEL_TERMINALS)
        # Per node: echoes of a leased credential its tunnels removed from responses.
        self._echoes: dict[str, int] = {}
        registry.add_observer(self)

    # -- open --------------------------------------------------------------------------------

    def open(
        self,
        node_id: str,
        *,
        adapter: str,
        target: str,
        operation: str,
        method: str = "POST",
        path: str = "",
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        stream: bool = False,
        timeout_sec: int = 0,
        metadata: Mapping[str, str] | None = None,
        profile: str = "",
        run_id: str | None = None,
        seal: Callable[[], tuple[pb.CredentialBinding, bytes]] | None = None,
    ) -> TunnelStream:
        """
        Send a ``ProviderTunnelRequest`` to ``node_id``'s ready connection. Raises
        :class:`~iop.edge.errors.NodeUnavailable` when that node is not dispatch-ready and
        :class:`~iop.edge.errors.DispatchError` for a run id already in use. A send failure
        returns a stream that has already ended with an error. ``seal`` (managed mode) gives
        the credential binding and lease, called immediately before the request is sent; what
        it raises (a refused binding) is raised here and nothing is sent.
        """
        connection = self._registry.ready_connection(node_id)
        ownership = self._registry.ownership_of(connection) if connection is not None else None
        if connection is None or ownership is None:
            raise NodeUnavailable(f"node {node_id!r} is not connected")
        sealed = seal() if seal is not None else None
        rid = run_id or f"tun-{uuid.uuid4().hex}"
        tunnel = TunnelStream(rid, node_id, adapter, target, operation, self, self._max_buffered)
        tunnel.request_id = carried(metadata or {})
        self._tunnels.add(rid, tunnel, node_id, connection, ownership.generation)
        # Built in its envelope (no copy of the body into a second message).
        envelope = pb.Envelope()
        request = envelope.provider_tunnel_request
        request.run_id = rid
        request.adapter = adapter
        request.target = target
        request.method = method
        request.path = path
        request.operation = operation
        for name, value in headers:
            request.headers.add(name=name, value=value)
        request.body = body
        request.stream = stream
        request.timeout_sec = timeout_sec
        request.profile = profile
        if sealed is not None:
            request.credential_binding.CopyFrom(sealed[0])
            request.credential_lease = sealed[1]
        if metadata:
            request.metadata.update(metadata)
        try:
            self._send(connection, envelope)
        except Exception as e:
            self.log.failure(
                "sending tunnel {run_id} to node {node_id} failed", run_id=rid, node_id=node_id
            )
            self._finish(rid, f"could not send tunnel to node {node_id}: {e}", kind="send_failed")
        return tunnel

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """Ask the node to cancel ``run_id``; False when unknown or already being cancelled."""
        active = self._tunnels.get(run_id)
        if active is None or active.item.cancel_reason is not None:
            return False
        active.item._cancelling(reason)
        self.log.info(
            "cancelling tunnel {run_id} on node {node_id}: {reason}",
            run_id=run_id,
            node_id=active.node_id,
            reason=reason,
            request_id=active.item.request_id,
        )
        self._tunnels.request_cancel(
            run_id,
            reason,
            self._send,
            lambda entry: self._finish(run_id, entry.item.cancel_reason or reason),
        )
        return True

    # -- inbound from nodes ------------------------------------------------------------------

    def frame(self, connection: INodeConnection, message: pb.ProviderTunnelFrame) -> None:
        """One ``ProviderTunnelFrame`` from a node connection."""
        active = self._tunnels.accept(connection, message.run_id, message.sequence)
        if active is None:
            return
        stream = active.item
        kind = message.kind
        if kind == pb.RESPONSE_START:
            if stream.started:
                self._violation(stream, message, "a second RESPONSE_START")
                return
            stream._started(message.status_code, [(h.name, h.value) for h in message.headers])
        elif kind == pb.BODY:
            if not stream.started:
                self._violation(stream, message, "BODY before RESPONSE_START")
                return
            stream._body(message.body)
        elif kind == pb.USAGE:
            stream.usage = usage_from_proto(message.usage)
        elif kind == pb.END:
            self._count_echoes(stream, message.metadata)
            if not stream.started:
                self._finish(message.run_id, "tunnel ended without a response")
            else:
                self._finish(message.run_id, None)
        elif kind == pb.ERROR:
            self._count_echoes(stream, message.metadata)
            if stream.cancel_reason is not None:
                self.log.debug(
                    "tunnel {run_id} ended on its node: {error}",
                    run_id=message.run_id,
                    error=message.error,
                )
            self._finish(
                message.run_id,
                message.error or "tunnel failed on the node",
                error_code(message.metadata),
            )
        else:
            self._violation(stream, message, f"unknown frame kind {kind}")

    def node_ready(self, node_id: str, generation: int) -> None:
        pass

    def node_fenced(self, node_id: str, generation: int) -> None:
        """The node's ready generation is gone: its tunnels end with an error, now."""
        for active in self._tunnels.of_generation(node_id, generation):
            self._finish(
                active.key, f"node {node_id} disconnected during the tunnel", kind="node_lost"
            )

    # -- status ------------------------------------------------------------------------------

    def stats(self) -> dict[tuple[str, str], int]:
        """Tunnel ends per ``(node_id, kind)``: every configured node, every kind."""
        return self._terminals.snapshot(n.id for n in self._registry.config.nodes)

    def echo_stats(self) -> dict[str, int]:
        """
        Echoes of a leased credential the nodes removed from tunnel responses, per node
        (every configured node, zero until counted).
        """
        nodes = dict.fromkeys([*(n.id for n in self._registry.config.nodes), *self._echoes])
        return {node: self._echoes.get(node, 0) for node in nodes}

    def active(self) -> list[TunnelStream]:
        return [a.item for a in self._tunnels]

    def get(self, run_id: str) -> TunnelStream | None:
        active = self._tunnels.get(run_id)
        return active.item if active else None

    # -- internals ---------------------------------------------------------------------------

    def _violation(self, stream: TunnelStream, message: pb.ProviderTunnelFrame, what: str) -> None:
        self.log.warn(
            "dropping frame {sequence} of tunnel {run_id}: {what}",
            sequence=message.sequence,
            run_id=message.run_id,
            node_id=stream.node_id,
            what=what,
        )

    def _count_echoes(self, stream: TunnelStream, metadata: Mapping[str, str]) -> None:
        """The count a managed node puts in a tunnel's last frame (a bounded decimal, or none)."""
        raw = metadata.get(ECHOES_METADATA_KEY)
        if raw is None:
            return
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
            self.log.warn(
                "tunnel {run_id} on node {node_id}: ignoring a malformed {key} value",
                run_id=stream.run_id,
                node_id=stream.node_id,
                key=ECHOES_METADATA_KEY,
            )
            return
        self._echoes[stream.node_id] = self._echoes.get(stream.node_id, 0) + int(raw)

    def _finish(
        self,
        run_id: str,
        error: str | None,
        code: ErrorCode | None = None,
        kind: str | None = None,
    ) -> None:
        """
        End ``run_id`` once: ``error`` None is a clean end; a cancel's reason wins. ``kind``
        (of :data:`TUNNEL_TERMINALS`) when the caller knows it, else from ``error`` and ``code``.
        """
        active = self._tunnels.pop(run_id)
        if active is None:
            return
        stream = active.item
        if stream.cancel_reason is not None:
            # The caller gave up on this tunnel: whatever the node said, the body is incomplete.
            error, code, kind = stream.cancel_reason, None, "cancelled"
        elif kind is None:
            kind = _terminal_kind(error, code)
        self._terminals.count(stream.node_id, kind)
        outcome = TunnelOutcome(
            ok=error is None,
            error=error or "",
            code=code,
            usage=stream.usage,
            status_code=stream.status_code,
            body_bytes=stream.body_bytes,
        )
        if error is not None:
            log = self.log.info if kind == "cancelled" else self.log.warn
            log(
                "tunnel {run_id} on node {node_id} ended: {result}",
                run_id=run_id,
                node_id=stream.node_id,
                result=error,
                kind=kind,
                status_code=stream.status_code,
                body_bytes=stream.body_bytes,
                request_id=stream.request_id,
            )
        stream._finish(outcome)


def _terminal_kind(error: str | None, code: ErrorCode | None) -> str:
    if error is None:
        return "complete"
    if code is ErrorCode.PROVIDER_AT_CAPACITY:
        return "at_capacity"
    if code is ErrorCode.UPSTREAM_TIMEOUT:
        return "timeout"
    if code is not None and code.value.startswith("lease_"):
        return "lease_refused"
    return "error"
