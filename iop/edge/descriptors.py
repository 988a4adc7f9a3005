# -*- test-case-name: iop.test.edge.test_descriptors -*-
"""
How many client connections the Edge can afford: its open-file limit (``RLIMIT_NOFILE``) less
the descriptors the rest of the process needs.

Every client connection is a file descriptor, and so is every node connection, every admin
connection, the listening sockets, the log file, a Redis connection, a file read at a refresh.
When the process runs out, ``accept()`` fails with ``EMFILE`` on *every* listener: a flood of
client connections would lock the nodes and the operator out with them. So the client listener
stops short of the limit:

- :func:`reserve` — descriptors kept for everything but client connections: a fixed
  :data:`BASE_RESERVE` (stdio, the reactor's own, the listening sockets, log files, files read
  at a refresh or by ``/metrics``), :data:`ADMIN_RESERVE` for the admin listener, two per
  configured node (its connection and the one replacing it while the old one is found dead)
  plus :data:`NODE_SPARE`, and :data:`CLUSTER_RESERVE` for Redis in a cluster;
- :func:`client_caps` — from the limit less the reserve: the descriptors the client listener
  may hold at once (served connections and those being refused), the connections it serves at
  once (``openai.max_connections``, clamped to what fits with room for refusals) and per peer
  address (``openai.max_connections_per_peer``, by default a quarter of the served cap);
- :func:`raise_soft_limit` — at start, the soft limit is raised toward the hard one, as far as
  the config asks for (what ``LimitNOFILE=1024:524288``, systemd's default, expects of a
  program that does not use ``select()``); never past ``FD_SETSIZE`` on the select reactor.

Nothing here does I/O but :func:`raise_soft_limit`, which reads and sets the limit through the
functions it is given. :func:`descriptor_caps` puts them together for an Edge's config at start,
and :class:`DescriptorReport` (a service) logs what it took.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet.selectreactor import SelectReactor
from twisted.logger import Logger
from twisted.python import usage

from iop.config.model import EdgeConfig

__all__ = [
    "ADMIN_RESERVE",
    "BASE_RESERVE",
    "CLUSTER_RESERVE",
    "NODE_SPARE",
    "ClientCaps",
    "DescriptorLimit",
    "DescriptorReport",
    "OpenFiles",
    "TooFewDescriptors",
    "client_caps",
    "descriptor_caps",
    "raise_soft_limit",
    "refusal_room",
    "reserve",
    "wanted_limit",
]

# stdio, the reactor (epoll, its waker), the three listening sockets, the log file and its
# rotation, files read at a refresh (config, keys, certificates) or by /metrics (/proc), the
# console's assets, name lookups.
BASE_RESERVE = 64
# The admin listener's connections: console event streams, scrapes, the iop command.
ADMIN_RESERVE = 64
# Per configured node: its connection, and its next one while the old is being found dead.
PER_NODE = 2
# Connections from nodes the config does not name (refused at registration), TLS handshakes.
NODE_SPARE = 16
# A cluster's Redis connections (commands, the wake-up subscription) and their reconnects.
CLUSTER_RESERVE = 8
# Below this many served client connections the Edge does not start: raise the limit.
MIN_CLIENT_CONNECTIONS = 16
# Room for connections being refused (a 503 and a lingering close of at most 2 s): an eighth
# of the served cap, at least this.
MIN_REFUSAL_ROOM = 16
# A per-peer cap not given is this fraction of the served cap.
PER_PEER_SHARE = 4
# select() cannot watch a descriptor numbered FD_SETSIZE (1024) or more.
FD_SETSIZE = 1024
# How a limit of RLIM_INFINITY is counted (Linux never grants more than fs.nr_open, 2**20 by
# default).
UNLIMITED = 1 << 30


class TooFewDescriptors(Exception):
    """The process may open too few files to serve clients beside its nodes and admin."""


@dataclass(frozen=True)
class DescriptorLimit:
    """``RLIMIT_NOFILE`` as found at start (``found``) and as the process now runs (``soft``,
    ``hard``)."""

    found: int
    soft: int
    hard: int


@dataclass(frozen=True)
class ClientCaps:
    """
    The client listener's caps: at most ``descriptors`` connections held at once (served or
    being refused; at it, the listener stops accepting until one closes), ``max_connections``
    served at once, ``max_connections_per_peer`` from one address. ``clamped`` names each
    config value that was more than the process can afford, with the value given.
    """

    descriptors: int
    max_connections: int
    max_connections_per_peer: int
    clamped: tuple[tuple[str, int], ...] = ()


def reserve(nodes: int, *, cluster: bool = False) -> int:
    """The descriptors kept for all but client connections, with ``nodes`` configured."""
    return (
        BASE_RESERVE
        + ADMIN_RESERVE
        + PER_NODE * nodes
        + NODE_SPARE
        + (CLUSTER_RESERVE if cluster else 0)
    )


def refusal_room(max_connections: int) -> int:
    """Descriptors beyond the served cap for connections being refused."""
    return max(MIN_REFUSAL_ROOM, max_connections // 8)


def wanted_limit(reserved: int, max_connections: int) -> int:
    """The soft limit at which ``max_connections`` is served unclamped."""
    return reserved + max_connections + refusal_room(max_connections)


def client_caps(
    max_connections: int,
    max_connections_per_peer: int | None,
    available: int | None = None,
) -> ClientCaps:
    """
    The client listener's caps for the configured ``max_connections`` and
    ``max_connections_per_peer`` (None: not given) when ``available`` descriptors are left for
    client connections (the limit less :func:`reserve`; None: no limit).

    @raise TooFewDescriptors: fewer than :data:`MIN_CLIENT_CONNECTIONS` fit.
    """
    served = max_connections
    clamped: list[tuple[str, int]] = []
    if available is not None:
        affordable = available * 8 // 9
        while affordable > 0 and affordable + refusal_room(affordable) > available:
            affordable -= 1
        if affordable < MIN_CLIENT_CONNECTIONS:
            raise TooFewDescriptors(
                f"{available} descriptors are left for client connections, room for "
                f"{max(affordable, 0)} (at least {MIN_CLIENT_CONNECTIONS} are needed)"
            )
        if affordable < served:
            clamped.append(("max_connections", served))
            served = affordable
    if max_connections_per_peer is None:
        per_peer = max(1, served // PER_PEER_SHARE)
    else:
        per_peer = min(max_connections_per_peer, served)
        if per_peer < max_connections_per_peer:
            clamped.append(("max_connections_per_peer", max_connections_per_peer))
    return ClientCaps(served + refusal_room(served), served, per_peer, tuple(clamped))


GetLimit = Callable[[int], tuple[int, int]]
SetLimit = Callable[[int, tuple[int, int]], None]


def raise_soft_limit(
    wanted: int | None,
    *,
    ceiling: int | None = None,
    getrlimit: GetLimit = resource.getrlimit,
    setrlimit: SetLimit = resource.setrlimit,
) -> DescriptorLimit:
    """
    Read ``RLIMIT_NOFILE``; raise its soft limit to ``wanted`` (None: leave it), never past the
    hard limit nor ``ceiling``, and never lower it. A refused raise leaves the limit as it was.
    """
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    found = UNLIMITED if soft == resource.RLIM_INFINITY else soft
    top = UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if ceiling is not None:
        top = min(top, ceiling)
    target = min(wanted, top) if wanted is not None else found
    if target > found:
        try:
            setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            target = found
    return DescriptorLimit(found, max(target, found), hard)


# Reads RLIMIT_NOFILE and raises its soft limit to the number given (None: only reads), never
# past ``ceiling``: :func:`iop.edge.descriptors.raise_soft_limit`, or a test's stand-in.
OpenFiles = Callable[..., DescriptorLimit]


class DescriptorReport(Service):
    """Says at start what the Edge took from its open-file limit (and what it had to clamp)."""

    log = Logger()

    def __init__(
        self, limit: DescriptorLimit, reserved: int, caps: ClientCaps | None, wanted: int
    ) -> None:
        self.limit = limit
        self.reserved = reserved
        self.caps = caps
        self.wanted = wanted

    def startService(self) -> None:
        super().startService()
        limit, caps = self.limit, self.caps
        hard = "unlimited" if limit.hard < 0 else str(limit.hard)
        if caps is None:
            self.log.info(
                "open files: limit {soft} (found {found}, hard {hard}), {reserve} reserved for "
                "nodes, admin and the process; no client listener",
                soft=limit.soft,
                found=limit.found,
                hard=hard,
                reserve=self.reserved,
            )
            return
        self.log.info(
            "open files: limit {soft} (found {found}, hard {hard}), {reserve} reserved for "
            "nodes, admin and the process; client listener: {max_connections} connections "
            "served, {per_peer} per address, {descriptors} open at most",
            soft=limit.soft,
            found=limit.found,
            hard=hard,
            reserve=self.reserved,
            max_connections=caps.max_connections,
            per_peer=caps.max_connections_per_peer,
            descriptors=caps.descriptors,
        )
        taken = {"max_connections": caps.max_connections,
                 "max_connections_per_peer": caps.max_connections_per_peer}  # fmt: skip
        for key, given in caps.clamped:
            self.log.warn(
                "openai.{key}: {given} is more than this process can afford under its "
                "open-file limit ({soft}): {cap} instead; raise LimitNOFILE (ulimit -n) to at "
                "least {wanted} for the configured caps",
                key=key,
                given=given,
                soft=limit.soft,
                cap=taken[key],
                wanted=self.wanted,
            )


def descriptor_caps(
    config: EdgeConfig, reactor: Any, open_files: OpenFiles
) -> tuple[DescriptorReport, ClientCaps | None]:
    """
    Read (and raise) the open-file limit, and the client listener's caps under it.

    @raise usage.UsageError: the limit leaves too few descriptors for client connections.
    """
    reserved = reserve(len(config.nodes), cluster=config.cluster is not None)
    api = config.client_api
    serving = api.listen is not None
    wanted = wanted_limit(reserved, api.max_connections) if serving else reserved
    # select() watches no descriptor numbered FD_SETSIZE or more.
    ceiling = FD_SETSIZE if isinstance(reactor, SelectReactor) else None
    limit = open_files(wanted, ceiling=ceiling)
    caps: ClientCaps | None = None
    if serving:
        usable = limit.soft if ceiling is None else min(limit.soft, ceiling)
        try:
            caps = client_caps(api.max_connections, api.max_connections_per_peer, usable - reserved)
        except TooFewDescriptors as e:
            raise usage.UsageError(
                f"open files: the limit is {usable} and {reserved} are reserved for nodes, "
                f"admin and the process: {e}; raise LimitNOFILE (ulimit -n) to at least "
                f"{wanted}"
            ) from None
    return DescriptorReport(limit, reserved, caps, wanted), caps
