# -*- test-case-name: iop.test.node.test_runs -*-
"""
The Node's run manager: admission, execution, relay, cancel, timeout and terminal synthesis for
the normalized ``RunRequest`` path of one Edge session.

Every run goes through the same small life::

    RunRequest ─▶ resolve adapter ─▶ gate.try_acquire() ─▶ provider.execute(spec, emit)
                      │                     │                       │
                      └─ unknown/disabled ──┴─ at capacity ─────────┴──▶ one ``error`` event
                                                                         (nothing queued)

    running ─┬─ adapter terminal ───────────────────────┐
             ├─ Deferred succeeded (no terminal) ──▶ complete
             ├─ Deferred failed ─────────────────────▶ error (the failure's message)
             ├─ CANCEL_RUN ──────────────────────────▶ cancelled   (provider Deferred cancelled)
             ├─ timeout_sec elapsed ─────────────────▶ error "timed out after N s" (cancelled)
             └─ edge connection lost ────────────────▶ cancelled, recorded only (cannot be sent)
                                                       │
                                          finished: slot released, store updated, exactly once

Guarantees on the wire, per run id: events carry sequence 1, 2, 3…; the first is ``start``
(synthesized when the adapter's first event is something else); exactly one terminal
(``complete``, ``error`` or ``cancelled``), after which nothing more is sent. The capacity slot is
released before the terminal goes out, so an Edge that dispatches the next run on seeing the
terminal finds the slot free.

A request refused before execution (no run id, duplicate run id, unknown or disabled adapter, at
capacity) gets a single ``error`` event with sequence 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.capacity import Slot
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry, UnknownAdapter
from iop.node.store import RunStatus, RunStore
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.interfaces import ExecutionSpec, IProvider, ISessionTerminator
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto

CONNECTION_LOST_REASON = "edge connection lost"
CANCELLED_BY_EDGE = "cancelled by edge"
# Bound on an adapter's terminate_session, in seconds.
TERMINATE_SESSION_TIMEOUT = 30.0

_STATUS_OF = {
    EventType.COMPLETE: RunStatus.COMPLETED,
    EventType.ERROR: RunStatus.ERROR,
    EventType.CANCELLED: RunStatus.CANCELLED,
}


def _failureMessage(failure: Failure) -> str:
    message = failure.getErrorMessage()
    if not message or message == "None":
        return failure.type.__name__ if failure.type is not None else "unknown failure"
    return message


def _seconds(value: float) -> str:
    return f"{value:g}"


@dataclass(eq=False)
class _Run:
    """One admitted run. ``finished`` flips exactly once, in :meth:`RunManager._finish`."""

    run_id: str
    instance: AdapterInstance
    provider: IProvider
    target: str
    session_id: str
    background: bool
    slot: Slot
    started_at: float
    timeout_sec: float = 0.0
    sequence: int = 0
    started: bool = False
    finished: bool = False
    # Why it finished: "terminal" (the adapter's own), or "ended" (the manager decided).
    endedBy: str = ""
    deferred: Deferred[None] | None = None
    # A cancel that arrived while execute() had not returned yet.
    cancelPending: bool = False
    timer: IDelayedCall | None = field(default=None, repr=False)
    usage: Usage | None = None

    @property
    def adapter(self) -> str:
        return self.instance.name


@dataclass
class _Totals:
    completed: int = 0
    error: int = 0
    cancelled: int = 0
    rejected: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0

    def add(self, usage: Usage | None) -> None:
        if usage is None:
            return
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_tokens or 0
        self.cached_input_tokens += usage.cached_input_tokens or 0


class RunManager:
    """
    Runs the Edge's ``RunRequest``s of one session on the adapters of ``registry``.

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge (a no-op once the session closed).
    :param store: the local run store; its failures are logged there and never break a run.
    :param clock: time for run timeouts and event timestamps.
    :param nodeId: for logs.
    """

    log = Logger()

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        store: RunStore,
        clock: IReactorTime,
        nodeId: str = "",
    ) -> None:
        self._registry = registry
        self._send = send
        self._store = store
        self._clock = clock
        self._nodeId = nodeId
        self._active: dict[str, _Run] = {}
        self._totals = _Totals()
        self._closed = False

    # -- envelope handlers (install these on the session) -------------------------------------

    def runRequestReceived(self, envelope: pb.Envelope) -> None:
        """The ``run_request`` handler."""
        self.submit(envelope.run_request)

    def cancelRequestReceived(self, envelope: pb.Envelope) -> None:
        """The ``cancel_request`` handler: answers with a ``CancelResponse``."""
        self.cancel(envelope.cancel_request).addCallback(
            lambda response: self._safeSend(pb.Envelope(cancel_response=response), "")
        )

    # -- runs --------------------------------------------------------------------------------

    def submit(self, request: pb.RunRequest) -> None:
        """Admit and start one run, or refuse it with a single ``error`` event."""
        runId = request.run_id
        if self._closed:
            self.log.warn(
                "ignoring run {run_id}: the edge connection is gone",
                run_id=runId,
                node_id=self._nodeId,
            )
            return
        if not runId:
            self._refuse(request, "run request without a run_id", record=False)
            return
        if runId in self._active:
            self._refuse(request, f"run {runId!r} is already active on this node", record=False)
            return
        try:
            instance = self._registry.resolve(request.adapter)
        except UnknownAdapter as e:
            self._refuse(request, str(e))
            return
        provider = instance.provider
        if not instance.enabled or provider is None:
            self._refuse(request, f"adapter {instance.name!r} is disabled", adapter=instance.name)
            return
        gate = instance.gate
        slot = gate.try_acquire()
        if slot is None:
            self._refuse(
                request,
                f"adapter {instance.name!r} is at capacity ({gate.in_use}/{gate.limit})",
                adapter=instance.name,
            )
            return

        now = self._clock.seconds()
        run = _Run(
            run_id=runId,
            instance=instance,
            provider=provider,
            target=request.target,
            session_id=request.session_id,
            background=request.background,
            slot=slot,
            started_at=now,
            timeout_sec=float(request.timeout_sec),
        )
        self._active[runId] = run
        self.log.info(
            "run {run_id} started on adapter {adapter} ({in_use}/{limit})",
            run_id=runId,
            adapter=instance.name,
            target=request.target,
            in_use=gate.in_use,
            limit=gate.limit,
            node_id=self._nodeId,
        )
        self._store.run_started(
            runId,
            instance.name,
            request.target,
            session_id=request.session_id,
            background=request.background,
            created_at=now,
            started_at=now,
        )
        if request.timeout_sec:
            run.timer = self._clock.callLater(request.timeout_sec, self._timedOut, run)
        spec = ExecutionSpec(
            run_id=runId,
            target=request.target,
            input=request.input,
            workspace=request.workspace,
            metadata=dict(request.metadata),
            session_id=request.session_id,
            background=request.background,
            timeout_sec=float(request.timeout_sec),
            max_tokens=request.max_tokens,
            thinking_token_budget=request.thinking_token_budget,
        )
        d: Deferred[None] = maybeDeferred(provider.execute, spec, lambda e: self._emitted(run, e))
        run.deferred = d
        d.addCallbacks(
            self._executeSucceeded,
            self._executeFailed,
            callbackArgs=(run,),
            errbackArgs=(run,),
        )
        if run.cancelPending:
            self._cancelProvider(run)

    def cancel(self, request: pb.CancelRequest) -> Deferred[pb.CancelResponse]:
        """``CANCEL_RUN`` or ``TERMINATE_SESSION``; fires with the response (never fails)."""
        if request.kind == pb.CANCEL_RUN:
            return succeed(self._cancelRun(request))
        if request.kind == pb.TERMINATE_SESSION:
            return self._terminateSession(request)
        return succeed(self._cancelResponse(request, False, f"unknown cancel kind {request.kind}"))

    def connectionLost(self, reason: str = CONNECTION_LOST_REASON) -> None:
        """
        The session is gone: cancel every active run. Their terminals can no longer be sent, so
        they are recorded (status ``cancelled``, ``reason``) and counted only. New requests are
        ignored from now on.
        """
        self._closed = True
        runs = list(self._active.values())
        if runs:
            self.log.warn(
                "edge connection lost; cancelling {count} active run(s)",
                count=len(runs),
                node_id=self._nodeId,
            )
        for run in runs:
            self._finish(run, RuntimeEvent.cancelled(reason), cancelProvider=True, send=False)

    # -- status ------------------------------------------------------------------------------

    def activeCount(self, adapter: str | None = None) -> int:
        """Active runs, on ``adapter`` (an instance name) or on all adapters."""
        if adapter is None:
            return len(self._active)
        return sum(1 for run in self._active.values() if run.adapter == adapter)

    def describe(self) -> dict[str, object]:
        """The active runs (no inputs, only identities and progress)."""
        return {
            "active": [
                {
                    "run_id": run.run_id,
                    "adapter": run.adapter,
                    "target": run.target,
                    "session_id": run.session_id,
                    "background": run.background,
                    "started_unix_ms": int(run.started_at * 1000),
                    "events": run.sequence,
                }
                for run in self._active.values()
            ]
        }

    def usage(self) -> dict[str, object]:
        """
        Counters of this session: active runs (total and per adapter), finished runs by terminal
        (``error`` includes the ``rejected`` requests refused before execution), token sums.
        """
        byAdapter: dict[str, int] = {}
        for run in self._active.values():
            byAdapter[run.adapter] = byAdapter.get(run.adapter, 0) + 1
        totals = self._totals
        return {
            "active_runs": len(self._active),
            "active_by_adapter": byAdapter,
            "completed": totals.completed,
            "error": totals.error,
            "cancelled": totals.cancelled,
            "rejected": totals.rejected,
            "tokens": {
                "input_tokens": totals.input_tokens,
                "output_tokens": totals.output_tokens,
                "reasoning_tokens": totals.reasoning_tokens,
                "cached_input_tokens": totals.cached_input_tokens,
            },
        }

    # -- internals: events -------------------------------------------------------------------

    def _emitted(self, run: _Run, event: RuntimeEvent) -> None:
        """The ``emit`` given to the provider."""
        if run.finished:
            logger = self.log.debug if run.endedBy == "ended" else self.log.warn
            logger(
                "dropping {event_type} event of run {run_id}: the run already ended",
                event_type=getattr(getattr(event, "type", None), "value", repr(event)),
                run_id=run.run_id,
                adapter=run.adapter,
                node_id=self._nodeId,
            )
            return
        if event.usage is not None:
            run.usage = event.usage
        if event.session_id:
            run.session_id = event.session_id
        if event.type is EventType.START:
            if run.started:
                self.log.warn(
                    "dropping a second start event of run {run_id}",
                    run_id=run.run_id,
                    adapter=run.adapter,
                    node_id=self._nodeId,
                )
                return
            run.started = True
            self._relay(run, event)
            return
        if event.terminal:
            run.endedBy = "terminal"
            self._finish(run, event)
            return
        self._ensureStarted(run)
        self._relay(run, event)

    def _ensureStarted(self, run: _Run) -> None:
        if not run.started:
            run.started = True
            self._relay(run, RuntimeEvent.start(session_id=run.session_id))

    def _relay(self, run: _Run, event: RuntimeEvent) -> None:
        run.sequence += 1
        message = event_to_proto(event, run.run_id, run.sequence, self._nowMs())
        self._safeSend(pb.Envelope(run_event=message), run.run_id)

    def _safeSend(self, envelope: pb.Envelope, runId: str) -> None:
        try:
            self._send(envelope)
        except Exception:
            self.log.failure(
                "sending {kind} to the edge failed",
                kind=envelope.WhichOneof("message"),
                run_id=runId,
                node_id=self._nodeId,
            )

    def _nowMs(self) -> int:
        return int(self._clock.seconds() * 1000)

    # -- internals: the one end of a run -----------------------------------------------------

    def _finish(
        self,
        run: _Run,
        terminal: RuntimeEvent,
        cancelProvider: bool = False,
        send: bool = True,
    ) -> None:
        """
        End ``run`` with ``terminal``, exactly once: stop the timer, cancel the provider (when
        the manager ends it), release the slot, send start (if none went out) and the terminal,
        record and count it.
        """
        if run.finished:
            return
        run.finished = True
        if not run.endedBy:
            run.endedBy = "ended"
        if self._active.get(run.run_id) is run:
            del self._active[run.run_id]
        if run.timer is not None:
            if run.timer.active():
                run.timer.cancel()
            run.timer = None
        if cancelProvider:
            self._cancelProvider(run)
        run.slot.release()
        if send:
            self._ensureStarted(run)
            self._relay(run, terminal)
        status = _STATUS_OF[terminal.type]
        if status is RunStatus.COMPLETED:
            self._totals.completed += 1
        elif status is RunStatus.ERROR:
            self._totals.error += 1
        else:
            self._totals.cancelled += 1
        self._totals.add(run.usage)
        self.log.info(
            "run {run_id} on adapter {adapter} ended: {status}{detail}",
            run_id=run.run_id,
            adapter=run.adapter,
            status=status.value,
            detail=f" ({terminal.error})" if terminal.error else "",
            events=run.sequence,
            node_id=self._nodeId,
        )
        self._store.run_finished(
            run.run_id,
            status,
            terminal.error,
            session_id=run.session_id,
            finished_at=self._clock.seconds(),
        )

    def _cancelProvider(self, run: _Run) -> None:
        if run.deferred is None:
            # execute() has not returned yet: cancel as soon as it does.
            run.cancelPending = True
            return
        run.cancelPending = False
        if run.deferred.called:
            return
        try:
            run.deferred.cancel()
        except Exception:
            self.log.failure(
                "cancelling run {run_id} on adapter {adapter} raised",
                run_id=run.run_id,
                adapter=run.adapter,
                node_id=self._nodeId,
            )

    def _executeSucceeded(self, _: object, run: _Run) -> None:
        if run.finished:
            return
        self.log.info(
            "adapter {adapter} ended run {run_id} without a terminal event; completing it",
            adapter=run.adapter,
            run_id=run.run_id,
            node_id=self._nodeId,
        )
        self._finish(run, RuntimeEvent.complete(session_id=run.session_id))

    def _executeFailed(self, failure: Failure, run: _Run) -> None:
        if run.finished:
            if not failure.check(CancelledError):
                self.log.info(
                    "run {run_id} on adapter {adapter} failed after it ended: {error}",
                    run_id=run.run_id,
                    adapter=run.adapter,
                    error=_failureMessage(failure),
                    node_id=self._nodeId,
                )
            return
        # An adapter failing (upstream down, process crashed) is an outcome, not a node bug.
        self.log.warn(
            "run {run_id} on adapter {adapter} failed: {error}",
            run_id=run.run_id,
            adapter=run.adapter,
            error=_failureMessage(failure),
            error_type=failure.type.__name__ if failure.type is not None else None,
            node_id=self._nodeId,
        )
        self._finish(run, RuntimeEvent.failed(_failureMessage(failure)))

    def _timedOut(self, run: _Run) -> None:
        run.timer = None
        if run.finished:
            return
        seconds = run.timeout_sec
        self.log.warn(
            "run {run_id} on adapter {adapter} timed out after {seconds} s",
            run_id=run.run_id,
            adapter=run.adapter,
            seconds=_seconds(seconds),
            node_id=self._nodeId,
        )
        self._finish(
            run,
            RuntimeEvent.failed(f"timed out after {_seconds(seconds)} s"),
            cancelProvider=True,
        )

    # -- internals: refusals and cancels -----------------------------------------------------

    def _refuse(
        self,
        request: pb.RunRequest,
        reason: str,
        adapter: str | None = None,
        record: bool = True,
    ) -> None:
        self._totals.rejected += 1
        self._totals.error += 1
        self.log.warn(
            "refusing run {run_id} for adapter {adapter}: {error}",
            run_id=request.run_id,
            adapter=request.adapter,
            error=reason,
            node_id=self._nodeId,
        )
        event = RuntimeEvent(EventType.ERROR, error=reason, session_id=request.session_id)
        message = event_to_proto(event, request.run_id, 1, self._nowMs())
        self._safeSend(pb.Envelope(run_event=message), request.run_id)
        if record:
            self._store.run_rejected(
                request.run_id,
                adapter if adapter is not None else request.adapter,
                request.target,
                reason,
                session_id=request.session_id,
                background=request.background,
                at=self._clock.seconds(),
            )

    def _cancelResponse(
        self, request: pb.CancelRequest, ok: bool, reason: str
    ) -> pb.CancelResponse:
        return pb.CancelResponse(
            kind=request.kind,
            run_id=request.run_id,
            session_id=request.session_id,
            ok=ok,
            reason=reason,
        )

    def _cancelRun(self, request: pb.CancelRequest) -> pb.CancelResponse:
        if not request.run_id:
            return self._cancelResponse(request, False, "cancel without a run_id")
        run = self._active.get(request.run_id)
        if run is None:
            return self._cancelResponse(
                request, False, f"no active run {request.run_id!r} on this node"
            )
        self.log.info(
            "cancelling run {run_id} on adapter {adapter}: {reason}",
            run_id=run.run_id,
            adapter=run.adapter,
            reason=request.reason or CANCELLED_BY_EDGE,
            node_id=self._nodeId,
        )
        self._finish(
            run, RuntimeEvent.cancelled(request.reason or CANCELLED_BY_EDGE), cancelProvider=True
        )
        return self._cancelResponse(request, True, "")

    def _terminateSession(self, request: pb.CancelRequest) -> Deferred[pb.CancelResponse]:
        try:
            instance = self._registry.resolve(request.adapter)
        except UnknownAdapter as e:
            return succeed(self._cancelResponse(request, False, str(e)))
        name = instance.name
        if not instance.enabled or instance.provider is None:
            return succeed(self._cancelResponse(request, False, f"adapter {name!r} is disabled"))
        terminator = ISessionTerminator(instance.provider, None)
        if terminator is None:
            return succeed(
                self._cancelResponse(request, False, f"adapter {name!r} does not support sessions")
            )
        if not request.session_id:
            return succeed(self._cancelResponse(request, False, "terminate without a session_id"))
        d: Deferred[bool] = maybeDeferred(
            terminator.terminate_session, request.target, request.session_id
        )
        d.addTimeout(TERMINATE_SESSION_TIMEOUT, self._clock)

        def done(existed: bool) -> pb.CancelResponse:
            self.log.info(
                "session {session_id} on adapter {adapter}: terminate -> {existed}",
                session_id=request.session_id,
                adapter=name,
                existed=bool(existed),
                node_id=self._nodeId,
            )
            if existed:
                return self._cancelResponse(request, True, "")
            return self._cancelResponse(
                request, False, f"adapter {name!r} has no session {request.session_id!r}"
            )

        def failed(failure: Failure) -> pb.CancelResponse:
            self.log.warn(
                "terminating session {session_id} on adapter {adapter} failed: {error}",
                session_id=request.session_id,
                adapter=name,
                error=_failureMessage(failure),
                node_id=self._nodeId,
            )
            return self._cancelResponse(
                request, False, f"terminating the session failed: {_failureMessage(failure)}"
            )

        return d.addCallbacks(done, failed)
