# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
The ``cli`` adapter's provider (:class:`CLIProvider`) and factory (:func:`build`): one
:class:`~iop.node.adapters.cli.process.CLIRun` per run, and the logical sessions it remembers
per target (for resume baselines, ``list_sessions`` and ``terminate_session``).

Traces: with the node's tracing on, each agent process is a span ``invoke_agent {agent}``
(the GenAI conventions' agent invocation; ``agent`` is the command's file name), the child of
the run's span named in ``spec.metadata``, from spawn to the process's end, with
``process.executable.name`` and ``process.pid``; the prompt and the agent's output are never
on it. The agent gets the span's context as ``TRACEPARENT`` (and ``TRACESTATE``) in its
environment — OpenTelemetry's environment-variable carrier — so an agent or tool that traces
joins the same trace; without tracing its environment is untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.node.adapters.cli.plan import CLISettings, LaunchError, Which, which
from iop.node.adapters.cli.process import CLIRun, exit_description
from iop.runtime.events import RuntimeEvent, Usage
from iop.runtime.interfaces import (
    AdapterContext,
    Capabilities,
    Emit,
    ExecutionSpec,
    IProvider,
    IResizable,
    ISessionTerminator,
)
from iop.runtime.spec import AdapterSpec
from iop.telemetry import semconv
from iop.telemetry.propagation import inject
from iop.telemetry.tracing import TRACING_OFF, SpanKind, Tracing, end_span, set_attributes

# Inactive sessions remembered per adapter instance (oldest forgotten first).
MAX_SESSIONS = 1024

SignalGroup = Callable[[int, int], None]


@dataclass
class _Session:
    target: str
    session_id: str
    last_used: float
    runs: set[CLIRun] = field(default_factory=set)
    cumulative_usage: Usage | None = None


def signal_process_group(pgid: int, signum: int) -> None:
    """``os.killpg``; raises ProcessLookupError when no such group exists (yet)."""
    os.killpg(pgid, signum)


@implementer(IProvider, ISessionTerminator, IResizable)
class CLIProvider:
    """A CLI coding agent as a provider: one process per run, sessions remembered per target."""

    log = Logger()
    type = "cli"

    def __init__(
        self,
        spec: AdapterSpec,
        reactor: IReactorTime,
        signal_group: SignalGroup = signal_process_group,
        which: Which = which,
        environ: Mapping[str, str] | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        """
        ``reactor`` runs the timers and, adapted to ``IReactorProcess``, spawns the agents;
        ValueError when it cannot spawn processes or ``spec`` is not a usable configuration.
        """
        self.name = spec.name or "cli"
        self.settings = CLISettings.from_spec(spec)
        self.max_concurrency = spec.max_concurrency or 1
        processes = IReactorProcess(reactor, None)
        if processes is None:
            raise ValueError(f"cli adapter {self.name!r}: the reactor cannot spawn processes")
        self.reactor = reactor
        self.processes: IReactorProcess = processes
        self.signal_group = signal_group
        self._which = which
        self._environ = environ
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._runs: set[CLIRun] = set()
        self._tracing = tracing

    def __repr__(self) -> str:
        return f"<CLIProvider {self.name!r}>"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            max_concurrency=self.max_concurrency, streaming=True, tools=False, sessions=True
        )

    def resize(self, max_concurrency: int) -> None:
        """The adapter's ``max_concurrency`` changed live (``IResizable``)."""
        self.max_concurrency = max(1, max_concurrency)

    def execute(self, spec: ExecutionSpec, emit: Emit) -> Deferred[None]:
        return Deferred.fromCoroutine(self._execute(spec, emit))

    async def _execute(self, spec: ExecutionSpec, emit: Emit) -> None:
        try:
            plan = self.settings.plan(spec, self._which, self._environ)
        except LaunchError as e:
            emit(RuntimeEvent.failed(str(e)))
            return
        baseline = None
        if spec.session_id:
            known = self._sessions.get((spec.target, spec.session_id))
            baseline = known.cumulative_usage if known is not None else None
        run = CLIRun(self, spec, emit, plan, baseline)
        span = None
        if self._tracing.tracer is not None:
            agent = os.path.basename(plan.executable)
            span = self._tracing.start_remote(
                f"invoke_agent {agent}",
                spec.metadata,
                SpanKind.INTERNAL,
                {
                    semconv.GEN_AI_OPERATION_NAME: "invoke_agent",
                    semconv.GEN_AI_AGENT_NAME: agent,
                    semconv.GEN_AI_REQUEST_MODEL: spec.target,
                    semconv.PROCESS_EXECUTABLE_NAME: agent,
                    semconv.IOP_ADAPTER: self.name,
                },
            )
        if span is not None:
            # The agent's own traces (an agent or tool that reads the OpenTelemetry
            # environment-carrier variables) join this span's trace.
            carrier: dict[str, str] = {}
            inject(span, carrier)
            plan.env.update({key.upper(): value for key, value in carrier.items()})
        try:
            run.spawn()
        except OSError as e:
            emit(RuntimeEvent.failed(f"cannot start {self.settings.command!r}: {e.strerror or e}"))
            end_span(span, type(e).__name__, "the agent could not be started")
            return
        if span is not None and run.pid is not None:
            set_attributes(span, {semconv.PROCESS_PID: run.pid})
        try:
            await self._wait(run)
        except CancelledError:
            set_attributes(span, {semconv.IOP_OUTCOME: "cancelled"})
            end_span(span)
            raise
        except BaseException as e:
            end_span(span, type(e).__name__, "the agent run failed")
            raise
        end_span(span)

    async def _wait(self, run: CLIRun) -> None:
        """The spawned ``run`` noted, begun and awaited to its end (cancel: the process too)."""
        spec = run.spec
        if not run.finished:  # (Twisted may report an instant exit from within spawnProcess)
            self._runs.add(run)
            self.log.info(
                "cli run {run_id} started: adapter {adapter}, pid {pid}",
                run_id=spec.run_id,
                adapter=self.name,
                pid=run.pid,
            )
            if spec.session_id:
                self._note_session(run, spec.session_id)
            run.begin()
        try:
            await run.when_ended()
        except CancelledError:
            run.cancel()
            while not run.finished:
                try:
                    await run.when_ended()
                except CancelledError:
                    continue
            raise

    # -- sessions -----------------------------------------------------------------------------

    def _note_session(self, run: CLIRun, session_id: str) -> None:
        key = (run.spec.target, session_id)
        record = self._sessions.get(key)
        if record is None:
            record = self._sessions[key] = _Session(run.spec.target, session_id, 0.0)
            self._forget_old_sessions()
        record.runs.add(run)
        record.last_used = self.reactor.seconds()

    def _run_ended(self, run: CLIRun) -> None:
        self._runs.discard(run)
        now = self.reactor.seconds()
        for record in self._sessions.values():
            if run in record.runs:
                record.runs.discard(run)
                record.last_used = now
        if run.interpreter.cumulative_usage is not None and run.session_id:
            latest = self._sessions.get((run.spec.target, run.session_id))
            if latest is not None:
                latest.cumulative_usage = run.interpreter.cumulative_usage
        _, description = exit_description(run._exit_reason)
        self.log.info(
            "cli run {run_id} ended: {status}", run_id=run.spec.run_id, status=description
        )

    def _forget_old_sessions(self) -> None:
        if len(self._sessions) <= MAX_SESSIONS:
            return
        idle = sorted((r for r in self._sessions.values() if not r.runs), key=lambda r: r.last_used)
        for record in idle[: len(self._sessions) - MAX_SESSIONS]:
            del self._sessions[(record.target, record.session_id)]

    def list_sessions(self) -> list[dict[str, object]]:
        return [
            {
                "session_id": record.session_id,
                "target": record.target,
                "active": bool(record.runs),
                "last_used": record.last_used,
            }
            for record in sorted(self._sessions.values(), key=lambda r: -r.last_used)
        ]

    def terminate_session(self, target: str, session_id: str) -> Deferred[bool]:
        record = self._sessions.pop((target, session_id), None)
        if record is None:
            return succeed(False)
        runs = list(record.runs)
        for run in runs:
            self.log.info(
                "cli run {run_id}: terminating session {session_id}",
                run_id=run.spec.run_id,
                session_id=session_id,
            )
            run.terminate_session()
        if not runs:
            return succeed(True)
        done = DeferredList([run.when_ended() for run in runs], consumeErrors=True)
        return done.addCallback(lambda _: True)


def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
    """The ``cli`` adapter factory; raises ValueError for an unusable configuration."""
    return CLIProvider(spec, ctx.reactor, tracing=ctx.tracing)
