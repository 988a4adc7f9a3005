# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
What a section of edge.yaml makes known to the sections read after it: the security mode, the
protocol profiles and credential slots by name, each node's adapter instances, the providers by
id. The section modules fill these in; :mod:`iop.config.edge.links` checks the references
against them.

Each one also says whether it is *complete*: ``False`` when an entry could not be read far
enough to learn its name or id, so that a reference that does not resolve may point at it and
is not reported (one mistake, one issue: no cascades).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iop.config.model import AdapterConfig, CredentialSlot, EdgeSecurity, ProfileConfig

__all__ = [
    "AdapterEntry",
    "CredentialBinding",
    "Profiles",
    "ProviderIndex",
    "ProviderInfo",
    "Security",
    "Slots",
]


@dataclass(frozen=True)
class Security:
    """``security:`` as read, and how far the checks that depend on it may trust it."""

    config: EdgeSecurity = field(default_factory=EdgeSecurity)
    # False when security.mode could not be read: the checks that depend on the mode are
    # skipped rather than guessed.
    mode_known: bool = True
    # False when security.trust_domain could not be read (node ids are not checked against it).
    trust_domain_ok: bool = True

    @property
    def managed(self) -> bool:
        return self.config.managed

    @property
    def legacy(self) -> bool:
        """Known to be legacy mode (not merely unreadable)."""
        return self.mode_known and not self.config.managed


@dataclass
class Profiles:
    """``protocol_profiles[]``: every entry read, and the first of each name with its path."""

    configs: tuple[ProfileConfig, ...] = ()
    by_name: dict[str, tuple[str, ProfileConfig]] = field(default_factory=dict)
    complete: bool = True


@dataclass
class Slots:
    """
    ``credentials[]``: every slot whose secret resolved, the first of each name, and every
    name given (a slot whose secret failed still names a slot: references to it are fine).
    """

    configs: tuple[CredentialSlot, ...] = ()
    by_name: dict[str, CredentialSlot] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    complete: bool = True


@dataclass
class AdapterEntry:
    """One ``nodes[].adapters`` instance, as the node's providers resolve it."""

    config: AdapterConfig
    # False if the entry had issues (references to it are not checked further).
    ok: bool
    # (header name, config path) of each ``headers`` entry, for the managed-mode checks.
    header_paths: tuple[tuple[str, str], ...] = ()
    # The path of its ``max_concurrency`` (for the check against its providers' capacities).
    max_concurrency_path: str = ""


@dataclass(frozen=True)
class ProviderCapacity:
    """An enabled provider's ``capacity`` on its resolved adapter instance, with its path."""

    adapter: str
    path: str
    capacity: int


@dataclass(frozen=True)
class CredentialBinding:
    """An enabled provider bound to a credential slot, on its resolved adapter instance."""

    provider_id: str
    slot: str
    # The profile's auth_header, lowercase: the header the lease's credential goes in.
    header: str


@dataclass
class ProviderInfo:
    path: str
    # None when the provider's models list was invalid (model targets are not checked then).
    models: tuple[str, ...] | None


@dataclass
class ProviderIndex:
    """``nodes[].providers[]`` of every node by id (the first of each id), for ``models[]``."""

    by_id: dict[str, ProviderInfo] = field(default_factory=dict)
    complete: bool = True
