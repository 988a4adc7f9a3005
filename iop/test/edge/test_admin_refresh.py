# -*- test-case-name: iop.test.edge.test_admin_refresh -*-
"""
``POST /config/refresh`` on the admin app: the modes, the document, the refusals; and the Edge
service's refresh wiring behind it (skipped while the apply module is absent).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from typing import Any

import yaml
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.config import load_edge_config
from iop.edge.admin import AdminApp
from iop.edge.refresh.push import PUSH_TIMEOUT_SEC
from iop.edge.refresh.report import ChangeReport, RefreshResult, rejected_result
from iop.edge.tap import EdgeService
from iop.test.edge.fixtures import FakeConnection
from iop.wire import runtime_pb2 as pb

NODE_TOKEN = "admin-refresh-node-token"


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


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class EdgeServiceRefreshTests(SynchronousTestCase):
    """
    The Edge service's wiring: its admin app, refresher, applier and pusher over a real
    edge.yaml, with a memory reactor and a fake node connection.
    """

    skip = (
        None
        if _importable("iop.edge.refresh.apply")
        else "iop.edge.refresh.apply (LiveApplier) is not importable yet"
    )

    def setUp(self) -> None:
        self.path = os.path.join(os.path.abspath(self.mktemp()), "edge.yaml")
        os.makedirs(os.path.dirname(self.path))
        self.write(capacity=1, concurrency=0)
        self.reactor = MemoryReactorClock()
        self.edge = EdgeService(load_edge_config(self.path), self.reactor)
        self.treq: Any = StubTreq(self.edge.admin.resource())
        self.connection = FakeConnection()
        self.edge.registry.register(NODE_TOKEN, self.connection)
        self.edge.registry.ready("node-a", self.connection)

    def write(self, **node: Any) -> None:
        data = {
            "listen": {
                "nodes": "tcp:17443:interface=127.0.0.1",
                "admin": "tcp:18081:interface=127.0.0.1",
            },
            "node_transport": {"plaintext": True},
            "nodes": [
                {
                    "id": "node-a",
                    "token_sha256": hashlib.sha256(NODE_TOKEN.encode()).hexdigest(),
                    "concurrency": node["concurrency"],
                    "adapters": [
                        {
                            "name": "api",
                            "type": "openai_compat",
                            "base_url": "http://127.0.0.1:9/v1",
                            # Explicit: the node's gate does not follow the capacity.
                            "max_concurrency": 8,
                        }
                    ],
                    "providers": [
                        {
                            "id": "a-chat",
                            "adapter": "api",
                            "category": "api",
                            "models": ["m"],
                            "capacity": node["capacity"],
                        }
                    ],
                }
            ],
            "models": [{"id": "pool", "providers": ["a-chat"]}],
        }
        with open(self.path, "w") as f:
            yaml.safe_dump(data, f)

    def post(self, mode: str) -> Any:
        return self.treq.post("http://admin/config/refresh", data=json.dumps({"mode": mode}))

    def document(self, d: Any) -> dict[str, Any]:
        self.treq.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        body: dict[str, Any] = json.loads(self.successResultOf(response.content()))
        return body

    def capacity(self) -> int:
        [entry] = [p for p in self.edge.snapshot()["providers"] if p["id"] == "a-chat"]
        return int(entry["capacity"])

    def test_noOpDryRun(self) -> None:
        body = self.document(self.post("dry_run"))
        self.assertEqual(
            (body["result"], body["reports"], body["node_pushes"]), ("applied", [], [])
        )

    def test_liveChangeApplies(self) -> None:
        before = self.edge.config
        self.write(capacity=2, concurrency=0)
        body = self.document(self.post("apply"))
        self.assertEqual(body["result"], "applied")
        self.assertEqual(self.capacity(), 2)
        self.assertIsNot(self.edge.config, before)
        # Provider capacity under an explicit max_concurrency is not in the node's payload:
        # nothing to push.
        self.assertEqual((body["node_pushes"], self.connection.sent), ([], []))

    def test_nodePushAnswered(self) -> None:
        self.write(capacity=1, concurrency=3)
        d = self.post("apply")
        self.treq.flush()
        self.assertNoResult(d)
        [envelope] = self.connection.sent
        request = envelope.node_config_refresh_request
        self.assertEqual(request.config.runtime.concurrency, 3)
        self.assertEqual(request.config.config_revision, self.edge.applier.generation)
        answer = pb.Envelope(
            node_config_refresh_response=pb.NodeConfigRefreshResponse(
                request_id=request.request_id, outcome=pb.REFRESH_APPLIED
            )
        )
        self.edge.node_factory.handlers["node_config_refresh_response"](
            self.connection,  # type: ignore[arg-type]
            answer,
        )
        body = self.document(d)
        self.assertEqual(
            body["node_pushes"], [{"node_id": "node-a", "outcome": "applied", "reason": ""}]
        )

    def test_pushTimesOut(self) -> None:
        self.write(capacity=1, concurrency=3)
        d = self.post("apply")
        self.treq.flush()
        self.reactor.advance(PUSH_TIMEOUT_SEC)
        body = self.document(d)
        self.assertEqual(body["node_pushes"][0]["outcome"], "timeout")

    def test_restartRequiredLeavesStatus(self) -> None:
        before = self.edge.snapshot()
        with open(self.path) as f:
            data = yaml.safe_load(f)
        data["listen"]["admin"] = "tcp:18082:interface=127.0.0.1"
        data["nodes"][0]["providers"][0]["capacity"] = 5
        with open(self.path, "w") as f:
            yaml.safe_dump(data, f)
        body = self.document(self.post("apply"))
        self.assertEqual(body["result"], "restart_required")
        self.assertEqual(self.edge.snapshot(), before)

    def test_brokenFileRejected(self) -> None:
        before = self.edge.snapshot()
        with open(self.path, "w") as f:
            f.write("nodes: [\n")
        body = self.document(self.post("apply"))
        self.assertEqual(body["result"], "rejected")
        self.assertIn("invalid YAML", body["errors"][0])
        self.assertEqual(self.edge.snapshot(), before)
