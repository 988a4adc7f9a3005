# -*- test-case-name: iop.test.node.test_transport -*-
"""
The Node end of the Edge socket: framing, heartbeat and the register → apply → ready handshake.

The protocol frames and forwards; it decides nothing about reconnecting (that is
:mod:`iop.node.supervisor`) and nothing about what a message means now: it names each envelope
it reads as one input of the connection's lifecycle, an Automat machine, and the machine's state
decides::

    dialing ──handshake──▶ registering ──accepted, applied──▶ applying ──ready=true──▶ ready
       │                        │                                │                     │
       └────── abort / anything unexpected ──────────────────────┴─────────────────────┴─▶ closing
                                                                      connection lost ─▶ closed

A transition that depends on what a response says (accepted or not, applied or not, ready or
not) is fed back as the machine's own next input, which Automat runs before the input that caused
it returns: so the ready response has moved the connection to ``ready`` before any later
envelope, even one read in the same chunk, is looked at. From then on every Edge request goes to
the connection's :class:`~iop.node.session.NodeSession`. A request that arrives before the ready
response is the Edge dispatching before it acknowledged: a protocol error, the connection is
aborted and says so.

Every failure on the way aborts the transport first and then fails the handshake's Deferred with a
:class:`~iop.node.errors.FatalError` (the Edge does not know our token, or refuses our client
certificate or, in managed mode, our credential lease support) or a
:class:`~iop.node.errors.RetryableError` (anything else remote). The config apply itself is the
:class:`~iop.node.session.SessionBuilder`'s.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from automat import TypeMachineBuilder
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IAddress, IReactorTime, ISSLTransport
from twisted.internet.protocol import Factory, connectionDone
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from iop import __version__
from iop.node.errors import FatalError, RetryableError, connection_lost_error, not_an_edge
from iop.node.session import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    EDGE_REQUEST_KINDS,
    NodeSession,
    SessionBuilder,
    default_adapter_context,
)
from iop.wire import runtime_pb2 as pb
from iop.wire.framing import DEFAULT_MAX_FRAME_BYTES, EnvelopeProtocol
from iop.wire.heartbeat import Heartbeat

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "EdgeConnectionFactory",
    "EdgeConnectionProtocol",
    "IllegalTransition",
]


class IllegalTransition(RuntimeError):
    """A handshake asked of a connection that already has one (a programming error)."""


def _reject_code_name(code: int) -> str:
    try:
        return pb.RegisterRejectCode.Name(code)
    except ValueError:
        return str(code)


def _accepted_node_id(response: pb.RegisterResponse) -> str:
    """The node id of an accepted registration; the reason as a NodeError otherwise."""
    if not response.accepted:
        reason = response.reason or "no reason given"
        code = _reject_code_name(response.reject_code)
        if response.reject_code == pb.REGISTER_REJECT_UNKNOWN_TOKEN:
            raise FatalError(
                f"the Edge does not know this node's token ({code}: {reason}): no edge.yaml "
                "nodes[] entry has it; check its token_sha256, or print a new join line "
                "(iop node add)"
            )
        if response.reject_code == pb.REGISTER_REJECT_WORKLOAD_IDENTITY:
            raise FatalError(f"edge refused this node's client certificate ({code}): {reason}")
        if response.reject_code == pb.REGISTER_REJECT_LEASE_SUPPORT:
            raise FatalError(
                f"edge refused this node's credential lease support ({code}): {reason}"
            )
        raise RetryableError(f"edge rejected registration ({code}): {reason}")
    if not response.node_id:
        raise RetryableError("edge accepted registration without a node id")
    return response.node_id


# ---------------------------------------------------------------------------------------------
# The lifecycle machine

# How a handshake fails: a NodeError, or the Failure of something unexpected.
_Failed = Exception | Failure


class _Wire(Protocol):
    """What the lifecycle uses of its connection (the protocol)."""

    def write(self, envelope: pb.Envelope) -> None: ...

    def drop(self, reason: str, **fields: object) -> None: ...

    def adopt_heartbeat(self, interval_ms: int, timeout_ms: int) -> tuple[float, float]: ...

    def stop_heartbeat(self) -> None: ...

    def peer(self) -> str: ...

    def tls_handle(self) -> object: ...


class _Connection(Protocol):
    """
    The inputs of one Edge connection's lifecycle. An input called from inside a transition (a
    Deferred callback the machine fired, say) runs once that transition is over; only inputs
    that return nothing may be called so.
    """

    def handshake(self, token: str) -> Deferred[NodeSession]:
        """Register with ``token``; fires with the ready session (or fails, aborted first)."""

    def register_response_received(self, envelope: pb.Envelope) -> None:
        """The Edge answered the registration."""

    def ready_response_received(self, envelope: pb.Envelope) -> None:
        """The Edge answered the ready request."""

    def request_received(self, envelope: pb.Envelope) -> None:
        """One of :data:`~iop.node.session.EDGE_REQUEST_KINDS`."""

    def unexpected_received(self, envelope: pb.Envelope) -> None:
        """Any other envelope (never a heartbeat: liveness is the protocol's)."""

    def abort(self, reason: str, error: _Failed | None = None) -> None:
        """Close for ``reason``; fail a handshake in progress with ``error`` (if given)."""

    def connection_lost(self, reason: Failure) -> None:
        """The transport is gone."""

    def _registered(self, session: NodeSession) -> None:
        """The registration was accepted and its config applied into ``session``."""

    def _ready(self, session: NodeSession) -> None:
        """The Edge acknowledged ready."""


@dataclass
class _Core:
    """What the lifecycle works with: the connection, the config applier, the handshake."""

    wire: _Wire
    sessions: SessionBuilder
    clock: IReactorTime
    node_version: str
    hostname: str
    log: Logger
    # Managed mode: the lease keys announced at registration (None: a legacy node).
    lease_support: pb.LeaseSupport | None = None
    # The handshake in progress (until it fires), and the session built on this connection
    # (from apply until the connection is lost, so its close is signalled either way).
    waiter: Deferred[NodeSession] | None = None
    session: NodeSession | None = None
    node_id: str | None = None
    # Whether anything may still be written: shut by every close.
    writable: bool = True

    def send(self, envelope: pb.Envelope) -> None:
        if self.writable:
            self.wire.write(envelope)

    def new_waiter(self) -> Deferred[NodeSession]:
        def cancel(d: Deferred[NodeSession]) -> None:
            if self.waiter is d:
                self.waiter = None

        self.waiter = Deferred(cancel)
        return self.waiter

    def fail_waiter(self, error: _Failed) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.errback(error)

    def close(self, reason: str, error: _Failed | None = None, **fields: object) -> None:
        """Abort the transport (once) for ``reason``, then fail the handshake with ``error``."""
        self.writable = False
        self.wire.stop_heartbeat()
        self.wire.drop(reason, **fields)
        if error is not None:
            self.fail_waiter(error)

    def lost(self, reason: Failure) -> None:
        self.writable = False
        if self.waiter is not None:
            self.fail_waiter(
                connection_lost_error(self.wire.tls_handle(), reason, self.wire.peer())
            )
        session, self.session = self.session, None
        if session is not None:
            session.connection_lost(reason)


def _kind(envelope: pb.Envelope) -> str:
    return envelope.WhichOneof("message") or ""


def _carry(c: _Connection, s: _Core, session: NodeSession) -> NodeSession:
    return session


def _fail_handshake(c: _Connection, failure: Failure) -> None:
    # Fed back as an input: it runs as soon as the current transition is over.
    c.abort(f"handshake failed: {failure.getErrorMessage()}", failure)


class _EnvelopeBehaviour(Protocol):
    def __call__(self, c: _Connection, s: _Core, envelope: pb.Envelope) -> None: ...


class _SessionEnvelopeBehaviour(Protocol):
    def __call__(
        self, c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope
    ) -> None: ...


def _refuse(s: _Core, envelope: pb.Envelope, during: str) -> None:
    kind = _kind(envelope)
    s.close(
        f"unexpected {kind} while {during}",
        RetryableError(f"edge sent an unexpected {kind} while {during}"),
        message=kind,
    )


def _unexpected(during: str) -> _EnvelopeBehaviour:
    def refuse(c: _Connection, s: _Core, envelope: pb.Envelope) -> None:
        _refuse(s, envelope, during)

    return refuse


def _unexpected_applying(
    c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope
) -> None:
    _refuse(s, envelope, "applying")


def _ignore(c: _Connection, s: _Core, envelope: pb.Envelope) -> None:
    pass


def _ignore_session(c: _Connection, s: _Core, session: NodeSession) -> None:
    pass


def _ignore_lost(c: _Connection, s: _Core, reason: Failure) -> None:
    pass


def _make_connection_machine() -> Callable[[_Core], _Connection]:
    machine = TypeMachineBuilder(_Connection, _Core)
    dialing = machine.state("Dialing")
    registering = machine.state("Registering")
    applying = machine.state("Applying", _carry)
    ready = machine.state("Ready", _carry)
    closing = machine.state("Closing")
    closed = machine.state("Closed")
    received = (
        _Connection.register_response_received,
        _Connection.ready_response_received,
        _Connection.request_received,
        _Connection.unexpected_received,
    )

    # -- dialing -----------------------------------------------------------------------------

    @dialing.upon(_Connection.handshake).to(registering)
    def register(c: _Connection, s: _Core, token: str) -> Deferred[NodeSession]:
        s.log.info(
            "registering with edge {peer}",
            peer=s.wire.peer(),
            node_version=s.node_version,
            hostname=s.hostname,
        )
        waiter = s.new_waiter()
        request = pb.RegisterRequest(token=token, node_version=s.node_version, hostname=s.hostname)
        if s.lease_support is not None:
            request.lease_support.CopyFrom(s.lease_support)
        s.send(pb.Envelope(register_request=request))
        return waiter

    for message in received:
        dialing.upon(message).to(closing)(_unexpected("dialing"))

    # -- registering -------------------------------------------------------------------------

    @registering.upon(_Connection.register_response_received).loop()
    def apply(c: _Connection, s: _Core, envelope: pb.Envelope) -> None:
        response = envelope.register_response
        try:
            node_id = _accepted_node_id(response)
            s.node_id = node_id
            interval, timeout = s.wire.adopt_heartbeat(
                response.heartbeat_interval_ms, response.heartbeat_timeout_ms
            )
            s.log.info(
                "registered as node {node_id}; applying config revision {revision}",
                node_id=node_id,
                revision=response.config.config_revision,
                adapters=len(response.config.adapters),
            )
            session = s.sessions.apply(
                node_id,
                response.config,
                s.send,
                s.clock,
                heartbeat_interval=interval,
                heartbeat_timeout=timeout,
                draining_supported=response.node_draining_supported,
            )
        except Exception:
            _fail_handshake(c, Failure())
            return
        s.session = session
        c._registered(session)

    @registering.upon(_Connection._registered).to(applying)
    def announce(c: _Connection, s: _Core, session: NodeSession) -> None:
        try:
            s.sessions.equip(session)
        except Exception:
            _fail_handshake(c, Failure())
            return
        s.send(pb.Envelope(node_ready_request=pb.NodeReadyRequest(node_id=session.node_id)))

    for message in received[1:]:
        registering.upon(message).to(closing)(_unexpected("registering"))

    # -- applying ----------------------------------------------------------------------------

    @applying.upon(_Connection.ready_response_received).loop()
    def acknowledged(c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope) -> None:
        response = envelope.node_ready_response
        if not response.ready:
            reason = response.reason or "no reason given"
            _fail_handshake(c, Failure(RetryableError(f"edge refused ready: {reason}")))
            return
        c._ready(session)

    @applying.upon(_Connection._ready).to(ready)
    def serve(c: _Connection, s: _Core, applied: NodeSession, session: NodeSession) -> None:
        session.ready_at = s.clock.seconds()
        s.log.info("node {node_id} ready", node_id=session.node_id, adapters=len(session.registry))
        waiter, s.waiter = s.waiter, None
        if waiter is not None:
            waiter.callback(session)

    @applying.upon(_Connection.request_received).to(closing)
    def early_request(
        c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope
    ) -> None:
        # The Edge must acknowledge ready before it dispatches anything to this connection.
        kind = _kind(envelope)
        s.close(
            f"unexpected {kind} while applying: a request before the ready response",
            RetryableError(
                f"edge sent an unexpected {kind} while applying, before acknowledging ready"
            ),
            message=kind,
        )

    for message in (_Connection.register_response_received, _Connection.unexpected_received):
        applying.upon(message).to(closing)(_unexpected_applying)

    # -- ready -------------------------------------------------------------------------------

    @ready.upon(_Connection.request_received).loop()
    def forward(c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope) -> None:
        session.envelope_received(envelope)

    def not_for_ready(
        c: _Connection, s: _Core, session: NodeSession, envelope: pb.Envelope
    ) -> None:
        s.close("message the edge may not send to a ready node", message=_kind(envelope))

    for message in (
        _Connection.register_response_received,
        _Connection.ready_response_received,
        _Connection.unexpected_received,
    ):
        ready.upon(message).to(closing)(not_for_ready)

    # -- every open state --------------------------------------------------------------------

    def close(c: _Connection, s: _Core, reason: str, error: _Failed | None = None) -> None:
        s.close(reason, error)

    def lost(c: _Connection, s: _Core, reason: Failure) -> None:
        s.lost(reason)

    def twice(c: _Connection, s: _Core, token: str) -> Deferred[NodeSession]:
        return fail(IllegalTransition("node connection cannot handshake twice"))

    def close_session(
        c: _Connection, s: _Core, session: NodeSession, reason: str, error: _Failed | None = None
    ) -> None:
        s.close(reason, error)

    def lost_session(c: _Connection, s: _Core, session: NodeSession, reason: Failure) -> None:
        s.lost(reason)

    def twice_session(
        c: _Connection, s: _Core, session: NodeSession, token: str
    ) -> Deferred[NodeSession]:
        return twice(c, s, token)

    dialing.upon(_Connection.abort).to(closing)(close)
    dialing.upon(_Connection.connection_lost).to(closed)(lost)
    registering.upon(_Connection.abort).to(closing)(close)
    registering.upon(_Connection.connection_lost).to(closed)(lost)
    registering.upon(_Connection.handshake).loop()(twice)
    for open_ in (applying, ready):
        open_.upon(_Connection.abort).to(closing)(close_session)
        open_.upon(_Connection.connection_lost).to(closed)(lost_session)
        open_.upon(_Connection.handshake).loop()(twice_session)

    # -- closing / closed: nothing more is read, written or decided --------------------------

    def fail_late(c: _Connection, s: _Core, reason: str, error: _Failed | None = None) -> None:
        if error is not None:
            s.fail_waiter(error)

    def gone(c: _Connection, s: _Core, token: str) -> Deferred[NodeSession]:
        return fail(RetryableError("connection closed before the handshake"))

    closing.upon(_Connection.connection_lost).to(closed)(lost)
    closed.upon(_Connection.connection_lost).loop()(_ignore_lost)
    for over in (closing, closed):
        over.upon(_Connection.abort).loop()(fail_late)
        over.upon(_Connection.handshake).loop()(gone)
        over.upon(_Connection._registered).loop()(_ignore_session)
        over.upon(_Connection._ready).loop()(_ignore_session)
        for message in received:
            over.upon(message).loop()(_ignore)

    return machine.build()


_ConnectionMachine = _make_connection_machine()


# ---------------------------------------------------------------------------------------------
# Protocol


class EdgeConnectionProtocol(EnvelopeProtocol):
    """
    One connection to the Edge. Call :meth:`handshake` once after ``connectionMade``; the
    Deferred it returns fires with the ready :class:`~iop.node.session.NodeSession`.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        sessions: SessionBuilder | None = None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        node_version: str = __version__,
        hostname: str = "",
        log: Logger | None = None,
        lease_support: pb.LeaseSupport | None = None,
    ) -> None:
        super().__init__(max_frame_bytes)
        if log is not None:
            self.log = log
        self._clock = clock
        self._heartbeat_sequence = 0
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_timeout = heartbeat_timeout
        self._heartbeat = self._make_heartbeat(heartbeat_interval, heartbeat_timeout)
        self._core = _Core(
            self,
            sessions if sessions is not None else SessionBuilder(default_adapter_context(clock)),
            clock,
            node_version,
            hostname,
            self.log,
            lease_support,
        )
        self._connection = _ConnectionMachine(self._core)
        self._disconnected = False
        # Whether the peer has sent a byte (after TLS: of application data) on this connection.
        self._answered = False
        self._disconnect_waiters: list[Deferred[None]] = []

    # -- connection --------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._heartbeat.start()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self._heartbeat.stop()
        self._disconnected = True
        was_ready = self._core.session is not None
        self._connection.connection_lost(reason)
        # A connection that never became ready: the supervisor's line for the attempt says why.
        self.log.emit(
            LogLevel.info if was_ready else LogLevel.debug,
            "connection to edge closed: {reason}",
            reason=self.close_reason or reason.getErrorMessage(),
            node_id=self._core.node_id,
        )
        waiters, self._disconnect_waiters = self._disconnect_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def dataReceived(self, data: bytes) -> None:
        if not self._answered:
            self._answered = True
            if data.startswith(b"HTTP/"):
                # An HTTP listener's answer to our frame: not an Edge node listener.
                error: _Failed = not_an_edge(self.peer(), "it answered HTTP")
                self._connection.abort("an HTTP answer", error)
                return
        super().dataReceived(data)

    def when_disconnected(self) -> Deferred[None]:
        """A new Deferred, fired with ``None`` once this connection is lost."""
        if self._disconnected:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._disconnect_waiters.append(waiter)
        return waiter

    # -- handshake ---------------------------------------------------------------------------

    def handshake(self, token: str, clock: IReactorTime, timeout: float) -> Deferred[NodeSession]:
        """
        Register with ``token``, apply the delivered config, announce ready. The whole exchange is
        bounded by ``timeout`` seconds on ``clock``. On any failure the transport is aborted
        before the returned Deferred fails (FatalError or RetryableError).
        """
        d = self._connection.handshake(token)
        d.addTimeout(timeout, clock)
        return d.addErrback(self._handshake_failed, timeout)

    def _handshake_failed(self, failure: Failure, timeout: float) -> NodeSession:
        if isinstance(failure.value, DeferredTimeoutError):
            message = f"handshake timed out after {timeout:g} s"
            self._connection.abort(message)
            raise RetryableError(message) from failure.value
        # A failure the lifecycle decided has already closed; this covers the rest.
        self._connection.abort(f"handshake failed: {failure.getErrorMessage()}")
        failure.raiseException()

    # -- inbound: name the envelope, the lifecycle decides -----------------------------------

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self._heartbeat.received()
        kind = envelope.WhichOneof("message")
        if kind == "heartbeat":
            return
        if kind in EDGE_REQUEST_KINDS:
            self._connection.request_received(envelope)
        elif kind == "register_response":
            self._connection.register_response_received(envelope)
        elif kind == "node_ready_response":
            self._connection.ready_response_received(envelope)
        else:
            self._connection.unexpected_received(envelope)

    # -- the wire, as the lifecycle uses it --------------------------------------------------

    def write(self, envelope: pb.Envelope) -> None:
        if self.transport is not None:
            self.send_envelope(envelope)

    def drop(self, reason: str, **fields: object) -> None:
        if not self._disconnected:
            self.drop_connection(reason, **fields)

    def peer(self) -> str:
        """The Edge as ``host:port``: as its logger names it, else the connection's peer."""
        edge = getattr(self.log, "edge", None)
        if isinstance(edge, str) and edge:
            return edge
        address = self.transport.getPeer() if self.transport is not None else None
        host, port = getattr(address, "host", None), getattr(address, "port", None)
        if host is None or port is None:
            return self._peer()
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def tls_handle(self) -> object:
        """The transport, whose TLS connection says why this node refused the Edge."""
        return self.transport

    def adopt_heartbeat(self, interval_ms: int, timeout_ms: int) -> tuple[float, float]:
        """Restart the heartbeat with the Edge's cadence (0 keeps the current value)."""
        if interval_ms:
            self._heartbeat_interval = interval_ms / 1000
        if timeout_ms:
            self._heartbeat_timeout = timeout_ms / 1000
        self._heartbeat.stop()
        self._heartbeat = self._make_heartbeat(self._heartbeat_interval, self._heartbeat_timeout)
        self._heartbeat.start()
        return self._heartbeat_interval, self._heartbeat_timeout

    def stop_heartbeat(self) -> None:
        self._heartbeat.stop()

    # -- heartbeat ---------------------------------------------------------------------------

    def _make_heartbeat(self, interval: float, timeout: float) -> Heartbeat:
        return Heartbeat(
            self._clock, interval, timeout, self._send_heartbeat, self._heartbeat_expired
        )

    def _send_heartbeat(self, _sequence: int) -> None:
        # Our own counter, so it keeps counting when the heartbeat restarts with the Edge's cadence.
        self._heartbeat_sequence += 1
        self._core.send(
            pb.Envelope(
                heartbeat=pb.Heartbeat(
                    sequence=self._heartbeat_sequence,
                    sent_unix_ms=int(self._clock.seconds() * 1000),
                )
            )
        )

    def _heartbeat_expired(self) -> None:
        tls = ISSLTransport(self.transport, None)
        if tls is not None and tls.getPeerCertificate() is None:
            # Connected, and not even a TLS answer: not an Edge's node listener (an HTTP
            # listener waits for a request line that never comes; an Edge answers at once).
            error: _Failed = not_an_edge(
                self.peer(),
                f"it accepted the connection but sent no TLS answer in "
                f"{self._heartbeat_timeout:g} s",
            )
            self._connection.abort("no TLS answer", error)
            return
        self.log.warn(
            "nothing from edge for {timeout} s; dropping the connection",
            timeout=self._heartbeat_timeout,
            node_id=self._core.node_id,
        )
        self._connection.abort("heartbeat timeout", RetryableError("edge heartbeat timed out"))


class EdgeConnectionFactory(Factory):
    """
    Builds one :class:`EdgeConnectionProtocol` per dial, with the node's defaults.

    :param sessions: applies each accepted registration's config and installs the session's
        request handlers (default: a :class:`~iop.node.session.SessionBuilder` with the clock,
        the ``treq`` module, the adapters of :mod:`iop.node.adapters` and no handlers).
    :param log: the logger of every connection it builds (default: the protocol's own); a node
        dialling several Edges gives each Edge's factory one that names the Edge.
    :param lease_support: managed mode: the lease keys every registration announces
        (:meth:`~iop.security.lease.NodeLeaseKeys.announcement`); None for a legacy node.
    """

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        sessions: SessionBuilder | None = None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        node_version: str = __version__,
        hostname: str | None = None,
        log: Logger | None = None,
        lease_support: pb.LeaseSupport | None = None,
    ) -> None:
        self.clock = clock
        self.connection_log = log
        self.lease_support = lease_support
        self.sessions = (
            sessions if sessions is not None else SessionBuilder(default_adapter_context(clock))
        )
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.max_frame_bytes = max_frame_bytes
        self.node_version = node_version
        self.hostname = socket.gethostname() if hostname is None else hostname

    def buildProtocol(self, addr: IAddress | None) -> EdgeConnectionProtocol:
        protocol = EdgeConnectionProtocol(
            self.clock,
            self.sessions,
            heartbeat_interval=self.heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            max_frame_bytes=self.max_frame_bytes,
            node_version=self.node_version,
            hostname=self.hostname,
            log=self.connection_log,
            lease_support=self.lease_support,
        )
        protocol.factory = self
        return protocol
