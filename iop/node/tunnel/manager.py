# -*- test-case-name: iop.test.node.test_tunnel,iop.test.node.test_tunnel_properties -*-
"""
The Node's tunnel manager: the Edge's ``ProviderTunnelRequest``s and tunnel cancels of one
session, admitted on the adapters' capacity gates and served as :class:`~.exchange.Tunnel`\\ s.

::

    ProviderTunnelRequest ─▶ adapter ─▶ ITunnelProvider? ─▶ lease? ─▶ operation → URL ─▶ slot?
                               │             │                │             │              │
                               └─ unknown ───┴─ not HTTP ─────┴─ managed ───┴─ no path ────┴─ full
                                  disabled                       mode: none        ▼
                                                                   one ERROR frame (nothing queued)

Admission goes through the manager's :class:`~iop.node.admission.Admission` on the adapter
instance's :class:`~iop.node.adapters.capacity.CapacityGate` — the same gate, on the same path,
as normalized runs; the tunnel's own checks are :func:`~.plan.tunnel_provider`,
:func:`~.credentials.check_lease_presence` and :func:`~.plan.plan_request`. An at-capacity
ERROR frame carries ``metadata[error_code] = provider_at_capacity``.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.admission import CONNECTION_LOST_REASON, Admission, Nouns, Refusal, WorkGate
from iop.node.tunnel.credentials import check_lease_presence
from iop.node.tunnel.exchange import CANCELLED, Tunnel, TunnelContext, tunnel_span
from iop.node.tunnel.frames import BODY_FRAME_BYTES, TunnelFrames
from iop.node.tunnel.plan import TunnelPlan, plan_request, tunnel_provider
from iop.runtime.codes import ERROR_CODE_KEY
from iop.security.lease import LeaseVerifier
from iop.telemetry.tracing import TRACING_OFF, Tracing, end_span
from iop.wire import runtime_pb2 as pb

__all__ = ["TunnelManager"]

_TUNNEL_NOUNS = Nouns(work="provider tunnel", request="provider tunnel request", active="tunnel")


class TunnelManager:
    """
    Serves the Edge's ``ProviderTunnelRequest``s of one session on the adapters of
    ``registry``.

    :param registry: the session's adapter instances (providers and capacity gates).
    :param send: sends one envelope to the Edge.
    :param clock: idle and overall timeouts.
    :param node_id: for logs.
    :param body_frame_bytes: the largest body a ``BODY`` frame carries.
    :param leases: managed mode: the verifier of this node's credential leases (None: legacy,
        leases refused).
    :param work_gate: the node's drain for this session (:class:`~iop.node.admission.WorkGate`).
    :param tracing: the node's tracing: a span per tunnel and its upstream call.
    """

    log = Logger()

    def __init__(
        self,
        registry: AdapterRegistry,
        send: Callable[[pb.Envelope], None],
        clock: IReactorTime,
        node_id: str = "",
        body_frame_bytes: int = BODY_FRAME_BYTES,
        leases: LeaseVerifier | None = None,
        work_gate: WorkGate | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        if body_frame_bytes < 1:
            raise ValueError("body_frame_bytes must be at least 1")
        self.clock = clock
        self.leases = leases
        self._node_id = node_id
        self._admission: Admission[Tunnel] = Admission(
            registry, send, _TUNNEL_NOUNS, node_id, work_gate
        )
        self._context = TunnelContext(
            clock=clock,
            send_frame=self._send_frame,
            leave=self._admission.leave,
            ended=self._count,
            body_frame_bytes=body_frame_bytes,
            leases=leases,
            node_id=node_id,
            tracing=tracing,
        )
        self._counts = {"completed": 0, "error": 0, "cancelled": 0, "rejected": 0}

    # -- envelope handlers (install these on the session) -------------------------------------

    def tunnel_request_received(self, envelope: pb.Envelope) -> None:
        """The ``provider_tunnel_request`` handler."""
        self.submit(envelope.provider_tunnel_request)

    def cancel_request_received(self, envelope: pb.Envelope) -> None:
        """
        A ``CANCEL_RUN`` for a tunnel: abort it (its ERROR frame goes out) and answer with a
        ``CancelResponse``.
        """
        request = envelope.cancel_request
        ok = request.kind == pb.CANCEL_RUN and self.cancel(request.run_id, request.reason)
        self._admission.send(
            pb.Envelope(
                cancel_response=pb.CancelResponse(
                    kind=request.kind,
                    run_id=request.run_id,
                    session_id=request.session_id,
                    ok=ok,
                    reason="" if ok else f"no active tunnel {request.run_id!r} on this node",
                )
            ),
            request.run_id,
        )

    # -- tunnels -----------------------------------------------------------------------------

    def submit(self, request: pb.ProviderTunnelRequest) -> None:
        """Admit and start one tunnel, or refuse it with a single ERROR frame."""
        admitted = self._admission.admit(request, self._check, self._refused)
        if admitted is None:
            return
        tunnel = Tunnel(self._context, request, admitted)
        self._admission.enter(tunnel)
        tunnel.start()

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Abort an open tunnel: the upstream is disconnected, its ERROR says ``cancelled``."""
        tunnel = self._admission.get(run_id)
        if tunnel is None:
            return False
        message = f"{CANCELLED}: {reason}" if reason else CANCELLED
        self.log.info(
            "cancelling tunnel {run_id} on adapter {adapter}: {reason}",
            run_id=run_id,
            **tunnel.context,
            adapter=tunnel.adapter,
            reason=reason or "cancelled by edge",
            node_id=self._node_id,
        )
        return tunnel.abort(message)

    def is_active(self, run_id: str) -> bool:
        """Whether ``run_id`` names an open tunnel (cancel routing asks this)."""
        return self._admission.is_active(run_id)

    def active_count(self, adapter: str | None = None) -> int:
        """Open tunnels, on ``adapter`` (an instance name) or on all adapters."""
        return self._admission.active_count(adapter)

    def connection_lost(self, reason: str = CONNECTION_LOST_REASON) -> None:
        """
        The session is gone: every open tunnel is aborted (nothing more can be sent) and later
        requests are ignored.
        """
        tunnels = self._admission.close()
        if tunnels:
            self.log.warn(
                "edge connection lost; aborting {count} provider tunnel(s)",
                count=len(tunnels),
                node_id=self._node_id,
            )
        for tunnel in tunnels:
            tunnel.abort(reason)

    # -- status ------------------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        """Open tunnels (identities and progress only) and counters of ended ones."""
        return {
            "active": [
                {
                    "run_id": tunnel.run_id,
                    "adapter": tunnel.adapter,
                    "operation": tunnel.operation,
                    "request_id": tunnel.request_id,
                    "started_unix_ms": int(tunnel.started_at * 1000),
                    "status_code": tunnel.frames.status_code,
                    "body_bytes": tunnel.frames.body_bytes,
                }
                for tunnel in self._admission
            ],
            **self._counts,
        }

    # -- internals ---------------------------------------------------------------------------

    def _check(self, request: pb.ProviderTunnelRequest, instance: AdapterInstance) -> TunnelPlan:
        """The tunnel's own admission checks, in order; :class:`Refusal` at the first "no"."""
        provider = tunnel_provider(instance)
        check_lease_presence(self.leases, request, instance, provider)
        return plan_request(request, instance, provider)

    def _refused(self, request: pb.ProviderTunnelRequest, refusal: Refusal) -> None:
        self._counts["rejected"] += 1
        if self._context.tracing.tracer is not None:
            span = tunnel_span(self._context, request, "", refusal.adapter or request.adapter)
            end_span(span, refusal.metadata.get(ERROR_CODE_KEY) or "refused", refusal.reason)
        TunnelFrames(request.run_id, self._send_frame).error(refusal.reason, refusal.metadata)

    def _send_frame(self, frame: pb.ProviderTunnelFrame) -> None:
        self._admission.send(pb.Envelope(provider_tunnel_frame=frame), frame.run_id)

    def _count(self, outcome: str) -> None:
        self._counts[outcome] += 1
