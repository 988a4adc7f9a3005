# -*- test-case-name: iop.test.node.test_link -*-
"""The node's links to its Edges as the node builds them (:mod:`iop.node.link`)."""

from __future__ import annotations

from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ClientTLS, EdgeAddress, NodeDaemonConfig, ReconnectPolicy, Secret
from iop.node import link
from iop.node.store import RunStore, SynchronousExecutor
from iop.runtime.interfaces import AdapterContext


def _config(*edges: EdgeAddress) -> NodeDaemonConfig:
    return NodeDaemonConfig(
        edge_host=edges[0].host,
        edge_port=edges[0].port,
        token=Secret("a-node-token"),
        tls=edges[0].tls,
        plaintext=edges[0].plaintext,
        reconnect=ReconnectPolicy(max_attempts=2, interval_sec=1),
        edges=edges,
    )


class NodeLinkTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.config = _config(
            EdgeAddress("127.0.0.1", 17443, None, plaintext=True),
            EdgeAddress("127.0.0.1", 17444, None, plaintext=True),
        )

    def test_plaintextEndpoints(self) -> None:
        """A plaintext Edge is dialled over TCP alone, each Edge on its own endpoint."""
        endpoints = link.edge_endpoints(self.config, self.reactor)
        self.assertEqual([type(e) for e in endpoints], [HostnameEndpoint, HostnameEndpoint])

    def test_brokenTLSFiles(self) -> None:
        """TLS files that make no client context are a usage error, before anything is built."""
        config = _config(
            EdgeAddress("127.0.0.1", 17443, ClientTLS(self.mktemp(), "edge.iop.internal"))
        )
        self.assertRaises(usage.UsageError, link.edge_endpoints, config, self.reactor)

    def test_oneSupervisedSessionPerEdge(self) -> None:
        """One supervisor per Edge, in the config's order, under ``supervisor``; each session's
        transport status names its Edge."""
        store = RunStore(":memory:", Clock(), SynchronousExecutor())
        supervisors = link.build(
            self.config,
            link.edge_endpoints(self.config, self.reactor),
            self.reactor,
            AdapterContext(reactor=self.reactor, http=None),
            store,
            None,
        )
        self.assertEqual(supervisors.name, "supervisor")
        self.assertEqual(
            [edge["edge"] for edge in supervisors.describe()],
            ["127.0.0.1:17443", "127.0.0.1:17444"],
        )
