# -*- test-case-name: iop.test.edge.refresh.test_push -*-
"""
The node half of a config refresh: push the new ``NodeConfigPayload`` to the ready nodes whose
payload changed (``NodeConfigRefreshRequest``) and collect their answers
(``NodeConfigRefreshResponse``: applied, restart required, failed), each bounded by a timeout.

- Only a *ready* node is a recipient. A node still pending when a refresh is pushed registered
  with the payload of the config before it: it is pushed the current payload once it is ready
  (an unchanged payload costs the node nothing: it answers ``applied``, no change). A node not
  connected gets the current payload when it registers.
- Every push ends in exactly one :class:`~iop.edge.refresh.report.NodePush`: the node's answer,
  ``timeout`` when it does not answer in time, ``failed`` when its connection is fenced first or
  the request cannot be sent.
- Each outcome is logged and published on the event bus
  (:attr:`~iop.edge.events.NodeEventKind.CONFIG_REFRESHED`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver, Send, send_envelope
from iop.edge.refresh.report import NodePush, PushOutcome
from iop.edge.registry import NodeRegistry
from iop.wire import runtime_pb2 as pb

__all__ = ["PUSH_TIMEOUT_SEC", "NodePusher"]

#: How long a node has to answer a refresh push.
PUSH_TIMEOUT_SEC = 10.0

# The current payload of a node id (its config revision set); KeyError for an unknown node.
PayloadFor = Callable[[str], pb.NodeConfigPayload]

_OUTCOMES: dict[int, PushOutcome] = {
    pb.REFRESH_APPLIED: "applied",
    pb.REFRESH_RESTART_REQUIRED: "restart_required",
    pb.REFRESH_FAILED: "failed",
}


@dataclass
class _Pending:
    node_id: str
    generation: int
    connection: INodeConnection
    payload: pb.NodeConfigPayload
    deferred: Deferred[NodePush]
    timer: IDelayedCall | None = None


@implementer(INodeLifecycleObserver)
class NodePusher:
    """
    Pushes refreshed payloads to ready nodes and waits for their answers.

    :param payload_for: the node's current payload (the running config, its revision set).
    :param node_ids: every node id of the running config.
    :param timeout: seconds each node has to answer.
    """

    log = Logger()

    def __init__(
        self,
        registry: NodeRegistry,
        payload_for: PayloadFor,
        bus: EventBus,
        clock: IReactorTime,
        node_ids: Callable[[], Iterable[str]] = tuple,
        send: Send = send_envelope,
        timeout: float = PUSH_TIMEOUT_SEC,
    ) -> None:
        self._registry = registry
        self._payload_for = payload_for
        self._bus = bus
        self._clock = clock
        self._send = send
        self._timeout = timeout
        self._node_ids = node_ids
        self._pending: dict[str, _Pending] = {}
        # Nodes pending when a refresh was pushed: pushed the current payload once ready.
        self._stale: set[str] = set()
        registry.add_observer(self)

    # -- pushing -------------------------------------------------------------------------------

    def push(self, node_ids: Iterable[str]) -> Deferred[list[NodePush]]:
        """
        Push the current payload to each of ``node_ids`` that is ready now (the others are
        skipped: see the module docstring); fires with one outcome per node pushed, in order.
        """
        for node_id in self._node_ids():
            if self._registry.state(node_id) == "pending":
                self._stale.add(node_id)
        pushes: list[Deferred[NodePush]] = []
        for node_id in dict.fromkeys(node_ids):
            d = self._push_one(node_id)
            if d is not None:
                pushes.append(d)
        return gatherResults(pushes)

    def _push_one(self, node_id: str) -> Deferred[NodePush] | None:
        connection = self._registry.ready_connection(node_id)
        ownership = self._registry.ownership_of(connection) if connection is not None else None
        if connection is None or ownership is None:
            self.log.info(
                "config refresh: node {node_id} is not ready; it gets the new config when it is",
                node_id=node_id,
            )
            return None
        try:
            payload = self._payload_for(node_id)
        except Exception as e:
            return self._now(node_id, "failed", f"could not build its payload: {type(e).__name__}")
        request_id = f"refresh-{uuid.uuid4().hex}"
        d: Deferred[NodePush] = Deferred()
        pending = _Pending(node_id, ownership.generation, connection, payload, d)
        self._pending[request_id] = pending
        request = pb.NodeConfigRefreshRequest(request_id=request_id, config=payload)
        try:
            self._send(connection, pb.Envelope(node_config_refresh_request=request))
        except Exception as e:
            self._pending.pop(request_id, None)
            return self._now(node_id, "failed", f"could not send the push: {type(e).__name__}")
        if request_id in self._pending:
            pending.timer = self._clock.callLater(self._timeout, self._expired, request_id)
        return d

    def _now(self, node_id: str, outcome: PushOutcome, reason: str) -> Deferred[NodePush]:
        d: Deferred[NodePush] = Deferred()
        d.callback(self._outcome(node_id, outcome, reason))
        return d

    # -- answers -------------------------------------------------------------------------------

    def response_received(
        self, connection: INodeConnection, response: pb.NodeConfigRefreshResponse
    ) -> None:
        """A ``NodeConfigRefreshResponse`` from a ready node's connection."""
        pending = self._pending.get(response.request_id)
        if pending is None or pending.connection is not connection:
            self.log.debug(
                "dropping a config refresh answer nobody waits for ({request_id})",
                request_id=response.request_id,
            )
            return
        outcome = _OUTCOMES.get(response.outcome)
        reason = response.reason
        if outcome is None:
            outcome, reason = "failed", reason or "the node gave no outcome"
        self._settle(response.request_id, outcome, reason)

    def _expired(self, request_id: str) -> None:
        pending = self._pending.get(request_id)
        if pending is not None:
            pending.timer = None
            self._settle(request_id, "timeout", f"no answer within {self._timeout:g} s")

    def _settle(self, request_id: str, outcome: PushOutcome, reason: str) -> None:
        pending = self._pending.pop(request_id)
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()
        pending.deferred.callback(self._outcome(pending.node_id, outcome, reason))

    def _outcome(self, node_id: str, outcome: PushOutcome, reason: str) -> NodePush:
        self.log.info(
            "config refresh pushed to node {node_id}: {outcome}{why}",
            node_id=node_id,
            outcome=outcome,
            why=f" ({reason})" if reason else "",
        )
        self._bus.publish(
            NodeEvent(
                NodeEventKind.CONFIG_REFRESHED,
                node_id,
                reason,
                self._clock.seconds(),
                outcome=outcome,
            )
        )
        return NodePush(node_id, outcome, reason)

    # -- INodeLifecycleObserver ----------------------------------------------------------------

    def node_ready(self, node_id: str, generation: int) -> None:
        """A node that was pending when a refresh was pushed is pushed the current payload."""
        if node_id not in self._stale:
            return
        self._stale.discard(node_id)
        self.log.info(
            "node {node_id} registered before the last config refresh; pushing it",
            node_id=node_id,
        )
        d = self._push_one(node_id)
        if d is not None:
            d.addErrback(lambda f: self.log.failure("catch-up push failed", f))

    def node_fenced(self, node_id: str, generation: int) -> None:
        for request_id, pending in list(self._pending.items()):
            if pending.node_id == node_id and pending.generation == generation:
                self._settle(
                    request_id,
                    "failed",
                    "the node disconnected before answering (it gets the new config when it "
                    "registers again)",
                )
