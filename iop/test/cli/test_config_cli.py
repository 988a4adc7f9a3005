# -*- test-case-name: iop.test.cli.test_config_cli -*-
"""
Tests for C{iop config refresh} (L{iop.cli.config}) through L{iop.cli.main.main}, against a
fake admin listener (the HTTP call is replaced): the request, the admin URL's sources, the
summary and C{--json}, the exit codes, and the refusals.
"""

from __future__ import annotations

import io
import json
import os
import urllib.error
import urllib.request
from email.message import Message
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import config as config_cli
from iop.test.cli.support import Result, run

APPLIED = {
    "result": "applied",
    "mode": "apply",
    "changed_nodes": ["node-a"],
    "changed_providers": ["a-chat"],
    "changed_models": [],
    "reports": [
        {
            "path": "nodes[0].providers[0].capacity",
            "old": "1",
            "new": "2",
            "change_class": "live",
            "detail": "",
        }
    ],
    "errors": [],
    "node_pushes": [{"node_id": "node-a", "outcome": "applied", "reason": ""}],
}


def document(result: str, mode: str = "apply", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "result": result,
        "mode": mode,
        "changed_nodes": [],
        "changed_providers": [],
        "changed_models": [],
        "reports": [],
        "errors": [],
        "node_pushes": [],
    }
    body.update(extra)
    return body


class RefreshCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.requests: list[tuple[str, Any, float]] = []
        self.answer: tuple[int, bytes] = (200, json.dumps(APPLIED).encode())
        self.error: OSError | None = None
        self.patch(config_cli, "http_post", self.post)
        self.admin_env(None)

    def admin_env(self, value: str | None) -> None:
        """Set (or, with None, unset) $IOP_ADMIN for the rest of the test."""
        old = os.environ.pop(config_cli.ADMIN_ENV, None)
        if old is not None:
            self.addCleanup(os.environ.__setitem__, config_cli.ADMIN_ENV, old)
        if value is not None:
            os.environ[config_cli.ADMIN_ENV] = value
            self.addCleanup(os.environ.pop, config_cli.ADMIN_ENV, None)

    def post(
        self, url: str, body: bytes, timeout: float, headers: object = None
    ) -> tuple[int, bytes]:
        self.requests.append((url, json.loads(body), timeout))
        if self.error is not None:
            raise self.error
        return self.answer

    def answers(self, body: object, status: int = 200) -> None:
        self.answer = (status, json.dumps(body).encode())

    def iop(self, *argv: str) -> Result:
        return run(["config", "refresh", *argv])

    def test_apply(self) -> None:
        result = self.iop()
        self.assertEqual(result.code, 0)
        [(url, body, timeout)] = self.requests
        self.assertEqual(url, "http://127.0.0.1:8081/config/refresh")
        self.assertEqual(body, {"mode": "apply"})
        self.assertEqual(timeout, config_cli.TIMEOUT_SEC)
        self.assertEqual(
            result.out.splitlines(),
            [
                "applied (1 change)",
                "  nodes[0].providers[0].capacity: 1 → 2 (live)",
                "  node node-a: applied",
            ],
        )
        self.assertEqual(result.err, "")

    def test_dryRun(self) -> None:
        self.answers(document("applied", "dry_run"))
        result = self.iop("--dry-run")
        self.assertEqual(self.requests[0][1], {"mode": "dry_run"})
        self.assertEqual((result.code, result.out), (0, "dry run: would apply (0 changes)\n"))

    def test_restartRequiredExits3(self) -> None:
        self.answers(
            document(
                "restart_required",
                reports=[
                    {
                        "path": "admin_listen",
                        "old": "tcp:8081",
                        "new": "tcp:9091",
                        "change_class": "restart_required",
                        "detail": "a listener",
                    }
                ],
            )
        )
        result = self.iop()
        self.assertEqual(result.code, 3)
        self.assertEqual(
            result.out.splitlines(),
            [
                "restart required: nothing was applied (1 change)",
                "  admin_listen: tcp:8081 → tcp:9091 (restart_required): a listener",
            ],
        )

    def test_rejectedExits1(self) -> None:
        self.answers(document("rejected", errors=["nodes[0].providers[0].capacity: must be >= 1"]))
        result = self.iop()
        self.assertEqual(result.code, 1)
        self.assertEqual(
            result.out.splitlines(),
            [
                "rejected: nothing was applied (0 changes)",
                "  error: nodes[0].providers[0].capacity: must be >= 1",
            ],
        )

    def test_json(self) -> None:
        result = self.iop("--json")
        self.assertEqual((result.code, json.loads(result.out)), (0, APPLIED))

    def test_adminUrlSources(self) -> None:
        self.iop("--admin", "http://10.0.0.1:9000/")
        self.admin_env("127.0.0.1:7070")
        self.iop()
        self.iop("--admin", "http://edge:1")
        self.assertEqual(
            [url for url, _, _ in self.requests],
            [
                "http://10.0.0.1:9000/config/refresh",
                "http://127.0.0.1:7070/config/refresh",
                "http://edge:1/config/refresh",
            ],
        )

    def test_unreachable(self) -> None:
        self.error = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        result = self.iop()
        self.assertEqual(result.code, 1)
        self.assertIn("cannot reach the Edge admin listener at http://127.0.0.1:8081", result.err)
        self.assertIn("Connection refused", result.err)

    def test_httpError(self) -> None:
        self.answers({"error": {"message": "config refresh is not available", "code": 503}}, 503)
        result = self.iop()
        self.assertEqual(result.code, 1)
        self.assertEqual(
            result.err,
            "iop: error: http://127.0.0.1:8081/config/refresh answered HTTP 503: config "
            "refresh is not available\n",
        )

    def test_notADocument(self) -> None:
        self.answer = (200, b"<html>")
        self.assertEqual(self.iop().code, 1)
        self.answers({"result": "maybe"})
        result = self.iop()
        self.assertEqual(result.code, 1)
        self.assertIn("unknown result 'maybe'", result.err)

    def test_help(self) -> None:
        result = run(["config", "refresh", "--help"])
        self.assertEqual(result.code, 0)
        self.assertIn("--dry-run", result.out)
        self.assertIn("3 restart", result.out)
        self.assertIn("config", run(["--help"]).out)


class HttpPostTests(SynchronousTestCase):
    """The default client, with C{urlopen} replaced."""

    def test_answer(self) -> None:
        seen: list[Any] = []

        class Response(io.BytesIO):
            status = 200

        def urlopen(request: urllib.request.Request, timeout: float) -> Response:
            seen.append((request.full_url, request.get_method(), request.data, timeout))
            return Response(b"{}")

        self.patch(urllib.request, "urlopen", urlopen)
        self.assertEqual(config_cli.http_post("http://e/config/refresh", b"{}", 5), (200, b"{}"))
        self.assertEqual(seen, [("http://e/config/refresh", "POST", b"{}", 5)])

    def test_httpErrorIsAnAnswer(self) -> None:
        def urlopen(request: urllib.request.Request, timeout: float) -> Any:
            raise urllib.error.HTTPError(
                request.full_url, 400, "Bad Request", Message(), io.BytesIO(b'{"error": {}}')
            )

        self.patch(urllib.request, "urlopen", urlopen)
        self.assertEqual(
            config_cli.http_post("http://e/config/refresh", b"{}", 5), (400, b'{"error": {}}')
        )
