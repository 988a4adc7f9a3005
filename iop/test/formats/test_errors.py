"""The one rule for the message of an upstream error body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.formats.errors import error_message


class ErrorMessageTests(SynchronousTestCase):
    def test_shapes(self) -> None:
        cases: list[tuple[bytes | str | Mapping[str, Any], str]] = [
            (b'{"error": {"message": "m", "type": "x"}}', "m"),
            (b'{"error": "plain"}', "plain"),
            (b'{"object": "error", "message": "vllm"}', "vllm"),
            (b'{"detail": "fastapi"}', "fastapi"),
            ('{"error": {"message": "text input"}}', "text input"),
            ({"error": {"message": "decoded"}}, "decoded"),
        ]
        for body, expected in cases:
            self.assertEqual(error_message(body), expected, body)

    def test_firstNonBlankWins(self) -> None:
        body = b'{"error": {"message": "  "}, "message": "", "detail": "why"}'
        self.assertEqual(error_message(body), "why")
        self.assertEqual(error_message(b'{"error": " spaced "}'), " spaced ")

    def test_noMessage(self) -> None:
        bodies: list[bytes | Mapping[str, Any]] = [
            b"",
            b"gateway down",
            b"[1]",
            b'{"error": {"code": 5}}',
            b"\xff",
            {"a": 1},
        ]
        for body in bodies:
            self.assertIsNone(error_message(body), body)
