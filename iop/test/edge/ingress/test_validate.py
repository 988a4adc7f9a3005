# -*- test-case-name: iop.test.edge.ingress.test_validate -*-
"""
Every route answers a malformed body with 400 in its own surface's shape before it spends a
lease, naming the field: JSON the Edge could not send on as JSON (deep nesting, lone surrogates,
non-finite numbers; :func:`~iop.edge.ingress.http.read_json`) and known fields of the wrong type
or out of bounds (:mod:`iop.edge.ingress.validate`). Bodies as the real clients send them, with
fields nobody here knows, are forwarded untouched.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.app import ClientApp
from iop.edge.ingress.validate import (
    MAX_TOKENS_LIMIT,
    check_anthropic_count_tokens,
    check_anthropic_messages,
    check_openai_chat,
    check_openai_responses,
)
from iop.test.edge.ingress.harness import IngressCase, Recording
from iop.test.edge.ingress.test_relay_properties import strict_loads

USER = [{"role": "user", "content": "hi"}]
# A valid body per route, to models that serve them over a tunnel (nothing answers: a request
# that passed validation just waits for its node).
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "chat", "messages": USER},
    "/v1/responses": {"model": "resp", "input": "hi"},
    "/v1/messages": {"model": "bare", "max_tokens": 10, "messages": USER},
    "/v1/messages/count_tokens": {"model": "native", "messages": USER},
}
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/responses")
PROVIDERS = ["p-chat", "p-native", "p-resp", "p-plain", "p-bare", "p-llama"]


class Case(IngressCase):
    """An ingress whose body limit lets 100,000 levels of nesting through to the decoder."""

    def setUp(self) -> None:
        super().setUp()
        edge = self.edge
        edge.config = replace(
            edge.config, client_api=replace(edge.config.client_api, max_body_bytes=1 << 20)
        )
        edge.app = ClientApp(edge.gateway, edge.config.client_api, edge.clock)
        edge.resource = Recording(edge.app.resource())
        edge.http = StubTreq(edge.resource)

    def refused(self, path: str, d: Deferred[Any], fragment: str = "") -> dict[str, Any]:
        code, answer = self.json_answer(d)
        self.assertEqual(code, 400, (path, answer))
        if path in OPENAI_ROUTES:
            self.assertEqual(set(answer), {"error", "request_id"})
            self.assertEqual(set(answer["error"]), {"message", "type", "param", "code"})
            self.assertEqual(answer["error"]["type"], "invalid_request_error")
        else:
            self.assertEqual(answer["type"], "error")
            self.assertEqual(set(answer["error"]), {"type", "message"})
            self.assertEqual(answer["error"]["type"], "invalid_request_error")
        self.assertIn(fragment, answer["error"]["message"])
        return answer["error"]  # type: ignore[no-any-return]

    def assertNothingSpent(self) -> None:
        self.assertEqual(self.edge.sent, [])
        for provider in PROVIDERS:
            counters = self.edge.pool.counters("node-a", provider)
            self.assertEqual(
                (counters["in_flight"], counters["long_in_flight"], counters["queued"]), (0, 0, 0)
            )
        self.assertEqual(self.edge.clock.getDelayedCalls(), [])

    def raw(self, path: str, data: bytes) -> Deferred[Any]:
        return self.edge.post(path, None, raw=data)


class UnsendableJSONTests(Case):
    """Item by item, on every route: JSON the Edge could not re-serialize is a 400."""

    def content_raw(self, path: str, literal: bytes) -> bytes:
        """The route's valid body with its content (``input`` on Responses) set to ``literal``."""
        request = json.loads(json.dumps(ROUTES[path]))
        if "messages" in request:
            request["messages"][0]["content"] = "@X@"
        else:
            request["input"] = "@X@"
        return json.dumps(request).encode().replace(b'"@X@"', literal)

    def test_deep_nesting(self) -> None:
        for path in ROUTES:
            for depth in (1000, 100_000):
                nested = b"[" * depth + b"]" * depth
                self.refused(path, self.raw(path, self.content_raw(path, nested)))
                objects = b'{"a":' * depth + b"1" + b"}" * depth
                self.refused(path, self.raw(path, self.content_raw(path, objects)))
        self.assertNothingSpent()

    def test_lone_surrogate_in_content_and_model(self) -> None:
        for path, request in ROUTES.items():
            for escape in (b'"\\ud800"', b'"a\\udfffb"'):
                self.refused(path, self.raw(path, self.content_raw(path, escape)), "surrogate")
                raw = json.dumps({**request, "model": "@X@"}).encode().replace(b'"@X@"', escape)
                self.refused(path, self.raw(path, raw), "surrogate")
        self.assertNothingSpent()

    def test_non_finite_numbers(self) -> None:
        for path, request in ROUTES.items():
            for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"):
                self.refused(path, self.raw(path, self.content_raw(path, literal)))
                raw = json.dumps({**request, "temperature": "@X@"}).encode()
                self.refused(path, self.raw(path, raw.replace(b'"@X@"', literal)))
        self.assertNothingSpent()

    def test_huge_integers_where_the_edge_reads_them(self) -> None:
        limits = {
            "/v1/chat/completions": ["max_tokens", "max_completion_tokens", "n", "seed"],
            "/v1/responses": ["max_output_tokens"],
            "/v1/messages": ["max_tokens", "top_k"],
        }
        for path, names in limits.items():
            for name in names:
                for value in (10**30, -(10**30)):
                    error = self.refused(path, self.edge.post(path, {**ROUTES[path], name: value}))
                    self.assertIn(name, error["message"])
        thinking = {"type": "enabled", "budget_tokens": 10**30}
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            error = self.refused(path, self.edge.post(path, {**ROUTES[path], "thinking": thinking}))
            self.assertIn("thinking.budget_tokens", error["message"])
        self.assertNothingSpent()


# (field, wrong value, the param named) per surface; every one refused with 400.
OPENAI_CHAT_BAD: list[tuple[str, Any, str]] = [
    ("messages", [], "messages"),
    ("messages", "hi", "messages"),
    ("messages", ["hi"], "messages[0]"),
    ("messages", [{"content": "hi"}], "messages[0].role"),
    ("messages", [{"role": 1, "content": "hi"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": 5}], "messages[0].content"),
    ("messages", [{"role": "user", "content": {"text": "x"}}], "messages[0].content"),
    ("messages", [{"role": "user", "content": ["x"]}], "messages[0].content[0]"),
    ("messages", [{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0].type"),
    ("messages", [{"role": "assistant", "tool_calls": {}}], "messages[0].tool_calls"),
    ("messages", [{"role": "assistant", "tool_calls": [1]}], "messages[0].tool_calls[0]"),
    ("tools", {"type": "function"}, "tools"),
    ("tools", ["f"], "tools[0]"),
    ("tool_choice", 3, "tool_choice"),
    ("tool_choice", ["auto"], "tool_choice"),
    ("n", 0, "n"),
    ("n", 1000, "n"),
    ("n", "2", "n"),
    ("n", 1.5, "n"),
    ("stop", 1, "stop"),
    ("stop", ["a", 1], "stop"),
    ("temperature", "hot", "temperature"),
    ("temperature", True, "temperature"),
    ("top_p", [], "top_p"),
    ("presence_penalty", {}, "presence_penalty"),
    ("frequency_penalty", "0", "frequency_penalty"),
    ("seed", 2**64, "seed"),
    ("seed", "1", "seed"),
    ("max_tokens", 10**30, "max_tokens"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 2.5, "max_tokens"),
    ("max_completion_tokens", 2**32, "max_completion_tokens"),
    ("stream", "yes", "stream"),
    ("stream_options", [], "stream_options"),
    ("stream_options", {"include_usage": "yes"}, "stream_options"),
    ("reasoning_effort", 1, "reasoning_effort"),
    ("response_format", "json", "response_format"),
    ("metadata", [], "metadata"),
    ("model", 7, "model"),
    ("model", "", "model"),
]
OPENAI_RESPONSES_BAD: list[tuple[str, Any, str]] = [
    ("input", 5, "input"),
    ("input", [1], "input[0]"),
    ("instructions", ["x"], "instructions"),
    ("max_output_tokens", 10**30, "max_output_tokens"),
    ("max_output_tokens", -1, "max_output_tokens"),
    ("tools", "web", "tools"),
    ("tool_choice", 1, "tool_choice"),
    ("temperature", "x", "temperature"),
    ("stream", 1, "stream"),
    ("metadata", "x", "metadata"),
]
ANTHROPIC_BAD: list[tuple[str, Any, str]] = [
    ("messages", [], "messages"),
    ("messages", [{"role": "user"}], "messages[0].content"),
    ("messages", [{"role": None, "content": "x"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": None}], "messages[0].content"),
    ("messages", [{"role": "user", "content": 5}], "messages[0].content"),
    ("messages", [{"role": "user", "content": [5]}], "messages[0].content[0]"),
    ("messages", [{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0].type"),
    ("system", 5, "system"),
    ("system", [{"text": "x"}], "system[0].type"),
    ("tools", {"name": "f"}, "tools"),
    ("tools", [[]], "tools[0]"),
    ("tool_choice", "auto", "tool_choice"),
    ("tool_choice", {"name": "f"}, "tool_choice.type"),
    ("thinking", "on", "thinking"),
    ("thinking", {"budget_tokens": 10}, "thinking.type"),
    ("thinking", {"type": "enabled", "budget_tokens": "10"}, "thinking.budget_tokens"),
    ("thinking", {"type": "enabled", "budget_tokens": 0}, "thinking.budget_tokens"),
    ("metadata", "x", "metadata"),
    ("stream", "true", "stream"),
    ("model", ["bare"], "model"),
]
MESSAGES_ONLY_BAD: list[tuple[str, Any, str]] = [
    ("max_tokens", 10**30, "max_tokens"),
    ("max_tokens", "10", "max_tokens"),
    ("temperature", "warm", "temperature"),
    ("top_p", False, "top_p"),
    ("top_k", 1.5, "top_k"),
    ("stop_sequences", "END", "stop_sequences"),
    ("stop_sequences", ["END", 2], "stop_sequences"),
]
BAD: dict[str, list[tuple[str, Any, str]]] = {
    "/v1/chat/completions": OPENAI_CHAT_BAD,
    "/v1/responses": OPENAI_RESPONSES_BAD,
    "/v1/messages": ANTHROPIC_BAD + MESSAGES_ONLY_BAD,
    "/v1/messages/count_tokens": ANTHROPIC_BAD,
}


class WrongFieldTests(Case):
    def test_every_wrong_field_is_refused_naming_it(self) -> None:
        for path, cases in BAD.items():
            for name, value, param in cases:
                d = self.edge.post(path, {**ROUTES[path], name: value})
                error = self.refused(path, d)
                if path in OPENAI_ROUTES:
                    self.assertIn(error["param"], (param, name), (path, name, value, error))
                self.assertIn(param.split("[")[0], error["message"], (path, name, value))
        self.assertNothingSpent()

    def test_run_models_are_checked_the_same(self) -> None:
        for path, model in (("/v1/chat/completions", "llama"), ("/v1/messages", "cli")):
            for name, value, _ in BAD[path]:
                if name == "model":
                    continue
                self.refused(
                    path, self.edge.post(path, {**ROUTES[path], "model": model, name: value})
                )
        self.assertNothingSpent()


# Bodies as the official SDKs, Codex and Claude Code send them (more fields than the Edge knows).
CODEX_CHAT: dict[str, Any] = {
    "model": "chat",
    "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "stream": True,
    "stream_options": {"include_usage": True},
    "store": False,
    "prompt_cache_key": "abc",
    "temperature": 0,
    "top_p": 1.0,
    "stop": ["\n\n"],
    "n": 1,
    "seed": -5,
    "logit_bias": {"50256": -100},
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "metadata": {"k": "v"},
    "user": "u",
    "x_vendor_extension": {"anything": [1, 2.5, None]},
}
CODEX_RESPONSES: dict[str, Any] = {
    "model": "resp",
    "instructions": "be brief",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ],
    "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}],
    "tool_choice": "auto",
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k",
    "max_output_tokens": 1000,
}
CLAUDE_CODE_MESSAGES: dict[str, Any] = {
    "model": "bare",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "You are Claude Code", "cache_control": {"type": "ephemeral"}}
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "x"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "data"}],
        },
    ],
    "tools": [
        {"name": "Read", "description": "read", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "metadata": {"user_id": "user_abc"},
    "temperature": 1,
    "top_k": 40,
    "stop_sequences": ["</done>"],
    "stream": True,
    "context_management": {"edits": []},
}


class RealClientTests(Case):
    def test_real_client_bodies_are_forwarded_untouched(self) -> None:
        cases = [
            ("/v1/chat/completions", CODEX_CHAT),
            ("/v1/responses", CODEX_RESPONSES),
            ("/v1/messages/count_tokens", {**CLAUDE_CODE_MESSAGES, "model": "native"}),
            ("/v1/messages", {**CLAUDE_CODE_MESSAGES, "model": "native"}),
        ]
        for path, request in cases:
            self.setUp()  # a fresh Edge: a provider serves one request at a time
            d = self.edge.post(path, request)
            self.edge.flush()
            self.assertNoResult(d)
            sent = strict_loads(self.edge.tunnel_request().body)
            expected = dict(request)
            expected.pop("model")
            del sent["model"]
            if path == "/v1/chat/completions":
                sent.pop("max_tokens", None)  # the model's default_max_tokens policy
            self.assertEqual(sent, expected, path)

    def test_claude_code_over_the_bridge(self) -> None:
        # (A server tool cannot be bridged to Chat Completions: the bridge refuses it.)
        tools = CLAUDE_CODE_MESSAGES["tools"][:1]
        self.edge.post("/v1/messages", {**CLAUDE_CODE_MESSAGES, "tools": tools})
        self.edge.flush()
        sent = strict_loads(self.edge.tunnel_request().body)
        self.assertEqual(sent["model"], "bare-target")


class FunctionTests(SynchronousTestCase):
    def test_valid_bodies_pass(self) -> None:
        check_openai_chat(CODEX_CHAT)
        check_openai_responses(CODEX_RESPONSES)
        check_anthropic_messages(CLAUDE_CODE_MESSAGES)
        check_anthropic_count_tokens(CLAUDE_CODE_MESSAGES)
        check_openai_chat({**CODEX_CHAT, "max_tokens": MAX_TOKENS_LIMIT, "stop": "x"})
        check_openai_chat({**CODEX_CHAT, "temperature": None, "tools": None, "n": None})
        check_anthropic_messages({**CLAUDE_CODE_MESSAGES, "system": "plain"})
