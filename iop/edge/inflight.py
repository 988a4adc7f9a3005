# -*- test-case-name: iop.test.edge.test_inflight,iop.test.edge.test_runs -*-
"""
The Edge's table of requests in flight on node connections, shared by runs and tunnels.

Each entry remembers the connection and generation it was sent on, the highest ``sequence`` the
node has sent for it, and the cancel-grace timer of a cancel the node has not answered yet. The
table is the fence: a message counts only from the entry's own connection and in strictly
increasing sequence; a fenced generation's entries are swept out together. What an entry *is*
(a run's handle, a tunnel's stream) and how it ends belongs to the dispatcher that owns the table.

:class:`TerminalCounts` is how each dispatcher counts its ends per node and kind (plain ints,
read by the metrics at scrape time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from iop.edge.errors import DispatchError
from iop.edge.interfaces import INodeConnection, Send
from iop.wire import runtime_pb2 as pb

T = TypeVar("T")


class TerminalCounts:
    """
    Ends per ``(node_id, kind)``, ``kind`` from a fixed vocabulary ``kinds``; :meth:`snapshot`
    lists every given node with every kind (zero until counted).
    """

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, node_id: str, kind: str) -> None:
        key = (node_id, kind)
        self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self, node_ids: Iterable[str]) -> dict[tuple[str, str], int]:
        nodes = list(dict.fromkeys([*node_ids, *(n for n, _ in self._counts)]))
        return {(n, k): self._counts.get((n, k), 0) for n in nodes for k in self.kinds}


@dataclass(eq=False)
class InFlight(Generic[T]):
    """One request sent to a node: what it is, where it went, how far its messages got."""

    key: str
    item: T
    node_id: str
    connection: INodeConnection = field(repr=False)
    generation: int
    last_sequence: int = 0
    cancel_timer: IDelayedCall | None = field(default=None, repr=False)


class InFlightTable(Generic[T]):
    """
    Requests in flight, keyed by run id.

    :param what: what an entry is, for errors and logs (``run``, ``tunnel``).
    :param unit: what the node sends for one (``event``, ``frame``), for logs.
    :param cancel_grace: seconds a cancel waits for the node before :meth:`start_grace` gives up.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, cancel_grace: float, what: str, unit: str) -> None:
        self._clock = clock
        self._cancel_grace = cancel_grace
        self._what = what
        self._unit = unit
        self._entries: dict[str, InFlight[T]] = {}

    def __iter__(self) -> Iterator[InFlight[T]]:
        """The entries in the order they were sent (a snapshot)."""
        return iter(list(self._entries.values()))

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> InFlight[T] | None:
        return self._entries.get(key)

    def add(
        self, key: str, item: T, node_id: str, connection: INodeConnection, generation: int
    ) -> InFlight[T]:
        """Track ``item``; raises :class:`DispatchError` for a key already in flight."""
        if key in self._entries:
            raise DispatchError(f"{self._what} {key!r} is already active")
        entry = InFlight(key, item, node_id, connection, generation)
        self._entries[key] = entry
        return entry

    def accept(self, connection: INodeConnection, key: str, sequence: int) -> InFlight[T] | None:
        """
        The fence for one message from a node: the entry when ``connection`` is the one ``key``
        was sent on and ``sequence`` is past the last one seen (which it becomes); else None,
        logged.
        """
        entry = self._entries.get(key)
        if entry is None or entry.connection is not connection:
            self.log.debug(
                "dropping a {unit} of unknown {what} {run_id}",
                unit=self._unit,
                what=self._what,
                run_id=key,
            )
            return None
        if sequence <= entry.last_sequence:
            self.log.warn(
                "dropping out-of-order {unit} {sequence} of {what} {run_id} (after {last})",
                unit=self._unit,
                what=self._what,
                sequence=sequence,
                last=entry.last_sequence,
                run_id=key,
                node_id=entry.node_id,
            )
            return None
        entry.last_sequence = sequence
        return entry

    def request_cancel(
        self, key: str, reason: str, send: Send, end: Callable[[InFlight[T]], None]
    ) -> None:
        """
        Ask the node to cancel ``key`` (``CancelRequest(CANCEL_RUN)``). ``end(entry)`` ends it
        here: at once when the request cannot be sent, else after the cancel grace unless the
        node has ended it by then.
        """
        entry = self._entries[key]
        request = pb.CancelRequest(kind=pb.CANCEL_RUN, run_id=key, reason=reason)
        try:
            send(entry.connection, pb.Envelope(cancel_request=request))
        except Exception:
            self.log.failure(
                "sending cancel for {what} {run_id} failed", what=self._what, run_id=key
            )
            end(entry)
            return
        self.start_grace(key, end)

    def start_grace(self, key: str, expired: Callable[[InFlight[T]], None]) -> None:
        """After the cancel grace, ``expired(entry)`` unless ``key`` has ended by then."""

        def fire() -> None:
            entry = self._entries.get(key)
            if entry is not None:
                entry.cancel_timer = None
                self.log.warn(
                    "node {node_id} did not confirm cancel of {what} {run_id}; ending it here",
                    node_id=entry.node_id,
                    what=self._what,
                    run_id=key,
                )
                expired(entry)

        entry = self._entries[key]
        entry.cancel_timer = self._clock.callLater(self._cancel_grace, fire)

    def pop(self, key: str) -> InFlight[T] | None:
        """Stop tracking ``key`` (once; None after), cancelling its grace timer."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        timer, entry.cancel_timer = entry.cancel_timer, None
        if timer is not None and timer.active():
            timer.cancel()
        return entry

    def of_generation(self, node_id: str, generation: int) -> list[InFlight[T]]:
        """The sweep on a fence: every entry sent on ``node_id``'s ``generation``."""
        return [
            e for e in self._entries.values() if e.node_id == node_id and e.generation == generation
        ]


__all__ = ["InFlight", "InFlightTable", "TerminalCounts"]
