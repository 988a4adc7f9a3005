# -*- test-case-name: iop.test.edge.test_dispatch -*-
"""
Submitting normalized runs to nodes: the Edge's direct path.

``RunDispatcher.submit_run`` picks the node (explicit, or the single-node fallback when exactly
one node is dispatch-ready), sends a ``RunRequest`` on that node's ready connection and returns a
:class:`RunHandle`: the run's ordered events and a cancel handle. Every run ends with exactly one
terminal event on the Edge side, whatever happens: the node's terminal, a send failure, the node's
disconnect (fenced by the registry, in the authoritative path) or a cancel the node never
answered.

``resolve_model`` maps an external model id through ``openai.model_routes[]`` to adapter + target
(+ node). The provider pool adds ``models[]`` resolution later.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.config.model import EdgeConfig, ModelRoute
from iop.edge.registry import INodeLifecycleObserver, NodeRegistry
from iop.runtime.events import RuntimeEvent
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_from_proto

# How long a cancelled run waits for the node's own terminal before ending locally.
CANCEL_GRACE_SEC = 10.0


class DispatchError(Exception):
    """A run could not be submitted; the message says why (no secrets, safe for clients)."""


class NoRoute(DispatchError):
    """No route or node for the request."""


class NodeUnavailable(DispatchError):
    """The chosen node is not dispatch-ready."""


EventCallback = Callable[[RuntimeEvent], None]


@dataclass
class RunHandle:
    """One submitted run: its identity, ordered events and a cancel handle."""

    run_id: str
    node_id: str
    adapter: str
    target: str
    _dispatcher: RunDispatcher = field(repr=False)
    _subscribers: list[EventCallback] = field(default_factory=list, repr=False)
    _backlog: list[RuntimeEvent] = field(default_factory=list, repr=False)
    _done: list[Deferred[RuntimeEvent]] = field(default_factory=list, repr=False)
    terminal: RuntimeEvent | None = None
    last_sequence: int = 0
    cancel_requested: bool = False

    def subscribe(self, callback: EventCallback) -> None:
        """Receive every event in order, starting with those that already arrived."""
        for event in self._backlog:
            callback(event)
        self._subscribers.append(callback)

    def whenDone(self) -> Deferred[RuntimeEvent]:
        """A fresh Deferred firing with the terminal event."""
        if self.terminal is not None:
            return succeed(self.terminal)
        d: Deferred[RuntimeEvent] = Deferred()
        self._done.append(d)
        return d

    def cancel(self, reason: str = "cancelled by caller") -> None:
        """Ask the node to cancel; idempotent; the run ends ``cancelled`` either way."""
        self._dispatcher.cancel_run(self.run_id, reason)

    def _deliver(self, event: RuntimeEvent) -> None:
        if self.terminal is not None:
            return
        self._backlog.append(event)
        if event.terminal:
            self.terminal = event
        for callback in list(self._subscribers):
            callback(event)
        if event.terminal:
            done, self._done = self._done, []
            for d in done:
                d.callback(event)


@dataclass
class _ActiveRun:
    handle: RunHandle
    connection: object
    generation: int
    cancel_timer: IDelayedCall | None = None


@implementer(INodeLifecycleObserver)
class RunDispatcher:
    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        registry: NodeRegistry,
        clock: IReactorTime,
        send: Callable[[object, pb.Envelope], None],
        cancelGrace: float = CANCEL_GRACE_SEC,
    ) -> None:
        self._config = config
        self._registry = registry
        self._clock = clock
        self._send = send
        self._cancelGrace = cancelGrace
        self._runs: dict[str, _ActiveRun] = {}
        self._routes = {r.model: r for r in config.model_routes}
        registry.addObserver(self)

    # -- routing -----------------------------------------------------------------------------

    def resolve_model(self, model: str) -> ModelRoute:
        route = self._routes.get(model)
        if route is None:
            raise NoRoute(f"unknown model {model!r}")
        return route

    def choose_node(self, node_id: str | None) -> str:
        if node_id:
            if self._config.node(node_id) is None:
                raise NoRoute(f"unknown node {node_id!r}")
            if not self._registry.isReady(node_id):
                raise NodeUnavailable(f"node {node_id!r} is not connected")
            return node_id
        ready = [n.id for n in self._config.nodes if self._registry.isReady(n.id)]
        if len(ready) == 1:
            return ready[0]
        if not ready:
            raise NodeUnavailable("no node is connected")
        raise NoRoute(f"no node named and {len(ready)} nodes are connected; name one")

    # -- submit ------------------------------------------------------------------------------

    def submit_run(
        self,
        *,
        adapter: str,
        target: str,
        input: str,
        node_id: str | None = None,
        workspace: str = "",
        metadata: Mapping[str, str] | None = None,
        session_id: str = "",
        background: bool = False,
        timeout_sec: int = 0,
        max_tokens: int = 0,
        thinking_token_budget: int = 0,
        run_id: str | None = None,
    ) -> RunHandle:
        """Send a run to a ready node; raises :class:`DispatchError` when it cannot."""
        chosen = self.choose_node(node_id)
        connection = self._registry.readyConnection(chosen)
        ownership = self._registry.ownershipOf(connection)
        if connection is None or ownership is None:
            raise NodeUnavailable(f"node {chosen!r} is not connected")
        rid = run_id or f"run-{uuid.uuid4().hex}"
        if rid in self._runs:
            raise DispatchError(f"run {rid!r} is already active")
        handle = RunHandle(rid, chosen, adapter, target, self)
        self._runs[rid] = _ActiveRun(handle, connection, ownership.generation)
        request = pb.RunRequest(
            run_id=rid,
            adapter=adapter,
            target=target,
            workspace=workspace,
            input=input,
            session_id=session_id,
            background=background,
            timeout_sec=timeout_sec,
            max_tokens=max_tokens,
            thinking_token_budget=thinking_token_budget,
        )
        request.metadata.update(dict(metadata or {}))
        try:
            self._send(connection, pb.Envelope(run_request=request))
        except Exception as e:
            self.log.failure(
                "sending run {run_id} to node {node_id} failed", run_id=rid, node_id=chosen
            )
            self._finish(rid, RuntimeEvent.failed(f"could not send run to node {chosen}: {e}"))
            return handle
        self.log.info(
            "run {run_id} sent to node {node_id} ({adapter}/{target})",
            run_id=rid,
            node_id=chosen,
            adapter=adapter,
            target=target,
        )
        return handle

    def submit_model_run(self, model: str, input: str, **kwargs: object) -> RunHandle:
        """Resolve ``model`` through ``openai.model_routes`` and submit."""
        route = self.resolve_model(model)
        node = kwargs.pop("node_id", None) or route.node_id
        return self.submit_run(
            adapter=route.adapter,
            target=route.target,
            input=input,
            node_id=node,  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )

    # -- cancel ------------------------------------------------------------------------------

    def cancel_run(self, run_id: str, reason: str = "cancelled") -> bool:
        active = self._runs.get(run_id)
        if active is None or active.handle.cancel_requested:
            return False
        active.handle.cancel_requested = True
        try:
            self._send(
                active.connection,
                pb.Envelope(
                    cancel_request=pb.CancelRequest(
                        kind=pb.CANCEL_RUN, run_id=run_id, reason=reason
                    )
                ),
            )
        except Exception:
            self.log.failure("sending cancel for run {run_id} failed", run_id=run_id)
            self._finish(run_id, RuntimeEvent.cancelled(reason))
            return True
        active.cancel_timer = self._clock.callLater(
            self._cancelGrace, self._cancelExpired, run_id, reason
        )
        return True

    def _cancelExpired(self, run_id: str, reason: str) -> None:
        active = self._runs.get(run_id)
        if active is not None:
            active.cancel_timer = None
            self.log.warn(
                "node {node_id} did not confirm cancel of run {run_id}; ending it here",
                node_id=active.handle.node_id,
                run_id=run_id,
            )
            self._finish(run_id, RuntimeEvent.cancelled(reason))

    # -- inbound from nodes ------------------------------------------------------------------

    def runEvent(self, connection: object, message: pb.RunEvent) -> None:
        active = self._runs.get(message.run_id)
        if active is None or active.connection is not connection:
            self.log.debug("dropping event for unknown run {run_id}", run_id=message.run_id)
            return
        handle = active.handle
        if message.sequence <= handle.last_sequence:
            self.log.warn(
                "dropping out-of-order event {sequence} of run {run_id}",
                sequence=message.sequence,
                run_id=message.run_id,
            )
            return
        handle.last_sequence = message.sequence
        event = event_from_proto(message)
        if event.terminal:
            self._finish(message.run_id, event)
        else:
            handle._deliver(event)

    def nodeReady(self, node_id: str, generation: int) -> None:
        pass

    def nodeFenced(self, node_id: str, generation: int) -> None:
        """The node's ready generation is gone: its runs end with an error, now."""
        for run_id, active in list(self._runs.items()):
            if active.handle.node_id == node_id and active.generation == generation:
                if active.handle.cancel_requested:
                    self._finish(run_id, RuntimeEvent.cancelled("cancelled; node disconnected"))
                else:
                    self._finish(
                        run_id, RuntimeEvent.failed(f"node {node_id} disconnected during the run")
                    )

    # -- status ------------------------------------------------------------------------------

    def active(self) -> list[RunHandle]:
        return [a.handle for a in self._runs.values()]

    def get(self, run_id: str) -> RunHandle | None:
        active = self._runs.get(run_id)
        return active.handle if active else None

    def _finish(self, run_id: str, terminal: RuntimeEvent) -> None:
        active = self._runs.pop(run_id, None)
        if active is None:
            return
        if active.cancel_timer is not None and active.cancel_timer.active():
            active.cancel_timer.cancel()
        active.handle._deliver(terminal)
