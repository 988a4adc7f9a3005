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
             ├─ timeout_sec elapsed ─────────────────▶ error "timed out after N s" (cancelled,
             │                                        error_code upstream_timeout)
             └─ edge connection lost ────────────────▶ cancelled, recorded only (cannot be sent)
                                                       │
                                          finished: slot released, store updated, exactly once

Guarantees on the wire, per run id: events carry sequence 1, 2, 3…; the first is ``start``
(synthesized when the adapter's first event is something else); exactly one terminal
(``complete``, ``error`` or ``cancelled``), after which nothing more is sent. The capacity slot is
released before the terminal goes out, so an Edge that dispatches the next run on seeing the
terminal finds the slot free.

A request refused before execution (no run id, duplicate run id, unknown or disabled adapter, at
capacity) gets a single ``error`` event with sequence 1; an at-capacity one carries
``metadata[error_code] = provider_at_capacity``. Admission, the active table, safe sending and
connection loss are the manager's :class:`~iop.node.admission.Admission` (the same object kind the
tunnel manager holds); the manager gives it its own check and its own answer to a refusal.

Managed mode (``managed=True``): a run on an HTTP provider adapter (one that serves provider
tunnels: ``openai_compat``, ``vllm``) is refused before admission with ``lease_missing``. Such an
upstream is reached only through a tunnel carrying a credential lease the Edge signed for that
request; a normalized run carries none, so a managed node never calls that upstream outside the
lease path, whatever the Edge sends. Runs on the other adapters (``ollama``, ``cli``), which
carry no IOP credential, are served as usual.

A ``TERMINATE_SESSION`` cancel request concerns an adapter's session, not a run: the manager
hands it to its :class:`~iop.node.session_termination.SessionTermination`.

Traces (``telemetry:``): each run has one span, ``iop.node.run`` (kind SERVER), the child of
the trace context the Edge put in ``RunRequest.metadata`` (``traceparent``; a root without
one), started when the run is admitted and ended in :meth:`RunManager._finish`, with the GenAI
attributes the node knows (``gen_ai.operation.name``, ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.usage.*``, ``gen_ai.response.finish_reasons``), the run's
identities and its outcome (``error.type``: the error code of an ``error`` terminal, else
``_OTHER``; a cancel is an outcome, not an error). The adapter gets the run's metadata with
``traceparent`` naming this span, so its upstream call or process is the span's child. A
refused request gets a span ended at once with its refusal's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.capacity import Slot
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.admission import (
    CONNECTION_LOST_REASON,
    Admission,
    Admitted,
    Nouns,
    Refusal,
    WorkGate,
)
from iop.node.errors import failure_message
from iop.node.session_termination import SessionTermination, cancel_response
from iop.node.store import RunStatus, RunStore
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.interfaces import ExecutionSpec, IProvider, ITunnelProvider
from iop.runtime.requestid import carried, log_context
from iop.telemetry import semconv
from iop.telemetry.propagation import inject, log_ids
from iop.telemetry.tracing import TRACING_OFF, Span, SpanKind, Tracing, end_span, set_attributes
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto

__all__ = ["CANCELLED_BY_EDGE", "CONNECTION_LOST_REASON", "RunManager"]

CANCELLED_BY_EDGE = "cancelled by edge"

_STATUS_OF = {
    EventType.COMPLETE: RunStatus.COMPLETED,
    EventType.ERROR: RunStatus.ERROR,
    EventType.CANCELLED: RunStatus.CANCELLED,
}


def _seconds(value: float) -> str:
    return f"{value:g}"


# Run event types whose plain deltas are held for the turn and sent joined (RunManager._relay).
_HELD_TYPES = frozenset({EventType.DELTA, EventType.REASONING_DELTA})


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
    # The client request's id the run serves (its metadata's; "" when none).
    request_id: str = ""
    sequence: int = 0
    started: bool = False
    finished: bool = False
    # Why it finished: "terminal" (the adapter's own), or "ended" (the manager decided).
    ended_by: str = ""
    deferred: Deferred[None] | None = None
    # A cancel that arrived while execute() had not returned yet.
    cancel_pending: bool = False
    timer: IDelayedCall | None = field(default=None, repr=False)
    usage: Usage | None = None
    # The adapter gate's occupancy when admitted (for the run's one log line).
    gate_in_use: int = 0
    # Text deltas of this reactor turn not sent yet, all of one type (RunManager._relay).
    held_type: EventType | None = None
    held: list[str] = field(default_factory=list, repr=False)
    held_call: IDelayedCall | None = field(default=None, repr=False)
    # The run's span (None: tracing off or not sampled out: it is None only when off).
    span: Span | None = field(default=None, repr=False)
    # The span's ids for the run's log lines (kept after the span ended).
    trace_ids: dict[str, str] = field(default_factory=dict, repr=False)
    finish_reason: str = ""

    @property
    def adapter(self) -> str:
        return self.instance.name

    @property
    def context(self) -> dict[str, str]:
        """What each log line about this run adds (the request's id and, traced, the span's
        ids: JSON lines show them)."""
        return log_context(self.request_id, self.trace_ids)


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


_RUN_NOUNS = Nouns(work="run", request="run request", active="run")


class RunManager:
    """
    Runs the Edge's ``RunRequest``s of one session on the adapters of ``registry``.

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge (a no-op once the session closed).
    :param store: the local run store; its failures are logged there and never break a run.
    :param clock: time for run timeouts and event timestamps.
    :param node_id: for logs.
    :param hold_deltas: join a reactor turn's text deltas into one event (:meth:`_relay`).
    :param managed: managed mode: runs on HTTP provider adapters are refused (module doc).
    :param work_gate: the node's drain for this session (:class:`~iop.node.admission.WorkGate`).
    :param tracing: the node's tracing: a span per run (module doc).
    """

    log = Logger()

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        store: RunStore,
        clock: IReactorTime,
        node_id: str = "",
        hold_deltas: bool = True,
        managed: bool = False,
        work_gate: WorkGate | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self._registry = registry
        self.clock = clock
        self._node_id = node_id
        self._admission: Admission[_Run] = Admission(registry, send, _RUN_NOUNS, node_id, work_gate)
        # TERMINATE_SESSION arrives with the runs' cancels; it concerns no run.
        self._sessions = SessionTermination(registry, clock, node_id)
        self.managed = managed
        self._store = store
        self._totals = _Totals()
        self._hold_deltas = hold_deltas
        self._tracing = tracing

    # -- envelope handlers (install these on the session) -------------------------------------

    def run_request_received(self, envelope: pb.Envelope) -> None:
        """The ``run_request`` handler."""
        self.submit(envelope.run_request)

    def cancel_request_received(self, envelope: pb.Envelope) -> None:
        """The ``cancel_request`` handler: answers with a ``CancelResponse``."""
        self.cancel(envelope.cancel_request).addCallback(
            lambda response: self._admission.send(pb.Envelope(cancel_response=response), "")
        )

    # -- runs --------------------------------------------------------------------------------

    def submit(self, request: pb.RunRequest) -> None:
        """Admit and start one run, or refuse it with a single ``error`` event."""
        admitted = self._admission.admit(request, self._check, self._refused)
        if admitted is None:
            return
        run = self._open(request, admitted)
        self._admission.enter(run)
        self._start(run, request)

    def cancel(self, request: pb.CancelRequest) -> Deferred[pb.CancelResponse]:
        """``CANCEL_RUN`` or ``TERMINATE_SESSION``; fires with the response (never fails)."""
        if request.kind == pb.CANCEL_RUN:
            return succeed(self._cancel_run(request))
        if request.kind == pb.TERMINATE_SESSION:
            return self._sessions.terminate(request)
        return succeed(cancel_response(request, False, f"unknown cancel kind {request.kind}"))

    def is_active(self, run_id: str) -> bool:
        """Whether ``run_id`` names an active run."""
        return self._admission.is_active(run_id)

    def active_count(self, adapter: str | None = None) -> int:
        """Active runs, on ``adapter`` (an instance name) or on all adapters."""
        return self._admission.active_count(adapter)

    def connection_lost(self, reason: str = CONNECTION_LOST_REASON) -> None:
        """
        The session is gone: every active run ends cancelled, recorded but not sent (nothing
        can be), and later requests are ignored.
        """
        runs = self._admission.close()
        if runs:
            self.log.warn(
                "edge connection lost; cancelling {count} active run(s)",
                count=len(runs),
                node_id=self._node_id,
            )
        for run in runs:
            self._finish(run, RuntimeEvent.cancelled(reason), cancel_provider=True, send=False)

    # -- admission: the run's own check, item, start and refusal -----------------------------

    def _check(self, request: pb.RunRequest, instance: AdapterInstance) -> IProvider:
        provider = instance.provider
        assert provider is not None  # an enabled instance has one
        if self.managed and ITunnelProvider(provider, None) is not None:
            raise Refusal(
                f"{ErrorCode.LEASE_MISSING.value}: this node runs in managed mode and adapter"
                f" {instance.name!r} ({instance.type}) is reached only through a provider tunnel"
                " carrying a credential lease; a normalized run carries none",
                code=ErrorCode.LEASE_MISSING,
                adapter=instance.name,
            )
        return provider

    def _open(self, request: pb.RunRequest, admitted: Admitted[IProvider]) -> _Run:
        return _Run(
            run_id=request.run_id,
            instance=admitted.instance,
            provider=admitted.plan,
            target=request.target,
            session_id=request.session_id,
            background=request.background,
            slot=admitted.slot,
            started_at=self.clock.seconds(),
            timeout_sec=float(request.timeout_sec),
            request_id=carried(request.metadata),
        )

    def _start(self, run: _Run, request: pb.RunRequest) -> None:
        run.gate_in_use = run.instance.gate.in_use
        self._store.run_started(
            run.run_id,
            run.adapter,
            request.target,
            session_id=request.session_id,
            background=request.background,
            created_at=run.started_at,
            started_at=run.started_at,
            request_id=run.request_id,
        )
        if request.timeout_sec:
            run.timer = self.clock.callLater(request.timeout_sec, self._timed_out, run)
        metadata = dict(request.metadata)
        if self._tracing.tracer is not None:
            run.span = self._run_span(request, run.instance.type, run.adapter)
            if run.span is not None:
                # The adapter's upstream call or process is this span's child.
                inject(run.span, metadata)
                run.trace_ids = log_ids(run.span)
        spec = ExecutionSpec(
            run_id=run.run_id,
            target=request.target,
            input=request.input,
            workspace=request.workspace,
            metadata=metadata,
            session_id=request.session_id,
            background=request.background,
            timeout_sec=float(request.timeout_sec),
            max_tokens=request.max_tokens,
            thinking_token_budget=request.thinking_token_budget,
            collect=request.collect,
        )
        d: Deferred[None] = maybeDeferred(
            run.provider.execute, spec, lambda e: self._emitted(run, e)
        )
        run.deferred = d
        d.addCallbacks(
            self._execute_succeeded,
            self._execute_failed,
            callbackArgs=(run,),
            errbackArgs=(run,),
        )
        if run.cancel_pending:
            self._cancel_provider(run)

    def _run_span(self, request: pb.RunRequest, kind: str, adapter: str) -> Span | None:
        """The run's span, the child of the Edge's context in the request's metadata."""
        attributes: dict[str, str | bool] = {
            semconv.GEN_AI_OPERATION_NAME: "invoke_agent" if kind == "cli" else "chat",
            semconv.GEN_AI_REQUEST_MODEL: request.target,
            semconv.GEN_AI_REQUEST_STREAM: not request.collect,
            semconv.IOP_RUN_ID: request.run_id,
            semconv.IOP_ADAPTER: adapter,
            semconv.IOP_NODE_ID: self._node_id,
        }
        if kind:
            attributes[semconv.GEN_AI_PROVIDER_NAME] = semconv.provider_name(kind)
        if request.session_id:
            attributes[semconv.GEN_AI_CONVERSATION_ID] = request.session_id
        request_id = carried(request.metadata)
        if request_id:
            attributes[semconv.IOP_REQUEST_ID] = request_id
        return self._tracing.start_remote(
            "iop.node.run", request.metadata, SpanKind.SERVER, attributes
        )

    def _refused(self, request: pb.RunRequest, refusal: Refusal) -> None:
        if self._tracing.tracer is not None:
            span = self._run_span(request, "", refusal.adapter or request.adapter)
            code = refusal.metadata.get(ERROR_CODE_KEY) if refusal.metadata else None
            end_span(span, code or "refused", refusal.reason)
        self._totals.rejected += 1
        self._totals.error += 1
        event = RuntimeEvent(
            EventType.ERROR,
            error=refusal.reason,
            metadata=refusal.metadata,
            session_id=request.session_id,
        )
        message = event_to_proto(event, request.run_id, 1, self._now_ms())
        self._admission.send(pb.Envelope(run_event=message), request.run_id)
        if refusal.record:
            self._store.run_rejected(
                request.run_id,
                refusal.adapter if refusal.adapter is not None else request.adapter,
                request.target,
                refusal.reason,
                session_id=request.session_id,
                background=request.background,
                at=self.clock.seconds(),
                request_id=carried(request.metadata),
            )

    # -- status ------------------------------------------------------------------------------

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
                    "request_id": run.request_id,
                    "started_unix_ms": int(run.started_at * 1000),
                    "events": run.sequence,
                }
                for run in self._admission
            ]
        }

    def usage(self) -> dict[str, object]:
        """
        Counters of this session: active runs (total and per adapter), finished runs by terminal
        (``error`` includes the ``rejected`` requests refused before execution), token sums.
        """
        by_adapter: dict[str, int] = {}
        for run in self._admission:
            by_adapter[run.adapter] = by_adapter.get(run.adapter, 0) + 1
        totals = self._totals
        return {
            "active_runs": self._admission.active_count(),
            "active_by_adapter": by_adapter,
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
            logger = self.log.debug if run.ended_by == "ended" else self.log.warn
            logger(
                "dropping {event_type} event of run {run_id}: the run already ended",
                event_type=getattr(getattr(event, "type", None), "value", repr(event)),
                run_id=run.run_id,
                **run.context,
                adapter=run.adapter,
                node_id=self._node_id,
            )
            return
        if event.usage is not None:
            run.usage = event.usage
        if run.span is not None and event.metadata:
            run.finish_reason = event.metadata.get("finish_reason", run.finish_reason)
        if event.session_id:
            run.session_id = event.session_id
        if event.type is EventType.START:
            if run.started:
                self.log.warn(
                    "dropping a second start event of run {run_id}",
                    run_id=run.run_id,
                    **run.context,
                    adapter=run.adapter,
                    node_id=self._node_id,
                )
                return
            run.started = True
            self._relay(run, event)
            return
        if event.terminal:
            run.ended_by = "terminal"
            self._finish(run, event)
            return
        self._ensure_started(run)
        self._relay(run, event)

    def _ensure_started(self, run: _Run) -> None:
        if not run.started:
            run.started = True
            self._relay(run, RuntimeEvent.start(session_id=run.session_id))

    def _relay(self, run: _Run, event: RuntimeEvent) -> None:
        """
        Send ``event``. Plain text deltas (no usage, metadata or session) are held for the
        reactor turn and the run of same-type deltas goes out as one event when the turn ends
        or before any other event: an upstream that answers many tokens at once (one TCP read)
        costs one frame, not one per token; the text and its order are untouched.
        """
        if (
            self._hold_deltas
            and event.type in _HELD_TYPES
            and event.usage is None
            and not event.metadata
            and not event.session_id
        ):
            if run.held_type is not event.type:
                self._send_held(run)
                run.held_type = event.type
            run.held.append(event.delta)
            if run.held_call is None:
                run.held_call = self.clock.callLater(0, self._send_held, run)
            return
        self._send_held(run)
        self._send_event(run, event)

    def _send_held(self, run: _Run) -> None:
        call, run.held_call = run.held_call, None
        if call is not None and call.active():
            call.cancel()
        if run.held_type is None:
            return
        event = RuntimeEvent(run.held_type, delta="".join(run.held))
        run.held_type = None
        run.held = []
        self._send_event(run, event)

    def _drop_held(self, run: _Run) -> None:
        if run.held_call is not None and run.held_call.active():
            run.held_call.cancel()
        run.held_call = None
        run.held_type = None
        run.held = []

    def _send_event(self, run: _Run, event: RuntimeEvent) -> None:
        run.sequence += 1
        message = event_to_proto(event, run.run_id, run.sequence, self._now_ms())
        self._admission.send(pb.Envelope(run_event=message), run.run_id)

    def _now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # -- internals: the one end of a run -----------------------------------------------------

    def _finish(
        self,
        run: _Run,
        terminal: RuntimeEvent,
        cancel_provider: bool = False,
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
        if not run.ended_by:
            run.ended_by = "ended"
        self._admission.leave(run)
        if run.timer is not None:
            if run.timer.active():
                run.timer.cancel()
            run.timer = None
        if cancel_provider:
            self._cancel_provider(run)
        run.slot.release()
        if send:
            self._ensure_started(run)
            self._relay(run, terminal)
        else:
            # Nothing more can be sent: held text is dropped with its timer.
            self._drop_held(run)
        status = _STATUS_OF[terminal.type]
        if status is RunStatus.COMPLETED:
            self._totals.completed += 1
        elif status is RunStatus.ERROR:
            self._totals.error += 1
        else:
            self._totals.cancelled += 1
        self._totals.add(run.usage)
        # The run's one log line: what it was, how it ended, how much and how long.
        usage = run.usage
        self.log.info(
            "run {run_id} {adapter}/{target} ended: {status}{detail}, {events} events"
            " in {duration_sec} s",
            run_id=run.run_id,
            **run.context,
            adapter=run.adapter,
            target=run.target,
            status=status.value,
            detail=f" ({terminal.error})" if terminal.error else "",
            events=run.sequence,
            duration_sec=round(self.clock.seconds() - run.started_at, 3),
            input_tokens=usage.input_tokens if usage is not None else None,
            output_tokens=usage.output_tokens if usage is not None else None,
            in_use=run.gate_in_use,
            limit=run.instance.gate.limit,
            node_id=self._node_id,
        )
        self._store.run_finished(
            run.run_id,
            status,
            terminal.error,
            session_id=run.session_id,
            finished_at=self.clock.seconds(),
        )
        if run.span is not None:
            self._end_span(run, status, terminal)

    def _end_span(self, run: _Run, status: RunStatus, terminal: RuntimeEvent) -> None:
        span, run.span = run.span, None
        attributes: dict[str, str | int | list[str]] = {semconv.IOP_OUTCOME: status.value}
        if run.usage is not None:
            attributes.update(semconv.usage_attributes(run.usage))
        reason = terminal.metadata.get("finish_reason") or run.finish_reason
        if reason:
            attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [reason]
        if run.session_id:
            attributes[semconv.GEN_AI_CONVERSATION_ID] = run.session_id
        code = terminal.metadata.get(ERROR_CODE_KEY, "")
        if code:
            attributes[semconv.IOP_ERROR_CODE] = code
        set_attributes(span, attributes)
        if status is RunStatus.ERROR:
            # The text is the run's own (adapters redact what they report).
            end_span(span, code or "_OTHER", terminal.error)
        else:
            end_span(span)

    def _cancel_provider(self, run: _Run) -> None:
        if run.deferred is None:
            # execute() has not returned yet: cancel as soon as it does.
            run.cancel_pending = True
            return
        run.cancel_pending = False
        if run.deferred.called:
            return
        try:
            run.deferred.cancel()
        except Exception:
            self.log.failure(
                "cancelling run {run_id} on adapter {adapter} raised",
                run_id=run.run_id,
                request_id=run.request_id,
                adapter=run.adapter,
                node_id=self._node_id,
            )

    def _execute_succeeded(self, _: object, run: _Run) -> None:
        if run.finished:
            return
        self.log.info(
            "adapter {adapter} ended run {run_id} without a terminal event; completing it",
            adapter=run.adapter,
            run_id=run.run_id,
            **run.context,
            node_id=self._node_id,
        )
        self._finish(run, RuntimeEvent.complete(session_id=run.session_id))

    def _execute_failed(self, failure: Failure, run: _Run) -> None:
        if run.finished:
            if not failure.check(CancelledError):
                self.log.info(
                    "run {run_id} on adapter {adapter} failed after it ended: {error}",
                    run_id=run.run_id,
                    **run.context,
                    adapter=run.adapter,
                    error=failure_message(failure),
                    node_id=self._node_id,
                )
            return
        # An adapter failing (upstream down, process crashed) is an outcome, not a node bug.
        self.log.warn(
            "run {run_id} on adapter {adapter} failed: {error}",
            run_id=run.run_id,
            **run.context,
            adapter=run.adapter,
            error=failure_message(failure),
            error_type=failure.type.__name__ if failure.type is not None else None,
            node_id=self._node_id,
        )
        self._finish(run, RuntimeEvent.failed(failure_message(failure)))

    def _timed_out(self, run: _Run) -> None:
        run.timer = None
        if run.finished:
            return
        seconds = run.timeout_sec
        self.log.warn(
            "run {run_id} on adapter {adapter} timed out after {seconds} s",
            run_id=run.run_id,
            **run.context,
            adapter=run.adapter,
            seconds=_seconds(seconds),
            node_id=self._node_id,
        )
        self._finish(
            run,
            RuntimeEvent.failed(
                f"timed out after {_seconds(seconds)} s",
                {ERROR_CODE_KEY: ErrorCode.UPSTREAM_TIMEOUT.value},
            ),
            cancel_provider=True,
        )

    # -- internals: refusals and cancels -----------------------------------------------------

    def _cancel_run(self, request: pb.CancelRequest) -> pb.CancelResponse:
        if not request.run_id:
            return cancel_response(request, False, "cancel without a run_id")
        run = self._admission.get(request.run_id)
        if run is None:
            return cancel_response(request, False, f"no active run {request.run_id!r} on this node")
        self.log.info(
            "cancelling run {run_id} on adapter {adapter}: {reason}",
            run_id=run.run_id,
            **run.context,
            adapter=run.adapter,
            reason=request.reason or CANCELLED_BY_EDGE,
            node_id=self._node_id,
        )
        self._finish(
            run, RuntimeEvent.cancelled(request.reason or CANCELLED_BY_EDGE), cancel_provider=True
        )
        return cancel_response(request, True, "")
