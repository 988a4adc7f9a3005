# -*- test-case-name: iop.test.edge.cluster.test_pool,tests.test_cluster_edges -*-
"""
The lease table of an Edge in a cluster (:class:`ClusterLeaseTable`, an
:class:`~iop.edge.leasetable.ILeaseTable`): the Edge's :class:`~iop.edge.pool.ProviderPool` keeps
its catalog, live state, local queue and counting, and every slot it grants comes from the
cluster's shared lease table on Redis (:class:`~iop.edge.cluster.leases.RedisLeaseStore`), so a
provider's capacity is exact across every Edge.

What stays local
    Each Edge keeps its own node sessions: a provider is a candidate here when *this* Edge has
    its node ready (the Edge must hold the session to send the work). Fencing a session returns
    this Edge's leases on it, no one else's. Waiters queue here, FIFO per Edge, with the model
    group's ``max_queue`` and queue timeout applying per Edge (an Edge's clients never wait
    behind another Edge's). ``Unavailable`` comes at once when this Edge sees no live candidate.

What is shared
    The leases: selection (lowest ``in_flight`` over every Edge → priority → round-robin),
    capacity and long-context capacity are decided by one server-side script per grant.

Grants
    The table is shared (:attr:`ClusterLeaseTable.shared`): a new request with nobody of its
    model waiting here asks the table at once; granted, it holds a lease; every candidate full,
    it queues (limit checked then). With waiters of its model already here it queues behind
    them. A grant for a provider whose node this Edge lost (or fenced and re-registered) while
    the script ran is returned and the table asked again — the pool's rule for every table that
    answers later (:mod:`iop.edge.pool`).

Wake-ups
    Waiters are re-tried (:meth:`~iop.edge.leasetable.IWaiters.pump`), in arrival order, one
    grant at a time: when a slot is returned here, when the table publishes a slot returned by
    any Edge (:meth:`ClusterLeaseTable.wake`), when a node becomes ready here, and every
    :data:`RETRY_SEC` while anyone waits (a slot freed by an Edge that died frees without a
    message: its lease just expires). One pass asks the table once per model key and long
    context pattern that found everything full, not once per waiter (:mod:`iop.edge.queue`).

Leases and their TTL
    A lease lives ``cluster.lease_ttl_sec`` from its grant or renewal; this Edge renews all it
    holds every third of that, in one script call, so a dead Edge's slots come back within the
    TTL. A renewal that failed (Redis unreachable) is tried again as soon as the connection to
    Redis is back (:meth:`ClusterLeaseTable.reconnected`) and at each deadline check (every
    tenth of the TTL) until one goes through, not a third of a TTL later: a Redis away for less
    than a third of the TTL costs no lease. Each lease is known held until the time its last
    confirmed renewal (or its grant) was *asked* plus the TTL — never later than the table's
    own expiry. A lease not confirmed by :data:`DEADLINE_MARGIN` of the TTL before that (Redis
    unreachable for most of a TTL), or one the table no longer has, is *lost*: logged, counted
    (:attr:`ClusterLeaseTable.lost`) and its holder told
    (:meth:`~iop.edge.leasetable.Lease.when_lost`; the client surfaces cut the client's
    connection, which cancels the work), so its slot is never used twice. (Clocks: the Edge's
    runs no faster than Redis's over one TTL — the usual lease assumption.)

Failure (fail closed)
    Redis unreachable: every grant fails at once with
    :class:`~iop.edge.errors.CapacityUnknown` (HTTP 503 ``cluster_unavailable``), new requests
    and waiters alike; releases not delivered are left to expire. It serves again as soon as
    Redis answers.

Status
    :meth:`ClusterLeaseTable.view` is the cluster seen from here: every Edge that reported
    lately with its waiters, and the leases held per provider over every Edge, refreshed every
    :data:`VIEW_SEC` (this Edge's own report goes up in the same call); whether Redis answered
    the last time, and whether the view is stale. It holds no clock readings, so two reads of
    an idle cluster are equal. The providers it reports are the pool's at each report
    (:meth:`~iop.edge.leasetable.IWaiters.provider_ids`): a provider a config refresh added
    shows from the next report on, a removed one until its last lease on this Edge has ended
    (the leases other Edges hold on it are theirs to report until they refresh).

Providers added and removed by a config refresh
    Nothing here is per provider but the view: a grant names its candidates with their
    capacities each time, and a lease is renewed and released by its id, so a provider new to
    the catalog is granted on at once and a removed one's leases renew until released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.leases import Candidate, ClusterView, Grant
from iop.edge.errors import CapacityUnknown
from iop.edge.leasetable import Candidate as PoolCandidate
from iop.edge.leasetable import Granted, ILeaseTable, IWaiters, Lease

__all__ = ["RETRY_SEC", "VIEW_SEC", "ClusterLeaseTable", "LeaseStore"]

# How often waiters are re-tried without a wake-up (a slot freed by an expired lease).
RETRY_SEC = 0.5
# How often this Edge reports its waiters and reads the cluster's view.
VIEW_SEC = 1.0
# A report outlives its Edge's silence this many view periods.
VIEW_LIFETIMES = 5
# The view is stale (its Edges and leases old) after this many periods without an answer.
STALE_VIEWS = 3
# A lease not confirmed renewed until this share of the TTL before it would expire is lost.
DEADLINE_MARGIN = 0.1


class LeaseStore(Protocol):
    """The shared lease table on Redis (:class:`~iop.edge.cluster.leases.RedisLeaseStore`)."""

    def acquire(
        self,
        model_key: str,
        candidates: Sequence[Candidate],
        edge_id: str,
        ttl_ms: int,
        long_context: bool = ...,
        *,
        ring_size: int | None = ...,
    ) -> Deferred[Grant | None]: ...

    def renew(
        self,
        lease_ids: Sequence[str],
        ttl_ms: int,
        *,
        owners: Mapping[str, tuple[str, bool]] | None = ...,
        edge_id: str = ...,
    ) -> Deferred[frozenset[str]]: ...

    def release(self, lease_id: str) -> Deferred[bool]: ...

    def view(
        self,
        edge_id: str,
        queued: Mapping[str, int],
        provider_ids: Sequence[str],
        lifetime_ms: int,
    ) -> Deferred[ClusterView]: ...


@implementer(ILeaseTable)
class ClusterLeaseTable:
    """The lease table of one Edge of a cluster; see the module docstring for the rules."""

    shared = True
    log = Logger()

    def __init__(
        self,
        store: LeaseStore,
        clock: IReactorTime,
        *,
        edge_id: str,
        lease_ttl_sec: float,
        provider_ids: Sequence[str],
    ) -> None:
        """
        ``store``: the shared table; ``provider_ids``: every configured provider (the cluster
        view reports their leases over every Edge), until a pool is attached: from then on the
        pool's (:meth:`~iop.edge.leasetable.IWaiters.provider_ids`, which a refresh changes).
        """
        self._store = store
        self._clock = clock
        self._edge_id = edge_id
        self._ttl_ms = max(1, int(lease_ttl_sec * 1000))
        self._provider_ids = list(provider_ids)
        self._waiters: IWaiters | None = None
        # This Edge's leases in the table, by lease id (renewed together), and the local time
        # until which each is known to be held (asked at + TTL: the table's expiry is later).
        self._held: dict[str, Lease] = {}
        self._confirmed: dict[str, float] = {}
        # A renewal call in flight; the last one failed (tried again at the next check).
        self._renewing = False
        self._renew_failed = False
        self._loops: list[LoopingCall] = []
        self._view: ClusterView | None = None
        self._view_at: float | None = None
        self._redis_up = False
        #: Leases lost: not confirmed renewed in time, or the table no longer had them.
        self.lost = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start renewing leases, re-trying waiters and reporting to the cluster view."""
        ttl = self._ttl_ms / 1000
        for call, interval in (
            (self._renew, ttl / 3),
            (self._check_deadlines, ttl * DEADLINE_MARGIN),
            (self.wake, RETRY_SEC),
            (self._report, VIEW_SEC),
        ):
            loop = LoopingCall(call)
            loop.clock = self._clock
            loop.start(interval, now=False).addErrback(self._loop_failed)
            self._loops.append(loop)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()

    def _loop_failed(self, failure: Failure) -> None:
        self.log.failure("cluster: a periodic task failed", failure)

    # -- ILeaseTable ---------------------------------------------------------------------------

    def attach(self, waiters: IWaiters) -> None:
        self._waiters = waiters

    def grant(
        self,
        model_id: str,
        live: Sequence[PoolCandidate],
        group: Sequence[PoolCandidate],
        prompt_tokens: int,
    ) -> Deferred[Granted | None]:
        """One script call: a slot on the candidate the table's selection picks over every
        Edge; ``CapacityUnknown`` when Redis fails (fail closed)."""
        asked_at = self._clock.seconds()
        try:
            asking = self._store.acquire(
                model_id,
                [_candidate(c, prompt_tokens) for c in live],
                self._edge_id,
                self._ttl_ms,
                ring_size=len(group),
            )
        except Exception:
            asking = fail()
        return asking.addCallbacks(
            self._granted,
            self._refused,
            callbackArgs=(live, asked_at),
            errbackArgs=(model_id,),
        )

    def _granted(
        self, grant: Grant | None, live: Sequence[PoolCandidate], asked_at: float
    ) -> Granted | None:
        self._redis_up = True
        if grant is None:
            return None
        chosen = next(c for c in live if c.provider_id == grant.provider_id)
        return Granted(chosen, grant.lease_id, asked_at + self._ttl_ms / 1000)

    def _refused(self, failure: Failure, model_id: str) -> Failure:
        if failure.check(ClusterUnavailable):
            self._redis_up = False
            return Failure(CapacityUnknown(model_id))
        return failure

    def hold(self, granted: Granted, lease: Lease) -> None:
        self._held[granted.lease_id] = lease
        self._confirmed[granted.lease_id] = granted.until

    def release(self, lease_id: str) -> None:
        """Give the slot back in the table; if Redis cannot take it, the lease expires."""
        self._held.pop(lease_id, None)
        self._confirmed.pop(lease_id, None)
        self._store.release(lease_id).addErrback(lambda _: None)

    # -- wake-ups ------------------------------------------------------------------------------

    def wake(self) -> None:
        """Something may have freed a slot somewhere: re-try the waiters (if any)."""
        if self._waiters is not None:
            self._waiters.pump()

    def reconnected(self) -> None:
        """A connection to Redis is up again: renew now if the last renewal failed, and
        re-try the waiters."""
        if self._renew_failed:
            self._renew()
        self.wake()

    # -- renewal, view -------------------------------------------------------------------------

    def _renew(self) -> Deferred[None] | None:
        ids = list(self._held)
        if not ids or self._renewing:
            return None
        self._renewing = True
        sent = self._clock.seconds()
        owners = {i: (self._held[i].provider_id, self._held[i].long) for i in ids}
        renewing = self._store.renew(ids, self._ttl_ms, owners=owners, edge_id=self._edge_id)
        return renewing.addCallbacks(self._renewed, self._renewal_failed, callbackArgs=(ids, sent))

    def _renewal_failed(self, failure: Failure) -> None:
        self._renewing = False
        self._renew_failed = True
        self._unreachable(failure)

    def _renewed(self, renewed: frozenset[str], ids: list[str], sent: float) -> None:
        self._renewing = False
        self._renew_failed = False
        self._redis_up = True
        until = sent + self._ttl_ms / 1000
        for lease_id in ids:
            if lease_id not in self._held:
                continue  # released meanwhile
            if lease_id in renewed:
                self._confirmed[lease_id] = until
            else:
                self._lose(lease_id, "the table no longer had it")

    def _check_deadlines(self) -> Deferred[None] | None:
        """End the requests whose lease may expire before a renewal can be confirmed; try a
        failed renewal again."""
        margin = self._ttl_ms / 1000 * DEADLINE_MARGIN
        now = self._clock.seconds()
        for lease_id, until in list(self._confirmed.items()):
            if now >= until - margin:
                self._lose(lease_id, "its renewal could not be confirmed in time")
        if self._renew_failed:
            return self._renew()
        return None

    def _lose(self, lease_id: str, why: str) -> None:
        lease = self._held.pop(lease_id, None)
        self._confirmed.pop(lease_id, None)
        if lease is None:
            return
        self.lost += 1
        self.log.warn(
            "cluster: lease {lease_id} on provider {provider_id} lost ({why}): its request is "
            "ended, since its slot may be granted to another",
            lease_id=lease_id,
            provider_id=lease.provider_id,
            why=why,
        )
        lease.lose()

    def _unreachable(self, failure: Failure) -> None:
        failure.trap(ClusterUnavailable)
        self._redis_up = False

    def _report(self) -> Deferred[None]:
        waiters = self._waiters
        queued = dict(waiters.waiting()) if waiters is not None else {}
        providers = list(waiters.provider_ids()) if waiters is not None else self._provider_ids
        lifetime_ms = int(VIEW_SEC * VIEW_LIFETIMES * 1000)
        return self._store.view(self._edge_id, queued, providers, lifetime_ms).addCallbacks(
            self._viewed, self._unreachable
        )

    def _viewed(self, view: ClusterView) -> None:
        self._redis_up = True
        self._view = view
        self._view_at = self._clock.seconds()

    def view(self) -> dict[str, Any]:
        """The cluster seen from this Edge (for ``/status``): see the module docstring."""
        view = self._view
        entry: dict[str, Any] = {
            "edge_id": self._edge_id,
            "redis": "up" if self._redis_up else "unreachable",
            "lease_ttl_sec": self._ttl_ms / 1000,
            "leases_held_here": len(self._held),
            "leases_lost": self.lost,
            # No answer to the last few reports: the edges and providers below are old.
            "stale": self._view_at is None
            or self._clock.seconds() - self._view_at > VIEW_SEC * STALE_VIEWS,
            "edges": [],
            "providers": {},
        }
        if view is not None:
            entry["edges"] = [
                {
                    "id": e.edge_id,
                    "queued": sum(e.queued.values()),
                    "queued_by_model": dict(e.queued),
                }
                for e in view.edges
            ]
            entry["providers"] = {
                pid: {"in_flight": held, "long_in_flight": long}
                for pid, (held, long) in view.held.items()
            }
        return entry


def _candidate(c: PoolCandidate, prompt_tokens: int) -> Candidate:
    res = c.state
    return Candidate(
        provider_id=res.provider_id,
        capacity=res.config.capacity,
        priority=res.config.priority,
        long_capacity=res.config.long_capacity,
        position=c.index,
        long=res.is_long(prompt_tokens),
    )
