# -*- test-case-name: iop.test.node.test_supervisor -*-
"""
One connectivity supervisor for the Node: the initial dial and every re-dial run through the same
loop and the same :class:`~iop.config.model.ReconnectPolicy`.

- An *attempt* is one dial plus, if the dial connects, one register → apply → ready handshake.
- ``max_attempts`` 0: retry until local shutdown. N > 0: give up after N consecutive failed
  attempts. A session that reached ready resets the count, so a session that later drops starts
  a fresh budget.
- A :class:`~iop.node.errors.FatalError` (bad local config or credentials, or the Edge not
  knowing our token) stops at once.
- Exit codes, delivered by :meth:`NodeSupervisor.whenFinished`: 1 after exhaustion or a fatal
  error, 0 after local shutdown (``stopService``). The supervisor never stops the reactor itself.

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

from enum import Enum
from typing import cast

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
from iop.node.errors import FatalError, NodeError
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol, NodeSession

EXIT_OK = 0
EXIT_FAILURE = 1

DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class SupervisorState(Enum):
    IDLE = "idle"  # not started
    CONNECTING = "connecting"  # dialling, or handshaking on a fresh connection
    READY = "ready"  # a session is established
    WAITING = "waiting"  # between attempts
    STOPPING = "stopping"  # given up or shutting down; closing the connection
    FINISHED = "finished"  # the exit code has been delivered


@implementer(IStreamClientEndpoint)
class _SupervisedEndpoint:
    """The Edge endpoint as ``ClientService`` sees it: every dial goes past the supervisor."""

    def __init__(self, endpoint: IStreamClientEndpoint, supervisor: NodeSupervisor) -> None:
        self._endpoint = endpoint
        self._supervisor = supervisor

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        return self._supervisor._dial(self._endpoint, protocolFactory)

    def __repr__(self) -> str:
        return f"<supervised {self._endpoint!r}>"


class NodeSupervisor(Service):
    """
    Keeps one registered, ready session with the Edge, re-dialling per ``policy``.

    :param endpoint: how to reach the Edge (TCP or TLS client endpoint).
    :param factory: builds the :class:`EdgeConnectionProtocol` for each dial.
    :param token: the node's token; revealed only into the ``RegisterRequest``.
    :param policy: ``reconnect`` from node.yaml.
    :param clock: the clock for retries and handshake timeouts.
    :param handshakeTimeout: bound on register → apply → ready, per attempt, in seconds.
    """

    log = Logger()

    def __init__(
        self,
        endpoint: IStreamClientEndpoint,
        factory: EdgeConnectionFactory,
        token: Secret,
        policy: ReconnectPolicy,
        clock: IReactorTime,
        handshakeTimeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        if policy.max_attempts < 0:
            raise ValueError("reconnect.max_attempts must be >= 0")
        if policy.interval_sec < 0 or (policy.unlimited and policy.interval_sec <= 0):
            raise ValueError("reconnect.interval_sec must be positive")
        if handshakeTimeout <= 0:
            raise ValueError("handshakeTimeout must be positive")
        self._token = token
        self._policy = policy
        self._clock = clock
        self._handshakeTimeout = handshakeTimeout
        self._client = ClientService(
            _SupervisedEndpoint(endpoint, self),
            factory,
            retryPolicy=self._retryDelay,
            clock=clock,
            prepareConnection=self._prepare,
        )
        self._state = SupervisorState.IDLE
        self._dials = 0
        self._failures = 0
        self._lastError: str | None = None
        self._session: NodeSession | None = None
        self._exitCode: int | None = None
        self._pendingStop: IDelayedCall | None = None
        self._clientStopping = False
        self._finishWaiters: list[Deferred[int]] = []

    # -- public ------------------------------------------------------------------------------

    @property
    def session(self) -> NodeSession | None:
        """The current ready session, or ``None``."""
        return self._session

    @property
    def state(self) -> SupervisorState:
        return self._state

    def whenFinished(self) -> Deferred[int]:
        """A new Deferred, fired once with the exit code (0 shutdown, 1 exhausted or fatal)."""
        if self._state is SupervisorState.FINISHED:
            assert self._exitCode is not None
            return succeed(self._exitCode)
        waiter: Deferred[int] = Deferred()
        self._finishWaiters.append(waiter)
        return waiter

    def describe(self) -> dict[str, object]:
        """Status for operators. Never contains the token."""
        return {
            "state": self._state.value,
            "attempts": self._failures,
            "max_attempts": self._policy.max_attempts,
            "interval_sec": self._policy.interval_sec,
            "dials": self._dials,
            "last_error": self._lastError,
            "exit_code": self._exitCode,
            "session": self._session.describe() if self._session is not None else None,
        }

    def startService(self) -> None:
        if self._state is not SupervisorState.IDLE:
            raise RuntimeError("a NodeSupervisor runs once")
        super().startService()  # type: ignore[no-untyped-call]
        self._state = SupervisorState.CONNECTING
        self.log.info(
            "node supervisor starting (max_attempts={max_attempts}, interval {interval_sec} s)",
            max_attempts=self._policy.max_attempts,
            interval_sec=self._policy.interval_sec,
        )
        self._client.startService()

    def stopService(self) -> Deferred[None]:
        """Local shutdown: exit code 0, unless the supervisor had already given up."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._exitCode is None:
            self._exitCode = EXIT_OK
            self._state = SupervisorState.STOPPING
            self.log.info("node supervisor stopping: local shutdown")
        if self._pendingStop is not None and self._pendingStop.active():
            self._pendingStop.cancel()
        self._stopClient()
        return self.whenFinished().addCallback(lambda _: None)

    # -- the loop ----------------------------------------------------------------------------

    def _retryDelay(self, failedAttempts: int) -> float:
        return self._policy.interval_sec

    def _dial(
        self, endpoint: IStreamClientEndpoint, factory: IProtocolFactory
    ) -> Deferred[IProtocol]:
        if self._exitCode is not None:
            return fail(CancelledError("node supervisor is stopping"))
        self._dials += 1
        self._state = SupervisorState.CONNECTING
        self.log.info(
            "dialing edge (attempt {attempt}, limit {max_attempts})",
            attempt=self._failures + 1,
            max_attempts=self._policy.max_attempts or "unlimited",
        )
        dialing = endpoint.connect(factory)
        dialing.addErrback(self._dialFailed)
        return dialing

    def _dialFailed(self, failure: Failure) -> Failure:
        self._attemptFailed(failure.value)
        return failure  # ClientService counts it too, and schedules the retry

    def _prepare(self, protocol: IProtocol) -> None:
        # ClientService hands us its proxy, which forwards attribute access to our protocol.
        edge = cast(EdgeConnectionProtocol, protocol)
        handshake = edge.handshake(self._token.reveal(), self._clock, self._handshakeTimeout)
        handshake.addCallbacks(self._ready, self._handshakeFailed, callbackArgs=(edge,))

    def _ready(self, session: NodeSession, edge: EdgeConnectionProtocol) -> None:
        if self._exitCode is not None:
            return  # stopping; the connection is already being closed
        self._failures = 0
        self._session = session
        self._state = SupervisorState.READY
        self.log.info("node {node_id} connected to edge", node_id=session.node_id)
        edge.whenDisconnected().addCallback(self._sessionEnded, session)

    def _sessionEnded(self, _: None, session: NodeSession) -> None:
        if self._session is session:
            self._session = None
        if self._exitCode is not None:
            return
        self._state = SupervisorState.WAITING
        self.log.warn(
            "session of node {node_id} with edge ended; redialing in {interval_sec} s",
            node_id=session.node_id,
            interval_sec=self._policy.interval_sec,
        )

    def _handshakeFailed(self, failure: Failure) -> None:
        if self._exitCode is None and not isinstance(failure.value, NodeError):
            self.log.failure("unexpected handshake failure", failure)
        self._attemptFailed(failure.value)

    def _attemptFailed(self, error: BaseException | None) -> None:
        if self._exitCode is not None:
            return  # the failure of our own stopping
        self._lastError = _describeError(error)
        if isinstance(error, FatalError):
            self.log.error("giving up: {error}", error=self._lastError)
            self._giveUp(EXIT_FAILURE)
            return
        self._failures += 1
        limit = self._policy.max_attempts
        if limit and self._failures >= limit:
            self.log.error(
                "giving up after {attempts} consecutive failed attempts; last error: {error}",
                attempts=self._failures,
                error=self._lastError,
            )
            self._giveUp(EXIT_FAILURE)
            return
        self._state = SupervisorState.WAITING
        self.log.warn(
            "attempt {attempt} failed: {error}; retrying in {interval_sec} s",
            attempt=self._failures,
            max_attempts=limit or "unlimited",
            error=self._lastError,
            interval_sec=self._policy.interval_sec,
        )

    # -- finishing ---------------------------------------------------------------------------

    def _giveUp(self, exitCode: int) -> None:
        self._exitCode = exitCode
        self._state = SupervisorState.STOPPING
        # We may be inside a ClientService transition, which cannot be re-entered: next tick.
        self._pendingStop = self._clock.callLater(0, self._stopClient)

    def _stopClient(self) -> None:
        self._pendingStop = None
        if self._clientStopping:
            return
        self._clientStopping = True
        self._client.stopService().addBoth(self._clientStopped)

    def _clientStopped(self, _: object) -> None:
        assert self._exitCode is not None
        self._session = None
        self._state = SupervisorState.FINISHED
        self.log.info(
            "node supervisor finished with exit code {exit_code}", exit_code=self._exitCode
        )
        waiters, self._finishWaiters = self._finishWaiters, []
        for waiter in waiters:
            waiter.callback(self._exitCode)


def _describeError(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, NodeError):
        return str(error)
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
