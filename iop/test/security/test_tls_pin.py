# -*- test-case-name: iop.test.security.test_tls_pin -*-
"""
A node that knows only the pin of its Edge's CA (a join string, node.yaml ``edge.ca_sha256``):
:func:`verify_pinned_chain` over certificates from :mod:`iop.security.pki`, and real handshakes
in memory where the Edge presents its certificate then its CA: accepted when the pin, the chain
and the name fit; refused before any byte of the node's reaches the Edge otherwise, with the one
line :func:`edge_refusal` gives the node. Also :func:`not_tls_answer`: an HTTP listener's answer
to a ClientHello.
"""

from __future__ import annotations

import atexit
import datetime
import os
import shutil
import tempfile
from typing import Any

from OpenSSL import SSL
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.test.iosim import connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ClientTLS, ServerTLS
from iop.security import pki
from iop.security.tls import (
    CAPinMismatch,
    EdgeCertificateRefused,
    EdgeNameMismatch,
    EdgeRefused,
    TLSConfigError,
    ca_file_pin,
    ca_pin,
    client_connection_creator,
    edge_refusal,
    not_tls_answer,
    server_context_factory,
    verify_pinned_chain,
)

EDGE = "edge.iop.internal"
WHERE = "gw.example.net:7443"
ROOT = pki.make_ca("IOP CA")
OTHER = pki.make_ca("Other CA")
LEAF = pki.issue_edge(ROOT, EDGE)
INTERMEDIATE = pki.make_ca("IOP intermediate", issuer=ROOT)
VIA_INTERMEDIATE = pki.issue_edge(INTERMEDIATE, EDGE)


def pinned(pin: str, name: str = EDGE, host: str | None = None) -> ClientTLS:
    return ClientTLS(ca_file="", server_name=name, ca_pin=pin, host_name=host)


class VerifyPinnedChainTests(SynchronousTestCase):
    def test_pinned_root_in_the_chain(self) -> None:
        ca = verify_pinned_chain([LEAF[1], ROOT[1]], pinned(ca_pin(ROOT[1])), WHERE)
        self.assertEqual(ca, ROOT[1])

    def test_through_an_intermediate(self) -> None:
        chain = [VIA_INTERMEDIATE[1], INTERMEDIATE[1], ROOT[1]]
        self.assertEqual(verify_pinned_chain(chain, pinned(ca_pin(ROOT[1])), WHERE), ROOT[1])
        pin = ca_pin(INTERMEDIATE[1])
        self.assertEqual(verify_pinned_chain(chain, pinned(pin), WHERE), INTERMEDIATE[1])

    def test_pin_mismatch(self) -> None:
        error = self.assertRaises(
            CAPinMismatch, verify_pinned_chain, [LEAF[1], ROOT[1]], pinned(ca_pin(OTHER[1])), WHERE
        )
        self.assertTrue(str(error).startswith(f"CA pin mismatch: no certificate {WHERE} presented"))
        self.assertIn("it presented CN=IOP CA (sha256:", str(error))
        self.assertIn("print a new join line (iop node add)", str(error))

    def test_leaf_alone(self) -> None:
        error = self.assertRaises(
            CAPinMismatch, verify_pinned_chain, [LEAF[1]], pinned(ca_pin(ROOT[1])), WHERE
        )
        self.assertIn("sent only its own certificate", str(error))
        self.assertIn(
            "node_transport.tls.cert_file must hold the certificate then its CA", str(error)
        )

    def test_a_ca_in_the_chain_that_did_not_sign_the_leaf(self) -> None:
        """The pinned key must have issued the leaf: merely appending it is not enough."""
        stranger = pki.issue_edge(OTHER, EDGE)
        error = self.assertRaises(
            EdgeCertificateRefused,
            verify_pinned_chain,
            [stranger[1], ROOT[1]],
            pinned(ca_pin(ROOT[1])),
            WHERE,
        )
        self.assertIn("does not verify under the pinned CA CN=IOP CA", str(error))
        self.assertFalse(error.retryable)

    def test_name(self) -> None:
        error = self.assertRaises(
            EdgeNameMismatch,
            verify_pinned_chain,
            [LEAF[1], ROOT[1]],
            pinned(ca_pin(ROOT[1]), name="gw.iop.internal"),
            WHERE,
        )
        self.assertEqual(
            str(error),
            f"the certificate of {WHERE} names edge.iop.internal, not gw.iop.internal, the Edge "
            "name this node requires: pass --server-name edge.iop.internal (node.yaml "
            "edge.server_name) if that is the Edge's workload name",
        )
        self.assertEqual((error.expected, error.presented), ("gw.iop.internal", (EDGE,)))

    def test_defaulted_name_accepts_the_host(self) -> None:
        """node.yaml once defaulted server_name to the host: such a certificate still passes."""
        by_host = pki.issue(ROOT, dns_names=["gw.example.net"])
        tls = pinned(ca_pin(ROOT[1]), name=EDGE, host="gw.example.net")
        self.assertEqual(verify_pinned_chain([by_host[1], ROOT[1]], tls, WHERE), ROOT[1])

    def test_expired_is_retryable(self) -> None:
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=400)
        error = self.assertRaises(
            EdgeCertificateRefused,
            verify_pinned_chain,
            [LEAF[1], ROOT[1]],
            pinned(ca_pin(ROOT[1])),
            WHERE,
            later,
        )
        self.assertIn("expired on", str(error))
        self.assertTrue(error.retryable)

    def test_client_certificate_is_no_edge(self) -> None:
        node = pki.issue_node(ROOT, "gpu-a")
        error = self.assertRaises(
            EdgeRefused,
            verify_pinned_chain,
            [node[1], ROOT[1]],
            pinned(ca_pin(ROOT[1]), name="gpu-a.node.iop.internal"),
            WHERE,
        )
        self.assertIn("does not verify", str(error))

    def test_ca_file_pin(self) -> None:
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        chain, leaf = os.path.join(d, "edge.crt"), os.path.join(d, "leaf.crt")
        pki.write_pem(chain, LEAF[1], ROOT[1])
        pki.write_pem(leaf, LEAF[1])
        self.assertEqual(ca_file_pin(chain), ca_pin(ROOT[1]))
        self.assertRaises(TLSConfigError, ca_file_pin, leaf)


# ---------------------------------------------------------------------------------------------
# Handshakes in memory

_DIR = tempfile.mkdtemp(prefix="iop-test-pin-")
atexit.register(shutil.rmtree, _DIR, True)


def _files(name: str, pair: pki.KeyPair, *chain: Any) -> ServerTLS:
    cert, key = os.path.join(_DIR, f"{name}.crt"), os.path.join(_DIR, f"{name}.key")
    if not os.path.exists(cert):
        pki.write_pem(key, pair[0])
        pki.write_pem(cert, pair[1], *chain)
    return ServerTLS(cert, key)


class _Side(Protocol):
    def __init__(self, greeting: bytes) -> None:
        self.greeting = greeting
        self.received = b""
        self.refusal: EdgeRefused | None = None
        self.lost: Failure | None = None

    def connectionMade(self) -> None:
        self.transport.write(self.greeting)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.lost = reason
        self.refusal = edge_refusal(self.transport, reason)


def _handshake(server: ServerTLS, client: ClientTLS) -> tuple[_Side, _Side]:
    clock = Clock()
    edge, node = _Side(b"edge hello"), _Side(b"TOKEN")
    server_factory = TLSMemoryBIOFactory(
        server_context_factory(server), False, Factory.forProtocol(lambda: edge), clock=clock
    )
    client_factory = TLSMemoryBIOFactory(
        client_connection_creator(client, WHERE),
        True,
        Factory.forProtocol(lambda: node),
        clock=clock,
    )
    _, _, pump = connectedServerAndClient(
        lambda: server_factory.buildProtocol(None),
        lambda: client_factory.buildProtocol(None),
        clock=clock,
    )
    pump.flush()
    return edge, node


class PinnedHandshakeTests(SynchronousTestCase):
    def test_edge_presenting_its_ca_is_accepted(self) -> None:
        edge, node = _handshake(_files("chain", LEAF, ROOT[1]), pinned(ca_pin(ROOT[1])))
        self.assertEqual((edge.received, node.received), (b"TOKEN", b"edge hello"))
        self.assertIsNone(node.lost)

    def test_pin_mismatch_sends_nothing(self) -> None:
        edge, node = _handshake(_files("chain", LEAF, ROOT[1]), pinned(ca_pin(OTHER[1])))
        self.assertEqual(edge.received, b"")  # the token never left the node
        self.assertIsInstance(node.refusal, CAPinMismatch)
        assert node.lost is not None
        self.assertIsInstance(node.lost.value, SSL.Error)

    def test_leaf_only_edge(self) -> None:
        edge, node = _handshake(_files("leaf", LEAF), pinned(ca_pin(ROOT[1])))
        self.assertEqual(edge.received, b"")
        self.assertIsInstance(node.refusal, CAPinMismatch)

    def test_name_mismatch(self) -> None:
        edge, node = _handshake(
            _files("chain", LEAF, ROOT[1]), pinned(ca_pin(ROOT[1]), name="gw.iop.internal")
        )
        self.assertEqual(edge.received, b"")
        self.assertIsInstance(node.refusal, EdgeNameMismatch)

    def test_ca_file_still_works_with_a_chain(self) -> None:
        ca = os.path.join(_DIR, "root.pem")
        if not os.path.exists(ca):
            pki.write_pem(ca, ROOT[1])
        edge, _ = _handshake(
            _files("chain", LEAF, ROOT[1]), ClientTLS(ca_file=ca, server_name=EDGE)
        )
        self.assertEqual(edge.received, b"TOKEN")


class NotTLSTests(SynchronousTestCase):
    def test_http_answer(self) -> None:
        """What a node's TLS client makes of an HTTP listener's 400 answer."""
        clock = Clock()
        node = _Side(b"TOKEN")

        class HTTP(Protocol):
            def dataReceived(self, data: bytes) -> None:
                self.transport.write(  # type: ignore[union-attr]
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
                )

        client_factory = TLSMemoryBIOFactory(
            client_connection_creator(pinned(ca_pin(ROOT[1])), WHERE),
            True,
            Factory.forProtocol(lambda: node),
            clock=clock,
        )
        _, _, pump = connectedServerAndClient(
            HTTP, lambda: client_factory.buildProtocol(None), clock=clock
        )
        pump.flush()
        assert node.lost is not None
        error = node.lost.value
        assert isinstance(error, SSL.Error)
        self.assertTrue(not_tls_answer(error))
        self.assertIsNone(node.refusal)

    def test_other_errors(self) -> None:
        self.assertFalse(
            not_tls_answer(SSL.Error([("SSL routines", "", "certificate verify failed")]))
        )
