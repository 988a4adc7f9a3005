# -*- test-case-name: iop.test.edge.refresh.test_build -*-
"""Config refresh as the Edge builds it (:mod:`iop.edge.refresh.build`)."""

from __future__ import annotations

import dataclasses

from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import alsoProvides

from iop.config.model import EdgeConfig
from iop.edge import link
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.leasetable import InProcessTable
from iop.edge.pool import ProviderPool
from iop.edge.refresh import build as refresh
from iop.edge.refresh.service import RefreshOnSignal
from iop.test.edge.fixtures import edge_config


def _refresh(config: EdgeConfig, reactor: MemoryReactorClock) -> refresh.Refresh:
    bus = EventBus(reactor)
    pool = ProviderPool(config, reactor, InProcessTable())
    node_link = link.build(config, bus, reactor, [pool])
    gateway = EdgeGateway(config, pool, node_link.runs, node_link.tunnels)
    return refresh.build(config, pool, gateway, None, node_link, bus, reactor)


class RefreshBuildTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()

    def test_configBuiltInCode(self) -> None:
        """A config read from no file cannot be read again: no refresher, no SIGHUP service."""
        built = _refresh(edge_config(), self.reactor)
        self.assertIsNone(built.refresher)
        alsoProvides(self.reactor, IReactorFromThreads)
        self.assertIsNone(built.on_signal(self.reactor))

    def test_configFromAFile(self) -> None:
        """A config read from a file: a refresher, and SIGHUP where signals can reach it."""
        config = dataclasses.replace(edge_config(), source_path=self.mktemp())
        built = _refresh(config, self.reactor)
        self.assertIsNotNone(built.refresher)
        self.assertIsNone(built.on_signal(self.reactor))
        alsoProvides(self.reactor, IReactorFromThreads)
        sighup = built.on_signal(self.reactor)
        self.assertIsInstance(sighup, RefreshOnSignal)
        assert sighup is not None
        self.assertEqual(sighup.name, "sighup")

    def test_pushesToTheRunningConfigsNodes(self) -> None:
        """The pusher pushes to the nodes of the running config."""
        built = _refresh(edge_config(), self.reactor)
        self.assertEqual(list(built.pusher._node_ids()), ["node-a", "node-b"])
