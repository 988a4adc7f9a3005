"""
Managed mode on the Edge (:mod:`iop.edge.credentials`): the exact binding of a tunnel request,
the lease sealed to its node and opened there, and every refusal failing closed with nothing
sent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import (
    CredentialSlot,
    EdgeConfig,
    EdgeSecurity,
    ProfileConfig,
    Secret,
)
from iop.edge.credentials import CredentialIssuer
from iop.edge.errors import CredentialRefused
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway, Placement
from iop.edge.ingress.errors import client_error
from iop.edge.payload import build_node_payload
from iop.edge.pool import ProviderPool
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.tunnel import TunnelDispatcher
from iop.security.keys import generate_issuer, generate_recipient
from iop.security.lease import LeaseVerifier, ReplayCache
from iop.security.pki import issue_node, make_ca
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb

SECRET = "sk-provider-secret-0123456789"
# principal, slot, route, profile, target, node recipient, the three revisions, the adapter
# instance and the upstream origin the key goes to.
EXPECTED_BINDING = (
    "team-a",
    "main",
    "pool:node-a/a-chat",
    "openai-chat",
    "demo-model",
    "node-a",
    1,
    1,
    1,
    "fake",
    "http://127.0.0.1:1",
)
PROFILE = ProfileConfig(
    name="openai-chat",
    driver="openai_chat",
    operations=(("chat_completions", "/chat/completions"),),
    capabilities=("chat", "streaming"),
    auth_header="authorization",
    auth_scheme="Bearer",
)


def managed(config: EdgeConfig, *, revision: int = 1, enabled: bool = True) -> EdgeConfig:
    """``config`` in managed mode, node-a's a-chat bound to slot ``main``."""
    node_a, node_b = config.nodes
    chat = dataclasses.replace(node_a.providers[0], credential="main", profile=PROFILE.name)
    node_a = dataclasses.replace(node_a, providers=(chat, *node_a.providers[1:]))
    return dataclasses.replace(
        config,
        nodes=(node_a, node_b),
        protocol_profiles=(PROFILE,),
        security=EdgeSecurity(mode="managed", lease_ttl_sec=30.0),
        credentials=(CredentialSlot("main", Secret(SECRET), revision=revision, enabled=enabled),),
    )


class ManagedTunnelTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.config = managed(edge_config())
        self.signing = generate_issuer()
        self.recipients = {"node-a": generate_recipient(), "node-b": generate_recipient()}
        self.issuer = CredentialIssuer(
            self.config,
            self.signing,
            {node: key.public_key() for node, key in self.recipients.items()},
            self.clock,
        )
        pool = ProviderPool(self.config, self.clock)
        self.registry = NodeRegistry(
            self.config,
            lambda n: build_node_payload(self.config, n),
            EventBus(self.clock),
            self.clock,
            [pool],
            lease_check=self.issuer.lease_support_problem,
        )
        self.sent: list[pb.Envelope] = []
        send = lambda c, e: self.sent.append(e)  # noqa: E731
        self.tunnels = TunnelDispatcher(self.registry, self.clock, send)
        self.gateway = EdgeGateway(
            self.config,
            pool,
            RunDispatcher(self.config, self.registry, self.clock, send),
            self.tunnels,
            credentials=self.issuer,
        )
        ca = make_ca("test CA")
        for node_id in ("node-a", "node-b"):
            connection = FakeConnection()
            # Managed: each node proves its workload name with its client certificate.
            _, certificate = issue_node(ca, node_id)
            # ... and announces the lease keys this issuer seals to and signs with.
            announced = self.issuer.lease_support_for(node_id)
            self.registry.register(TOKENS[node_id], connection, certificate, announced)
            self.registry.ready(node_id, connection)
        self.events = EventLoggingObserver()
        globalLogPublisher.addObserver(self.events)
        self.addCleanup(globalLogPublisher.removeObserver, self.events)

    def place(self, principal: str = "team-a") -> Placement:
        placement = self.successResultOf(self.gateway.place("pool", principal=principal))
        self.addCleanup(placement.release)
        return placement

    def on_node(self, placement: Placement) -> Placement:
        """The same placement on node-a (the pool round-robins)."""
        if placement.node_id == "node-a":
            return placement
        placement.release()
        again = self.place(placement.principal)
        assert again.node_id == "node-a", again
        return again

    def open(self, placement: Placement) -> pb.ProviderTunnelRequest:
        self.gateway.tunnel(placement, operation="chat_completions", body=b"{}", stream=False)
        return self.sent[-1].provider_tunnel_request

    def verifier(self, node_id: str = "node-a") -> LeaseVerifier:
        return LeaseVerifier(
            node_id=node_id,
            recipient=self.recipients[node_id],
            issuer=self.signing.public_key(),
            clock_skew_sec=5.0,
            replay=ReplayCache(),
        )

    def test_the_exact_binding_and_a_lease_only_that_node_opens(self) -> None:
        placement = self.on_node(self.place())
        request = self.open(placement)
        binding = request.credential_binding
        self.assertEqual(
            (
                binding.principal,
                binding.slot,
                binding.route,
                binding.profile,
                binding.target,
                binding.node_recipient,
                binding.credential_revision,
                binding.route_revision,
                binding.projection_generation,
                binding.adapter,
                binding.upstream_origin,
            ),
            EXPECTED_BINDING,
        )
        secret = self.verifier().open(request.credential_lease, binding, self.clock.seconds())
        self.assertEqual(bytes(secret), SECRET.encode())
        # Sealed to node-a alone.
        self.assertNotIn(SECRET.encode(), request.SerializeToString())
        self.assertNotIn(SECRET, "".join(formatEvent(e) for e in self.events))

    def test_a_provider_without_a_slot_gets_a_lease_with_no_secret(self) -> None:
        placement = self.place()
        if placement.node_id == "node-a":
            placement.release()
            placement = self.place()
        self.assertEqual(placement.provider_id, "b-chat")
        request = self.open(placement)
        self.assertEqual(request.credential_binding.slot, "")
        self.assertEqual(request.credential_binding.credential_revision, 0)
        opened = self.verifier("node-b").open(
            request.credential_lease, request.credential_binding, self.clock.seconds()
        )
        self.assertEqual(bytes(opened), b"")

    def refused(self, placement: Placement, fragment: str) -> None:
        before = len(self.sent)
        e = self.assertRaises(
            CredentialRefused,
            self.gateway.tunnel,
            placement,
            operation="chat_completions",
            body=b"{}",
            stream=False,
        )
        self.assertIn(fragment, str(e))
        self.assertEqual(len(self.sent), before, "nothing is sent")
        self.assertEqual(self.tunnels.active(), [])
        mapped = client_error(e)
        assert mapped is not None
        self.assertEqual((mapped.status, mapped.code), (503, "credential_unavailable"))

    def test_a_disabled_slot_fails_closed(self) -> None:
        self.issuer.update(managed(edge_config(), enabled=False), 1)
        self.refused(self.on_node(self.place()), "disabled")

    def test_a_node_without_a_recipient_key(self) -> None:
        issuer = CredentialIssuer(
            self.config,
            self.signing,
            {"node-b": self.recipients["node-b"].public_key()},
            self.clock,
        )
        self.gateway._credentials = issuer
        self.refused(self.on_node(self.place()), "recipient key")

    def test_stale_by_send_time(self) -> None:
        placement = self.on_node(self.place())
        for config, generation in (
            (managed(edge_config(), revision=2), 1),  # the slot rotated
            (self.config, 2),  # a new config generation
        ):
            binding = self.issuer.bind(placement)
            self.issuer.update(config, generation)
            e = self.assertRaises(CredentialRefused, self.issuer.seal, placement, binding)
            self.assertIn("stale", str(e))
            self.issuer.update(self.config, 1)

    def with_adapter(self, **changes: Any) -> EdgeConfig:
        """The managed config with node-a's adapter ``fake`` changed."""
        node_a, node_b = self.config.nodes
        adapter = dataclasses.replace(node_a.adapters[0], **changes)
        node_a = dataclasses.replace(node_a, adapters=(adapter,))
        return dataclasses.replace(self.config, nodes=(node_a, node_b))

    def test_the_origin_follows_the_pushed_adapter_config(self) -> None:
        """Another base_url (a port, a scheme) is another origin in the binding."""
        placement = self.on_node(self.place())
        for base_url, origin in (
            ("https://api.example.net/v1", "https://api.example.net:443"),
            ("http://127.0.0.1:8001/v1", "http://127.0.0.1:8001"),
        ):
            self.issuer.update(self.with_adapter(base_url=base_url), 1)
            self.assertEqual(self.issuer.bind(placement).upstream_origin, origin)

    def test_an_adapter_the_node_is_not_given_fails_closed(self) -> None:
        placement = self.on_node(self.place())
        self.issuer.update(self.with_adapter(name="renamed"), 1)
        self.refused(placement, "adapter 'fake' is not configured on node 'node-a'")

    def test_an_adapter_without_an_http_origin_fails_closed(self) -> None:
        placement = self.on_node(self.place())
        self.issuer.update(self.with_adapter(base_url=""), 1)
        self.refused(placement, "no http(s) base_url")

    def test_lease_support(self) -> None:
        """What a node must announce at registration, and why another announcement fails."""
        expected = self.issuer.lease_support_for("node-a")
        assert expected is not None
        key = self.recipients["node-a"]
        self.assertEqual(
            (expected.recipient_key_id, expected.kem, expected.issuer_key_id),
            (key.key_id, key.kem, self.signing.key_id),
        )
        self.assertEqual(self.issuer.lease_support_problem("node-a", expected), "")
        other_key = self.recipients["node-b"].key_id
        for change, fragment in (
            ({"recipient_key_id": other_key}, "recipient_key_file"),
            ({"kem": "mlkem768-x25519"}, "recipient_key_file"),
            ({"issuer_key_id": "ed25519:other"}, "signing_key_file"),
        ):
            announced = pb.LeaseSupport()
            announced.CopyFrom(expected)
            for name, value in change.items():
                setattr(announced, name, value)
            problem = self.issuer.lease_support_problem("node-a", announced)
            self.assertIn(fragment, problem, change)
        self.assertIsNone(self.issuer.lease_support_for("node-c"))
        self.assertIn(
            "no lease recipient key", self.issuer.lease_support_problem("node-c", expected)
        )

    def test_legacy_carries_no_lease(self) -> None:
        self.gateway._credentials = None
        request = self.open(self.place())
        self.assertFalse(request.HasField("credential_binding"))
        self.assertEqual(request.credential_lease, b"")


class FromConfigTests(SynchronousTestCase):
    def test_legacy_has_no_issuer(self) -> None:
        self.assertIsNone(CredentialIssuer.from_config(edge_config(), Clock()))

    def test_managed_loads_every_key(self) -> None:
        from iop.security.keys import write_issuer, write_recipient

        directory = self.mktemp()
        import os

        os.makedirs(directory)
        signing = generate_issuer()
        write_issuer(signing, f"{directory}/issuer.key", f"{directory}/issuer.pub")
        config = managed(edge_config())
        nodes: list[Any] = []
        for node in config.nodes:
            key = generate_recipient()
            write_recipient(key, f"{directory}/{node.id}.key", f"{directory}/{node.id}.pub")
            nodes.append(dataclasses.replace(node, recipient_key_file=f"{directory}/{node.id}.pub"))
        config = dataclasses.replace(
            config,
            nodes=tuple(nodes),
            security=dataclasses.replace(
                config.security, signing_key_file=f"{directory}/issuer.key"
            ),
        )
        issuer = CredentialIssuer.from_config(config, Clock())
        assert issuer is not None
        self.assertEqual(issuer.issuer_key_id, signing.key_id)
