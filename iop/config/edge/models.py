# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
``models:`` in edge.yaml: the model ids clients ask for, each served by one or more providers
(``nodes[].providers[]`` ids, optionally with the upstream ``target`` model to ask for), with
its display name, token defaults, token counter and price.

``price`` is per million tokens in ``usage.currency``::

    price: {input: 3.0, output: 15.0, cached_input: 0.3, cache_write: 3.75, reasoning: 15.0}

``input`` and ``output`` are required; ``cached_input`` and ``cache_write`` default to
``input``, ``reasoning`` to ``output``. A price is a number >= 0 (a local model may cost
nothing) with at most six decimals: it is held as integer micro-units per million tokens
(:class:`~iop.config.model.Price`), so every cost is exact integer arithmetic and a finer price
would be silently rounded. No ``price``: the model's cost is unknown, never invented.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from iop.config.edge import links
from iop.config.edge.known import ProviderIndex
from iop.config.errors import MISSING, Section, as_section, type_name
from iop.config.model import MICROS_PER_UNIT, TOKEN_COUNTERS, ModelConfig, ModelProviderRef, Price

__all__ = ["models_section", "price_section"]


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
        price = price_section(section)
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
                price=price,
            )
        )
    return tuple(result)


def price_section(model: Section) -> Price | None:
    """``models[].price`` as a :class:`Price` (defaults filled in); None when absent or bad."""
    section = model.section("price")
    if section is None:
        return None
    before = len(section.issues)
    given = {
        name: _micros(section, name, required=name in ("input", "output"))
        for name in ("input", "output", "cached_input", "cache_write", "reasoning")
    }
    section.finish()
    input_price, output_price = given["input"], given["output"]
    if len(section.issues) > before or input_price is None or output_price is None:
        return None
    return Price(
        input=input_price,
        output=output_price,
        cached_input=_or(given["cached_input"], input_price),
        cache_write=_or(given["cache_write"], input_price),
        reasoning=_or(given["reasoning"], output_price),
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _micros(section: Section, key: str, *, required: bool) -> int | None:
    """A price per million tokens as micro-units: a number >= 0 with at most six decimals."""
    value = section.require(key) if required else section.raw(key)
    if value is MISSING:
        return None
    path = section.path_of(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        section.issues.add(path, f"must be a number, got {type_name(value)}")
        return None
    # The decimal the YAML spelled (repr of a float is its shortest round-trip text).
    exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    if not exact.is_finite():
        section.issues.add(path, "must be a finite number")
        return None
    if exact < 0:
        section.issues.add(path, "must be >= 0")
        return None
    micros = exact * MICROS_PER_UNIT
    if micros != micros.to_integral_value():
        section.issues.add(path, "must have at most 6 decimal places")
        return None
    return int(micros)


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
