# -*- test-case-name: tests.test_cluster_leases -*-
"""
The cluster's shared lease table on Redis: exact provider capacity across every Edge.

:class:`RedisLeaseStore` grants, renews and releases leases with one server-side script each
(:mod:`iop.edge.cluster.scripts`, whose docstring is the data model), so each operation is atomic
over the whole candidate set and one round trip. It has no view of nodes or sessions: the caller
(an Edge's pool) passes the candidates it sees live, with their configured capacities (the
Edges of a cluster share their config).

Selection (the in-process table's rule, :func:`iop.edge.leasetable.select`)
    Among the candidates with room (``in_flight < capacity``, and for a long request
    ``long_capacity == 0`` or ``long_in_flight < long_capacity``): the lowest ``in_flight``
    counted over every Edge; ties → the lower ``priority`` number; ties → round-robin per model
    key, the first at or after the model key's rotation start in configured position order
    (cyclically), the start then moving past the one chosen.

Leases
    A lease lives ``ttl_ms`` from its grant or last renewal, on the Redis server's clock. Its
    Edge renews it while the request runs; an Edge that dies loses its leases within the TTL, so
    capacity is never over-committed and at worst briefly under-used. :meth:`release` returns the
    slot exactly once: a second release, or one after the lease expired, returns False and
    changes nothing.

Redis
    The table must not be evicted: run its Redis with ``maxmemory-policy noeviction`` (or a
    ``volatile-*`` policy, which can only take expiring lease records: briefly under-used
    capacity, never over-committed). A Redis that starts empty (restarted without persistence,
    failed over to an empty replica) has lost the table: the first call sees no epoch and opens
    a recovery period of one TTL in which nothing is granted and the Edges' renewals re-assert
    the leases they hold (``{P}:epoch`` in :mod:`~iop.edge.cluster.scripts`). Run it without
    persistence: a table restored from an old snapshot looks established but is stale.

Failure
    Every Redis problem is :class:`~iop.edge.cluster.errors.ClusterUnavailable`, at once when no
    connection is up and after at most ``timeout`` seconds otherwise: the caller refuses the
    request (fail closed). A hung Redis runs the calls it was sent once it answers again, long
    after their Edge gave up on them: an acquire then would grant a lease nobody holds (its
    slot blocked for a TTL), a renewal would extend one its Edge already ended. So acquire and
    renew carry a *deadline* in Redis's time — when the Edge stops waiting, from the offset
    between the two clocks that every view call measures (:attr:`RedisLeaseStore.offset_ms`) —
    and a call run after it changes nothing. Until a first view has answered, calls carry none.
    A script Redis has forgotten (``SCRIPT FLUSH``, a restart, a failover) is loaded again and
    the call retried once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.defer import Deferred, TimeoutError, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.edge.cluster.errors import ClusterUnavailable
from iop.edge.cluster.scripts import ACQUIRE, IN_FLIGHT, RELEASE, RENEW, VIEW, Script

__all__ = [
    "DEFAULT_TIMEOUT_SEC",
    "Candidate",
    "ClusterView",
    "EdgeReport",
    "Grant",
    "RedisClient",
    "RedisLeaseStore",
]

# What the acquire script's packed candidate lines take as a provider id.
_WORD = re.compile(r"\S+\Z")
# How long one operation may wait for Redis before the request is refused.
DEFAULT_TIMEOUT_SEC = 2.0
# A call's deadline in Redis, as a share of the timeout: inside the connection's own reply
# timeout (0.8 of it), with room for the clock offset's error.
DEADLINE_SHARE = 0.7
# A view whose round trip took longer than this says too little about the clocks' offset.
OFFSET_MAX_RTT_MS = 200.0


class RedisClient(Protocol):
    """What the store needs of a Redis client (txredisapi's connection handler has it)."""

    def evalsha(
        self, sha1_hash: str, keys: Sequence[str] = ..., args: Sequence[Any] = ...
    ) -> Deferred[Any]: ...

    def script_load(self, script: str) -> Deferred[Any]: ...


@dataclass(frozen=True)
class Candidate:
    """
    One provider a model key may be leased on, as the caller's config says: ``capacity``,
    ``long_capacity`` (0: no separate long cap), ``priority`` (lower wins a tie), ``position``
    (its place in the model key's provider list, for round-robin; ``None``: its index in the
    candidates passed) and ``long`` (whether the request is long-context on this provider;
    ``None``: the call's ``long_context``).
    """

    provider_id: str
    capacity: int
    priority: int = 0
    long_capacity: int = 0
    position: int | None = None
    long: bool | None = None


@dataclass(frozen=True)
class Grant:
    """
    A lease granted on ``provider_id``: ``lease_id`` (what renew and release take), whether it
    also holds a long-context slot, and when it expires unless renewed (ms, Redis server time).
    """

    provider_id: str
    lease_id: str
    long: bool
    expires_at_ms: int


@dataclass(frozen=True)
class EdgeReport:
    """One Edge's last report in the cluster view: its id, its waiters per model key, and how
    long ago (ms of Redis time) it reported."""

    edge_id: str
    queued: Mapping[str, int]
    age_ms: int


@dataclass(frozen=True)
class ClusterView:
    """
    The cluster as Redis saw it at ``now_ms`` (its clock): every Edge that reported within the
    report lifetime, and per provider asked about ``(in_flight, long_in_flight)`` over every Edge.
    """

    now_ms: int
    edges: tuple[EdgeReport, ...]
    held: Mapping[str, tuple[int, int]]


class RedisLeaseStore:
    """The shared lease table; see the module docstring for the rules."""

    log = Logger()

    def __init__(
        self,
        redis: RedisClient,
        clock: IReactorTime,
        *,
        key_prefix: str = "iop",
        timeout: float = DEFAULT_TIMEOUT_SEC,
        connected: Callable[[], bool] | None = None,
    ) -> None:
        """
        ``redis``: the client; ``clock``: for the timeout; ``connected``: a callable saying
        whether a connection is up now (``None``: assume it is), so that a store without one
        fails at once instead of after ``timeout``.
        """
        self._redis = redis
        self._clock = clock
        self._timeout = timeout
        self._connected = connected
        self._tag = "{" + key_prefix + "}"
        # Since the last answer, operations have failed (logged once).
        self._failing = False
        #: Redis's clock minus this Edge's, in ms (from the last view answered quickly);
        #: ``None`` until one has.
        self.offset_ms: float | None = None
        #: The last acquire found the table recovering (granting nothing).
        self.recovering = False

    # -- keys ----------------------------------------------------------------------------------

    def _key(self, *parts: str) -> str:
        return ":".join((self._tag, *parts))

    def _held(self, provider_id: str) -> str:
        return self._key("held", provider_id)

    def _long(self, provider_id: str) -> str:
        return self._key("long", provider_id)

    def _lease(self, lease_id: str) -> str:
        return self._key("lease", lease_id)

    # -- operations ----------------------------------------------------------------------------

    def acquire(
        self,
        model_key: str,
        candidates: Sequence[Candidate],
        edge_id: str,
        ttl_ms: int,
        long_context: bool = False,
        *,
        ring_size: int | None = None,
    ) -> Deferred[Grant | None]:
        """
        A lease for ``model_key`` on the candidate selection picks, held by ``edge_id`` for
        ``ttl_ms``; ``None`` when every candidate is full (or there is none), or while the
        table recovers (:attr:`recovering`). ``ring_size``: the
        model key's configured provider count (default: enough for every position given).
        """
        if not candidates:
            return succeed(None)
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be > 0")
        positions = [c.position if c.position is not None else i for i, c in enumerate(candidates)]
        ring = max(ring_size or 0, max(positions) + 1)
        lines = []
        for candidate, position in zip(candidates, positions, strict=True):
            if not _WORD.match(candidate.provider_id):
                raise ValueError(f"provider id {candidate.provider_id!r} has a blank")
            long = long_context if candidate.long is None else candidate.long
            lines.append(
                f"{candidate.provider_id} {candidate.capacity} {candidate.long_capacity} "
                f"{candidate.priority} {position} {1 if long else 0}"
            )
        keys = [self._key("seq")]
        args = [
            self._key(""),
            edge_id,
            ttl_ms,
            ring,
            model_key,
            "\n".join(lines),
            self._deadline(),
        ]
        d = self._run(ACQUIRE, keys, args)
        d.addCallback(self._granted)
        return d

    def _deadline(self) -> int:
        """When Redis should no longer run a call sent now (ms, its clock); 0: unknown."""
        if self.offset_ms is None:
            return 0
        local_ms = self._clock.seconds() * 1000
        return int(local_ms + self.offset_ms + self._timeout * 1000 * DEADLINE_SHARE)

    def _granted(self, reply: Any) -> Grant | None:
        if reply == -2:
            raise ClusterUnavailable("the cluster's Redis ran the acquire after its deadline")
        if isinstance(reply, int) and reply < 0:
            if not self.recovering:
                self.recovering = True
                self.log.warn(
                    "cluster: the lease table is new or was lost (Redis started empty): "
                    "granting nothing for one lease TTL while the Edges re-assert their leases"
                )
            return None
        if self.recovering:
            self.recovering = False
            self.log.info("cluster: the lease table has recovered; granting again")
        return _grant(reply)

    def renew(
        self,
        lease_ids: Sequence[str],
        ttl_ms: int,
        *,
        owners: Mapping[str, tuple[str, bool]] | None = None,
        edge_id: str = "",
    ) -> Deferred[frozenset[str]]:
        """
        Extend each lease still held to ``ttl_ms`` from now; the ids renewed (a lease missing
        from them expired or was released: its slot is no longer this request's). With
        ``owners`` (per lease id: its provider id and whether it holds a long slot) and
        ``edge_id``, a lease the table lost is re-asserted while the table recovers (see
        :mod:`~iop.edge.cluster.scripts`, ``{P}:epoch``).
        """
        ids = list(lease_ids)
        if not ids:
            return succeed(frozenset())
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be > 0")
        lines = []
        for lease_id in ids:
            provider, long = (owners or {}).get(lease_id, ("-", False))
            lines.append(f"{lease_id} {provider} {1 if long else 0}")
        keys = [self._lease(i) for i in ids]
        epoch = self._key("epoch") if owners is not None else ""
        args = [
            self._held(""),
            self._long(""),
            ttl_ms,
            epoch,
            edge_id,
            "\n".join(lines),
            self._deadline(),
        ]
        d = self._run(RENEW, keys, args)
        d.addCallback(_renewed, ids)
        return d

    @property
    def wake_channel(self) -> str:
        """The pub/sub channel every returned slot is published on (message: provider id)."""
        return self._key("wake")

    def release(self, lease_id: str) -> Deferred[bool]:
        """
        Return the lease's slot(s); True only for the call that did (exactly once). A returned
        slot is published on :attr:`wake_channel`.
        """
        keys = [self._lease(lease_id)]
        args = [self._held(""), self._long(""), lease_id, self.wake_channel]
        d = self._run(RELEASE, keys, args)
        d.addCallback(lambda returned: bool(int(returned)))
        return d

    def in_flight(self, provider_ids: Sequence[str]) -> Deferred[Mapping[str, tuple[int, int]]]:
        """Per provider: (in_flight, long_in_flight) over every Edge, expired leases dropped."""
        ids = list(dict.fromkeys(provider_ids))
        if not ids:
            return succeed({})
        keys: list[str] = []
        for pid in ids:
            keys += [self._held(pid), self._long(pid)]
        d = self._run(IN_FLIGHT, keys, [])
        d.addCallback(
            lambda counts: {
                pid: (int(counts[2 * i]), int(counts[2 * i + 1])) for i, pid in enumerate(ids)
            }
        )
        return d

    def view(
        self,
        edge_id: str,
        queued: Mapping[str, int],
        provider_ids: Sequence[str],
        lifetime_ms: int,
    ) -> Deferred[ClusterView]:
        """
        Report this Edge's waiters per model key (kept ``lifetime_ms``) and read the cluster's
        view: every Edge's last report, and the providers' leases held over every Edge.
        """
        ids = list(dict.fromkeys(provider_ids))
        keys = [self._key("edges")]
        args = [self._key(""), edge_id, lifetime_ms, json.dumps(dict(queued)), *ids]
        sent = self._clock.seconds()
        d = self._run(VIEW, keys, args)
        d.addCallback(_view, ids)
        d.addCallback(self._timed, sent)
        return d

    def _timed(self, view: ClusterView, sent: float) -> ClusterView:
        """Note the clocks' offset from a view that answered quickly."""
        received = self._clock.seconds()
        rtt_ms = (received - sent) * 1000
        if rtt_ms <= OFFSET_MAX_RTT_MS:
            self.offset_ms = view.now_ms - (sent + received) * 500
        return view

    # -- for the cluster's other tables (the quota table) ---------------------------------------

    def key(self, *parts: str) -> str:
        """A key of this cluster's table: ``{P}:<parts joined by ':'>``."""
        return self._key(*parts)

    def deadline(self) -> int:
        """When Redis should no longer run a call sent now (ms, its clock); 0: unknown."""
        return self._deadline()

    def run(self, script: Script, keys: list[str], args: list[Any]) -> Deferred[Any]:
        """Run another table's ``script`` on this connection, with the same timeout, script
        reloading and failures (:class:`ClusterUnavailable`)."""
        return self._run(script, keys, args)

    # -- transport -----------------------------------------------------------------------------

    def _run(self, script: Script, keys: list[str], args: list[Any]) -> Deferred[Any]:
        """EVALSHA ``script``; on NOSCRIPT load it and try once more. Bounded by the timeout."""
        if self._connected is not None and not self._connected():
            return fail(self._note(ClusterUnavailable("not connected to the cluster's Redis")))
        # Plain callbacks, not a coroutine: this runs twice per request.
        try:
            d: Deferred[Any] = self._redis.evalsha(script.sha, keys, args)
        except Exception:
            d = fail()
        d.addErrback(self._load_and_retry, script, keys, args)
        d.addTimeout(self._timeout, self._clock)
        d.addCallbacks(self._answered, self._unavailable, errbackArgs=(script,))
        return d

    def _answered(self, reply: Any) -> Any:
        if self._failing:
            self._failing = False
            self.log.info("cluster: Redis answers again")
        return reply

    def _load_and_retry(
        self, failure: Failure, script: Script, keys: list[str], args: list[Any]
    ) -> Failure | Deferred[Any]:
        if failure.value is None or not _is_noscript(failure.value):
            return failure
        self.log.info("Redis does not know the {script} script: loading it", script=script.name)
        loading: Deferred[Any] = self._redis.script_load(script.source)
        return loading.addCallback(lambda _: self._redis.evalsha(script.sha, keys, args))

    def _unavailable(self, failure: Failure, script: Script) -> Failure:
        if failure.check(ClusterUnavailable):
            return failure
        # Ours (addTimeout) or the client's own reply timeout, whichever fired first.
        if failure.check(TimeoutError) or type(failure.value).__name__ == "TimeoutError":
            error = ClusterUnavailable(
                f"the cluster's Redis did not answer {script.name} within {self._timeout:g}s"
            )
        else:
            text = failure.getErrorMessage() or type(failure.value).__name__
            error = ClusterUnavailable(f"the cluster's Redis failed {script.name}: {text}")
        return Failure(self._note(error))

    def _note(self, error: ClusterUnavailable) -> ClusterUnavailable:
        """Log the first failure of a run of them (not one line per refused request)."""
        if not self._failing:
            self._failing = True
            self.log.warn("cluster: {error}; refusing leases until Redis answers", error=str(error))
        return error


def _is_noscript(error: BaseException) -> bool:
    """EVALSHA of a script the server does not have (txredisapi's ScriptDoesNotExist or raw)."""
    if type(error).__name__ == "ScriptDoesNotExist":
        return True
    return str(error).startswith("NOSCRIPT")


def _grant(reply: Any) -> Grant | None:
    if reply is None:
        return None
    # One bulk string (cheaper for the client to read than an array): "provider id long expires".
    provider, lease_id, long, expires = _text(reply).split(" ")
    return Grant(
        provider_id=_text(provider),
        lease_id=_text(lease_id),
        long=bool(int(long)),
        expires_at_ms=int(expires),
    )


def _renewed(flags: Any, ids: list[str]) -> frozenset[str]:
    if flags == -2:
        raise ClusterUnavailable("the cluster's Redis ran the renewal after its deadline")
    return frozenset(i for i, ok in zip(ids, flags, strict=True) if int(ok))


def _view(reply: Any, provider_ids: list[str]) -> ClusterView:
    data = json.loads(_text(reply))
    now = int(data["now"])
    edges = []
    for edge_id, seen, report in data.get("edges") or ():
        queued = json.loads(report) if isinstance(report, str) else {}
        edges.append(
            EdgeReport(
                edge_id=str(edge_id),
                queued={str(k): int(v) for k, v in dict(queued or {}).items()},
                age_ms=max(0, now - int(seen)),
            )
        )
    counts = data.get("held") or []
    held = {pid: (int(counts[2 * i]), int(counts[2 * i + 1])) for i, pid in enumerate(provider_ids)}
    return ClusterView(now_ms=now, edges=tuple(edges), held=held)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
