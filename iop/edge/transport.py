# -*- test-case-name: iop.test.edge.test_transport,iop.test.edge.test_transport_identity -*-
"""
The Edge end of a node socket: framing, heartbeat and the register/ready handshake, forwarded
to the :class:`~iop.edge.registry.NodeRegistry`, which decides.

Per connection: a node must register within ``register_timeout`` seconds; the heartbeat runs from
the first byte; a message only a node may send is accepted, anything else closes the connection.

The connection's lifecycle is one Automat machine (:func:`_make_session_machine`)::

    idle → awaiting register → registering → pending → readying → ready
                                   └──────────────┴──────────┴──→ closed

The protocol only classifies each envelope and sends the machine an input (``register``,
``ready``, ``message_after_ready``, ``forbidden_message``, the timers' ``register_expired`` and
``heartbeat_expired``, ``connection_lost``); it never asks the machine for its state. The one
per-frame path is the exception to an input per envelope: entering ``ready`` the machine routes
the messages only a ready node may send (``route_after_ready``) straight to their handlers, and
every way out of ``ready`` routes them back to the machine — an Automat input costs ~4 µs, a
stream is a frame per token. The register timer lives in the awaiting-register state's data.

Workload identity is the registry's too: the ``register`` input hands it the client certificate
the TLS handshake verified (read with the factory's ``peer_certificate``, by default
:func:`iop.security.tls.peer_certificate`), and a refusal closes the connection like any other.
A connection lost before its TLS handshake completed is told to the factory's
:class:`~iop.edge.tlsrefusals.TLSRefusals` (the handshake refused the peer, or the peer left);
the machine only hears ``connection_lost``, as for any loss.

Every ``RegisterResponse`` says the Edge understands ``NodeDraining``
(``node_draining_supported``). A ready node's ``NodeDraining`` goes to the registry
(:meth:`~iop.edge.registry.NodeRegistry.draining`) and is answered with ``NodeDraining``: the
node refuses new work only after that answer, which follows whatever was dispatched to it
before.

Ownership and generations stay the registry's: the machine's ``registering`` and ``readying``
states last exactly as long as the registry takes to decide, and the registry (not this module)
orders ready: the ``NodeReadyResponse`` is written before any observer can dispatch to the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from automat import TypeMachineBuilder, pep614
from cryptography import x509
from twisted.internet.interfaces import IAddress, IDelayedCall, IHandshakeListener, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.edge.interfaces import INodeConnection
from iop.edge.registry import NodeRegistry, ReadyOutcome, RegisterAccepted
from iop.edge.tlsrefusals import TLSRefusals
from iop.security.tls import peer_certificate
from iop.wire import runtime_pb2 as pb
from iop.wire.framing import _CONNECTION_DONE, EnvelopeProtocol
from iop.wire.heartbeat import Heartbeat

# Messages a node may send once it is ready. The factory's ``handlers`` route them to the
# service that owns them; one without a handler is logged and dropped.
_NODE_TO_EDGE_AFTER_READY = frozenset(
    {
        "run_event",
        "cancel_response",
        "provider_tunnel_frame",
        "node_command_response",
        "node_config_refresh_response",
        "node_draining",
    }
)

Handler = Callable[["NodeConnection", pb.Envelope], None]
# The client certificate a connection's transport presented (None: none, or not TLS).
PeerCertificate = Callable[[object], x509.Certificate | None]


# -- the lifecycle machine ---------------------------------------------------------------------


class _Session(Protocol):
    """The inputs of one node connection's lifecycle, each listed once."""

    def connection_made(self) -> None:
        "The socket is up: start the heartbeat and the register timer."

    def register(self, request: pb.RegisterRequest) -> None:
        "The node presents its token."

    def ready(self, request: pb.NodeReadyRequest) -> None:
        "The node says it has applied its config."

    def message_after_ready(self, kind: str, envelope: pb.Envelope) -> None:
        "A message only a ready node may send."

    def forbidden_message(self, kind: str) -> None:
        "A message a node may never send."

    def register_expired(self) -> None:
        "No registration within the register timeout."

    def heartbeat_expired(self) -> None:
        "Nothing from the node within the heartbeat timeout."

    def connection_lost(self, reason: str) -> None:
        "The socket is gone (once, whatever closed it)."

    def _accepted(self) -> None:
        "The registry accepted the registration (internal)."

    def _readied(self) -> None:
        "The registry made the node ready (internal)."

    def _refused(self) -> None:
        "The registry refused a registration or a ready; the connection is closing (internal)."


@dataclass
class _Core:
    """What the machine acts on: the connection (send, close) and its collaborators."""

    connection: NodeConnection
    registry: NodeRegistry
    clock: IReactorTime
    heartbeat: Heartbeat
    handlers: dict[str, Handler]
    heartbeat_interval: float
    heartbeat_timeout: float
    register_timeout: float
    log = Logger()

    def register(self, session: _Session, request: pb.RegisterRequest) -> None:
        outcome = self.registry.register(
            request.token,
            self.connection,
            self.connection.peer_certificate(),
            request.lease_support if request.HasField("lease_support") else None,
        )
        response = pb.RegisterResponse(
            heartbeat_interval_ms=int(self.heartbeat_interval * 1000),
            heartbeat_timeout_ms=int(self.heartbeat_timeout * 1000),
            node_draining_supported=True,
        )
        if isinstance(outcome, RegisterAccepted):
            self.connection.node_id = outcome.node_id
            response.accepted = True
            response.node_id = outcome.node_id
            response.config.CopyFrom(outcome.payload)
            self.connection.send_envelope(pb.Envelope(register_response=response))
            session._accepted()
        else:
            response.accepted = False
            response.node_id = outcome.node_id
            response.reason = outcome.reason
            response.reject_code = outcome.code  # type: ignore[assignment]
            self.connection.send_envelope(pb.Envelope(register_response=response))
            self.connection.close(f"registration rejected: {outcome.reason}")
            session._refused()

    def ready(self, session: _Session, request: pb.NodeReadyRequest) -> None:
        def acknowledge(outcome: ReadyOutcome) -> None:
            self.connection.send_envelope(
                pb.Envelope(
                    node_ready_response=pb.NodeReadyResponse(
                        ready=outcome.ready, node_id=request.node_id, reason=outcome.reason
                    )
                )
            )

        outcome = self.registry.ready(request.node_id, self.connection, acknowledge)
        if outcome.ready:
            session._readied()
        else:
            self.connection.close(f"ready rejected: {outcome.reason}")
            session._refused()

    def open_route(self) -> None:
        """Ready: messages after ready go straight to their handlers (the per-frame path)."""
        self.connection.route_after_ready = self.forward

    def close_route(self, session: _Session) -> None:
        """Leaving ready: messages after ready are the machine's input again."""
        self.connection.route_after_ready = session.message_after_ready

    def forward(self, kind: str, envelope: pb.Envelope) -> None:
        handler = self.handlers.get(kind)
        if handler is None:
            self.log.info(
                "ignoring {message} from node {node_id}: not handled by this edge",
                message=kind,
                node_id=self.connection.node_id,
            )
            return
        handler(self.connection, envelope)

    def lost(self, reason: str) -> None:
        self.heartbeat.stop()
        self.registry.disconnected(self.connection, reason)


@dataclass
class _AwaitingRegister:
    """The awaiting-register state's data: its timer."""

    timer: IDelayedCall

    def cancel(self) -> None:
        if self.timer.active():
            self.timer.cancel()


def _make_session_machine() -> Callable[[_Core], _Session]:
    machine = TypeMachineBuilder(_Session, _Core)

    def start(session: _Session, core: _Core) -> _AwaitingRegister:
        core.heartbeat.start()
        return _AwaitingRegister(
            core.clock.callLater(core.register_timeout, session.register_expired)
        )

    idle = machine.state("idle")
    awaiting_register = machine.state("awaiting_register", start)
    registering = machine.state("registering")
    pending = machine.state("pending")
    readying = machine.state("readying")
    ready = machine.state("ready")
    closed = machine.state("closed")

    idle.upon(_Session.connection_made).to(awaiting_register).returns(None)
    registering.upon(_Session._accepted).to(pending).returns(None)

    @pep614(readying.upon(_Session._readied).to(ready))
    def readied(session: _Session, core: _Core) -> None:
        core.open_route()

    for transient in (registering, readying):
        transient.upon(_Session._refused).to(closed).returns(None)

    @pep614(awaiting_register.upon(_Session.register).to(registering))
    def first_register(
        session: _Session, core: _Core, wait: _AwaitingRegister, request: pb.RegisterRequest
    ) -> None:
        wait.cancel()
        core.register(session, request)

    @pep614(pending.upon(_Session.register).to(registering))
    @pep614(ready.upon(_Session.register).to(registering))
    def register_again(session: _Session, core: _Core, request: pb.RegisterRequest) -> None:
        # The registry refuses it ("already registered") and the connection closes.
        core.close_route(session)
        core.register(session, request)

    @pep614(awaiting_register.upon(_Session.ready).to(readying))
    def ready_unregistered(
        session: _Session, core: _Core, wait: _AwaitingRegister, request: pb.NodeReadyRequest
    ) -> None:
        # The registry refuses it ("has not registered") and the connection closes.
        wait.cancel()
        core.ready(session, request)

    @pep614(pending.upon(_Session.ready).to(readying))
    @pep614(ready.upon(_Session.ready).to(readying))
    def ask_ready(session: _Session, core: _Core, request: pb.NodeReadyRequest) -> None:
        core.close_route(session)
        core.ready(session, request)

    @pep614(ready.upon(_Session.message_after_ready).loop())
    def forward(session: _Session, core: _Core, kind: str, envelope: pb.Envelope) -> None:
        # Only until the route is open (entering ready opens it): then frames bypass the machine.
        core.forward(kind, envelope)

    @pep614(awaiting_register.upon(_Session.message_after_ready).to(closed))
    def early_message_awaiting(
        session: _Session, core: _Core, wait: _AwaitingRegister, kind: str, envelope: pb.Envelope
    ) -> None:
        wait.cancel()
        core.connection.drop_connection("message before ready", message=kind)

    @pep614(pending.upon(_Session.message_after_ready).to(closed))
    def early_message(session: _Session, core: _Core, kind: str, envelope: pb.Envelope) -> None:
        core.connection.drop_connection("message before ready", message=kind)

    @pep614(awaiting_register.upon(_Session.forbidden_message).to(closed))
    def forbidden_awaiting(
        session: _Session, core: _Core, wait: _AwaitingRegister, kind: str
    ) -> None:
        wait.cancel()
        core.connection.drop_connection("message a node may not send", message=kind)

    @pep614(pending.upon(_Session.forbidden_message).to(closed))
    @pep614(ready.upon(_Session.forbidden_message).to(closed))
    def forbidden(session: _Session, core: _Core, kind: str) -> None:
        core.close_route(session)
        core.connection.drop_connection("message a node may not send", message=kind)

    @pep614(awaiting_register.upon(_Session.register_expired).to(closed))
    def too_late(session: _Session, core: _Core, wait: _AwaitingRegister) -> None:
        core.connection.drop_connection("no registration in time", timeout=core.register_timeout)

    @pep614(awaiting_register.upon(_Session.heartbeat_expired).to(closed))
    def silent_awaiting(session: _Session, core: _Core, wait: _AwaitingRegister) -> None:
        wait.cancel()
        silent(session, core)

    @pep614(pending.upon(_Session.heartbeat_expired).to(closed))
    @pep614(ready.upon(_Session.heartbeat_expired).to(closed))
    @pep614(closed.upon(_Session.heartbeat_expired).loop())
    def silent(session: _Session, core: _Core) -> None:
        # Also once closing: a peer that never reads our close is aborted all the same.
        core.close_route(session)
        core.connection.drop_connection(
            "heartbeat timeout", node_id=core.connection.node_id, timeout=core.heartbeat_timeout
        )

    @pep614(idle.upon(_Session.connection_lost).to(closed))
    @pep614(registering.upon(_Session.connection_lost).to(closed))
    @pep614(pending.upon(_Session.connection_lost).to(closed))
    @pep614(readying.upon(_Session.connection_lost).to(closed))
    @pep614(ready.upon(_Session.connection_lost).to(closed))
    @pep614(closed.upon(_Session.connection_lost).loop())
    def lost(session: _Session, core: _Core, reason: str) -> None:
        core.close_route(session)
        core.lost(reason)

    @pep614(awaiting_register.upon(_Session.connection_lost).to(closed))
    def lost_awaiting(session: _Session, core: _Core, wait: _AwaitingRegister, reason: str) -> None:
        wait.cancel()
        core.lost(reason)

    # Once closing, what the node still says changes nothing.
    @pep614(closed.upon(_Session.register).loop())
    def ignore_register(session: _Session, core: _Core, request: pb.RegisterRequest) -> None:
        pass

    @pep614(closed.upon(_Session.ready).loop())
    def ignore_ready(session: _Session, core: _Core, request: pb.NodeReadyRequest) -> None:
        pass

    @pep614(closed.upon(_Session.message_after_ready).loop())
    def ignore_message(session: _Session, core: _Core, kind: str, envelope: pb.Envelope) -> None:
        pass

    @pep614(closed.upon(_Session.forbidden_message).loop())
    def ignore_forbidden(session: _Session, core: _Core, kind: str) -> None:
        pass

    for input in (_Session._accepted, _Session._readied, _Session._refused):
        closed.upon(input).loop().returns(None)

    return machine.build()


_SessionMachine = _make_session_machine()


# -- the protocol ------------------------------------------------------------------------------


@implementer(INodeConnection, IHandshakeListener)
class NodeConnection(EnvelopeProtocol):
    """One node socket: frames in, one machine input per envelope; frames out."""

    log = Logger()

    def __init__(self, factory: NodeConnectionFactory) -> None:
        super().__init__(factory.max_frame_bytes)
        self.factory = factory
        self.node_id: str | None = None
        heartbeat = Heartbeat(
            factory.clock,
            factory.heartbeat_interval,
            factory.heartbeat_timeout,
            self._send_heartbeat,
            lambda: self._session.heartbeat_expired(),
        )
        self._session = _SessionMachine(
            _Core(
                connection=self,
                registry=factory.registry,
                clock=factory.clock,
                heartbeat=heartbeat,
                handlers=factory.handlers,
                heartbeat_interval=factory.heartbeat_interval,
                heartbeat_timeout=factory.heartbeat_timeout,
                register_timeout=factory.register_timeout,
            )
        )
        self._heartbeat = heartbeat
        # Over TLS: whether the handshake completed (before, a loss may be a refusal).
        self._handshake_completed = False
        # Where a message only a ready node may send goes: the machine's input, until the
        # machine enters ready and routes such messages straight to their handlers.
        self.route_after_ready: Callable[[str, pb.Envelope], None] = (
            self._session.message_after_ready
        )

    # INodeConnection.send_envelope is EnvelopeProtocol's own.

    def peer_certificate(self) -> x509.Certificate | None:
        """The client certificate the node presented in the TLS handshake, if any."""
        certificate: x509.Certificate | None = self.factory.peer_certificate(self.transport)
        return certificate

    # -- lifecycle ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._session.connection_made()

    def handshakeCompleted(self) -> None:
        self._handshake_completed = True

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        super().connectionLost(reason)
        if not self._handshake_completed:
            # A TLS error here is the handshake refusing the peer (nothing else, over plaintext).
            self.factory.tls_refusals.connection_lost(self.transport, reason)
        self._session.connection_lost(self.close_reason or "connection closed")

    def close(self, reason: str) -> None:
        """Close after what was sent (a refusal the node should read), noting why."""
        self.close_reason = reason
        self.transport.loseConnection()  # type: ignore[union-attr]

    # -- inbound -----------------------------------------------------------------------------

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self._heartbeat.received()
        kind = envelope.WhichOneof("message")
        if kind == "heartbeat":
            return
        if kind == "register_request":
            self._session.register(envelope.register_request)
        elif kind == "node_ready_request":
            self._session.ready(envelope.node_ready_request)
        elif kind in _NODE_TO_EDGE_AFTER_READY:
            self.route_after_ready(kind, envelope)
        else:
            self._session.forbidden_message(str(kind))

    # -- outbound ----------------------------------------------------------------------------

    def _send_heartbeat(self, sequence: int) -> None:
        now_ms = int(self.factory.clock.seconds() * 1000)
        self.send_envelope(
            pb.Envelope(heartbeat=pb.Heartbeat(sequence=sequence, sent_unix_ms=now_ms))
        )


class NodeConnectionFactory(Factory):
    """Builds one :class:`NodeConnection` per node socket, sharing the registry."""

    protocol = NodeConnection  # type: ignore[assignment]
    # No "Starting factory <... at 0x...>" lines: the Edge's start banner names its listeners.
    noisy = False

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        heartbeat_interval: float = 2.0,
        heartbeat_timeout: float = 5.0,
        register_timeout: float = 10.0,
        max_frame_bytes: int = 16 * 1024 * 1024,
        peer_certificate: PeerCertificate = peer_certificate,
        tls_refusals: TLSRefusals | None = None,
    ) -> None:
        self.registry = registry
        # Handshakes the TLS listener in front of this factory refused (counted and logged).
        self.tls_refusals = tls_refusals if tls_refusals is not None else TLSRefusals(clock)
        self.peer_certificate = peer_certificate
        self.clock = clock
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.register_timeout = register_timeout
        self.max_frame_bytes = max_frame_bytes
        # Message kind -> handler(connection, envelope), for messages a ready node sends.
        self.handlers: dict[str, Handler] = {"node_draining": self._node_draining}

    def buildProtocol(self, addr: IAddress | None) -> NodeConnection:
        return NodeConnection(self)

    def _node_draining(self, connection: NodeConnection, envelope: pb.Envelope) -> None:
        """
        A ready node stops: the registry takes it out of placement, then the node is answered
        with ``NodeDraining`` — after every request dispatched to it before, so from the answer
        on it may refuse new work (see :mod:`iop.node.drain`).
        """
        if self.registry.draining(connection):
            connection.send_envelope(pb.Envelope(node_draining=pb.NodeDraining()))
