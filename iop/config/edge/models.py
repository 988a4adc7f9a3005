# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
``models:`` in edge.yaml: the model ids clients ask for, each served by one or more providers
(``nodes[].providers[]`` ids, optionally with the upstream ``target`` model to ask for), with
its display name, token defaults and token counter.
"""

from __future__ import annotations

from collections.abc import Mapping

from iop.config.edge import links
from iop.config.edge.known import ProviderIndex
from iop.config.errors import Section, as_section, type_name
from iop.config.model import TOKEN_COUNTERS, ModelConfig, ModelProviderRef

__all__ = ["models_section"]


def models_section(top: Section, providers: ProviderIndex) -> tuple[ModelConfig, ...]:
    """Every ``models[]`` entry, its providers resolved against ``providers``."""
    issues = top.issues
    result: list[ModelConfig] = []
    ids: dict[str, str] = {}
    for path, item in top.items("models") or ():
        section = as_section(issues, path, item)
        if section is None:
            continue
        model_id = section.string("id", required=True)
        if model_id in ids:
            issues.add(
                section.path_of("id"), f"duplicate model id {model_id!r} (also {ids[model_id]})"
            )
        elif model_id:
            ids[model_id] = path
        display_name = section.string("display_name")
        refs = _model_providers(section, model_id, providers)
        default_max = section.optional_integer("default_max_tokens", minimum=1)
        min_max = section.optional_integer("min_max_tokens", minimum=1)
        if default_max is not None and min_max is not None and min_max > default_max:
            issues.add(
                section.path_of("min_max_tokens"),
                f"must be <= default_max_tokens ({default_max})",
            )
        thinking = section.optional_integer("default_thinking_token_budget", minimum=0)
        counter = section.string("token_counter")
        if counter and counter not in TOKEN_COUNTERS:
            issues.add(
                section.path_of("token_counter"),
                f"unknown token counter {counter!r} (one of: {', '.join(sorted(TOKEN_COUNTERS))})",
            )
        section.finish()
        result.append(
            ModelConfig(
                id=model_id,
                providers=refs,
                display_name=display_name,
                default_max_tokens=default_max,
                min_max_tokens=min_max,
                default_thinking_token_budget=thinking,
                token_counter=counter,
            )
        )
    return tuple(result)


def _model_providers(
    model: Section, model_id: str, providers: ProviderIndex
) -> tuple[ModelProviderRef, ...]:
    """``providers``: ids, or ``{id, target}`` mappings; at least one, none twice."""
    issues = model.issues
    items = model.items("providers", required=True)
    if items is not None and not items:
        issues.add(model.path_of("providers"), "must list at least one provider")
    refs: list[ModelProviderRef] = []
    seen: set[str] = set()
    for path, item in items or ():
        provider_id = ""
        explicit_target: str | None = None
        id_path = path
        if isinstance(item, str):
            provider_id = item
        elif isinstance(item, Mapping):
            entry = as_section(issues, path, item)
            if entry is None:
                continue
            provider_id = entry.string("id", required=True)
            id_path = entry.path_of("id")
            if entry.has("target"):
                explicit_target = entry.string("target", required=True)
            else:
                entry.raw("target")
            entry.finish()
        else:
            issues.add(
                path,
                "must be a provider id or a mapping {id: ..., target: ...}, "
                f"got {type_name(item)}",
            )
            continue
        if not provider_id:
            if isinstance(item, str):
                issues.add(path, "must not be empty")
            continue
        if provider_id in seen:
            issues.add(id_path, f"duplicate provider {provider_id!r} in this model")
            continue
        seen.add(provider_id)
        target = links.provider_target(
            issues,
            providers,
            provider_id,
            id_path=id_path,
            path=path,
            model_id=model_id,
            explicit=explicit_target,
        )
        if target is not None:
            refs.append(ModelProviderRef(provider_id=provider_id, target=target))
    return tuple(refs)
