# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
Tests for :mod:`iop.config.edge`: edge.yaml loading, defaults, normalization and validation.

The validation table at the bottom holds one row per rule: a mutation of a known-good config
and the issue (path + message fragment) it must produce.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import yaml
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, load_edge_config, parse_edge_config
from iop.config.edge import is_loopback_host, split_endpoint
from iop.config.errors import ConfigIssue, read_yaml_file
from iop.config.model import EdgeConfig, NodeToken

TOKEN_A = "token-for-node-a"
TOKEN_B = "token-for-node-b"
UPSTREAM_KEY = "upstream-key-value"

ENVIRON = {
    "TOKEN_A": TOKEN_A,
    "UPSTREAM_KEY": UPSTREAM_KEY,
    "EMPTY": "",
    "MULTILINE": "a\r\nX-Injected: 1",
}

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "etc", "iop")


def base_config() -> dict[str, Any]:
    """A valid config touching most features; rows mutate a fresh copy."""
    return {
        "edge": {"id": "edge-1"},
        "listen": {"nodes": "tcp:7443:interface=0.0.0.0"},
        "node_transport": {
            "tls": {"cert_file": "pki/edge.crt", "key_file": "pki/edge.key"},
        },
        "protocol_profiles": [
            {
                "name": "openai-chat",
                "driver": "openai_chat",
                "operations": {"chat_completions": "/chat/completions"},
                "capabilities": ["chat", "streaming"],
                "extensions": {"thinking": True},
                "auth_header": "Authorization",
            }
        ],
        "nodes": [
            {
                "id": "node-a",
                "token": "${TOKEN_A}",
                "adapters": [
                    {
                        "name": "fake-openai",
                        "type": "openai_compat",
                        "base_url": "http://127.0.0.1:9001/v1",
                        "headers": {"Authorization": "Bearer ${UPSTREAM_KEY}"},
                    },
                    {"name": "coder", "type": "cli", "command": "agent"},
                ],
                "providers": [
                    {
                        "id": "a-chat",
                        "adapter": "fake-openai",
                        "category": "api",
                        "models": ["m1"],
                        "profile": "openai-chat",
                    },
                    {"id": "a-cli", "adapter": "coder", "category": "cli", "models": ["coder"]},
                ],
            },
            {
                "id": "node-b",
                "token_file": "secrets/b.token",
                "adapters": {"ollama": {"base_url": "http://127.0.0.1:11434"}},
                "providers": [
                    {
                        "id": "b-chat",
                        "adapter": "ollama",
                        "category": "local_inference",
                        "models": ["m1", "m2"],
                    }
                ],
            },
        ],
        "models": [
            {"id": "m1", "providers": ["a-chat", "b-chat"]},
            {"id": "pool", "providers": ["a-chat", {"id": "b-chat", "target": "m2"}]},
        ],
    }


# ---------------------------------------------------------------------------------------------
# Mutations: dotted paths with numeric list indexes, e.g. "nodes.0.providers.0.priority".

Mutation = Callable[[dict[str, Any]], None]


def _parent(data: Any, dotted: str) -> tuple[Any, Any]:
    keys: list[Any] = [int(k) if k.isdigit() else k for k in dotted.split(".")]
    for key in keys[:-1]:
        data = data[key]
    return data, keys[-1]


def put(dotted: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        parent, key = _parent(data, dotted)
        parent[key] = copy.deepcopy(value)

    return mutate


def drop(dotted: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        parent, key = _parent(data, dotted)
        del parent[key]

    return mutate


def append(dotted: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        parent, key = _parent(data, dotted)
        parent[key].append(copy.deepcopy(value))

    return mutate


def chain(*mutations: Mutation) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        for m in mutations:
            m(data)

    return mutate


def assertIssue(
    case: SynchronousTestCase, error: ConfigError, path: str, fragment: str
) -> ConfigIssue:
    """Fail unless ``error`` holds an issue at exactly ``path`` whose message has ``fragment``."""
    for issue in error.issues:
        if issue.path == path and fragment in issue.message:
            return issue
    case.fail(f"no issue at {path!r} containing {fragment!r}; got:\n{error}")


class EdgeConfigTestMixin:
    """Files a config may reference: TLS material and a token file, in a temporary dir."""

    base: str

    def make_base(self, case: SynchronousTestCase) -> None:
        self.base = os.path.abspath(case.mktemp())
        os.makedirs(os.path.join(self.base, "pki"))
        os.makedirs(os.path.join(self.base, "secrets"))
        for name in ("edge.crt", "edge.key", "ca.crt"):
            self.write(os.path.join("pki", name), "PEM\n")
        self.write(os.path.join("secrets", "b.token"), f"  {TOKEN_B}\n\n")

    def write(self, relative: str, text: str) -> str:
        path = os.path.join(self.base, relative)
        with open(path, "w") as f:
            f.write(text)
        return path

    def parse(self, data: object, environ: Mapping[str, str] = ENVIRON) -> EdgeConfig:
        return parse_edge_config(data, base_dir=self.base, environ=environ)


class HappyPathTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_full(self) -> None:
        config = self.parse(base_config())
        self.assertEqual(config.id, "edge-1")
        self.assertEqual(config.node_listen, "tcp:7443:interface=0.0.0.0")
        self.assertEqual(config.admin_listen, "tcp:8081:interface=127.0.0.1")
        self.assertFalse(config.plaintext_nodes)
        assert config.tls is not None
        self.assertEqual(config.tls.cert_file, os.path.join(self.base, "pki", "edge.crt"))
        self.assertEqual(config.tls.key_file, os.path.join(self.base, "pki", "edge.key"))
        self.assertIsNone(config.tls.client_ca_file)
        self.assertEqual(config.heartbeat.interval_sec, 2.0)
        self.assertEqual(config.heartbeat.timeout_sec, 5.0)
        self.assertEqual(config.max_frame_bytes, 16 * 1024 * 1024)
        self.assertEqual(config.register_timeout_sec, 10.0)
        self.assertEqual(config.source_path, "")

        (profile,) = config.protocol_profiles
        self.assertEqual(profile.name, "openai-chat")
        self.assertEqual(profile.driver, "openai_chat")
        self.assertEqual(profile.operations, (("chat_completions", "/chat/completions"),))
        self.assertEqual(profile.capabilities, ("chat", "streaming"))
        self.assertEqual(dict(profile.extensions), {"thinking": True, "reasoning": False})
        self.assertEqual(profile.auth_header, "Authorization")

        node_a, node_b = config.nodes
        self.assertEqual(node_a.id, "node-a")
        self.assertTrue(node_a.token.matches(TOKEN_A))
        self.assertFalse(node_a.token.matches(TOKEN_B))
        self.assertTrue(node_b.token.matches(TOKEN_B))  # token file, whitespace stripped
        self.assertEqual([a.name for a in node_a.adapters], ["fake-openai", "coder"])
        fake = node_a.adapters[0]
        self.assertEqual(fake.headers, (("Authorization", f"Bearer {UPSTREAM_KEY}"),))
        # Left out: the node's gate follows the adapter's providers (see iop.edge.payload).
        self.assertIsNone(fake.max_concurrency)
        self.assertTrue(fake.enabled)

        chat, cli = node_a.providers
        self.assertEqual(
            (chat.id, chat.adapter, chat.adapter_instance, chat.type, chat.category),
            ("a-chat", "fake-openai", "fake-openai", "openai_compat", "api"),
        )
        self.assertEqual(chat.models, ("m1",))
        self.assertEqual(chat.profile, "openai-chat")
        self.assertEqual((chat.priority, chat.capacity, chat.max_queue), (0, 1, 0))
        self.assertTrue(chat.enabled)
        self.assertEqual((cli.adapter_instance, cli.type), ("coder", "cli"))

        self.assertEqual(
            [(m.id, [(r.provider_id, r.target) for r in m.providers]) for m in config.models],
            [
                ("m1", [("a-chat", "m1"), ("b-chat", "m1")]),
                ("pool", [("a-chat", "m1"), ("b-chat", "m2")]),
            ],
        )
        self.assertIs(config.node("node-b"), node_b)

    def test_minimal(self) -> None:
        """Only the required keys: defaults fill in the rest."""
        config = self.parse(
            {
                "listen": {"nodes": "tcp:7443:interface=127.0.0.1"},
                "node_transport": {"plaintext": True},
                "nodes": [{"id": "n", "token": "${TOKEN_A}"}],
            }
        )
        self.assertEqual(config.id, "edge")
        self.assertIsNone(config.tls)
        self.assertTrue(config.plaintext_nodes)
        self.assertEqual(config.nodes[0].adapters, ())
        self.assertEqual(config.nodes[0].providers, ())
        self.assertEqual(config.models, ())
        self.assertEqual(config.protocol_profiles, ())

    def test_everyOptionalField(self) -> None:
        data = base_config()
        data["listen"]["admin"] = "tcp:9090:interface=127.0.0.1"
        transport = data["node_transport"]
        transport["tls"]["client_ca_file"] = "pki/ca.crt"
        transport.update(
            {
                "plaintext": False,
                "heartbeat": {"interval_sec": 1.5, "timeout_sec": 4},
                "max_frame_bytes": 1024,
                "register_timeout_sec": 2.5,
            }
        )
        node = data["nodes"][0]
        node.update({"alias": "A", "agent_kind": "gpu", "concurrency": 3})
        node["adapters"][1].update(
            {
                "enabled": True,
                "request_timeout_ms": 1000,
                "idle_timeout_ms": 2000,
                "max_concurrency": 4,
                "args": ["--port", 8080, True],
                "env": {"KEY": "${UPSTREAM_KEY}", "PLAIN": "a$${literal}"},
                "workspace": "/srv/work",
                "mode": "plan",
                "resume_args": ["--resume"],
                "output_format": "stream-json",
                "prompt_placement": "stdin",
                "context_size": 8192,
                "settings": {"num_ctx": 4096, "name": "x"},
            }
        )
        node["providers"][0].update(
            {
                "type": "openai_compat",
                "enabled": True,
                "priority": 2,
                "capacity": 4,
                "long_context_threshold": 1000,
                "long_capacity": 4,
                "max_queue": 8,
                "queue_timeout_sec": 2.5,
                "usage_attribution": "team",
            }
        )
        data["models"][0].update(
            {
                "display_name": "Model One",
                "default_max_tokens": 1024,
                "min_max_tokens": 1024,
                "default_thinking_token_budget": 0,
            }
        )
        config = self.parse(data)
        self.assertEqual(config.admin_listen, "tcp:9090:interface=127.0.0.1")
        assert config.tls is not None
        self.assertEqual(config.tls.client_ca_file, os.path.join(self.base, "pki", "ca.crt"))
        self.assertEqual((config.heartbeat.interval_sec, config.heartbeat.timeout_sec), (1.5, 4))
        self.assertEqual((config.max_frame_bytes, config.register_timeout_sec), (1024, 2.5))
        node_a = config.nodes[0]
        self.assertEqual((node_a.alias, node_a.agent_kind, node_a.concurrency), ("A", "gpu", 3))
        coder = node_a.adapters[1]
        self.assertEqual(coder.args, ("--port", "8080", "true"))
        self.assertEqual(coder.env, (("KEY", UPSTREAM_KEY), ("PLAIN", "a${literal}")))
        self.assertEqual(coder.settings, (("num_ctx", "4096"), ("name", "x")))
        self.assertEqual(
            (coder.request_timeout_ms, coder.idle_timeout_ms, coder.max_concurrency),
            (1000, 2000, 4),
        )
        self.assertEqual(
            (coder.workspace, coder.mode, coder.resume_args, coder.output_format),
            ("/srv/work", "plan", ("--resume",), "stream-json"),
        )
        self.assertEqual((coder.prompt_placement, coder.context_size), ("stdin", 8192))
        chat = node_a.providers[0]
        self.assertEqual(
            (
                chat.priority,
                chat.capacity,
                chat.long_context_threshold,
                chat.long_capacity,
                chat.max_queue,
                chat.queue_timeout_sec,
                chat.usage_attribution,
            ),
            (2, 4, 1000, 4, 8, 2.5, "team"),
        )
        model = config.models[0]
        self.assertEqual(
            (
                model.display_name,
                model.default_max_tokens,
                model.min_max_tokens,
                model.default_thinking_token_budget,
            ),
            ("Model One", 1024, 1024, 0),
        )

    def test_nullMeansAbsent(self) -> None:
        """An explicit YAML null (``key:`` with nothing after it) reads as the default."""
        data = base_config()
        data["protocol_profiles"] = None
        data["nodes"][0]["providers"][0]["profile"] = None
        data["nodes"][0]["providers"][0]["priority"] = None
        data["models"] = None
        config = self.parse(data)
        self.assertEqual(config.protocol_profiles, ())
        self.assertEqual(config.models, ())
        self.assertEqual(config.nodes[0].providers[0].priority, 0)

    def test_tokenSha256(self) -> None:
        data = base_config()
        del data["nodes"][0]["token"]
        digest = hashlib.sha256(TOKEN_A.encode()).hexdigest().upper()
        data["nodes"][0]["token_sha256"] = digest
        config = self.parse(data)
        self.assertTrue(config.nodes[0].token.matches(TOKEN_A))
        self.assertEqual(config.nodes[0].token, NodeToken.from_plaintext(TOKEN_A))

    def test_headerReferencesResolvedInline(self) -> None:
        data = base_config()
        data["nodes"][0]["adapters"][0]["headers"] = {
            "Authorization": "Bearer ${UPSTREAM_KEY}",
            "X-Pair": "${TOKEN_A}:${UPSTREAM_KEY}",
            "X-Cost": "$$5 and $x",
            "X-Empty": "${EMPTY}",
        }
        headers = dict(self.parse(data).nodes[0].adapters[0].headers)
        self.assertEqual(
            headers,
            {
                "Authorization": f"Bearer {UPSTREAM_KEY}",
                "X-Pair": f"{TOKEN_A}:{UPSTREAM_KEY}",
                "X-Cost": "$5 and $x",
                "X-Empty": "",
            },
        )

    def test_plaintextLoopback(self) -> None:
        """plaintext is accepted on every loopback spelling."""
        for interface in ("127.0.0.1", "127.1.2.3", "\\:\\:1", "localhost", "LOCALHOST"):
            data = base_config()
            data["listen"]["nodes"] = f"tcp:7443:interface={interface}"
            data["node_transport"] = {"plaintext": True}
            config = self.parse(data)
            self.assertTrue(config.plaintext_nodes, interface)
            self.assertIsNone(config.tls)

    def test_positionalInterface(self) -> None:
        """``tcp:PORT:INTERFACE`` (Twisted's positional form) also counts as loopback."""
        data = base_config()
        data["listen"]["nodes"] = "tcp:7443:127.0.0.1"
        data["node_transport"] = {"plaintext": True}
        self.assertTrue(self.parse(data).plaintext_nodes)


class LegacyAdapterTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_mappingNormalized(self) -> None:
        """``adapters: {type: settings}`` becomes a list of instances named after their type."""
        data = base_config()
        data["nodes"][1]["adapters"] = {
            "ollama": {"base_url": "http://127.0.0.1:11434", "max_concurrency": 2},
            "vllm": {"base_url": "http://127.0.0.1:8000/v1", "enabled": False},
            "cli": None,
        }
        node = self.parse(data).nodes[1]
        self.assertEqual(
            [(a.name, a.type, a.enabled) for a in node.adapters],
            [("ollama", "ollama", True), ("vllm", "vllm", False), ("cli", "cli", True)],
        )
        self.assertEqual(node.adapters[0].max_concurrency, 2)
        self.assertEqual(node.adapters[0].base_url, "http://127.0.0.1:11434")
        provider = node.providers[0]
        self.assertEqual((provider.adapter_instance, provider.type), ("ollama", "ollama"))

    def test_listWithoutName(self) -> None:
        """A list entry without a name is named after its type."""
        data = base_config()
        data["nodes"][1]["adapters"] = [{"type": "ollama"}]
        node = self.parse(data).nodes[1]
        self.assertEqual([(a.name, a.type) for a in node.adapters], [("ollama", "ollama")])
        self.assertEqual(node.providers[0].adapter_instance, "ollama")


class AdapterResolutionTests(EdgeConfigTestMixin, SynchronousTestCase):
    """``providers[].adapter``: exact instance name first, then a legacy type name."""

    def setUp(self) -> None:
        self.make_base(self)

    def resolve(self, adapters: list[Any], ref: str, **provider: Any) -> tuple[str, str]:
        data = base_config()
        data["nodes"][1]["adapters"] = adapters
        data["nodes"][1]["providers"][0].update(adapter=ref, **provider)
        resolved = self.parse(data).nodes[1].providers[0]
        return resolved.adapter_instance, resolved.type

    def failure(self, adapters: list[Any], ref: str) -> ConfigError:
        data = base_config()
        data["nodes"][1]["adapters"] = adapters
        data["nodes"][1]["providers"][0]["adapter"] = ref
        error = self.assertRaises(ConfigError, self.parse, data)
        assert isinstance(error, ConfigError)
        return error

    def test_exactName(self) -> None:
        adapters = [
            {"name": "big", "type": "openai_compat"},
            {"name": "small", "type": "openai_compat"},
        ]
        self.assertEqual(self.resolve(adapters, "small"), ("small", "openai_compat"))

    def test_exactNameWinsOverTypeName(self) -> None:
        """An instance literally named like a type is matched by name, whatever its type."""
        adapters = [
            {"name": "vllm", "type": "openai_compat"},
            {"name": "real-vllm", "type": "vllm"},
        ]
        self.assertEqual(self.resolve(adapters, "vllm"), ("vllm", "openai_compat"))

    def test_legacyTypeNameSingleEnabled(self) -> None:
        """A type name resolves when exactly one enabled instance has that type."""
        adapters = [
            {"name": "off", "type": "ollama", "enabled": False},
            {"name": "on", "type": "ollama"},
            {"name": "other", "type": "vllm"},
        ]
        self.assertEqual(self.resolve(adapters, "ollama"), ("on", "ollama"))

    def test_legacyTypeNameAmbiguous(self) -> None:
        adapters = [
            {"name": "one", "type": "ollama"},
            {"name": "two", "type": "ollama"},
        ]
        issue = assertIssue(
            self,
            self.failure(adapters, "ollama"),
            "nodes[1].providers[0].adapter",
            "ambiguous: 2 enabled instances of type 'ollama'; name one of: one, two",
        )
        self.assertNotIn("\n", issue.message)

    def test_legacyTypeNameNoneEnabled(self) -> None:
        adapters = [{"name": "off", "type": "ollama", "enabled": False}]
        assertIssue(
            self,
            self.failure(adapters, "ollama"),
            "nodes[1].providers[0].adapter",
            "no enabled adapter instance of type 'ollama'",
        )

    def test_exactNameDisabled(self) -> None:
        """Naming a disabled instance is an error, never a silent redirect to another one."""
        adapters = [
            {"name": "ollama", "type": "ollama", "enabled": False},
            {"name": "ollama-2", "type": "ollama"},
        ]
        assertIssue(
            self,
            self.failure(adapters, "ollama"),
            "nodes[1].providers[0].adapter",
            "no enabled adapter instance 'ollama' on node 'node-b': it is disabled",
        )

    def test_unknownName(self) -> None:
        assertIssue(
            self,
            self.failure([{"name": "x", "type": "ollama"}], "nope"),
            "nodes[1].providers[0].adapter",
            "no enabled adapter instance 'nope' on node 'node-b' (configured instances: x)",
        )

    def test_otherNodesAdapterNotVisible(self) -> None:
        """A reference only sees the adapters of its own node."""
        data = base_config()
        data["nodes"][1]["providers"][0]["adapter"] = "fake-openai"
        assertIssue(
            self,
            self.assertRaises(ConfigError, self.parse, data),
            "nodes[1].providers[0].adapter",
            "no enabled adapter instance 'fake-openai'",
        )

    def test_brokenAdapterNoCascade(self) -> None:
        """An adapter entry with its own issue does not also fail the providers naming it."""
        data = base_config()
        data["nodes"][1]["adapters"] = [{"name": "x", "type": "olama"}]
        data["nodes"][1]["providers"][0]["adapter"] = "x"
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual([i.path for i in error.issues], ["nodes[1].adapters[0].type"])


class DisabledProviderTests(EdgeConfigTestMixin, SynchronousTestCase):
    """A disabled provider skips the adapter-reference check but not structural checks."""

    def setUp(self) -> None:
        self.make_base(self)

    def disabled(self, **fields: Any) -> dict[str, Any]:
        data = base_config()
        data["nodes"][1]["providers"][0].update(enabled=False, **fields)
        return data

    def test_unresolvableAdapterSkipped(self) -> None:
        provider = self.parse(self.disabled(adapter="gone")).nodes[1].providers[0]
        self.assertFalse(provider.enabled)
        self.assertEqual(
            (provider.adapter, provider.adapter_instance, provider.type), ("gone", "", "")
        )

    def test_explicitTypeKept(self) -> None:
        provider = self.parse(self.disabled(adapter="gone", type="vllm")).nodes[1].providers[0]
        self.assertEqual((provider.adapter_instance, provider.type), ("", "vllm"))

    def test_typeInferredWhenPossible(self) -> None:
        provider = self.parse(self.disabled()).nodes[1].providers[0]
        self.assertEqual((provider.adapter_instance, provider.type), ("", "ollama"))

    def test_ambiguousSkipped(self) -> None:
        data = self.disabled()
        data["nodes"][1]["adapters"] = [
            {"name": "a", "type": "ollama"},
            {"name": "b", "type": "ollama"},
        ]
        provider = self.parse(data).nodes[1].providers[0]
        self.assertEqual((provider.adapter_instance, provider.type), ("", "ollama"))

    def test_badPriorityStillFails(self) -> None:
        error = self.assertRaises(
            ConfigError, self.parse, self.disabled(adapter="gone", priority=-1)
        )
        self.assertEqual(
            [str(i) for i in error.issues], ["nodes[1].providers[0].priority: must be >= 0"]
        )

    def test_structuralChecksKept(self) -> None:
        error = self.assertRaises(
            ConfigError,
            self.parse,
            self.disabled(
                adapter="gone",
                type="bogus",
                category="remote",
                models=[],
                capacity=0,
                profile="missing",
            ),
        )
        paths = sorted(i.path for i in error.issues)
        self.assertEqual(
            paths,
            sorted(
                f"nodes[1].providers[0].{key}"
                for key in ("type", "category", "models", "capacity", "profile")
            ),
        )


class UniquenessTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_providerIdAcrossNodes(self) -> None:
        data = base_config()
        data["nodes"][1]["providers"][0]["id"] = "a-chat"
        error = self.assertRaises(ConfigError, self.parse, data)
        issue = assertIssue(
            self, error, "nodes[1].providers[0].id", "duplicate provider id 'a-chat'"
        )
        self.assertIn("nodes[0].providers[0]", issue.message)

    def test_providerIdWithinNode(self) -> None:
        data = base_config()
        data["nodes"][0]["providers"][1]["id"] = "a-chat"
        assertIssue(
            self,
            self.assertRaises(ConfigError, self.parse, data),
            "nodes[0].providers[1].id",
            "duplicate provider id 'a-chat'",
        )


class ErrorReportingTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_collectsEveryIssue(self) -> None:
        data = base_config()
        data["edge"]["id"] = "bad id"
        data["nodes"][0]["providers"][0]["priority"] = -1
        data["nodes"][1]["providers"][0]["capacity"] = 0
        data["models"][1]["min_max_tokens"] = 0
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual(
            [i.path for i in error.issues],
            [
                "edge.id",
                "nodes[0].providers[0].priority",
                "nodes[1].providers[0].capacity",
                "models[1].min_max_tokens",
            ],
        )

    def test_strOneLinePerIssue(self) -> None:
        data = base_config()
        data["nodes"].append(copy.deepcopy(data["nodes"][1]))
        data["nodes"][2]["id"] = "node-c"
        data["nodes"][2]["token_file"] = "secrets/c.token"
        self.write("secrets/c.token", "token-c")
        data["nodes"][2]["providers"][0].update(id="c-chat", priority=-3)
        data["nodes"][1]["providers"][0]["priority"] = True
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual(
            str(error).splitlines(),
            [
                "nodes[1].providers[0].priority: must be an integer, got boolean",
                "nodes[2].providers[0].priority: must be >= 0",
            ],
        )
        self.assertEqual(
            error.issues[1], ConfigIssue("nodes[2].providers[0].priority", "must be >= 0")
        )

    def test_noCascades(self) -> None:
        """
        An entry that cannot be read does not also fail every reference that might point at
        it: only the root cause is reported.
        """
        cases: list[tuple[Mutation, list[str]]] = [
            (put("nodes", {"id": "x"}), ["nodes"]),
            (put("nodes.0.providers.0", "a-chat"), ["nodes[0].providers[0]"]),
            (drop("nodes.0.providers.0.id"), ["nodes[0].providers[0].id"]),
            (put("nodes.0.adapters", "x"), ["nodes[0].adapters"]),
            (put("nodes.1.adapters", {"olama": {}}), ["nodes[1].adapters.olama"]),
            (put("protocol_profiles.0", "x"), ["protocol_profiles[0]"]),
            (drop("models.1.id"), ["models[1].id"]),
        ]
        for mutate, paths in cases:
            data = base_config()
            mutate(data)
            error = self.assertRaises(ConfigError, self.parse, data)
            self.assertEqual([i.path for i in error.issues], paths, str(error))

    def test_nonMappingTopLevel(self) -> None:
        samples: tuple[object, ...] = ([], "text", None, 3)
        for data in samples:
            error = self.assertRaises(ConfigError, self.parse, data)
            assertIssue(self, error, "<root>", "must be a mapping")

    def test_nonStringKey(self) -> None:
        data = base_config()
        data["nodes"][0]["providers"][0][5] = "x"
        assertIssue(
            self,
            self.assertRaises(ConfigError, self.parse, data),
            "nodes[0].providers[0]",
            "keys must be strings",
        )


class SecretHygieneTests(EdgeConfigTestMixin, SynchronousTestCase):
    """Token and header values never appear in reprs or error messages."""

    SECRET = "S3CRET-marker-7f1c"

    def setUp(self) -> None:
        self.make_base(self)

    def test_notInRepr(self) -> None:
        self.write("secrets/b.token", self.SECRET + "-file")
        environ = {"TOKEN_A": self.SECRET + "-env", "UPSTREAM_KEY": self.SECRET + "-header"}
        data = base_config()
        data["nodes"][0]["adapters"][1]["env"] = {"KEY": "${UPSTREAM_KEY}"}
        config = self.parse(data, environ)
        self.assertEqual(
            dict(config.nodes[0].adapters[0].headers)["Authorization"],
            f"Bearer {self.SECRET}-header",
        )
        for text in (repr(config), str(config)):
            self.assertNotIn(self.SECRET, text)

    def test_notInErrors(self) -> None:
        data = base_config()
        # Literal token, a token pasted into token_sha256, a token file that cannot be read,
        # and a header value with a malformed reference next to a literal credential.
        data["nodes"][0]["token"] = self.SECRET
        del data["nodes"][1]["token_file"]
        data["nodes"][1]["token_sha256"] = self.SECRET
        data["nodes"][0]["adapters"][0]["headers"] = {
            "Authorization": f"Bearer {self.SECRET} ${{bad-name}}",
            "X-Other": f"{self.SECRET}${{MISSING_VAR}}",
            "X-List": [self.SECRET],
        }
        data["nodes"][0]["adapters"][0]["env"] = {"K": {"v": self.SECRET}}
        data["nodes"][0]["adapters"][0]["settings"] = {"k": [self.SECRET]}
        data["nodes"][0]["adapters"][0]["base_url"] = f"ftp://{self.SECRET}"
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual(len(error.issues), 8, str(error))
        for text in (str(error), repr(error), *(str(i) for i in error.issues)):
            self.assertNotIn(self.SECRET, text)
        assertIssue(
            self,
            error,
            "nodes[0].token",
            "literal tokens are not allowed in config; use token: ${ENV_VAR}, token_file or "
            "token_sha256",
        )


class YamlFileTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_loadResolvesRelativeToFile(self) -> None:
        """Relative paths resolve against the config file's directory, not the cwd."""
        path = self.write("edge.yaml", yaml.safe_dump(base_config()))
        config = load_edge_config(path, ENVIRON)
        self.assertEqual(config.source_path, path)
        assert config.tls is not None
        self.assertEqual(config.tls.cert_file, os.path.join(self.base, "pki", "edge.crt"))
        self.assertTrue(config.nodes[1].token.matches(TOKEN_B))

    def test_absoluteNormalizedPaths(self) -> None:
        data = base_config()
        data["node_transport"]["tls"]["cert_file"] = "secrets/../pki/./edge.crt"
        data["node_transport"]["tls"]["key_file"] = os.path.join(self.base, "pki", "edge.key")
        config = self.parse(data)
        assert config.tls is not None
        self.assertEqual(config.tls.cert_file, os.path.join(self.base, "pki", "edge.crt"))
        self.assertEqual(config.tls.key_file, os.path.join(self.base, "pki", "edge.key"))

    def test_missingFile(self) -> None:
        path = os.path.join(self.base, "nope.yaml")
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        assertIssue(self, error, path, "cannot read config file")

    def test_syntaxError(self) -> None:
        path = self.write("edge.yaml", "listen:\n  nodes: [tcp:7443\nnodes: x\n")
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        issue = assertIssue(self, error, path, "invalid YAML at line")
        self.assertNotIn("tcp:7443", issue.message)

    def test_duplicateKey(self) -> None:
        path = self.write("edge.yaml", "listen:\n  nodes: a\n  nodes: b\n")
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        assertIssue(
            self, error, path, "invalid YAML at line 3, column 3: found duplicate key 'nodes'"
        )

    def test_mergeKeysAllowed(self) -> None:
        """YAML merge keys may be overridden without tripping the duplicate-key check."""
        path = self.write("x.yaml", "base: &b {a: 1, c: 2}\nother:\n  <<: *b\n  a: 3\n")
        self.assertEqual(
            read_yaml_file(path), {"base": {"a": 1, "c": 2}, "other": {"a": 3, "c": 2}}
        )

    def test_notUtf8(self) -> None:
        path = self.write("edge.yaml", "")
        with open(path, "wb") as f:
            f.write(b"edge:\n  id: \xff\xfe\n")
        assertIssue(
            self, self.assertRaises(ConfigError, load_edge_config, path, ENVIRON), path, "UTF-8"
        )

    def test_emptyFile(self) -> None:
        path = self.write("edge.yaml", "# nothing\n")
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        assertIssue(self, error, "<root>", "must be a mapping, got null")

    def test_topLevelList(self) -> None:
        path = self.write("edge.yaml", "- a\n- b\n")
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        assertIssue(self, error, "<root>", "must be a mapping, got list")

    def test_yamlBooleanIsNotAnInteger(self) -> None:
        text = yaml.safe_dump(base_config()).replace(
            "id: a-chat\n", "id: a-chat\n    priority: yes\n"
        )
        self.assertIn("priority: yes", text)
        path = self.write("edge.yaml", text)
        error = self.assertRaises(ConfigError, load_edge_config, path, ENVIRON)
        assertIssue(
            self, error, "nodes[0].providers[0].priority", "must be an integer, got boolean"
        )


class ExampleFileTests(EdgeConfigTestMixin, SynchronousTestCase):
    """etc/iop/edge.yaml, the documented example, loads."""

    def setUp(self) -> None:
        self.make_base(self)

    def test_exampleLoads(self) -> None:
        example = os.path.join(EXAMPLE_DIR, "edge.yaml")
        if not os.path.exists(example):
            raise self.skipTest("etc/iop/edge.yaml is not in this tree")
        shutil.copy(example, os.path.join(self.base, "edge.yaml"))
        self.write("secrets/build-c.token", "token-build-c\n")
        # The example names the files `iop pki issue-edge edge.iop.internal` writes.
        for name in ("edge.iop.internal.crt", "edge.iop.internal.key"):
            self.write(os.path.join("pki", name), "PEM\n")
        environ = {
            "IOP_NODE_GPU_A_TOKEN": "token-gpu-a",
            "IOP_VLLM_API_KEY": "k1",
            "IOP_AGENT_API_KEY": "k2",
            "IOP_UPSTREAM_KEY": "k3",
        }
        config = load_edge_config(os.path.join(self.base, "edge.yaml"), environ)
        self.assertEqual([n.id for n in config.nodes], ["gpu-a", "laptop-b", "build-c"])
        self.assertTrue(config.nodes[0].token.matches("token-gpu-a"))
        self.assertTrue(config.nodes[1].token.matches("example-token-laptop-b"))
        self.assertTrue(config.nodes[2].token.matches("token-build-c"))
        self.assertEqual(config.nodes[1].adapters[0].name, "openai_compat")
        self.assertEqual(config.nodes[0].providers[1].adapter_instance, "ollama-local")
        self.assertEqual([m.id for m in config.models], ["qwen-coder", "gpt-small", "llama"])

        missing = self.assertRaises(
            ConfigError, load_edge_config, os.path.join(self.base, "edge.yaml"), {}
        )
        self.assertEqual(
            sorted(i.message.split()[2] for i in missing.issues),
            sorted(environ),
        )


class HelperTests(SynchronousTestCase):
    def test_isLoopbackHost(self) -> None:
        for host in ("127.0.0.1", "127.255.0.9", "::1", "[::1]", "localhost", "LocalHost"):
            self.assertTrue(is_loopback_host(host), host)
        for host in ("", "0.0.0.0", "::", "10.0.0.1", "edge.example.net", "128.0.0.1"):
            self.assertFalse(is_loopback_host(host), host)

    def test_splitEndpoint(self) -> None:
        self.assertEqual(
            split_endpoint("tcp:7443:interface=127.0.0.1"),
            (["tcp", "7443"], {"interface": "127.0.0.1"}),
        )
        self.assertEqual(
            split_endpoint("tcp:port=1:interface=\\:\\:1"),
            (["tcp"], {"port": "1", "interface": "::1"}),
        )
        self.assertEqual(split_endpoint("tcp:1:a=b=c"), (["tcp", "1"], {"a": "b=c"}))


# ---------------------------------------------------------------------------------------------
# The validation table: (name, mutation of baseConfig(), issue path, message fragment).


class Row(NamedTuple):
    name: str
    mutate: Mutation
    path: str
    fragment: str


P0 = "nodes.0.providers.0"  # a-chat on node-a (adapter fake-openai)
A0 = "nodes.0.adapters.0"  # fake-openai
M1 = "models.1"  # pool

ROWS = [
    # top level / edge
    Row("unknownTopKey", put("listn", {}), "listn", "unknown key; did you mean 'listen'?"),
    Row("edgeNotMapping", put("edge", "edge-1"), "edge", "must be a mapping, got string"),
    Row("edgeIdBadChars", put("edge.id", "edge 1"), "edge.id", "only letters, digits"),
    Row("edgeIdEmpty", put("edge.id", ""), "edge.id", "must not be empty"),
    Row("edgeIdNotString", put("edge.id", 1), "edge.id", "must be a string, got integer"),
    Row("edgeUnknownKey", put("edge.name", "x"), "edge.name", "unknown key"),
    # listen
    Row("listenMissing", drop("listen"), "listen", "is required"),
    Row("listenNodesMissing", drop("listen.nodes"), "listen.nodes", "is required"),
    Row("listenNodesNotString", put("listen.nodes", 7443), "listen.nodes", "must be a string"),
    Row(
        "listenNodesNotTcp", put("listen.nodes", "ssl:7443"), "listen.nodes", "starting with 'tcp:'"
    ),
    Row("listenNodesNoPort", put("listen.nodes", "tcp"), "listen.nodes", "needs a port"),
    Row(
        "listenNodesBadPort",
        put("listen.nodes", "tcp:http"),
        "listen.nodes",
        "port must be an integer",
    ),
    Row(
        "listenNodesPortRange", put("listen.nodes", "tcp:70000"), "listen.nodes", "from 0 to 65535"
    ),
    Row(
        "listenNodesUnknownOption",
        put("listen.nodes", "tcp:7443:iface=127.0.0.1"),
        "listen.nodes",
        "unknown tcp endpoint option 'iface'",
    ),
    Row(
        "listenNodesTooManyArgs",
        put("listen.nodes", "tcp:1:2:3:4"),
        "listen.nodes",
        "too many",
    ),
    Row(
        "listenNodesBadBacklog",
        put("listen.nodes", "tcp:1:backlog=x"),
        "listen.nodes",
        "backlog must be a positive integer",
    ),
    Row(
        "listenNodesUnescapedIpv6",
        put("listen.nodes", "tcp:7443:interface=::1"),
        "listen.nodes",
        "escape the ':' of an IPv6 address",
    ),
    Row("listenAdminBad", put("listen.admin", "tcp:x"), "listen.admin", "port must be an integer"),
    Row("listenAdminEmpty", put("listen.admin", ""), "listen.admin", "must not be empty"),
    Row("listenUnknownKey", put("listen.node", "tcp:1"), "listen.node", "did you mean 'nodes'?"),
    # node_transport
    Row("transportMissing", drop("node_transport"), "node_transport.tls", "is required unless"),
    Row("tlsMissing", drop("node_transport.tls"), "node_transport.tls", "is required unless"),
    Row(
        "tlsNotMapping", put("node_transport.tls", True), "node_transport.tls", "must be a mapping"
    ),
    Row(
        "tlsCertMissingFile",
        put("node_transport.tls.cert_file", "pki/nope.crt"),
        "node_transport.tls.cert_file",
        "does not exist",
    ),
    Row(
        "tlsCertIsDirectory",
        put("node_transport.tls.cert_file", "pki"),
        "node_transport.tls.cert_file",
        "is not a regular file",
    ),
    Row(
        "tlsKeyRequired",
        drop("node_transport.tls.key_file"),
        "node_transport.tls.key_file",
        "is required",
    ),
    Row(
        "tlsClientCaMissingFile",
        put("node_transport.tls.client_ca_file", "nope.crt"),
        "node_transport.tls.client_ca_file",
        "does not exist",
    ),
    Row(
        "tlsUnknownKey",
        put("node_transport.tls.ca_file", "x"),
        "node_transport.tls.ca_file",
        "unknown key",
    ),
    Row(
        "plaintextNotLoopback",
        put("node_transport.plaintext", True),
        "node_transport.plaintext",
        "only allowed when listen.nodes binds a loopback interface",
    ),
    Row(
        "plaintextAllInterfaces",
        chain(put("listen.nodes", "tcp:7443"), put("node_transport", {"plaintext": True})),
        "node_transport.plaintext",
        "all interfaces",
    ),
    Row(
        "plaintextWithTls",
        chain(
            put("listen.nodes", "tcp:7443:interface=127.0.0.1"),
            put("node_transport.plaintext", True),
        ),
        "node_transport.tls",
        "must not be set when plaintext is true",
    ),
    Row(
        "plaintextNotBool",
        put("node_transport.plaintext", "no"),
        "node_transport.plaintext",
        "must be a boolean",
    ),
    Row(
        "heartbeatIntervalZero",
        put("node_transport.heartbeat", {"interval_sec": 0}),
        "node_transport.heartbeat.interval_sec",
        "must be > 0",
    ),
    Row(
        "heartbeatTimeoutNegative",
        put("node_transport.heartbeat", {"timeout_sec": -1}),
        "node_transport.heartbeat.timeout_sec",
        "must be > 0",
    ),
    Row(
        "heartbeatTimeoutNotAboveInterval",
        put("node_transport.heartbeat", {"interval_sec": 5, "timeout_sec": 5}),
        "node_transport.heartbeat.timeout_sec",
        "must be greater than interval_sec (5)",
    ),
    Row(
        "heartbeatIntervalBool",
        put("node_transport.heartbeat", {"interval_sec": True}),
        "node_transport.heartbeat.interval_sec",
        "must be a number, got boolean",
    ),
    Row(
        "heartbeatIntervalNan",
        put("node_transport.heartbeat", {"interval_sec": float("nan")}),
        "node_transport.heartbeat.interval_sec",
        "must be a finite number",
    ),
    Row(
        "heartbeatUnknownKey",
        put("node_transport.heartbeat", {"interval": 1}),
        "node_transport.heartbeat.interval",
        "did you mean 'interval_sec'?",
    ),
    Row(
        "maxFrameZero",
        put("node_transport.max_frame_bytes", 0),
        "node_transport.max_frame_bytes",
        "must be >= 1",
    ),
    Row(
        "maxFrameTooBig",
        put("node_transport.max_frame_bytes", 256 * 1024 * 1024 + 1),
        "node_transport.max_frame_bytes",
        "must be <= 268435456",
    ),
    Row(
        "maxFrameFloat",
        put("node_transport.max_frame_bytes", 1024.0),
        "node_transport.max_frame_bytes",
        "must be an integer, got number",
    ),
    Row(
        "registerTimeoutZero",
        put("node_transport.register_timeout_sec", 0),
        "node_transport.register_timeout_sec",
        "must be > 0",
    ),
    Row(
        "registerTimeoutString",
        put("node_transport.register_timeout_sec", "10s"),
        "node_transport.register_timeout_sec",
        "must be a number, got string",
    ),
    Row(
        "transportUnknownKey",
        put("node_transport.tsl", {}),
        "node_transport.tsl",
        "did you mean 'tls'?",
    ),
    # protocol_profiles
    Row(
        "profilesNotList",
        put("protocol_profiles", {"name": "x"}),
        "protocol_profiles",
        "must be a list",
    ),
    Row(
        "profileNotMapping",
        put("protocol_profiles.0", "x"),
        "protocol_profiles[0]",
        "must be a mapping",
    ),
    Row(
        "profileNameMissing",
        drop("protocol_profiles.0.name"),
        "protocol_profiles[0].name",
        "is required",
    ),
    Row(
        "profileNameDuplicate",
        append("protocol_profiles", {"name": "openai-chat", "driver": "openai_responses"}),
        "protocol_profiles[1].name",
        "duplicate profile name 'openai-chat'",
    ),
    Row(
        "profileDriverMissing",
        drop("protocol_profiles.0.driver"),
        "protocol_profiles[0].driver",
        "is required",
    ),
    Row(
        "profileDriverUnknown",
        put("protocol_profiles.0.driver", "openai"),
        "protocol_profiles[0].driver",
        "must be one of 'anthropic_messages', 'openai_chat', 'openai_responses'",
    ),
    Row(
        "profileOperationPath",
        put("protocol_profiles.0.operations", {"chat_completions": "chat/completions"}),
        "protocol_profiles[0].operations.chat_completions",
        "starting with '/'",
    ),
    Row(
        "profileOperationsNotMapping",
        put("protocol_profiles.0.operations", ["/chat"]),
        "protocol_profiles[0].operations",
        "must be a mapping, got list",
    ),
    Row(
        "profileCapabilityUnknown",
        put("protocol_profiles.0.capabilities", ["chat", "vision"]),
        "protocol_profiles[0].capabilities[1]",
        "unknown capability 'vision'",
    ),
    Row(
        "profileCapabilityDuplicate",
        put("protocol_profiles.0.capabilities", ["chat", "chat"]),
        "protocol_profiles[0].capabilities[1]",
        "duplicate entry 'chat'",
    ),
    Row(
        "profileCapabilitiesNotList",
        put("protocol_profiles.0.capabilities", "chat"),
        "protocol_profiles[0].capabilities",
        "must be a list",
    ),
    Row(
        "profileExtensionUnknown",
        put("protocol_profiles.0.extensions", {"thinkng": True}),
        "protocol_profiles[0].extensions.thinkng",
        "did you mean 'thinking'?",
    ),
    Row(
        "profileExtensionNotBool",
        put("protocol_profiles.0.extensions", {"reasoning": "yes"}),
        "protocol_profiles[0].extensions.reasoning",
        "must be a boolean",
    ),
    Row(
        "profileAuthHeaderInvalid",
        put("protocol_profiles.0.auth_header", "Authorization:"),
        "protocol_profiles[0].auth_header",
        "must be an HTTP header name",
    ),
    Row(
        "profileUnknownKey",
        put("protocol_profiles.0.drivers", "x"),
        "protocol_profiles[0].drivers",
        "unknown key",
    ),
    # nodes
    Row("nodesMissing", drop("nodes"), "nodes", "is required"),
    Row("nodesEmpty", put("nodes", []), "nodes", "must list at least one node"),
    Row("nodesNotList", put("nodes", {"id": "a"}), "nodes", "must be a list, got mapping"),
    Row("nodeNotMapping", put("nodes.1", "node-b"), "nodes[1]", "must be a mapping, got string"),
    Row("nodeIdMissing", drop("nodes.0.id"), "nodes[0].id", "is required"),
    Row("nodeIdBadChars", put("nodes.0.id", "node/a"), "nodes[0].id", "only letters, digits"),
    Row(
        "nodeIdDuplicate", put("nodes.1.id", "node-a"), "nodes[1].id", "duplicate node id 'node-a'"
    ),
    Row("nodeAliasNotString", put("nodes.0.alias", ["x"]), "nodes[0].alias", "must be a string"),
    Row(
        "nodeAgentKindNotString",
        put("nodes.0.agent_kind", 3),
        "nodes[0].agent_kind",
        "must be a string",
    ),
    Row(
        "nodeConcurrencyNegative",
        put("nodes.0.concurrency", -1),
        "nodes[0].concurrency",
        "must be >= 0",
    ),
    Row(
        "nodeConcurrencyBool",
        put("nodes.0.concurrency", False),
        "nodes[0].concurrency",
        "got boolean",
    ),
    Row("nodeUnknownKey", put("nodes.0.tokens", "x"), "nodes[0].tokens", "did you mean 'token'?"),
    # node tokens
    Row(
        "tokenLiteral",
        put("nodes.0.token", "abc"),
        "nodes[0].token",
        "literal tokens are not allowed in config; "
        "use token: ${ENV_VAR}, token_file or token_sha256",
    ),
    Row(
        "tokenPartialReference",
        put("nodes.0.token", "x${TOKEN_A}"),
        "nodes[0].token",
        "literal tokens",
    ),
    Row("tokenNotString", put("nodes.0.token", 12345), "nodes[0].token", "got integer"),
    Row(
        "tokenVariableMissing",
        put("nodes.0.token", "${MISSING_VAR}"),
        "nodes[0].token",
        "environment variable MISSING_VAR is not set",
    ),
    Row(
        "tokenVariableEmpty",
        put("nodes.0.token", "${EMPTY}"),
        "nodes[0].token",
        "environment variable EMPTY is empty",
    ),
    Row(
        "tokenNone",
        drop("nodes.0.token"),
        "nodes[0]",
        "one of token, token_file or token_sha256 is required",
    ),
    Row(
        "tokenTwoSources",
        put("nodes.0.token_file", "secrets/b.token"),
        "nodes[0]",
        "set only one of token, token_file or token_sha256 (found: token, token_file)",
    ),
    Row(
        "tokenFileMissing",
        put("nodes.1.token_file", "secrets/nope.token"),
        "nodes[1].token_file",
        "does not exist",
    ),
    Row(
        "tokenFileIsDirectory",
        put("nodes.1.token_file", "secrets"),
        "nodes[1].token_file",
        "cannot read token file",
    ),
    Row(
        "tokenFileEmptyPath",
        put("nodes.1.token_file", ""),
        "nodes[1].token_file",
        "must be a file path",
    ),
    Row(
        "tokenFileEmpty",
        put("nodes.1.token_file", "pki/../secrets/empty"),
        "nodes[1].token_file",
        "is empty",
    ),
    Row(
        "tokenSha256BadHex",
        chain(drop("nodes.0.token"), put("nodes.0.token_sha256", "z" * 64)),
        "nodes[0].token_sha256",
        "exactly 64 hexadecimal characters",
    ),
    Row(
        "tokenSha256Short",
        chain(drop("nodes.0.token"), put("nodes.0.token_sha256", "ab" * 16)),
        "nodes[0].token_sha256",
        "exactly 64 hexadecimal characters",
    ),
    Row(
        "tokenSha256NotString",
        chain(drop("nodes.0.token"), put("nodes.0.token_sha256", 1234)),
        "nodes[0].token_sha256",
        "got integer",
    ),
    Row(
        "tokenSharedBetweenNodes",
        chain(drop("nodes.1.token_file"), put("nodes.1.token", "${TOKEN_A}")),
        "nodes[1]",
        "has the same token as nodes[0]",
    ),
    # adapters
    Row(
        "adaptersScalar",
        put("nodes.0.adapters", "openai"),
        "nodes[0].adapters",
        "must be a list, got string",
    ),
    Row("adapterNotMapping", put(f"{A0}", "x"), "nodes[0].adapters[0]", "must be a mapping"),
    Row("adapterTypeMissing", drop(f"{A0}.type"), "nodes[0].adapters[0].type", "is required"),
    Row(
        "adapterTypeUnknown",
        put(f"{A0}.type", "openai"),
        "nodes[0].adapters[0].type",
        "must be one of 'cli', 'ollama', 'openai_compat', 'vllm', got 'openai'",
    ),
    Row(
        "adapterNameEmpty", put(f"{A0}.name", ""), "nodes[0].adapters[0].name", "must not be empty"
    ),
    Row(
        "adapterNameDuplicate",
        put("nodes.0.adapters.1.name", "fake-openai"),
        "nodes[0].adapters[1].name",
        "duplicate adapter instance name 'fake-openai'",
    ),
    Row(
        "adapterUnnamedDuplicate",
        put("nodes.1.adapters", [{"type": "ollama"}, {"type": "ollama"}]),
        "nodes[1].adapters[1]",
        "duplicate adapter instance name 'ollama'",
    ),
    Row(
        "adapterEnabledNotBool",
        put(f"{A0}.enabled", 1),
        "nodes[0].adapters[0].enabled",
        "must be a boolean",
    ),
    Row(
        "adapterBaseUrlScheme",
        put(f"{A0}.base_url", "127.0.0.1:9001"),
        "nodes[0].adapters[0].base_url",
        "must be an http:// or https:// URL",
    ),
    Row(
        "adapterBaseUrlReference",
        put(f"{A0}.base_url", "${UPSTREAM_URL}"),
        "nodes[0].adapters[0].base_url",
        "only resolved in headers, env and tokens",
    ),
    Row(
        "adapterHeaderVariableMissing",
        put(f"{A0}.headers", {"Authorization": "Bearer ${MISSING_KEY}"}),
        "nodes[0].adapters[0].headers.Authorization",
        "environment variable MISSING_KEY is not set",
    ),
    Row(
        "adapterHeaderMalformedReference",
        put(f"{A0}.headers", {"X-Key": "${lower-case}"}),
        "nodes[0].adapters[0].headers.X-Key",
        "malformed ${...} reference",
    ),
    Row(
        "adapterHeaderUnterminatedReference",
        put(f"{A0}.headers", {"X-Key": "${UPSTREAM_KEY"}),
        "nodes[0].adapters[0].headers.X-Key",
        "malformed ${...} reference",
    ),
    Row(
        "adapterHeaderLineBreak",
        put(f"{A0}.headers", {"X-Key": "${MULTILINE}"}),
        "nodes[0].adapters[0].headers.X-Key",
        "must not contain a line break",
    ),
    Row(
        "adapterHeaderName",
        put(f"{A0}.headers", {"Bad Header": "x"}),
        'nodes[0].adapters[0].headers["Bad Header"]',
        "not a valid HTTP header name",
    ),
    Row(
        "adapterHeadersNotMapping",
        put(f"{A0}.headers", ["Authorization: x"]),
        "nodes[0].adapters[0].headers",
        "must be a mapping, got list",
    ),
    Row(
        "adapterEnvVariableMissing",
        put(f"{A0}.env", {"API_KEY": "${MISSING_KEY}"}),
        "nodes[0].adapters[0].env.API_KEY",
        "environment variable MISSING_KEY is not set",
    ),
    Row(
        "adapterEnvValueNotScalar",
        put(f"{A0}.env", {"API_KEY": {"a": 1}}),
        "nodes[0].adapters[0].env.API_KEY",
        "must be a string, got mapping",
    ),
    Row(
        "adapterSettingsValueNotScalar",
        put(f"{A0}.settings", {"k": [1]}),
        "nodes[0].adapters[0].settings.k",
        "must be a string, got list",
    ),
    Row(
        "adapterArgsNotList",
        put(f"{A0}.args", "--x"),
        "nodes[0].adapters[0].args",
        "must be a list",
    ),
    Row(
        "adapterArgNotScalar",
        put(f"{A0}.args", [["x"]]),
        "nodes[0].adapters[0].args[0]",
        "must be a string",
    ),
    Row(
        "adapterResumeArgNotScalar",
        put(f"{A0}.resume_args", [{"a": 1}]),
        "nodes[0].adapters[0].resume_args[0]",
        "must be a string",
    ),
    Row(
        "adapterRequestTimeoutNegative",
        put(f"{A0}.request_timeout_ms", -1),
        "nodes[0].adapters[0].request_timeout_ms",
        "must be >= 0",
    ),
    Row(
        "adapterIdleTimeoutNegative",
        put(f"{A0}.idle_timeout_ms", -5),
        "nodes[0].adapters[0].idle_timeout_ms",
        "must be >= 0",
    ),
    Row(
        "adapterMaxConcurrencyZero",
        put(f"{A0}.max_concurrency", 0),
        "nodes[0].adapters[0].max_concurrency",
        "must be >= 1",
    ),
    Row(
        "adapterContextSizeNegative",
        put(f"{A0}.context_size", -1),
        "nodes[0].adapters[0].context_size",
        "must be >= 0",
    ),
    Row(
        "adapterOutputFormat",
        put(f"{A0}.output_format", "yaml"),
        "nodes[0].adapters[0].output_format",
        "must be one of '', 'json', 'stream-json', 'text'",
    ),
    Row(
        "adapterCommandNotString",
        put(f"{A0}.command", ["a"]),
        "nodes[0].adapters[0].command",
        "must be a string",
    ),
    Row(
        "adapterUnknownKey",
        put(f"{A0}.baseurl", "x"),
        "nodes[0].adapters[0].baseurl",
        "did you mean 'base_url'?",
    ),
    Row(
        "legacyAdapterUnknownType",
        put("nodes.1.adapters", {"olama": {}}),
        "nodes[1].adapters.olama",
        "unknown adapter type 'olama'",
    ),
    Row(
        "legacyAdapterName",
        put("nodes.1.adapters.ollama.name", "x"),
        "nodes[1].adapters.ollama.name",
        "not allowed in the legacy adapters mapping",
    ),
    Row(
        "legacyAdapterNotMapping",
        put("nodes.1.adapters.ollama", "http://x"),
        "nodes[1].adapters.ollama",
        "must be a mapping, got string",
    ),
    Row(
        "legacyAdapterBadField",
        put("nodes.1.adapters.ollama.max_concurrency", 0),
        "nodes[1].adapters.ollama.max_concurrency",
        "must be >= 1",
    ),
    # providers
    Row(
        "providersNotList",
        put("nodes.0.providers", {"id": "x"}),
        "nodes[0].providers",
        "must be a list",
    ),
    Row("providerNotMapping", put(P0, "a-chat"), "nodes[0].providers[0]", "must be a mapping"),
    Row("providerIdMissing", drop(f"{P0}.id"), "nodes[0].providers[0].id", "is required"),
    Row("providerIdEmpty", put(f"{P0}.id", " "), "nodes[0].providers[0].id", "must not be empty"),
    Row(
        "providerIdDuplicateAcrossNodes",
        put("nodes.1.providers.0.id", "a-chat"),
        "nodes[1].providers[0].id",
        "duplicate provider id 'a-chat'",
    ),
    Row(
        "providerAdapterMissing",
        drop(f"{P0}.adapter"),
        "nodes[0].providers[0].adapter",
        "is required",
    ),
    Row(
        "providerAdapterUnknown",
        put(f"{P0}.adapter", "nope"),
        "nodes[0].providers[0].adapter",
        "no enabled adapter instance 'nope'",
    ),
    Row(
        "providerAdapterDisabled",
        put(f"{A0}.enabled", False),
        "nodes[0].providers[0].adapter",
        "it is disabled",
    ),
    Row(
        "providerAdapterTypeNameNone",
        put(f"{P0}.adapter", "vllm"),
        "nodes[0].providers[0].adapter",
        "no enabled adapter instance of type 'vllm'",
    ),
    Row(
        "providerAdapterTypeNameAmbiguous",
        chain(
            put(f"{P0}.adapter", "openai_compat"), put("nodes.0.adapters.1.type", "openai_compat")
        ),
        "nodes[0].providers[0].adapter",
        "ambiguous: 2 enabled instances of type 'openai_compat'; name one of: fake-openai, coder",
    ),
    Row(
        "providerCategoryMissing",
        drop(f"{P0}.category"),
        "nodes[0].providers[0].category",
        "is required",
    ),
    Row(
        "providerCategoryUnknown",
        put(f"{P0}.category", "remote"),
        "nodes[0].providers[0].category",
        "must be one of 'api', 'cli', 'local_inference'",
    ),
    Row(
        "providerCliNeedsCliAdapter",
        put(f"{P0}.category", "cli"),
        "nodes[0].providers[0].category",
        "category cli needs an enabled cli adapter, but 'fake-openai' is of type 'openai_compat'",
    ),
    Row(
        "providerCliAdapterDisabled",
        put("nodes.0.adapters.1.enabled", False),
        "nodes[0].providers[1].adapter",
        "no enabled adapter instance 'coder'",
    ),
    Row(
        "providerDisabledCliExplicitType",
        chain(put(f"{P0}.enabled", False), put(f"{P0}.category", "cli"), put(f"{P0}.type", "vllm")),
        "nodes[0].providers[0].category",
        "category cli needs a cli adapter, but type is 'vllm'",
    ),
    Row(
        "providerTypeUnknown",
        put(f"{P0}.type", "openai"),
        "nodes[0].providers[0].type",
        "must be one of 'cli', 'ollama', 'openai_compat', 'vllm'",
    ),
    Row(
        "providerTypeMismatch",
        put(f"{P0}.type", "vllm"),
        "nodes[0].providers[0].type",
        "is 'vllm' but adapter 'fake-openai' is of type 'openai_compat'",
    ),
    Row(
        "providerModelsMissing", drop(f"{P0}.models"), "nodes[0].providers[0].models", "is required"
    ),
    Row(
        "providerModelsEmpty",
        put(f"{P0}.models", []),
        "nodes[0].providers[0].models",
        "must list at least one model",
    ),
    Row(
        "providerModelsNotList",
        put(f"{P0}.models", "m1"),
        "nodes[0].providers[0].models",
        "must be a list",
    ),
    Row(
        "providerModelNotString",
        put(f"{P0}.models", ["m1", 2]),
        "nodes[0].providers[0].models[1]",
        "must be a string",
    ),
    Row(
        "providerModelEmpty",
        put(f"{P0}.models", [""]),
        "nodes[0].providers[0].models[0]",
        "must not be empty",
    ),
    Row(
        "providerModelDuplicate",
        put(f"{P0}.models", ["m1", "m1"]),
        "nodes[0].providers[0].models[1]",
        "duplicate entry 'm1'",
    ),
    Row(
        "providerEnabledNotBool",
        put(f"{P0}.enabled", "false"),
        "nodes[0].providers[0].enabled",
        "must be a boolean",
    ),
    Row(
        "providerPriorityNegative",
        put(f"{P0}.priority", -1),
        "nodes[0].providers[0].priority",
        "must be >= 0",
    ),
    Row(
        "providerPriorityBool",
        put(f"{P0}.priority", True),
        "nodes[0].providers[0].priority",
        "must be an integer, got boolean",
    ),
    Row(
        "providerPriorityFloat",
        put(f"{P0}.priority", 1.5),
        "nodes[0].providers[0].priority",
        "must be an integer, got number",
    ),
    Row(
        "providerCapacityZero",
        put(f"{P0}.capacity", 0),
        "nodes[0].providers[0].capacity",
        "must be >= 1",
    ),
    Row(
        "providerLongThresholdNegative",
        put(f"{P0}.long_context_threshold", -1),
        "nodes[0].providers[0].long_context_threshold",
        "must be >= 0",
    ),
    Row(
        "providerLongCapacityNegative",
        put(f"{P0}.long_capacity", -1),
        "nodes[0].providers[0].long_capacity",
        "must be >= 0",
    ),
    Row(
        "providerLongCapacityAboveCapacity",
        chain(put(f"{P0}.capacity", 2), put(f"{P0}.long_capacity", 3)),
        "nodes[0].providers[0].long_capacity",
        "must be <= capacity (2)",
    ),
    Row(
        "providerMaxQueueNegative",
        put(f"{P0}.max_queue", -1),
        "nodes[0].providers[0].max_queue",
        "must be >= 0",
    ),
    Row(
        "providerQueueTimeoutNegative",
        put(f"{P0}.queue_timeout_sec", -0.5),
        "nodes[0].providers[0].queue_timeout_sec",
        "must be >= 0",
    ),
    Row(
        "providerQueueTimeoutString",
        put(f"{P0}.queue_timeout_sec", "5"),
        "nodes[0].providers[0].queue_timeout_sec",
        "must be a number",
    ),
    Row(
        "providerProfileUnknown",
        put(f"{P0}.profile", "openai-chatt"),
        "nodes[0].providers[0].profile",
        "unknown protocol profile 'openai-chatt' (protocol_profiles defines: openai-chat)",
    ),
    Row(
        "providerUsageAttributionNotString",
        put(f"{P0}.usage_attribution", 5),
        "nodes[0].providers[0].usage_attribution",
        "must be a string",
    ),
    Row(
        "providerUnknownKey",
        put(f"{P0}.priorty", 1),
        "nodes[0].providers[0].priorty",
        "did you mean 'priority'?",
    ),
    Row(
        "providerDisabledBadPriority",
        chain(put(f"{P0}.enabled", False), put(f"{P0}.adapter", "gone"), put(f"{P0}.priority", -2)),
        "nodes[0].providers[0].priority",
        "must be >= 0",
    ),
    # models
    Row("modelsNotList", put("models", {"id": "x"}), "models", "must be a list"),
    Row("modelNotMapping", put("models.0", "m1"), "models[0]", "must be a mapping"),
    Row("modelIdMissing", drop("models.0.id"), "models[0].id", "is required"),
    Row("modelIdDuplicate", put("models.1.id", "m1"), "models[1].id", "duplicate model id 'm1'"),
    Row(
        "modelDisplayNameNotString",
        put("models.0.display_name", 1),
        "models[0].display_name",
        "must be a string",
    ),
    Row("modelProvidersMissing", drop("models.0.providers"), "models[0].providers", "is required"),
    Row(
        "modelProvidersEmpty",
        put("models.0.providers", []),
        "models[0].providers",
        "must list at least one provider",
    ),
    Row(
        "modelProvidersNotList",
        put("models.0.providers", "a-chat"),
        "models[0].providers",
        "must be a list",
    ),
    Row(
        "modelProviderUnknown",
        put("models.0.providers", ["a-chat", "nope"]),
        "models[0].providers[1]",
        "unknown provider 'nope'",
    ),
    Row(
        "modelProviderUnknownMapping",
        put("models.0.providers", [{"id": "nope"}]),
        "models[0].providers[0].id",
        "unknown provider 'nope'",
    ),
    Row(
        "modelProviderDuplicate",
        put("models.0.providers", ["a-chat", "a-chat"]),
        "models[0].providers[1]",
        "duplicate provider 'a-chat'",
    ),
    Row(
        "modelProviderWrongType",
        put("models.0.providers", [3]),
        "models[0].providers[0]",
        "must be a provider id or a mapping",
    ),
    Row(
        "modelProviderEmptyId",
        put("models.0.providers", [""]),
        "models[0].providers[0]",
        "must not be empty",
    ),
    Row(
        "modelProviderMappingIdMissing",
        put("models.0.providers", [{"target": "m1"}]),
        "models[0].providers[0].id",
        "is required",
    ),
    Row(
        "modelProviderMappingUnknownKey",
        put("models.0.providers", [{"id": "a-chat", "targt": "m1"}]),
        "models[0].providers[0].targt",
        "did you mean 'target'?",
    ),
    Row(
        "modelTargetNotServed",
        put(f"{M1}.providers", [{"id": "b-chat", "target": "m3"}]),
        "models[1].providers[0].target",
        "'m3' is not one of provider 'b-chat' models (m1, m2)",
    ),
    Row(
        "modelTargetEmpty",
        put(f"{M1}.providers", [{"id": "b-chat", "target": ""}]),
        "models[1].providers[0].target",
        "must not be empty",
    ),
    Row(
        "modelTargetAmbiguous",
        put(f"{M1}.providers", ["b-chat"]),
        "models[1].providers[0]",
        "provider 'b-chat' serves several models (m1, m2) and none is 'pool'; "
        "give an explicit target",
    ),
    Row(
        "modelDefaultMaxTokensZero",
        put(f"{M1}.default_max_tokens", 0),
        "models[1].default_max_tokens",
        "must be >= 1",
    ),
    Row(
        "modelMinMaxTokensZero",
        put(f"{M1}.min_max_tokens", 0),
        "models[1].min_max_tokens",
        "must be >= 1",
    ),
    Row(
        "modelMinAboveDefault",
        chain(put(f"{M1}.default_max_tokens", 100), put(f"{M1}.min_max_tokens", 101)),
        "models[1].min_max_tokens",
        "must be <= default_max_tokens (100)",
    ),
    Row(
        "modelThinkingBudgetNegative",
        put(f"{M1}.default_thinking_token_budget", -1),
        "models[1].default_thinking_token_budget",
        "must be >= 0",
    ),
    Row(
        "modelMaxTokensBool",
        put(f"{M1}.default_max_tokens", True),
        "models[1].default_max_tokens",
        "must be an integer, got boolean",
    ),
    Row("modelUnknownKey", put(f"{M1}.max_tokens", 1), "models[1].max_tokens", "unknown key"),
]


def _add_row_tests(cls: type[SynchronousTestCase]) -> type[SynchronousTestCase]:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names)), "duplicate row names"
    for row in ROWS:

        def test(self: ValidationTableTests, row: Row = row) -> None:
            self.check_row(row)

        test.__name__ = f"test_{row.name}"
        test.__doc__ = f"{row.path}: ...{row.fragment}..."
        setattr(cls, test.__name__, test)
    return cls


@_add_row_tests
class ValidationTableTests(EdgeConfigTestMixin, SynchronousTestCase):
    """One test per row of ``ROWS``, each generated as ``test_<row name>``."""

    def setUp(self) -> None:
        self.make_base(self)
        self.write("secrets/empty", " \n")

    def check_row(self, row: Row) -> None:
        data = base_config()
        row.mutate(data)
        error = self.assertRaises(ConfigError, self.parse, data)
        assertIssue(self, error, row.path, row.fragment)

    def test_baseIsValid(self) -> None:
        self.parse(base_config())
