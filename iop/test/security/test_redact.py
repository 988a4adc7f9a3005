# -*- test-case-name: iop.test.security.test_redact -*-
"""
:func:`iop.security.redact.redact_secrets`: every credential shape an upstream may echo is
replaced, ordinary error text is left as it is.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.security.redact import REDACTED, redact_secrets

SECRET = "sk-proj-Abc123def456GHI789jkl0"


class RedactTests(SynchronousTestCase):
    def assertRedacted(self, text: str, expected: str, *secrets: str) -> None:
        redacted = redact_secrets(text)
        self.assertEqual(redacted, expected)
        for secret in secrets:
            self.assertNotIn(secret, redacted)

    def test_bearer_header(self) -> None:
        self.assertRedacted(
            f"invalid header Authorization: Bearer {SECRET}",
            f"invalid header Authorization: Bearer {REDACTED}",
            SECRET,
        )

    def test_bearer_anywhere_and_other_schemes(self) -> None:
        self.assertRedacted(
            "got bearer abcdefgh.ijkl and Basic dXNlcjpwYXNz",
            f"got bearer {REDACTED} and Basic {REDACTED}",
            "abcdefgh",
            "dXNlcjpwYXNz",
        )

    def test_api_key_header(self) -> None:
        self.assertRedacted(
            "bad x-api-key: 0123456789abcdef (check it)",
            f"bad x-api-key: {REDACTED} (check it)",
            "0123456789abcdef",
        )

    def test_query_form(self) -> None:
        self.assertRedacted(
            "GET /v1/models?api_key=hunter2hunter2&page=2",
            f"GET /v1/models?api_key={REDACTED}&page=2",
            "hunter2hunter2",
        )

    def test_json_form(self) -> None:
        self.assertRedacted(
            'echo: {"api_key": "secret value 1", "access_token":"tok-9999", "n": 1}',
            f'echo: {{"api_key": "{REDACTED}", "access_token":"{REDACTED}", "n": 1}}',
            "secret value 1",
            "tok-9999",
        )

    def test_json_authorization_keeps_the_scheme(self) -> None:
        self.assertRedacted(
            '{"authorization": "Bearer abc.def.ghi"}',
            f'{{"authorization": "Bearer {REDACTED}"}}',
            "abc.def.ghi",
        )

    def test_password_and_secret_fields(self) -> None:
        self.assertRedacted(
            "password=p4ssw0rd; client_secret: cs-1",
            f"password={REDACTED}; client_secret: {REDACTED}",
            "p4ssw0rd",
            "cs-1",
        )

    def test_bare_secret_key_tokens(self) -> None:
        for token in (SECRET, "sk-ant-api03-" + "x" * 30, "sk_live_" + "9" * 24):
            self.assertRedacted(
                f"Incorrect API key provided: {token}.",
                f"Incorrect API key provided: {REDACTED}.",
                token,
            )

    def test_ordinary_text_is_unchanged(self) -> None:
        for text in (
            "",
            "context too long",
            "'max_tokens' must be a positive integer",
            "max_tokens: 100 is more than the model allows",
            "token limit exceeded: 5000 tokens",
            "the provider answered HTTP 401",
            "invalid authorization",
            "sk-short",
            "model 'gpt-4o' does not exist",
            "Bearer",
            "ask-me-anything-please-now is a phrase",
        ):
            self.assertEqual(redact_secrets(text), text)

    def test_idempotent(self) -> None:
        text = f'Authorization: Bearer {SECRET} {{"api_key": "v-12345678"}} x-api-key=abcdefgh'
        once = redact_secrets(text)
        self.assertEqual(redact_secrets(once), once)
