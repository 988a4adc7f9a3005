# -*- test-case-name: iop.test.config.test_node_config_edges -*-
"""
Tests for node.yaml's ``edges:`` (several Edges, one session each) in :mod:`iop.config.node`:
each entry is checked like ``edge:`` under its own path, exactly one of the two is given, and the
one-line join's repeated or comma-separated ``--edge`` builds the same list.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, parse_node_config
from iop.config.errors import ConfigIssue
from iop.config.model import ClientTLS, EdgeAddress, NodeDaemonConfig, ReconnectPolicy, Secret
from iop.config.node import MAX_EDGES, node_config_from_flags
from iop.test.config.test_node_config import (
    ENVIRON,
    NODE_TOKEN,
    NodeConfigTestCase,
    assertIssue,
    base_config,
)


def edge(host: str, port: int = 7443, **extra: Any) -> dict[str, Any]:
    base = {"host": host, "port": port, "server_name": "edge.iop.internal", "ca_file": "pki/ca.crt"}
    return base | extra


def edges_config(*entries: dict[str, Any]) -> dict[str, Any]:
    data = base_config()
    del data["edge"]
    data["edges"] = list(entries)
    return data


class EdgesSectionTests(NodeConfigTestCase):
    def test_several_edges(self) -> None:
        config = self.parse(
            edges_config(edge("edge-a.example.net"), edge("edge-b.example.net", 8443))
        )
        self.assertEqual(
            [e.name for e in config.edges], ["edge-a.example.net:7443", "edge-b.example.net:8443"]
        )
        ca = os.path.join(self.base, "pki", "ca.crt")
        tls = ClientTLS(ca_file=ca, server_name="edge.iop.internal")
        self.assertEqual(config.edges[1], EdgeAddress("edge-b.example.net", 8443, tls))
        # The first Edge is the single-Edge view existing code reads.
        self.assertEqual((config.edge_host, config.edge_port), ("edge-a.example.net", 7443))
        self.assertEqual(config.tls, tls)
        self.assertFalse(config.plaintext)
        self.assertEqual(config.token.reveal(), NODE_TOKEN)

    def test_one_edge_is_one_entry(self) -> None:
        single = self.parse(base_config())
        self.assertEqual(
            single.edges,
            (EdgeAddress(single.edge_host, single.edge_port, single.tls, single.plaintext),),
        )
        listed = self.parse(edges_config(base_config()["edge"]))
        self.assertEqual(listed, single)

    def test_each_entry_has_its_own_tls(self) -> None:
        config = self.parse(
            edges_config(
                edge("edge-a.example.net", cert_file="pki/node.crt", key_file="pki/node.key"),
                {"host": "127.0.0.1", "port": 17443, "plaintext": True},
            )
        )
        first, second = config.edges
        assert first.tls is not None
        self.assertEqual(first.tls.cert_file, os.path.join(self.base, "pki", "node.crt"))
        self.assertEqual((second.tls, second.plaintext), (None, True))
        self.assertEqual(second.name, "127.0.0.1:17443")

    def test_ipv6_name(self) -> None:
        config = self.parse(edges_config(edge("[::1]"), edge("edge-b.example.net")))
        self.assertEqual(config.edges[0].host, "::1")
        self.assertEqual(config.edges[0].name, "[::1]:7443")

    def test_errors_name_the_entry(self) -> None:
        error = self.fails(
            edges_config(
                edge("edge-a.example.net"),
                edge("edge-b.example.net", 0),
                {"host": "edge-c.example.net", "port": 7443, "plaintext": True, "ca_file": "x"},
            )
        )
        assertIssue(self, error, "edges[1].port", "must be >= 1")
        assertIssue(self, error, "edges[2].ca_file", "must not be set when plaintext is true")
        assertIssue(self, error, "edges[2].plaintext", "when edges[2].host is a loopback")
        self.assertFalse(any(i.path.startswith("edges[0]") for i in error.issues))

    def test_entry_not_a_mapping(self) -> None:
        error = self.fails(edges_config(edge("edge-a.example.net"), "edge-b:7443"))  # type: ignore[arg-type]
        assertIssue(self, error, "edges[1]", "must be a mapping")

    def test_unknown_key_in_entry(self) -> None:
        error = self.fails(edges_config(edge("edge-a.example.net", hots="x")))
        assertIssue(self, error, "edges[0].hots", "unknown key")

    def test_both_edge_and_edges(self) -> None:
        data = edges_config(edge("edge-a.example.net"))
        data["edge"] = edge("edge-b.example.net")
        assertIssue(self, self.fails(data), "edges", "not both")

    def test_neither(self) -> None:
        data = base_config()
        del data["edge"]
        assertIssue(self, self.fails(data), "edge", "is required")

    def test_empty_list(self) -> None:
        assertIssue(self, self.fails(edges_config()), "edges", "at least one Edge")

    def test_not_a_list(self) -> None:
        data = base_config()
        data["edges"] = data.pop("edge")
        assertIssue(self, self.fails(data), "edges", "must be a list")

    def test_too_many(self) -> None:
        many = [edge(f"edge-{i}.example.net") for i in range(MAX_EDGES + 1)]
        assertIssue(self, self.fails(edges_config(*many)), "edges", f"at most {MAX_EDGES}")
        self.assertEqual(len(self.parse(edges_config(*many[:MAX_EDGES])).edges), MAX_EDGES)

    def test_same_edge_twice(self) -> None:
        error = self.fails(edges_config(edge("Edge-A.example.net"), edge("edge-a.example.net")))
        assertIssue(
            self, error, "edges[1]", "dials edge-a.example.net:7443 again (already edges[0])"
        )

    def test_managed_needs_each_client_certificate(self) -> None:
        for name in ("recipient.key", "issuer.pub"):
            self.write(name, "PEM\n")
        data = edges_config(
            edge("edge-a.example.net", cert_file="pki/node.crt", key_file="pki/node.key"),
            edge("edge-b.example.net"),
        )
        data["security"] = {
            "mode": "managed",
            "recipient_key_file": "recipient.key",
            "issuer_key_file": "issuer.pub",
        }
        error = self.fails(data)
        assertIssue(self, error, "edges[1].cert_file", "is required with security.mode: managed")
        self.assertFalse(any(i.path.startswith("edges[0]") for i in error.issues))

    def test_token_never_in_errors(self) -> None:
        error = self.fails(edges_config(edge("edge-a.example.net", 0)), ENVIRON)
        self.assertNotIn(NODE_TOKEN, str(error))


class DirectConstructionTests(SynchronousTestCase):
    def test_edges_default_to_the_single_edge_fields(self) -> None:
        config = NodeDaemonConfig(
            edge_host="127.0.0.1",
            edge_port=17443,
            token=Secret("t"),
            tls=None,
            plaintext=True,
            reconnect=ReconnectPolicy(),
        )
        self.assertEqual(config.edges, (EdgeAddress("127.0.0.1", 17443, None, True),))


class JoinFlagEdgesTests(SynchronousTestCase):
    """Several ``--edge`` values: one ``edges:`` entry each, the TLS flags shared."""

    def setUp(self) -> None:
        self.dir = self.mktemp()
        os.makedirs(self.dir)
        for name, text in (("node.token", NODE_TOKEN + "\n"), ("ca.crt", "ca\n")):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    def build(self, edge: str | list[str], **flags: Any) -> NodeDaemonConfig:
        arguments: dict[str, Any] = {"token_file": "node.token", "ca_file": "ca.crt"}
        arguments.update(flags)
        return node_config_from_flags(edge=edge, base_dir=self.dir, environ={}, **arguments)

    def issues(self, edge: str | list[str], **flags: Any) -> list[ConfigIssue]:
        return list(self.assertRaises(ConfigError, self.build, edge, **flags).issues)

    def test_repeated_and_comma_separated(self) -> None:
        repeated = self.build(["a.example.net:7443", "b.example.net:7443"])
        commas = self.build("a.example.net:7443, b.example.net:7443")
        self.assertEqual(repeated, commas)
        self.assertEqual(
            [e.name for e in repeated.edges], ["a.example.net:7443", "b.example.net:7443"]
        )
        tls = [e.tls for e in repeated.edges]
        # The same TLS flags; each Edge's own host is accepted besides the default name.
        self.assertEqual(
            [t.host_name if t else None for t in tls], ["a.example.net", "b.example.net"]
        )
        self.assertEqual(
            {dataclasses.replace(t, host_name=None) for t in tls if t is not None},
            {tls[0] and dataclasses.replace(tls[0], host_name=None)},
        )
        self.assertEqual(self.build(["a.example.net:7443"]), self.build("a.example.net:7443"))

    def test_same_as_node_yaml(self) -> None:
        from_flags = self.build(["a.example.net:7443", "[::1]:8443"], server_name="gw")
        entries = [
            {"host": h, "port": p, "server_name": "gw", "ca_file": "ca.crt"}
            for h, p in (("a.example.net", 7443), ("::1", 8443))
        ]
        from_yaml = parse_node_config(
            {"edges": entries, "token_file": "node.token"}, base_dir=self.dir, environ={}
        )
        self.assertEqual(from_flags, from_yaml)

    def test_one_bad_address(self) -> None:
        issues = self.issues(["a.example.net:7443", "b.example.net"])
        self.assertEqual([i.path for i in issues], ["--edge"])
        self.assertIn("'b.example.net'", issues[0].message)

    def test_bad_port_in_second(self) -> None:
        issues = self.issues("a.example.net:7443,b.example.net:0")
        self.assertEqual([i.path for i in issues], ["--edge"])
        self.assertIn("must be >= 1", issues[0].message)

    def test_duplicate(self) -> None:
        issues = self.issues("a.example.net:7443,a.example.net:7443")
        self.assertEqual([i.path for i in issues], ["--edge"])
        self.assertIn("again", issues[0].message)

    def test_empty(self) -> None:
        self.assertEqual([i.path for i in self.issues([])], ["--edge"])

    def test_shared_flags_reported_once(self) -> None:
        issues = self.issues(["a.example.net:7443", "b.example.net:7443"], ca_file=None)
        self.assertEqual(issues, [ConfigIssue("--ca-file", "is required with --edge")])
