# -*- test-case-name: iop.test.cli.test_keys_cli -*-
"""
Tests for C{iop keys} (L{iop.cli.keys}), run through L{iop.cli.main.main}: the key files and
their modes, the config keys the output names, refusals, and no key material in any output.
"""

from __future__ import annotations

import os
import stat

from iop.cli import keys as keys_cli
from iop.security import keys as security_keys
from iop.test.cli.support import (
    CommandAssertions,
    Result,
    assert_no_key_material,
    assert_setting,
    run,
)


class KeysCommandTests(CommandAssertions):
    def setUp(self) -> None:
        self.dir = os.path.join(self.mktemp(), "keys")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def iop(self, *argv: str) -> Result:
        """Run C{iop argv}; check that nothing it printed holds key material."""
        result = run(argv)
        names = os.listdir(self.dir) if os.path.isdir(self.dir) else []
        private = [self.path(n) for n in names if n.endswith(".key")]
        assert_no_key_material(self, result, *private)
        return result

    def assertPrivate(self, path: str) -> None:
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600, path)

    def test_kemChoices(self) -> None:
        """--kem offers exactly the library's KEMs, x25519 first (the default)."""
        self.assertEqual(set(keys_cli.KEM_CHOICES), set(security_keys.KEMS))
        self.assertEqual(keys_cli.KEM_CHOICES[0], security_keys.KEM_X25519)

    def test_issuer(self) -> None:
        """
        C{iop keys issuer}: issuer.key (0600) and issuer.pub that load as a pair; the output
        names the key id and the edge.yaml / node.yaml keys that take them.
        """
        result = self.iop("keys", "issuer", "--dir", self.dir)
        self.assertOK(result)
        private, public = self.path("issuer.key"), self.path("issuer.pub")
        self.assertEqual(sorted(os.listdir(self.dir)), ["issuer.key", "issuer.pub"])
        self.assertPrivate(private)
        key = security_keys.load_issuer_private(private)
        pub = security_keys.load_issuer_public(public)
        self.assertEqual(key.key_id, pub.key_id)
        self.assertIn(key.key_id, result.out)
        assert_setting(self, result, "edge.yaml", "security.lease.signing_key_file", private)
        assert_setting(self, result, "node.yaml", "security.issuer_key_file", public)

    def test_issuerRefusesExisting(self) -> None:
        self.assertOK(self.iop("keys", "issuer", "--dir", self.dir))
        with open(self.path("issuer.key"), "rb") as f:
            before = f.read()
        self.assertUserError(self.iop("keys", "issuer", "--dir", self.dir), "issuer.key")
        with open(self.path("issuer.key"), "rb") as f:
            self.assertEqual(f.read(), before)

    def test_issuerPublicExists(self) -> None:
        """An issuer.pub already there is not replaced, and no lone issuer.key is left."""
        os.makedirs(self.dir)
        with open(self.path("issuer.pub"), "w") as f:
            f.write("old")
        self.assertUserError(self.iop("keys", "issuer", "--dir", self.dir), "issuer.pub")
        self.assertEqual(os.listdir(self.dir), ["issuer.pub"])

    def _recipient(self, kem: str | None) -> None:
        argv = ["keys", "recipient", "gpu-a", "--dir", self.dir]
        if kem is not None:
            argv += ["--kem", kem]
        result = self.iop(*argv)
        self.assertOK(result)
        private, public = self.path("gpu-a.recipient.key"), self.path("gpu-a.recipient.pub")
        self.assertPrivate(private)
        key = security_keys.load_recipient_private(private)
        pub = security_keys.load_recipient_public(public)
        self.assertEqual(key.kem, kem or security_keys.KEM_X25519)
        self.assertEqual((pub.kem, pub.key_id), (key.kem, key.key_id))
        self.assertIn(key.key_id, result.out)
        assert_setting(self, result, "edge.yaml", "nodes[].recipient_key_file", public)
        assert_setting(self, result, "node.yaml", "security.recipient_key_file", private)
        self.assertIn("gpu-a", result.out)

    def test_recipientDefaultKem(self) -> None:
        """C{iop keys recipient ID}: an x25519 pair by default."""
        self._recipient(None)

    def test_recipientHybrid(self) -> None:
        """--kem mlkem768-x25519: the post-quantum hybrid pair."""
        self._recipient(security_keys.KEM_MLKEM768_X25519)

    def test_recipientRefusals(self) -> None:
        """A bad --kem is a usage error (2); a bad node id or existing files a user error (1)."""
        result = self.iop("keys", "recipient", "gpu-a", "--dir", self.dir, "--kem", "rsa")
        self.assertEqual(result.code, 2)
        self.assertIn("--kem", result.err)
        self.assertUserError(self.iop("keys", "recipient", "../a", "--dir", self.dir), "'../a'")
        self.assertFalse(os.path.exists(self.dir))
        self.assertOK(self.iop("keys", "recipient", "gpu-a", "--dir", self.dir))
        self.assertUserError(
            self.iop("keys", "recipient", "gpu-a", "--dir", self.dir), "gpu-a.recipient"
        )

    def test_defaultDir(self) -> None:
        """Without --dir the files go to ./keys."""
        cwd = os.path.abspath(self.mktemp())
        os.makedirs(cwd)
        here = os.getcwd()
        os.chdir(cwd)
        self.addCleanup(os.chdir, here)
        self.assertOK(run(["keys", "issuer"]))
        self.assertOK(run(["keys", "recipient", "gpu-a"]))
        self.assertEqual(
            sorted(os.listdir(os.path.join(cwd, "keys"))),
            ["gpu-a.recipient.key", "gpu-a.recipient.pub", "issuer.key", "issuer.pub"],
        )
