"""The twistd plugins' Options and makeService, driven with memory reactors."""

from __future__ import annotations

import os
from typing import Any, cast

import yaml
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from iop.edge import tap as edge_tap
from iop.edge.transport import NodeConnectionFactory
from iop.node import tap as node_tap
from iop.runtime import AdapterContext, TreqClient
from iop.testing.pki import create_dev_pki

TOKEN = "tap-test-token"


class TapTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        create_dev_pki(os.path.join(self.dir, "pki"), node_names=["node-a"])
        with open(os.path.join(self.dir, "node.token"), "w") as f:
            f.write(TOKEN)

    def write(self, name: str, data: dict[str, Any]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            yaml.safe_dump(data, f)
        return path

    def edge_yaml(self, **transport: Any) -> str:
        return self.write(
            "edge.yaml",
            {
                "listen": {
                    "nodes": "tcp:17443:interface=127.0.0.1",
                    "admin": "tcp:18081:interface=127.0.0.1",
                },
                "node_transport": transport
                or {"tls": {"cert_file": "pki/edge.crt", "key_file": "pki/edge.key"}},
                "nodes": [{"id": "node-a", "token_file": "node.token"}],
            },
        )

    def node_yaml(self, **extra: Any) -> str:
        return self.write(
            "node.yaml",
            {
                "edge": {
                    "host": "127.0.0.1",
                    "port": 17443,
                    "ca_file": "pki/ca.crt",
                    "server_name": "edge.iop.internal",
                },
                "token_file": "node.token",
                "reconnect": {"max_attempts": 2, "interval_sec": 1},
                **extra,
            },
        )

    def test_edge_options_load_config(self) -> None:
        options = edge_tap.Options()
        options.parseOptions(["--config", self.edge_yaml()])
        self.assertEqual(options.edge_config.nodes[0].id, "node-a")

    def test_edge_options_reject_bad_config_naming_the_path(self) -> None:
        path = self.write("bad.yaml", {"listen": {"nodes": "tcp:1"}, "nodes": [{"id": "x"}]})
        options = edge_tap.Options()
        e = self.assertRaises(usage.UsageError, options.parseOptions, ["--config", path])
        self.assertIn("nodes[0]", str(e))

    def test_edge_service_listens_with_tls(self) -> None:
        options = edge_tap.Options()
        options.parseOptions(["--config", self.edge_yaml()])
        reactor = MemoryReactorClock()
        service: Any = edge_tap.makeService(options, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        ports: dict[int, Any] = {port: f for port, f, _, _ in reactor.tcpServers}
        self.assertEqual(set(ports), {17443, 18081})
        self.assertIsInstance(ports[17443], TLSMemoryBIOFactory)
        self.assertIsInstance(ports[17443].wrappedFactory, NodeConnectionFactory)
        self.assertEqual({s[3] for s in reactor.tcpServers}, {"127.0.0.1"})
        # A burst of reconnecting nodes or admin calls queues instead of being refused.
        self.assertEqual({s[2] for s in reactor.tcpServers}, {1024})

    def test_edge_listeners_keep_a_backlog_they_set(self) -> None:
        path = self.edge_yaml()
        text = open(path).read().replace("tcp:18081:", "tcp:18081:backlog=7:")
        open(path, "w").write(text)
        options = edge_tap.Options()
        options.parseOptions(["--config", path])
        reactor = MemoryReactorClock()
        service: Any = edge_tap.makeService(options, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual({port: b for port, _, b, _ in reactor.tcpServers}, {17443: 1024, 18081: 7})

    def test_edge_plaintext_on_loopback_only_when_asked(self) -> None:
        options = edge_tap.Options()
        options.parseOptions(["--config", self.edge_yaml(plaintext=True)])
        reactor = MemoryReactorClock()
        service: Any = edge_tap.makeService(options, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        ports = {port: factory for port, factory, _, _ in reactor.tcpServers}
        self.assertIsInstance(ports[17443], NodeConnectionFactory)

    def test_node_options_and_service_dial(self) -> None:
        options = node_tap.Options()
        options.parseOptions(["--config", self.node_yaml()])
        self.assertEqual(options.node_config.edge_port, 17443)
        self.assertNotIn(TOKEN, repr(options.node_config))
        reactor = MemoryReactorClock()
        service: Any = node_tap.makeService(options, reactor)
        service.startService()
        reactor.advance(0)
        self.assertEqual([(h, p) for h, p, *_ in reactor.tcpClients], [("127.0.0.1", 17443)])
        self.successResultOf(service.stopService())

    def test_node_service_takes_its_http_client(self) -> None:
        """The HTTP client is a collaborator: given, adapters get it and no pool is made."""
        options = node_tap.Options()
        options.parseOptions(["--config", self.node_yaml()])
        reactor = MemoryReactorClock()
        http = StubTreq(Resource())
        service: Any = node_tap.makeService(options, reactor, http=cast(TreqClient, http))
        service.startService()
        reactor.advance(0)
        # Down the endpoint's and TLS's wrappers to the (proxied) EdgeConnectionFactory.
        factory: Any = reactor.tcpClients[0][2]
        while not hasattr(factory, "sessions"):
            factory = getattr(factory, "_wrappedFactory", None) or factory.wrappedFactory
        context: AdapterContext = factory.sessions.adapter_context
        self.assertIs(context.http, http)
        self.assertIs(context.reactor, reactor)
        self.assertIsNone(service.getServiceNamed("node")._http_pool)
        self.successResultOf(service.stopService())

    def test_node_service_default_http_client_is_pooled(self) -> None:
        options = node_tap.Options()
        options.parseOptions(["--config", self.node_yaml()])
        service: Any = node_tap.makeService(options, MemoryReactorClock())
        pool = service.getServiceNamed("node")._http_pool
        self.assertEqual(pool.maxPersistentPerHost, node_tap.UPSTREAM_KEEPALIVE_PER_HOST)

    def test_node_options_reject_adapters(self) -> None:
        options = node_tap.Options()
        e = self.assertRaises(
            usage.UsageError,
            options.parseOptions,
            ["--config", self.node_yaml(adapters=[{"type": "ollama"}])],
        )
        self.assertIn("adapters", str(e))
