# -*- test-case-name: iop.test.node.test_admission,iop.test.node.test_runs -*-
"""
The Node's admission of one session's work: the checks every run and provider tunnel passes on
its adapter instance's capacity gate, and the table of the work admitted and not yet ended.

A :class:`~iop.node.runs.RunManager` and a :class:`~iop.node.tunnel.TunnelManager` each hold
one :class:`Admission` and call it; it knows nothing of what runs or tunnels do. Admission is one
path for both kinds of work::

    request ─▶ session open? ─▶ run id? ─▶ not already active? ─▶ adapter resolves, enabled?
                                                                          │
                 the kind's own ``check`` (tunnels: HTTP provider, lease, method, path…) ─▶ slot?
                                                                          │
                     any "no": a :class:`Refusal`, answered by the kind's ``refuse`` with one
                     terminal message, nothing queued; all "yes": :class:`Admitted` (the slot
                     held), and the manager builds its item and :meth:`Admission.enter`\\ s it

An at-capacity refusal carries :data:`~iop.runtime.codes.ErrorCode.PROVIDER_AT_CAPACITY` so the
Edge matches on a code, never on the text.

A :class:`WorkGate` (the node's drain, :mod:`iop.node.drain`) may stand in front of the adapter
checks: while it has a refusal (the node is draining and its Edge knows) every new request gets
it, and it hears of each item entering and leaving the active table, so the drain knows when the
node's work in flight has ended. When the session is lost, :meth:`Admission.close`
hands the manager every active item to end (nothing more can be sent) and later requests are
ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from twisted.logger import Logger

from iop.node.adapters.capacity import Slot
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry, UnknownAdapter
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.wire import runtime_pb2 as pb

__all__ = ["CONNECTION_LOST_REASON", "Admission", "Admitted", "Nouns", "Refusal", "WorkGate"]

CONNECTION_LOST_REASON = "edge connection lost"


class Refusal(Exception):
    """
    A request refused before it started. The message is what the Edge is told; ``code`` is the
    machine code it matches on (if any); ``record`` says whether the run store keeps it.
    """

    def __init__(
        self,
        reason: str,
        code: ErrorCode | None = None,
        adapter: str | None = None,
        record: bool = True,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.adapter = adapter
        self.record = record

    @property
    def metadata(self) -> dict[str, str]:
        """The ``metadata`` of the refusal's terminal message."""
        return {ERROR_CODE_KEY: self.code.value} if self.code is not None else {}


class Request(Protocol):
    """What admission reads of a request: its run id and the adapter it names."""

    @property
    def run_id(self) -> str: ...

    @property
    def adapter(self) -> str: ...


class Work(Protocol):
    """What the active table reads of an admitted item."""

    @property
    def run_id(self) -> str: ...

    @property
    def adapter(self) -> str: ...


class WorkGate(Protocol):
    """What may close admission for a whole session, and hears of its work in flight."""

    def refusal(self) -> Refusal | None:
        """Why no new request is admitted now, or None."""

    def entered(self, work: object) -> None:
        """``work`` is active."""

    def left(self, work: object) -> None:
        """``work`` has ended (called once per :meth:`entered`)."""


RequestT = TypeVar("RequestT", bound=Request)
PlanT = TypeVar("PlanT")
WorkT = TypeVar("WorkT", bound=Work)


@dataclass(frozen=True)
class Nouns:
    """
    How logs and refusals name one kind of work: "refusing <work> …", "<request> without a
    run_id", "<active> 'x' is already active on this node".
    """

    work: str
    request: str
    active: str


@dataclass(frozen=True)
class Admitted(Generic[PlanT]):
    """A request that passed every check: its adapter instance, the kind's plan, its slot."""

    instance: AdapterInstance
    plan: PlanT
    slot: Slot


class Admission(Generic[WorkT]):
    """
    Admission, the active table, safe sending and connection loss for one session's work of one
    kind.

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge.
    :param nouns: how logs and refusals name this kind of work.
    :param node_id: for logs.
    :param gate: the session's :class:`WorkGate` (the node's drain), if any.
    """

    log = Logger()

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        nouns: Nouns,
        node_id: str = "",
        gate: WorkGate | None = None,
    ) -> None:
        self._gate = gate
        self._registry = registry
        self._send = send
        self._nouns = nouns
        self._node_id = node_id
        self._active: dict[str, WorkT] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether the session is gone (nothing is admitted or sent any more)."""
        return self._closed

    # -- admission ---------------------------------------------------------------------------

    def admit(
        self,
        request: RequestT,
        check: Callable[[RequestT, AdapterInstance], PlanT],
        refuse: Callable[[RequestT, Refusal], None],
    ) -> Admitted[PlanT] | None:
        """
        Run every check on ``request``: the shared ones, then ``check`` (the kind's own, on an
        enabled instance; it raises :class:`Refusal` or returns the plan), then the capacity
        gate. Returns what was admitted, its slot held; the caller builds its item and
        :meth:`enter`\\ s it. None when the request was refused (logged, then answered by
        ``refuse``) or the session is gone (logged, not answered).
        """
        nouns = self._nouns
        if self._closed:
            self.log.warn(
                "ignoring {work} {run_id}: the edge connection is gone",
                work=nouns.work,
                run_id=request.run_id,
                node_id=self._node_id,
            )
            return None
        try:
            return self._checked(request, check)
        except Refusal as refusal:
            self.log.warn(
                "refusing {work} {run_id} for adapter {adapter}: {error}",
                work=nouns.work,
                run_id=request.run_id,
                adapter=request.adapter,
                error=refusal.reason,
                error_code=refusal.code.value if refusal.code is not None else None,
                node_id=self._node_id,
            )
            refuse(request, refusal)
            return None

    def _checked(
        self, request: RequestT, check: Callable[[RequestT, AdapterInstance], PlanT]
    ) -> Admitted[PlanT]:
        run_id = request.run_id
        if not run_id:
            raise Refusal(f"{self._nouns.request} without a run_id", record=False)
        if run_id in self._active:
            raise Refusal(
                f"{self._nouns.active} {run_id!r} is already active on this node", record=False
            )
        if self._gate is not None:
            closed = self._gate.refusal()
            if closed is not None:
                raise closed
        try:
            instance = self._registry.resolve(request.adapter)
        except UnknownAdapter as e:
            raise Refusal(str(e)) from None
        if not instance.enabled or instance.provider is None:
            raise Refusal(f"adapter {instance.name!r} is disabled", adapter=instance.name)
        plan = check(request, instance)
        gate = instance.gate
        slot = gate.try_acquire()
        if slot is None:
            raise Refusal(
                f"adapter {instance.name!r} is at capacity ({gate.in_use}/{gate.limit})",
                code=ErrorCode.PROVIDER_AT_CAPACITY,
                adapter=instance.name,
            )
        return Admitted(instance, plan, slot)

    # -- the active table --------------------------------------------------------------------

    def enter(self, work: WorkT) -> None:
        """``work``, built from what :meth:`admit` returned, is active (before it starts)."""
        self._active[work.run_id] = work
        if self._gate is not None:
            self._gate.entered(work)

    def leave(self, work: WorkT) -> None:
        """``work`` has ended: out of the table (if it is the item under its run id)."""
        if self._active.get(work.run_id) is work:
            del self._active[work.run_id]
            if self._gate is not None:
                self._gate.left(work)

    def get(self, run_id: str) -> WorkT | None:
        """The active item under ``run_id``, or None."""
        return self._active.get(run_id)

    def is_active(self, run_id: str) -> bool:
        """Whether ``run_id`` names an active item (cancel routing asks this)."""
        return run_id in self._active

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._active

    def __iter__(self) -> Iterator[WorkT]:
        """The active items, in the order they were admitted."""
        return iter(self._active.values())

    def active_count(self, adapter: str | None = None) -> int:
        """Active items, on ``adapter`` (an instance name) or on all adapters."""
        if adapter is None:
            return len(self._active)
        return sum(1 for work in self._active.values() if work.adapter == adapter)

    # -- the session -------------------------------------------------------------------------

    def send(self, envelope: pb.Envelope, run_id: str) -> None:
        """Send unless the session is gone; a failing send is logged, never raised."""
        if self._closed:
            return
        try:
            self._send(envelope)
        except Exception:
            self.log.failure(
                "sending {kind} to the edge failed",
                kind=envelope.WhichOneof("message"),
                run_id=run_id,
                node_id=self._node_id,
            )

    def close(self) -> list[WorkT]:
        """
        The session is gone: from now on nothing is admitted or sent. Returns the active items,
        for the caller to end (they leave the table as they end).
        """
        self._closed = True
        return list(self._active.values())
