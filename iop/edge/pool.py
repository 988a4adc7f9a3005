# -*- test-case-name: iop.test.edge.test_pool,iop.test.edge.refresh.test_apply -*-
"""
The Edge provider pool: the ``models[]`` catalog, live candidates, selection and capacity leases.

:class:`ProviderPool` is the one public entry. It is pure logic (no I/O; time comes from the
injected clock) and is driven synchronously by the node registry as an
:class:`~iop.edge.interfaces.INodeLifecycleObserver`, by the dispatcher through :meth:`acquire` and
:meth:`Lease.release`, and by config refresh through :meth:`ProviderPool.plan`,
:meth:`~ProviderPool.switch` and :meth:`~ProviderPool.pump` (or the single toggle
:meth:`ProviderPool.set_enabled`). Waiting is delegated to :mod:`iop.edge.queue`, whose
docstring states the per-model-group queue limit and timeout rules.

Candidates
    A model key's candidates are its ``ModelProviderRef``\\ s whose provider is enabled and whose
    node's active generation is dispatch-ready ("live"). Leases are keyed by
    ``node_id + provider_id``: every model key pointing at one provider shares its capacity.

Long context
    A request is long for provider P when ``P.long_context_threshold > 0`` and
    ``prompt_tokens >= P.long_context_threshold`` (threshold 0 = never long). A long request holds
    one normal slot *and* one long slot. ``long_capacity`` caps concurrent long requests on P;
    ``long_capacity == 0`` means there is no separate long cap and only ``capacity`` applies.
    P has room for a request when ``in_flight < capacity`` and (the request is not long, or
    ``long_capacity == 0``, or ``long_in_flight < long_capacity``).

Selection
    Among live candidates with room: the lowest ``in_flight``; ties → the lower ``priority``
    number; ties → round-robin per model key, rotating through the tied candidates in config order
    starting after the one this key chose last (so repeated acquire/release cycles alternate
    between equals).

Queue
    No candidate with room → the request waits (FIFO across all model groups). Releases, node
    ready and enabling a provider pump the waiters in arrival order. No live candidate at all →
    ``Unavailable`` at once, also for waiters when a fence or a disable removes their last live
    candidate (not at queue timeout).

Live reconfiguration
    A refreshed config's catalog is prepared first (:meth:`ProviderPool.plan`: same nodes and
    provider ids, else ``ValueError`` and nothing changes), switched in one step
    (:meth:`~ProviderPool.switch`, which returns the plan back) and only then are the waiters
    re-evaluated (:meth:`~ProviderPool.pump`), so the caller can switch its other parts in
    between and every grant after the pump sees all of it. Live: ``capacity``,
    ``long_capacity``, ``long_context_threshold``, ``priority``, ``max_queue``,
    ``queue_timeout_sec``, ``enabled`` and every ``models[]`` provider list (with its targets).
    Held leases finish where they are: a capacity lowered below ``in_flight`` grants nothing
    until releases bring it below; a lease keeps the long slot it was granted with. Queue limit
    and timeout changes apply to waiters that queue afterwards.

Generations
    Only the node's active generation's fence changes anything: its leases are returned exactly
    once, its providers go offline, every waiter is re-evaluated. A new ready generation starts
    with zero occupancy. Stale callbacks (an old generation's ready or fence) and the release of a
    lease whose generation was fenced change nothing.

Counting (:meth:`ProviderPool.stats`)
    Per provider: leases granted, and leases returned, each exactly once, either ``released``
    by their holder or ``fenced`` (returned by the fence of their generation; a later release
    of such a lease counts nothing). So grants minus releases is the provider's held leases at any
    moment. Per model key: how every request ended (:data:`~iop.edge.queue.QUEUE_OUTCOMES`) and
    how many of them waited in the queue; a request for an unknown model id counts nowhere (its
    id is the client's, not the config's). Plain ints, read by the metrics at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.config.model import EdgeConfig, ModelProviderRef, ProviderConfig
from iop.edge.errors import Overloaded, PoolError, QueueTimeout, Unavailable, UnknownModel
from iop.edge.interfaces import INodeLifecycleObserver
from iop.edge.queue import (
    QUEUE_OUTCOMES,
    QueueStats,
    Waiter,
    WaitQueue,
    queue_limit,
    queue_timeout,
)

_log = Logger()

# ---------------------------------------------------------------------------------------------
# Leases


@dataclass
class _LeaseState:
    released: bool = False
    fenced: bool = False
    lost: bool = False
    on_lost: list[Callable[[], object]] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Lease:
    """
    One held slot (or, for a long request, one normal plus one long slot) on
    ``node_id + provider_id`` in connection generation ``generation``.

    :meth:`release` is idempotent: only the first call frees the slot(s) and pumps the queue. If
    the generation was fenced first, the fence already returned the slot(s) and release changes
    nothing. Identity is the object: two leases are never equal.
    """

    provider_id: str
    node_id: str
    generation: int
    # The adapter instance on the node (``ProviderConfig.adapter_instance``).
    adapter: str
    # The served target for this model key (``ModelProviderRef.target``).
    target: str
    model_id: str
    provider_type: str
    category: str
    usage_attribution: str
    long: bool
    _on_release: Callable[[Lease], None] = field(repr=False)
    _state: _LeaseState = field(default_factory=_LeaseState, repr=False)
    # In a cluster: the lease's id in the shared lease table ("" for an Edge alone).
    lease_id: str = ""

    @property
    def released(self) -> bool:
        """``release()`` has been called."""
        return self._state.released

    @property
    def fenced(self) -> bool:
        """The node's generation was fenced while this lease was held (slot already returned)."""
        return self._state.fenced

    @property
    def lost(self) -> bool:
        """The pool could no longer vouch for this lease's slot (see :meth:`when_lost`)."""
        return self._state.lost

    def when_lost(self, callback: Callable[[], object]) -> None:
        """
        Call ``callback`` if the pool loses this lease's slot while it is held: in a cluster,
        when its renewal could not be confirmed before it would expire (the holder must end
        its work: the slot is free for others). At once if already lost; never for an Edge
        alone.
        """
        if self._state.lost:
            callback()
        elif not self._state.released:
            self._state.on_lost.append(callback)

    def release(self) -> None:
        if self._state.released:
            return
        self._state.released = True
        self._state.on_lost.clear()
        self._on_release(self)

    def lose(self) -> None:
        """The pool's side of :meth:`when_lost`: run the callbacks once."""
        if self._state.lost or self._state.released:
            return
        self._state.lost = True
        callbacks, self._state.on_lost = self._state.on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _log.failure("a lost lease's callback failed")


# ---------------------------------------------------------------------------------------------
# Catalog and live state


def is_long(provider: ProviderConfig, prompt_tokens: int) -> bool:
    """Whether a request of ``prompt_tokens`` is long-context for ``provider``."""
    threshold = provider.long_context_threshold
    return threshold > 0 and prompt_tokens >= threshold


class _Resource:
    """Live state of one configured provider: enabled toggle, active generation, leases."""

    def __init__(self, node_id: str, config: ProviderConfig) -> None:
        self.node_id = node_id
        self.config = config
        self.enabled = config.enabled
        self.generation: int | None = None
        self.leases: set[Lease] = set()
        self.long_in_flight = 0
        # Model keys that list this provider.
        self.models: set[str] = set()
        # Leases granted; returned by their holder; returned by a fence.
        self.grants = 0
        self.released = 0
        self.fenced = 0

    @property
    def provider_id(self) -> str:
        return self.config.id

    @property
    def in_flight(self) -> int:
        return len(self.leases)

    @property
    def live(self) -> bool:
        return self.enabled and self.generation is not None

    def is_long(self, prompt_tokens: int) -> bool:
        return is_long(self.config, prompt_tokens)

    def has_room(self, long: bool) -> bool:
        if self.in_flight >= self.config.capacity:
            return False
        cap = self.config.long_capacity
        return not long or cap == 0 or self.long_in_flight < cap

    def hold(self, lease: Lease) -> None:
        self.grants += 1
        self.leases.add(lease)
        if lease.long:
            self.long_in_flight += 1

    def drop(self, lease: Lease) -> bool:
        """Free ``lease``'s slot(s) if it still holds them; whether it did."""
        if lease not in self.leases:
            return False
        self.leases.remove(lease)
        self.released += 1
        if lease.long:
            self.long_in_flight -= 1
        return True

    def fence(self) -> int:
        """Go offline, returning every held lease exactly once; how many."""
        returned = len(self.leases)
        self.fenced += returned
        for lease in self.leases:
            lease._state.fenced = True
        self.leases.clear()
        self.long_in_flight = 0
        self.generation = None
        return returned


@dataclass(frozen=True)
class _Candidate:
    ref: ModelProviderRef
    resource: _Resource
    # Position in the model key's provider list (config order), for round-robin.
    index: int


@dataclass
class _NodeState:
    resources: list[_Resource]
    active: int | None = None
    # The highest generation this node has been made ready with; older readies are stale.
    seen: int = 0


@dataclass(frozen=True)
class PoolPlan:
    """
    A catalog the pool switches to in one step (:meth:`ProviderPool.switch`): per provider id
    its config, enabled toggle and the model keys listing it; per model key its candidates and
    round-robin position. Built by :meth:`ProviderPool.plan`; only valid for that pool.
    """

    configs: Mapping[str, ProviderConfig]
    enabled: Mapping[str, bool]
    memberships: Mapping[str, frozenset[str]]
    models: Mapping[str, tuple[_Candidate, ...]]
    rr: Mapping[str, int]


def _order(candidates: Sequence[_Candidate]) -> tuple[str, ...]:
    return tuple(c.ref.provider_id for c in candidates)


def select(
    candidates: Sequence[_Candidate], prompt_tokens: int, start: int, size: int
) -> _Candidate | None:
    """
    The candidate to lease, or None when none has room: lowest ``in_flight``, then lower
    ``priority``, then the first in config order at or after position ``start`` (cyclically over
    ``size`` positions).
    """
    best: _Candidate | None = None
    best_key: tuple[int, int, int] | None = None
    for c in candidates:
        res = c.resource
        if not res.has_room(res.is_long(prompt_tokens)):
            continue
        key = (res.in_flight, res.config.priority, (c.index - start) % size)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


LEASE_RELEASE_OUTCOMES = ("released", "fenced")


@dataclass(frozen=True)
class PoolStats:
    """
    The pool's counters at one moment (:meth:`ProviderPool.stats`), every configured provider
    and model key present (zero until something happens).

    ``lease_grants[(provider_id, node_id)]``, ``lease_releases[(provider_id, node_id,
    outcome)]`` (outcome in :data:`LEASE_RELEASE_OUTCOMES`), ``in_flight[(provider_id,
    node_id)]`` (leases held now, also while disabled), ``queue_entered[model_id]`` and
    ``queue_outcomes[(model_id, outcome)]`` (outcome in :data:`QUEUE_OUTCOMES`).
    """

    lease_grants: Mapping[tuple[str, str], int]
    lease_releases: Mapping[tuple[str, str, str], int]
    in_flight: Mapping[tuple[str, str], int]
    queue_entered: Mapping[str, int]
    queue_outcomes: Mapping[tuple[str, str], int]


_ZERO = {"in_flight": 0, "long_in_flight": 0, "queued": 0, "long_queued": 0}


# ---------------------------------------------------------------------------------------------
# The pool


@implementer(INodeLifecycleObserver)
class ProviderPool:
    """
    Provider selection, capacity leases and the wait queue for ``models[]``. See the module
    docstring for the rules.
    """

    log = Logger()

    def __init__(self, config: EdgeConfig, clock: IReactorTime) -> None:
        self._clock = clock
        self._resources: dict[str, _Resource] = {}
        self._nodes: dict[str, _NodeState] = {}
        for node in config.nodes:
            resources = [_Resource(node.id, p) for p in node.providers]
            self._nodes[node.id] = _NodeState(resources)
            for res in resources:
                self._resources[res.provider_id] = res
        self._models: dict[str, tuple[_Candidate, ...]] = {}
        # Per model key: the config position where the next round-robin tie-break starts.
        self._rr: dict[str, int] = {}
        self._queue_stats = QueueStats()
        self._queue: WaitQueue[Lease] = WaitQueue(
            clock,
            expired=self._expired,
            discard=lambda lease: lease.release(),
            failure_outcome=_outcome_name,
            stats=self._queue_stats,
        )
        self.switch(self.plan(config))

    # -- acquire -----------------------------------------------------------------------------

    def acquire(self, model_id: str, *, prompt_tokens: int = 0) -> Deferred[Lease]:
        """
        A lease on a provider of ``model_id``: at once when a live candidate has room, else after
        waiting in the queue. Fails with :class:`UnknownModel`, :class:`Unavailable`,
        :class:`Overloaded` or :class:`QueueTimeout`. Cancelling the Deferred while it waits
        withdraws the request.
        """
        candidates = self._models.get(model_id)
        if candidates is None:
            return fail(UnknownModel(model_id))
        outcome = self._decide(model_id, prompt_tokens)
        if isinstance(outcome, Lease):
            self._queue_stats.count(model_id, "served")
            return succeed(outcome)
        if outcome is not None:
            self._queue_stats.count(model_id, _outcome_name(outcome))
            self.log.info("no live provider for model {model_id}", model_id=model_id)
            return fail(outcome)
        return self._enqueue(model_id, prompt_tokens)

    def _enqueue(self, model_id: str, prompt_tokens: int) -> Deferred[Lease]:
        """Wait in the queue, or ``Overloaded`` when the model group's queue is full."""
        candidates = self._models.get(model_id, ())
        enabled = [c.resource.config for c in candidates if c.resource.enabled]
        limit = queue_limit(enabled)
        if self._queue.waiting(model_id) >= limit:
            self.log.warn(
                "queue for model {model_id} is full ({limit}): rejecting",
                model_id=model_id,
                limit=limit,
            )
            self._queue_stats.count(model_id, "overloaded")
            return fail(Overloaded(model_id, limit))
        return self._queue.enqueue(model_id, prompt_tokens, queue_timeout(enabled))

    # -- authoritative lifecycle -------------------------------------------------------------

    def node_ready(self, node_id: str, generation: int) -> None:
        node = self._nodes.get(node_id)
        if node is None:
            self.log.warn("ready for unconfigured node {node_id} ignored", node_id=node_id)
            return
        if node.active == generation:
            return
        if generation <= node.seen:
            self.log.info(
                "stale ready of node {node_id} (generation {generation}) ignored",
                node_id=node_id,
                generation=generation,
            )
            return
        node.seen = generation
        if node.active is not None:
            self._fence_node(node_id, node)
        node.active = generation
        for res in node.resources:
            res.generation = generation
        self.log.info(
            "node {node_id} providers active (generation {generation})",
            node_id=node_id,
            generation=generation,
        )
        self._pump()

    def node_fenced(self, node_id: str, generation: int) -> None:
        node = self._nodes.get(node_id)
        if node is None or node.active is None or node.active != generation:
            self.log.info(
                "stale fence of node {node_id} (generation {generation}) ignored",
                node_id=node_id,
                generation=generation,
            )
            return
        self._fence_node(node_id, node)
        self._pump()

    def set_enabled(self, provider_id: str, enabled: bool) -> None:
        """
        Live enable/disable. Disabling excludes the provider from selection at once and fails
        waiters left without a live candidate; leases it holds stay valid until released.
        Enabling pumps the queue. Raises ``KeyError`` for an unconfigured provider.
        """
        res = self._resources.get(provider_id)
        if res is None:
            raise KeyError(f"unknown provider {provider_id!r}")
        if res.enabled == enabled:
            return
        res.enabled = enabled
        self.log.info(
            "provider {provider_id} on node {node_id} {state}",
            provider_id=provider_id,
            node_id=res.node_id,
            state="enabled" if enabled else "disabled",
        )
        self._pump()

    # -- live reconfiguration (config refresh) ---------------------------------------------

    def plan(self, config: EdgeConfig) -> PoolPlan:
        """
        Prepare the switch to ``config``'s catalog without changing anything: each provider's
        new settings (capacity, long capacity and threshold, priority, queue limits, enabled)
        and the ``models[]`` candidate lists. The nodes and the provider ids under each node must
        be the ones this pool was built with (adding or removing them needs a restart): raises
        ``ValueError`` naming the difference otherwise.
        """
        nodes = {n.id: n for n in config.nodes}
        if set(nodes) != set(self._nodes):
            raise ValueError(
                f"nodes differ: running {sorted(self._nodes)}, candidate {sorted(nodes)}"
            )
        configs: dict[str, ProviderConfig] = {}
        for node_id, state in self._nodes.items():
            running = {res.provider_id for res in state.resources}
            candidate = {p.id: p for p in nodes[node_id].providers}
            if set(candidate) != running or len(candidate) != len(nodes[node_id].providers):
                raise ValueError(
                    f"node {node_id}: providers differ: running {sorted(running)}, "
                    f"candidate {sorted(p.id for p in nodes[node_id].providers)}"
                )
            configs.update(candidate)
        models: dict[str, tuple[_Candidate, ...]] = {}
        memberships: dict[str, set[str]] = {pid: set() for pid in configs}
        for model in config.models:
            candidates: list[_Candidate] = []
            for ref in model.providers:
                found = self._resources.get(ref.provider_id)
                if found is None or found.provider_id in {c.ref.provider_id for c in candidates}:
                    self.log.warn(
                        "model {model_id}: ignoring unknown or repeated provider {provider_id}",
                        model_id=model.id,
                        provider_id=ref.provider_id,
                    )
                    continue
                candidates.append(_Candidate(ref, found, len(candidates)))
                memberships[found.provider_id].add(model.id)
            models[model.id] = tuple(candidates)
        # Round-robin positions survive only where the candidate order is unchanged.
        rr = {
            model_id: start
            for model_id, start in self._rr.items()
            if model_id in models and _order(models[model_id]) == _order(self._models[model_id])
        }
        return PoolPlan(
            configs=configs,
            enabled={pid: c.enabled for pid, c in configs.items()},
            memberships={pid: frozenset(m) for pid, m in memberships.items()},
            models=models,
            rr=rr,
        )

    def switch(self, plan: PoolPlan) -> PoolPlan:
        """
        Take ``plan`` (from :meth:`plan` on this pool) as the catalog, at once and without
        failing; returns the plan that switches back. Held leases are untouched: they finish on
        the slot they hold, and a capacity lowered below ``in_flight`` grants nothing until
        releases bring it below. Nobody's outcome changes until :meth:`pump`.
        """
        undo = PoolPlan(
            configs={pid: res.config for pid, res in self._resources.items()},
            enabled={pid: res.enabled for pid, res in self._resources.items()},
            memberships={pid: frozenset(res.models) for pid, res in self._resources.items()},
            models=dict(self._models),
            rr=dict(self._rr),
        )
        for pid, res in self._resources.items():
            res.config = plan.configs[pid]
            res.enabled = plan.enabled[pid]
            res.models = set(plan.memberships[pid])
        self._models = dict(plan.models)
        self._rr = dict(plan.rr)
        return undo

    def pump(self) -> None:
        """
        Re-evaluate every waiter now, in arrival order: granted where a live candidate has
        room, ``Unavailable`` where the model has no live candidate left (a provider disabled or
        taken out of the model's list, the model removed), still waiting otherwise.
        """
        self._pump()

    # -- observation -------------------------------------------------------------------------

    def counters(self, node_id: str, provider_id: str) -> dict[str, int]:
        """
        :class:`~iop.edge.status.ProviderCounters`: lease occupancy of the provider's active
        generation and the pending requests that include it as a live candidate. All zero when
        the provider is offline, disabled or not on ``node_id``.
        """
        res = self._resources.get(provider_id)
        if res is None or res.node_id != node_id or not res.live:
            return dict(_ZERO)
        queued = long_queued = 0
        for waiter in self._queue:
            if waiter.model_id in res.models:
                queued += 1
                if res.is_long(waiter.prompt_tokens):
                    long_queued += 1
        return {
            "in_flight": res.in_flight,
            "long_in_flight": res.long_in_flight,
            "queued": queued,
            "long_queued": long_queued,
        }

    def stats(self) -> PoolStats:
        """The lease and queue counters now (see the module docstring's *Counting*)."""
        grants: dict[tuple[str, str], int] = {}
        releases: dict[tuple[str, str, str], int] = {}
        in_flight: dict[tuple[str, str], int] = {}
        for pid, res in self._resources.items():
            key = (pid, res.node_id)
            grants[key] = res.grants
            releases[(*key, "released")] = res.released
            releases[(*key, "fenced")] = res.fenced
            in_flight[key] = res.in_flight
        counted = self._queue_stats
        models = set(self._models) | set(counted.entered) | {m for m, _ in counted.outcomes}
        return PoolStats(
            lease_grants=grants,
            lease_releases=releases,
            in_flight=in_flight,
            queue_entered={m: counted.entered.get(m, 0) for m in sorted(models)},
            queue_outcomes={
                (m, o): counted.outcomes.get((m, o), 0)
                for m in sorted(models)
                for o in QUEUE_OUTCOMES
            },
        )

    def snapshot(self) -> dict[str, Any]:
        """
        For tests and debugging: every provider's raw state (``in_flight``/``long_in_flight`` are
        the held leases even while disabled; ``queued``/``long_queued`` as in :meth:`counters`)
        and the waiters in arrival order.
        """
        providers: dict[str, dict[str, Any]] = {}
        for pid, res in self._resources.items():
            live = self.counters(res.node_id, pid)
            providers[pid] = {
                "node_id": res.node_id,
                "generation": res.generation,
                "enabled": res.enabled,
                "live": res.live,
                "capacity": res.config.capacity,
                "long_capacity": res.config.long_capacity,
                "in_flight": res.in_flight,
                "long_in_flight": res.long_in_flight,
                "queued": live["queued"],
                "long_queued": live["long_queued"],
            }
        return {
            "providers": providers,
            "waiters": [
                {
                    "model_id": w.model_id,
                    "prompt_tokens": w.prompt_tokens,
                    "enqueued_at": w.enqueued_at,
                    "timeout": w.timeout,
                }
                for w in self._queue
            ],
        }

    # -- internals ---------------------------------------------------------------------------

    def _decide(self, model_id: str, prompt_tokens: int) -> Lease | PoolError | None:
        """A lease when a live candidate has room, ``Unavailable`` when none is live, else None."""
        candidates = self._models.get(model_id, ())
        live = [c for c in candidates if c.resource.live]
        if not live:
            return Unavailable(model_id)
        chosen = select(live, prompt_tokens, self._rr.get(model_id, 0), len(candidates))
        if chosen is None:
            return None
        self._rr[model_id] = (chosen.index + 1) % len(candidates)
        return self._grant(model_id, chosen, prompt_tokens)

    def _grant(
        self, model_id: str, chosen: _Candidate, prompt_tokens: int, lease_id: str = ""
    ) -> Lease:
        res = chosen.resource
        assert res.generation is not None
        lease = Lease(
            provider_id=res.provider_id,
            node_id=res.node_id,
            generation=res.generation,
            adapter=res.config.adapter_instance,
            target=chosen.ref.target,
            model_id=model_id,
            provider_type=res.config.type,
            category=res.config.category,
            usage_attribution=res.config.usage_attribution,
            long=res.is_long(prompt_tokens),
            _on_release=self._release,
            lease_id=lease_id,
        )
        res.hold(lease)
        return lease

    def _release(self, lease: Lease) -> None:
        res = self._resources[lease.provider_id]
        if not res.drop(lease):
            return
        self._pump()

    def _fence_node(self, node_id: str, node: _NodeState) -> None:
        generation = node.active
        node.active = None
        returned = sum(res.fence() for res in node.resources)
        self.log.info(
            "node {node_id} generation {generation} fenced: {returned} leases returned",
            node_id=node_id,
            generation=generation,
            returned=returned,
        )

    def _pump(self) -> None:
        self._queue.settle(lambda w: self._decide(w.model_id, w.prompt_tokens))

    def _expired(self, waiter: Waiter[Lease]) -> BaseException:
        self.log.info(
            "request for model {model_id} timed out after {timeout}s in the queue",
            model_id=waiter.model_id,
            timeout=waiter.timeout,
        )
        return QueueTimeout(waiter.model_id, waiter.timeout)


def _outcome_name(error: BaseException) -> str:
    """The :data:`~iop.edge.queue.QUEUE_OUTCOMES` name of a request's error."""
    if isinstance(error, QueueTimeout):
        return "timeout"
    if isinstance(error, Overloaded):
        return "overloaded"
    return "unavailable"


__all__ = [
    "LEASE_RELEASE_OUTCOMES",
    "Lease",
    "PoolPlan",
    "PoolStats",
    "ProviderPool",
    "is_long",
]
