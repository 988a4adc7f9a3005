"""Node commands and session termination from the Edge, without sockets."""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.commands import NodeCommander
from iop.edge.errors import CommandFailed, NodeUnavailable, NoRoute
from iop.edge.events import EventBus
from iop.edge.payload import build_node_payload
from iop.edge.registry import NodeRegistry
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb


class CommanderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        config = edge_config()
        self.registry = NodeRegistry(
            config, lambda n: build_node_payload(config, n), EventBus(self.clock), self.clock
        )
        self.sent: list[tuple[object, pb.Envelope]] = []
        self.commander = NodeCommander(
            self.registry, self.clock, lambda c, e: self.sent.append((c, e)), timeout=30
        )
        self.conn = FakeConnection()
        self.registry.register(TOKENS["node-a"], self.conn)
        self.registry.ready("node-a", self.conn)

    def test_command_round_trip(self) -> None:
        d = self.commander.command("node-a", "capabilities")
        [(conn, envelope)] = self.sent
        request = envelope.node_command_request
        self.assertIs(conn, self.conn)
        self.assertEqual(request.type, pb.NODE_COMMAND_CAPABILITIES)
        self.assertNoResult(d)
        self.commander.command_response(
            self.conn,
            pb.NodeCommandResponse(
                request_id=request.request_id, ok=True, result_json='{"adapters": []}'
            ),
        )
        self.assertEqual(self.successResultOf(d), {"adapters": []})

    def test_not_ok_fails(self) -> None:
        d = self.commander.command("node-a", "ollama-tags")
        rid = self.sent[0][1].node_command_request.request_id
        self.commander.command_response(
            self.conn, pb.NodeCommandResponse(request_id=rid, ok=False, error="no ollama adapter")
        )
        self.assertIn("no ollama", str(self.failureResultOf(d, CommandFailed).value))

    def test_response_from_other_connection_ignored(self) -> None:
        d = self.commander.command("node-a", "usage")
        rid = self.sent[0][1].node_command_request.request_id
        self.commander.command_response(
            FakeConnection(), pb.NodeCommandResponse(request_id=rid, ok=True)
        )
        self.assertNoResult(d)
        self.clock.advance(30)
        self.failureResultOf(d, defer.TimeoutError)

    def test_fence_fails_pending_at_once(self) -> None:
        d = self.commander.command("node-a", "transport")
        self.registry.disconnected(self.conn)
        self.failureResultOf(d, CommandFailed)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_unknown_command_and_node(self) -> None:
        self.assertRaises(NoRoute, self.commander.command, "node-a", "reboot")
        self.assertRaises(NodeUnavailable, self.commander.command, "node-b", "usage")

    def test_terminate_session(self) -> None:
        d = self.commander.terminate_session("node-a", "agent", "m", "sess-1")
        request = self.sent[0][1].cancel_request
        self.assertEqual(
            (request.kind, request.adapter, request.session_id),
            (pb.TERMINATE_SESSION, "agent", "sess-1"),
        )
        self.commander.cancel_response(
            self.conn, pb.CancelResponse(kind=pb.TERMINATE_SESSION, session_id="sess-1", ok=True)
        )
        self.assertTrue(self.successResultOf(d).ok)
