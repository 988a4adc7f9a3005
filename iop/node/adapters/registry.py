# -*- test-case-name: iop.test.node.test_registry -*-
"""
The Node's runtime adapter registry, built from ``NodeConfigPayload.adapters``.

Each ``AdapterConfig`` becomes a named :class:`AdapterInstance` (an empty ``name`` means the legacy
single instance of its ``type``, so it is named after the type). Disabled instances are kept, marked
disabled, so a run naming one gets a clear answer rather than "unknown adapter". A payload with a
duplicate instance name or an unknown type does not apply: :class:`AdapterApplyError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from iop.config.model import ADAPTER_TYPES
from iop.node.adapters.capacity import CapacityGate
from iop.wire import runtime_pb2 as pb

# One source of truth with the config loaders: openai_compat, vllm, ollama, cli.
KNOWN_ADAPTER_TYPES = ADAPTER_TYPES


class AdapterApplyError(ValueError):
    """A config payload's adapter list cannot be applied. The message names the adapter."""


class UnknownAdapter(KeyError):
    """No adapter instance answers to this name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown adapter {self.name!r}"


@dataclass(frozen=True)
class AdapterInstance:
    """
    One configured adapter instance and its capacity gate. ``config`` is a private copy of the
    wire message; it can hold headers and environment values, so it stays out of ``repr``.
    """

    name: str
    type: str
    enabled: bool
    max_concurrency: int
    config: pb.AdapterConfig = field(repr=False, compare=False)
    gate: CapacityGate = field(repr=False, compare=False)

    @classmethod
    def from_config(cls, config: pb.AdapterConfig) -> AdapterInstance:
        """
        Build one instance; raises :class:`AdapterApplyError` for an unknown type. A
        ``max_concurrency`` of 0 (unset on the wire) means 1, the configuration default.
        """
        name = config.name or config.type
        if config.type not in KNOWN_ADAPTER_TYPES:
            raise AdapterApplyError(f"adapter {name!r}: unknown type {config.type!r}")
        copy = pb.AdapterConfig()
        copy.CopyFrom(config)
        limit = config.max_concurrency or 1
        return cls(
            name=name,
            type=config.type,
            enabled=config.enabled,
            max_concurrency=limit,
            config=copy,
            gate=CapacityGate(limit),
        )

    def describe(self) -> dict[str, object]:
        """Status view: identity and occupancy only (no endpoints, headers or commands)."""
        return {
            "name": self.name,
            "type": self.type,
            "enabled": self.enabled,
            "max_concurrency": self.max_concurrency,
            "in_use": self.gate.in_use,
        }


class AdapterRegistry:
    """The adapter instances of one applied config payload, by instance name."""

    def __init__(self, instances: Iterable[AdapterInstance] = ()) -> None:
        byName: dict[str, AdapterInstance] = {}
        for instance in instances:
            if instance.name in byName:
                raise AdapterApplyError(f"adapter {instance.name!r}: duplicate instance name")
            byName[instance.name] = instance
        self._byName = byName

    @classmethod
    def from_payload(cls, payload: pb.NodeConfigPayload) -> AdapterRegistry:
        """Apply ``payload.adapters``; raises :class:`AdapterApplyError` if they do not apply."""
        return cls(AdapterInstance.from_config(config) for config in payload.adapters)

    def get(self, name: str) -> AdapterInstance:
        """The instance with exactly this name (enabled or not), or :class:`UnknownAdapter`."""
        try:
            return self._byName[name]
        except KeyError:
            raise UnknownAdapter(name) from None

    def resolve(self, reference: str) -> AdapterInstance:
        """
        Resolve an adapter reference the way the Edge's config does: the exact instance name
        first; a legacy type name only when exactly one enabled instance has that type.
        """
        if reference in self._byName:
            return self._byName[reference]
        candidates = [i for i in self._byName.values() if i.type == reference and i.enabled]
        if len(candidates) == 1:
            return candidates[0]
        raise UnknownAdapter(reference)

    def instances(self) -> tuple[AdapterInstance, ...]:
        """Every instance, in payload order."""
        return tuple(self._byName.values())

    def describe(self) -> list[dict[str, object]]:
        return [instance.describe() for instance in self._byName.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._byName

    def __iter__(self) -> Iterator[AdapterInstance]:
        return iter(self._byName.values())

    def __len__(self) -> int:
        return len(self._byName)

    def __repr__(self) -> str:
        return f"<AdapterRegistry {sorted(self._byName)}>"
