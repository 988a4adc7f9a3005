# -*- test-case-name: iop.test.edge.ingress.test_app -*-
"""The client app: the catalog, the usage event, the client listener, the config in step."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import yaml
from klein.resource import KleinResource
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from iop.config import parse_edge_config
from iop.config.model import (
    EdgeConfig,
)
from iop.edge import tap as edge_tap
from iop.edge.events import RequestFinished
from iop.edge.ingress.errors import ApiError
from iop.edge.tap import EdgeService
from iop.test.edge.ingress.harness import BASE, CHAT, KEY, MESSAGES, IngressCase, ingress_config


class CatalogTests(IngressCase):
    def test_openai_list(self) -> None:
        code, listing = self.json_answer(self.edge.get("/v1/models"))
        self.assertEqual(code, 200)
        self.assertEqual(listing["object"], "list")
        self.assertEqual(
            [m["id"] for m in listing["data"]],
            ["chat", "native", "resp", "plain", "bare", "llama", "counted", "cli"],
        )
        self.assertEqual(set(listing["data"][0]), {"id", "object", "created", "owned_by"})
        code, one = self.json_answer(self.edge.get("/v1/models/cli"))
        self.assertEqual((code, one["id"], one["object"]), (200, "cli", "model"))

    def test_anthropic_list(self) -> None:
        code, listing = self.json_answer(
            self.edge.get("/v1/models", anthropic_version="2023-06-01")
        )
        self.assertEqual(code, 200)
        self.assertEqual(listing["has_more"], False)
        self.assertEqual((listing["first_id"], listing["last_id"]), ("chat", "cli"))
        native = next(m for m in listing["data"] if m["id"] == "native")
        self.assertEqual(native["type"], "model")
        self.assertEqual(native["display_name"], "Native Claude")
        code, one = self.json_answer(
            self.edge.get("/v1/models/native", anthropic_version="2023-06-01")
        )
        self.assertEqual((code, one["display_name"]), (200, "Native Claude"))


class RoutingTests(IngressCase):
    def test_unknown_route_is_404_in_the_surface_shape(self) -> None:
        self.assertOpenAIError(self.edge.get("/v1/nope"), 404, "no route for GET /v1/nope")

    def test_a_path_the_router_would_redirect_is_404_not_a_redirect(self) -> None:
        # ``%2F`` decodes to ``//``: the router's answer is a redirect to the merged path, which
        # an API does not give (a client would retry elsewhere, or fail on a Location-less 308).
        self.assertOpenAIError(self.edge.get("/v1/models/%2F0"), 404, "no route for GET")


class DirectRouteTests(IngressCase):
    """The generation routes are served by exact path, without the router; the rest is not."""

    def routed(self) -> list[bytes]:
        seen: list[bytes] = []
        original = KleinResource.render

        def render(resource: KleinResource, request: Any) -> Any:
            seen.append(request.path)
            return original(resource, request)

        self.patch(KleinResource, "render", render)
        return seen

    def test_a_generation_post_skips_the_router(self) -> None:
        routed = self.routed()
        for path in ("/v1/chat/completions", "/v1/messages/count_tokens"):
            body = {**CHAT, "max_tokens": 5} if "messages" in path else {**CHAT, "model": "nope"}
            self.edge.post(path, body)
        self.assertEqual(routed, [])

    def test_everything_else_is_routed_as_before(self) -> None:
        routed = self.routed()
        self.assertOpenAIError(
            self.edge.post("/v1/chat/completions/", CHAT), 404, "no route for POST"
        )
        self.json_answer(self.edge.get("/v1/models"))
        self.assertEqual(routed, [b"/v1/chat/completions/", b"/v1/models"])
        d = self.edge.get("/v1/chat/completions")
        self.assertOpenAIError(d, 405, "no route for GET /v1/chat/completions")

    def test_an_unexpected_failure_is_a_500_in_the_surface_shape(self) -> None:
        def broken(body: Any) -> Any:
            raise RuntimeError("a bug")

        self.patch(self.edge.app.chat, "decode", broken)
        self.assertOpenAIError(self.edge.post("/v1/chat/completions", CHAT), 500, "internal error")
        self.flushLoggedErrors(RuntimeError)


class RequestEventTests(SynchronousTestCase):
    def test_the_edge_publishes_each_finished_request(self) -> None:
        reactor = MemoryReactorClock()
        edge = EdgeService(ingress_config(), reactor)
        seen: list[Any] = []
        edge.bus.subscribe(seen.append)
        http: Any = StubTreq(edge.clients.resource())
        headers = {"authorization": f"Bearer {KEY}"}
        response = self.successResultOf(http.get(BASE + "/v1/models", headers=headers))
        self.successResultOf(response.content())
        response = self.successResultOf(http.get(BASE + "/v1/models"))
        self.successResultOf(response.content())
        reactor.advance(0)
        listed, refused = seen
        self.assertIsInstance(listed, RequestFinished)
        self.assertEqual(
            (listed.surface, listed.operation, listed.status, listed.outcome),
            ("openai", "models", 200, "complete"),
        )
        self.assertEqual((refused.status, refused.outcome), (401, "refused"))

    def test_client_listener_only_when_configured(self) -> None:
        options = edge_tap.Options()
        options.edge_config = ingress_config()
        service = edge_tap.makeService(options, reactor=MemoryReactorClock())
        self.assertNotIn("clients", [s.name for s in service])  # type: ignore[attr-defined]
        listening = ingress_config()
        options.edge_config = dataclasses.replace(
            listening,
            client_api=dataclasses.replace(
                listening.client_api, listen="tcp:0:interface=127.0.0.1"
            ),
        )
        service = edge_tap.makeService(options, reactor=MemoryReactorClock())
        self.assertIn("clients", [s.name for s in service])  # type: ignore[attr-defined]


ETC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "etc", "iop")
README = os.path.join(ETC, "..", "..", "README.md")


class ConfigInStepTests(SynchronousTestCase):
    """The demo config, the example config and the README agree on the client API."""

    def load(self, name: str, **environ: str) -> EdgeConfig:
        path = os.path.join(ETC, name)
        if not os.path.exists(path):
            raise SkipTest(f"{path} is not in this tree")
        with open(path) as f:
            data = yaml.safe_load(f)
        # TLS material is made at run time; the listeners are loopback, so plaintext loads.
        data["node_transport"] = {"plaintext": True}
        data["listen"]["nodes"] = "tcp:7443:interface=127.0.0.1"
        for node in data["nodes"]:
            if "token_file" in node:  # a secret file that only exists where it is deployed
                del node["token_file"]
                node["token_sha256"] = "0" * 64
        return parse_edge_config(data, base_dir=os.path.dirname(path), environ=environ)

    def test_demo_client_api(self) -> None:
        config = self.load(
            os.path.join("demo", "edge.yaml"), IOP_DEMO_NODE_TOKEN="t", IOP_DEMO_NODE_B_TOKEN="u"
        )
        api = config.client_api
        self.assertEqual(api.listen, "tcp:8080:interface=127.0.0.1")
        self.assertTrue(api.auth)
        key = api.key_for("sk-iop-demo")
        assert key is not None
        self.assertEqual((key.name, key.models), ("demo", ()))
        self.assertIsNone(api.key_for("sk-iop-demo "))
        ids = [m.id for m in config.models] + [r.model for r in config.model_routes]
        self.assertEqual(
            ids,
            [
                "demo-pool",
                "demo-llama",
                "demo-claude",
                "demo-responses",
                "demo-openai",
                "demo-ollama",
                "demo-cli",
            ],
        )
        pool = config.models[0]
        self.assertEqual(pool.token_counter, "approximate")
        chat = next(p for p in config.nodes[0].providers if p.id == "demo-a-chat")
        profiles = {p.name: p for p in config.protocol_profiles}
        self.assertEqual(
            {name: p.driver for name, p in profiles.items()},
            {
                "openai-chat": "openai_chat",
                "anthropic-native": "anthropic_messages",
                "openai-responses": "openai_responses",
            },
        )
        profile = profiles["openai-chat"]
        self.assertEqual((chat.profile, profile.driver), ("openai-chat", "openai_chat"))
        self.assertEqual(profile.operations, (("chat_completions", "/chat/completions"),))
        self.assertEqual(set(profile.capabilities), {"chat", "streaming", "tools"})

    def test_readme_examples_use_the_demo(self) -> None:
        if not os.path.exists(README):
            raise SkipTest("README.md is not in this tree")
        with open(README) as f:
            text = f.read()
        config = self.load(
            os.path.join("demo", "edge.yaml"), IOP_DEMO_NODE_TOKEN="t", IOP_DEMO_NODE_B_TOKEN="u"
        )
        ids = {m.id for m in config.models} | {r.model for r in config.model_routes}
        used = set(re.findall(r'"(demo-[a-z]+)"', text))
        self.assertTrue(used)
        self.assertLessEqual(used, ids)
        self.assertIn("sk-iop-demo", text)
        self.assertIn("127.0.0.1:8080", text)

    def test_example_documents_the_keys(self) -> None:
        config = self.load(
            "edge.yaml",
            IOP_NODE_GPU_A_TOKEN="a",
            IOP_VLLM_API_KEY="b",
            IOP_AGENT_API_KEY="c",
            IOP_UPSTREAM_KEY="d",
        )
        api = config.client_api
        self.assertEqual(api.listen, "tcp:8080:interface=0.0.0.0")
        self.assertEqual(api.max_body_bytes, 10 * 1024 * 1024)
        team_a = api.key_for("example-client-key-team-a")
        assert team_a is not None
        self.assertEqual(team_a.models, ("qwen-coder", "local-llama"))
        ops = api.key_for("example-client-key-ops")
        assert ops is not None and ops.allows("anything")


class PipelineTests(IngressCase):
    """Every route runs the pipeline's stages: authenticate once, admit in one place."""

    GENERATION = (
        ("/v1/chat/completions", CHAT),
        ("/v1/responses", {"model": "chat", "input": "hi"}),
        ("/v1/messages", {**MESSAGES, "model": "chat"}),
        ("/v1/messages/count_tokens", {**MESSAGES, "model": "counted"}),
    )

    def test_authenticate_runs_once_per_request(self) -> None:
        calls: list[Any] = []
        original = self.edge.app.pipeline.authenticate

        def counting(request: Any) -> Any:
            calls.append(request)
            return original(request)

        self.patch(self.edge.app.pipeline, "authenticate", counting)
        for path, body in self.GENERATION:
            self.edge.post(path, body)
        self.json_answer(self.edge.get("/v1/models"))
        self.json_answer(self.edge.get("/v1/models/chat"))
        self.assertEqual(len(calls), len(self.GENERATION) + 2)
        self.assertEqual(len({id(r) for r in calls}), len(calls))

    def test_a_per_key_rule_in_admit_holds_on_every_route(self) -> None:
        admitted: list[tuple[str, str]] = []

        def admit(principal: Any, model: str) -> None:
            admitted.append((principal.name, model))
            raise ApiError(429, "over this key's budget", code="key_budget")

        self.patch(self.edge.app.pipeline, "admit", admit)
        for path, body in self.GENERATION:
            self.assertEqual(self.json_answer(self.edge.post(path, body))[0], 429)
        self.assertEqual(self.json_answer(self.edge.get("/v1/models/chat"))[0], 429)
        models = ["chat", "chat", "chat", "counted", "chat"]
        self.assertEqual(admitted, [("all", m) for m in models])
        # Nothing was placed: admit runs before the pool is asked.
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])
        self.assertEqual(self.edge.in_flight(), 0)

    def test_one_route_table_for_the_router_and_the_fast_path(self) -> None:
        routes = {(r.method, r.path): (r.surface, r.operation) for r in self.edge.app.routes}
        rules = {
            (method, rule.rule)
            for rule in self.edge.app.app.url_map.iter_rules()
            for method in rule.methods or ()
            if method not in ("HEAD", "OPTIONS")
        }
        self.assertEqual(set(routes), rules)
        self.assertEqual(
            sorted(self.edge.app._direct),
            sorted(p.encode() for m, p in routes if m == "POST"),
        )
