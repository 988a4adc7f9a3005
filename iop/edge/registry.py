# -*- test-case-name: iop.test.edge.test_registry -*-
"""
Who owns which node id: the authoritative pending → ready → closed lifecycle and the connection
generation fence.

A connection that registers with a known token claims *pending* ownership of its node id and gets
the node's config payload. Only its ``NodeReadyRequest`` makes the node dispatch-ready; only the
current ready owner's disconnect fences the node. Callbacks from any other connection (stale,
superseded, rejected) change nothing. Generations are internal and never leave this module's
callers: they are never on the wire or in config.

Authoritative consumers (the provider pool, later) implement :class:`INodeLifecycleObserver` and
are called synchronously inside the transition; the event bus only hears about it afterwards.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import Interface

from iop.config.model import EdgeConfig, NodeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.wire.runtime_pb2 import NodeConfigPayload, RegisterRejectCode


class INodeLifecycleObserver(Interface):
    """Authoritative listeners of a node's dispatch-readiness (provider pool, queue)."""

    def nodeReady(node_id: str, generation: int) -> None:
        """``node_id``'s generation ``generation`` became dispatch-ready."""

    def nodeFenced(node_id: str, generation: int) -> None:
        """``node_id``'s ready generation ``generation`` is gone: return its resources."""


class OwnershipState(enum.Enum):
    PENDING = "pending"
    READY = "ready"


@dataclass
class Ownership:
    node_id: str
    connection: object
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


class NodeRegistry:
    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        buildPayload: PayloadBuilder,
        bus: EventBus,
        clock: IReactorTime,
        observers: Iterable[INodeLifecycleObserver] = (),
    ) -> None:
        self._config = config
        self._buildPayload = buildPayload
        self._bus = bus
        self._clock = clock
        self._observers = list(observers)
        self._owners: dict[str, Ownership] = {}
        self._byConnection: dict[int, Ownership] = {}
        self._generation = 0

    def addObserver(self, observer: INodeLifecycleObserver) -> None:
        self._observers.append(observer)

    # -- queries -----------------------------------------------------------------------------

    def isReady(self, node_id: str) -> bool:
        owner = self._owners.get(node_id)
        return owner is not None and owner.state is OwnershipState.READY

    def state(self, node_id: str) -> str:
        """``ready``, ``pending`` or ``disconnected``."""
        owner = self._owners.get(node_id)
        return owner.state.value if owner is not None else "disconnected"

    def readyConnection(self, node_id: str) -> object | None:
        """The dispatch-ready connection of ``node_id``, or None."""
        owner = self._owners.get(node_id)
        if owner is None or owner.state is not OwnershipState.READY:
            return None
        return owner.connection

    def ownershipOf(self, connection: object) -> Ownership | None:
        return self._byConnection.get(id(connection))

    # -- transitions -------------------------------------------------------------------------

    def register(self, token: str, connection: object) -> RegisterOutcome:
        """A connection presents a token: claim pending ownership or say why not."""
        if id(connection) in self._byConnection:
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_OTHER,
                "this connection has already registered",
                self._byConnection[id(connection)].node_id,
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
            payload = self._buildPayload(node)
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
        self._byConnection[id(connection)] = owner
        self.log.info("node {node_id} registered (pending)", node_id=node.id)
        self._publish(NodeEventKind.REGISTERED, node.id)
        return RegisterAccepted(node.id, payload)

    def ready(self, node_id: str, connection: object) -> ReadyOutcome:
        """A connection says it is ready to serve ``node_id``."""
        owner = self._owners.get(node_id)
        if owner is None or owner.connection is not connection:
            if id(connection) not in self._byConnection:
                reason = "connection has not registered"
            else:
                reason = f"stale connection: not the current owner of node {node_id}"
            self.log.warn(
                "rejected ready for node {node_id}: {reason}", node_id=node_id, reason=reason
            )
            return ReadyOutcome(False, reason)
        if owner.state is OwnershipState.READY:
            return ReadyOutcome(True)
        owner.state = OwnershipState.READY
        for observer in self._observers:
            observer.nodeReady(node_id, owner.generation)
        self.log.info("node {node_id} ready", node_id=node_id)
        self._publish(NodeEventKind.CONNECTED, node_id)
        return ReadyOutcome(True)

    def disconnected(self, connection: object, reason: str = "connection closed") -> None:
        """A connection is gone. Only the current owner's loss changes anything."""
        owner = self._byConnection.pop(id(connection), None)
        if owner is None:
            return
        if self._owners.get(owner.node_id) is not owner:
            return
        del self._owners[owner.node_id]
        if owner.state is OwnershipState.READY:
            for observer in self._observers:
                observer.nodeFenced(owner.node_id, owner.generation)
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
    "INodeLifecycleObserver",
    "NodeRegistry",
    "Ownership",
    "OwnershipState",
    "ReadyOutcome",
    "RegisterAccepted",
    "RegisterOutcome",
    "RegisterRejected",
]
