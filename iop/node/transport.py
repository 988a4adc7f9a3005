# -*- test-case-name: iop.test.node.test_transport -*-
"""
The Node end of the Edge socket: framing, heartbeat and the register → apply → ready handshake.

The protocol frames and forwards; it decides nothing about reconnecting (that is
:mod:`iop.node.supervisor`). Its lifecycle is one explicit state machine::

    dialing ──handshake()──▶ registering ──accepted──▶ applying ──ready=true──▶ ready
       └──────────────────────────┴────────────────────────┴──────────────────────┴──▶ closed

Every failure on the way aborts the transport first and then fails the handshake's Deferred with a
:class:`~iop.node.errors.FatalError` (the Edge does not know our token) or a
:class:`~iop.node.errors.RetryableError` (anything else remote). Once ready, every envelope is
handed to the connection's :class:`NodeSession`.

Between apply and ready the factory's ``sessionSetup`` hook (if any) is given the new session to
install its request handlers (runs, cancel, node commands); a hook that raises fails the handshake
like a payload that does not apply. Adapter providers are built with the factory's
:class:`~iop.runtime.AdapterContext` (reactor + HTTP client).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from enum import Enum

import treq
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop import __version__
from iop.node.adapters.registry import AdapterApplyError, AdapterRegistry
from iop.node.errors import FatalError, NodeError, RetryableError
from iop.runtime.interfaces import AdapterContext, AdapterFactory
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_specs
from iop.wire.framing import DEFAULT_MAX_FRAME_BYTES, EnvelopeProtocol
from iop.wire.heartbeat import Heartbeat

DEFAULT_HEARTBEAT_INTERVAL = 2.0
DEFAULT_HEARTBEAT_TIMEOUT = 5.0

# ---------------------------------------------------------------------------------------------
# Lifecycle


class NodeState(Enum):
    DIALING = "dialing"
    REGISTERING = "registering"
    APPLYING = "applying"
    READY = "ready"
    CLOSED = "closed"


# The one place the node-side transitions are defined. Closing is allowed from every open state.
_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.DIALING: frozenset({NodeState.REGISTERING, NodeState.CLOSED}),
    NodeState.REGISTERING: frozenset({NodeState.APPLYING, NodeState.CLOSED}),
    NodeState.APPLYING: frozenset({NodeState.READY, NodeState.CLOSED}),
    NodeState.READY: frozenset({NodeState.CLOSED}),
    NodeState.CLOSED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A lifecycle transition that :data:`_TRANSITIONS` does not allow (a programming error)."""


class NodeLifecycle:
    """
    dialing → registering → applying → ready → closed, with guarded transitions: an illegal
    transition raises :class:`IllegalTransition` and leaves the state unchanged.
    """

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = NodeState.DIALING

    @property
    def state(self) -> NodeState:
        return self._state

    def advance(self, to: NodeState) -> None:
        if to not in _TRANSITIONS[self._state]:
            raise IllegalTransition(
                f"node connection cannot go from {self._state.value} to {to.value}"
            )
        self._state = to

    def close(self) -> bool:
        """Go to ``closed``. Idempotent; ``True`` only for the call that closed."""
        if self._state is NodeState.CLOSED:
            return False
        self.advance(NodeState.CLOSED)
        return True


# ---------------------------------------------------------------------------------------------
# Session

EnvelopeHandler = Callable[[pb.Envelope], None]
# Installs a new session's request handlers before the Node announces ready.
SessionSetup = Callable[["NodeSession"], None]

# Requests an Edge may send to a ready node. Each has a default handler that answers explicitly
# until the run, cancel, tunnel, command and refresh handlers are installed by later work.
EDGE_REQUEST_KINDS = frozenset(
    {
        "run_request",
        "cancel_request",
        "provider_tunnel_request",
        "node_command_request",
        "node_config_refresh_request",
    }
)

RUN_UNAVAILABLE = "execution not available on this node version"
CANCEL_UNAVAILABLE = "cancel not available on this node version"
TUNNEL_UNAVAILABLE = "provider tunnel not available on this node version"
COMMAND_UNAVAILABLE = "not implemented on this node yet"
REFRESH_UNAVAILABLE = "live config refresh not supported by this node version; restart the node"


class NodeSession:
    """
    What a ready connection serves: the node id and config payload the Edge delivered, the
    adapter registry built from it, and the handlers for the Edge's requests.

    The handlers are the seam later work extends (:meth:`install`); the defaults answer every
    request with an explicit error, never silence.
    """

    log = Logger()

    def __init__(
        self,
        node_id: str,
        config: pb.NodeConfigPayload,
        registry: AdapterRegistry,
        send: EnvelopeHandler,
        clock: IReactorTime,
        heartbeatInterval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeatTimeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.registry = registry
        # Transport facts for status (node commands): the heartbeat cadence in force, and when
        # the Edge acknowledged ready (seconds on the clock; None until then).
        self.heartbeat_interval = heartbeatInterval
        self.heartbeat_timeout = heartbeatTimeout
        self.ready_at: float | None = None
        self._send = send
        self._clock = clock
        self._closed = False
        self._closeWaiters: list[Deferred[None]] = []
        self._handlers: dict[str, EnvelopeHandler] = {
            "run_request": self._unavailableRun,
            "cancel_request": self._unavailableCancel,
            "provider_tunnel_request": self._unavailableTunnel,
            "node_command_request": self._unavailableCommand,
            "node_config_refresh_request": self._unavailableRefresh,
        }

    @property
    def closed(self) -> bool:
        return self._closed

    def install(self, kind: str, handler: EnvelopeHandler) -> None:
        """Handle the Edge requests of ``kind`` (an ``Envelope`` oneof name) with ``handler``."""
        if kind not in EDGE_REQUEST_KINDS:
            raise ValueError(f"{kind!r} is not a request an edge sends to a node")
        self._handlers[kind] = handler

    def handles(self, kind: str) -> bool:
        return kind in self._handlers

    def envelopeReceived(self, envelope: pb.Envelope) -> None:
        kind = envelope.WhichOneof("message")
        handler = self._handlers.get(kind or "")
        if handler is None:
            raise ValueError(f"no handler for {kind!r}")
        handler(envelope)

    def send(self, envelope: pb.Envelope) -> None:
        """Send to the Edge; a no-op once the connection has closed."""
        if not self._closed:
            self._send(envelope)

    def connectionLost(self, reason: Failure) -> None:
        if self._closed:
            return
        self._closed = True
        waiters, self._closeWaiters = self._closeWaiters, []
        for waiter in waiters:
            waiter.callback(None)

    def whenClosed(self) -> Deferred[None]:
        """A new Deferred, fired with ``None`` once this session's connection is gone."""
        if self._closed:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._closeWaiters.append(waiter)
        return waiter

    def describe(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "alias": self.config.alias,
            "config_revision": self.config.config_revision,
            "adapters": self.registry.describe(),
        }

    # -- default handlers --------------------------------------------------------------------

    def _nowMs(self) -> int:
        return int(self._clock.seconds() * 1000)

    def _unavailableRun(self, envelope: pb.Envelope) -> None:
        request = envelope.run_request
        self.log.warn(
            "refusing run {run_id} for adapter {adapter}: {error}",
            run_id=request.run_id,
            adapter=request.adapter,
            node_id=self.node_id,
            error=RUN_UNAVAILABLE,
        )
        self.send(
            pb.Envelope(
                run_event=pb.RunEvent(
                    run_id=request.run_id,
                    sequence=1,
                    type="error",
                    error=RUN_UNAVAILABLE,
                    session_id=request.session_id,
                    timestamp_unix_ms=self._nowMs(),
                )
            )
        )

    def _unavailableCancel(self, envelope: pb.Envelope) -> None:
        request = envelope.cancel_request
        self.log.warn(
            "refusing cancel of run {run_id}: {error}",
            run_id=request.run_id,
            node_id=self.node_id,
            error=CANCEL_UNAVAILABLE,
        )
        self.send(
            pb.Envelope(
                cancel_response=pb.CancelResponse(
                    kind=request.kind,
                    run_id=request.run_id,
                    session_id=request.session_id,
                    ok=False,
                    reason=CANCEL_UNAVAILABLE,
                )
            )
        )

    def _unavailableTunnel(self, envelope: pb.Envelope) -> None:
        request = envelope.provider_tunnel_request
        self.log.warn(
            "refusing provider tunnel {run_id} for adapter {adapter}: {error}",
            run_id=request.run_id,
            adapter=request.adapter,
            node_id=self.node_id,
            error=TUNNEL_UNAVAILABLE,
        )
        self.send(
            pb.Envelope(
                provider_tunnel_frame=pb.ProviderTunnelFrame(
                    run_id=request.run_id,
                    kind=pb.ERROR,
                    sequence=1,
                    end=True,
                    error=TUNNEL_UNAVAILABLE,
                )
            )
        )

    def _unavailableCommand(self, envelope: pb.Envelope) -> None:
        request = envelope.node_command_request
        self.log.warn(
            "refusing node command {request_id} ({command}): {error}",
            request_id=request.request_id,
            command=_commandName(request.type),
            node_id=self.node_id,
            error=COMMAND_UNAVAILABLE,
        )
        self.send(
            pb.Envelope(
                node_command_response=pb.NodeCommandResponse(
                    request_id=request.request_id,
                    type=request.type,
                    ok=False,
                    error=COMMAND_UNAVAILABLE,
                )
            )
        )

    def _unavailableRefresh(self, envelope: pb.Envelope) -> None:
        request = envelope.node_config_refresh_request
        self.log.warn(
            "config refresh {request_id} needs a restart: {error}",
            request_id=request.request_id,
            node_id=self.node_id,
            error=REFRESH_UNAVAILABLE,
        )
        self.send(
            pb.Envelope(
                node_config_refresh_response=pb.NodeConfigRefreshResponse(
                    request_id=request.request_id,
                    outcome=pb.REFRESH_RESTART_REQUIRED,
                    reason=REFRESH_UNAVAILABLE,
                )
            )
        )


def _rejectCodeName(code: int) -> str:
    try:
        return pb.RegisterRejectCode.Name(code)
    except ValueError:
        return str(code)


def _commandName(command: int) -> str:
    try:
        return pb.NodeCommandType.Name(command)
    except ValueError:
        return str(command)


# ---------------------------------------------------------------------------------------------
# Protocol


class EdgeConnectionProtocol(EnvelopeProtocol):
    """
    One connection to the Edge. Call :meth:`handshake` once after ``connectionMade``; the
    Deferred it returns fires with the ready :class:`NodeSession`.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        heartbeatInterval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeatTimeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        maxFrameBytes: int = DEFAULT_MAX_FRAME_BYTES,
        nodeVersion: str = __version__,
        hostname: str = "",
        adapterContext: AdapterContext | None = None,
        adapterFactories: Mapping[str, AdapterFactory] | None = None,
        sessionSetup: SessionSetup | None = None,
    ) -> None:
        super().__init__(maxFrameBytes)
        self._clock = clock
        self._adapterContext = (
            adapterContext if adapterContext is not None else defaultAdapterContext(clock)
        )
        self._adapterFactories = adapterFactories
        self._sessionSetup = sessionSetup
        self._nodeVersion = nodeVersion
        self._hostname = hostname
        self._lifecycle = NodeLifecycle()
        self._heartbeatSequence = 0
        self._heartbeatInterval = heartbeatInterval
        self._heartbeatTimeout = heartbeatTimeout
        self._heartbeat = self._makeHeartbeat(heartbeatInterval, heartbeatTimeout)
        # The one handshake step in flight: the envelope kind it waits for, and its Deferred.
        self._awaiting: tuple[str, Deferred[pb.Envelope]] | None = None
        self._session: NodeSession | None = None
        # The session built while applying, until ready (so its close is signalled either way).
        self._applying: NodeSession | None = None
        self._disconnected = False
        self._disconnectWaiters: list[Deferred[None]] = []

    @property
    def state(self) -> NodeState:
        return self._lifecycle.state

    @property
    def session(self) -> NodeSession | None:
        """The ready session, or ``None`` before ready."""
        return self._session

    # -- connection --------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._heartbeat.start()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self._heartbeat.stop()
        self._lifecycle.close()
        self._disconnected = True
        self._failAwaiting(
            RetryableError(f"connection lost during the handshake: {reason.getErrorMessage()}")
        )
        session, self._session = self._session, None
        applying, self._applying = self._applying, None
        if session is not None:
            session.connectionLost(reason)
        elif applying is not None:
            applying.connectionLost(reason)
        self.log.info(
            "connection to edge closed: {reason}",
            reason=self.closeReason or reason.getErrorMessage(),
            node_id=session.node_id if session is not None else None,
        )
        waiters, self._disconnectWaiters = self._disconnectWaiters, []
        for waiter in waiters:
            waiter.callback(None)

    def whenDisconnected(self) -> Deferred[None]:
        """A new Deferred, fired with ``None`` once this connection is lost."""
        if self._disconnected:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._disconnectWaiters.append(waiter)
        return waiter

    # -- handshake ---------------------------------------------------------------------------

    def handshake(self, token: str, clock: IReactorTime, timeout: float) -> Deferred[NodeSession]:
        """
        Register with ``token``, apply the delivered config, announce ready. The whole exchange is
        bounded by ``timeout`` seconds on ``clock``. On any failure the transport is aborted
        before the returned Deferred fails (FatalError or RetryableError).
        """
        if self._lifecycle.state is NodeState.CLOSED:
            return fail(RetryableError("connection closed before the handshake"))
        d = Deferred.fromCoroutine(self._handshake(token))
        d.addTimeout(timeout, clock)
        return d.addErrback(self._handshakeFailed, timeout)

    async def _handshake(self, token: str) -> NodeSession:
        self._lifecycle.advance(NodeState.REGISTERING)
        self.log.info(
            "registering with edge {peer}",
            peer=self._peer(),
            node_version=self._nodeVersion,
            hostname=self._hostname,
        )
        registered = self._expect("register_response")
        self.sendEnvelope(
            pb.Envelope(
                register_request=pb.RegisterRequest(
                    token=token, node_version=self._nodeVersion, hostname=self._hostname
                )
            )
        )
        response = (await registered).register_response
        if not response.accepted:
            reason = response.reason or "no reason given"
            code = _rejectCodeName(response.reject_code)
            if response.reject_code == pb.REGISTER_REJECT_UNKNOWN_TOKEN:
                raise FatalError(f"edge does not know this node's token ({code}): {reason}")
            raise RetryableError(f"edge rejected registration ({code}): {reason}")
        nodeId = response.node_id
        if not nodeId:
            raise RetryableError("edge accepted registration without a node id")
        self._adoptHeartbeat(response.heartbeat_interval_ms, response.heartbeat_timeout_ms)

        self._lifecycle.advance(NodeState.APPLYING)
        self.log.info(
            "registered as node {node_id}; applying config revision {revision}",
            node_id=nodeId,
            revision=response.config.config_revision,
            adapters=len(response.config.adapters),
        )
        try:
            registry = AdapterRegistry.from_specs(
                adapter_specs(response.config), self._adapterContext, self._adapterFactories
            )
        except AdapterApplyError as e:
            raise RetryableError(f"config payload does not apply: {e}") from e
        config = pb.NodeConfigPayload()
        config.CopyFrom(response.config)
        session = NodeSession(
            nodeId,
            config,
            registry,
            self._sendIfOpen,
            self._clock,
            heartbeatInterval=self._heartbeatInterval,
            heartbeatTimeout=self._heartbeatTimeout,
        )
        self._applying = session
        if self._sessionSetup is not None:
            try:
                self._sessionSetup(session)
            except Exception as e:
                self.log.failure("session setup failed", node_id=nodeId)
                raise RetryableError(f"session setup failed: {e or type(e).__name__}") from e

        readied = self._expect("node_ready_response")
        self.sendEnvelope(pb.Envelope(node_ready_request=pb.NodeReadyRequest(node_id=nodeId)))
        ready = (await readied).node_ready_response
        if not ready.ready:
            raise RetryableError(f"edge refused ready: {ready.reason or 'no reason given'}")

        self._lifecycle.advance(NodeState.READY)
        self._applying = None
        self._session = session
        session.ready_at = self._clock.seconds()
        self.log.info("node {node_id} ready", node_id=nodeId, adapters=len(registry))
        return session

    def _handshakeFailed(self, failure: Failure, timeout: float) -> NodeSession:
        if isinstance(failure.value, DeferredTimeoutError):
            message = f"handshake timed out after {timeout:g} s"
            self._abort(message)
            raise RetryableError(message) from failure.value
        self._abort(f"handshake failed: {failure.getErrorMessage()}")
        failure.raiseException()

    def _expect(self, kind: str) -> Deferred[pb.Envelope]:
        def cancel(d: Deferred[pb.Envelope]) -> None:
            if self._awaiting is not None and self._awaiting[1] is d:
                self._awaiting = None

        waiter: Deferred[pb.Envelope] = Deferred(cancel)
        self._awaiting = (kind, waiter)
        return waiter

    def _failAwaiting(self, error: NodeError) -> None:
        awaiting, self._awaiting = self._awaiting, None
        if awaiting is not None:
            awaiting[1].errback(error)

    # -- inbound -----------------------------------------------------------------------------

    def envelopeReceived(self, envelope: pb.Envelope) -> None:
        self._heartbeat.received()
        kind = envelope.WhichOneof("message") or ""
        if kind == "heartbeat":
            return
        state = self._lifecycle.state
        if state is NodeState.READY:
            assert self._session is not None
            if self._session.handles(kind):
                self._session.envelopeReceived(envelope)
            else:
                self._abort("message the edge may not send to a ready node", message=kind)
            return
        if state is NodeState.CLOSED:
            return
        awaiting = self._awaiting
        if awaiting is not None and awaiting[0] == kind:
            self._awaiting = None
            awaiting[1].callback(envelope)
            return
        self._abort(
            f"unexpected {kind} while {state.value}",
            RetryableError(f"edge sent an unexpected {kind} while {state.value}"),
            message=kind,
        )

    # -- heartbeat ---------------------------------------------------------------------------

    def _makeHeartbeat(self, interval: float, timeout: float) -> Heartbeat:
        return Heartbeat(
            self._clock, interval, timeout, self._sendHeartbeat, self._heartbeatExpired
        )

    def _adoptHeartbeat(self, intervalMs: int, timeoutMs: int) -> None:
        """Restart the heartbeat with the Edge's cadence (0 keeps the current value)."""
        if intervalMs:
            self._heartbeatInterval = intervalMs / 1000
        if timeoutMs:
            self._heartbeatTimeout = timeoutMs / 1000
        self._heartbeat.stop()
        self._heartbeat = self._makeHeartbeat(self._heartbeatInterval, self._heartbeatTimeout)
        self._heartbeat.start()

    def _sendHeartbeat(self, _sequence: int) -> None:
        # Our own counter, so it keeps counting when the heartbeat restarts with the Edge's cadence.
        self._heartbeatSequence += 1
        self._sendIfOpen(
            pb.Envelope(
                heartbeat=pb.Heartbeat(
                    sequence=self._heartbeatSequence,
                    sent_unix_ms=int(self._clock.seconds() * 1000),
                )
            )
        )

    def _heartbeatExpired(self) -> None:
        self.log.warn(
            "nothing from edge for {timeout} s; dropping the connection",
            timeout=self._heartbeatTimeout,
            node_id=self._session.node_id if self._session is not None else None,
        )
        self._abort("heartbeat timeout", RetryableError("edge heartbeat timed out"))

    # -- outbound / closing ------------------------------------------------------------------

    def _sendIfOpen(self, envelope: pb.Envelope) -> None:
        if self._lifecycle.state is not NodeState.CLOSED and self.transport is not None:
            self.sendEnvelope(envelope)

    def _abort(self, reason: str, error: NodeError | None = None, **fields: object) -> None:
        """Close for ``reason`` (aborting the transport once), then fail any handshake step."""
        if self._lifecycle.close():
            self._heartbeat.stop()
            if not self._disconnected:
                self.dropConnection(reason, **fields)
        if error is not None:
            self._failAwaiting(error)


def defaultAdapterContext(reactor: IReactorTime) -> AdapterContext:
    """``reactor`` and the ``treq`` module as the HTTP client (a daemon passes a pooled one)."""
    return AdapterContext(reactor=reactor, http=treq)


class EdgeConnectionFactory(Factory):
    """
    Builds one :class:`EdgeConnectionProtocol` per dial, with the node's defaults.

    :param adapterContext: what adapter factories get besides their config (default: the clock
        and the ``treq`` module).
    :param adapterFactories: adapter factories by type (default: the modules in
        :mod:`iop.node.adapters`); tests inject fakes.
    :param sessionSetup: called with each new session after its config applied and before the
        ready request; installs the session's request handlers. If it raises, the handshake fails
        with a :class:`~iop.node.errors.RetryableError`.
    """

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        heartbeatInterval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeatTimeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        maxFrameBytes: int = DEFAULT_MAX_FRAME_BYTES,
        nodeVersion: str = __version__,
        hostname: str | None = None,
        adapterContext: AdapterContext | None = None,
        adapterFactories: Mapping[str, AdapterFactory] | None = None,
        sessionSetup: SessionSetup | None = None,
    ) -> None:
        self.clock = clock
        self.heartbeatInterval = heartbeatInterval
        self.heartbeatTimeout = heartbeatTimeout
        self.maxFrameBytes = maxFrameBytes
        self.nodeVersion = nodeVersion
        self.hostname = socket.gethostname() if hostname is None else hostname
        self.adapterContext = (
            adapterContext if adapterContext is not None else defaultAdapterContext(clock)
        )
        self.adapterFactories = adapterFactories
        self.sessionSetup = sessionSetup

    def buildProtocol(self, addr: IAddress | None) -> EdgeConnectionProtocol:
        protocol = EdgeConnectionProtocol(
            self.clock,
            heartbeatInterval=self.heartbeatInterval,
            heartbeatTimeout=self.heartbeatTimeout,
            maxFrameBytes=self.maxFrameBytes,
            nodeVersion=self.nodeVersion,
            hostname=self.hostname,
            adapterContext=self.adapterContext,
            adapterFactories=self.adapterFactories,
            sessionSetup=self.sessionSetup,
        )
        protocol.factory = self
        return protocol
