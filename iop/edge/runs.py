# -*- test-case-name: iop.test.edge.test_runs -*-
"""
Submitting normalized runs to nodes: the Edge's direct path.

``RunDispatcher.submit_run`` picks the node (explicit, or the single-node fallback when exactly
one node is dispatch-ready), sends a ``RunRequest`` on that node's ready connection and returns a
:class:`RunHandle`: the run's ordered events and a cancel handle. Every run ends with exactly one
terminal event on the Edge side, whatever happens: the node's terminal, a send failure, the node's
disconnect (fenced by the registry, in the authoritative path) or a cancel the node never
answered.

Node choice and ``openai.model_routes[]`` resolution are :class:`~iop.edge.routes.RouteResolver`'s
(``RunDispatcher.routes``); the in-flight bookkeeping (connection, generation, sequence fence,
cancel grace, the sweep on a fence) is :class:`~iop.edge.inflight.InFlightTable`'s, shared with
the tunnels.

Managed mode: a run on an adapter reached only through leased tunnels (``openai_compat``,
``vllm``: :meth:`~iop.edge.routes.RouteResolver.leased_only`) is refused with
:class:`~iop.edge.errors.LeaseRequired` before anything is sent. This is the one path every
normalized run takes (the admin API's ``POST /runs``, model routes, pooled placements, the client
surfaces' run placements), so no path sends such a provider a request without a lease.

Each end is counted once per node by kind (:data:`RUN_TERMINALS`, :meth:`RunDispatcher.stats`):
the node's terminal (``complete``, ``cancelled``, ``error``, ``at_capacity`` when the node's own
gate refused the run, or ``timeout`` when the node timed it out), ``cancelled`` for a cancel the
node never answered or that a fence overtook, ``node_lost`` (the node's generation was fenced)
and ``send_failed``. A sent run is not logged (the access log has the request); a failure to
send is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.config.model import EdgeConfig
from iop.edge.errors import LeaseRequired, NodeUnavailable
from iop.edge.inflight import InFlightTable, TerminalCounts
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver, Send, send_envelope
from iop.edge.registry import NodeRegistry
from iop.edge.routes import RouteResolver
from iop.runtime.codes import ErrorCode, error_code
from iop.runtime.events import EventType, RuntimeEvent
from iop.runtime.requestid import carried
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_from_proto

# How long a cancelled run waits for the node's own terminal before ending locally.
CANCEL_GRACE_SEC = 10.0

EventCallback = Callable[[RuntimeEvent], None]
RUN_TERMINALS = (
    "complete",
    "error",
    "at_capacity",
    "timeout",
    "cancelled",
    "node_lost",
    "send_failed",
)


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
    cancel_requested: bool = False
    # The client request's id this run serves (from its metadata; "" when none).
    request_id: str = ""

    def subscribe(self, callback: EventCallback) -> None:
        """Receive every event in order, starting with those that already arrived."""
        for event in self._backlog:
            callback(event)
        self._subscribers.append(callback)

    def when_done(self) -> Deferred[RuntimeEvent]:
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


@implementer(INodeLifecycleObserver)
class RunDispatcher:
    """
    Sends runs to ready nodes and relays their events.

    :param send: ``send(connection, envelope)``; by default the connection's ``send_envelope``.
    :param cancel_grace: seconds a cancelled run waits for the node's terminal.
    """

    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        registry: NodeRegistry,
        clock: IReactorTime,
        send: Send = send_envelope,
        cancel_grace: float = CANCEL_GRACE_SEC,
    ) -> None:
        self._registry = registry
        self._send = send
        self._runs: InFlightTable[RunHandle] = InFlightTable(clock, cancel_grace, "run", "event")
        self._terminals = TerminalCounts(RUN_TERMINALS)
        self.routes = RouteResolver(config, registry)
        registry.add_observer(self)

    # -- routing -----------------------------------------------------------------------------

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
        collect: bool = False,
    ) -> RunHandle:
        """
        Send a run to a ready node; raises :class:`DispatchError` when it cannot, and
        :class:`LeaseRequired` (managed mode) for an adapter only a leased tunnel may reach.
        """
        chosen = self.routes.choose_node(node_id)
        leased = self.routes.leased_only(chosen, adapter)
        if leased is not None:
            raise LeaseRequired(
                f"managed mode: adapter {leased.name!r} ({leased.type}) on node {chosen!r} is"
                " reached only through a provider tunnel carrying a credential lease; a"
                " normalized run carries none and is not sent (use the client API:"
                " /v1/chat/completions, /v1/responses or /v1/messages)"
            )
        connection = self._registry.ready_connection(chosen)
        ownership = self._registry.ownership_of(connection) if connection is not None else None
        if connection is None or ownership is None:
            raise NodeUnavailable(f"node {chosen!r} is not connected")
        rid = run_id or f"run-{uuid.uuid4().hex}"
        # Built before anything is registered: a value the wire cannot carry (an int out of
        # range) raises here and leaves no run behind.
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
            collect=collect,
        )
        request.metadata.update(dict(metadata or {}))
        handle = RunHandle(rid, chosen, adapter, target, self, request_id=carried(request.metadata))
        self._runs.add(rid, handle, chosen, connection, ownership.generation)
        try:
            self._send(connection, pb.Envelope(run_request=request))
        except Exception as e:
            self.log.failure(
                "sending run {run_id} to node {node_id} failed", run_id=rid, node_id=chosen
            )
            self._finish(
                rid,
                RuntimeEvent.failed(f"could not send run to node {chosen}: {e}"),
                "send_failed",
            )
        return handle

    def submit_model_run(self, model: str, input: str, **kwargs: object) -> RunHandle:
        """Resolve ``model`` through ``openai.model_routes`` and submit."""
        route = self.routes.resolve_model(model)
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
        if active is None or active.item.cancel_requested:
            return False
        active.item.cancel_requested = True
        self._runs.request_cancel(
            run_id,
            reason,
            self._send,
            lambda _: self._finish(run_id, RuntimeEvent.cancelled(reason)),
        )
        return True

    # -- inbound from nodes ------------------------------------------------------------------

    def run_event(self, connection: INodeConnection, message: pb.RunEvent) -> None:
        active = self._runs.accept(connection, message.run_id, message.sequence)
        if active is None:
            return
        event = event_from_proto(message)
        if event.terminal:
            self._finish(message.run_id, event)
        else:
            active.item._deliver(event)

    def node_ready(self, node_id: str, generation: int) -> None:
        pass

    def node_fenced(self, node_id: str, generation: int) -> None:
        """The node's ready generation is gone: its runs end with an error, now."""
        for active in self._runs.of_generation(node_id, generation):
            if active.item.cancel_requested:
                self._finish(active.key, RuntimeEvent.cancelled("cancelled; node disconnected"))
            else:
                self._finish(
                    active.key,
                    RuntimeEvent.failed(f"node {node_id} disconnected during the run"),
                    "node_lost",
                )

    # -- status ------------------------------------------------------------------------------

    def stats(self) -> dict[tuple[str, str], int]:
        """Run ends per ``(node_id, kind)``: every configured node, every kind."""
        return self._terminals.snapshot(n.id for n in self._registry.config.nodes)

    def active(self) -> list[RunHandle]:
        return [a.item for a in self._runs]

    def get(self, run_id: str) -> RunHandle | None:
        active = self._runs.get(run_id)
        return active.item if active else None

    def _finish(self, run_id: str, terminal: RuntimeEvent, kind: str | None = None) -> None:
        active = self._runs.pop(run_id)
        if active is not None:
            self._terminals.count(active.node_id, kind or _terminal_kind(terminal))
            active.item._deliver(terminal)


def _terminal_kind(terminal: RuntimeEvent) -> str:
    if terminal.type is EventType.COMPLETE:
        return "complete"
    if terminal.type is EventType.CANCELLED:
        return "cancelled"
    code = error_code(terminal.metadata)
    if code is ErrorCode.PROVIDER_AT_CAPACITY:
        return "at_capacity"
    if code is ErrorCode.UPSTREAM_TIMEOUT:
        return "timeout"
    return "error"


__all__ = [
    "CANCEL_GRACE_SEC",
    "RUN_TERMINALS",
    "RunDispatcher",
    "RunHandle",
]
