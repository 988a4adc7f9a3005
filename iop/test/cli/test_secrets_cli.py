# -*- test-case-name: iop.test.cli.test_secrets_cli -*-
"""
Tests for C{iop token new} and C{iop key new} (L{iop.cli.secrets}): the secret is printed once,
its digest entry is what the edge.yaml loader accepts for it, and each run makes a new one.
"""

from __future__ import annotations

import datetime
import hashlib
import re

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import secrets as secrets_cli
from iop.test.cli.support import run


class TokenNewTests(SynchronousTestCase):
    def test_token(self) -> None:
        result = run(["token", "new", "gpu-1"])
        self.assertEqual((result.code, result.err), (0, ""))
        token = re.search(r"^  (\S+)$", result.out, re.MULTILINE)
        assert token is not None
        self.assertRegex(token.group(1), r"\A[A-Za-z0-9_-]{43}\Z")
        self.assertEqual(result.out.count(token.group(1)), 1)
        digest = hashlib.sha256(token.group(1).encode()).hexdigest()
        self.assertIn(f"\n    token_sha256: {digest}\n", result.out)
        self.assertIn("gpu-1", result.out)

    def test_fresh(self) -> None:
        self.assertNotEqual(run(["token", "new", "a"]).out, run(["token", "new", "a"]).out)

    def test_badNodeId(self) -> None:
        result = run(["token", "new", "-x y"])
        self.assertNotEqual(result.code, 0)
        self.assertEqual(result.out, "")


class KeyNewTests(SynchronousTestCase):
    def test_key(self) -> None:
        result = run(["key", "new", "team-a"])
        self.assertEqual((result.code, result.err), (0, ""))
        key = re.search(r"^  (sk-iop-\S+)$", result.out, re.MULTILINE)
        assert key is not None
        self.assertEqual(len(key.group(1)), len(secrets_cli.KEY_PREFIX) + 43)
        digest = hashlib.sha256(key.group(1).encode()).hexdigest()
        self.assertIn(f"      - name: team-a\n        key_sha256: {digest}\n", result.out)

    def test_badName(self) -> None:
        result = run(["key", "new", "a b"])
        self.assertEqual(result.code, 1)
        self.assertIn("key name 'a b'", result.err)

    def test_rotate(self) -> None:
        result = run(["key", "new", "team-a", "--rotate", "--grace-days", "2"])
        self.assertEqual((result.code, result.err), (0, ""))
        key = re.search(r"^  (sk-iop-\S+)$", result.out, re.MULTILINE)
        assert key is not None
        digest = hashlib.sha256(key.group(1).encode()).hexdigest()
        self.assertIn(f"      - name: team-a\n        key_sha256: {digest}\n", result.out)
        self.assertIn("previous_key_sha256: <the entry's current key_sha256>", result.out)
        until = re.search(r'previous_valid_until: "(\S+)"', result.out)
        assert until is not None
        when = datetime.datetime.fromisoformat(until.group(1).replace("Z", "+00:00"))
        left = when - datetime.datetime.now(datetime.UTC)
        self.assertTrue(datetime.timedelta(days=1.99) < left <= datetime.timedelta(days=2))

    def test_rotate_grace_bounds(self) -> None:
        result = run(["key", "new", "team-a", "--rotate", "--grace-days", "0"])
        self.assertEqual(result.code, 1)
        self.assertIn("--grace-days", result.err)
