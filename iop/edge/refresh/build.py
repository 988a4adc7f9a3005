# -*- test-case-name: iop.test.edge.refresh.test_build,iop.test.edge.test_admin_refresh -*-
"""
Config refresh as a part of an Edge: :func:`build` makes it from the running parts it switches —
the :class:`~iop.edge.refresh.apply.LiveApplier` over the pool, gateway, credential issuer and
registry, the :class:`~iop.edge.refresh.push.NodePusher` that tells the ready nodes (it
observes readiness after every dispatcher, so it joins the registry after the node link), and,
when the config was read from a file, the :class:`~iop.edge.refresh.service.ConfigRefresher`
behind ``POST /config/refresh`` and :meth:`Refresh.on_signal`'s SIGHUP service — so the Edge's
composition root only hands the refresher to the admin surface and the service to its tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from twisted.application.service import IService
from twisted.internet.interfaces import IReactorFromThreads

from iop.config import load_edge_config
from iop.config.model import EdgeConfig
from iop.edge.credentials import CredentialIssuer
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.link import NodeLink
from iop.edge.pool import ProviderPool
from iop.edge.refresh.apply import ConfigListener, LiveApplier
from iop.edge.refresh.classify import classify
from iop.edge.refresh.push import NodePusher
from iop.edge.refresh.service import ConfigRefresher, RefreshOnSignal

__all__ = ["Refresh", "build"]


@dataclass(frozen=True)
class Refresh:
    """Config refresh's parts; ``refresher`` is ``None`` for a config built in code."""

    applier: LiveApplier
    pusher: NodePusher
    refresher: ConfigRefresher | None

    def on_signal(self, reactor: Any) -> IService | None:
        """SIGHUP applies the config file again (the service named ``sighup``); ``None``
        without a file to read or a reactor that takes calls from a signal handler."""
        if self.refresher is None or not IReactorFromThreads.providedBy(reactor):
            return None
        sighup = RefreshOnSignal(self.refresher, reactor)
        sighup.setName("sighup")
        return sighup


def build(
    config: EdgeConfig,
    pool: ProviderPool,
    gateway: EdgeGateway,
    credentials: CredentialIssuer | None,
    link: NodeLink,
    bus: EventBus,
    reactor: Any,
    listeners: Iterable[ConfigListener] = (),
) -> Refresh:
    """
    Config refresh for an Edge running ``config``: ``listeners`` are told each applied config
    (and its undo); the pusher pushes to the nodes of the running config.
    """
    applier = LiveApplier(config, pool, gateway, credentials, link.registry, listeners=listeners)
    pusher = NodePusher(
        link.registry,
        applier.payload,
        bus,
        reactor,
        node_ids=lambda: [n.id for n in applier.config.nodes],
    )
    link.handle("node_config_refresh_response", pusher.response_received)
    # A config read from a file can be read again (a config built in code cannot).
    refresher: ConfigRefresher | None = None
    if config.source_path:
        source = config.source_path
        refresher = ConfigRefresher(
            lambda: load_edge_config(source), classify, applier, pusher, reactor
        )
    return Refresh(applier, pusher, refresher)
