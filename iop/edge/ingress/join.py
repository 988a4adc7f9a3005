# -*- test-case-name: iop.test.edge.ingress.test_join -*-
"""
When an Edge sharing its client port (``openai.reuse_port``) joins it: once every node of its
config is ready on it, or :data:`JOIN_WAIT_SEC` after it started, whichever comes first.

The other half of a rolling restart (the first is the drain, :mod:`.drain`): the kernel gives a
listening socket of a ``SO_REUSEPORT`` group its share of new connections the moment it
listens, and an Edge just started has no node yet — its share would be answered 503
``node_unavailable`` while the nodes redial (up to their ``reconnect.interval_sec``, 10 s by
default). So the Edge binds the port at start (a port held without ``reuse_port`` is still a
startup error at once) and listens only when :class:`JoinGate` opens; meanwhile the Edges
already serving take every connection. An Edge alone on its port (no ``reuse_port``) listens at
once as before: there is no one else to serve, and a quick 503 is better than a refused
connection. The bound keeps a node that stays away (down, or removed from its config on the
other Edges) from keeping the Edge out of the port for good.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.edge.interfaces import INodeLifecycleObserver

__all__ = ["JOIN_WAIT_SEC", "JoinGate"]

# The longest an Edge waits for its nodes before it joins the shared client port anyway: past a
# node's default reconnect interval (10 s), with room for its registration.
JOIN_WAIT_SEC = 20.0


@implementer(INodeLifecycleObserver)
class JoinGate:
    """
    Opens once every node of ``node_ids`` is ready (a node-lifecycle observer of the registry)
    or ``wait_sec`` after the first :meth:`wait`; :meth:`wait` fires then (at once after).
    """

    log = Logger()

    def __init__(
        self, node_ids: Iterable[str], clock: IReactorTime, wait_sec: float = JOIN_WAIT_SEC
    ) -> None:
        self._expected = frozenset(node_ids)
        self._ready: set[str] = set()
        self._clock = clock
        self._wait_sec = wait_sec
        self._waiters: list[Deferred[None]] = []
        self._timer: IDelayedCall | None = None
        self._started_at: float | None = None
        self.open = False

    def wait(self) -> Deferred[None]:
        """A Deferred that fires when the gate opens (cancellable: the Edge stopped first)."""
        if self.open:
            return succeed(None)
        waiter: Deferred[None] = Deferred(lambda d: self._forget(d))
        self._waiters.append(waiter)
        if self._started_at is None:
            self._started_at = self._clock.seconds()
            self._timer = self._clock.callLater(self._wait_sec, self._open, "bound")
            self._check()
        return waiter

    def _forget(self, waiter: Deferred[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def node_ready(self, node_id: str, generation: int) -> None:
        self._ready.add(node_id)
        self._check()

    def node_fenced(self, node_id: str, generation: int) -> None:
        self._ready.discard(node_id)

    def _check(self) -> None:
        if not self.open and self._started_at is not None and self._expected <= self._ready:
            self._open("ready")

    def _open(self, why: str) -> None:
        if self.open:
            return
        self.open = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        waited = self._clock.seconds() - (self._started_at or 0.0)
        ready, expected = len(self._ready & self._expected), len(self._expected)
        if why == "ready":
            self.log.info(
                "joining the shared client port: all {expected} nodes ready after {waited:.1f} s",
                expected=expected,
                waited=waited,
            )
        else:
            self.log.warn(
                "joining the shared client port after {waited:.1f} s with {ready} of {expected} "
                "nodes ready (the others have not registered here yet)",
                ready=ready,
                expected=expected,
                waited=waited,
            )
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
