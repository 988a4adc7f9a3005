# -*- test-case-name: iop.test.edge.test_queue -*-
"""
Waiting for a provider: the FIFO of pending acquires, per-model-group limits, queue timeouts and
the pump's mechanics.

This module decides *when* a waiter is looked at and how its outcome reaches it; *what* a waiter
gets (a lease, an error, or nothing yet) is decided by the caller's ``decide`` function
(:class:`iop.edge.pool.ProviderPool`). It knows nothing about providers beyond the two limit
rules below.

Limits of a model group
-----------------------
Both are computed when a request is about to queue, from the providers of the model group that are
*enabled* at that moment (the live enabled toggle counts; node connectivity does not, so a node
that comes and goes does not make the limits flap):

- queue limit = the sum of ``max_queue`` over those providers, where a provider's
  ``max_queue == 0`` counts as :data:`DEFAULT_MAX_QUEUE` (100). When the group already has that
  many waiters the request fails ``Overloaded`` at once; nothing is dropped silently.
- queue timeout = the largest ``queue_timeout_sec`` among those providers, where ``0`` counts as
  :data:`DEFAULT_QUEUE_TIMEOUT_SEC` (60 s). A waiter still waiting then fails ``QueueTimeout``
  (on the injected clock). The timeout is fixed per waiter when it queues.

Pump
----
:meth:`WaitQueue.settle` makes one pass over every waiter in arrival order (FIFO across all model
groups). A waiter the decision leaves waiting is skipped, so a later waiter for other providers may
proceed; with a ``group`` function, a waiter whose group a decision of this pass found full is
skipped without asking (one question per group and pass, not one per waiter). All decisions of a
pass are made, and the queue updated, before any outcome is delivered: no caller code runs inside
a pass, so a callback that releases, acquires or cancels re-entrantly sees a settled queue. A
decided outcome whose Deferred has meanwhile been cancelled is handed to ``discard`` (the pool
releases the lease), so a granted lease never leaks.

A decision may also answer later (a Deferred: a lease table on another server). The pass then
delivers what it has decided so far and waits for that answer before it asks about the next
waiter: one question at a time, in arrival order. A ``settle`` meanwhile asks for one more pass
after this one instead of starting its own. A waiter that leaves (cancelled, timed out) while
its answer is awaited gets nothing; a lease answered for it is discarded. A decision that
answers at once — every decision of the in-process table — costs no Deferred.

Counting
--------
Every request the pool is asked for ends in exactly one outcome of :data:`QUEUE_OUTCOMES`,
counted in :class:`QueueStats` per model key by whoever decides it: the pool for what it decides
at once (a lease, ``unavailable``, ``overloaded``), this queue for its waiters (``served`` when a
lease is delivered, ``timeout``, ``withdrawn`` when the caller cancelled — also when it cancelled
after the decision but before delivery, the lease then being discarded — and whatever the pump's
decision names). ``entered`` counts the requests that waited. Plain ints, read by the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.config.model import ProviderConfig

_log = Logger()

DEFAULT_MAX_QUEUE = 100
DEFAULT_QUEUE_TIMEOUT_SEC = 60.0

T = TypeVar("T")

# How a request for a lease ends: a lease (at once or after waiting), no live candidate, the
# queue timeout, the queue limit, or the caller left while it waited.
QUEUE_OUTCOMES = ("served", "unavailable", "timeout", "overloaded", "withdrawn")


@dataclass
class QueueStats:
    """
    Per model key: how many requests waited in the queue (``entered``) and how every request
    ended (``outcomes[(model_id, outcome)]``, outcome one of :data:`QUEUE_OUTCOMES`).
    """

    entered: dict[str, int] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, model_id: str, outcome: str) -> None:
        key = (model_id, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def enter(self, model_id: str) -> None:
        self.entered[model_id] = self.entered.get(model_id, 0) + 1


def queue_limit(providers: Iterable[ProviderConfig]) -> int:
    """A model group's queue limit: sum of ``max_queue`` (0 → :data:`DEFAULT_MAX_QUEUE`)."""
    return sum(p.max_queue if p.max_queue > 0 else DEFAULT_MAX_QUEUE for p in providers)


def queue_timeout(providers: Iterable[ProviderConfig]) -> float:
    """
    A model group's queue timeout: max of ``queue_timeout_sec`` (0 →
    :data:`DEFAULT_QUEUE_TIMEOUT_SEC`); the default when there are no providers.
    """
    return max(
        (
            p.queue_timeout_sec if p.queue_timeout_sec > 0 else DEFAULT_QUEUE_TIMEOUT_SEC
            for p in providers
        ),
        default=DEFAULT_QUEUE_TIMEOUT_SEC,
    )


@dataclass(eq=False)
class Waiter(Generic[T]):
    """One pending acquire."""

    seq: int
    model_id: str
    prompt_tokens: int
    timeout: float
    enqueued_at: float
    deferred: Deferred[T] = field(repr=False)
    timer: IDelayedCall | None = field(default=None, repr=False)


# What a pump's decision gives a waiter: a result, an error, or None (keep waiting); at once or,
# as a Deferred, later.
Decide: TypeAlias = Callable[
    [Waiter[T]], T | BaseException | Deferred[T | BaseException | None] | None
]


@dataclass(eq=False)
class _Pass(Generic[T]):
    """One pump pass: what it asks, the waiters it has still to look at, the groups it found
    full, and what it has decided and not yet delivered."""

    decide: Decide[T]
    group: Callable[[Waiter[T]], Hashable] | None
    waiters: Iterator[Waiter[T]]
    full: set[Hashable] = field(default_factory=set)
    decided: list[tuple[Waiter[T], T | BaseException]] = field(default_factory=list)


class WaitQueue(Generic[T]):
    """
    Pending acquires in arrival order, each with its own timeout timer and a cancellable Deferred.

    :param expired: builds the exception a waiter fails with when its timeout passes.
    :param discard: disposes of a decided result nobody can receive any more (its Deferred was
        cancelled between decision and delivery).
    :param failure_outcome: the :data:`QUEUE_OUTCOMES` name of an error the pump decided.
    :param stats: where outcomes are counted (the pool shares its own).
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        expired: Callable[[Waiter[T]], BaseException],
        discard: Callable[[T], None],
        failure_outcome: Callable[[BaseException], str] = lambda e: "unavailable",
        stats: QueueStats | None = None,
    ) -> None:
        self._clock = clock
        self._expired = expired
        self._discard = discard
        self._failure_outcome = failure_outcome
        self.stats = stats if stats is not None else QueueStats()
        self._waiters: dict[int, Waiter[T]] = {}
        self._per_model: dict[str, int] = {}
        self._seq = 0
        # A pass waiting for a decision that answers later, and the pass asked for meanwhile
        # (made when it starts: it sees the waiters queued until then).
        self._asking: _Pass[T] | None = None
        self._again: tuple[Decide[T], Callable[[Waiter[T]], Hashable] | None] | None = None

    def __len__(self) -> int:
        return len(self._waiters)

    def __iter__(self) -> Iterator[Waiter[T]]:
        """The waiters in arrival order (a snapshot: safe to change the queue meanwhile)."""
        return iter(list(self._waiters.values()))

    def waiting(self, model_id: str) -> int:
        """How many waiters the model group ``model_id`` has."""
        return self._per_model.get(model_id, 0)

    def by_model(self) -> dict[str, int]:
        """How many waiters each model group has now (groups without any left out)."""
        return dict(self._per_model)

    def enqueue(self, model_id: str, prompt_tokens: int, timeout: float) -> Deferred[T]:
        """
        Queue a waiter that fails with ``expired(waiter)`` after ``timeout`` seconds. Cancelling
        the returned Deferred removes the waiter and its timer.
        """
        self._seq += 1
        seq = self._seq

        def cancel(d: Deferred[T]) -> None:
            waiter = self._waiters.get(seq)
            if waiter is not None:
                self._remove(waiter)
                self.stats.count(waiter.model_id, "withdrawn")

        d: Deferred[T] = Deferred(cancel)
        waiter = Waiter(seq, model_id, prompt_tokens, timeout, self._clock.seconds(), d)
        self._waiters[seq] = waiter
        self._per_model[model_id] = self._per_model.get(model_id, 0) + 1
        self.stats.enter(model_id)
        waiter.timer = self._clock.callLater(timeout, self._expire, seq)
        return d

    def settle(
        self, decide: Decide[T], group: Callable[[Waiter[T]], Hashable] | None = None
    ) -> None:
        """
        The pump: one FIFO pass asking ``decide`` about every waiter (``None`` = keep waiting),
        then deliver every decided outcome. ``group(waiter)``: waiters of one group that a
        decision of this pass found full are skipped. While a pass waits for a decision that
        answers later, this only asks for another pass after it.
        """
        if not self._waiters:
            return
        if self._asking is not None:
            self._again = (decide, group)
            return
        self._go_on(self._pass(decide, group))

    def holds(self, waiter: Waiter[T]) -> bool:
        """Whether ``waiter`` is still waiting (not served, failed, timed out or withdrawn)."""
        return self._waiters.get(waiter.seq) is waiter

    # -- the pass ----------------------------------------------------------------------------

    def _go_on(self, run: _Pass[T]) -> None:
        """Go on with ``run`` (and the passes asked for meanwhile) until done or until a
        decision answers later."""
        while True:
            for waiter in run.waiters:
                if not self.holds(waiter):
                    continue
                # A waiter's group matters once the pass has found one full.
                key = run.group(waiter) if run.full and run.group is not None else None
                if key is not None and key in run.full:
                    continue
                decision = run.decide(waiter)
                if isinstance(decision, Deferred):
                    answered, outcome = self._wait(run, waiter, decision)
                    if not answered:
                        return
                else:
                    outcome = decision
                self._take(run, waiter, outcome)
            self._deliver_decided(run)
            again, self._again = self._again, None
            if again is None:
                return
            run = self._pass(*again)

    def _pass(self, decide: Decide[T], group: Callable[[Waiter[T]], Hashable] | None) -> _Pass[T]:
        """A pass over the waiters as they are now, in arrival order."""
        return _Pass(decide, group, iter(list(self._waiters.values())))

    def _wait(
        self,
        run: _Pass[T],
        waiter: Waiter[T],
        pending: Deferred[T | BaseException | None],
    ) -> tuple[bool, T | BaseException | None]:
        """
        ``(True, answer)`` if ``pending`` has its answer already; else ``(False, None)``, after
        delivering what ``run`` has decided so far: the answer then goes on with the pass.
        """
        now: list[T | BaseException | None] = []
        later = False

        def answered(result: T | BaseException | Failure | None) -> None:
            outcome = result.value if isinstance(result, Failure) else result
            if not later:
                now.append(outcome)
                return
            self._asking = None
            try:
                self._take(run, waiter, outcome)
                self._go_on(run)
            except Exception:
                _log.failure("the queue's pump failed")

        pending.addBoth(answered)
        if now:
            return True, now[0]
        later = True
        self._asking = run
        self._deliver_decided(run)
        return False, None

    def _take(self, run: _Pass[T], waiter: Waiter[T], outcome: T | BaseException | None) -> None:
        """Note ``outcome`` for ``waiter``: its group full, or decided (delivered at the end of
        the pass); a waiter gone while its answer was awaited cannot take it."""
        if outcome is None:
            if run.group is not None:
                run.full.add(run.group(waiter))
            return
        if not self.holds(waiter):
            if not isinstance(outcome, BaseException):
                self._discard(outcome)
            return
        self._remove(waiter)
        run.decided.append((waiter, outcome))

    def _deliver_decided(self, run: _Pass[T]) -> None:
        decided, run.decided = run.decided, []
        for waiter, outcome in decided:
            self._deliver(waiter, outcome)

    # -- helpers -----------------------------------------------------------------------------

    def _remove(self, waiter: Waiter[T]) -> None:
        del self._waiters[waiter.seq]
        left = self._per_model[waiter.model_id] - 1
        if left:
            self._per_model[waiter.model_id] = left
        else:
            del self._per_model[waiter.model_id]
        timer, waiter.timer = waiter.timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self, seq: int) -> None:
        waiter = self._waiters.get(seq)
        if waiter is None:
            return
        waiter.timer = None
        self._remove(waiter)
        self._deliver(waiter, self._expired(waiter), "timeout")

    def _deliver(
        self, waiter: Waiter[T], outcome: T | BaseException, name: str | None = None
    ) -> None:
        d = waiter.deferred
        if d.called:
            # Cancelled after the decision, before delivery: the caller left.
            self.stats.count(waiter.model_id, "withdrawn")
            if not isinstance(outcome, BaseException):
                self._discard(outcome)
        elif isinstance(outcome, BaseException):
            self.stats.count(waiter.model_id, name or self._failure_outcome(outcome))
            d.errback(outcome)
        else:
            self.stats.count(waiter.model_id, "served")
            d.callback(outcome)


__all__ = [
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_QUEUE_TIMEOUT_SEC",
    "QUEUE_OUTCOMES",
    "Decide",
    "QueueStats",
    "WaitQueue",
    "Waiter",
    "queue_limit",
    "queue_timeout",
]
