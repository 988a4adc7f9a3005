# -*- test-case-name: iop.test.edge.ingress.test_drain -*-
"""
The client API's drain when the Edge stops (SIGTERM under twistd or systemd): no new work, the
work in flight finished within a bound (``edge.drain_timeout_sec``), then what is left cancelled.

:meth:`Drain.run`, in this order:

1. **The listener closes.** Connections the kernel has already completed on the listening
   socket are accepted first (they are served like any other), then the port is closed, so a
   new connection goes to another Edge sharing the port (``openai.reuse_port``,
   docs/multi-edge.md) or is refused at once (an Edge alone: nothing else can take it). What
   completes in the instant between that last accept and the close is reset by Linux, unless
   ``net.ipv4.tcp_migrate_req = 1`` moves it to another listener of the port.
2. **Connections wind down** (:meth:`~iop.edge.ingress.channel.ClientChannel.drain`): a
   kept-alive connection with no request is closed at once; a request being read or served is
   served to its end with ``Connection: close``. A request the Edge has read is never refused:
   a production user restarting Edges one by one expects no request lost, and serving it costs
   at most one answer's time, which the bound covers.
3. **Work in flight finishes**: streams, answers being collected and requests waiting in the
   pool's queue (they keep their place and are served when a slot frees, here or on another
   Edge of a cluster releasing its lease) — until every connection has closed and no handler
   runs, or ``timeout`` seconds have passed.
4. **At the bound, what is left is cut**: every remaining connection is aborted, and its work
   ends as when a client goes away — the upstream cancelled, the lease, key reservation and
   queue place released once, by the request's own ``finally`` — a queued request included
   (its client sees a connection error, which the SDKs retry, on another Edge). The drain then
   waits up to :data:`CUT_GRACE_SEC` for those handlers to end, so that the cluster's leases
   are released before the Edge leaves Redis.

It logs one line when it starts (what is in flight) and one when it is done (how long, what
was cut). The drain is polled every :data:`POLL_SEC` on the reactor's clock: connections and
handlers end in many places, and a poll needs no hook in each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from iop.edge.ingress.http import ClientSite
from iop.edge.runs import CANCEL_GRACE_SEC as RUN_CANCEL_GRACE_SEC
from iop.edge.tunnel import CANCEL_GRACE_SEC as TUNNEL_CANCEL_GRACE_SEC

__all__ = ["CUT_GRACE_SEC", "POLL_SEC", "Drain"]

# How often a drain looks at what is still in flight.
POLL_SEC = 0.05
# After the cut: how long the cancelled work gets to release what it holds — past the grace a
# cancel gives its node to answer, after which the Edge ends that work itself.
CUT_GRACE_SEC = max(RUN_CANCEL_GRACE_SEC, TUNNEL_CANCEL_GRACE_SEC) + 1.0
# Accept passes over the closing listener's queue (each takes what is there, up to Twisted's
# per-pass number); a pass that takes nothing ends them.
_ACCEPT_PASSES = 20


class Drain:
    """
    The drain of the client listener's :class:`ClientSite` (:meth:`attach`, once it exists)
    whose handlers ``active()`` counts (:attr:`~iop.edge.ingress.app.ClientApp.active`).
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, active: Callable[[], int]) -> None:
        self._clock = clock
        self._active = active
        self._site: ClientSite | None = None
        self._done: Deferred[None] | None = None
        # When the drain began (clock seconds); None while the Edge serves. /readyz and
        # /status read it.
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        """Whether the Edge is draining (it stops): its readiness route answers 503."""
        return self.since is not None

    def attach(self, site: ClientSite) -> None:
        """The client listener's site: the connections a drain winds down."""
        self._site = site

    def in_flight(self) -> tuple[int, int]:
        """``(requests being handled, open client connections)``."""
        site = self._site
        return self._active(), len(site.live) if site is not None else 0

    def run(self, timeout: float) -> Deferred[None]:
        """Drain (module docstring); fires once done. A second call shares the first's end."""
        if self._done is not None:
            return _share(self._done)
        if self.since is None:
            self.since = self._clock.seconds()
        site = self._site
        if site is None:
            # No client listener (or it never listened): nothing to drain.
            return succeed(None)
        done: Deferred[None] = Deferred()
        self._done = done
        started = self._clock.seconds()
        site.draining = True
        accepted, closed = _close_listener(site)
        for channel in list(site.live):
            channel.drain()
        requests, connections = self.in_flight()
        self.log.info(
            "draining: {requests} client requests in flight on {connections} connections "
            "({accepted} accepted from the closing listener); new connections go elsewhere; "
            "up to {timeout:g} s to finish",
            requests=requests,
            connections=connections,
            accepted=accepted,
            timeout=timeout,
        )
        state = _State(started, started + timeout, closed)
        poll = state.poll = LoopingCall(self._poll, site, state)
        poll.clock = self._clock
        poll.start(POLL_SEC, now=True).addErrback(
            lambda failure: self.log.failure("drain failed", failure)
        )
        return done

    def _poll(self, site: ClientSite, state: _State) -> None:
        now = self._clock.seconds()
        requests, connections = self.in_flight()
        if requests == 0 and connections == 0:
            self._finish(state, now, left=0)
            return
        if state.cut_at is None and now >= state.deadline:
            state.cut_at = now
            state.cut = connections
            state.cut_requests = requests
            for channel in list(site.live):
                channel.cut()
            return
        if state.cut_at is not None and now >= state.cut_at + CUT_GRACE_SEC:
            self._finish(state, now, left=requests)

    def _finish(self, state: _State, now: float, left: int) -> None:
        if state.poll is not None and state.poll.running:
            state.poll.stop()
        elapsed = now - state.started
        if state.cut_at is None:
            self.log.info("drained in {elapsed:.1f} s: every request finished", elapsed=elapsed)
        else:
            self.log.warn(
                "drained in {elapsed:.1f} s: {cut} connections ({requests} requests) still "
                "busy at the bound (edge.drain_timeout_sec) were cut, their work cancelled"
                "{left_note}",
                elapsed=elapsed,
                cut=state.cut,
                requests=state.cut_requests,
                left_note=f"; {left} handlers had not ended {CUT_GRACE_SEC:g} s later"
                if left
                else "",
            )
        done, self._done = self._done, None
        # (A later run finds nothing left and returns at once.)
        self._site = None
        if done is not None:
            # Done once the listening socket is closed too (a turn of the reactor after).
            state.closed.addBoth(lambda _: done.callback(None))


def _share(running: Deferred[None]) -> Deferred[None]:
    """A Deferred that fires when ``running`` does, leaving its result alone."""
    shared: Deferred[None] = Deferred()

    def fire(result: object) -> object:
        shared.callback(None)
        return result

    running.addBoth(fire)
    return shared


class _State:
    """One drain's progress."""

    def __init__(self, started: float, deadline: float, closed: Deferred[None]) -> None:
        self.started = started
        self.closed = closed
        self.deadline = deadline
        self.cut_at: float | None = None
        self.cut = 0
        self.cut_requests = 0
        self.poll: LoopingCall | None = None


def _close_listener(site: ClientSite) -> tuple[int, Deferred[None]]:
    """Accept what the listening port has queued, then close it: how many were accepted, and
    a Deferred that fires once the socket is closed."""
    port: Any = site.connections.port
    if port is None or not getattr(port, "connected", False):
        return 0, succeed(None)
    before = len(site.live)
    accept = getattr(port, "doRead", None)
    if accept is not None and not getattr(port, "disconnecting", False):
        for _ in range(_ACCEPT_PASSES):
            count = len(site.live)
            accept()
            if len(site.live) == count:
                break
    closing = port.stopListening()
    closed: Deferred[None] = Deferred()
    if isinstance(closing, Deferred):
        closing.addBoth(lambda _: closed.callback(None))
    else:
        closed.callback(None)
    return len(site.live) - before, closed
