# -*- test-case-name: iop.test.edge.test_admin_service -*-
"""The admin surface as the Edge builds it (:mod:`iop.edge.admin_service`)."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Site
from twisted.web.test.requesthelper import DummyRequest

from iop.edge import admin_service, link
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.leasetable import InProcessTable
from iop.edge.pool import ProviderPool
from iop.test.edge.fixtures import edge_config


class AdminSurfaceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.config = edge_config()
        self.bus = EventBus(self.reactor)
        pool = ProviderPool(self.config, self.reactor, InProcessTable())
        node_link = link.build(self.config, self.bus, self.reactor, [pool])
        gateway = EdgeGateway(self.config, pool, node_link.runs, node_link.tunnels)
        self.surface = admin_service.build(
            lambda: {}, self.bus, self.reactor, node_link, pool, gateway, None
        )

    def test_metricsReadTheBus(self) -> None:
        """The metrics and the console (what a new console is told first) read the bus."""
        self.assertEqual(len(self.bus._subscriptions), 2)

    def test_listener(self) -> None:
        admin = self.surface.listener(self.config, self.reactor)
        self.assertEqual(admin.name, "admin")
        self.assertIsInstance(admin.factory, admin_service.AdminSite)

    def test_readsAreNotLogged(self) -> None:
        """The admin site logs writes, one line each, and not reads."""
        logged: list[Any] = []
        self.patch(Site, "log", lambda site, request: logged.append(request.method))
        site = self.surface.listener(self.config, self.reactor).factory
        for method in (b"GET", b"HEAD", b"POST"):
            request = DummyRequest([b""])
            request.method = method
            site.log(request)
        self.assertEqual(logged, [b"POST"])
