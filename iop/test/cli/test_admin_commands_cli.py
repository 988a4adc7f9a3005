# -*- test-case-name: iop.test.cli.test_admin_commands_cli -*-
"""
Tests for the admin-listener commands C{iop status}, C{iop runs} and C{iop node command}
(L{iop.cli.status}, L{iop.cli.runs}, L{iop.cli.node}) through L{iop.cli.main.main}, with the
HTTP calls replaced by a fake admin listener.
"""

from __future__ import annotations

import json
import os
import urllib.error
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import config as config_cli
from iop.cli import node as node_cli
from iop.cli import status as status_cli
from iop.edge.commands import COMMAND_TYPES
from iop.test.cli.support import run

STATUS = {
    "edge": {"id": "edge-1", "mode": "legacy"},
    "nodes": [
        {
            "id": "node-a",
            "alias": "",
            "connected": True,
            "state": "ready",
            "identity": {"checked": True, "ok": True, "presented": [], "refusals": 0},
            "providers": ["a-chat"],
        },
        {
            "id": "node-b",
            "alias": "",
            "connected": False,
            "state": "disconnected",
            "identity": {"checked": False, "ok": False, "presented": [], "refusals": 0},
            "providers": [],
        },
    ],
    "providers": [
        {
            "id": "a-chat",
            "node_id": "node-a",
            "adapter": "openai_compat",
            "type": "openai_compat",
            "category": "api",
            "models": ["m1", "m2"],
            "enabled": True,
            "priority": 0,
            "status": "available",
            "health": "healthy",
            "capacity": 4,
            "long_capacity": 1,
            "in_flight": 2,
            "long_in_flight": 0,
            "queued": 3,
            "long_queued": 1,
        }
    ],
    "models": [],
}


class FakeAdmin:
    """Answers GETs and POSTs from canned (status, body) pairs per URL; records each call."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.answers: dict[str, tuple[int, bytes]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.error: OSError | None = None
        case.patch(status_cli, "http_get", self.get)
        case.patch(config_cli, "http_post", self.post)
        old = os.environ.pop(config_cli.ADMIN_ENV, None)
        if old is not None:
            case.addCleanup(os.environ.__setitem__, config_cli.ADMIN_ENV, old)
        case.addCleanup(os.environ.pop, config_cli.ADMIN_ENV, None)

    def answer(self, url: str, body: object, status: int = 200) -> None:
        self.answers[url] = (status, json.dumps(body).encode())

    def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        self.calls.append(("GET", url, None))
        return self._answer(url)

    def post(self, url: str, body: bytes, timeout: float, headers: Any = None) -> tuple[int, bytes]:
        self.calls.append(("POST", url, json.loads(body)))
        return self._answer(url)

    def _answer(self, url: str) -> tuple[int, bytes]:
        if self.error is not None:
            raise self.error
        return self.answers.get(url, (404, b'{"error": {"message": "not found", "code": 404}}'))


ADMIN = "http://127.0.0.1:8081"


class StatusCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.admin = FakeAdmin(self)
        self.admin.answer(f"{ADMIN}/status", STATUS)

    def test_tables(self) -> None:
        result = run(["status"])
        self.assertEqual((result.code, result.err), (0, ""))
        self.assertEqual(
            result.out.splitlines(),
            [
                "edge edge-1 (mode: legacy)",
                "",
                "NODE    STATE         SINCE            IDENTITY  PROVIDERS",
                "node-a  ready         -                ok        a-chat",
                "node-b  disconnected  never connected  -         -",
                "",
                "NODE    PROVIDER  ADAPTER        MODEL(S)  STATUS     HEALTH   "
                "IN FLIGHT/CAPACITY  LONG  QUEUED",
                "node-a  a-chat    openai_compat  m1,m2     available  healthy  "
                "2/4                 0/1   3 (1 long)",
                "(LONG: long-prompt leases in flight/capacity; -: takes no requests now)",
                "",
                "no client models configured",
            ],
        )
        self.assertEqual(self.admin.calls, [("GET", f"{ADMIN}/status", None)])

    def test_cluster_view(self) -> None:
        cluster = {
            "edge_id": "edge-1",
            "redis": "up",
            "lease_ttl_sec": 10.0,
            "leases_held_here": 2,
            "leases_lost": 0,
            "stale": False,
            "edges": [{"id": "edge-1", "queued": 0}, {"id": "edge-2", "queued": 3}],
            "providers": {"a-chat": {"in_flight": 4, "long_in_flight": 1}},
        }
        self.admin.answer(f"{ADMIN}/status", {**STATUS, "cluster": cluster})
        lines = run(["status"]).out.splitlines()
        self.assertEqual(
            lines[lines.index("no client models configured") + 1 :],
            [
                "",
                "cluster: this Edge is edge-1, Redis up, lease TTL 10.0s, 2 leases held here, "
                "0 lost",
                "  edge edge-1: 0 queued",
                "  edge edge-2: 3 queued",
                "  provider a-chat: 4/1 in flight over every Edge (all/long)",
            ],
        )

    def test_a_refused_node_says_why(self) -> None:
        refusal = {"code": "lease_support", "reason": "the node announced none", "at_unix_ms": 1}
        nodes = [dict(STATUS["nodes"][0], last_refusal=refusal)]  # type: ignore[index]
        nodes.append(dict(STATUS["nodes"][1], last_refusal=refusal))  # type: ignore[index]
        self.admin.answer(f"{ADMIN}/status", {**STATUS, "nodes": nodes})
        lines = run(["status"]).out.splitlines()
        # Only the node that is not connected: a connected node's refusal is history.
        self.assertEqual(
            [line for line in lines if "refused" in line],
            ["node-b: last registration refused (lease_support): the node announced none"],
        )

    def test_json(self) -> None:
        result = run(["status", "--json"])
        self.assertEqual((result.code, json.loads(result.out)), (0, STATUS))

    def test_identity(self) -> None:
        identity = status_cli._identity
        self.assertEqual(
            identity({"checked": True, "ok": True, "presented": ["a.node.x"]}), "a.node.x"
        )
        self.assertEqual(identity({"checked": True, "ok": False, "presented": ["b"]}), "refused")
        self.assertEqual(identity(None), "-")

    def test_adminSources(self) -> None:
        self.admin.answer("http://edge:9/status", STATUS)
        self.admin.answer("http://10.1.1.1:7/status", STATUS)
        self.assertEqual(run(["status", "--admin", "http://edge:9/"]).code, 0)
        os.environ[config_cli.ADMIN_ENV] = "10.1.1.1:7"
        self.assertEqual(run(["status"]).code, 0)
        self.assertEqual(
            [url for _, url, _ in self.admin.calls],
            ["http://edge:9/status", "http://10.1.1.1:7/status"],
        )

    def test_unreachable(self) -> None:
        self.admin.error = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        result = run(["status"])
        self.assertEqual(result.code, 1)
        self.assertIn(
            f"iop: error: cannot reach the Edge admin listener at {ADMIN}/status", result.err
        )

    def test_httpError(self) -> None:
        self.admin.answer(f"{ADMIN}/status", {"error": {"message": "nope", "code": 500}}, 500)
        result = run(["status"])
        self.assertEqual(
            (result.code, result.err), (1, f"iop: error: {ADMIN}/status answered HTTP 500: nope\n")
        )

    def test_empty(self) -> None:
        self.admin.answer(
            f"{ADMIN}/status",
            {"edge": {"id": "e", "mode": "managed"}, "nodes": [], "providers": []},
        )
        self.assertEqual(
            run(["status"]).out.splitlines(),
            [
                "edge e (mode: managed)",
                "",
                "no nodes configured",
                "",
                "no providers configured",
                "",
                "no client models configured",
            ],
        )


class RunsCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.admin = FakeAdmin(self)

    def test_none(self) -> None:
        self.admin.answer(f"{ADMIN}/runs", {"runs": []})
        self.assertEqual(run(["runs"]).out, "no active runs\n")

    def test_table(self) -> None:
        runs = {
            "runs": [
                {
                    "run_id": "r-1",
                    "node_id": "node-a",
                    "adapter": "cli",
                    "target": "",
                    "request_id": "req_1",
                }
            ],
            "tunnels": [
                {
                    "run_id": "t-1",
                    "node_id": "node-a",
                    "adapter": "vllm",
                    "target": "m",
                    "operation": "chat",
                    "request_id": "",
                }
            ],
        }
        self.admin.answer(f"{ADMIN}/runs", runs)
        result = run(["runs"])
        self.assertEqual(
            result.out.splitlines(),
            [
                "KIND    RUN  NODE    ADAPTER  TARGET  REQUEST",
                "run     r-1  node-a  cli      -       req_1",
                "tunnel  t-1  node-a  vllm     m       -",
            ],
        )
        self.assertEqual(json.loads(run(["runs", "--json"]).out), runs)

    def test_only_tunnels(self) -> None:
        """An Edge answering tunnels only (every client request over a tunnel) lists them."""
        tunnels = {"run_id": "t-1", "node_id": "n", "adapter": "a", "target": "", "request_id": ""}
        self.admin.answer(f"{ADMIN}/runs", {"runs": [], "tunnels": [tunnels]})
        self.assertEqual(len(run(["runs"]).out.splitlines()), 2)


class NodeCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.admin = FakeAdmin(self)
        self.url = f"{ADMIN}/nodes/node-a/commands"

    def test_capabilities(self) -> None:
        self.admin.answer(self.url, {"adapters": ["a"]})
        result = run(["node", "command", "node-a", "capabilities"])
        self.assertEqual((result.code, json.loads(result.out)), (0, {"adapters": ["a"]}))
        self.assertEqual(self.admin.calls, [("POST", self.url, {"type": "capabilities"})])

    def test_options(self) -> None:
        self.admin.answer(self.url, [1, 2])
        result = run(
            [
                "node",
                "command",
                "node-a",
                "ollama-show",
                "--adapter",
                "ol",
                "--target",
                "llama",
                "--arg",
                "model=llama",
                "--arg",
                "verbose=",
            ]
        )
        self.assertEqual((result.code, json.loads(result.out)), (0, [1, 2]))
        self.assertEqual(
            self.admin.calls[0][2],
            {
                "type": "ollama-show",
                "adapter": "ol",
                "target": "llama",
                "arguments": {"model": "llama", "verbose": ""},
            },
        )

    def test_badArgument(self) -> None:
        result = run(["node", "command", "node-a", "usage", "--arg", "novalue"])
        self.assertEqual(result.code, 1)
        self.assertIn("expected KEY=VALUE", result.err)
        self.assertEqual(self.admin.calls, [])

    def test_unknownType(self) -> None:
        self.assertEqual(run(["node", "command", "node-a", "reboot"]).code, 2)

    def test_edgeRefuses(self) -> None:
        self.admin.answer(
            self.url, {"error": {"message": "node node-a is not connected", "code": 503}}, 503
        )
        result = run(["node", "command", "node-a", "capabilities"])
        self.assertEqual(result.code, 1)
        self.assertIn("answered HTTP 503: node node-a is not connected", result.err)

    def test_typesAgreeWithTheEdge(self) -> None:
        self.assertEqual(set(node_cli.COMMAND_TYPES), set(COMMAND_TYPES))

    def test_nodeIdQuoted(self) -> None:
        run(["node", "command", "a/b", "usage"])
        self.assertEqual(self.admin.calls[0][1], f"{ADMIN}/nodes/a%2Fb/commands")
