# -*- test-case-name: iop.test.edge.test_pool,iop.test.edge.test_pool_properties -*-
"""
The Edge provider pool: the ``models[]`` catalog, live candidates, the wait queue, capacity
leases and their counting — every slot granted by a lease table.

:class:`ProviderPool` is the one public entry. It is driven synchronously by the node registry
as an :class:`~iop.edge.interfaces.INodeLifecycleObserver`, by the dispatcher through
:meth:`acquire` and :meth:`Lease.release`, and by config refresh through
:meth:`ProviderPool.plan`, :meth:`~ProviderPool.switch` and :meth:`~ProviderPool.pump` (or the
single toggle :meth:`ProviderPool.set_enabled`); time comes from the injected clock. Waiting is
delegated to :mod:`iop.edge.queue`, whose docstring states the per-model-group queue limit and
timeout rules and the pump's mechanics.

The table (:mod:`iop.edge.leasetable`)
    Which live candidate gets a slot, if any, is the table's answer
    (:class:`~iop.edge.leasetable.ILeaseTable`), and so is how long a granted slot stays its
    holder's. An Edge alone has the :class:`~iop.edge.leasetable.InProcessTable` (the pool's
    own occupancy, answering at once: pure logic, no I/O, no Deferred per grant); an Edge of a
    cluster has :class:`~iop.edge.cluster.table.ClusterLeaseTable` (the shared table on Redis,
    answering later). The selection rule and the long-context rule are stated in
    :mod:`iop.edge.leasetable`. Everything below holds for both.

Candidates
    A model key's candidates are its ``ModelProviderRef``\\ s whose provider is enabled and whose
    node's active generation is dispatch-ready ("live"). Leases are keyed by
    ``node_id + provider_id``: every model key pointing at one provider shares its capacity. A
    long request holds one normal slot *and* one long slot.

Queue
    No candidate with room → the request waits (FIFO across all model groups). Releases, node
    ready and enabling a provider pump the waiters in arrival order (and, with a shared table,
    whatever the table says may have freed a slot elsewhere; a new request then also queues
    behind the waiters of its model key instead of overtaking them). No live candidate at all →
    ``Unavailable`` at once, also for waiters when a fence or a disable removes their last live
    candidate (not at queue timeout). A table answering later is asked one waiter at a time;
    its grant for a provider whose node went away (or came back as a new generation) or left
    the model meanwhile is returned and the table asked again (at most
    :data:`MAX_STALE_GRANTS` times).

Live reconfiguration
    A refreshed config's catalog is prepared first (:meth:`ProviderPool.plan`: the same nodes,
    else ``ValueError`` and nothing changes), switched in one step (:meth:`~ProviderPool.switch`,
    which returns the plan back) and only then are the waiters re-evaluated
    (:meth:`~ProviderPool.pump`), so the caller can switch its other parts in between and every
    grant after the pump sees all of it. Live: ``capacity``, ``long_capacity``,
    ``long_context_threshold``, ``priority``, ``max_queue``, ``queue_timeout_sec``, ``enabled``,
    every ``models[]`` provider list (with its targets) and the providers under each node.
    Held leases finish where they are: a capacity lowered below ``in_flight`` grants nothing
    until releases bring it below; a lease keeps the long slot it was granted with. Queue limit
    and timeout changes apply to waiters that queue afterwards.

Providers added and removed
    A provider added under a node is a candidate at once if its node is ready (it starts with
    zero occupancy in that generation), else unavailable like every provider of a node that is
    not. A removed provider is treated like a disabled one that never comes back: it takes no
    new work, and the pump moves its waiters to another live candidate or ends them
    ``Unavailable``; its held leases finish where they are. Until the last of them is returned
    (released, or fenced with its node) it stays *retiring*: its releases and fences are
    counted and returned to the table exactly once, :meth:`~ProviderPool.stats` and
    :meth:`~ProviderPool.removed` still show it; then it is forgotten. Re-added while it still
    retires (same node), it comes back with its leases and counters. A provider id the plan
    finds under another node than now (moved), or retiring on another node, is a
    ``ValueError``: leases, counters and the table's records are keyed by provider id, and one
    id on two nodes at once would mix them up.

Generations
    Only the node's active generation's fence changes anything: its leases are returned exactly
    once (to the table too), its providers go offline, every waiter is re-evaluated. A new
    ready generation starts with zero occupancy. Stale callbacks (an old generation's ready or
    fence) and the release of a lease whose generation was fenced change nothing.

Draining nodes
    A ready node that stops drains first (:meth:`ProviderPool.node_draining`, from the
    registry): its providers stop being live candidates at once, like a node not ready, but its
    generation stays active — its held leases keep counting (:meth:`~ProviderPool.counters`
    shows them) and are released by their holders, or by the fence when the node goes, exactly
    once as always. Waiters move to another live candidate at the pump; a model whose only
    candidates are on the draining node does not fail ``Unavailable``: its requests (new ones
    too) keep waiting in the queue for the node to come back. After the drained node's fence
    that expectation lasts one queue timeout (the longest ``queue_timeout_sec`` of its
    providers): a single-node deployment restarting its node loses no request that fits in the
    queue timeout, and a node stopped for good is ``Unavailable`` again after it. A plain fence
    (the node lost, not drained) keeps today's rule: no live candidate → ``Unavailable``.

Counting (:meth:`ProviderPool.stats`)
    Per provider: leases granted, and leases returned, each exactly once, either ``released``
    by their holder or ``fenced`` (returned by the fence of their generation; a later release
    of such a lease counts nothing). So grants minus releases is the provider's held leases at any
    moment. A provider a refresh removed keeps its counters while it retires and leaves the
    stats with its last lease (a series that ends; added back later, it starts from zero). Per
    model key: how every request ended (:data:`~iop.edge.queue.QUEUE_OUTCOMES`) and how many of
    them waited in the queue; a request for an unknown model id counts nowhere (its id is the
    client's, not the config's). Plain ints, read by the metrics at scrape time. In a
    cluster these are this Edge's own leases and waiters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.config.model import EdgeConfig, ProviderConfig
from iop.edge.errors import (
    Overloaded,
    PoolError,
    QueueTimeout,
    Unavailable,
    UnknownModel,
)
from iop.edge.interfaces import INodeDrainObserver, INodeLifecycleObserver
from iop.edge.leasetable import (
    Candidate,
    Granted,
    ILeaseTable,
    InProcessTable,
    IWaiters,
    Lease,
    ProviderState,
    is_long,
)
from iop.edge.queue import (
    QUEUE_OUTCOMES,
    QueueStats,
    Waiter,
    WaitQueue,
    queue_limit,
    queue_timeout,
)

# Grants a table answered late for a provider whose node went away meanwhile, before the
# request is left waiting (for the next pump).
MAX_STALE_GRANTS = 3

# What a grant comes to: a lease, an error, or None (every live candidate full).
Outcome = Lease | BaseException | None


@dataclass
class _NodeState:
    resources: list[ProviderState]
    active: int | None = None
    # The highest generation this node has been made ready with; older readies are stale.
    seen: int = 0
    # When the active generation said it drains (clock seconds); None while it serves.
    draining_since: float | None = None
    # After a drained generation's fence: until when its return is waited for (clock seconds).
    back_until: float | None = None


@dataclass(frozen=True)
class PoolPlan:
    """
    A catalog the pool switches to in one step (:meth:`ProviderPool.switch`): per node the
    providers under it (new ones made by the plan, not yet known to the pool); per provider id
    its config, enabled toggle and the model keys listing it; per model key its candidates.
    Built by :meth:`ProviderPool.plan`; only valid for that pool.
    """

    nodes: Mapping[str, tuple[ProviderState, ...]]
    configs: Mapping[str, ProviderConfig]
    enabled: Mapping[str, bool]
    memberships: Mapping[str, frozenset[str]]
    models: Mapping[str, tuple[Candidate, ...]]


LEASE_RELEASE_OUTCOMES = ("released", "fenced")


@dataclass(frozen=True)
class PoolStats:
    """
    The pool's counters at one moment (:meth:`ProviderPool.stats`), every configured provider
    (and every retiring one) and model key present (zero until something happens).

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


@implementer(INodeLifecycleObserver, INodeDrainObserver, IWaiters)
class ProviderPool:
    """
    Provider selection, capacity leases and the wait queue for ``models[]``, every slot granted
    by ``table`` (default: :class:`~iop.edge.leasetable.InProcessTable`). See the module
    docstring for the rules.
    """

    log = Logger()

    def __init__(
        self, config: EdgeConfig, clock: IReactorTime, table: ILeaseTable | None = None
    ) -> None:
        self._clock = clock
        self._table: ILeaseTable = table if table is not None else InProcessTable()
        # The configured providers; removed ones still holding leases (see the docstring).
        self._resources: dict[str, ProviderState] = {}
        self._retiring: dict[str, ProviderState] = {}
        self._nodes: dict[str, _NodeState] = {n.id: _NodeState([]) for n in config.nodes}
        self._models: dict[str, tuple[Candidate, ...]] = {}
        self._queue_stats = QueueStats()
        self._queue: WaitQueue[Lease] = WaitQueue(
            clock,
            expired=self._expired,
            discard=lambda lease: lease.release(),
            failure_outcome=_outcome_name,
            stats=self._queue_stats,
        )
        self.switch(self.plan(config))
        self._table.attach(self)

    # -- acquire -----------------------------------------------------------------------------

    def acquire(self, model_id: str, *, prompt_tokens: int = 0) -> Deferred[Lease]:
        """
        A lease on a provider of ``model_id``: at once when a live candidate has room, else after
        waiting in the queue. Fails with :class:`UnknownModel`, :class:`Unavailable`,
        :class:`Overloaded`, :class:`QueueTimeout` or (a cluster's table unreachable)
        :class:`~iop.edge.errors.CapacityUnknown`. Cancelling the Deferred while it waits
        withdraws the request.
        """
        candidates = self._models.get(model_id)
        if candidates is None:
            return fail(UnknownModel(model_id))
        if (
            self._table.shared
            and self._queue.waiting(model_id)
            and any(c.state.live for c in candidates)
        ):
            # Behind this pool's earlier waiters of the model (FIFO): a slot the shared table
            # has free may not have been offered to them yet.
            queued = self._enqueue(model_id, prompt_tokens)
            self.pump()
            return queued
        outcome = self._ask(model_id, prompt_tokens)
        # (A lease at once is the common case: no ABC isinstance check for it.)
        if type(outcome) is not Lease and isinstance(outcome, Deferred):
            return self._answer_later(model_id, prompt_tokens, outcome)
        return self._answer(model_id, prompt_tokens, outcome)

    def _answer(self, model_id: str, prompt_tokens: int, outcome: Outcome) -> Deferred[Lease]:
        """A new request's answer: its lease or error, or a place in the queue."""
        if outcome is None:
            return self._enqueue(model_id, prompt_tokens)
        if isinstance(outcome, BaseException):
            self._queue_stats.count(model_id, _outcome_name(outcome))
            if isinstance(outcome, Unavailable):
                self.log.info("no live provider for model {model_id}", model_id=model_id)
            return fail(outcome)
        self._queue_stats.count(model_id, "served")
        return succeed(outcome)

    def _answer_later(
        self, model_id: str, prompt_tokens: int, pending: Deferred[Outcome]
    ) -> Deferred[Lease]:
        """A new request's answer once the table's is in; cancelling it meanwhile withdraws
        the request (a lease granted after that goes back)."""
        withdrawn = False
        waiting: Deferred[Lease] | None = None

        def cancel(_: Deferred[Lease]) -> None:
            nonlocal withdrawn
            if waiting is not None:
                waiting.cancel()
            elif not withdrawn:
                withdrawn = True
                self._queue_stats.count(model_id, "withdrawn")

        result: Deferred[Lease] = Deferred(cancel)

        def answered(outcome: Outcome) -> None:
            nonlocal waiting
            if withdrawn:
                if isinstance(outcome, Lease):
                    outcome.release()
                return
            waiting = self._answer(model_id, prompt_tokens, outcome)
            waiting.chainDeferred(result)

        pending.addCallback(answered)
        return result

    def _enqueue(self, model_id: str, prompt_tokens: int) -> Deferred[Lease]:
        """Wait in the queue, or ``Overloaded`` when the model group's queue is full."""
        candidates = self._models.get(model_id, ())
        enabled = [c.state.config for c in candidates if c.state.enabled]
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
        node.draining_since = None
        node.back_until = None
        for res in node.resources:
            res.generation = generation
            res.draining = False
        self.log.info(
            "node {node_id} providers active (generation {generation})",
            node_id=node_id,
            generation=generation,
        )
        self.pump()

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
        self.pump()

    def node_draining(self, node_id: str, generation: int) -> None:
        """``node_id``'s active generation drains: no new leases on it (module docstring)."""
        node = self._nodes.get(node_id)
        if node is None or node.active != generation or node.draining_since is not None:
            return
        node.draining_since = self._clock.seconds()
        for res in node.resources:
            res.draining = True
        self.log.info(
            "node {node_id} draining: its providers take no new leases; {held} held finish",
            node_id=node_id,
            held=sum(res.in_flight for res in node.resources),
        )
        self.pump()

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
        self.pump()

    # -- live reconfiguration (config refresh) ---------------------------------------------

    def plan(self, config: EdgeConfig) -> PoolPlan:
        """
        Prepare the switch to ``config``'s catalog without changing anything: the providers
        under each node (added ones made here), each provider's settings (capacity, long
        capacity and threshold, priority, queue limits, enabled) and the ``models[]`` candidate
        lists. The nodes must be the ones this pool was built with, and a provider may not move
        to another node (see the module docstring): raises ``ValueError`` naming the
        difference otherwise.
        """
        nodes = {n.id: n for n in config.nodes}
        if set(nodes) != set(self._nodes):
            raise ValueError(
                f"nodes differ: running {sorted(self._nodes)}, candidate {sorted(nodes)}"
            )
        states: dict[str, ProviderState] = {}
        per_node: dict[str, tuple[ProviderState, ...]] = {}
        configs: dict[str, ProviderConfig] = {}
        for node_id, node in nodes.items():
            under: list[ProviderState] = []
            for p in node.providers:
                if p.id in states:
                    raise ValueError(f"node {node_id}: provider {p.id} is configured twice")
                state = self._state_for(node_id, p)
                states[p.id] = state
                configs[p.id] = p
                under.append(state)
            per_node[node_id] = tuple(under)
        models: dict[str, tuple[Candidate, ...]] = {}
        memberships: dict[str, set[str]] = {pid: set() for pid in configs}
        for model in config.models:
            candidates: list[Candidate] = []
            for ref in model.providers:
                found = states.get(ref.provider_id)
                if found is None or found.provider_id in {c.ref.provider_id for c in candidates}:
                    self.log.warn(
                        "model {model_id}: ignoring unknown or repeated provider {provider_id}",
                        model_id=model.id,
                        provider_id=ref.provider_id,
                    )
                    continue
                candidates.append(Candidate(ref, found, len(candidates)))
                memberships[found.provider_id].add(model.id)
            models[model.id] = tuple(candidates)
        return PoolPlan(
            nodes=per_node,
            configs=configs,
            enabled={pid: c.enabled for pid, c in configs.items()},
            memberships={pid: frozenset(m) for pid, m in memberships.items()},
            models=models,
        )

    def _state_for(self, node_id: str, config: ProviderConfig) -> ProviderState:
        """The state provider ``config`` has under ``node_id`` in a plan: its own if configured
        or retiring there, a new one if it is new; ``ValueError`` if it is elsewhere."""
        pid = config.id
        known = self._resources.get(pid) or self._retiring.get(pid)
        if known is None:
            return ProviderState(node_id, config)
        if known.node_id == node_id:
            return known
        if pid in self._resources:
            raise ValueError(
                f"provider {pid} moved from node {known.node_id} to node {node_id}: "
                "a restart is required"
            )
        raise ValueError(
            f"provider {pid} still holds {known.in_flight} leases on node {known.node_id} "
            f"since its removal: it can be added to node {node_id} once they have ended"
        )

    def switch(self, plan: PoolPlan) -> PoolPlan:
        """
        Take ``plan`` (from :meth:`plan` on this pool) as the catalog, at once and without
        failing; returns the plan that switches back. Held leases are untouched: they finish on
        the slot they hold, and a capacity lowered below ``in_flight`` grants nothing until
        releases bring it below. An added provider takes its node's active generation (live
        at once if the node is ready); a removed one retires (see the module docstring). Nobody's
        outcome changes until :meth:`pump`.
        """
        undo = PoolPlan(
            nodes={nid: tuple(node.resources) for nid, node in self._nodes.items()},
            configs={pid: res.config for pid, res in self._resources.items()},
            enabled={pid: res.enabled for pid, res in self._resources.items()},
            memberships={pid: frozenset(res.models) for pid, res in self._resources.items()},
            models=dict(self._models),
        )
        resources: dict[str, ProviderState] = {}
        for node_id, under in plan.nodes.items():
            node = self._nodes[node_id]
            node.resources = list(under)
            for res in under:
                pid = res.provider_id
                res.config = plan.configs[pid]
                res.enabled = plan.enabled[pid]
                res.models = set(plan.memberships[pid])
                res.generation = node.active
                res.draining = node.draining_since is not None and node.active is not None
                resources[pid] = res
                if self._retiring.pop(pid, None) is not None:
                    self.log.info(
                        "provider {provider_id} on node {node_id} added back while retiring",
                        provider_id=pid,
                        node_id=node_id,
                    )
                elif pid not in self._resources:
                    self.log.info(
                        "provider {provider_id} added on node {node_id}",
                        provider_id=pid,
                        node_id=node_id,
                    )
        for pid, res in self._resources.items():
            if pid not in resources:
                self._retire(res)
        self._resources = resources
        self._models = dict(plan.models)
        return undo

    def _retire(self, res: ProviderState) -> None:
        """A provider left the catalog: it retires until its last lease is returned."""
        res.models = set()
        if res.leases:
            self._retiring[res.provider_id] = res
        self.log.info(
            "provider {provider_id} removed from node {node_id}: {held} leases finish on it",
            provider_id=res.provider_id,
            node_id=res.node_id,
            held=res.in_flight,
        )

    def pump(self) -> None:
        """
        Re-evaluate every waiter now, in arrival order: granted where a live candidate has
        room, ``Unavailable`` where the model has no live candidate left (a provider disabled or
        taken out of the model's list, the model removed), still waiting otherwise. Also what
        the table calls when a slot may have come back outside this pool.
        """
        self._queue.settle(self._decide, self._shape)

    def waiting(self) -> dict[str, int]:
        """How many requests wait per model key now."""
        return self._queue.by_model()

    # -- observation -------------------------------------------------------------------------

    def counters(self, node_id: str, provider_id: str) -> dict[str, int]:
        """
        :class:`~iop.edge.status.ProviderCounters`: lease occupancy of the provider's active
        generation and the pending requests that include it as a live candidate. All zero when
        the provider is offline, disabled or not on ``node_id``.
        """
        res = self._resources.get(provider_id)
        if res is None or res.node_id != node_id or not (res.live or res.draining):
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
        for pid, res in self._held_states():
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
        for pid, res in self._held_states():
            live = self.counters(res.node_id, pid)
            providers[pid] = {
                "node_id": res.node_id,
                "generation": res.generation,
                "enabled": res.enabled,
                "removed": pid in self._retiring,
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

    def removed(self, node_id: str) -> list[tuple[ProviderConfig, dict[str, int]]]:
        """
        The providers removed from ``node_id`` by a refresh whose leases have not all ended
        yet (retiring), each with its last config and its held leases (``in_flight``,
        ``long_in_flight``; never queued: a removed provider has no waiters).
        """
        return [
            (
                res.config,
                {
                    "in_flight": res.in_flight,
                    "long_in_flight": res.long_in_flight,
                    "queued": 0,
                    "long_queued": 0,
                },
            )
            for res in self._retiring.values()
            if res.node_id == node_id
        ]

    def provider_ids(self) -> list[str]:
        """Every provider this pool has leases or a place in the catalog for: the configured
        ones in config order, then the retiring ones."""
        return [pid for pid, _ in self._held_states()]

    # -- internals ---------------------------------------------------------------------------

    def _held_states(self) -> list[tuple[str, ProviderState]]:
        """The configured providers, then the retiring ones."""
        return [*self._resources.items(), *self._retiring.items()]

    def _decide(self, waiter: Waiter[Lease]) -> Outcome | Deferred[Outcome]:
        return self._ask(waiter.model_id, waiter.prompt_tokens)

    def _shape(self, waiter: Waiter[Lease]) -> tuple[str, tuple[bool, ...]]:
        """A waiter's model key and which of its candidates it would take a long slot on:
        waiters of one shape find room or not alike."""
        return (
            waiter.model_id,
            tuple(
                c.state.is_long(waiter.prompt_tokens) for c in self._models.get(waiter.model_id, ())
            ),
        )

    def _ask(
        self, model_id: str, prompt_tokens: int, tries: int = MAX_STALE_GRANTS
    ) -> Outcome | Deferred[Outcome]:
        """
        Ask the table for a slot: a lease, ``None`` when every live candidate is full,
        ``Unavailable`` when none is live; at once, or later as a Deferred (which never fails:
        an error is its result).
        """
        candidates = self._models.get(model_id, ())
        live = [c for c in candidates if c.state.live]
        if not live:
            if self._expected_back(candidates):
                return None  # wait in the queue for the draining node to come back
            return Unavailable(model_id)
        granted = self._table.grant(model_id, live, candidates, prompt_tokens)
        if granted is None:
            return None
        if type(granted) is Granted:  # at once (an ABC's isinstance costs more)
            return self._lease(model_id, granted, prompt_tokens)
        assert isinstance(granted, Deferred)
        generations = {c.provider_id: c.state.generation for c in live}
        answer = granted.addCallback(
            self._granted_later, model_id, prompt_tokens, generations, tries
        ).addErrback(self._grant_failed)
        # A Deferred returned by a callback is chained: its result is the answer's.
        return cast("Deferred[Outcome]", answer)

    def _granted_later(
        self,
        granted: Granted | None,
        model_id: str,
        prompt_tokens: int,
        generations: Mapping[str, int | None],
        tries: int,
    ) -> Outcome | Deferred[Outcome]:
        """The table's late answer: a lease, unless the chosen provider's node went away (or
        came back as a new generation) or left the model meanwhile — then the slot goes back and
        the table is asked again."""
        if granted is None:
            return None
        chosen = granted.candidate
        state = chosen.state
        if (
            state.live
            and state.generation == generations[chosen.provider_id]
            and chosen in self._models.get(model_id, ())
        ):
            return self._lease(model_id, granted, prompt_tokens)
        self._table.release(granted.lease_id)
        if tries > 1:
            return self._ask(model_id, prompt_tokens, tries - 1)
        return None

    def _expected_back(self, candidates: tuple[Candidate, ...]) -> bool:
        """Whether an enabled candidate's node drains, or drained and may still come back."""
        now = self._clock.seconds()
        for c in candidates:
            if not c.state.enabled:
                continue
            node = self._nodes.get(c.state.node_id)
            if node is None:
                continue
            if node.draining_since is not None and node.active is not None:
                return True
            if node.back_until is not None and now < node.back_until:
                return True
        return False

    def _grant_failed(self, failure: Failure) -> BaseException:
        if not failure.check(PoolError):
            self.log.failure("pool: a grant failed", failure)
        error = failure.value
        assert error is not None
        return error

    def _lease(self, model_id: str, granted: Granted, prompt_tokens: int) -> Lease:
        chosen = granted.candidate
        res = chosen.state
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
            lease_id=granted.lease_id,
        )
        res.hold(lease)
        self._table.hold(granted, lease)
        return lease

    def _release(self, lease: Lease) -> None:
        pid = lease.provider_id
        res = self._resources.get(pid) or self._retiring.get(pid)
        # (None: removed, and every lease it held since returned, this one by a fence.)
        if res is None or not res.drop(lease):
            return
        # The table sees this return before the pump's next grant.
        self._table.release(lease.lease_id)
        if not res.leases and self._retiring.get(pid) is res:
            del self._retiring[pid]
            self.log.info(
                "removed provider {provider_id} on node {node_id}: its last lease ended",
                provider_id=pid,
                node_id=res.node_id,
            )
        self.pump()

    def _fence_node(self, node_id: str, node: _NodeState) -> None:
        generation = node.active
        node.active = None
        if node.draining_since is not None:
            # A drained node is restarting, likely: its return is waited for a queue timeout.
            node.back_until = self._clock.seconds() + queue_timeout(
                res.config for res in node.resources
            )
        node.draining_since = None
        retiring = [res for res in self._retiring.values() if res.node_id == node_id]
        for res in retiring:
            del self._retiring[res.provider_id]
        returned = [lease for res in [*node.resources, *retiring] for lease in res.fence()]
        self.log.info(
            "node {node_id} generation {generation} fenced: {returned} leases returned",
            node_id=node_id,
            generation=generation,
            returned=len(returned),
        )
        for lease in returned:
            self._table.release(lease.lease_id)

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
    "MAX_STALE_GRANTS",
    "Lease",
    "PoolPlan",
    "PoolStats",
    "ProviderPool",
    "is_long",
]
