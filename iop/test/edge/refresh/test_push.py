# -*- test-case-name: iop.test.edge.refresh.test_push -*-
"""
The Edge's refresh push (L{iop.edge.refresh.push}): ready nodes only, one outcome per push (the
node's answer, timeout, failed on fence or send error), a bus event per outcome, and the
catch-up of a node that was pending during an apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import EdgeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.payload import build_node_payload
from iop.edge.refresh.push import NodePusher
from iop.edge.refresh.report import NodePush
from iop.edge.registry import NodeRegistry
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb


def with_concurrency(config: EdgeConfig, node_id: str, concurrency: int) -> EdgeConfig:
    nodes = tuple(
        dataclasses.replace(n, concurrency=concurrency) if n.id == node_id else n
        for n in config.nodes
    )
    return dataclasses.replace(config, nodes=nodes)


class PushTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.config = edge_config()
        self.revision = 1
        self.bus = EventBus(self.clock)
        self.events: list[Any] = []
        self.bus.subscribe(self.events.append)
        self.registry = NodeRegistry(self.config, self.registered, self.bus, self.clock)
        self.pusher = NodePusher(
            self.registry,
            self.payload_for,
            self.bus,
            self.clock,
            node_ids=lambda: [n.id for n in self.config.nodes],
            timeout=10,
        )
        self.addCleanup(self.no_timer_left)

    def no_timer_left(self) -> None:
        self.clock.advance(0)  # the bus's deliveries
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def payload(self, node_id: str) -> pb.NodeConfigPayload:
        node = next(n for n in self.config.nodes if n.id == node_id)
        payload = build_node_payload(self.config, node)
        payload.config_revision = self.revision
        return payload

    def payload_for(self, node_id: str) -> pb.NodeConfigPayload:
        return self.payload(node_id)

    def registered(self, node: Any) -> pb.NodeConfigPayload:
        return self.payload(node.id)

    def connect(self, node_id: str, ready: bool = True) -> FakeConnection:
        connection = FakeConnection()
        self.registry.register(TOKENS[node_id], connection)
        if ready:
            self.registry.ready(node_id, connection)
        return connection

    def apply(self, concurrency: int, node_id: str = "node-a") -> None:
        self.config = with_concurrency(self.config, node_id, concurrency)
        self.revision += 1

    def request(self, connection: FakeConnection) -> pb.NodeConfigRefreshRequest:
        envelope = connection.sent.pop()
        self.assertEqual(envelope.WhichOneof("message"), "node_config_refresh_request")
        return envelope.node_config_refresh_request

    def answer(
        self, connection: FakeConnection, request_id: str, outcome: int, reason: str = ""
    ) -> None:
        self.pusher.response_received(
            connection,
            pb.NodeConfigRefreshResponse(
                request_id=request_id,
                outcome=outcome,  # type: ignore[arg-type]
                reason=reason,
            ),
        )

    def refresh_events(self) -> list[NodeEvent]:
        self.clock.advance(0)
        return [
            e
            for e in self.events
            if isinstance(e, NodeEvent) and e.kind is NodeEventKind.CONFIG_REFRESHED
        ]

    def test_appliedAnswer(self) -> None:
        connection = self.connect("node-a")
        self.apply(4)
        d = self.pusher.push(["node-a"])
        request = self.request(connection)
        self.assertEqual(request.config.runtime.concurrency, 4)
        self.assertEqual(request.config.config_revision, 2)
        self.assertNoResult(d)
        self.answer(connection, request.request_id, pb.REFRESH_APPLIED)
        self.assertEqual(self.successResultOf(d), [NodePush("node-a", "applied")])
        [event] = self.refresh_events()
        self.assertEqual((event.node_id, event.outcome), ("node-a", "applied"))

    def test_restartRequiredAndFailedAnswers(self) -> None:
        a, b = self.connect("node-a"), self.connect("node-b")
        d = self.pusher.push(["node-a", "node-b"])
        ra, rb = self.request(a), self.request(b)
        self.answer(b, rb.request_id, pb.REFRESH_FAILED, "bad payload")
        self.assertNoResult(d)
        self.answer(a, ra.request_id, pb.REFRESH_RESTART_REQUIRED, "adapter settings changed")
        self.assertEqual(
            self.successResultOf(d),
            [
                NodePush("node-a", "restart_required", "adapter settings changed"),
                NodePush("node-b", "failed", "bad payload"),
            ],
        )
        self.assertEqual(
            [(e.node_id, e.outcome) for e in self.refresh_events()],
            [("node-b", "failed"), ("node-a", "restart_required")],
        )

    def test_unspecifiedOutcomeFails(self) -> None:
        connection = self.connect("node-a")
        d = self.pusher.push(["node-a"])
        self.answer(connection, self.request(connection).request_id, pb.REFRESH_OUTCOME_UNSPECIFIED)
        [push] = self.successResultOf(d)
        self.assertEqual(push.outcome, "failed")

    def test_timeout(self) -> None:
        connection = self.connect("node-a")
        d = self.pusher.push(["node-a"])
        request = self.request(connection)
        self.clock.advance(9.9)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        self.assertEqual(
            self.successResultOf(d), [NodePush("node-a", "timeout", "no answer within 10 s")]
        )
        # A late answer changes nothing.
        self.answer(connection, request.request_id, pb.REFRESH_APPLIED)
        self.assertEqual([e.outcome for e in self.refresh_events()], ["timeout"])

    def test_pendingAndDisconnectedNodesSkipped(self) -> None:
        pending = self.connect("node-a", ready=False)
        d = self.pusher.push(["node-a", "node-b"])
        self.assertEqual(self.successResultOf(d), [])
        self.assertEqual(pending.sent, [])

    def test_pendingNodeCaughtUpWhenReady(self) -> None:
        """A node that registered before an apply is pushed the new payload once ready."""
        pending = self.connect("node-a", ready=False)
        self.apply(3)
        self.assertEqual(self.successResultOf(self.pusher.push(["node-a"])), [])
        self.registry.ready("node-a", pending)
        request = self.request(pending)
        self.assertEqual(request.config.runtime.concurrency, 3)
        self.answer(pending, request.request_id, pb.REFRESH_APPLIED)
        self.assertEqual([e.outcome for e in self.refresh_events()], ["applied"])

    def test_readyWithoutRefreshNotPushed(self) -> None:
        connection = self.connect("node-a", ready=False)
        self.registry.ready("node-a", connection)
        self.assertEqual(connection.sent, [])

    def test_caughtUpOnce(self) -> None:
        pending = self.connect("node-a", ready=False)
        self.successResultOf(self.pusher.push([]))
        self.registry.ready("node-a", pending)
        self.answer(pending, self.request(pending).request_id, pb.REFRESH_APPLIED)
        self.registry.disconnected(pending)
        again = self.connect("node-a")
        self.assertEqual(again.sent, [])

    def test_fenceFailsAtOnce(self) -> None:
        connection = self.connect("node-a")
        d = self.pusher.push(["node-a"])
        request = self.request(connection)
        self.registry.disconnected(connection)
        [push] = self.successResultOf(d)
        self.assertEqual(push.outcome, "failed")
        self.assertIn("disconnected", push.reason)
        self.answer(connection, request.request_id, pb.REFRESH_APPLIED)
        self.assertEqual([e.outcome for e in self.refresh_events()], ["failed"])

    def test_answerFromOtherConnectionIgnored(self) -> None:
        connection = self.connect("node-a")
        d = self.pusher.push(["node-a"])
        request = self.request(connection)
        self.answer(FakeConnection(), request.request_id, pb.REFRESH_APPLIED)
        self.assertNoResult(d)
        self.clock.advance(10)
        self.assertEqual(self.successResultOf(d)[0].outcome, "timeout")

    def test_sendFailure(self) -> None:
        connection = self.connect("node-a")
        connection.fail = True
        [push] = self.successResultOf(self.pusher.push(["node-a"]))
        self.assertEqual(
            push, NodePush("node-a", "failed", "could not send the push: ConnectionError")
        )

    def test_payloadFailure(self) -> None:
        self.connect("node-a")

        def broken(node_id: str) -> pb.NodeConfigPayload:
            raise KeyError(node_id)

        self.pusher._payload_for = broken
        [push] = self.successResultOf(self.pusher.push(["node-a"]))
        self.assertEqual(push.outcome, "failed")
