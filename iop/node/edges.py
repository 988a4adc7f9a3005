# -*- test-case-name: iop.test.node.test_edges -*-
"""
A node that dials several Edges: one supervised session per Edge, and the exit policy over them.

Each Edge in node.yaml (``edge:`` or ``edges:``) gets its own
:class:`~iop.node.supervisor.NodeSupervisor`, with its own endpoint, connection factory and
session builder, so each keeps its own register → ready handshake and its own reconnect budget
(``reconnect:`` applies to every session alone). What holds no connection is shared by the
daemon: the run store, the providers' HTTP client and pool, the lease keys and their replay cache.

:class:`EdgeSupervisors` starts and stops them together and decides the process's exit code:

- one supervisor giving up (its budget exhausted, or a fatal answer from its Edge) is logged and
  leaves the others serving;
- :meth:`EdgeSupervisors.when_finished` fires once every supervisor has finished: with 0 if any
  finished with 0 (a local shutdown), otherwise with the highest exit code (every Edge lost).

With one Edge this is exactly that Edge's supervisor's code.

A local shutdown drains first when the node has a :class:`~iop.node.drain.NodeDrain`: the
supervisors (and with them the sessions) stop once the drain has ended, so the sessions stay
open while their work in flight finishes.

:class:`EdgeLogger` is how each session's lines name their Edge: an ``edge`` field
(``host:port``) on every event, and, when the node dials more than one Edge, ``edge host:port:``
in front of the message so text logs say it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.logger import Logger, LogLevel

from iop.node.drain import NodeDrain
from iop.node.supervisor import EXIT_OK, NodeSupervisor

__all__ = ["EdgeLogger", "EdgeSupervisors", "SupervisedEdge"]

log = Logger()


class EdgeLogger(Logger):
    """
    A :class:`Logger` whose every event carries ``edge`` (the Edge's ``host:port``); with
    ``prefix``, the message also begins ``edge host:port:``.
    """

    def __init__(
        self, edge: str, namespace: str, *, prefix: bool = False, source: object = None
    ) -> None:
        super().__init__(namespace, source)
        self.edge = edge
        self.prefix = prefix

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("edge", self.edge)
        if self.prefix and format is not None:
            format = "edge {edge}: " + format
        super().emit(level, format, **kwargs)


@dataclass(frozen=True)
class SupervisedEdge:
    """One Edge the node dials (``host:port``, TLS or not) and the supervisor of its session."""

    name: str
    tls: bool
    supervisor: NodeSupervisor


class EdgeSupervisors(Service):
    """
    Every Edge's supervisor, started and stopped together, with the exit policy of the module
    docstring. ``edges`` is never empty.
    """

    def __init__(self, edges: Sequence[SupervisedEdge], drain: NodeDrain | None = None) -> None:
        if not edges:
            raise ValueError("a node dials at least one Edge")
        self.edges = tuple(edges)
        self.drain = drain
        self._codes: dict[int, int] = {}  # by index in edges
        self._waiters: list[Deferred[int]] = []
        self._stopping = False
        for index, edge in enumerate(self.edges):
            edge.supervisor.when_finished().addCallback(self._one_finished, index)

    # -- public ------------------------------------------------------------------------------

    def when_finished(self) -> Deferred[int]:
        """A new Deferred, fired once every Edge's supervisor has finished (see the module)."""
        if len(self._codes) == len(self.edges):
            return succeed(self._exit_code())
        waiter: Deferred[int] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def describe(self) -> list[dict[str, object]]:
        """Each Edge with its supervisor's state and counters (never the token)."""
        described: list[dict[str, object]] = []
        for edge in self.edges:
            status = edge.supervisor.describe()
            described.append(
                {
                    "edge": edge.name,
                    "tls": edge.tls,
                    "supervisor_state": status["state"],
                    "dials": status["dials"],
                    "attempts": status["attempts"],
                    "last_error": status["last_error"],
                    "exit_code": status["exit_code"],
                }
            )
        return described

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        for edge in self.edges:
            edge.supervisor.startService()

    def stopService(self) -> Deferred[None]:
        """
        Local shutdown: the drain (if any), then every supervisor stops; fires once all have
        finished.
        """
        super().stopService()  # type: ignore[no-untyped-call]
        self._stopping = True
        drained = self.drain.begin() if self.drain is not None else succeed(None)

        def stop(_: object) -> Deferred[None]:
            stopped = [edge.supervisor.stopService() for edge in self.edges]
            return DeferredList(stopped, consumeErrors=True).addCallback(lambda _: None)

        return drained.addCallback(stop)

    # -- each supervisor ---------------------------------------------------------------------

    def _one_finished(self, code: int, index: int) -> None:
        self._codes[index] = code
        edge = self.edges[index]
        serving = [e.name for i, e in enumerate(self.edges) if i not in self._codes]
        if code != EXIT_OK and serving and not self._stopping:
            log.error(
                "gave up on edge {edge} (exit code {code}); still serving through "
                "{count} other edge(s): {serving}",
                edge=edge.name,
                code=code,
                count=len(serving),
                serving=", ".join(serving),
            )
        if serving:
            return
        code = self._exit_code()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(code)

    def _exit_code(self) -> int:
        codes = self._codes.values()
        return EXIT_OK if EXIT_OK in codes else max(codes)
