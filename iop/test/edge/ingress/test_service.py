# -*- test-case-name: iop.test.edge.ingress.test_service -*-
"""The client API as the Edge builds it (:mod:`iop.edge.ingress.service`)."""

from __future__ import annotations

import dataclasses

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.events import EventBus
from iop.edge.ingress import service as ingress
from iop.edge.ingress.listen import ObservedEndpoint
from iop.test.edge.ingress.harness import ingress_config


class ClientApiTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.bus = EventBus(self.reactor)

    def build(self, listen: str | None) -> ingress.ClientApi:
        config = dataclasses.replace(ingress_config().client_api, listen=listen)
        return ingress.build(object(), config, self.bus, self.reactor)  # type: ignore[arg-type]

    def test_noListen(self) -> None:
        """Without ``openai.listen`` there is no client listener."""
        self.assertIsNone(self.build(None).listener(None, self.reactor))

    def test_listener(self) -> None:
        """With it, the listener ``clients`` serves the app's site on the observed endpoint."""
        api = self.build("tcp:0:interface=127.0.0.1")
        clients = api.listener(None, self.reactor)
        assert clients is not None
        self.assertEqual(clients.name, "clients")
        self.assertIsInstance(clients.endpoint, ObservedEndpoint)

    def test_accessLogReadsTheBus(self) -> None:
        """The access log is subscribed to the bus the app publishes on."""
        self.build(None)
        self.assertEqual(len(self.bus._subscriptions), 1)
