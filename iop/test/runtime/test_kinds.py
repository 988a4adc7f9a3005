"""
The provider kind table is complete and consistent: every kind has a row and an adapter on the
node (a tunnel kind's adapter serves tunnels, a run kind's does not), every driver a row, and what
edge.yaml accepts is exactly what the table holds.
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
from typing import Any, cast

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, parse_edge_config
from iop.node.adapters.registry import ADAPTER_PACKAGE, DEFAULT_FACTORIES, KNOWN_ADAPTER_TYPES
from iop.node.tunnel.usage import USAGE_OPERATIONS
from iop.runtime import IProvider, ITunnelProvider
from iop.runtime.kinds import (
    ADAPTER_KINDS,
    DRIVER_NAMES,
    GENERATE_OPERATIONS,
    LEASED_KINDS,
    OPERATION_PATHS,
    PROTOCOL_DRIVERS,
    PROVIDER_KINDS,
    TUNNEL_KINDS,
    Images,
    ProtocolDriver,
    Wire,
    default_operation_path,
    images_of,
    wire_of,
)


def adapter_class(kind: str) -> type:
    """The provider class the adapter module of ``kind`` defines for it."""
    module = importlib.import_module(f"{ADAPTER_PACKAGE}.{kind}")
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and vars(value).get("type") == kind
        and IProvider.implementedBy(value)
    ]
    assert len(found) == 1, (kind, found)
    return found[0]


class TableTests(SynchronousTestCase):
    def test_rowsAreNamedByTheirKey(self) -> None:
        for name, kind in PROVIDER_KINDS.items():
            self.assertEqual(kind.name, name)
        for name, driver in PROTOCOL_DRIVERS.items():
            self.assertEqual(driver.name, name)

    def test_frozen(self) -> None:
        kind = PROVIDER_KINDS["vllm"]
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, kind, "wire", Wire.RUN)
        self.assertRaises(TypeError, operator.setitem, cast(Any, PROVIDER_KINDS), "x", kind)
        operations = PROTOCOL_DRIVERS["openai_chat"].operations
        self.assertRaises(TypeError, operator.setitem, cast(Any, operations), "x", "/x")
        given = {"generate": "/generate"}
        driver = ProtocolDriver("d", "generate", given)
        given["generate"] = "/changed"
        self.assertEqual(dict(driver.operations), {"generate": "/generate"})

    def test_kinds(self) -> None:
        """The rows as they are: changing one is a behaviour change, made here on purpose."""
        rows = {
            k.name: (k.wire, k.leased_credential, k.images, k.default_driver)
            for k in PROVIDER_KINDS.values()
        }
        self.assertEqual(
            rows,
            {
                "openai_compat": (Wire.TUNNEL, True, Images.ANY, "openai_chat"),
                "vllm": (Wire.TUNNEL, True, Images.ANY, "openai_chat"),
                "ollama": (Wire.RUN, False, Images.BASE64, ""),
                "cli": (Wire.RUN, False, Images.NONE, ""),
            },
        )

    def test_views(self) -> None:
        self.assertEqual(ADAPTER_KINDS, {"openai_compat", "vllm", "ollama", "cli"})
        self.assertEqual(TUNNEL_KINDS, {"openai_compat", "vllm"})
        self.assertEqual(LEASED_KINDS, {"openai_compat", "vllm"})
        self.assertEqual(DRIVER_NAMES, {"openai_chat", "openai_responses", "anthropic_messages"})
        self.assertEqual(GENERATE_OPERATIONS, {"chat_completions", "responses", "messages"})
        self.assertEqual(
            dict(OPERATION_PATHS),
            {
                "chat_completions": "/chat/completions",
                "responses": "/responses",
                "messages": "/messages",
                "count_tokens": "/messages/count_tokens",
                "models": "/models",
            },
        )

    def test_leasedOnlyOverATunnel(self) -> None:
        """A lease rides only on a tunnel: a run carries no credential."""
        for kind in PROVIDER_KINDS.values():
            if kind.leased_credential:
                self.assertIs(kind.wire, Wire.TUNNEL, kind.name)

    def test_defaultDrivers(self) -> None:
        """A tunnel kind speaks a known driver without a profile; a run kind has none."""
        for kind in PROVIDER_KINDS.values():
            if kind.wire is Wire.TUNNEL:
                self.assertIn(kind.default_driver, PROTOCOL_DRIVERS, kind.name)
                self.assertIs(kind.images, Images.ANY, kind.name)
            else:
                self.assertEqual(kind.default_driver, "", kind.name)

    def test_drivers(self) -> None:
        """Each driver generates through one of its operations; every path is absolute."""
        for driver in PROTOCOL_DRIVERS.values():
            self.assertIn(driver.generate, driver.operations, driver.name)
            for operation, path in driver.operations.items():
                self.assertTrue(path.startswith("/"), (driver.name, operation, path))
                self.assertEqual(OPERATION_PATHS[operation], path)

    def test_lookups(self) -> None:
        self.assertEqual(
            [wire_of(k) for k in ("openai_compat", "vllm", "ollama", "cli", "", "x")],
            ["tunnel", "tunnel", "run", "run", "run", "run"],
        )
        self.assertEqual(
            [images_of(k) for k in ("openai_compat", "vllm", "ollama", "cli", "", "x")],
            ["any", "any", "base64", "none", "none", "none"],
        )
        self.assertEqual(default_operation_path("count_tokens"), "/messages/count_tokens")
        self.assertEqual(default_operation_path("embeddings"), "")


class NodeTests(SynchronousTestCase):
    def test_aFactoryPerKind(self) -> None:
        self.assertEqual(KNOWN_ADAPTER_TYPES, ADAPTER_KINDS)
        self.assertEqual(set(DEFAULT_FACTORIES), ADAPTER_KINDS)

    def test_anAdapterPerKind(self) -> None:
        """Each kind's module defines its provider; a tunnel kind's serves tunnels, only it."""
        for kind in PROVIDER_KINDS.values():
            cls = adapter_class(kind.name)
            module = importlib.import_module(f"{ADAPTER_PACKAGE}.{kind.name}")
            self.assertTrue(callable(getattr(module, "build", None)), kind.name)
            self.assertEqual(
                ITunnelProvider.implementedBy(cls), kind.wire is Wire.TUNNEL, kind.name
            )

    def test_usageOperations(self) -> None:
        self.assertEqual(USAGE_OPERATIONS, GENERATE_OPERATIONS | {""})


ENVIRON = {"TOKEN": "node-token"}


def edge_yaml(adapters: object, drivers: list[str]) -> dict[str, Any]:
    return {
        "edge": {"id": "edge-1"},
        "listen": {"nodes": "tcp:7443:interface=127.0.0.1"},
        "node_transport": {"plaintext": True},
        "protocol_profiles": [{"name": f"p-{d}", "driver": d} for d in drivers],
        "nodes": [{"id": "node-a", "token": "${TOKEN}", "adapters": adapters}],
    }


class ConfigTests(SynchronousTestCase):
    """What edge.yaml accepts as an adapter type and a driver is the table."""

    def parse(self, data: dict[str, Any]) -> list[str]:
        try:
            parse_edge_config(data, base_dir="/", environ=ENVIRON)
        except ConfigError as e:
            return [str(issue) for issue in e.issues]
        return []

    def test_everyKindAndDriverAccepted(self) -> None:
        drivers = sorted(DRIVER_NAMES)
        listed = [
            {"name": f"a-{k}", "type": k, "base_url": "http://127.0.0.1:1/v1", "command": "x"}
            for k in sorted(ADAPTER_KINDS)
        ]
        self.assertEqual(self.parse(edge_yaml(listed, drivers)), [])
        legacy = {k: {"base_url": "http://127.0.0.1:1/v1"} for k in sorted(ADAPTER_KINDS)}
        self.assertEqual(self.parse(edge_yaml(legacy, drivers)), [])

    def test_onlyTheTable(self) -> None:
        kinds = ", ".join(repr(k) for k in sorted(ADAPTER_KINDS))
        drivers = ", ".join(repr(d) for d in sorted(DRIVER_NAMES))
        issues = self.parse(edge_yaml([{"name": "a", "type": "olama"}], ["openai"]))
        self.assertEqual(
            issues,
            [
                f"protocol_profiles[0].driver: must be one of {drivers}, got 'openai'",
                f"nodes[0].adapters[0].type: must be one of {kinds}, got 'olama'",
            ],
        )
        issues = self.parse(edge_yaml({"olama": {}}, []))
        self.assertEqual(
            issues,
            [
                "nodes[0].adapters.olama: unknown adapter type 'olama' (one of: "
                f"{', '.join(sorted(ADAPTER_KINDS))})"
            ],
        )
