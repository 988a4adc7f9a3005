# -*- test-case-name: iop.test.node.test_runs,iop.test.node.test_tunnel -*-
"""
The skeleton the Node's run manager and tunnel manager share: one session's admitted work on
its adapter instances' capacity gates.

Admission is one path for both kinds of work::

    request ─▶ session open? ─▶ run id? ─▶ not already active? ─▶ adapter resolves, enabled?
                                                                          │
                       the kind's own checks (tunnels: HTTP provider, method, path…) ─▶ slot?
                                                                          │
                     any "no": a :class:`Refusal`, answered with one terminal message,
                     nothing queued; all "yes": the work is opened and in the active table

An at-capacity refusal carries :data:`~iop.runtime.codes.ErrorCode.PROVIDER_AT_CAPACITY` so the
Edge matches on a code, never on the text. When the session is lost, every active item is ended
(nothing more can be sent) and later requests are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Generic, Protocol, TypeVar

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from iop.node.adapters.capacity import Slot
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry, UnknownAdapter
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.wire import runtime_pb2 as pb

__all__ = ["CONNECTION_LOST_REASON", "Refusal", "WorkManager"]

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


class _Request(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def adapter(self) -> str: ...


class _Work(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def adapter(self) -> str: ...


RequestT = TypeVar("RequestT", bound=_Request)
PlanT = TypeVar("PlanT")
WorkT = TypeVar("WorkT", bound=_Work)


class WorkManager(Generic[RequestT, PlanT, WorkT]):
    """
    Admission, the active table, safe sending and connection loss for one session's work.

    A subclass names its work (:attr:`noun`…) and fills in :meth:`_check` (its own checks,
    returning what :meth:`_open` needs), :meth:`_open` (build the item), :meth:`_start` (run
    it, once it is in the active table), :meth:`_refused` (answer a refusal) and :meth:`_lose`
    (end an item whose session is gone).

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge.
    :param clock: time for timeouts and timestamps.
    :param node_id: for logs.
    """

    log = Logger()

    # For logs and refusals: "refusing <noun> …", "<request_noun> without a run_id",
    # "<active_noun> 'x' is already active on this node", and the connection-lost summary.
    noun: ClassVar[str]
    request_noun: ClassVar[str]
    active_noun: ClassVar[str]
    lost_message: ClassVar[str]

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        clock: IReactorTime,
        node_id: str = "",
    ) -> None:
        self._registry = registry
        self._send = send
        self.clock = clock
        self._node_id = node_id
        self._active: dict[str, WorkT] = {}
        self._closed = False

    # -- admission ---------------------------------------------------------------------------

    def submit(self, request: RequestT) -> None:
        """Admit and start one item, or refuse it with a single terminal message."""
        if self._closed:
            self.log.warn(
                f"ignoring {self.noun} {{run_id}}: the edge connection is gone",
                run_id=request.run_id,
                node_id=self._node_id,
            )
            return
        try:
            instance, plan, slot = self._admit(request)
        except Refusal as refusal:
            self.log.warn(
                f"refusing {self.noun} {{run_id}} for adapter {{adapter}}: {{error}}",
                run_id=request.run_id,
                adapter=request.adapter,
                error=refusal.reason,
                error_code=refusal.code.value if refusal.code is not None else None,
                node_id=self._node_id,
            )
            self._refused(request, refusal)
            return
        work = self._open(request, instance, plan, slot)
        self._active[work.run_id] = work
        self._start(work, request)

    def _admit(self, request: RequestT) -> tuple[AdapterInstance, PlanT, Slot]:
        run_id = request.run_id
        if not run_id:
            raise Refusal(f"{self.request_noun} without a run_id", record=False)
        if run_id in self._active:
            raise Refusal(
                f"{self.active_noun} {run_id!r} is already active on this node", record=False
            )
        try:
            instance = self._registry.resolve(request.adapter)
        except UnknownAdapter as e:
            raise Refusal(str(e)) from None
        if not instance.enabled or instance.provider is None:
            raise Refusal(f"adapter {instance.name!r} is disabled", adapter=instance.name)
        plan = self._check(request, instance)
        gate = instance.gate
        slot = gate.try_acquire()
        if slot is None:
            raise Refusal(
                f"adapter {instance.name!r} is at capacity ({gate.in_use}/{gate.limit})",
                code=ErrorCode.PROVIDER_AT_CAPACITY,
                adapter=instance.name,
            )
        return instance, plan, slot

    # -- the active table --------------------------------------------------------------------

    def is_active(self, run_id: str) -> bool:
        """Whether ``run_id`` names an active item (cancel routing asks this)."""
        return run_id in self._active

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._active

    def active_count(self, adapter: str | None = None) -> int:
        """Active items, on ``adapter`` (an instance name) or on all adapters."""
        if adapter is None:
            return len(self._active)
        return sum(1 for work in self._active.values() if work.adapter == adapter)

    def _forget(self, work: WorkT) -> None:
        if self._active.get(work.run_id) is work:
            del self._active[work.run_id]

    # -- the session -------------------------------------------------------------------------

    def connection_lost(self, reason: str = CONNECTION_LOST_REASON) -> None:
        """
        The session is gone: end every active item (nothing more can be sent) and ignore new
        requests from now on.
        """
        self._closed = True
        items = list(self._active.values())
        if items:
            self.log.warn(self.lost_message, count=len(items), node_id=self._node_id)
        for work in items:
            self._lose(work, reason)

    def _safe_send(self, envelope: pb.Envelope, run_id: str) -> None:
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

    def _now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # -- the kind's own parts ----------------------------------------------------------------

    def _check(self, request: RequestT, instance: AdapterInstance) -> PlanT:
        """The kind's own admission checks on an enabled instance; raise :class:`Refusal`."""
        raise NotImplementedError

    def _open(self, request: RequestT, instance: AdapterInstance, plan: PlanT, slot: Slot) -> WorkT:
        """The admitted item (not started yet; it holds ``slot``)."""
        raise NotImplementedError

    def _start(self, work: WorkT, request: RequestT) -> None:
        """Run ``work``, which is in the active table now."""
        raise NotImplementedError

    def _refused(self, request: RequestT, refusal: Refusal) -> None:
        """Answer (and count) a refusal, already logged."""
        raise NotImplementedError

    def _lose(self, work: WorkT, reason: str) -> None:
        """End ``work`` because the session is gone (``_closed`` is set: nothing is sent)."""
        raise NotImplementedError
