"""Node commands: capabilities, transport/usage status, sessions, Ollama queries."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.commands import NodeCommandHandler, session_transport_status
from iop.node.runs import RunManager
from iop.node.session import NodeSession
from iop.runtime import RuntimeEvent
from iop.test.node.test_runs import (
    FakeOllama,
    ScriptedProvider,
    SessionProvider,
    open_store,
    registry_of,
    run_request,
)
from iop.wire import runtime_pb2 as pb


class CommandTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.gpu = ScriptedProvider("gpu", "vllm", max_concurrency=3)
        self.agent = SessionProvider("agent", "cli", max_concurrency=1)
        self.local = FakeOllama("local", "ollama", max_concurrency=1)
        self.old = ScriptedProvider("old", "openai_compat")
        self.build(self.gpu, self.agent, self.local, self.old, disabled=["old"])

    def build(self, *providers: ScriptedProvider, disabled: list[str] | None = None) -> None:
        self.sent: list[pb.Envelope] = []
        self.store = open_store(self, self.clock)
        self.registry = registry_of(*providers, disabled=disabled or [])
        self.runs = RunManager(self.registry, self.sent.append, self.store, self.clock)
        self.handler = NodeCommandHandler(
            self.registry,
            self.runs,
            self.sent.append,
            self.clock,
            lambda: {"node_id": "node-1", "state": "ready"},
        )

    def command(self, type: int, **kwargs: Any) -> pb.NodeCommandResponse:
        before = len(self.sent)
        self.handler.command_received(
            pb.Envelope(
                node_command_request=pb.NodeCommandRequest(request_id="c1", type=type, **kwargs)  # type: ignore[arg-type]
            )
        )
        [response] = self.sent[before:]
        self.assertEqual(response.WhichOneof("message"), "node_command_response")
        self.assertEqual(
            (response.node_command_response.request_id, response.node_command_response.type),
            ("c1", type),
        )
        return response.node_command_response

    def result(self, type: int, **kwargs: Any) -> Any:
        response = self.command(type, **kwargs)
        self.assertEqual((response.ok, response.error), (True, ""))
        return json.loads(response.result_json)

    def refused(self, type: int, **kwargs: Any) -> str:
        response = self.command(type, **kwargs)
        self.assertFalse(response.ok)
        self.assertEqual(response.result_json, "")
        return response.error


class CapabilitiesTests(CommandTestCase):
    def test_capabilities(self) -> None:
        result = self.result(pb.NODE_COMMAND_CAPABILITIES)
        self.assertEqual(
            result,
            {
                "adapters": [
                    {
                        "name": "gpu",
                        "type": "vllm",
                        "enabled": True,
                        "sessions": False,
                        "ollama": False,
                        "capabilities": {
                            "max_concurrency": 3,
                            "streaming": True,
                            "tools": False,
                            "reasoning": False,
                            "sessions": False,
                        },
                    },
                    {
                        "name": "agent",
                        "type": "cli",
                        "enabled": True,
                        "sessions": True,
                        "ollama": False,
                        "capabilities": {
                            "max_concurrency": 1,
                            "streaming": True,
                            "tools": False,
                            "reasoning": False,
                            "sessions": False,
                        },
                    },
                    {
                        "name": "local",
                        "type": "ollama",
                        "enabled": True,
                        "sessions": False,
                        "ollama": True,
                        "capabilities": {
                            "max_concurrency": 1,
                            "streaming": True,
                            "tools": False,
                            "reasoning": False,
                            "sessions": False,
                        },
                    },
                    {
                        "name": "old",
                        "type": "openai_compat",
                        "enabled": False,
                        "sessions": False,
                        "ollama": False,
                        "capabilities": None,
                    },
                ]
            },
        )
        text = self.command(pb.NODE_COMMAND_CAPABILITIES).result_json
        self.assertNotIn("upstream-secret", text)
        self.assertNotIn("10.0.0.5", text)


class StatusTests(CommandTestCase):
    def test_transportStatus(self) -> None:
        self.assertEqual(
            self.result(pb.NODE_COMMAND_TRANSPORT_STATUS), {"node_id": "node-1", "state": "ready"}
        )

    def test_sessionTransportStatus(self) -> None:
        config = pb.NodeConfigPayload(node_id="node-1", alias="lab", config_revision=4)
        session = NodeSession(
            "node-1",
            config,
            self.registry,
            self.sent.append,
            self.clock,
            heartbeat_interval=2.0,
            heartbeat_timeout=5.0,
        )
        status = session_transport_status(session, self.clock, lambda: {"tls": True})
        self.assertEqual(status()["connected_since_unix_ms"], None)
        session.ready_at = 1000.0
        self.clock.advance(30)
        self.assertEqual(
            dict(status()),
            {
                "node_id": "node-1",
                "alias": "lab",
                "config_revision": 4,
                "state": "ready",
                "connected_since_unix_ms": 1_000_000,
                "connected_for_sec": 30.0,
                "heartbeat_interval_sec": 2.0,
                "heartbeat_timeout_sec": 5.0,
                "tls": True,
            },
        )
        session.connection_lost(None)  # type: ignore[arg-type]
        self.assertEqual(status()["state"], "closed")

    def test_usageStatus(self) -> None:
        self.runs.submit(run_request("a", adapter="gpu"))
        self.runs.submit(run_request("b", adapter="gpu"))
        self.runs.submit(run_request("c", adapter="agent"))
        self.gpu.executions[0].emit(RuntimeEvent.complete())
        self.runs.submit(run_request("d", adapter="nope"))
        self.sent.clear()
        result = self.result(pb.NODE_COMMAND_USAGE_STATUS)
        self.assertEqual(
            result["adapters"],
            [
                {
                    "name": "gpu",
                    "type": "vllm",
                    "enabled": True,
                    "in_use": 1,
                    "limit": 3,
                    "active_runs": 1,
                },
                {
                    "name": "agent",
                    "type": "cli",
                    "enabled": True,
                    "in_use": 1,
                    "limit": 1,
                    "active_runs": 1,
                },
                {
                    "name": "local",
                    "type": "ollama",
                    "enabled": True,
                    "in_use": 0,
                    "limit": 1,
                    "active_runs": 0,
                },
                {
                    "name": "old",
                    "type": "openai_compat",
                    "enabled": False,
                    "in_use": 0,
                    "limit": 2,
                    "active_runs": 0,
                },
            ],
        )
        self.assertEqual(result["runs"]["active_runs"], 2)
        self.assertEqual([r["run_id"] for r in result["active_runs"]], ["b", "c"])
        self.assertEqual(
            (result["runs"]["completed"], result["runs"]["error"], result["runs"]["rejected"]),
            (1, 1, 1),
        )
        self.runs.connection_lost()

    def test_unknownType(self) -> None:
        self.assertEqual(self.refused(99), "unknown node command type 99")
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_UNSPECIFIED),
            "unknown node command type NODE_COMMAND_UNSPECIFIED",
        )

    def test_commandsNeverTouchTheGates(self) -> None:
        for command in (
            pb.NODE_COMMAND_CAPABILITIES,
            pb.NODE_COMMAND_USAGE_STATUS,
            pb.NODE_COMMAND_SESSION_LIST,
            pb.NODE_COMMAND_OLLAMA_TAGS,
        ):
            self.command(command)
        self.assertEqual([i.gate.in_use for i in self.registry], [0, 0, 0, 0])
        self.assertEqual(self.gpu.executions + self.local.executions, [])


class SessionListTests(CommandTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.agent.sessions[("repo-a", "s1")] = True
        self.agent.sessions[("repo-b", "s2")] = False
        self.other = SessionProvider("agent2", "cli")
        self.other.sessions[("repo-a", "s3")] = False
        self.build(self.gpu, self.agent, self.other)

    def test_allAdapters(self) -> None:
        self.assertEqual(
            self.result(pb.NODE_COMMAND_SESSION_LIST),
            {
                "sessions": [
                    {"adapter": "agent", "session_id": "s1", "target": "repo-a", "active": True},
                    {"adapter": "agent", "session_id": "s2", "target": "repo-b", "active": False},
                    {"adapter": "agent2", "session_id": "s3", "target": "repo-a", "active": False},
                ]
            },
        )

    def test_filteredByAdapterAndTarget(self) -> None:
        self.assertEqual(
            [
                s["session_id"]
                for s in self.result(pb.NODE_COMMAND_SESSION_LIST, adapter="agent")["sessions"]
            ],
            ["s1", "s2"],
        )
        self.assertEqual(
            [
                s["session_id"]
                for s in self.result(pb.NODE_COMMAND_SESSION_LIST, target="repo-a")["sessions"]
            ],
            ["s1", "s3"],
        )

    def test_adapterWithoutSessions(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_SESSION_LIST, adapter="gpu"),
            "adapter 'gpu' does not support sessions",
        )

    def test_unknownAdapter(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_SESSION_LIST, adapter="x"), "unknown adapter 'x'"
        )

    def test_noSessionAdapters(self) -> None:
        self.build(self.gpu)
        self.assertEqual(self.result(pb.NODE_COMMAND_SESSION_LIST), {"sessions": []})


class OllamaTests(CommandTestCase):
    def test_tagsFromTheOnlyOllama(self) -> None:
        self.assertEqual(
            self.result(pb.NODE_COMMAND_OLLAMA_TAGS),
            {"adapter": "local", "result": {"models": [{"name": "llama3:8b"}]}},
        )
        self.assertEqual(self.local.queries, [("tags", "")])

    def test_psNamed(self) -> None:
        self.assertEqual(
            self.result(pb.NODE_COMMAND_OLLAMA_PS, adapter="local"),
            {"adapter": "local", "result": {"models": []}},
        )

    def test_legacyTypeName(self) -> None:
        self.assertEqual(
            self.result(pb.NODE_COMMAND_OLLAMA_PS, adapter="ollama")["adapter"], "local"
        )

    def test_show(self) -> None:
        result = self.result(pb.NODE_COMMAND_OLLAMA_SHOW, arguments={"model": "llama3:8b"})
        self.assertEqual(result["result"]["model"], "llama3:8b")
        self.assertEqual(self.local.queries, [("show", "llama3:8b")])

    def test_showTargetFallback(self) -> None:
        self.result(pb.NODE_COMMAND_OLLAMA_SHOW, target="qwen3:4b")
        self.assertEqual(self.local.queries, [("show", "qwen3:4b")])

    def test_showNeedsAModel(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_SHOW), "ollama show needs arguments.model"
        )
        self.assertEqual(self.local.queries, [])

    def test_showFailure(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_SHOW, arguments={"model": "missing"}),
            "ollama: model 'missing' not found",
        )

    def test_notOllama(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_TAGS, adapter="gpu"),
            "adapter 'gpu' (vllm) does not answer Ollama queries",
        )

    def test_disabled(self) -> None:
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_TAGS, adapter="old"), "adapter 'old' is disabled"
        )

    def test_noOllama(self) -> None:
        self.build(self.gpu)
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_TAGS), "no ollama adapter on this node"
        )

    def test_severalOllamas(self) -> None:
        self.build(self.local, FakeOllama("spare"))
        self.assertEqual(
            self.refused(pb.NODE_COMMAND_OLLAMA_PS),
            "several ollama adapters ('local', 'spare'); name one in 'adapter'",
        )
        self.assertEqual(
            self.result(pb.NODE_COMMAND_OLLAMA_PS, adapter="spare")["adapter"], "spare"
        )

    def test_timeout(self) -> None:
        self.local.pending = Deferred()
        d = self.handler.handle(
            pb.NodeCommandRequest(request_id="c1", type=pb.NODE_COMMAND_OLLAMA_PS)
        )
        self.assertNoResult(d)
        self.clock.advance(30)
        response = self.successResultOf(d)
        self.assertEqual((response.ok, response.error), (False, "timed out after 30 s"))
        self.assertEqual(self.clock.getDelayedCalls(), [])
