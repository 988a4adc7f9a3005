# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
One agent process, from spawn to the moment it has exited and its pipes are closed
(:class:`CLIRun`): started through :data:`SETSID_SHIM` so it leads its own process group, its
stdout decoded into run events, its timers (whole run, idle, exit grace, kill grace, drain), and
the group signalled on cancel, timeout and session termination. :class:`AgentProcessProtocol` is
the thin ``ProcessProtocol`` that hands everything to the run.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.cli.decoders import (
    JsonDecoder,
    OutputDecoder,
    StreamJsonDecoder,
    TextDecoder,
)
from iop.node.adapters.cli.interpreter import StreamInterpreter
from iop.node.adapters.cli.plan import CLISettings, LaunchPlan
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.interfaces import Emit, ExecutionSpec


class RunHost(Protocol):
    """
    What a run needs of the provider that started it (:class:`~.provider.CLIProvider`): its
    reactor, settings and process spawner, its log, how to signal a process group, and where to
    report the session an agent named and the run's end.
    """

    reactor: IReactorTime
    settings: CLISettings
    processes: IReactorProcess
    log: Logger

    signal_group: Callable[[int, int], None]

    def _note_session(self, run: CLIRun, session_id: str) -> None: ...

    def _run_ended(self, run: CLIRun) -> None: ...


STDERR_TAIL_BYTES = 4096
# After the agent exited: how long descendants outside its group may hold stdout/stderr open.
DRAIN_SECONDS = 2.0

# Run by ``python -I -S -c``: a new session (and process group) led by the agent, then exec.
SETSID_SHIM = (
    "import os, sys\n"
    "try:\n"
    "    os.setsid()\n"
    "except OSError:\n"
    "    pass\n"
    "try:\n"
    "    os.execv(sys.argv[1], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write('cannot run %r: %s\\n' % (sys.argv[1], e.strerror))\n"
    "    os._exit(127)\n"
)


class AgentProcessProtocol(ProcessProtocol):
    """Thin: hands stdout, stderr, exit and end to its :class:`CLIRun`, which decides."""

    def __init__(self, run: CLIRun) -> None:
        self.run = run

    def connectionMade(self) -> None:
        self.run.started(self.transport)

    def outReceived(self, data: bytes) -> None:
        self.run.stdout(data)

    def errReceived(self, data: bytes) -> None:
        self.run.stderr(data)

    def processExited(self, reason: Failure) -> None:
        self.run.exited(reason)

    def processEnded(self, reason: Failure) -> None:
        self.run.ended(reason)


def exit_description(reason: Failure | None) -> tuple[int | None, str]:
    """``(exit code or None, "code N" / "signal N")`` of a process-ended Failure."""
    if reason is None:
        return None, "unknown status"
    value = reason.value
    if isinstance(value, ProcessDone):
        return 0, "code 0"
    if isinstance(value, ProcessTerminated):
        if value.exitCode is not None:
            return value.exitCode, f"code {value.exitCode}"
        if value.signal is not None:
            return None, f"signal {value.signal}"
    return None, "unknown status"


class CLIRun:
    """
    One agent process and its output, from spawn to the moment the process has exited and its
    pipes are closed. Emits the run's events (nothing at all once cancelled) and answers
    :meth:`when_ended` to every caller.
    """

    def __init__(
        self,
        provider: RunHost,
        spec: ExecutionSpec,
        emit: Emit,
        plan: LaunchPlan,
        usage_baseline: Usage | None,
    ) -> None:
        self.provider = provider
        self.spec = spec
        self.plan = plan
        self._emit = emit
        self._reactor = provider.reactor
        settings = provider.settings
        self.interpreter = StreamInterpreter(self, usage_baseline)
        self.decoder: OutputDecoder
        if settings.output_format == "text":
            self.decoder = TextDecoder(self)
        elif settings.output_format == "json":
            self.decoder = JsonDecoder(self.interpreter, settings.max_line_bytes, self)
        else:
            self.decoder = StreamJsonDecoder(self.interpreter, settings.max_line_bytes, self)
        self.session_id = spec.session_id
        self.pid: int | None = None
        self.transport: Any = None
        self._stderr = bytearray()
        self._terminal_sent = False
        self._quiet = False
        self._stopping = False
        self._exited = False
        self._finished = False
        self._exit_reason: Failure | None = None
        self._waiters: list[Deferred[None]] = []
        self._timers: dict[str, IDelayedCall] = {}

    # -- spawning -----------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process (raises OSError when it cannot be started)."""
        plan = self.plan
        argv = [sys.executable, "-I", "-S", "-c", SETSID_SHIM, plan.executable, *plan.argv]
        null_fd: int | None = None
        child_fds: dict[int, int | str] = {1: "r", 2: "r"}
        if plan.stdin is None:
            null_fd = os.open(os.devnull, os.O_RDONLY)
            child_fds[0] = null_fd
        else:
            child_fds[0] = "w"
        try:
            self.transport = self.provider.processes.spawnProcess(
                AgentProcessProtocol(self),
                sys.executable,
                argv,
                env=plan.env,
                path=plan.cwd,
                usePTY=False,
                childFDs=child_fds,
            )
        finally:
            if null_fd is not None:
                os.close(null_fd)
        if plan.stdin is not None and not self._exited:
            self.transport.write(plan.stdin)
            self.transport.closeStdin()

    def started(self, transport: Any) -> None:
        """The process exists (called while ``spawnProcess`` runs)."""
        self.transport = transport
        pid = getattr(transport, "pid", None)
        self.pid = pid if isinstance(pid, int) else None

    def begin(self) -> None:
        """The process is running: emit ``start`` and arm the timers."""
        settings = self.provider.settings
        if self._finished:
            return
        self.emit(RuntimeEvent.start(session_id=self.session_id))
        timeout = self.spec.timeout_sec or settings.request_timeout
        if timeout > 0:
            self._timers["timeout"] = self._reactor.callLater(timeout, self._timed_out, timeout)
        if settings.idle_timeout > 0:
            self._timers["idle"] = self._reactor.callLater(settings.idle_timeout, self._idle)

    # -- events -------------------------------------------------------------------------------

    def emit(self, event: RuntimeEvent) -> None:
        if self._quiet or self._terminal_sent:
            return
        if event.terminal:
            self._terminal_sent = True
            self._cancel_timer("timeout")
            self._cancel_timer("idle")
            if not self._exited and not self._stopping:
                grace = self.provider.settings.exit_grace
                self._timers["exit"] = self._reactor.callLater(grace, self.stop)
        try:
            self._emit(event)
        except Exception:
            self.provider.log.failure("cli run {run_id}: emit failed", run_id=self.spec.run_id)

    # OutputSink

    def session(self, session_id: str) -> None:
        self.session_id = session_id
        if not self._stopping and not self._finished:
            self.provider._note_session(self, session_id)

    def text(self, delta: str) -> None:
        self.emit(RuntimeEvent.text(delta))

    def reasoning(self, delta: str) -> None:
        self.emit(RuntimeEvent.reasoning(delta))

    def complete(self, usage: Usage | None) -> None:
        self.emit(RuntimeEvent.complete(usage=usage, session_id=self.session_id))

    def fail(self, reason: str) -> None:
        self.emit(RuntimeEvent(EventType.ERROR, error=reason, session_id=self.session_id))

    def abort(self, reason: str) -> None:
        self.fail(reason)
        self.stop()

    # -- process I/O --------------------------------------------------------------------------

    def stdout(self, data: bytes) -> None:
        self._touch()
        if not self._terminal_sent and not self._quiet:
            self.decoder.feed(data)

    def stderr(self, data: bytes) -> None:
        self._touch()
        self._stderr += data
        if len(self._stderr) > STDERR_TAIL_BYTES:
            del self._stderr[: len(self._stderr) - STDERR_TAIL_BYTES]

    def stderr_tail(self) -> str:
        return bytes(self._stderr).decode("utf-8", errors="replace").strip()

    def exited(self, reason: Failure) -> None:
        """The agent itself has exited: sweep its group, give stray pipe holders a moment."""
        self._exited = True
        self._exit_reason = reason
        self._cancel_timer("exit")
        self._cancel_timer("kill")
        if self.pid is not None:
            self._signal_group(signal.SIGKILL)
        self._timers["drain"] = self._reactor.callLater(DRAIN_SECONDS, self._drain)

    def ended(self, reason: Failure) -> None:
        """Process exited and pipes closed: settle the outcome, then every waiter."""
        if self._finished:
            return
        if not self._exited:
            self._exited = True
            self._exit_reason = reason
        for name in list(self._timers):
            self._cancel_timer(name)
        code, description = exit_description(self._exit_reason)
        if not self._terminal_sent and not self._quiet:
            self.decoder.finish(code)
        if not self._terminal_sent and not self._quiet:
            self.fail(self._missing_result(description))
        self._finished = True
        self.provider._run_ended(self)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _missing_result(self, description: str) -> str:
        if self.provider.settings.output_format == "text":
            reason = f"agent exited ({description})"
        else:
            reason = f"agent exited ({description}) without a result"
        if self.interpreter.legacy:
            reason += " (legacy Codex --json output; Codex 0.44 or later is needed)"
        notes = [n for n in self.interpreter.notes if n]
        if notes:
            reason += ": " + "; ".join(notes[-3:])
        tail = self.stderr_tail()
        if tail:
            reason += f"\nstderr: {tail}"
        return reason

    # -- stopping -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def active(self) -> bool:
        return not self._exited

    def when_ended(self) -> Deferred[None]:
        """A fresh Deferred that fires once the process has exited and its pipes are closed."""
        if self._finished:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def cancel(self) -> None:
        """The caller cancelled: emit nothing further, stop the process group."""
        self._quiet = True
        self.stop()

    def terminate_session(self) -> None:
        self.emit(RuntimeEvent.cancelled("session terminated"))
        self.stop()

    def stop(self) -> None:
        """SIGTERM the group now, SIGKILL after the grace. Idempotent."""
        if self._stopping or self._exited:
            return
        self._stopping = True
        self._cancel_timer("exit")
        self._signal_group(signal.SIGTERM)
        grace = self.provider.settings.kill_grace
        self._timers["kill"] = self._reactor.callLater(grace, self._kill)

    def _kill(self) -> None:
        self._timers.pop("kill", None)
        if not self._exited:
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        """Signal the agent's process group; before the shim's ``setsid``, the agent alone."""
        if self.pid is None:
            return
        try:
            self.provider.signal_group(self.pid, signum)
            return
        except ProcessLookupError:
            pass
        except PermissionError:
            self.provider.log.warn(
                "cli run {run_id}: not allowed to signal process group {pgid}",
                run_id=self.spec.run_id,
                pgid=self.pid,
            )
        if not self._exited and self.transport is not None:
            try:
                self.transport.signalProcess(signum)
            except (ProcessExitedAlready, OSError):
                pass

    def _drain(self) -> None:
        # The agent is gone but something outside its group still holds stdout/stderr open.
        self._timers.pop("drain", None)
        if not self._finished and self.transport is not None:
            self.transport.loseConnection()

    # -- timers -------------------------------------------------------------------------------

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _touch(self) -> None:
        timer = self._timers.get("idle")
        if timer is not None and timer.active():
            timer.reset(self.provider.settings.idle_timeout)

    def _timed_out(self, seconds: float) -> None:
        self._timers.pop("timeout", None)
        self.abort(f"timed out after {seconds:g}s")

    def _idle(self) -> None:
        self._timers.pop("idle", None)
        self.abort(f"timed out: no output for {self.provider.settings.idle_timeout:g}s")
