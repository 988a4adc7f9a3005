# -*- test-case-name: iop.test.config.test_admin_section -*-
"""
Tests for edge.yaml's ``admin:`` section (:class:`~iop.config.model.AdminConfig`): the admin
bearer token's three forms, kept as a digest, and the rule that a non-loopback admin listener
needs it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.test.config.test_edge_config import (
    ENVIRON,
    EdgeConfigTestMixin,
    assertIssue,
    base_config,
)

ADMIN_TOKEN = "admin-token-value"
ENV = {**ENVIRON, "IOP_ADMIN_TOKEN": ADMIN_TOKEN}


class AdminSectionTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def config(self, admin_listen: str | None = None, admin: Any = None) -> dict[str, Any]:
        data = base_config()
        if admin_listen is not None:
            data["listen"]["admin"] = admin_listen
        if admin is not None:
            data["admin"] = admin
        return data

    def error(self, data: dict[str, Any]) -> ConfigError:
        error: ConfigError = self.assertRaises(ConfigError, self.parse, data, ENV)
        return error

    def test_defaultOpenOnLoopback(self) -> None:
        """Today's behaviour: the loopback admin listener needs no token."""
        config = self.parse(self.config(), ENV)
        self.assertIsNone(config.admin.auth)

    def test_loopbackWithoutAuth(self) -> None:
        for listen in ("tcp:8081:interface=127.0.0.1", "tcp:8081:interface=\\:\\:1", "unix:a.sock"):
            self.assertIsNone(self.parse(self.config(listen), ENV).admin.auth)

    def test_tokenFromEnvironment(self) -> None:
        config = self.parse(self.config(admin={"auth": {"token": "${IOP_ADMIN_TOKEN}"}}), ENV)
        assert config.admin.auth is not None
        self.assertTrue(config.admin.auth.matches(ADMIN_TOKEN))
        self.assertFalse(config.admin.auth.matches("other"))

    def test_tokenFile(self) -> None:
        self.write("secrets/admin.token", f"{ADMIN_TOKEN}\n")
        config = self.parse(
            self.config(
                "tcp:8081:interface=0.0.0.0", {"auth": {"token_file": "secrets/admin.token"}}
            ),
            ENV,
        )
        assert config.admin.auth is not None
        self.assertTrue(config.admin.auth.matches(ADMIN_TOKEN))

    def test_tokenSha256(self) -> None:
        digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
        config = self.parse(self.config("tcp:8081", {"auth": {"token_sha256": digest}}), ENV)
        assert config.admin.auth is not None
        self.assertTrue(config.admin.auth.matches(ADMIN_TOKEN))

    def test_digestOnlyNotInRepr(self) -> None:
        config = self.parse(self.config(admin={"auth": {"token": "${IOP_ADMIN_TOKEN}"}}), ENV)
        self.assertNotIn(ADMIN_TOKEN, repr(config))
        self.assertNotIn(hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest(), repr(config))

    def test_nonLoopbackNeedsAuth(self) -> None:
        for listen, shown in (
            ("tcp:8081", "all interfaces"),
            ("tcp:8081:interface=0.0.0.0", "interface 0.0.0.0"),
            ("tcp:8081:interface=10.0.0.5", "interface 10.0.0.5"),
            ("ssl:8081:privateKey=k.pem", "all interfaces"),
        ):
            error = self.error(self.config(listen))
            issue = assertIssue(self, error, "listen.admin", "admin.auth")
            self.assertIn(shown, issue.message)
            self.assertIn("not loopback", issue.message)

    def test_literalTokenRefused(self) -> None:
        error = self.error(self.config(admin={"auth": {"token": ADMIN_TOKEN}}))
        assertIssue(self, error, "admin.auth.token", "literal tokens are not allowed")
        self.assertNotIn(ADMIN_TOKEN, str(error))

    def test_oneForm(self) -> None:
        error = self.error(self.config(admin={"auth": {}}))
        assertIssue(self, error, "admin.auth", "one of token, token_file or token_sha256")
        error = self.error(
            self.config(admin={"auth": {"token": "${IOP_ADMIN_TOKEN}", "token_sha256": "0" * 64}})
        )
        assertIssue(self, error, "admin.auth", "set only one of")

    def test_brokenAuthDoesNotCascade(self) -> None:
        """A broken admin.auth on a public listener is its own issue, not also listen.admin's."""
        error = self.error(self.config("tcp:8081", {"auth": {"token": "${NOT_SET}"}}))
        assertIssue(self, error, "admin.auth.token", "NOT_SET is not set")
        self.assertEqual([i.path for i in error.issues], ["admin.auth.token"])

    def test_unknownKeys(self) -> None:
        error = self.error(self.config(admin={"auth": {"token": "${IOP_ADMIN_TOKEN}"}, "x": 1}))
        assertIssue(self, error, "admin.x", "")
        error = self.error(self.config(admin={"auth": {"token_sha256": "0" * 64, "y": 1}}))
        assertIssue(self, error, "admin.auth.y", "")

    def test_badTokenSha256(self) -> None:
        error = self.error(self.config(admin={"auth": {"token_sha256": ADMIN_TOKEN}}))
        assertIssue(self, error, "admin.auth.token_sha256", "64 hexadecimal")
        self.assertNotIn(ADMIN_TOKEN, str(error))
