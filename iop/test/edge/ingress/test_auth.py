# -*- test-case-name: iop.test.edge.ingress.test_auth -*-
"""Authentication and authorization on both surfaces (either key header, 401/403)."""

from __future__ import annotations

from iop.test.edge.ingress.harness import (
    CHAT,
    END,
    KEY,
    LIMITED_KEY,
    MESSAGES,
    IngressCase,
    body,
    start,
)


class AuthTests(IngressCase):
    def test_missing_key_is_401_on_both_surfaces(self) -> None:
        error = self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT, key=None), 401)
        self.assertEqual(error["code"], "missing_api_key")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, key=None), 401, "authentication_error"
        )
        self.assertEqual(self.edge.sent, [])

    def test_wrong_key_is_401(self) -> None:
        error = self.assertOpenAIError(
            self.edge.post("/v1/chat/completions", CHAT, key="sk-nope"), 401
        )
        self.assertEqual(
            (error["type"], error["code"]), ("invalid_request_error", "invalid_api_key")
        )
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, headers={"x-api-key": "sk-nope"}, key=None),
            401,
            "authentication_error",
        )
        self.assertOpenAIError(self.edge.get("/v1/models", key="sk-nope"), 401)

    def test_either_header_on_either_surface(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, key=None, headers={"x-api-key": KEY})
        self.edge.flush()
        self.assertEqual(len(self.edge.requests("provider_tunnel_request")), 1)
        run_id = self.edge.tunnel_request().run_id
        self.edge.frames(run_id, start(), body(b"{}"), END)
        self.assertEqual(self.answer(d)[0], 200)
        d = self.edge.post("/v1/messages/count_tokens", {**MESSAGES, "model": "counted"})
        self.assertEqual(self.json_answer(d)[0], 200)

    def test_restricted_key_is_403_for_other_models_even_unknown_ones(self) -> None:
        for name in ("llama", "does-not-exist"):
            error = self.assertOpenAIError(
                self.edge.post("/v1/chat/completions", {**CHAT, "model": name}, key=LIMITED_KEY),
                403,
                name,
            )
            self.assertEqual(error["code"], "model_not_allowed")
        self.assertAnthropicError(
            self.edge.post("/v1/messages", MESSAGES, key=LIMITED_KEY), 403, "permission_error"
        )
        self.assertEqual(self.edge.sent, [])

    def test_restricted_key_sees_only_its_models(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models", key=LIMITED_KEY))
        self.assertEqual(code, 200)
        self.assertEqual([m["id"] for m in listing["data"]], ["chat"])
        self.assertOpenAIError(self.edge.get("/v1/models/llama", key=LIMITED_KEY), 403)

    def test_auth_order_before_body(self) -> None:
        d = self.edge.post("/v1/chat/completions", None, key=None, raw=b"{not json")
        self.assertOpenAIError(d, 401)


class AuthOffTests(IngressCase):
    auth = False

    def test_no_key_needed(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models", key=None))
        self.assertEqual(code, 200)
        self.assertIn("llama", [m["id"] for m in listing["data"]])
