# -*- test-case-name: iop.test.edge.ingress.test_errors -*-
"""Error shapes and statuses on both surfaces, and the mapping of the Edge's errors."""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.errors import (
    CredentialRefused,
    LeaseRequired,
    Overloaded,
    QueueTimeout,
    TunnelFailed,
    Unavailable,
    UnknownModel,
)
from iop.edge.ingress.errors import ApiError, client_error, run_error, upstream_error
from iop.runtime.codes import ErrorCode
from iop.runtime.events import RuntimeEvent
from iop.test.edge.ingress.harness import (
    BODY_LIMIT,
    CHAT,
    END,
    MESSAGES,
    IngressCase,
    body,
    error,
    start,
)
from iop.test.edge.ingress.test_channel import ChannelCase, chat, post


class ErrorShapeTests(IngressCase):
    def test_bad_json_is_400(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", None, raw=b"{nope"), 400
        )
        self.assertEqual(error["type"], "invalid_request_error")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", None, raw=b"[1, 2]"), 400, "invalid_request_error"
        )

    def test_schema_errors_are_400(self) -> None:
        for bad in (
            {"messages": [{"role": "user", "content": "x"}]},
            {"model": "chat"},
            {"model": "chat", "messages": []},
            {"model": "chat", "messages": [{"content": "x"}]},
            {**CHAT, "stream": "yes"},
            {**CHAT, "max_tokens": 0},
            {**CHAT, "stream_options": 3},
            {**CHAT, "tools": {}},
        ):
            self.assertOpenAIError(self.edge.post("/v1/chat/completions", bad), 400)
        self.assertEqual(self.edge.sent, [])

    def test_unknown_model_is_404(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "nope"}), 404, "nope"
        )
        self.assertEqual(error["code"], "model_not_found")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**MESSAGES, "model": "nope"}), 404, "not_found_error"
        )
        self.assertOpenAIError(self.edge.get("/v1/models/nope"), 404)

    def test_unknown_path_and_method(self) -> None:
        self.assertOpenAIError(self.edge.get("/v1/embeddings"), 404, "/v1/embeddings")
        self.assertOpenAIError(self.edge.get("/v1/chat/completions"), 405)
        self.assertAnthropicError(
            self.edge.get("/v1/messages"), 405, "invalid_request_error", "GET /v1/messages"
        )

    def test_body_limit_is_413(self) -> None:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", big), 413)
        self.assertEqual(error["code"], "request_too_large")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", {**MESSAGES, "system": "x" * BODY_LIMIT}),
            413,
            "request_too_large",
        )
        self.assertEqual(self.edge.sent, [])

    def test_no_node_is_503(self) -> None:
        self.edge.registry.disconnected(self.edge.conn)
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT), 503)
        self.assertEqual(error["type"], "server_error")
        self.assertAnthropicError(self.edge.post("/v1/messages", MESSAGES), 503, "overloaded_error")
        # A direct route whose node is gone.
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", {**CHAT, "model": "cli"}), 503
        )

    def test_full_queue_is_429_with_retry_after(self) -> None:
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        queued = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        code, headers, data = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 429)
        self.assertEqual(headers.getRawHeaders("retry-after"), ["1"])
        self.assertEqual(json.loads(data)["error"]["type"], "rate_limit_error")
        code, headers, data = self.answer(
            self.edge.post("/v1/messages", {**MESSAGES, "model": "chat"})
        )
        self.assertEqual(code, 429)
        self.assertEqual(json.loads(data)["error"]["type"], "rate_limit_error")
        self.assertNoResult(queued)
        self.assertNoResult(first)

    def test_queue_timeout_is_503(self) -> None:
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        queued = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.clock.advance(31)
        error = self.assertOpenAIError(queued, 503, "timed out")
        self.assertEqual(error["code"], "queue_timeout")

    def test_upstream_error_passes_through(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        upstream = json.dumps({"error": {"message": "bad things", "type": "x", "code": "y"}})
        self.edge.frames(
            self.edge.tunnel_request().run_id, start(418), body(upstream.encode()), END
        )
        code, _, data = self.answer(d)
        self.assertEqual((code, data), (418, upstream.encode()))

    def test_tunnel_failing_before_start_is_502(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.frames(self.edge.tunnel_request().run_id, error("connection refused"))
        error_ = self.assertOpenAIError(d, 502, "connection refused")
        self.assertEqual(error_["code"], "upstream_error")
        self.assertEqual(self.edge.in_flight(), 0)

    def test_node_capacity_gate_full_is_503(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        self.edge.frames(
            self.edge.tunnel_request().run_id,
            error("adapter 'chat' is at capacity (1/1)", ErrorCode.PROVIDER_AT_CAPACITY),
        )
        self.assertAnthropicError(d, 503, "overloaded_error", "at capacity")
        self.assertEqual(self.edge.in_flight("p-bare"), 0)

    def test_capacity_is_the_code_not_the_wording(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        self.edge.frames(
            self.edge.tunnel_request().run_id, error("adapter 'chat' is at capacity (1/1)")
        )
        self.assertAnthropicError(d, 502, "api_error", "at capacity")


class MappingTests(SynchronousTestCase):
    def test_client_errors(self) -> None:
        cases: list[tuple[BaseException, int]] = [
            (UnknownModel("m"), 404),
            (Overloaded("m", 3), 429),
            (Unavailable("m"), 503),
            (QueueTimeout("m", 2.0), 503),
            (TunnelFailed("full", ErrorCode.PROVIDER_AT_CAPACITY), 503),
            (TunnelFailed("provider at capacity"), 502),
            (TunnelFailed("boom"), 502),
        ]
        for exc, status in cases:
            mapped = client_error(exc)
            assert mapped is not None
            self.assertEqual(mapped.status, status, exc)
        self.assertIsNone(client_error(ValueError("x")))

    def test_a_refused_lease_names_its_class(self) -> None:
        for code in (ErrorCode.LEASE_EXPIRED, ErrorCode.LEASE_REPLAYED):
            mapped = client_error(TunnelFailed(f"{code.value}: refused", code))
            assert mapped is not None
            self.assertEqual((mapped.status, mapped.code), (502, code.value))
        refused = client_error(CredentialRefused("credential slot 'x' is disabled"))
        assert refused is not None
        self.assertEqual((refused.status, refused.code), (503, "credential_unavailable"))

    def test_a_run_that_needs_a_lease(self) -> None:
        """Managed mode: refused on the Edge (a client error), or by the node (its class)."""
        required = client_error(LeaseRequired("managed mode: adapter 'a' needs a lease"))
        assert required is not None
        self.assertEqual((required.status, required.code), (400, "lease_required"))
        event = RuntimeEvent.failed(
            "lease_missing: this node runs in managed mode",
            metadata={"error_code": ErrorCode.LEASE_MISSING.value},
        )
        refused = run_error(event)
        self.assertEqual((refused.status, refused.code), (502, "lease_missing"))

    def test_error_bodies(self) -> None:
        e = ApiError(429, "slow down", code="overloaded", param="model")
        self.assertEqual(
            e.openai_body(),
            {
                "error": {
                    "message": "slow down",
                    "type": "rate_limit_error",
                    "param": "model",
                    "code": "overloaded",
                }
            },
        )
        self.assertEqual(
            e.anthropic_body(),
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        )
        self.assertEqual(
            ApiError(418, "x").anthropic_body()["error"]["type"], "invalid_request_error"
        )
        self.assertEqual(ApiError(599, "x").openai_body()["error"]["type"], "server_error")

    def test_upstream_error_message(self) -> None:
        self.assertEqual(upstream_error(400, b'{"error": {"message": "no"}}').message, "no")
        self.assertEqual(upstream_error(500, b'{"error": "flat"}').message, "flat")
        self.assertEqual(upstream_error(502, b"gateway down").message, "gateway down")
        self.assertIn("HTTP 500", upstream_error(500, b"").message)

    def test_messages_iop_writes_are_redacted(self) -> None:
        secret = "sk-0123456789abcdefghijk"
        echoed = f'{{"error": {{"message": "bad key Authorization: Bearer {secret}"}}}}'
        error_ = upstream_error(401, echoed.encode())
        self.assertEqual(error_.message, "bad key Authorization: Bearer [redacted]")
        self.assertNotIn(secret, error_.message)
        self.assertNotIn(secret, upstream_error(401, f"x-api-key: {secret}".encode()).message)
        failed = run_error(RuntimeEvent.failed(f"upstream HTTP 401: api_key={secret}"))
        self.assertEqual(failed.message, "upstream HTTP 401: api_key=[redacted]")
        mapped = client_error(TunnelFailed(f'upstream echoed {{"api_key": "{secret}"}}'))
        assert mapped is not None
        self.assertNotIn(secret, json.dumps(mapped.openai_body()))
        self.assertNotIn(secret, json.dumps(ApiError(400, secret).anthropic_body()))


class RedactedAnswerTests(IngressCase):
    def test_tunnel_failing_before_start_is_redacted(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.edge.frames(
            self.edge.tunnel_request().run_id, error("refused: Authorization: Bearer abcdefghijk")
        )
        error_ = self.assertOpenAIError(d, 502, "Bearer [redacted]")
        self.assertNotIn("abcdefghijk", error_["message"])

    def test_run_failing_mid_stream_is_redacted(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "llama", "stream": True})
        self.edge.flush()
        self.edge.events(
            self.edge.run_request().run_id,
            RuntimeEvent.start(),
            RuntimeEvent.text("h"),
            RuntimeEvent.failed("echo x-api-key: abcdefghijk"),
        )
        _, _, data = self.answer(d)
        self.assertIn(b"x-api-key: [redacted]", data)
        self.assertNotIn(b"abcdefghijk", data)


class RetryHintTests(IngressCase):
    """``x-should-retry: false`` on errors a retry cannot fix, ``retry-after`` on 429/503."""

    def hints(self, d: Any) -> tuple[int, list[str] | None, list[str] | None]:
        code, headers, _ = self.answer(d)
        return code, headers.getRawHeaders("x-should-retry"), headers.getRawHeaders("retry-after")

    def test_headers_of_api_errors(self) -> None:
        for status in (400, 401, 403, 404, 405, 413, 422, 431):
            self.assertIn(("x-should-retry", "false"), ApiError(status, "x").headers, status)
        for status in (408, 409, 429, 500, 502, 503, 504):
            self.assertNotIn(("x-should-retry", "false"), ApiError(status, "x").headers, status)
        for status in (429, 503, 529):
            self.assertIn(("retry-after", "1"), ApiError(status, "x").headers, status)
        given = ApiError(503, "x", headers=[("Retry-After", "7")]).headers
        self.assertEqual(given, (("Retry-After", "7"),))
        self.assertEqual(ApiError(502, "x").headers, ())

    def test_both_surfaces(self) -> None:
        surfaces: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", CHAT),
            ("/v1/messages", MESSAGES),
        ]
        for path, request in surfaces:
            # 401: a wrong key; 400: a bad field; 404: no such model.
            self.assertEqual(
                self.hints(self.edge.post(path, request, key="sk-wrong")), (401, ["false"], None)
            )
            self.assertEqual(
                self.hints(self.edge.post(path, {**request, "stream": "yes"})),
                (400, ["false"], None),
            )
            self.assertEqual(
                self.hints(self.edge.post(path, {**request, "model": "nope"})),
                (404, ["false"], None),
            )
        self.assertEqual(self.hints(self.edge.get("/v1/messages")), (405, ["false"], None))
        self.edge.registry.disconnected(self.edge.conn)
        for path, request in surfaces:
            self.assertEqual(self.hints(self.edge.post(path, request)), (503, None, ["1"]))

    def test_upstream_client_error_over_the_bridge(self) -> None:
        d = self.edge.post("/v1/messages", MESSAGES)
        self.edge.flush()
        upstream = b'{"error": {"message": "bad key upstream"}}'
        self.edge.frames(self.edge.tunnel_request().run_id, start(401), body(upstream), END)
        self.assertEqual(self.hints(d), (401, ["false"], None))


class ChannelRetryHintTests(ChannelCase):
    def test_refusals_before_the_app(self) -> None:
        connection = self.exchange(chat(b"Content-Length: %d\r\n" % (BODY_LIMIT + 1)))
        response = self.assertRefused(connection, 413)
        self.assertEqual(response.header("x-should-retry"), "false")
        connection = self.exchange(
            post(
                "/v1/messages",
                b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            )
        )
        response = self.assertRefused(connection, 400, surface="anthropic")
        self.assertEqual(response.header("x-should-retry"), "false")
