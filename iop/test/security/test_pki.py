# -*- test-case-name: iop.test.security.test_pki -*-
"""
Tests for L{iop.security.pki}: the certificates carry exactly the workload names and usages
managed mode checks, files are written atomically with private keys 0600 and never replaced
unless asked, and what ``iop pki`` lays out works for a real mTLS handshake (in memory).
"""

from __future__ import annotations

import datetime
import errno
import functools
import os
import stat

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import DEFAULT_TRUST_DOMAIN, ClientTLS, EdgeSecurity, ServerTLS
from iop.security import pki
from iop.security.pki import PKIError
from iop.security.tls import (
    WorkloadIdentityError,
    client_connection_creator,
    server_context_factory,
    verify_peer_workload,
)
from iop.test.security.test_tls import _connect

EDGE_NAME = "edge.iop.internal"


@functools.cache
def _ca() -> pki.KeyPair:
    return pki.make_ca("test CA")


def _sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _load_cert(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class NameTests(SynchronousTestCase):
    def test_workloadName(self) -> None:
        """The node workload name is the one the Edge requires (EdgeSecurity.node_workload)."""
        self.assertEqual(pki.node_workload_name("gpu-a"), "gpu-a.node.iop.internal")
        self.assertEqual(
            pki.node_workload_name("gpu-a", "corp.example"),
            EdgeSecurity(trust_domain="corp.example").node_workload("gpu-a"),
        )
        self.assertEqual(pki.node_workload_name("n1"), EdgeSecurity().node_workload("n1"))
        self.assertEqual(DEFAULT_TRUST_DOMAIN, "iop.internal")

    def test_validNodeIds(self) -> None:
        """Every edge.yaml-valid id that makes a DNS name is accepted."""
        for node_id in ["gpu-a", "gpu1", "rack1.gpu-a", "x" * 63, "7"]:
            pki.check_node_id(node_id)

    def test_invalidNodeIds(self) -> None:
        """
        Ids edge.yaml refuses, and ids that make no lowercase DNS name (which managed mode
        refuses), are refused by name.
        """
        bad = ["", "a/b", "../x", "a b", "a..b", ".a", "a.", "-a", "a-", "x" * 64, "é", "a_b"]
        for node_id in bad:
            with self.assertRaises(PKIError, msg=node_id) as ctx:
                pki.check_node_id(node_id)
            if node_id:
                self.assertIn(repr(node_id), str(ctx.exception))

    def test_upperCase(self) -> None:
        """Names are compared in lowercase: an upper-case one is refused with the fix."""
        with self.assertRaises(PKIError) as ctx:
            pki.check_node_id("GPU-A")
        self.assertIn("'gpu-a'", str(ctx.exception))
        self.assertRaises(PKIError, pki.check_dns_name, "Edge.iop.internal")

    def test_invalidDnsNames(self) -> None:
        for name in ["", "*.iop.internal", "edge.", "a_b.example", "127.0.0.1", "a..b", "-a.b"]:
            self.assertRaises(PKIError, pki.check_dns_name, name, "Edge name")
        pki.check_dns_name("edge.iop.internal")
        pki.check_dns_name("localhost")

    def test_badTrustDomain(self) -> None:
        self.assertRaises(PKIError, pki.node_workload_name, "gpu-a", "*.evil")
        self.assertRaises(PKIError, pki.node_workload_name, "gpu-a", "")

    def test_tooLong(self) -> None:
        """A workload name over 253 characters is refused."""
        domain = ".".join(["d" * 60] * 4)  # 243 characters
        self.assertRaises(PKIError, pki.node_workload_name, "node-id", domain)


class IssueTests(SynchronousTestCase):
    def test_ca(self) -> None:
        """A root CA: self-signed, CA:true, may sign certificates, valid ten years."""
        key, cert = _ca()
        cert.verify_directly_issued_by(cert)
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        self.assertTrue(bc.critical)
        self.assertTrue(bc.value.ca)
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        self.assertTrue(ku.key_cert_sign)
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        self.assertEqual(lifetime, datetime.timedelta(days=pki.CA_DAYS) + pki.BACKDATE)
        self.assertEqual(pki.CA_DAYS, 3650)
        self.assertEqual(key.curve.name, "secp256r1")

    def test_edge(self) -> None:
        """The Edge certificate carries exactly its name, serverAuth only, signed by the CA."""
        ca = _ca()
        key, cert = pki.issue_edge(ca, EDGE_NAME)
        cert.verify_directly_issued_by(ca[1])
        self.assertEqual(_sans(cert).get_values_for_type(x509.DNSName), [EDGE_NAME])
        self.assertEqual(_sans(cert).get_values_for_type(x509.IPAddress), [])
        self.assertEqual(len(list(_sans(cert))), 1)
        self.assertEqual(_eku(cert), [ExtendedKeyUsageOID.SERVER_AUTH])
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        self.assertEqual(cn, EDGE_NAME)
        self.assertFalse(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
        self.assertEqual(key.curve.name, "secp256r1")
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        self.assertEqual(lifetime, datetime.timedelta(days=365) + pki.BACKDATE)

    def test_edgeBadName(self) -> None:
        self.assertRaises(PKIError, pki.issue_edge, _ca(), "*.iop.internal")

    def test_node(self) -> None:
        """
        A node certificate carries exactly its workload name, clientAuth only, and passes the
        Edge's workload check for that node and no other.
        """
        ca = _ca()
        _, cert = pki.issue_node(ca, "gpu-a")
        cert.verify_directly_issued_by(ca[1])
        self.assertEqual(_sans(cert).get_values_for_type(x509.DNSName), ["gpu-a.node.iop.internal"])
        self.assertEqual(len(list(_sans(cert))), 1)
        self.assertEqual(_eku(cert), [ExtendedKeyUsageOID.CLIENT_AUTH])
        security = EdgeSecurity()
        verify_peer_workload(cert, security.node_workload("gpu-a"))
        for other in ["gpu-b", "gpu", "gpu-a.node"]:
            self.assertRaises(
                WorkloadIdentityError, verify_peer_workload, cert, security.node_workload(other)
            )
        self.assertRaises(
            WorkloadIdentityError,
            verify_peer_workload,
            cert,
            EdgeSecurity(trust_domain="other.internal").node_workload("gpu-a"),
        )

    def test_nodeTrustDomain(self) -> None:
        _, cert = pki.issue_node(_ca(), "gpu-a", trust_domain="corp.example", days=30)
        self.assertEqual(_sans(cert).get_values_for_type(x509.DNSName), ["gpu-a.node.corp.example"])
        verify_peer_workload(cert, "gpu-a.node.corp.example")
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        self.assertEqual(lifetime, datetime.timedelta(days=30) + pki.BACKDATE)

    def test_nodeBadId(self) -> None:
        self.assertRaises(PKIError, pki.issue_node, _ca(), "../gpu")
        self.assertRaises(PKIError, pki.issue_node, _ca(), "gpu_a")

    def test_leafOutlivingCA(self) -> None:
        """A leaf may not outlive its CA; the message says until when the CA is valid."""
        ca = pki.make_ca("short CA", days=10)
        with self.assertRaises(PKIError) as ctx:
            pki.issue_node(ca, "gpu-a", days=11)
        self.assertIn(f"{ca[1].not_valid_after_utc:%Y-%m-%d}", str(ctx.exception))
        pki.issue_node(ca, "gpu-a", days=9)

    def test_days(self) -> None:
        self.assertRaises(PKIError, pki.issue_edge, _ca(), EDGE_NAME, days=0)
        self.assertRaises(PKIError, pki.make_ca, "x", days=0)

    def test_needsUsageAndName(self) -> None:
        self.assertRaises(PKIError, pki.issue, _ca(), dns_names=[])
        self.assertRaises(PKIError, pki.issue, _ca(), dns_names=["a"], server=False)


class WritePemTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = self.mktemp()
        os.makedirs(self.dir)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def test_modes(self) -> None:
        """A key file is 0600, a certificate 0644; no temporary file is left behind."""
        key, cert = _ca()
        pki.write_pem(self.path("k.pem"), key)
        pki.write_pem(self.path("c.pem"), cert)
        self.assertEqual(_mode(self.path("k.pem")), 0o600)
        self.assertEqual(_mode(self.path("c.pem")), 0o644)
        self.assertEqual(sorted(os.listdir(self.dir)), ["c.pem", "k.pem"])
        self.assertEqual(
            _read(self.path("k.pem")),
            key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
        )

    def test_refusesOverwrite(self) -> None:
        """An existing file is left as it was, and the error names it."""
        key, _ = _ca()
        with open(self.path("k.pem"), "wb") as f:
            f.write(b"old")
        with self.assertRaises(PKIError) as ctx:
            pki.write_pem(self.path("k.pem"), key)
        self.assertIn(self.path("k.pem"), str(ctx.exception))
        self.assertNotIn("PRIVATE", str(ctx.exception))
        self.assertEqual(_read(self.path("k.pem")), b"old")
        self.assertEqual(os.listdir(self.dir), ["k.pem"])

    def test_overwrite(self) -> None:
        key, _ = _ca()
        with open(self.path("k.pem"), "wb") as f:
            f.write(b"old")
        pki.write_pem(self.path("k.pem"), key, overwrite=True)
        self.assertIn(b"PRIVATE KEY", _read(self.path("k.pem")))
        self.assertEqual(_mode(self.path("k.pem")), 0o600)
        self.assertEqual(os.listdir(self.dir), ["k.pem"])

    def test_noHardLinks(self) -> None:
        """On a file system without hard links the file is still written, and still not over."""

        def no_link(src: str, dst: str) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        self.patch(os, "link", no_link)
        key, _ = _ca()
        pki.write_pem(self.path("k.pem"), key)
        self.assertEqual(_mode(self.path("k.pem")), 0o600)
        self.assertRaises(PKIError, pki.write_pem, self.path("k.pem"), key)
        self.assertEqual(os.listdir(self.dir), ["k.pem"])

    def test_missingDirectory(self) -> None:
        with self.assertRaises(PKIError) as ctx:
            pki.write_pem(self.path("nowhere/k.pem"), _ca()[0])
        self.assertIn("nowhere", str(ctx.exception))

    def test_pairRefusesIfEitherExists(self) -> None:
        """write_pair writes nothing when the certificate is there already (not even the key)."""
        with open(self.path("c.pem"), "wb") as f:
            f.write(b"old")
        self.assertRaises(PKIError, pki.write_pair, _ca(), self.path("c.pem"), self.path("k.pem"))
        self.assertEqual(os.listdir(self.dir), ["c.pem"])


class FilesTests(SynchronousTestCase):
    """The directory layout ``iop pki`` makes."""

    def test_init(self) -> None:
        """ca.crt and ca.key (0600) in a new directory that only its owner may enter."""
        d = os.path.join(self.mktemp(), "pki")
        files = pki.init_ca_files(d, name="Corp IOP CA")
        self.assertEqual(files.cert_file, os.path.join(d, "ca.crt"))
        self.assertEqual(files.key_file, os.path.join(d, "ca.key"))
        self.assertEqual(sorted(os.listdir(d)), ["ca.crt", "ca.key"])
        self.assertEqual(_mode(d), 0o700)
        self.assertEqual(_mode(files.key_file), 0o600)
        cert = _load_cert(files.cert_file)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        self.assertEqual(cn, "Corp IOP CA")
        self.assertEqual(files.names, ("Corp IOP CA",))
        self.assertEqual(files.not_after, cert.not_valid_after_utc)
        pki.load_ca(files.cert_file, files.key_file)

    def test_initRefusesExisting(self) -> None:
        d = self.mktemp()
        files = pki.init_ca_files(d)
        before = _read(files.key_file), _read(files.cert_file)
        with self.assertRaises(PKIError) as ctx:
            pki.init_ca_files(d)
        self.assertIn("--force", str(ctx.exception))
        self.assertEqual((_read(files.key_file), _read(files.cert_file)), before)
        pki.init_ca_files(d, force=True)
        self.assertNotEqual(_read(files.key_file), before[0])
        self.assertNotEqual(_read(files.cert_file), before[1])

    def test_issueWithoutCA(self) -> None:
        with self.assertRaises(PKIError) as ctx:
            pki.issue_edge_files(self.mktemp(), EDGE_NAME)
        self.assertIn("iop pki init", str(ctx.exception))

    def test_issueEdgeAndNode(self) -> None:
        """
        The issued files are signed by the directory's CA, carry the right names, and are not
        replaced without C{force}.
        """
        d = self.mktemp()
        ca = pki.init_ca_files(d)
        edge = pki.issue_edge_files(d, EDGE_NAME, days=100)
        node = pki.issue_node_files(d, "gpu-a")
        self.assertEqual(edge.cert_file, os.path.join(d, f"{EDGE_NAME}.crt"))
        self.assertEqual(edge.key_file, os.path.join(d, f"{EDGE_NAME}.key"))
        self.assertEqual(node.cert_file, os.path.join(d, "gpu-a.crt"))
        self.assertEqual(node.key_file, os.path.join(d, "gpu-a.key"))
        self.assertEqual(edge.names, (EDGE_NAME,))
        self.assertEqual(node.names, ("gpu-a.node.iop.internal",))
        for files in (edge, node):
            self.assertEqual(_mode(files.key_file), 0o600)
            self.assertEqual(_mode(files.cert_file), 0o644)
            _load_cert(files.cert_file).verify_directly_issued_by(_load_cert(ca.cert_file))
        before = _read(node.cert_file)
        self.assertRaises(PKIError, pki.issue_node_files, d, "gpu-a")
        self.assertEqual(_read(node.cert_file), before)
        pki.issue_node_files(d, "gpu-a", force=True)
        self.assertNotEqual(_read(node.cert_file), before)

    def test_nodeNamedCa(self) -> None:
        """A node called "ca" can never overwrite the CA, not even with C{force}."""
        d = self.mktemp()
        ca = pki.init_ca_files(d)
        before = _read(ca.key_file)
        self.assertRaises(PKIError, pki.issue_node_files, d, "ca", force=True)
        self.assertRaises(PKIError, pki.issue_edge_files, d, "ca", force=True)
        self.assertEqual(_read(ca.key_file), before)

    def test_loadCARefusals(self) -> None:
        """A CA that cannot sign is refused with a message naming the file, not its content."""
        d = self.mktemp()
        ca = pki.init_ca_files(d)
        other = pki.init_ca_files(self.mktemp())
        leaf = pki.issue_edge_files(d, EDGE_NAME)
        cases = [
            (ca.cert_file, other.key_file, "does not belong"),
            (leaf.cert_file, leaf.key_file, "not a CA certificate"),
            (ca.cert_file, leaf.cert_file, "not a valid PEM private key"),
            (ca.key_file, ca.key_file, "not a PEM certificate"),
        ]
        for cert_file, key_file, message in cases:
            with self.assertRaises(PKIError) as ctx:
                pki.load_ca(cert_file, key_file)
            self.assertIn(message, str(ctx.exception))
            self.assertNotIn("BEGIN", str(ctx.exception))
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=pki.CA_DAYS + 1)
        with self.assertRaises(PKIError) as ctx:
            pki.load_ca(ca.cert_file, ca.key_file, now=later)
        self.assertIn("not valid now", str(ctx.exception))

    def test_mutualTLS(self) -> None:
        """
        Files from init / issue-edge / issue-node make a real mTLS handshake (in memory): the
        node verifies the Edge's name, the Edge reads the node's certificate and its workload
        check accepts that node and no other.
        """
        d = self.mktemp()
        ca = pki.init_ca_files(d)
        edge = pki.issue_edge_files(d, EDGE_NAME)
        node = pki.issue_node_files(d, "gpu-a")
        server = server_context_factory(
            ServerTLS(edge.cert_file, edge.key_file, client_ca_file=ca.cert_file)
        )
        client = client_connection_creator(
            ClientTLS(
                ca_file=ca.cert_file,
                server_name=EDGE_NAME,
                cert_file=node.cert_file,
                key_file=node.key_file,
            )
        )
        edge_peer, node_peer, _ = _connect(server, client)
        self.assertTrue(edge_peer.handshake_done)
        self.assertTrue(node_peer.handshake_done)
        presented = edge_peer.peer_certificate
        assert presented is not None
        verify_peer_workload(presented, EdgeSecurity().node_workload("gpu-a"))
        self.assertRaises(
            WorkloadIdentityError,
            verify_peer_workload,
            presented,
            EdgeSecurity().node_workload("gpu-b"),
        )
