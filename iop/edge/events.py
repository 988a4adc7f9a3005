# -*- test-case-name: iop.test.edge.test_events -*-
"""
In-process fanout of node lifecycle events and finished client requests to observers.

Observers only: nothing that must happen (lease return, fencing, queue settlement) rides this
bus. Each subscriber gets its own bounded queue drained on a later reactor turn, so a slow or
failing subscriber never runs inside the transport's call stack and never affects the others;
when a subscriber falls ``max_pending`` events behind, new events for it are dropped and counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from iop.runtime.events import Usage


class NodeEventKind(Enum):
    REGISTERED = "node.registered"
    REJECTED = "node.rejected"
    CONNECTED = "node.connected"
    DISCONNECTED = "node.disconnected"
    # A ready node said it stops: it takes no new work, what runs finishes (iop.node.drain).
    DRAINING = "node.draining"
    # Managed mode: the token named a node but the client certificate did not name its workload.
    IDENTITY_REJECTED = "node.identity_rejected"
    # A config refresh was pushed to a ready node: ``outcome`` is its answer (or ``timeout``).
    CONFIG_REFRESHED = "node.config_refreshed"


@dataclass(frozen=True)
class NodeEvent:
    kind: NodeEventKind
    # Empty for a rejection whose token matched no node.
    node_id: str
    reason: str = ""
    at: float = 0.0
    # IDENTITY_REJECTED: the workload name required, and the DNS names the certificate carried.
    expected: str = ""
    presented: tuple[str, ...] = ()
    # CONFIG_REFRESHED: applied, restart_required, failed or timeout (``reason`` says why).
    outcome: str = ""


#: What the metrics and the console count a request under when it named no configured model
#: (``RequestFinished.model`` is ""): none named, a body that could not be read, a model the Edge
#: does not have, or a route without a model (``GET /v1/models``). A named bucket rather than an
#: empty label, so that a per-model alert or panel sees these requests too.
NO_MODEL = "(none)"


@dataclass(frozen=True)
class RequestFinished:
    """
    One client request ended (its response finished, or its client went away, and its handler
    returned): what it asked, where it ran, how it ended, what it used and how long it took.
    Published exactly once per request on the client API (the admin API's runs are not), by
    :class:`iop.edge.ingress.record.RequestRecord`.

    Every string is from a bounded set, so it may be a metric label: ``surface`` (``openai``,
    ``anthropic``, ``admin``); ``operation`` (``chat``, ``responses``, ``messages``,
    ``count_tokens``, ``models``, ``run``, ``tunnel``, ``unrouted``); ``model``, ``provider_id``,
    ``node_id``, ``target`` from the config (``model`` is set as soon as the request named a
    configured model or direct route, so a request refused after that — by its key's scope, a
    limit, a bad field, no node for its route — counts under its model; the others are "" until
    placed — a client's unknown model name never appears: :data:`NO_MODEL`); ``outcome``:
    ``complete``, ``error``, ``cancelled`` (the work was cancelled, e.g. the client left) or
    ``refused`` (no work was sent: a 4xx/5xx before placement or dispatch); ``error_code``: the
    error's machine code in the surface's error body ("" on success; codes are IOP's own
    vocabulary).
    ``status`` is the HTTP status sent (0 when the client left before any status was sent).

    Times are seconds: ``duration`` from the request's arrival at the handler to its end;
    ``time_to_first_token`` from arrival to the first body byte of a streamed answer (None
    unless streamed); ``queue_wait`` from asking the pool for a provider to getting one (None
    when never placed, 0.0 when placed at once); ``usage`` as the provider reported it (None when
    it reported nothing; never estimated).

    ``key`` and ``team`` name the client key the request authenticated with and its team (from
    the config, so bounded too; "" when unauthenticated or auth is off); ``cost_micros`` is what
    the reported usage cost at the model's price (micro-units of ``usage.currency``; None when
    either is unknown).

    ``request_id`` is the request's id (:mod:`iop.runtime.requestid`), the one its answer and
    every other record of it carry: a client's own, so never a metric label.
    """

    surface: str
    operation: str
    status: int
    outcome: str
    duration: float
    model: str = ""
    provider_id: str = ""
    node_id: str = ""
    target: str = ""
    usage_attribution: str = ""
    error_code: str = ""
    stream: bool = False
    usage: Usage | None = None
    time_to_first_token: float | None = None
    queue_wait: float | None = None
    at: float = 0.0
    key: str = ""
    team: str = ""
    cost_micros: int | None = None
    # The request's id (iop.runtime.requestid): unbounded, so never a metric label.
    request_id: str = ""
    # Traces (iop.telemetry): the request's trace id (32 hex digits; "" when not traced), for
    # the metrics' exemplars and the access log, and its Edge server span's id (16 hex digits)
    # for the access log; and the Edge→provider leg, dispatch to the end of the work on the
    # node (None when not dispatched, or it never ended), for gen_ai.client.operation.duration.
    trace_id: str = ""
    provider_duration: float | None = None
    span_id: str = ""
    kind: str = "request.finished"


BusEvent = NodeEvent | RequestFinished
# A subscriber receives every event published (NodeEvent and RequestFinished alike); one that wants
# a single kind filters with isinstance.
Subscriber = Callable[[Any], object]


@dataclass
class _Subscription:
    callback: Subscriber
    pending: deque[BusEvent] = field(default_factory=deque)
    dropped: int = 0
    active: bool = True


class EventBus:
    log = Logger()

    def __init__(self, clock: IReactorTime, max_pending: int = 1000) -> None:
        self._clock = clock
        self._max_pending = max_pending
        self._subscriptions: list[_Subscription] = []
        # One delivery call per reactor turn for all subscribers (None: nothing pending).
        self._scheduled: IDelayedCall | None = None

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Add an observer; returns a function that removes it."""
        sub = _Subscription(callback)
        self._subscriptions.append(sub)

        def unsubscribe() -> None:
            sub.active = False
            sub.pending.clear()
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)
            if not self._subscriptions and self._scheduled is not None:
                if self._scheduled.active():
                    self._scheduled.cancel()
                self._scheduled = None

        return unsubscribe

    def publish(self, event: BusEvent) -> None:
        for sub in self._subscriptions:
            if len(sub.pending) >= self._max_pending:
                sub.dropped += 1
                continue
            sub.pending.append(event)
            if self._scheduled is None:
                self._scheduled = self._clock.callLater(0, self._drain_all)

    def dropped(self) -> int:
        return sum(s.dropped for s in self._subscriptions)

    def _drain_all(self) -> None:
        self._scheduled = None
        for sub in list(self._subscriptions):
            self._drain(sub)

    def _drain(self, sub: _Subscription) -> None:
        while sub.active and sub.pending:
            event = sub.pending.popleft()
            try:
                sub.callback(event)
            except Exception:
                kind = event.kind if not isinstance(event, NodeEvent) else event.kind.value
                self.log.failure("event subscriber failed on {kind}", kind=kind)
