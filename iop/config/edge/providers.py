# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
``nodes[].providers`` in edge.yaml: what a node offers the pool — each provider's id (unique
across the file), its adapter instance, category, models, scheduling limits (priority,
capacity, long-context share, queue), protocol profile and credential slot.

The references a provider makes (its adapter on the node, its profile, its credential slot) are
checked by :mod:`iop.config.edge.links`.
"""

from __future__ import annotations

from iop.config.edge import links
from iop.config.edge.known import (
    AdapterEntry,
    CredentialBinding,
    Profiles,
    ProviderCapacity,
    ProviderIndex,
    ProviderInfo,
    Security,
    Slots,
)
from iop.config.errors import Section, as_section
from iop.config.model import PROVIDER_CATEGORIES, ProviderConfig
from iop.runtime.kinds import ADAPTER_KINDS

__all__ = ["providers_list"]


def providers_list(
    node: Section,
    node_id: str,
    adapters: list[AdapterEntry],
    bindings: dict[str, list[CredentialBinding]],
    *,
    index: ProviderIndex,
    security: Security,
    profiles: Profiles,
    slots: Slots,
    capacities: list[ProviderCapacity] | None = None,
) -> tuple[ProviderConfig, ...]:
    """
    The node's providers. Each is added to ``index`` (for ``models[]``); each enabled,
    slot-bound one to ``bindings`` under its adapter instance (for the managed-mode header
    check); each enabled one whose adapter resolved to ``capacities`` (for the check against
    its adapter's ``max_concurrency``).
    """
    result: list[ProviderConfig] = []
    items = node.items("providers")
    if items is None and node.has("providers"):
        index.complete = False
    for path, item in items or ():
        section = as_section(node.issues, path, item)
        if section is None:
            index.complete = False
            continue
        provider = _provider(
            section,
            node_id,
            adapters,
            index=index,
            security=security,
            profiles=profiles,
            slots=slots,
        )
        result.append(provider)
        if capacities is not None and provider.enabled and provider.adapter_instance:
            capacities.append(
                ProviderCapacity(
                    provider.adapter_instance, section.path_of("capacity"), provider.capacity
                )
            )
        binding = links.credential_binding(provider, profiles)
        if binding is not None:
            bindings.setdefault(provider.adapter_instance, []).append(binding)
    return tuple(result)


def _provider(
    section: Section,
    node_id: str,
    adapters: list[AdapterEntry],
    *,
    index: ProviderIndex,
    security: Security,
    profiles: Profiles,
    slots: Slots,
) -> ProviderConfig:
    issues = section.issues
    provider_id = section.string("id", required=True)
    if not provider_id.strip():
        index.complete = False
    if provider_id in index.by_id:
        issues.add(
            section.path_of("id"),
            f"duplicate provider id {provider_id!r} (also "
            f"{index.by_id[provider_id].path}); provider ids are unique across the "
            "whole config",
        )
    adapter_ref = section.string("adapter", required=True)
    category = section.choice("category", PROVIDER_CATEGORIES, required=True)
    explicit_type = section.choice("type", ADAPTER_KINDS)
    models_before = len(issues)
    models = section.string_list("models", unique=True)
    if section.has("models"):
        if not models and len(issues) == models_before:
            issues.add(section.path_of("models"), "must list at least one model")
    else:
        section.require("models")
    for i, model in enumerate(models):
        if not model.strip():
            issues.add(f"{section.path_of('models')}[{i}]", "must not be empty")
    models_ok = len(issues) == models_before
    enabled = section.boolean("enabled", True)
    priority = section.integer("priority", 0, minimum=0)
    capacity = section.integer("capacity", 1, minimum=1)
    long_threshold = section.integer("long_context_threshold", 0, minimum=0)
    long_capacity = section.integer("long_capacity", 0, minimum=0)
    if long_capacity > capacity:
        issues.add(section.path_of("long_capacity"), f"must be <= capacity ({capacity})")
    max_queue = section.integer("max_queue", 0, minimum=0)
    queue_timeout = section.number("queue_timeout_sec", 0.0, minimum=0)
    profile = section.string("profile")
    links.provider_profile(section, profile, profiles)
    usage_attribution = section.string("usage_attribution")
    credential = section.string("credential", nonempty=True)
    section.finish()

    if provider_id and provider_id not in index.by_id:
        index.by_id[provider_id] = ProviderInfo(section.path, models if models_ok else None)

    instance, type_ = links.provider_adapter(
        section,
        node_id,
        adapters,
        ref=adapter_ref,
        enabled=enabled,
        explicit_type=explicit_type,
        category=category,
    )
    if not enabled and category == "cli" and explicit_type and explicit_type != "cli":
        issues.add(
            section.path_of("category"),
            f"category cli needs a cli adapter, but type is {explicit_type!r}",
        )
    if credential.strip():
        links.provider_credential(
            section,
            credential,
            profile,
            type_,
            security=security,
            slots=slots,
            profiles=profiles,
        )

    return ProviderConfig(
        id=provider_id,
        adapter=adapter_ref,
        category=category,
        adapter_instance=instance,
        type=type_,
        models=models,
        enabled=enabled,
        priority=priority,
        capacity=capacity,
        long_context_threshold=long_threshold,
        long_capacity=long_capacity,
        max_queue=max_queue,
        queue_timeout_sec=queue_timeout,
        profile=profile,
        usage_attribution=usage_attribution,
        credential=credential,
    )
