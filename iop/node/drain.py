# -*- test-case-name: iop.test.node.test_drain -*-
"""
The node's drain when it stops (SIGTERM under twistd or systemd): stop taking new work, let what
runs finish within ``drain_timeout_sec``, then let the sessions close.

One :class:`NodeDrain` per process, shared by every Edge's sessions; each session holds a
:class:`SessionGate` (its runs' and tunnels' :class:`~iop.node.admission.WorkGate`)::

    serving ──begin()──▶ draining ──last work in flight ended, or the bound──▶ drained

- :meth:`NodeDrain.begin` tells each ready Edge that understands it (its ``RegisterResponse``
  set ``node_draining_supported``) with a ``NodeDraining`` carrying the deadline. That Edge takes
  the node's providers out of placement and answers with ``NodeDraining``; TCP keeps order, so
  every request it dispatched before its answer arrives before it. The session admits those
  (they were placed while the Edge still counted on the node) and refuses what arrives after the
  answer with :data:`~iop.runtime.codes.ErrorCode.NODE_DRAINING` (nothing was sent upstream, so
  the Edge may place it again). An Edge that does not understand ``NodeDraining`` (an older one)
  is told nothing — its framing would drop the connection on an unknown message — and its
  session refuses new work at once. A session that registers while the node drains (it had
  lost its Edge and redialled) is told nothing either and refuses at once.
- Work in flight (every item in any session's admission table) runs on. The drain ends when the
  last of it ends (on the reactor turn after, once its last message is written), or at the
  bound, whichever comes first; what still runs at the bound is cut when the sessions close (the
  Edge tells its clients the node disconnected), and one line says how many were cut.
- ``drain_timeout_sec`` 0: no drain at all, the sessions close at once (as before drains
  existed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from iop.node.admission import Refusal
from iop.node.session import NodeSession
from iop.runtime.codes import ErrorCode
from iop.wire import runtime_pb2 as pb

__all__ = ["DRAINING_REASON", "NodeDrain", "SessionGate"]

DRAINING_REASON = "node is draining (stopping): it takes no new work"


class SessionGate:
    """
    One session's :class:`~iop.node.admission.WorkGate`: admits until the node drains and the
    session's Edge has acknowledged it (or at once, for an Edge that cannot be told).
    """

    def __init__(self, drain: NodeDrain, session: NodeSession, refuse_at_once: bool) -> None:
        self._drain = drain
        self.session = session
        # Whether the Edge answered our NodeDraining: it places nothing new on us any more.
        self.acknowledged = False
        # Created while the node drains: never announced, refuses from the start.
        self._refuse_at_once = refuse_at_once

    @property
    def told(self) -> bool:
        """Whether this session's Edge can be told of the drain (it understands NodeDraining)."""
        return self.session.draining_supported and not self._refuse_at_once

    def refusal(self) -> Refusal | None:
        if not self._drain.draining:
            return None
        if self.told and not self.acknowledged:
            return None  # placed before the Edge heard: admitted, it drains with the rest
        return Refusal(DRAINING_REASON, code=ErrorCode.NODE_DRAINING)

    def entered(self, work: object) -> None:
        self._drain._entered(work)

    def left(self, work: object) -> None:
        self._drain._left(work)

    def announce(self, deadline_unix_ms: int) -> None:
        if self.told and not self.session.closed:
            self.session.send(
                pb.Envelope(node_draining=pb.NodeDraining(deadline_unix_ms=deadline_unix_ms))
            )

    def edge_acknowledged(self, envelope: pb.Envelope) -> None:
        """The ``node_draining`` handler: the Edge's answer."""
        if self._drain.draining and not self.acknowledged:
            self.acknowledged = True
            self._drain.log.info(
                "edge acknowledged the drain of node {node_id}: no new work from it",
                node_id=self.session.node_id,
            )


class NodeDrain:
    """
    The process's drain (see the module docstring). ``timeout_sec`` is node.yaml's
    ``drain_timeout_sec``; ``wall`` is the wall clock for the deadline the Edges are told.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        timeout_sec: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if timeout_sec < 0:
            raise ValueError("drain_timeout_sec must be >= 0")
        self.timeout_sec = timeout_sec
        self._clock = clock
        self._wall = wall
        self._gates: list[SessionGate] = []
        self._work: dict[int, object] = {}
        self.draining = False
        self.drained = False
        self.since: float | None = None
        self._waiters: list[Deferred[None]] = []
        self._bound: IDelayedCall | None = None
        self._settling: IDelayedCall | None = None

    @property
    def in_flight(self) -> int:
        """Runs and tunnels active on every session now."""
        return len(self._work)

    def gate(self, session: NodeSession) -> SessionGate:
        """``session``'s gate, forgotten when the session closes."""
        gate = SessionGate(self, session, refuse_at_once=self.draining)
        self._gates.append(gate)
        session.when_closed().addCallback(lambda _: self._forget(gate))
        return gate

    def begin(self) -> Deferred[None]:
        """
        Start draining (once; again, the same end): fires once no work is in flight, or at the
        bound. With ``timeout_sec`` 0, fires at once.
        """
        if self.draining:
            return self.when_drained()
        self.draining = True
        self.since = self._clock.seconds()
        ended = self.when_drained()
        if self.timeout_sec <= 0:
            self._finish()
            return ended
        deadline_ms = int((self._wall() + self.timeout_sec) * 1000)
        told = [gate for gate in self._gates if gate.told and not gate.session.closed]
        self.log.info(
            "node draining: no new work; {in_flight} run(s)/tunnel(s) in flight may finish"
            " within {timeout} s (drain_timeout_sec); telling {told} edge session(s)",
            in_flight=self.in_flight,
            timeout=self.timeout_sec,
            told=len(told),
        )
        for gate in told:
            gate.announce(deadline_ms)
        if not self._work:
            self._finish()
        else:
            self._bound = self._clock.callLater(self.timeout_sec, self._at_bound)
        return ended

    def when_drained(self) -> Deferred[None]:
        """A new Deferred, fired once the drain has ended (never, if it does not begin)."""
        if self.drained:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    # -- the work in flight -----------------------------------------------------------------

    def _entered(self, work: object) -> None:
        self._work[id(work)] = work

    def _left(self, work: object) -> None:
        if self._work.pop(id(work), None) is None:
            return
        if self.draining and not self._work and not self.drained and self._settling is None:
            # On the next turn: the work leaves its table before its last message is sent,
            # and the sessions must close after that message, not before.
            self._settling = self._clock.callLater(0, self._settle)

    def _settle(self) -> None:
        self._settling = None
        if not self._work and not self.drained:
            self.log.info("node drained: the last work in flight has ended")
            self._finish()

    def _forget(self, gate: SessionGate) -> None:
        if gate in self._gates:
            self._gates.remove(gate)

    def _at_bound(self) -> None:
        self._bound = None
        self.log.warn(
            "drain bound of {timeout} s (drain_timeout_sec) reached: closing the sessions cuts"
            " {in_flight} run(s)/tunnel(s) still in flight",
            timeout=self.timeout_sec,
            in_flight=self.in_flight,
        )
        self._finish()

    def _finish(self) -> None:
        for pending in (self._bound, self._settling):
            if pending is not None and pending.active():
                pending.cancel()
        self._bound = self._settling = None
        if self.drained:
            return
        self.drained = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
