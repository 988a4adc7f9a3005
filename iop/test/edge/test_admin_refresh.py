# -*- test-case-name: iop.test.edge.test_admin_refresh -*-
"""``POST /config/refresh`` on the admin app: the modes, the document, the refusals."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.admin import AdminApp
from iop.edge.refresh.report import ChangeReport, RefreshResult, rejected_result


class FakeRefresher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answer: Deferred[RefreshResult] | None = None

    def refresh(self, mode: str, trigger: str = "admin API") -> Deferred[RefreshResult]:
        self.calls.append((mode, trigger))
        if self.answer is not None:
            return self.answer
        if mode not in ("dry_run", "apply"):
            return succeed(rejected_result(mode, [f"unknown refresh mode {mode!r}"]))
        return succeed(
            RefreshResult(
                "applied",
                mode,
                reports=[ChangeReport("nodes[0].providers[0].capacity", "1", "2", "live")],
            )
        )


class AdminRefreshTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.refresher = FakeRefresher()
        app = AdminApp(lambda: {}, refresher=self.refresher)  # type: ignore[arg-type]
        self.treq: Any = StubTreq(app.resource())

    def post(self, data: bytes) -> tuple[int, Any]:
        response = self.successResultOf(self.treq.post("http://admin/config/refresh", data=data))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        return response.code, body

    def test_apply(self) -> None:
        code, body = self.post(b'{"mode": "apply"}')
        self.assertEqual(code, 200)
        self.assertEqual(self.refresher.calls, [("apply", "admin API")])
        self.assertEqual(body["result"], "applied")
        self.assertEqual(body["mode"], "apply")
        self.assertEqual(
            body["reports"],
            [
                {
                    "path": "nodes[0].providers[0].capacity",
                    "old": "1",
                    "new": "2",
                    "change_class": "live",
                    "detail": "",
                }
            ],
        )
        for key in ("changed_nodes", "changed_providers", "changed_models", "node_pushes"):
            self.assertEqual(body[key], [])

    def test_noBodyIsDryRun(self) -> None:
        for data in (b"", b"{}", b"  \n"):
            code, body = self.post(data)
            self.assertEqual((code, body["mode"]), (200, "dry_run"))
        self.assertEqual([m for m, _ in self.refresher.calls], ["dry_run"] * 3)

    def test_unknownModeIsRejectedDocument(self) -> None:
        code, body = self.post(b'{"mode": "force"}')
        self.assertEqual((code, body["result"], body["mode"]), (200, "rejected", "force"))
        self.assertTrue(body["errors"])

    def test_badBodies(self) -> None:
        for data, message in [
            (b"{nope", "request body must be JSON"),
            (b"[]", "request body must be a JSON object"),
            (b'{"mode": 1}', "'mode' must be a string"),
            (b'{"mode": "apply", "force": true}', "unknown field 'force'"),
        ]:
            code, body = self.post(data)
            self.assertEqual((code, body["error"]["message"]), (400, message))
        self.assertEqual(self.refresher.calls, [])

    def test_waitsForResult(self) -> None:
        self.refresher.answer = Deferred()
        d = self.treq.post("http://admin/config/refresh", data=b'{"mode": "apply"}')
        self.assertNoResult(d)
        self.refresher.answer.callback(RefreshResult("restart_required", "apply"))
        self.treq.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual(body["result"], "restart_required")

    def test_unavailable(self) -> None:
        treq: Any = StubTreq(AdminApp(lambda: {}).resource())
        response = self.successResultOf(treq.post("http://admin/config/refresh", data=b"{}"))
        self.assertEqual(response.code, 503)

    def test_getNotAllowed(self) -> None:
        response = self.successResultOf(self.treq.get("http://admin/config/refresh"))
        self.assertEqual(response.code, 405)
