# -*- test-case-name: iop.test.edge.ingress.test_relay -*-
"""The relay: client disconnects (queued and running), the lease held to the end of the work."""

from __future__ import annotations

from iop.runtime.events import RuntimeEvent
from iop.test.edge.ingress.harness import CHAT, MESSAGES, IngressCase, body, error, sse, start


class DisconnectTests(IngressCase):
    def test_queued_request_is_withdrawn(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertEqual(self.edge.pool.counters("node-a", "p-chat")["queued"], 1)
        self.edge.disconnect()
        self.assertEqual(self.edge.pool.counters("node-a", "p-chat")["queued"], 0)
        self.assertEqual(len(self.edge.requests("provider_tunnel_request")), 1)
        # The queue has room again: a new request queues instead of a 429.
        third = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertNoResult(third)

    def test_running_tunnel_is_cancelled(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(200, "text/event-stream"), body(sse([{"choices": []}])))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.frames(run_id, error("cancelled"))
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(self.edge.finished[-1][2], "error")

    def test_running_run_is_cancelled(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.events(run_id, RuntimeEvent.start(), RuntimeEvent.text("he"))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.events(run_id, RuntimeEvent.cancelled("client disconnected"))
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.assertEqual(self.edge.finished[-1][2], "cancelled")

    def test_waiting_for_the_first_event_is_cancelled(self) -> None:
        self.edge.post("/v1/messages", {**MESSAGES, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.edge.clock.advance(60)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
