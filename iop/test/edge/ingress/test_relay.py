# -*- test-case-name: iop.test.edge.ingress.test_relay -*-
"""The relay: client disconnects (queued and running), the lease held to the end of the work."""

from __future__ import annotations

import json
from typing import Any

from twisted.web.client import ResponseFailed

from iop.edge.errors import NodeUnavailable
from iop.edge.ingress.messages_encode import RunEventsToMessages
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
        self.assertEqual(self.edge.finished[-1][2], "cancelled")

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


class LeaseTests(IngressCase):
    """The placement is released once, by its one owner, when the work on the node has ended."""

    def test_held_while_the_run_runs(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.events(run_id, RuntimeEvent.start(), RuntimeEvent.text("he"))
        self.assertEqual(self.edge.in_flight("p-llama"), 1)
        self.edge.events(run_id, RuntimeEvent.complete())
        self.assertEqual(self.answer(d)[0], 200)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_client_gone_mid_run_holds_it_until_the_node_ends_the_run(self) -> None:
        self.edge.post("/v1/messages", {**MESSAGES, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id
        self.edge.events(run_id, RuntimeEvent.start())
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        # The node still runs it: its slot is still taken.
        self.assertEqual(self.edge.in_flight("p-llama"), 1)
        self.edge.events(run_id, RuntimeEvent.cancelled("client disconnected"))
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_client_gone_mid_tunnel_holds_it_until_the_tunnel_ends(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(200, "text/event-stream"))
        self.assertEqual(self.successResultOf(d).code, 200)
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [run_id])
        self.assertEqual(self.edge.in_flight(), 1)
        # The node never confirms: the cancel grace ends the tunnel, and the lease with it.
        self.edge.clock.advance(60)
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(self.edge.tunnels.active(), [])

    def test_refused_after_placement(self) -> None:
        # 'n' > 1 is refused once the run provider is chosen.
        error_ = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "n": 2}), 400
        )
        self.assertEqual(error_["code"], "unsupported")
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_submit_failure(self) -> None:
        def refuse(**options: Any) -> None:
            raise NodeUnavailable("node 'node-a' is not connected")

        self.patch(self.edge.runs, "submit_run", refuse)
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama"}), 503
        )
        self.assertEqual(self.edge.in_flight("p-llama"), 0)

    def test_whatever_a_handler_raises(self) -> None:
        def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a bug")

        self.patch(self.edge.tunnels, "open", broken)
        self.patch(self.edge.runs, "submit_run", broken)
        for path, request in (
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "model": "llama"}),
            ("/v1/messages", MESSAGES),
            ("/v1/messages", {**MESSAGES, "model": "llama"}),
        ):
            code, _ = self.json_answer(self.edge.post(path, request))
            self.assertEqual(code, 500)
        self.assertEqual(self.edge.in_flight(), 0)
        self.assertEqual(self.edge.in_flight("p-bare"), 0)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.flushLoggedErrors(RuntimeError)

    def test_converter_failure_on_a_run_cancels_it(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "model": "llama", "stream": True})
        self.edge.flush()
        run_id = self.edge.run_request().run_id

        def broken(self: Any, event: Any) -> Any:
            raise RuntimeError("a bug")

        self.patch(RunEventsToMessages, "feed", broken)
        self.edge.events(run_id, RuntimeEvent.start())
        self.assertEqual(self.edge.cancels(), [run_id])
        self.assertEqual(self.edge.in_flight("p-llama"), 1)
        self.edge.events(run_id, RuntimeEvent.cancelled("the answer could not be relayed"))
        # The stream had started: the client sees it cut, not a clean end.
        response = self.successResultOf(d)
        self.edge.flush()
        self.failureResultOf(response.content(), ResponseFailed)
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.flushLoggedErrors(RuntimeError)


class MalformedRequestTests(IngressCase):
    """A body the Edge cannot send on is 400 in the surface's shape, and leaks nothing."""

    LONE = b'"a\\ud800b"'

    def raw(self, request: dict[str, Any], field: str) -> bytes:
        return json.dumps({**request, field: "X"}).encode().replace(b'"X"', self.LONE)

    def test_lone_surrogate_on_messages_and_count_tokens(self) -> None:
        for model in ("bare", "native", "llama", "chat"):
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                raw = self.raw({**MESSAGES, "model": model}, "system")
                error_ = self.assertAnthropicError(
                    self.edge.post(path, None, raw=raw), 400, "invalid_request_error"
                )
                self.assertIn("surrogate", error_["message"])
        for provider in ("p-bare", "p-native", "p-llama", "p-chat"):
            self.assertEqual(self.edge.in_flight(provider), 0, provider)
        self.assertEqual(self.edge.sent, [])

    def test_lone_surrogate_on_openai(self) -> None:
        for request in (CHAT, {**CHAT, "model": "llama"}, {"model": "resp", "input": "x"}):
            for path in ("/v1/chat/completions", "/v1/responses"):
                error_ = self.assertOpenAIError(
                    self.edge.post(path, None, raw=self.raw(request, "user")), 400, "surrogate"
                )
                self.assertEqual(error_["code"], "invalid_json")
        self.assertEqual(self.edge.sent, [])

    def test_numbers_and_nesting(self) -> None:
        for value in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"[" * 1000 + b"]" * 1000):
            raw = json.dumps({**MESSAGES, "metadata": "X"}).encode().replace(b'"X"', value)
            self.assertAnthropicError(
                self.edge.post("/v1/messages", None, raw=raw), 400, "invalid_request_error"
            )
            raw = json.dumps({**CHAT, "temperature": "X"}).encode().replace(b'"X"', value)
            self.assertOpenAIError(self.edge.post("/v1/chat/completions", None, raw=raw), 400)
        self.assertEqual(self.edge.sent, [])

    def test_run_options_out_of_range(self) -> None:
        for thinking in (-1, 2**32):
            request = {
                **MESSAGES,
                "model": "llama",
                "thinking": {"type": "enabled", "budget_tokens": thinking},
            }
            self.assertAnthropicError(
                self.edge.post("/v1/messages", request), 400, "invalid_request_error"
            )
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "max_tokens": 2**40}),
            400,
            "range",
        )
        self.assertEqual(self.edge.in_flight("p-llama"), 0)
        self.assertEqual(self.edge.runs.active(), [])
