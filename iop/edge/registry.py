# -*- test-case-name: iop.test.edge.test_registry -*-
"""
Who owns which node id: the authoritative pending → ready → closed lifecycle and the connection
generation fence.

A connection that registers with a known token claims *pending* ownership of its node id and gets
the node's config payload. Only its ``NodeReadyRequest`` makes the node dispatch-ready; only the
current ready owner's disconnect fences the node. Callbacks from any other connection (stale,
superseded, rejected) change nothing. Generations are internal and never leave this module's
callers: they are never on the wire or in config.

Authoritative consumers (the provider pool, the dispatchers, the commander) implement
:class:`~iop.edge.interfaces.INodeLifecycleObserver` and are called synchronously inside the
transition; the event bus only hears about it afterwards.

Ready is ordered here, in :meth:`NodeRegistry.ready` alone: decide, *acknowledge* (the transport
writes ``NodeReadyResponse``), and only then mark the node ready and tell the observers, whose
reaction (the pool pumping its queue) may dispatch to the node at once. So the node always reads
its ready acknowledgement before any request of that generation.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from iop.config.model import EdgeConfig, NodeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver
from iop.wire.runtime_pb2 import NodeConfigPayload, RegisterRejectCode


class OwnershipState(enum.Enum):
    PENDING = "pending"
    READY = "ready"


@dataclass
class Ownership:
    node_id: str
    connection: INodeConnection
    generation: int
    state: OwnershipState


@dataclass(frozen=True)
class RegisterAccepted:
    node_id: str
    payload: NodeConfigPayload


@dataclass(frozen=True)
class RegisterRejected:
    code: int
    reason: str
    node_id: str = ""


RegisterOutcome = RegisterAccepted | RegisterRejected


@dataclass(frozen=True)
class ReadyOutcome:
    ready: bool
    reason: str = ""


PayloadBuilder = Callable[[NodeConfig], NodeConfigPayload]
# Writes the node's NodeReadyResponse for an outcome; called before any observer hears of ready.
Acknowledge = Callable[[ReadyOutcome], None]


def _no_acknowledgement(outcome: ReadyOutcome) -> None:
    """For callers with no wire to answer on (unit tests driving the registry directly)."""


class NodeRegistry:
    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        build_payload: PayloadBuilder,
        bus: EventBus,
        clock: IReactorTime,
        observers: Iterable[INodeLifecycleObserver] = (),
    ) -> None:
        self._config = config
        self._build_payload = build_payload
        self._bus = bus
        self._clock = clock
        self._observers = list(observers)
        self._owners: dict[str, Ownership] = {}
        self._by_connection: dict[int, Ownership] = {}
        self._generation = 0

    def add_observer(self, observer: INodeLifecycleObserver) -> None:
        self._observers.append(observer)

    # -- queries -----------------------------------------------------------------------------

    def is_ready(self, node_id: str) -> bool:
        owner = self._owners.get(node_id)
        return owner is not None and owner.state is OwnershipState.READY

    def state(self, node_id: str) -> str:
        """``ready``, ``pending`` or ``disconnected``."""
        owner = self._owners.get(node_id)
        return owner.state.value if owner is not None else "disconnected"

    def ready_connection(self, node_id: str) -> INodeConnection | None:
        """The dispatch-ready connection of ``node_id``, or None."""
        owner = self._owners.get(node_id)
        if owner is None or owner.state is not OwnershipState.READY:
            return None
        return owner.connection

    def ownership_of(self, connection: INodeConnection) -> Ownership | None:
        return self._by_connection.get(id(connection))

    # -- transitions -------------------------------------------------------------------------

    def register(self, token: str, connection: INodeConnection) -> RegisterOutcome:
        """A connection presents a token: claim pending ownership or say why not."""
        if id(connection) in self._by_connection:
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_OTHER,
                "this connection has already registered",
                self._by_connection[id(connection)].node_id,
            )
        node = self._lookup(token)
        if node is None:
            return self._reject(RegisterRejectCode.REGISTER_REJECT_UNKNOWN_TOKEN, "unknown token")
        if node.id in self._owners:
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_DUPLICATE_CONNECTION,
                f"node {node.id} already has a live connection",
                node.id,
            )
        try:
            payload = self._build_payload(node)
        except Exception as e:
            self.log.failure("could not build config payload for node {node_id}", node_id=node.id)
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_CONFIG_PAYLOAD,
                f"edge could not build config payload: {type(e).__name__}",
                node.id,
            )
        self._generation += 1
        owner = Ownership(node.id, connection, self._generation, OwnershipState.PENDING)
        self._owners[node.id] = owner
        self._by_connection[id(connection)] = owner
        self.log.info("node {node_id} registered (pending)", node_id=node.id)
        self._publish(NodeEventKind.REGISTERED, node.id)
        return RegisterAccepted(node.id, payload)

    def ready(
        self,
        node_id: str,
        connection: INodeConnection,
        acknowledge: Acknowledge = _no_acknowledgement,
    ) -> ReadyOutcome:
        """
        A connection says it is ready to serve ``node_id``. The one place that orders ready:
        the outcome is decided, ``acknowledge(outcome)`` answers the node, and only then (if it
        is ready and still the owner) do the observers hear of it. An ``acknowledge`` that raises
        leaves the node pending.
        """
        owner = self._owners.get(node_id)
        if owner is None or owner.connection is not connection:
            if id(connection) not in self._by_connection:
                reason = "connection has not registered"
            else:
                reason = f"stale connection: not the current owner of node {node_id}"
            self.log.warn(
                "rejected ready for node {node_id}: {reason}", node_id=node_id, reason=reason
            )
            outcome = ReadyOutcome(False, reason)
            acknowledge(outcome)
            return outcome
        outcome = ReadyOutcome(True)
        acknowledge(outcome)
        if owner.state is OwnershipState.READY:
            return outcome
        if self._owners.get(node_id) is not owner:
            # The acknowledgement lost the connection on the spot: nothing became ready.
            return ReadyOutcome(False, "connection closed while acknowledging ready")
        owner.state = OwnershipState.READY
        for observer in self._observers:
            observer.node_ready(node_id, owner.generation)
        self.log.info("node {node_id} ready", node_id=node_id)
        self._publish(NodeEventKind.CONNECTED, node_id)
        return outcome

    def disconnected(self, connection: INodeConnection, reason: str = "connection closed") -> None:
        """A connection is gone. Only the current owner's loss changes anything."""
        owner = self._by_connection.pop(id(connection), None)
        if owner is None:
            return
        if self._owners.get(owner.node_id) is not owner:
            return
        del self._owners[owner.node_id]
        if owner.state is OwnershipState.READY:
            for observer in self._observers:
                observer.node_fenced(owner.node_id, owner.generation)
            self.log.info(
                "node {node_id} disconnected: {reason}", node_id=owner.node_id, reason=reason
            )
            self._publish(NodeEventKind.DISCONNECTED, owner.node_id, reason)
        else:
            self.log.info(
                "pending node {node_id} went away before ready: {reason}",
                node_id=owner.node_id,
                reason=reason,
            )

    # -- helpers -----------------------------------------------------------------------------

    def _lookup(self, token: str) -> NodeConfig | None:
        """Constant-time over all nodes: every digest is compared, whatever matches."""
        digest = hashlib.sha256(token.encode()).digest()
        found: NodeConfig | None = None
        for node in self._config.nodes:
            if hmac.compare_digest(node.token.sha256, digest) and found is None:
                found = node
        return found

    def _reject(self, code: int, reason: str, node_id: str = "") -> RegisterRejected:
        self.log.warn(
            "rejected node registration: {reason}", reason=reason, node_id=node_id or None
        )
        self._publish(NodeEventKind.REJECTED, node_id, reason)
        return RegisterRejected(code, reason, node_id)

    def _publish(self, kind: NodeEventKind, node_id: str, reason: str = "") -> None:
        self._bus.publish(NodeEvent(kind, node_id, reason, self._clock.seconds()))


__all__ = [
    "Acknowledge",
    "INodeLifecycleObserver",
    "NodeRegistry",
    "Ownership",
    "OwnershipState",
    "ReadyOutcome",
    "RegisterAccepted",
    "RegisterOutcome",
    "RegisterRejected",
]
