# -*- test-case-name: iop.test.edge.test_pool,iop.test.edge.cluster.test_pool -*-
"""
The seam between the provider pool and the table that grants its slots: :class:`ILeaseTable`,
what crosses it (:class:`Candidate`, :class:`Granted`, :class:`Lease`) and the in-process table.

The pool (:mod:`iop.edge.pool`) owns the catalog, the node generations, the wait queue and the
counting. For each grant it asks its table one question: "may one of these live candidates take
a request of this model key, and which one". The table answers with a :class:`Granted` or
``None`` (every candidate full), at once or later (a Deferred); the pool makes the
:class:`Lease` and tells the table (:meth:`ILeaseTable.hold`), and tells it again when the slot
comes back (:meth:`ILeaseTable.release`: released by its holder, fenced, or a grant the pool
could not use). Two tables exist:

:class:`InProcessTable` (an Edge alone)
    The pool's own occupancy (:class:`ProviderState`) *is* the table: it selects by
    :func:`select` and answers at once — no Deferred, nothing to hold or release.

:class:`~iop.edge.cluster.table.ClusterLeaseTable` (``cluster:``)
    The cluster's shared table on Redis: it answers later, renews the leases it granted, and
    loses (:meth:`Lease.lose`) those it can no longer vouch for; it wakes the pool
    (:meth:`IWaiters.pump`) when a slot may have come back elsewhere.

Selection (:func:`select`; the cluster's scripts apply the same rule over every Edge)
    Among the candidates with room: the lowest ``in_flight``; ties → the lower ``priority``
    number; ties → round-robin per model key, rotating through the tied candidates in config
    order starting after the one this key chose last. A provider has room for a request when
    ``in_flight < capacity`` and (the request is not long, or ``long_capacity == 0``, or
    ``long_in_flight < long_capacity``); a request is long for provider P when
    ``P.long_context_threshold > 0`` and ``prompt_tokens >= P.long_context_threshold``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import Attribute, Interface, implementer

from iop.config.model import ModelProviderRef, ProviderConfig

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "Candidate",
    "Granted",
    "ILeaseTable",
    "IWaiters",
    "InProcessTable",
    "Lease",
    "ProviderState",
    "is_long",
    "select",
]

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
        """The table's side of :meth:`when_lost`: run the callbacks once."""
        if self._state.lost or self._state.released:
            return
        self._state.lost = True
        callbacks, self._state.on_lost = self._state.on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _log.failure("a lost lease's callback failed")

    def fence(self) -> None:
        """The pool's side of :attr:`fenced`: its generation was fenced while it was held."""
        self._state.fenced = True


# ---------------------------------------------------------------------------------------------
# What a table reads


def is_long(provider: ProviderConfig, prompt_tokens: int) -> bool:
    """Whether a request of ``prompt_tokens`` is long-context for ``provider``."""
    threshold = provider.long_context_threshold
    return threshold > 0 and prompt_tokens >= threshold


class ProviderState:
    """
    Live state of one configured provider on this Edge: its config, enabled toggle, its node's
    active generation and the leases held on it here. The pool changes it; a table reads it.
    """

    def __init__(self, node_id: str, config: ProviderConfig) -> None:
        self.node_id = node_id
        self.config = config
        self.enabled = config.enabled
        self.generation: int | None = None
        # Its node's generation drains (it stops): no new leases, held ones run on.
        self.draining = False
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
        """A candidate for new work: enabled, its node ready and not draining."""
        return self.enabled and self.generation is not None and not self.draining

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

    def fence(self) -> list[Lease]:
        """Go offline, returning every held lease exactly once; those leases."""
        returned = list(self.leases)
        self.fenced += len(returned)
        for lease in returned:
            lease.fence()
        self.leases.clear()
        self.long_in_flight = 0
        self.generation = None
        self.draining = False
        return returned


@dataclass(frozen=True, slots=True)
class Candidate:
    """One provider a model key may be leased on: its ``models[]`` entry, its live state, and
    its position in the model key's provider list (config order, for round-robin)."""

    ref: ModelProviderRef
    state: ProviderState
    index: int

    @property
    def provider_id(self) -> str:
        return self.ref.provider_id


class Granted(NamedTuple):
    """
    A table's yes: the ``candidate`` chosen, its ``lease_id`` in the table ("" in process) and
    the local time ``until`` which the table vouches for the slot without a renewal.
    """

    candidate: Candidate
    lease_id: str = ""
    until: float = float("inf")


# ---------------------------------------------------------------------------------------------
# The interface


class IWaiters(Interface):
    """The pool as its table sees it: the requests waiting for a slot."""

    def pump() -> None:
        """A slot may have come back outside the pool (another Edge, an expiry, the table
        reachable again): try the waiters again, in arrival order."""

    def waiting() -> Mapping[str, int]:
        """How many requests wait per model key now."""

    def provider_ids() -> Sequence[str]:
        """The providers the pool knows now: the configured ones (a refresh adds and removes
        them) and removed ones whose leases have not all ended here."""


class ILeaseTable(Interface):
    """Where a pool's slots are granted, and how long a granted slot stays its holder's."""

    shared = Attribute(
        "True when holders outside this pool change the table (other Edges, leases that "
        "expire): a slot may then be free while this pool's waiters still wait, so a new "
        "request queues behind the waiters of its model key instead of overtaking them."
    )

    def attach(waiters: IWaiters) -> None:
        """The pool this table grants for (called once, by the pool)."""

    def grant(
        model_id: str,
        live: Sequence[Candidate],
        group: Sequence[Candidate],
        prompt_tokens: int,
    ) -> Granted | Deferred[Granted | None] | None:
        """
        A slot for a request of ``model_id`` with ``prompt_tokens`` on one of ``live`` (the
        model key's candidates live on this Edge, never empty; ``group``: all of its candidates,
        in config order), or ``None`` when every one is full. At once, or later as a Deferred,
        which fails with a :class:`~iop.edge.errors.PoolError` when the table cannot answer
        (:class:`~iop.edge.errors.CapacityUnknown`).
        """

    def hold(granted: Granted, lease: Lease) -> None:
        """The pool made ``lease`` from ``granted``: it is held until :meth:`release`; if the
        table can no longer vouch for it first, it calls :meth:`Lease.lose`."""

    def release(lease_id: str) -> None:
        """The slot ``lease_id`` (from a :class:`Granted`) comes back, exactly once: released by
        its holder, returned by a fence, or granted too late for the pool to use."""


# ---------------------------------------------------------------------------------------------
# The in-process table


def _order(candidates: Iterable[Candidate]) -> tuple[str, ...]:
    return tuple(c.provider_id for c in candidates)


def select(
    candidates: Sequence[Candidate], prompt_tokens: int, start: int, size: int
) -> Candidate | None:
    """
    The candidate to lease, or None when none has room: lowest ``in_flight``, then lower
    ``priority``, then the first in config order at or after position ``start`` (cyclically over
    ``size`` positions).
    """
    best: Candidate | None = None
    best_key: tuple[int, int, int] | None = None
    for c in candidates:
        state = c.state
        if not state.has_room(state.is_long(prompt_tokens)):
            continue
        key = (state.in_flight, state.config.priority, (c.index - start) % size)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


@implementer(ILeaseTable)
class InProcessTable:
    """
    The table of an Edge alone: the leases this process holds (each candidate's
    :class:`ProviderState`), the rule :func:`select`, and per model key where the next
    round-robin tie-break starts — kept while the key's candidate order stays the same (a
    config refresh that reorders them starts the rotation afresh). Answers at once.
    """

    shared = False

    def __init__(self) -> None:
        # Per model key: the candidate list the rotation was made for, and its next start.
        self._rotation: dict[str, tuple[Sequence[Candidate], int]] = {}

    def attach(self, waiters: IWaiters) -> None:
        pass

    def grant(
        self,
        model_id: str,
        live: Sequence[Candidate],
        group: Sequence[Candidate],
        prompt_tokens: int,
    ) -> Granted | None:
        start = 0
        turn = self._rotation.get(model_id)
        if turn is not None:
            if turn[0] is group:
                start = turn[1]
            elif _order(turn[0]) == _order(group):
                start = turn[1]
                self._rotation[model_id] = (group, start)
        chosen = select(live, prompt_tokens, start, len(group))
        if chosen is None:
            return None
        self._rotation[model_id] = (group, (chosen.index + 1) % len(group))
        return Granted(chosen)

    def hold(self, granted: Granted, lease: Lease) -> None:
        pass

    def release(self, lease_id: str) -> None:
        pass
