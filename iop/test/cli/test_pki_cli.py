# -*- test-case-name: iop.test.cli.test_pki_cli -*-
"""
Tests for C{iop pki} (L{iop.cli.pki}), run through L{iop.cli.main.main} against a temporary
directory: exit codes, the files and their modes, the config keys the output names, and no
key material in any output.
"""

from __future__ import annotations

import os
import stat

from cryptography import x509
from cryptography.x509.oid import NameOID

from iop.config.model import EdgeSecurity
from iop.security.tls import verify_peer_workload
from iop.test.cli.support import (
    CommandAssertions,
    Result,
    assert_no_key_material,
    assert_setting,
    run,
)

EDGE_NAME = "edge.iop.internal"


def _cert(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def _dns(path: str) -> list[str]:
    cert = _cert(path)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class PKICommandTests(CommandAssertions):
    def setUp(self) -> None:
        self.dir = os.path.join(self.mktemp(), "pki")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def iop(self, *argv: str) -> Result:
        """Run C{iop argv}; check that nothing it printed holds key material."""
        result = run(argv)
        keys = os.listdir(self.dir) if os.path.isdir(self.dir) else []
        assert_no_key_material(self, result, *(self.path(n) for n in keys if n.endswith(".key")))
        return result

    def test_init(self) -> None:
        """
        C{iop pki init} writes ca.crt and ca.key (0600) and says which config keys take the
        CA certificate.
        """
        result = self.iop("pki", "init", "--dir", self.dir, "--name", "Corp CA")
        self.assertOK(result)
        self.assertEqual(sorted(os.listdir(self.dir)), ["ca.crt", "ca.key"])
        self.assertEqual(stat.S_IMODE(os.stat(self.path("ca.key")).st_mode), 0o600)
        cn = _cert(self.path("ca.crt")).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        self.assertEqual(cn[0].value, "Corp CA")
        self.assertIn(f"wrote {self.path('ca.crt')}", result.out)
        self.assertIn(f"wrote {self.path('ca.key')}", result.out)
        ca = self.path("ca.crt")
        assert_setting(self, result, "edge.yaml", "node_transport.tls.client_ca_file", ca)
        assert_setting(self, result, "node.yaml", "edge.ca_file", ca)
        self.assertIn("issue-edge", result.out)

    def test_initRefusesExisting(self) -> None:
        """A second init leaves the CA alone (exit 1); --force replaces it."""
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        before = _read(self.path("ca.key"))
        self.assertUserError(
            self.iop("pki", "init", "--dir", self.dir), self.path("ca.crt"), "--force"
        )
        self.assertEqual(_read(self.path("ca.key")), before)
        self.assertOK(self.iop("pki", "init", "--dir", self.dir, "--force"))
        self.assertNotEqual(_read(self.path("ca.key")), before)

    def test_defaultDir(self) -> None:
        """Without --dir everything goes to ./pki."""
        cwd = os.path.abspath(self.mktemp())
        os.makedirs(cwd)
        here = os.getcwd()
        os.chdir(cwd)
        self.addCleanup(os.chdir, here)
        self.assertOK(run(["pki", "init"]))
        result = run(["pki", "issue-node", "gpu-a"])
        self.assertOK(result)
        self.assertEqual(
            sorted(os.listdir(os.path.join(cwd, "pki"))),
            ["ca.crt", "ca.key", "gpu-a.crt", "gpu-a.key"],
        )
        assert_setting(
            self, result, "node.yaml", "edge.cert_file", os.path.join("pki", "gpu-a.crt")
        )

    def test_issueEdge(self) -> None:
        """
        C{iop pki issue-edge NAME}: NAME.crt/.key carrying exactly NAME, and the output names
        the edge.yaml TLS keys and the node's edge.server_name.
        """
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        result = self.iop("pki", "issue-edge", EDGE_NAME, "--dir", self.dir, "--days", "90")
        self.assertOK(result)
        crt, key = self.path(f"{EDGE_NAME}.crt"), self.path(f"{EDGE_NAME}.key")
        self.assertEqual(_dns(crt), [EDGE_NAME])
        self.assertEqual(stat.S_IMODE(os.stat(key).st_mode), 0o600)
        _cert(crt).verify_directly_issued_by(_cert(self.path("ca.crt")))
        assert_setting(self, result, "edge.yaml", "node_transport.tls.cert_file", crt)
        assert_setting(self, result, "edge.yaml", "node_transport.tls.key_file", key)
        assert_setting(self, result, "node.yaml", "edge.server_name", EDGE_NAME)
        cert = _cert(crt)
        self.assertEqual((cert.not_valid_after_utc - cert.not_valid_before_utc).days, 90)

    def test_issueNode(self) -> None:
        """
        C{iop pki issue-node ID}: ID.crt/.key for workload ID.node.<trust domain>, and the
        output names the node.yaml keys, the trust domain and the node id.
        """
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        result = self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir)
        self.assertOK(result)
        crt, key = self.path("gpu-a.crt"), self.path("gpu-a.key")
        self.assertEqual(_dns(crt), ["gpu-a.node.iop.internal"])
        verify_peer_workload(_cert(crt), EdgeSecurity().node_workload("gpu-a"))
        self.assertEqual(stat.S_IMODE(os.stat(key).st_mode), 0o600)
        assert_setting(self, result, "node.yaml", "edge.cert_file", crt)
        assert_setting(self, result, "node.yaml", "edge.key_file", key)
        assert_setting(self, result, "node.yaml", "edge.ca_file", self.path("ca.crt"))
        assert_setting(self, result, "edge.yaml", "security.trust_domain", "iop.internal")
        assert_setting(self, result, "edge.yaml", "nodes[].id", "gpu-a")
        self.assertIn("(the default)", result.out)
        self.assertIn("gpu-a.node.iop.internal", result.out)

    def test_issueNodeTrustDomain(self) -> None:
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        result = self.iop(
            "pki", "issue-node", "gpu-a", "--dir", self.dir, "--trust-domain", "corp.example"
        )
        self.assertOK(result)
        self.assertEqual(_dns(self.path("gpu-a.crt")), ["gpu-a.node.corp.example"])
        assert_setting(self, result, "edge.yaml", "security.trust_domain", "corp.example")
        self.assertIn("(must match)", result.out)

    def test_issueRefusesExisting(self) -> None:
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        self.assertOK(self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir))
        before = _read(self.path("gpu-a.key"))
        self.assertUserError(
            self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir), self.path("gpu-a.crt")
        )
        self.assertEqual(_read(self.path("gpu-a.key")), before)
        self.assertOK(self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir, "--force"))
        self.assertNotEqual(_read(self.path("gpu-a.key")), before)

    def test_issueWithoutCA(self) -> None:
        """Issuing before init: exit 1, the message points at init; nothing is written."""
        self.assertUserError(
            self.iop("pki", "issue-edge", EDGE_NAME, "--dir", self.dir), "iop pki init"
        )
        self.assertUserError(
            self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir), "iop pki init"
        )
        self.assertFalse(os.path.exists(self.dir))

    def test_badNames(self) -> None:
        """Bad node ids, Edge names and trust domains: exit 1, naming the value."""
        self.assertOK(self.iop("pki", "init", "--dir", self.dir))
        self.assertUserError(self.iop("pki", "issue-node", "../x", "--dir", self.dir), "'../x'")
        self.assertUserError(self.iop("pki", "issue-node", "a..b", "--dir", self.dir), "'a..b'")
        self.assertUserError(self.iop("pki", "issue-node", "ca", "--dir", self.dir), "CA")
        self.assertUserError(
            self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir, "--trust-domain", "a_b"),
            "trust domain",
        )
        self.assertUserError(
            self.iop("pki", "issue-edge", "*.iop.internal", "--dir", self.dir), "Edge name"
        )
        self.assertUserError(
            self.iop("pki", "issue-edge", "10.0.0.1", "--dir", self.dir), "IP address"
        )
        self.assertEqual(sorted(os.listdir(self.dir)), ["ca.crt", "ca.key"])

    def test_badDays(self) -> None:
        """--days must be a whole number >= 1 (a usage error); a leaf may not outlive the CA."""
        for days in ("0", "-3", "soon"):
            result = self.iop("pki", "init", "--dir", self.dir, "--days", days)
            self.assertEqual(result.code, 2, days)
            self.assertIn("--days", result.err)
        self.assertOK(self.iop("pki", "init", "--dir", self.dir, "--days", "30"))
        self.assertUserError(self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir), "outlive")
        self.assertOK(self.iop("pki", "issue-node", "gpu-a", "--dir", self.dir, "--days", "29"))

    def test_dirIsAFile(self) -> None:
        """A --dir that cannot be created: exit 1 naming it."""
        parent = self.mktemp()
        with open(parent, "w") as f:
            f.write("not a directory")
        target = os.path.join(parent, "pki")
        result = self.iop("pki", "init", "--dir", target)
        self.assertUserError(result, target)
