# -*- test-case-name: iop.test.security.test_tls -*-
# mypy: disallow-untyped-calls=False
# (trial's assertions and Twisted's ssl helpers are unannotated)
"""
Tests for L{iop.security.tls} and the dev PKI in L{iop.testing.pki}.

Handshakes are real TLS, in memory: two L{TLSMemoryBIOFactory} protocols joined by an
L{iosim} pump, no sockets.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import io
import os
import pathlib
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from OpenSSL import SSL
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLClientConnectionCreator
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import (
    Certificate,
    CertificateOptions,
    PrivateCertificate,
    TLSVersion,
    optionsForClientTLS,
)
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.test.iosim import IOPump, connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.config.model import ClientTLS, ServerTLS
from iop.security import pki as security_pki
from iop.security.tls import (
    REFUSAL_REASONS,
    EdgeNameMismatch,
    EdgeRefused,
    HandshakeRefusal,
    TLSConfigError,
    VerifyFailure,
    WorkloadIdentityError,
    certificate_common_names,
    certificate_dns_names,
    classify_refusal,
    client_connection_creator,
    edge_refusal,
    handshake_refusal,
    peer_certificate,
    server_context_factory,
    verify_peer_workload,
)
from iop.testing import pki

EDGE_NAME = "edge.iop.internal"
NODE_GREETING = b"hello from the node"
EDGE_GREETING = b"hello from the edge"


# ---------------------------------------------------------------------------------------------
# Module-level PKI (built once: key generation is the slow part)


@dataclass(frozen=True)
class _PKI:
    dir: str
    # create_dev_pki output: ca.crt, edge.crt/.key, node-alpha.crt/.key, node-beta.crt/.key
    main: dict[str, str]
    # An unrelated CA with the same layout and names.
    other: dict[str, str]
    # root2 -> intermediate -> edge leaf: leaf+intermediate in one file, and the leaf alone.
    chain_ca: str
    chain_cert: str
    chain_leaf_only: str
    chain_key: str
    chain_wrong_order: str
    garbage: str
    encrypted_key: str

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)


@functools.cache
def _pki() -> _PKI:
    d = tempfile.mkdtemp(prefix="iop-test-pki-")
    atexit.register(shutil.rmtree, d, True)
    main = pki.create_dev_pki(os.path.join(d, "main"), node_names=["alpha", "beta"])
    other = pki.create_dev_pki(os.path.join(d, "other"), node_names=["alpha"])

    root = pki.make_ca("chain root")
    intermediate = pki.make_ca("chain intermediate", issuer=root)
    leaf_key, leaf = pki.issue(intermediate, dns_names=[EDGE_NAME])

    def p(name: str) -> str:
        return os.path.join(d, name)

    pki.write_pem(p("chain-ca.crt"), root[1])
    pki.write_pem(p("chain-edge.crt"), leaf, intermediate[1])
    pki.write_pem(p("chain-leaf-only.crt"), leaf)
    pki.write_pem(p("chain-wrong-order.crt"), intermediate[1], leaf)
    pki.write_pem(p("chain-edge.key"), leaf_key)
    with open(p("garbage.pem"), "wb") as f:
        f.write(b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    with open(p("encrypted.key"), "wb") as f:
        f.write(
            leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
    return _PKI(
        dir=d,
        main=main,
        other=other,
        chain_ca=p("chain-ca.crt"),
        chain_cert=p("chain-edge.crt"),
        chain_leaf_only=p("chain-leaf-only.crt"),
        chain_key=p("chain-edge.key"),
        chain_wrong_order=p("chain-wrong-order.crt"),
        garbage=p("garbage.pem"),
        encrypted_key=p("encrypted.key"),
    )


def _edge_tls(files: dict[str, str], client_ca_file: str | None = None) -> ServerTLS:
    return ServerTLS(files["edge.crt"], files["edge.key"], client_ca_file=client_ca_file)


def _node_tls(
    ca_file: str, server_name: str = EDGE_NAME, node: tuple[dict[str, str], str] | None = None
) -> ClientTLS:
    if node is None:
        return ClientTLS(ca_file=ca_file, server_name=server_name)
    files, name = node
    return ClientTLS(
        ca_file=ca_file,
        server_name=server_name,
        cert_file=files[f"node-{name}.crt"],
        key_file=files[f"node-{name}.key"],
    )


# ---------------------------------------------------------------------------------------------
# In-memory TLS


@implementer(IHandshakeListener)
class _Peer(Protocol):
    """Greets on connect, records what arrives, the handshake and the peer certificate."""

    def __init__(self, greeting: bytes) -> None:
        self.greeting = greeting
        self.received = b""
        self.handshake_done = False
        self.peer_certificate: x509.Certificate | None = None
        self.lost_reason: Failure | None = None
        self.edge_refusal: EdgeRefused | None = None

    def connectionMade(self) -> None:
        # Buffered by TLS until the handshake completes.
        self.transport.write(self.greeting)  # type: ignore[union-attr]

    def handshakeCompleted(self) -> None:
        self.handshake_done = True
        peer = self.transport.getPeerCertificate()  # type: ignore[union-attr]
        self.peer_certificate = None if peer is None else peer.to_cryptography()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.lost_reason = reason
        # While the TLS connection is still there: why this side refused the peer, if it did.
        self.edge_refusal = edge_refusal(self.transport, reason)


def _factory(proto: Protocol) -> Factory:
    f = Factory()
    f.protocol = lambda: proto  # type: ignore[assignment]
    return f


def _connect(server_options: Any, client_options: Any) -> tuple[_Peer, _Peer, IOPump]:
    """
    Run a TLS connection between an edge (server) and a node (client) to completion.

    @return: (edge-side application protocol, node-side application protocol, pump)
    """
    clock = Clock()
    edge, node = _Peer(EDGE_GREETING), _Peer(NODE_GREETING)
    server_factory = TLSMemoryBIOFactory(server_options, False, _factory(edge), clock=clock)
    client_factory = TLSMemoryBIOFactory(client_options, True, _factory(node), clock=clock)
    _, _, pump = connectedServerAndClient(
        lambda: server_factory.buildProtocol(None),
        lambda: client_factory.buildProtocol(None),
        clock=clock,
    )
    pump.flush()
    return edge, node, pump


class _TLSTestCase(SynchronousTestCase):
    def assertNoWarnings(self) -> None:
        """No warning at all (in particular no pyOpenSSL deprecation) was emitted."""
        self.assertEqual([w["message"] for w in self.flushWarnings()], [])

    def assertConnected(self, edge: _Peer, node: _Peer) -> None:
        self.assertTrue(edge.handshake_done)
        self.assertTrue(node.handshake_done)
        self.assertEqual(edge.received, NODE_GREETING)
        self.assertEqual(node.received, EDGE_GREETING)
        self.assertIsNone(edge.lost_reason)
        self.assertIsNone(node.lost_reason)

    def assertRefused(self, edge: _Peer, node: _Peer) -> None:
        """Both sides lost the connection and no application data got through."""
        self.assertEqual(edge.received, b"")
        self.assertEqual(node.received, b"")
        self.assertIsNotNone(edge.lost_reason)
        self.assertIsNotNone(node.lost_reason)
        self.assertFalse(edge.handshake_done)


# ---------------------------------------------------------------------------------------------
# Server authentication (the node verifies the edge)


class ServerAuthenticationTests(_TLSTestCase):
    def test_handshakeAndData(self) -> None:
        """
        A node trusting the CA and expecting the workload name the edge certificate carries
        completes the handshake, and bytes flow both ways over TLS 1.2 or later.
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main)),
            client_connection_creator(_node_tls(p.main["ca.crt"])),
        )
        self.assertConnected(edge, node)
        self.assertIsNone(edge.peer_certificate)  # no client certificate without a client CA
        assert node.peer_certificate is not None
        self.assertIn(EDGE_NAME, certificate_dns_names(node.peer_certificate))
        version = node.transport.getHandle().get_protocol_version_name()  # type: ignore[union-attr]
        self.assertIn(version, ("TLSv1.2", "TLSv1.3"))
        self.assertNoWarnings()

    def test_nameIndependentOfAddress(self) -> None:
        """
        The name checked is the configured workload name: the edge certificate also carries
        C{localhost}, so a node configured with that name connects too.
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main)),
            client_connection_creator(_node_tls(p.main["ca.crt"], server_name="localhost")),
        )
        self.assertConnected(edge, node)

    def test_wrongWorkloadName(self) -> None:
        """
        A node expecting a workload name the edge certificate does not carry refuses the
        connection (a TLS alert the edge sees), even though the certificate chains to its CA;
        the node's connectionLost learns why in plain words (edge_refusal).
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main)),
            client_connection_creator(
                _node_tls(p.main["ca.crt"], server_name="other.iop.internal")
            ),
        )
        self.assertRefused(edge, node)
        self.assertFalse(node.handshake_done)
        assert node.lost_reason is not None
        node.lost_reason.trap(SSL.Error)
        refusal = node.edge_refusal
        assert isinstance(refusal, EdgeNameMismatch)
        self.assertEqual(refusal.expected, "other.iop.internal")
        self.assertIn(EDGE_NAME, refusal.presented)
        self.assertIn(f"pass --server-name {EDGE_NAME}", str(refusal))
        self.assertNoWarnings()

    def test_otherCA(self) -> None:
        """
        An edge certificate for the right name but from another CA is refused.
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.other)),
            client_connection_creator(_node_tls(p.main["ca.crt"])),
        )
        self.assertRefused(edge, node)
        self.assertFalse(node.handshake_done)
        assert node.lost_reason is not None
        node.lost_reason.trap(SSL.Error)
        self.assertIn("certificate verify failed", str(node.lost_reason.value))

    def test_chainSentToPeer(self) -> None:
        """
        A certificate file holding leaf then intermediate lets a node that trusts only the
        root verify the edge: the intermediate is sent in the handshake.
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(ServerTLS(p.chain_cert, p.chain_key)),
            client_connection_creator(_node_tls(p.chain_ca)),
        )
        self.assertConnected(edge, node)
        self.assertNoWarnings()

    def test_chainMissingIntermediate(self) -> None:
        """Without the intermediate in the file, the same node cannot verify the edge."""
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(ServerTLS(p.chain_leaf_only, p.chain_key)),
            client_connection_creator(_node_tls(p.chain_ca)),
        )
        self.assertRefused(edge, node)

    def test_oldTLSRefused(self) -> None:
        """
        A client limited to TLS 1.0/1.1 is refused by the edge, for the protocol version. (The
        same client connects to a deliberately lenient server, so the refusal is the edge's.)
        """
        p = _pki()
        edge, node, _ = _connect(server_context_factory(_edge_tls(p.main)), _OldTLSClient())
        self.assertRefused(edge, node)
        self.assertFalse(node.handshake_done)
        assert edge.lost_reason is not None
        edge.lost_reason.trap(SSL.Error)
        self.assertIn("unsupported protocol", str(edge.lost_reason.value))

        with open(p.main["edge.key"], "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        lenient = CertificateOptions(
            privateKey=key,  # type: ignore[arg-type]
            certificate=_load_cert(p.main["edge.crt"]),  # type: ignore[arg-type]
            insecurelyLowerMinimumTo=TLSVersion.TLSv1_0,
        )
        lenient.getContext().set_cipher_list(b"DEFAULT:@SECLEVEL=0")
        edge, node, _ = _connect(lenient, _OldTLSClient())
        self.assertEqual(node.received, EDGE_GREETING)


@implementer(IOpenSSLClientConnectionCreator)
class _OldTLSClient:
    """A client that speaks only TLS 1.0 and 1.1 (and verifies nothing)."""

    def clientConnectionForTLS(self, tls_protocol: Any) -> SSL.Connection:
        ctx = SSL.Context(SSL.TLS_METHOD)
        # OpenSSL's default security level would refuse TLS < 1.2 on the client side already.
        ctx.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
        ctx.set_min_proto_version(SSL.TLS1_VERSION)
        ctx.set_max_proto_version(SSL.TLS1_1_VERSION)
        connection = SSL.Connection(ctx, None)
        connection.set_app_data(tls_protocol)
        return connection


# ---------------------------------------------------------------------------------------------
# Client authentication (mTLS: the edge verifies the node)


class MutualTLSTests(_TLSTestCase):
    def test_clientWithoutCertificateRefused(self) -> None:
        """An edge with a client CA refuses a node that presents no certificate."""
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"])),
            client_connection_creator(_node_tls(p.main["ca.crt"])),
        )
        self.assertRefused(edge, node)
        assert edge.lost_reason is not None
        edge.lost_reason.trap(SSL.Error)

    def test_clientFromOtherCARefused(self) -> None:
        """A node certificate from another CA is refused."""
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"])),
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.other, "alpha"))),
        )
        self.assertRefused(edge, node)
        assert edge.lost_reason is not None
        edge.lost_reason.trap(SSL.Error)

    def test_clientWithCertificateAccepted(self) -> None:
        """
        A node presenting a certificate from the client CA connects; the edge reads its
        certificate after the handshake and checks the workload name on it.
        """
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"])),
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.main, "alpha"))),
        )
        self.assertConnected(edge, node)
        cert = edge.peer_certificate
        assert cert is not None
        verify_peer_workload(cert, "alpha.node.iop.internal")
        error = self.assertRaises(
            WorkloadIdentityError, verify_peer_workload, cert, "beta.node.iop.internal"
        )
        self.assertEqual(error.expected, "beta.node.iop.internal")
        self.assertEqual(error.presented, ("alpha.node.iop.internal",))
        self.assertIn("beta.node.iop.internal", str(error))
        self.assertIn("alpha.node.iop.internal", str(error))
        self.assertNoWarnings()

    def test_noClientCAIgnoresClientCertificate(self) -> None:
        """Without a client CA the edge does not ask for a client certificate."""
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main)),
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.main, "alpha"))),
        )
        self.assertConnected(edge, node)
        self.assertIsNone(edge.peer_certificate)


class WarningDetectionTests(_TLSTestCase):
    """
    The no-warning assertions above mean something: handing Twisted pyOpenSSL objects (what
    C{PrivateCertificate} and C{optionsForClientTLS(clientCertificate=...)} do) is seen.
    """

    def test_pyOpenSSLObjectsWarn(self) -> None:
        p = _pki()
        with open(p.main["node-alpha.crt"], "rb") as c, open(p.main["node-alpha.key"], "rb") as k:
            client_cert = PrivateCertificate.loadPEM(c.read() + k.read())
        with open(p.main["ca.crt"], "rb") as f:
            ca = Certificate.loadPEM(f.read())
        creator = optionsForClientTLS(EDGE_NAME, trustRoot=ca, clientCertificate=client_cert)
        self.assertEqual(self.flushWarnings(), [])  # loading is fine; connecting is not
        edge, node, _ = _connect(server_context_factory(_edge_tls(p.main)), creator)
        self.assertConnected(edge, node)
        messages = [str(w["message"]) for w in self.flushWarnings()]
        self.assertTrue(messages)
        self.assertTrue(all("Passing pyOpenSSL" in m for m in messages), messages)


class PeerCertificateTests(_TLSTestCase):
    """L{peer_certificate}: what the Edge reads off a node connection after the handshake."""

    def test_clientCertificate(self) -> None:
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"])),
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.main, "beta"))),
        )
        self.assertConnected(edge, node)
        cert = peer_certificate(edge.transport)
        assert cert is not None
        self.assertEqual(certificate_dns_names(cert), ["beta.node.iop.internal"])
        self.assertEqual(cert, edge.peer_certificate)
        self.assertNoWarnings()

    def test_noClientCertificate(self) -> None:
        p = _pki()
        edge, node, _ = _connect(
            server_context_factory(_edge_tls(p.main)),
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.main, "alpha"))),
        )
        self.assertConnected(edge, node)
        self.assertIsNone(peer_certificate(edge.transport))

    def test_notTLS(self) -> None:
        self.assertIsNone(peer_certificate(object()))
        self.assertIsNone(peer_certificate(None))


# ---------------------------------------------------------------------------------------------
# Why a handshake failed (handshake_refusal), on real handshakes in memory


@functools.cache
def _bad_node_certificates() -> dict[str, tuple[str, str]]:
    """alpha's workload from the main CA, but expired / for servers only: (cert, key) files."""
    p = _pki()
    ca = security_pki.load_ca(p.main["ca.crt"], p.main["ca.key"])
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    pairs = {
        "expired": security_pki.issue_node(ca, "alpha", days=1, now=past),
        "not_yet_valid": security_pki.issue(
            ca,
            dns_names=["alpha.node.iop.internal"],
            client=True,
            server=False,
            now=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3),
            days=30,
        ),
        "server_only": security_pki.issue(
            ca, dns_names=["alpha.node.iop.internal"], client=False, server=True
        ),
    }
    files = {}
    for name, (key, cert) in pairs.items():
        files[name] = (p.path(f"bad-{name}.crt"), p.path(f"bad-{name}.key"))
        pki.write_pem(files[name][0], cert)
        pki.write_pem(files[name][1], key)
    return files


class _RefusedEdge(_Peer):
    """The edge side: what handshake_refusal says in connectionLost (where the Edge asks)."""

    refusal: HandshakeRefusal | None = None

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        super().connectionLost(reason)
        self.refusal = handshake_refusal(self.transport, reason)


class HandshakeRefusalTests(_TLSTestCase):
    """L{handshake_refusal}: why an mTLS edge refused a node, from a real handshake."""

    def refuse(self, client: Any, server: Any = None) -> _RefusedEdge:
        p = _pki()
        if server is None:
            server = server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"]))
        clock = Clock()
        edge = _RefusedEdge(EDGE_GREETING)
        server_factory = TLSMemoryBIOFactory(server, False, _factory(edge), clock=clock)
        if isinstance(client, Protocol):
            client_protocol: Protocol = client
        else:
            client_protocol = TLSMemoryBIOFactory(
                client, True, _factory(_Peer(NODE_GREETING)), clock=clock
            ).buildProtocol(None)
        _, _, pump = connectedServerAndClient(
            lambda: server_factory.buildProtocol(None), lambda: client_protocol, clock=clock
        )
        pump.flush()
        self.assertFalse(edge.handshake_done)
        self.assertIsNotNone(edge.lost_reason)
        return edge

    def node(self, cert_key: tuple[str, str], ca_file: str | None = None) -> Any:
        p = _pki()
        return client_connection_creator(
            ClientTLS(
                ca_file=ca_file or p.main["ca.crt"],
                server_name=EDGE_NAME,
                cert_file=cert_key[0],
                key_file=cert_key[1],
            )
        )

    def test_noCertificate(self) -> None:
        p = _pki()
        edge = self.refuse(client_connection_creator(_node_tls(p.main["ca.crt"])))
        self.assertEqual(
            edge.refusal,
            HandshakeRefusal("no_certificate", "peer did not return a certificate"),
        )

    def test_otherCA(self) -> None:
        p = _pki()
        edge = self.refuse(
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.other, "alpha")))
        )
        self.assertEqual(
            edge.refusal,
            HandshakeRefusal(
                "unknown_ca",
                "unable to get local issuer certificate",
                "CN=alpha.node.iop.internal",
            ),
        )

    def test_expired(self) -> None:
        edge = self.refuse(self.node(_bad_node_certificates()["expired"]))
        assert edge.refusal is not None
        self.assertEqual(
            (edge.refusal.reason, edge.refusal.detail), ("expired", "certificate has expired")
        )

    def test_notYetValid(self) -> None:
        edge = self.refuse(self.node(_bad_node_certificates()["not_yet_valid"]))
        assert edge.refusal is not None
        self.assertEqual(edge.refusal.reason, "not_yet_valid")

    def test_serverOnlyCertificate(self) -> None:
        """A certificate without clientAuth in its extended key usage."""
        edge = self.refuse(self.node(_bad_node_certificates()["server_only"]))
        assert edge.refusal is not None
        self.assertEqual(
            (edge.refusal.reason, edge.refusal.detail),
            ("wrong_usage", "unsuitable certificate purpose"),
        )

    def test_peerRefusesTheEdge(self) -> None:
        """The node does not trust the edge's CA: it ends the handshake with an alert."""
        p = _pki()
        edge = self.refuse(
            self.node(
                (p.main["node-alpha.crt"], p.main["node-alpha.key"]), ca_file=p.other["ca.crt"]
            )
        )
        assert edge.refusal is not None
        self.assertEqual(edge.refusal.reason, "peer_alert")
        self.assertIn("unknown ca", edge.refusal.detail)

    def test_plaintext(self) -> None:
        """A peer that does not speak TLS (a node configured for a plaintext transport)."""

        class Plain(Protocol):
            def connectionMade(self) -> None:
                self.transport.write(b"\x00\x00\x00\x10hello plaintext!")  # type: ignore[union-attr]

        edge = self.refuse(Plain())
        assert edge.refusal is not None
        self.assertEqual(
            edge.refusal, HandshakeRefusal("protocol", "not TLS: wrong version number")
        )

    def test_legacyEdgePlaintextToo(self) -> None:
        """Without a client CA nothing about certificates is checked; a plaintext peer still
        fails the handshake."""

        class Plain(Protocol):
            def connectionMade(self) -> None:
                self.transport.write(b"GET / HTTP/1.1\r\n\r\n")  # type: ignore[union-attr]

        edge = self.refuse(Plain(), server_context_factory(_edge_tls(_pki().main)))
        assert edge.refusal is not None
        self.assertEqual(edge.refusal.reason, "protocol")

    def test_peerLeavesWithoutATLSError(self) -> None:
        """A peer that connects and goes away is not a refusal."""

        class Leaver(Protocol):
            def connectionMade(self) -> None:
                self.transport.loseConnection()  # type: ignore[union-attr]

        edge = self.refuse(Leaver())
        self.assertIsNone(edge.refusal)

    def test_acceptedPeer(self) -> None:
        """Verification is unchanged: a good certificate still connects, nothing is noted."""
        p = _pki()
        options = server_context_factory(_edge_tls(p.main, client_ca_file=p.main["ca.crt"]))
        required = SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT
        self.assertEqual(options.getContext().get_verify_mode() & required, required)
        edge, node, _ = _connect(
            options,
            client_connection_creator(_node_tls(p.main["ca.crt"], node=(p.main, "alpha"))),
        )
        self.assertConnected(edge, node)
        self.assertNoWarnings()

    def test_notTLS(self) -> None:
        self.assertIsNone(handshake_refusal(object(), Failure(ValueError("no"))))
        self.assertEqual(
            handshake_refusal(object(), Failure(SSL.Error([("SSL routines", "", "bad thing")]))),
            HandshakeRefusal("protocol", "bad thing"),
        )


class ClassifyRefusalTests(SynchronousTestCase):
    """L{classify_refusal} on its own: OpenSSL's error and the noted verify failure."""

    VERIFY_FAILED = SSL.Error([("SSL routines", "", "certificate verify failed")])

    def test_verifyCodes(self) -> None:
        for code, reason, words in [
            (20, "unknown_ca", "unable to get local issuer certificate"),
            (18, "unknown_ca", "self-signed certificate"),
            (10, "expired", "certificate has expired"),
            (9, "not_yet_valid", "certificate is not yet valid"),
            (26, "wrong_usage", "unsuitable certificate purpose"),
            (23, "bad_certificate", "certificate revoked"),
        ]:
            self.assertEqual(
                classify_refusal(self.VERIFY_FAILED, VerifyFailure(code, 0, "CN=x")),
                HandshakeRefusal(reason, words, "CN=x"),
            )

    def test_unknownVerifyCode(self) -> None:
        refusal = classify_refusal(self.VERIFY_FAILED, VerifyFailure(4242, 0))
        self.assertEqual(
            refusal,
            HandshakeRefusal("bad_certificate", "certificate verify failed (X509 error 4242)"),
        )

    def test_issuerDepth(self) -> None:
        refusal = classify_refusal(self.VERIFY_FAILED, VerifyFailure(10, 1, "CN=some CA"))
        self.assertEqual(refusal.reason, "expired")
        self.assertEqual(refusal.detail, "certificate has expired (its issuer at depth 1)")

    def test_verifyFailedWithoutANote(self) -> None:
        self.assertEqual(
            classify_refusal(self.VERIFY_FAILED),
            HandshakeRefusal("bad_certificate", "certificate verify failed"),
        )

    def test_openSSLReasons(self) -> None:
        for words, reason in [
            ("peer did not return a certificate", "no_certificate"),
            ("tlsv1 alert unknown ca", "peer_alert"),
            ("sslv3 alert bad certificate", "peer_alert"),
            ("wrong version number", "protocol"),
            ("http request", "protocol"),
            ("no shared cipher", "protocol"),
            ("unsupported protocol", "protocol"),
        ]:
            refusal = classify_refusal(SSL.Error([("SSL routines", "", words)]))
            self.assertEqual(refusal.reason, reason, words)
            self.assertIn(words, refusal.detail)

    def test_unreadableError(self) -> None:
        self.assertEqual(
            classify_refusal(SSL.Error()), HandshakeRefusal("protocol", "unknown error")
        )

    def test_everyReasonIsInTheClosedSet(self) -> None:
        self.assertEqual(len(set(REFUSAL_REASONS)), len(REFUSAL_REASONS))
        from iop.security.tls import _VERIFY_ERRORS

        self.assertLessEqual({r for r, _ in _VERIFY_ERRORS.values()}, set(REFUSAL_REASONS))


# ---------------------------------------------------------------------------------------------
# verify_peer_workload on its own


class VerifyPeerWorkloadTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.ca = pki.make_ca("workload test CA")

    def test_exactNameCaseInsensitive(self) -> None:
        _, cert = pki.issue(self.ca, dns_names=["Alpha.node.iop.internal"], client=True)
        verify_peer_workload(cert, "alpha.node.iop.internal")
        verify_peer_workload(cert, "ALPHA.NODE.IOP.INTERNAL")

    def test_wildcardRefused(self) -> None:
        """A wildcard certificate does not stand for a particular workload."""
        _, cert = pki.issue(self.ca, dns_names=["*.node.iop.internal"], client=True)
        error = self.assertRaises(
            WorkloadIdentityError, verify_peer_workload, cert, "alpha.node.iop.internal"
        )
        self.assertIn("wildcard", str(error))

    def test_noDNSNames(self) -> None:
        _, cert = pki.issue(self.ca, dns_names=[], ip_addresses=["127.0.0.1"], client=True)
        error = self.assertRaises(
            WorkloadIdentityError, verify_peer_workload, cert, "alpha.node.iop.internal"
        )
        self.assertEqual(error.presented, ())
        self.assertIn("none", str(error))

    def test_commonNameIsNotAWorkloadName(self) -> None:
        """A name in the subject CN only is refused; it is reported for messages only."""
        _, cert = pki.issue(
            self.ca,
            dns_names=[],
            ip_addresses=["127.0.0.1"],
            common_name="alpha.node.iop.internal",
            client=True,
        )
        error = self.assertRaises(
            WorkloadIdentityError, verify_peer_workload, cert, "alpha.node.iop.internal"
        )
        self.assertEqual(error.presented, ())
        self.assertEqual(certificate_common_names(cert), ["alpha.node.iop.internal"])

    def test_otherName(self) -> None:
        _, cert = pki.issue(self.ca, dns_names=["alpha.node.iop.internal"], client=True)
        self.assertRaises(
            WorkloadIdentityError, verify_peer_workload, cert, "alpha.node.iop.internal.evil"
        )
        self.assertRaises(WorkloadIdentityError, verify_peer_workload, cert, "node.iop.internal")


# ---------------------------------------------------------------------------------------------
# Loading errors


class LoadingErrorTests(SynchronousTestCase):
    def assertConfigError(self, path: str, f: Any, *args: Any) -> TLSConfigError:
        """C{f(*args)} raises L{TLSConfigError} naming C{path} and showing no key material."""
        error: TLSConfigError = self.assertRaises(TLSConfigError, f, *args)
        message = str(error)
        self.assertIn(path, message)
        self.assertNotIn("BEGIN", message)
        self.assertNotIn("PRIVATE", message)
        return error

    def test_missingCertFile(self) -> None:
        p = _pki()
        missing = p.path("no-such.crt")
        self.assertConfigError(
            missing, server_context_factory, ServerTLS(missing, p.main["edge.key"])
        )

    def test_missingKeyFile(self) -> None:
        p = _pki()
        missing = p.path("no-such.key")
        self.assertConfigError(
            missing, server_context_factory, ServerTLS(p.main["edge.crt"], missing)
        )

    def test_missingClientCAFile(self) -> None:
        p = _pki()
        missing = p.path("no-such-ca.crt")
        self.assertConfigError(
            missing, server_context_factory, _edge_tls(p.main, client_ca_file=missing)
        )

    def test_missingCAFile(self) -> None:
        p = _pki()
        missing = p.path("no-such-ca.crt")
        self.assertConfigError(missing, client_connection_creator, _node_tls(missing))

    def test_garbageCertificate(self) -> None:
        p = _pki()
        error = self.assertConfigError(
            p.garbage, server_context_factory, ServerTLS(p.garbage, p.main["edge.key"])
        )
        self.assertIn("no valid PEM certificate", str(error))

    def test_notPEMAtAll(self) -> None:
        p = _pki()
        self.assertConfigError(
            p.main["edge.key"],
            server_context_factory,
            ServerTLS(p.main["edge.key"], p.main["edge.key"]),
        )

    def test_garbageCA(self) -> None:
        p = _pki()
        self.assertConfigError(p.garbage, client_connection_creator, _node_tls(p.garbage))

    def test_garbageKey(self) -> None:
        p = _pki()
        error = self.assertConfigError(
            p.garbage, server_context_factory, ServerTLS(p.main["edge.crt"], p.garbage)
        )
        self.assertIn("private key", str(error))

    def test_certificateAsKey(self) -> None:
        p = _pki()
        self.assertConfigError(
            p.main["edge.crt"],
            server_context_factory,
            ServerTLS(p.main["edge.crt"], p.main["edge.crt"]),
        )

    def test_encryptedKey(self) -> None:
        p = _pki()
        error = self.assertConfigError(
            p.encrypted_key, server_context_factory, ServerTLS(p.chain_cert, p.encrypted_key)
        )
        self.assertIn("encrypted", str(error))

    def test_mismatchedKey(self) -> None:
        """A key that does not belong to the certificate: the message names both files."""
        p = _pki()
        error = self.assertConfigError(
            p.main["node-alpha.key"],
            server_context_factory,
            ServerTLS(p.main["edge.crt"], p.main["node-alpha.key"]),
        )
        self.assertIn(p.main["edge.crt"], str(error))
        self.assertIn("does not match", str(error))

    def test_mismatchedClientKey(self) -> None:
        p = _pki()
        tls = ClientTLS(
            ca_file=p.main["ca.crt"],
            server_name=EDGE_NAME,
            cert_file=p.main["node-alpha.crt"],
            key_file=p.main["node-beta.key"],
        )
        self.assertConfigError(p.main["node-beta.key"], client_connection_creator, tls)

    def test_chainOutOfOrder(self) -> None:
        p = _pki()
        error = self.assertConfigError(
            p.chain_wrong_order,
            server_context_factory,
            ServerTLS(p.chain_wrong_order, p.chain_key),
        )
        self.assertIn("leaf certificate first", str(error))

    def test_clientCertWithoutKey(self) -> None:
        p = _pki()
        tls = ClientTLS(
            ca_file=p.main["ca.crt"], server_name=EDGE_NAME, cert_file=p.main["node-alpha.crt"]
        )
        self.assertRaises(TLSConfigError, client_connection_creator, tls)

    def test_emptyServerName(self) -> None:
        p = _pki()
        self.assertRaises(
            TLSConfigError, client_connection_creator, _node_tls(p.main["ca.crt"], server_name="")
        )


# ---------------------------------------------------------------------------------------------
# The dev PKI


def _read_all(paths: dict[str, str]) -> dict[str, bytes]:
    out = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            out[name] = f.read()
    return out


def _load_cert(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


class DevPKITests(SynchronousTestCase):
    def test_layout(self) -> None:
        """
        The files are there, keys are 0600, and the certificates carry the promised names and
        usages and are signed by the CA.
        """
        out = self.mktemp()
        paths = pki.create_dev_pki(out, node_names=["alpha", "beta"])
        expected = {
            "ca.crt",
            "ca.key",
            "edge.crt",
            "edge.key",
            "node-alpha.crt",
            "node-alpha.key",
            "node-beta.crt",
            "node-beta.key",
        }
        self.assertEqual(set(paths), expected)
        self.assertEqual(set(os.listdir(out)), expected)
        for name, path in paths.items():
            self.assertEqual(path, os.path.join(out, name))
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if name.endswith(".key"):
                self.assertEqual(mode, 0o600, name)
            else:
                self.assertEqual(mode & 0o077, 0o044, name)

        ca = _load_cert(paths["ca.crt"])
        edge = _load_cert(paths["edge.crt"])
        edge.verify_directly_issued_by(ca)
        san = edge.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), [EDGE_NAME, "localhost"])
        self.assertEqual([str(a) for a in san.get_values_for_type(x509.IPAddress)], ["127.0.0.1"])
        eku = edge.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.SERVER_AUTH])

        node = _load_cert(paths["node-beta.crt"])
        node.verify_directly_issued_by(ca)
        verify_peer_workload(node, "beta.node.iop.internal")
        eku = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.CLIENT_AUTH])

    def test_pathLike(self) -> None:
        """The output directory may be given as a C{pathlib.Path}; paths come back as text."""
        out = pathlib.Path(self.mktemp())
        paths = pki.create_dev_pki(out)
        self.assertEqual(paths["edge.key"], os.path.join(str(out), "edge.key"))
        self.assertTrue(os.path.exists(paths["edge.key"]))

    def test_idempotent(self) -> None:
        """A second run leaves every file as it was."""
        out = self.mktemp()
        first = pki.create_dev_pki(out, node_names=["alpha"])
        before = _read_all(first)
        second = pki.create_dev_pki(out, node_names=["alpha"])
        self.assertEqual(first, second)
        self.assertEqual(_read_all(second), before)

    def test_addNode(self) -> None:
        """A node added later is issued by the same CA; existing files are kept."""
        out = self.mktemp()
        before = _read_all(pki.create_dev_pki(out, node_names=["alpha"]))
        paths = pki.create_dev_pki(out, node_names=["alpha", "gamma"])
        after = _read_all(paths)
        for name, content in before.items():
            self.assertEqual(after[name], content, name)
        _load_cert(paths["node-gamma.crt"]).verify_directly_issued_by(_load_cert(paths["ca.crt"]))

    def test_edgeNameChangeReissuesEdge(self) -> None:
        """An edge certificate for another name is re-issued (same CA)."""
        out = self.mktemp()
        before = _read_all(pki.create_dev_pki(out))
        paths = pki.create_dev_pki(out, edge_name="main.edge.iop")
        after = _read_all(paths)
        self.assertEqual(after["ca.crt"], before["ca.crt"])
        self.assertNotEqual(after["edge.crt"], before["edge.crt"])
        self.assertIn("main.edge.iop", certificate_dns_names(_load_cert(paths["edge.crt"])))

    def test_overwrite(self) -> None:
        """C{overwrite=True} makes a new CA and re-issues everything."""
        out = self.mktemp()
        before = _read_all(pki.create_dev_pki(out))
        after = _read_all(pki.create_dev_pki(out, overwrite=True))
        self.assertEqual(set(before), set(after))
        for name in before:
            self.assertNotEqual(before[name], after[name], name)

    def test_missingCAKeyReissues(self) -> None:
        """Without the CA key the PKI cannot grow: a new CA is made and every leaf re-issued."""
        out = self.mktemp()
        first = pki.create_dev_pki(out)
        before = _read_all(first)
        os.remove(first["ca.key"])
        after = _read_all(pki.create_dev_pki(out))
        self.assertNotEqual(after["ca.crt"], before["ca.crt"])
        self.assertNotEqual(after["edge.crt"], before["edge.crt"])

    def test_badNodeName(self) -> None:
        out = self.mktemp()
        self.assertRaises(ValueError, pki.create_dev_pki, out, node_names=["../evil"])
        self.assertRaises(ValueError, pki.create_dev_pki, out, node_names=["a.b"])
        self.assertFalse(os.path.exists(out))

    def test_cli(self) -> None:
        """The command line prints what it wrote, then that nothing needed writing."""
        out = self.mktemp()
        stdout = io.StringIO()
        self.patch(sys, "stdout", stdout)
        self.assertEqual(pki.main(["--out", out, "--node", "alpha", "--node", "beta"]), 0)
        written = stdout.getvalue().splitlines()
        self.assertIn(f"wrote {os.path.join(out, 'node-beta.key')}", written)
        self.assertEqual(len(written), 8)
        stdout.truncate(0)
        stdout.seek(0)
        self.assertEqual(pki.main(["--out", out, "--node", "alpha", "--node", "beta"]), 0)
        self.assertIn("nothing written", stdout.getvalue())

    def test_cliBadNodeName(self) -> None:
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        self.assertEqual(pki.main(["--out", self.mktemp(), "--node", "a_b"]), 1)
        self.assertIn("a_b", stderr.getvalue())
