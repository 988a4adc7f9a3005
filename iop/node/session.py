# -*- test-case-name: iop.test.node.test_transport -*-
"""
What one ready Edge connection serves, and how the Edge's config becomes it.

:class:`SessionBuilder` is the config applier the connection is given: it turns the payload of an
accepted registration into an :class:`~iop.node.adapters.registry.AdapterRegistry` and a
:class:`NodeSession` (:meth:`SessionBuilder.apply`), then lets the daemon's set-up hook install
the session's request handlers (:meth:`SessionBuilder.equip`). Either step failing is a
:class:`~iop.node.errors.RetryableError`: the Edge's config may be fixed.

A :class:`NodeSession` answers every Edge request with an explicit error until a handler for its
kind is installed (runs, cancels, tunnels, node commands); never silence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import treq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.registry import AdapterApplyError, AdapterRegistry
from iop.node.errors import RetryableError
from iop.runtime.interfaces import AdapterContext, AdapterFactory
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_specs

__all__ = [
    "CANCEL_UNAVAILABLE",
    "COMMAND_UNAVAILABLE",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "EDGE_REQUEST_KINDS",
    "REFRESH_UNAVAILABLE",
    "RUN_UNAVAILABLE",
    "TUNNEL_UNAVAILABLE",
    "EnvelopeHandler",
    "NodeSession",
    "SessionBuilder",
    "SessionSetup",
    "default_adapter_context",
]

DEFAULT_HEARTBEAT_INTERVAL = 2.0
DEFAULT_HEARTBEAT_TIMEOUT = 5.0

EnvelopeHandler = Callable[[pb.Envelope], None]
# Installs a new session's request handlers before the Node announces ready.
SessionSetup = Callable[["NodeSession"], None]

# Requests an Edge may send to a ready node. Each has a default handler that answers explicitly
# until the run, cancel, tunnel, command and refresh handlers are installed.
EDGE_REQUEST_KINDS = frozenset(
    {
        "run_request",
        "cancel_request",
        "provider_tunnel_request",
        "node_command_request",
        "node_config_refresh_request",
        # The Edge's answer to our NodeDraining (iop.node.drain): no new work from it.
        "node_draining",
    }
)

RUN_UNAVAILABLE = "execution not available on this node version"
CANCEL_UNAVAILABLE = "cancel not available on this node version"
TUNNEL_UNAVAILABLE = "provider tunnel not available on this node version"
COMMAND_UNAVAILABLE = "not implemented on this node yet"
REFRESH_UNAVAILABLE = "live config refresh not supported by this node version; restart the node"


def default_adapter_context(reactor: IReactorTime) -> AdapterContext:
    """``reactor`` and the ``treq`` module as the HTTP client (a daemon passes a pooled one)."""
    return AdapterContext(reactor=reactor, http=treq)


class SessionBuilder:
    """
    Applies an accepted registration's config: adapters first, then the request handlers.

    :param adapter_context: what adapter factories get besides their config (reactor + HTTP).
    :param adapter_factories: adapter factories by type (default: the modules in
        :mod:`iop.node.adapters`); tests inject fakes.
    :param setup: called with each new session after its config applied and before the ready
        request; installs the session's request handlers.
    """

    log = Logger()

    def __init__(
        self,
        adapter_context: AdapterContext,
        adapter_factories: Mapping[str, AdapterFactory] | None = None,
        setup: SessionSetup | None = None,
    ) -> None:
        self.adapter_context = adapter_context
        self.adapter_factories = adapter_factories
        self.setup = setup

    def apply(
        self,
        node_id: str,
        payload: pb.NodeConfigPayload,
        send: EnvelopeHandler,
        clock: IReactorTime,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        draining_supported: bool = False,
    ) -> NodeSession:
        """
        The session ``payload`` describes; :class:`RetryableError` if it does not apply.
        ``draining_supported``: the Edge's ``RegisterResponse`` says it understands
        ``NodeDraining``.
        """
        context, factories = self.adapter_context, self.adapter_factories
        try:
            registry = AdapterRegistry.from_specs(adapter_specs(payload), context, factories)
        except AdapterApplyError as e:
            raise RetryableError(f"config payload does not apply: {e}") from e
        config = pb.NodeConfigPayload()
        config.CopyFrom(payload)
        return NodeSession(
            node_id,
            config,
            registry,
            send,
            clock,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            draining_supported=draining_supported,
        )

    def equip(self, session: NodeSession) -> None:
        """Install ``session``'s handlers; a failing hook is a :class:`RetryableError`."""
        if self.setup is None:
            return
        try:
            self.setup(session)
        except Exception as e:
            self.log.failure("session setup failed", node_id=session.node_id)
            raise RetryableError(f"session setup failed: {e or type(e).__name__}") from e


class NodeSession:
    """
    What a ready connection serves: the node id and config payload the Edge delivered, the
    adapter registry built from it, and the handlers for the Edge's requests.

    The handlers are the seam the daemon extends (:meth:`install`); the defaults answer every
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
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        draining_supported: bool = False,
    ) -> None:
        self.node_id = node_id
        # Whether this session's Edge may be sent NodeDraining (an older Edge may not).
        self.draining_supported = draining_supported
        self.config = config
        self.registry = registry
        # Transport facts for status (node commands): the heartbeat cadence in force, and when
        # the Edge acknowledged ready (seconds on the clock; None until then).
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.ready_at: float | None = None
        self._send = send
        self._clock = clock
        self._closed = False
        self._close_waiters: list[Deferred[None]] = []
        self._handlers: dict[str, EnvelopeHandler] = {
            "run_request": self._unavailable_run,
            "cancel_request": self._unavailable_cancel,
            "provider_tunnel_request": self._unavailable_tunnel,
            "node_command_request": self._unavailable_command,
            "node_config_refresh_request": self._unavailable_refresh,
            "node_draining": self._unexpected_draining,
        }

    @property
    def closed(self) -> bool:
        return self._closed

    def install(self, kind: str, handler: EnvelopeHandler) -> None:
        """Handle the Edge requests of ``kind`` (an ``Envelope`` oneof name) with ``handler``."""
        if kind not in EDGE_REQUEST_KINDS:
            raise ValueError(f"{kind!r} is not a request an edge sends to a node")
        self._handlers[kind] = handler

    def envelope_received(self, envelope: pb.Envelope) -> None:
        """One of :data:`EDGE_REQUEST_KINDS`, to its handler."""
        kind = envelope.WhichOneof("message")
        handler = self._handlers.get(kind or "")
        if handler is None:
            raise ValueError(f"no handler for {kind!r}")
        handler(envelope)

    def send(self, envelope: pb.Envelope) -> None:
        """Send to the Edge; a no-op once the connection has closed."""
        if not self._closed:
            self._send(envelope)

    def connection_lost(self, reason: Failure) -> None:
        if self._closed:
            return
        self._closed = True
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def when_closed(self) -> Deferred[None]:
        """A new Deferred, fired with ``None`` once this session's connection is gone."""
        if self._closed:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._close_waiters.append(waiter)
        return waiter

    def describe(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "alias": self.config.alias,
            "config_revision": self.config.config_revision,
            "adapters": self.registry.describe(),
        }

    # -- default handlers --------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    def _unavailable_run(self, envelope: pb.Envelope) -> None:
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
                    timestamp_unix_ms=self._now_ms(),
                )
            )
        )

    def _unavailable_cancel(self, envelope: pb.Envelope) -> None:
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

    def _unavailable_tunnel(self, envelope: pb.Envelope) -> None:
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

    def _unavailable_command(self, envelope: pb.Envelope) -> None:
        request = envelope.node_command_request
        self.log.warn(
            "refusing node command {request_id} ({command}): {error}",
            request_id=request.request_id,
            command=_command_name(request.type),
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

    def _unavailable_refresh(self, envelope: pb.Envelope) -> None:
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

    def _unexpected_draining(self, envelope: pb.Envelope) -> None:
        # Only an answer to our own NodeDraining means anything; without a drain, nothing to do.
        self.log.info("ignoring a node_draining answer: this node is not draining")


def _command_name(command: int) -> str:
    try:
        return pb.NodeCommandType.Name(command)
    except ValueError:
        return str(command)
