# -*- test-case-name: iop.test.edge.test_transport -*-
"""
The Edge end of a node socket: framing, heartbeat and the register/ready handshake, forwarded
to the :class:`~iop.edge.registry.NodeRegistry`, which decides.

Per connection: a node must register within ``register_timeout`` seconds; the heartbeat runs from
the first byte; a message only a node may send is accepted, anything else closes the connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.edge.registry import NodeRegistry, RegisterAccepted
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
    }
)


class NodeConnection(EnvelopeProtocol):
    log = Logger()

    def __init__(self, factory: NodeConnectionFactory) -> None:
        super().__init__(factory.maxFrameBytes)
        self.factory = factory
        self.nodeId: str | None = None
        self.isReady = False
        self._registerTimer: IDelayedCall | None = None
        self._heartbeat = Heartbeat(
            factory.clock,
            factory.heartbeatInterval,
            factory.heartbeatTimeout,
            self._sendHeartbeat,
            self._heartbeatExpired,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._heartbeat.start()
        self._registerTimer = self.factory.clock.callLater(
            self.factory.registerTimeout, self._registerExpired
        )

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        super().connectionLost(reason)
        self._heartbeat.stop()
        if self._registerTimer is not None and self._registerTimer.active():
            self._registerTimer.cancel()
        self.factory.registry.disconnected(self, self.closeReason or "connection closed")

    # -- inbound -----------------------------------------------------------------------------

    def envelopeReceived(self, envelope: pb.Envelope) -> None:
        self._heartbeat.received()
        kind = envelope.WhichOneof("message")
        if kind == "heartbeat":
            return
        if kind == "register_request":
            self._register(envelope.register_request)
        elif kind == "node_ready_request":
            self._ready(envelope.node_ready_request)
        elif kind in _NODE_TO_EDGE_AFTER_READY:
            if not self.isReady:
                self.dropConnection("message before ready", message=kind)
                return
            handler = self.factory.handlers.get(kind)
            if handler is None:
                self.log.info(
                    "ignoring {message} from node {node_id}: not handled by this edge",
                    message=kind,
                    node_id=self.nodeId,
                )
                return
            handler(self, envelope)
        else:
            self.dropConnection("message a node may not send", message=kind)

    def _register(self, request: pb.RegisterRequest) -> None:
        outcome = self.factory.registry.register(request.token, self)
        response = pb.RegisterResponse(
            heartbeat_interval_ms=int(self.factory.heartbeatInterval * 1000),
            heartbeat_timeout_ms=int(self.factory.heartbeatTimeout * 1000),
        )
        if isinstance(outcome, RegisterAccepted):
            if self._registerTimer is not None and self._registerTimer.active():
                self._registerTimer.cancel()
            self.nodeId = outcome.node_id
            response.accepted = True
            response.node_id = outcome.node_id
            response.config.CopyFrom(outcome.payload)
            self.sendEnvelope(pb.Envelope(register_response=response))
        else:
            response.accepted = False
            response.node_id = outcome.node_id
            response.reason = outcome.reason
            response.reject_code = outcome.code  # type: ignore[assignment]
            self.sendEnvelope(pb.Envelope(register_response=response))
            self.closeReason = f"registration rejected: {outcome.reason}"
            self.transport.loseConnection()  # type: ignore[union-attr]

    def _ready(self, request: pb.NodeReadyRequest) -> None:
        outcome = self.factory.registry.ready(request.node_id, self)
        self.sendEnvelope(
            pb.Envelope(
                node_ready_response=pb.NodeReadyResponse(
                    ready=outcome.ready, node_id=request.node_id, reason=outcome.reason
                )
            )
        )
        if outcome.ready:
            self.isReady = True
        else:
            self.closeReason = f"ready rejected: {outcome.reason}"
            self.transport.loseConnection()  # type: ignore[union-attr]

    # -- timers ------------------------------------------------------------------------------

    def _sendHeartbeat(self, sequence: int) -> None:
        self.sendEnvelope(
            pb.Envelope(
                heartbeat=pb.Heartbeat(sequence=sequence, sent_unix_ms=int(time.time() * 1000))
            )
        )

    def _heartbeatExpired(self) -> None:
        self.dropConnection(
            "heartbeat timeout", node_id=self.nodeId, timeout=self.factory.heartbeatTimeout
        )

    def _registerExpired(self) -> None:
        self.dropConnection("no registration in time", timeout=self.factory.registerTimeout)


class NodeConnectionFactory(Factory):
    """Builds one :class:`NodeConnection` per node socket, sharing the registry."""

    protocol = NodeConnection  # type: ignore[assignment]

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        heartbeatInterval: float = 2.0,
        heartbeatTimeout: float = 5.0,
        registerTimeout: float = 10.0,
        maxFrameBytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.heartbeatInterval = heartbeatInterval
        self.heartbeatTimeout = heartbeatTimeout
        self.registerTimeout = registerTimeout
        self.maxFrameBytes = maxFrameBytes
        # Message kind -> handler(connection, envelope), for messages a ready node sends.
        self.handlers: dict[str, Callable[[NodeConnection, pb.Envelope], None]] = {}

    def buildProtocol(self, addr: IAddress | None) -> NodeConnection:
        p = NodeConnection(self)
        return p
