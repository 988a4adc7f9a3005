# -*- test-case-name: iop.test.edge.test_admin_service,iop.test.edge.test_metrics -*-
"""
The admin surface as a part of an Edge: :func:`build` makes the Klein
:class:`~iop.edge.admin.AdminApp` with what it serves — the status snapshot, the dispatchers of
the node link, the gateway, the config refresher, the Prometheus metrics (gauges from the
snapshot and the parts' ``stats()``, counts off the event bus), the web console's event
streams and the usage ledger (``GET /usage``) — and :meth:`AdminSurface.listener` its listener
behind ``admin.auth`` (the console's static shell public), so the Edge's composition root only
hands the service to its tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.web.server import Site

from iop.config.model import EdgeConfig
from iop.edge.admin import AdminApp
from iop.edge.admin_auth import protect
from iop.edge.console import ConsoleEvents, public_shell
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.link import NodeLink
from iop.edge.metrics import EdgeMetrics
from iop.edge.pool import ProviderPool
from iop.edge.quota import QuotaGate
from iop.edge.refresh.service import ConfigRefresher
from iop.usage.ledger import UsageLedger

__all__ = ["AdminSite", "AdminSurface", "build"]


class AdminSite(Site):
    """The admin listener's ``Site``: its reads (``/status``, ``/metrics``, the console's
    polls, every few seconds) are not logged one line each; its writes (runs, commands,
    refreshes) are."""

    # No "Starting factory <... at 0x...>" lines: the Edge's start banner names its listeners.
    noisy = False

    def log(self, request: Any) -> None:
        if request.method not in (b"GET", b"HEAD"):
            super().log(request)


@dataclass(frozen=True)
class AdminSurface:
    """The admin surface's parts, built and not listening."""

    app: AdminApp
    metrics: EdgeMetrics

    def listener(self, config: EdgeConfig, reactor: Any) -> StreamServerEndpointService:
        """The admin listener (named ``admin``) on ``listen.admin``; it raises at start when
        its port cannot be had."""
        resource = self.app.resource()
        admin = StreamServerEndpointService(
            serverFromString(reactor, config.admin_listen_endpoint),
            AdminSite(public_shell(protect(resource, config.admin), resource)),
        )
        admin._raiseSynchronously = True
        admin.setName("admin")
        return admin


def build(
    snapshot: Callable[[], dict[str, Any]],
    bus: EventBus,
    reactor: Any,
    link: NodeLink,
    pool: ProviderPool,
    gateway: EdgeGateway,
    refresher: ConfigRefresher | None,
    usage: UsageLedger | None = None,
    limits: QuotaGate | None = None,
    spans_dropped: Callable[[], int] | None = None,
) -> AdminSurface:
    """The admin surface over ``snapshot`` (``/status``) and the Edge's running parts (the
    usage ledger behind ``GET /usage``, when the Edge keeps one); its metrics subscribe to
    ``bus`` at once."""
    # Prometheus metrics: state read from the status snapshot, counts off the bus.
    metrics = EdgeMetrics(
        snapshot,
        bus.dropped,
        pool_stats=pool.stats,
        registry_stats=link.registry.stats,
        tunnel_stats=link.tunnels.stats,
        run_stats=link.runs.stats,
        echo_stats=link.tunnels.echo_stats,
        tls_refusal_stats=link.factory.tls_refusals.stats,
        budgets=limits.standing if limits is not None else None,
        spans_dropped=spans_dropped,
    )
    bus.subscribe(metrics.observe)
    app = AdminApp(
        snapshot,
        link.runs,
        link.commands,
        link.tunnels,
        gateway,
        refresher,
        metrics=metrics,
        console=ConsoleEvents(bus.subscribe, reactor),
        usage=usage,
        limits=limits,
    )
    return AdminSurface(app, metrics)
