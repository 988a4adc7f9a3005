# -*- test-case-name: iop.test.node.test_supervisor -*-
"""
One connectivity supervisor for the Node: the initial dial and every re-dial run through the same
loop and the same :class:`~iop.config.model.ReconnectPolicy`.

- An *attempt* is one dial plus, if the dial connects, one register → apply → ready handshake.
- ``max_attempts`` 0: retry until local shutdown. N > 0: give up after N consecutive failed
  attempts. A session that reached ready resets the count, so a session that later drops starts
  a fresh budget.
- A :class:`~iop.node.errors.FatalError` (bad local config or credentials, the Edge not
  knowing our token, the Edge's certificate refused: a wrong CA pin, name or CA) stops at once;
  so does a :class:`~iop.node.errors.NotAnEdgeError` (the address is not an Edge node listener)
  until a session has once been ready — after that the Edge was there, and a silent port is more
  likely it restarting.
- Logging: a failed attempt is one warning line, at most one per distinct error a minute (a
  :class:`~iop.logs.limiter.LogLimiter`; what it holds back is summed up in one line), so a node
  retrying forever does not fill its log; the dials themselves and ``ClientService``'s own retry
  lines are debug or silent.
- Exit codes, delivered by :meth:`NodeSupervisor.when_finished`: 1 after exhaustion or a fatal
  error, 0 after local shutdown (``stopService``). The supervisor never stops the reactor itself.

The supervisor's lifecycle is an Automat machine (its inputs are ``_Supervisor``); the exit code
is data of the states that have decided it, so no flag can contradict the state::

    idle ──start──▶ connecting ──handshake reached ready──▶ ready
                     ▲   │                                    │
                     │   └──attempt failed, budget left──▶ waiting ◀──session ended──┘
                     └─────────────────dial─────────────────┘
    connecting ──fatal error, or budget exhausted──▶ giving up(1) ──next tick──▶ stopping(1)
    idle, connecting, waiting, ready ──stop (local shutdown)──▶ stopping(0)
    giving up(code) ──stop──▶ stopping(code) ──ClientService stopped──▶ finished(code)

Whether a failed attempt retries or gives up is decided in the failure's transition and fed back
as the machine's next input, which Automat runs before the failing input returns.

Dialling and the wait between attempts are Twisted's :class:`ClientService`, wrapped rather than
rewritten. Two properties of ``ClientService`` shape the wrapping:

1. A connection whose ``prepareConnection`` failed stays open and untracked, and when it later
   closes ``ClientService`` has no transition for that (``NoTransition`` from ``connectionLost``).
   So ``prepareConnection`` here only *starts* the handshake and always succeeds; the supervisor
   follows the handshake's Deferred itself. A failed handshake aborts its connection, which
   ``ClientService`` sees as a dropped connection and answers with a retry after
   ``retryPolicy(1)``, our one interval.
2. ``ClientService`` cannot be re-entered from its own callbacks (``whenConnected`` waiters fire
   inside a transition). So the supervisor watches dials through a thin endpoint wrapper rather
   than ``whenConnected``, and the stop that follows a give-up decision runs on the next clock
   tick (``callLater(0)``). Once the decision is made the wrapper refuses any further dial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol, cast

from automat import TypeMachineBuilder
from twisted.application.internet import ClientService
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.config.model import ReconnectPolicy, Secret
from iop.logs.limiter import LogLimiter
from iop.node.errors import FatalError, NodeError, NotAnEdgeError
from iop.node.session import NodeSession
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol

EXIT_OK = 0
EXIT_FAILURE = 1
# A failed attempt's line, at most once per distinct error in this many seconds.
ATTEMPT_LOG_INTERVAL_SEC = 60.0

DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class SupervisorState(Enum):
    """The supervisor's state as operators see it (:meth:`NodeSupervisor.describe`)."""

    IDLE = "idle"  # not started
    CONNECTING = "connecting"  # dialling, or handshaking on a fresh connection
    READY = "ready"  # a session is established
    WAITING = "waiting"  # between attempts
    STOPPING = "stopping"  # given up or shutting down; closing the connection
    FINISHED = "finished"  # the exit code has been delivered


class Status(NamedTuple):
    state: SupervisorState
    session: NodeSession | None = None
    exit_code: int | None = None


# ---------------------------------------------------------------------------------------------
# The machine


class _Supervisor(Protocol):
    """The inputs of the supervisor's lifecycle."""

    def start(self) -> None:
        """Begin; raises RuntimeError unless this is the first start."""

    def stop(self) -> Deferred[None]:
        """Local shutdown (exit 0 unless the supervisor already gave up); fires when finished."""

    def when_finished(self) -> Deferred[int]:
        """A new Deferred, fired once with the exit code."""

    def status(self) -> Status:
        """Where the supervisor is."""

    def dial(
        self, endpoint: IStreamClientEndpoint, factory: IProtocolFactory
    ) -> Deferred[IProtocol]:
        """ClientService dials the Edge (refused once the supervisor has decided to stop)."""

    def dial_failed(self, failure: Failure) -> None:
        """A dial did not connect."""

    def handshake_succeeded(self, session: NodeSession, edge: EdgeConnectionProtocol) -> None:
        """A connection's handshake reached ready."""

    def handshake_failed(self, failure: Failure) -> None:
        """A connection's handshake failed (its connection is already aborted)."""

    def session_ended(self, session: NodeSession) -> None:
        """The ready session's connection is gone."""

    def _retry(self) -> None:
        """An attempt failed within the budget: ClientService re-dials after the interval."""

    def _give_up(self, exit_code: int) -> None:
        """Fatal error or budget exhausted."""

    def _stop_client(self, exit_code: int) -> None:
        """Stop ClientService; the supervisor finishes with ``exit_code`` once it has."""

    def _client_stopped(self, exit_code: int) -> None:
        """ClientService has stopped."""


@dataclass
class _Core:
    """What the supervisor works with: ClientService, the policy, counters for operators."""

    client: ClientService
    policy: ReconnectPolicy
    clock: IReactorTime
    log: Logger
    limiter: LogLimiter
    dials: int = 0
    failures: int = 0
    last_error: str | None = None
    # Whether a session has once been ready (the Edge proved to be there).
    ever_ready: bool = False
    finish_waiters: list[Deferred[int]] = field(default_factory=list)

    def wait_finished(self) -> Deferred[int]:
        waiter: Deferred[int] = Deferred()
        self.finish_waiters.append(waiter)
        return waiter


@dataclass
class _GivingUp:
    exit_code: int
    # The stop of ClientService, on the next tick: we may be inside one of its transitions.
    pending: IDelayedCall


def _ready_data(
    c: _Supervisor, s: _Core, session: NodeSession, edge: EdgeConnectionProtocol
) -> NodeSession:
    return session


def _schedule_stop(c: _Supervisor, s: _Core, exit_code: int) -> _GivingUp:
    return _GivingUp(exit_code, s.clock.callLater(0, c._stop_client, exit_code))


def _exit_code(c: _Supervisor, s: _Core, exit_code: int) -> int:
    return exit_code


def _describe_error(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, NodeError):
        return str(error)
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _make_supervisor_machine() -> Callable[[_Core], _Supervisor]:
    machine = TypeMachineBuilder(_Supervisor, _Core)
    idle = machine.state("Idle")
    connecting = machine.state("Connecting")
    ready = machine.state("Ready", _ready_data)
    waiting = machine.state("Waiting")
    giving_up = machine.state("GivingUp", _schedule_stop)
    stopping = machine.state("Stopping", _exit_code)
    finished = machine.state("Finished", _exit_code)
    running = (idle, connecting, waiting)

    # -- starting ----------------------------------------------------------------------------

    @idle.upon(_Supervisor.start).to(connecting)
    def start(c: _Supervisor, s: _Core) -> None:
        s.log.info(
            "node supervisor starting (max_attempts={max_attempts}, interval {interval_sec} s)",
            max_attempts=s.policy.max_attempts,
            interval_sec=s.policy.interval_sec,
        )

    def again(c: _Supervisor, s: _Core) -> None:
        raise RuntimeError("a NodeSupervisor runs once")

    def again_with(c: _Supervisor, s: _Core, data: object) -> None:
        again(c, s)

    # -- the loop ----------------------------------------------------------------------------

    def dial(
        c: _Supervisor, s: _Core, endpoint: IStreamClientEndpoint, factory: IProtocolFactory
    ) -> Deferred[IProtocol]:
        s.dials += 1
        s.log.debug(
            "dialing edge (attempt {attempt}, limit {max_attempts})",
            attempt=s.failures + 1,
            max_attempts=s.policy.max_attempts or "unlimited",
        )

        def failed(failure: Failure) -> Failure:
            c.dial_failed(failure)
            return failure  # ClientService counts it too, and schedules the retry

        return endpoint.connect(factory).addErrback(failed)

    def dial_from_ready(
        c: _Supervisor,
        s: _Core,
        session: NodeSession,
        endpoint: IStreamClientEndpoint,
        factory: IProtocolFactory,
    ) -> Deferred[IProtocol]:
        return dial(c, s, endpoint, factory)

    connecting.upon(_Supervisor.dial).loop()(dial)
    waiting.upon(_Supervisor.dial).to(connecting)(dial)
    ready.upon(_Supervisor.dial).to(connecting)(dial_from_ready)

    def attempt_failed(s: _Core, c: _Supervisor, failure: Failure) -> None:
        error = failure.value
        s.last_error = _describe_error(error)
        if isinstance(error, FatalError) or (
            isinstance(error, NotAnEdgeError) and not s.ever_ready
        ):
            s.log.error("giving up: {error}", error=s.last_error)
            c._give_up(EXIT_FAILURE)
            return
        s.failures += 1
        limit = s.policy.max_attempts
        if limit and s.failures >= limit:
            s.log.error(
                "giving up after {attempts} consecutive failed attempts; last error: {error}",
                attempts=s.failures,
                error=s.last_error,
            )
            c._give_up(EXIT_FAILURE)
            return
        if not s.limiter.admit(s.last_error, "failed attempt"):
            c._retry()
            return
        s.log.warn(
            "attempt {attempt} failed: {error}; retrying in {interval_sec} s",
            attempt=s.failures,
            max_attempts=limit or "unlimited",
            error=s.last_error,
            interval_sec=s.policy.interval_sec,
        )
        c._retry()

    @connecting.upon(_Supervisor.dial_failed).loop()
    def dial_failed(c: _Supervisor, s: _Core, failure: Failure) -> None:
        attempt_failed(s, c, failure)

    @connecting.upon(_Supervisor.handshake_failed).loop()
    def handshake_failed(c: _Supervisor, s: _Core, failure: Failure) -> None:
        if not isinstance(failure.value, NodeError):
            s.log.failure("unexpected handshake failure", failure)
        attempt_failed(s, c, failure)

    connecting.upon(_Supervisor._retry).to(waiting).returns(None)
    connecting.upon(_Supervisor._give_up).to(giving_up).returns(None)

    @connecting.upon(_Supervisor.handshake_succeeded).to(ready)
    def connected(
        c: _Supervisor, s: _Core, session: NodeSession, edge: EdgeConnectionProtocol
    ) -> None:
        s.failures = 0
        s.ever_ready = True
        s.log.info("node {node_id} connected to edge", node_id=session.node_id)
        edge.when_disconnected().addCallback(lambda _: c.session_ended(session))

    @ready.upon(_Supervisor.session_ended).to(waiting)
    def ended(c: _Supervisor, s: _Core, current: NodeSession, session: NodeSession) -> None:
        s.log.warn(
            "session of node {node_id} with edge ended; redialing in {interval_sec} s",
            node_id=session.node_id,
            interval_sec=s.policy.interval_sec,
        )

    # -- local shutdown ----------------------------------------------------------------------

    def shutdown(c: _Supervisor, s: _Core) -> Deferred[None]:
        s.log.info("node supervisor stopping: local shutdown")
        c._stop_client(EXIT_OK)
        return s.wait_finished().addCallback(lambda _: None)

    def shutdown_with(c: _Supervisor, s: _Core, data: object) -> Deferred[None]:
        return shutdown(c, s)

    def stop_client(c: _Supervisor, s: _Core, exit_code: int) -> None:
        s.client.stopService().addBoth(lambda _: c._client_stopped(exit_code))

    def stop_client_with(c: _Supervisor, s: _Core, data: object, exit_code: int) -> None:
        stop_client(c, s, exit_code)

    for state in running:
        state.upon(_Supervisor.stop).loop()(shutdown)
        state.upon(_Supervisor._stop_client).to(stopping)(stop_client)
    ready.upon(_Supervisor.stop).loop()(shutdown_with)
    ready.upon(_Supervisor._stop_client).to(stopping)(stop_client_with)

    # -- giving up, stopping, finished: the decision is made -------------------------------

    @giving_up.upon(_Supervisor.stop).loop()
    def stop_now(c: _Supervisor, s: _Core, giving: _GivingUp) -> Deferred[None]:
        if giving.pending.active():
            giving.pending.cancel()
        c._stop_client(giving.exit_code)
        return s.wait_finished().addCallback(lambda _: None)

    giving_up.upon(_Supervisor._stop_client).to(stopping)(stop_client_with)

    @stopping.upon(_Supervisor.stop).loop()
    def wait_stopped(c: _Supervisor, s: _Core, exit_code: int) -> Deferred[None]:
        return s.wait_finished().addCallback(lambda _: None)

    @stopping.upon(_Supervisor._client_stopped).to(finished)
    def done(c: _Supervisor, s: _Core, stopping_with: int, exit_code: int) -> None:
        s.limiter.flush()
        s.log.info("node supervisor finished with exit code {exit_code}", exit_code=exit_code)
        waiters, s.finish_waiters = s.finish_waiters, []
        for waiter in waiters:
            waiter.callback(exit_code)

    @finished.upon(_Supervisor.stop).loop()
    def already_stopped(c: _Supervisor, s: _Core, exit_code: int) -> Deferred[None]:
        return succeed(None)

    @finished.upon(_Supervisor.when_finished).loop()
    def exit_code(c: _Supervisor, s: _Core, exit_code: int) -> Deferred[int]:
        return succeed(exit_code)

    def refuse_dial(
        c: _Supervisor,
        s: _Core,
        data: object,
        endpoint: IStreamClientEndpoint,
        factory: IProtocolFactory,
    ) -> Deferred[IProtocol]:
        return fail(CancelledError("node supervisor is stopping"))

    # Our own stopping (a handshake the stop broke, a connection being closed): no attempt.
    def ignore_failure(c: _Supervisor, s: _Core, data: object, failure: Failure) -> None:
        pass

    def ignore_ready(
        c: _Supervisor, s: _Core, data: object, session: NodeSession, edge: EdgeConnectionProtocol
    ) -> None:
        pass

    def ignore_ended(c: _Supervisor, s: _Core, data: object, session: NodeSession) -> None:
        pass

    for over in (giving_up, stopping, finished):
        over.upon(_Supervisor.start).loop()(again_with)
        over.upon(_Supervisor.dial).loop()(refuse_dial)
        over.upon(_Supervisor.dial_failed).loop()(ignore_failure)
        over.upon(_Supervisor.handshake_failed).loop()(ignore_failure)
        over.upon(_Supervisor.handshake_succeeded).loop()(ignore_ready)
        over.upon(_Supervisor.session_ended).loop()(ignore_ended)
    connecting.upon(_Supervisor.start).loop()(again)
    waiting.upon(_Supervisor.start).loop()(again)
    ready.upon(_Supervisor.start).loop()(again_with)

    def wait(c: _Supervisor, s: _Core) -> Deferred[int]:
        return s.wait_finished()

    def wait_with(c: _Supervisor, s: _Core, data: object) -> Deferred[int]:
        return s.wait_finished()

    for state in running:
        state.upon(_Supervisor.when_finished).loop()(wait)
    for waiting_state in (ready, giving_up, stopping):
        waiting_state.upon(_Supervisor.when_finished).loop()(wait_with)

    # -- status ------------------------------------------------------------------------------

    def status_of(name: SupervisorState) -> Callable[[_Supervisor, _Core], Status]:
        def status(c: _Supervisor, s: _Core) -> Status:
            return Status(name)

        return status

    idle.upon(_Supervisor.status).loop()(status_of(SupervisorState.IDLE))
    connecting.upon(_Supervisor.status).loop()(status_of(SupervisorState.CONNECTING))
    waiting.upon(_Supervisor.status).loop()(status_of(SupervisorState.WAITING))

    @ready.upon(_Supervisor.status).loop()
    def ready_status(c: _Supervisor, s: _Core, session: NodeSession) -> Status:
        return Status(SupervisorState.READY, session)

    @giving_up.upon(_Supervisor.status).loop()
    def giving_up_status(c: _Supervisor, s: _Core, giving: _GivingUp) -> Status:
        return Status(SupervisorState.STOPPING, exit_code=giving.exit_code)

    @stopping.upon(_Supervisor.status).loop()
    def stopping_status(c: _Supervisor, s: _Core, exit_code: int) -> Status:
        return Status(SupervisorState.STOPPING, exit_code=exit_code)

    @finished.upon(_Supervisor.status).loop()
    def finished_status(c: _Supervisor, s: _Core, exit_code: int) -> Status:
        return Status(SupervisorState.FINISHED, exit_code=exit_code)

    return machine.build()


_SupervisorMachine = _make_supervisor_machine()


# ---------------------------------------------------------------------------------------------
# The service


def _drop(event: object) -> None:
    """ClientService's own lines ("Scheduling retry ..."): the supervisor's say it already."""


class _QuietClientService(ClientService):
    _log = Logger(observer=_drop)  # type: ignore[arg-type]


@implementer(IStreamClientEndpoint)
class _SupervisedEndpoint:
    """The Edge endpoint as ``ClientService`` sees it: every dial goes past the supervisor."""

    def __init__(self, endpoint: IStreamClientEndpoint, supervisor: NodeSupervisor) -> None:
        self._endpoint = endpoint
        self._supervisor = supervisor

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        return self._supervisor._machine.dial(self._endpoint, protocolFactory)

    def __repr__(self) -> str:
        # ClientService's own lines name the endpoint: the Edge's host:port when it is known.
        edge = getattr(self._supervisor.log, "edge", None)
        return f"<supervised edge {edge}>" if edge else f"<supervised {self._endpoint!r}>"


class NodeSupervisor(Service):
    """
    Keeps one registered, ready session with the Edge, re-dialling per ``policy``.

    :param endpoint: how to reach the Edge (TCP or TLS client endpoint).
    :param factory: builds the :class:`EdgeConnectionProtocol` for each dial.
    :param token: the node's token; revealed only into the ``RegisterRequest``.
    :param policy: ``reconnect`` from node.yaml.
    :param clock: the clock for retries and handshake timeouts.
    :param handshake_timeout: bound on register → apply → ready, per attempt, in seconds.
    :param log: where its lines go (default: this class's logger); a node dialling several
        Edges gives each supervisor one that names its Edge
        (:class:`~iop.node.edges.EdgeLogger`).
    """

    log = Logger()

    def __init__(
        self,
        endpoint: IStreamClientEndpoint,
        factory: EdgeConnectionFactory,
        token: Secret,
        policy: ReconnectPolicy,
        clock: IReactorTime,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        log: Logger | None = None,
    ) -> None:
        if log is not None:
            self.log = log
        if policy.max_attempts < 0:
            raise ValueError("reconnect.max_attempts must be >= 0")
        if policy.interval_sec < 0 or (policy.unlimited and policy.interval_sec <= 0):
            raise ValueError("reconnect.interval_sec must be positive")
        if handshake_timeout <= 0:
            raise ValueError("handshake_timeout must be positive")
        self._token = token
        self._policy = policy
        self._clock = clock
        self._handshake_timeout = handshake_timeout
        client = _QuietClientService(
            _SupervisedEndpoint(endpoint, self),
            factory,
            retryPolicy=lambda failed: policy.interval_sec,
            clock=clock,
            prepareConnection=self._prepare,
        )
        limiter = LogLimiter(clock, self._held_back, interval=ATTEMPT_LOG_INTERVAL_SEC, burst=3)
        self._core = _Core(client, policy, clock, self.log, limiter)
        self._machine = _SupervisorMachine(self._core)

    # -- public ------------------------------------------------------------------------------

    @property
    def session(self) -> NodeSession | None:
        """The current ready session, or ``None``."""
        return self._machine.status().session

    @property
    def state(self) -> SupervisorState:
        return self._machine.status().state

    def when_finished(self) -> Deferred[int]:
        """A new Deferred, fired once with the exit code (0 shutdown, 1 exhausted or fatal)."""
        return self._machine.when_finished()

    def describe(self) -> dict[str, object]:
        """Status for operators. Never contains the token."""
        status = self._machine.status()
        core = self._core
        return {
            "state": status.state.value,
            "attempts": core.failures,
            "max_attempts": self._policy.max_attempts,
            "interval_sec": self._policy.interval_sec,
            "dials": core.dials,
            "last_error": core.last_error,
            "exit_code": status.exit_code,
            "session": status.session.describe() if status.session is not None else None,
        }

    def startService(self) -> None:
        self._machine.start()  # raises unless this is the first start
        super().startService()  # type: ignore[no-untyped-call]
        self._core.client.startService()

    def stopService(self) -> Deferred[None]:
        """Local shutdown: exit code 0, unless the supervisor had already given up."""
        super().stopService()  # type: ignore[no-untyped-call]
        return self._machine.stop()

    def _held_back(self, count: int, by_category: dict[str, int], since: float) -> None:
        self.log.warn(
            "{count} more failed attempt(s) in the last {seconds:.0f} s, not logged one by one;"
            " last error: {error}",
            count=count,
            seconds=self._clock.seconds() - since,
            error=self._core.last_error,
        )

    # -- each connection ---------------------------------------------------------------------

    def _prepare(self, protocol: IProtocol) -> None:
        # ClientService hands us its proxy, which forwards attribute access to our protocol.
        # Only *start* the handshake here (see the module docstring) and follow it ourselves.
        edge = cast(EdgeConnectionProtocol, protocol)
        handshake = edge.handshake(self._token.reveal(), self._clock, self._handshake_timeout)
        handshake.addCallbacks(
            self._machine.handshake_succeeded,
            self._machine.handshake_failed,
            callbackArgs=(edge,),
        )
