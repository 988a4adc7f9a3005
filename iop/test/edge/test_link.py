# -*- test-case-name: iop.test.edge.test_link -*-
"""The node link as the Edge builds it (:mod:`iop.edge.link`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ServerTLS
from iop.edge import link
from iop.edge.events import EventBus
from iop.test.edge.fixtures import FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb


class NodeLinkTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.config = edge_config()
        self.link = link.build(self.config, EventBus(self.reactor), self.reactor)

    def test_answersGoToTheirDispatchers(self) -> None:
        """A ready node's answers have a handler each, the run's events the run dispatcher's
        (and its drain the transport's own)."""
        self.assertEqual(
            sorted(self.link.factory.handlers),
            [
                "cancel_response",
                "node_command_response",
                "node_draining",
                "provider_tunnel_frame",
                "run_event",
            ],
        )

    def test_handleGivesTheMessage(self) -> None:
        """``handle`` routes a kind's envelopes to a handler with the message they carry."""
        seen: list[tuple[Any, Any]] = []
        self.link.handle("node_config_refresh_response", lambda c, m: seen.append((c, m)))
        connection = FakeConnection()
        response = pb.NodeConfigRefreshResponse(request_id="r1")
        self.link.factory.handlers["node_config_refresh_response"](
            connection,  # type: ignore[arg-type]
            pb.Envelope(node_config_refresh_response=response),
        )
        self.assertEqual(seen, [(connection, response)])

    def test_plaintextListener(self) -> None:
        """A loopback plaintext config's listener serves the factory itself, named ``nodes``."""
        nodes = self.link.listener(self.config, self.reactor)
        self.assertEqual(nodes.name, "nodes")
        self.assertIs(nodes.factory, self.link.factory)

    def test_brokenTLSFiles(self) -> None:
        """TLS files that make no context are a usage error naming the problem, at build."""
        config = dataclasses.replace(
            self.config,
            tls=ServerTLS(self.mktemp() + ".crt", self.mktemp() + ".key"),
            plaintext_nodes=False,
        )
        self.assertRaises(usage.UsageError, self.link.listener, config, self.reactor)
