# -*- test-case-name: iop.test.cli.test_admin_token_cli -*-
"""
``iop config refresh`` against an Edge with ``admin.auth``: the admin token from
``--admin-token-file`` or ``$IOP_ADMIN_TOKEN`` goes out as ``Authorization: Bearer``, and is
never printed.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Mapping
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import config as config_cli
from iop.test.cli.support import Result, run

TOKEN = "admin-token-for-cli-tests"
APPLIED = {
    "result": "applied",
    "mode": "apply",
    "changed_nodes": [],
    "changed_providers": [],
    "changed_models": [],
    "reports": [],
    "errors": [],
    "node_pushes": [],
}


class AdminTokenTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.headers: list[Mapping[str, str]] = []
        self.answer = (200, json.dumps(APPLIED).encode())
        self.patch(config_cli, "http_post", self.post)
        for name in (config_cli.ADMIN_ENV, config_cli.ADMIN_TOKEN_ENV):
            self.env(name, None)

    def env(self, name: str, value: str | None) -> None:
        old = os.environ.pop(name, None)
        if old is not None:
            self.addCleanup(os.environ.__setitem__, name, old)
        if value is not None:
            os.environ[name] = value
            self.addCleanup(os.environ.pop, name, None)

    def post(
        self, url: str, body: bytes, timeout: float, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        self.headers.append(dict(headers))
        return self.answer

    def iop(self, *argv: str) -> Result:
        result = run(["config", "refresh", *argv])
        self.assertNotIn(TOKEN, result.out + result.err)
        return result

    def token_file(self, text: str) -> str:
        path: str = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_noTokenNoHeader(self) -> None:
        self.assertEqual(self.iop().code, 0)
        self.assertEqual(self.headers, [{}])

    def test_tokenFile(self) -> None:
        result = self.iop("--admin-token-file", self.token_file(f"{TOKEN}\n"))
        self.assertEqual(result.code, 0)
        self.assertEqual(self.headers, [{"authorization": f"Bearer {TOKEN}"}])

    def test_environment(self) -> None:
        self.env(config_cli.ADMIN_TOKEN_ENV, TOKEN)
        self.assertEqual(self.iop().code, 0)
        self.assertEqual(self.headers, [{"authorization": f"Bearer {TOKEN}"}])

    def test_fileBeatsEnvironment(self) -> None:
        self.env(config_cli.ADMIN_TOKEN_ENV, "from-env")
        self.iop("--admin-token-file", self.token_file(TOKEN))
        self.assertEqual(self.headers, [{"authorization": f"Bearer {TOKEN}"}])

    def test_badFiles(self) -> None:
        missing = os.path.join(self.mktemp(), "none")
        for path, fragment in (
            (missing, "cannot read the admin token file"),
            (self.token_file("\n"), "is empty"),
            (self.token_file(f"{TOKEN}\nsecond line"), "does not hold one token"),
        ):
            result = self.iop("--admin-token-file", path)
            self.assertEqual(result.code, 1)
            self.assertIn(fragment, result.err)
            self.assertIn(path, result.err)
        self.assertEqual(self.headers, [])

    def test_unauthorizedSaysHow(self) -> None:
        body = {"error": {"message": "the admin bearer token is not valid", "code": 401}}
        self.answer = (401, json.dumps(body).encode())
        result = self.iop()
        self.assertEqual(result.code, 1)
        self.assertIn("HTTP 401: the admin bearer token is not valid", result.err)
        self.assertIn("--admin-token-file", result.err)
        self.assertIn(config_cli.ADMIN_TOKEN_ENV, result.err)


class HttpPostHeaderTests(SynchronousTestCase):
    def test_headersSent(self) -> None:
        seen: list[Any] = []

        class Response:
            status = 200

            def __enter__(self) -> Response:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def read(self) -> bytes:
                return b"{}"

        def urlopen(request: urllib.request.Request, timeout: float) -> Response:
            seen.append(request.get_header("Authorization"))
            return Response()

        self.patch(urllib.request, "urlopen", urlopen)
        config_cli.http_post("http://e/x", b"{}", 5, {"authorization": "Bearer t"})
        self.assertEqual(seen, ["Bearer t"])
