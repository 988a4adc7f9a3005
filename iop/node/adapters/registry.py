# -*- test-case-name: iop.test.node.test_registry -*-
"""
The Node's runtime adapter registry, built from the :class:`~iop.runtime.spec.AdapterSpec` of a
config payload's adapters (:func:`iop.wire.convert.adapter_specs` converts them once, where the
payload is applied).

Each spec becomes a named :class:`AdapterInstance` (a spec without a ``name`` is the legacy
single instance of its ``type``, so it is named after the type). Disabled instances are kept,
marked disabled and without a provider, so a run naming one gets a clear answer rather than
"unknown adapter". A payload with a duplicate instance name, an unknown type, or an adapter
whose factory cannot build it does not apply: :class:`AdapterApplyError`, naming the adapter.

Which types exist is the provider kind table's (:data:`iop.runtime.kinds.PROVIDER_KINDS`); this
registry maps each kind to its factory. An enabled instance holds its
:class:`~iop.runtime.IProvider`, built by the factory of its type:
``iop.node.adapters.<type>.build(spec, ctx)``, imported only when a payload needs it. Its
:class:`CapacityGate` is sized by the provider's ``capabilities().max_concurrency`` and is the one
gate that normalized runs and provider tunnels of that instance share.

The gate's limit is the one setting of a built instance that changes live
(:meth:`AdapterInstance.resize`, when a config refresh changes only an adapter's
``max_concurrency``): the Edge sizes it from the capacities of the providers the adapter serves,
so a capacity raised on the Edge must raise it too, and a raise that needed a node restart would
cut every stream the node carries. The gate resizes in place (held slots stay held) and the
provider, if it is :class:`~iop.runtime.interfaces.IResizable`, reports the new value; every
other adapter setting builds the provider and still needs a restart.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from iop.node.adapters.capacity import CapacityGate
from iop.runtime.interfaces import AdapterContext, AdapterFactory, IProvider, IResizable
from iop.runtime.kinds import ADAPTER_KINDS
from iop.runtime.spec import AdapterSpec

# The provider kind table's adapter types, the ones the config loaders accept too.
KNOWN_ADAPTER_TYPES = ADAPTER_KINDS

# The package whose modules named after each adapter type expose ``build(spec, ctx)``.
ADAPTER_PACKAGE = "iop.node.adapters"


class AdapterApplyError(ValueError):
    """A config payload's adapter list cannot be applied. The message names the adapter."""


class UnknownAdapter(KeyError):
    """No adapter instance answers to this name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown adapter {self.name!r}"


def _module_factory(type_: str) -> AdapterFactory:
    """
    The factory of ``type_``: ``iop.node.adapters.<type_>.build``, imported on first use (so a
    node only imports the adapters its payload names, and a missing module fails that payload).
    """

    def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
        module = importlib.import_module(f"{ADAPTER_PACKAGE}.{type_}")
        factory: AdapterFactory = module.build
        return factory(spec, ctx)

    build.__name__ = f"build_{type_}"
    return build


# The production factory table: one lazily imported module per known type.
DEFAULT_FACTORIES: Mapping[str, AdapterFactory] = {
    type_: _module_factory(type_) for type_ in sorted(KNOWN_ADAPTER_TYPES)
}


def _build_provider(
    spec: AdapterSpec, ctx: AdapterContext, factories: Mapping[str, AdapterFactory]
) -> IProvider:
    name = spec.name
    factory = factories.get(spec.type)
    if factory is None:
        raise AdapterApplyError(f"adapter {name!r}: no factory for type {spec.type!r}")
    try:
        provider = factory(spec, ctx)
    except AdapterApplyError:
        raise
    except ImportError as e:
        raise AdapterApplyError(
            f"adapter {name!r}: type {spec.type!r} is not available on this node ({e})"
        ) from e
    except Exception as e:
        raise AdapterApplyError(
            f"adapter {name!r}: cannot build {spec.type!r} adapter: {e or type(e).__name__}"
        ) from e
    if not IProvider.providedBy(provider):
        raise AdapterApplyError(
            f"adapter {name!r}: the {spec.type!r} factory did not return an IProvider"
        )
    return provider


@dataclass(frozen=True)
class AdapterInstance:
    """
    One configured adapter instance, its provider and its capacity gate.

    ``provider`` is ``None`` exactly when the instance is disabled: nothing runs on it.
    ``spec`` can hold headers and environment values, so it stays out of ``repr`` (as does the
    provider).
    """

    name: str
    type: str
    enabled: bool
    spec: AdapterSpec = field(repr=False, compare=False)
    gate: CapacityGate = field(repr=False, compare=False)
    provider: IProvider | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_spec(
        cls,
        spec: AdapterSpec,
        ctx: AdapterContext,
        factories: Mapping[str, AdapterFactory] = DEFAULT_FACTORIES,
    ) -> AdapterInstance:
        """
        Build one instance; raises :class:`AdapterApplyError` for an unknown type or a factory
        that fails. An enabled instance's gate is sized by its provider's ``max_concurrency``; a
        disabled one (no provider) by the spec, where 0 means 1.
        """
        name = spec.name
        if spec.type not in KNOWN_ADAPTER_TYPES:
            raise AdapterApplyError(f"adapter {name!r}: unknown type {spec.type!r}")
        limit = spec.max_concurrency or 1
        provider: IProvider | None = None
        if spec.enabled:
            provider = _build_provider(spec, ctx, factories)
            try:
                reported = int(provider.capabilities().max_concurrency)
            except Exception as e:
                raise AdapterApplyError(
                    f"adapter {name!r}: cannot read its capabilities: {e or type(e).__name__}"
                ) from e
            if reported >= 1:
                limit = reported
        return cls(
            name=name,
            type=spec.type,
            enabled=spec.enabled,
            spec=spec,
            gate=CapacityGate(limit),
            provider=provider,
        )

    @property
    def max_concurrency(self) -> int:
        """The gate's limit: at most this many runs and tunnels at once."""
        return self.gate.limit

    def resize(self, max_concurrency: int) -> None:
        """
        A live ``max_concurrency`` change (0, unset on the wire, means 1): the gate takes the
        new limit (raising admits at once; lowering cuts nothing, see
        :meth:`~iop.node.adapters.capacity.CapacityGate.resize`) and the provider, if it can,
        reports it.
        """
        limit = max(1, max_concurrency)
        self.gate.resize(limit)
        resizable = IResizable(self.provider, None)
        if resizable is not None:
            resizable.resize(limit)

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
        by_name: dict[str, AdapterInstance] = {}
        for instance in instances:
            if instance.name in by_name:
                raise AdapterApplyError(f"adapter {instance.name!r}: duplicate instance name")
            by_name[instance.name] = instance
        self._by_name = by_name

    @classmethod
    def from_specs(
        cls,
        specs: Iterable[AdapterSpec],
        ctx: AdapterContext,
        factories: Mapping[str, AdapterFactory] | None = None,
    ) -> AdapterRegistry:
        """
        Apply a payload's adapters, building each enabled instance's provider with ``factories``
        (by type; default :data:`DEFAULT_FACTORIES`). Raises :class:`AdapterApplyError` if they
        do not apply. Names and types are checked for the whole payload before any provider is
        built.
        """
        table = DEFAULT_FACTORIES if factories is None else factories
        specs = list(specs)
        seen: set[str] = set()
        for spec in specs:
            if spec.name in seen:
                raise AdapterApplyError(f"adapter {spec.name!r}: duplicate instance name")
            seen.add(spec.name)
            if spec.type not in KNOWN_ADAPTER_TYPES:
                raise AdapterApplyError(f"adapter {spec.name!r}: unknown type {spec.type!r}")
        return cls(AdapterInstance.from_spec(spec, ctx, table) for spec in specs)

    def get(self, name: str) -> AdapterInstance:
        """The instance with exactly this name (enabled or not), or :class:`UnknownAdapter`."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownAdapter(name) from None

    def resolve(self, reference: str) -> AdapterInstance:
        """
        Resolve an adapter reference the way the Edge's config does: the exact instance name
        first; a legacy type name only when exactly one enabled instance has that type.
        """
        if reference in self._by_name:
            return self._by_name[reference]
        candidates = [i for i in self._by_name.values() if i.type == reference and i.enabled]
        if len(candidates) == 1:
            return candidates[0]
        raise UnknownAdapter(reference)

    def instances(self) -> tuple[AdapterInstance, ...]:
        """Every instance, in payload order."""
        return tuple(self._by_name.values())

    def describe(self) -> list[dict[str, object]]:
        return [instance.describe() for instance in self._by_name.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[AdapterInstance]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"<AdapterRegistry {sorted(self._by_name)}>"
