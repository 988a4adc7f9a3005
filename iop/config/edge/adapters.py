# -*- test-case-name: iop.test.config.test_edge_config -*-
"""
``nodes[].adapters`` in edge.yaml: the adapter instances a node runs (a list of named,
typed instances, or the legacy ``{type: settings}`` mapping with one instance per type), each
with its upstream URL, headers, timeouts, concurrency and the CLI fields.

``max_concurrency`` is optional: left out (``None``), the node's gate for the instance follows
the providers it serves — the Edge sends the sum of its enabled providers' ``capacity``
(:func:`iop.edge.payload.adapter_limit`) — so a capacity changed live never meets a node gate
sized for the old one. Given, it is a ceiling the providers' capacities must fit under
(:func:`iop.config.edge.links.adapter_capacity`): a config that would have the node refuse what
the pool grants is an error at load, not a 503 after an "applied".

``${VAR}`` references are resolved in ``headers`` and ``env`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from iop.config.checks import HEADER_NAME
from iop.config.edge.known import AdapterEntry
from iop.config.errors import MISSING, Issues, Section, as_list, as_section, key_path
from iop.config.model import AdapterConfig
from iop.config.secrets import resolve_references
from iop.runtime.kinds import ADAPTER_KINDS

__all__ = ["ADAPTER_OUTPUT_FORMATS", "adapters_list"]

ADAPTER_OUTPUT_FORMATS = frozenset({"", "text", "json", "stream-json"})

_LEGACY_REJECTED = {
    "name": "not allowed in the legacy adapters mapping; use the list form to name instances",
    "type": "not allowed in the legacy adapters mapping (the key is the type); use the list "
    "form to name instances",
}


def adapters_list(node: Section, node_id: str, *, environ: Mapping[str, str]) -> list[AdapterEntry]:
    """
    The node's adapter instances in document order. An entry that could not be read at all
    stands as an unnamed, not-ok entry, so that a provider's reference to it is not reported.
    """
    issues = node.issues
    raw = node.raw("adapters")
    path = node.path_of("adapters")
    if raw is MISSING:
        return []
    result: list[AdapterEntry] = []
    unreadable = AdapterEntry(AdapterConfig(name="", type=""), ok=False)
    if isinstance(raw, Mapping):
        # Legacy single-instance form: {type: settings}; each becomes an instance named
        # after its type.
        legacy = as_section(issues, path, raw)
        if legacy is None:
            return [unreadable]
        for adapter_type, value in legacy.data.items():
            entry_path = legacy.path_of(adapter_type)
            if adapter_type not in ADAPTER_KINDS:
                shown = ", ".join(sorted(ADAPTER_KINDS))
                issues.add(entry_path, f"unknown adapter type {adapter_type!r} (one of: {shown})")
                result.append(unreadable)
                continue
            entry = Section(issues, entry_path, {})
            if value is not None:
                checked = as_section(issues, entry_path, value)
                if checked is None:
                    result.append(unreadable)
                    continue
                entry = checked
            before = len(issues)
            config = _adapter_fields(
                entry, adapter_type, adapter_type, environ, rejected=_LEGACY_REJECTED
            )
            result.append(
                AdapterEntry(
                    config,
                    len(issues) == before,
                    _header_paths(entry),
                    entry.path_of("max_concurrency"),
                )
            )
        return result

    items = as_list(issues, path, raw)
    if items is None:
        return [unreadable]
    names: dict[str, str] = {}
    for item_path, item in items:
        entry_ = as_section(issues, item_path, item)
        if entry_ is None:
            result.append(unreadable)
            continue
        before = len(issues)
        type_ = entry_.choice("type", ADAPTER_KINDS, required=True)
        name = entry_.string("name", type_, nonempty=True)
        if name in names:
            issues.add(
                entry_.path_of("name") if entry_.has("name") else item_path,
                f"duplicate adapter instance name {name!r} on node {node_id!r} "
                f"(also {names[name]}); give each instance a unique name",
            )
        elif name:
            names[name] = item_path
        config = _adapter_fields(entry_, name, type_, environ)
        result.append(
            AdapterEntry(
                config,
                len(issues) == before,
                _header_paths(entry_),
                entry_.path_of("max_concurrency"),
            )
        )
    return result


def _adapter_fields(
    section: Section,
    name: str,
    type_: str,
    environ: Mapping[str, str],
    rejected: Mapping[str, str] | None = None,
) -> AdapterConfig:
    issues = section.issues
    enabled = section.boolean("enabled", True)
    base_url = section.string("base_url")
    if base_url:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            hint = (
                " (${...} references are only resolved in headers, env and tokens)"
                if "${" in base_url
                else ""
            )
            issues.add(section.path_of("base_url"), f"must be an http:// or https:// URL{hint}")
    headers = _headers(section, issues, environ)
    env: list[tuple[str, str]] = []
    for path, key, value in section.string_map("env"):
        if "=" in key or "\0" in key:
            issues.add(path, "is not a valid environment variable name")
        env.append((key, resolve_references(issues, path, value, environ)))
    config = AdapterConfig(
        name=name,
        type=type_,
        enabled=enabled,
        base_url=base_url,
        headers=headers,
        request_timeout_ms=section.integer("request_timeout_ms", 0, minimum=0),
        idle_timeout_ms=section.integer("idle_timeout_ms", 0, minimum=0),
        max_concurrency=section.optional_integer("max_concurrency", minimum=1),
        command=section.string("command"),
        args=section.string_list("args", scalars=True),
        env=tuple(env),
        workspace=section.string("workspace"),
        mode=section.string("mode"),
        resume_args=section.string_list("resume_args", scalars=True),
        output_format=section.choice("output_format", ADAPTER_OUTPUT_FORMATS),
        prompt_placement=section.string("prompt_placement"),
        context_size=section.integer("context_size", 0, minimum=0),
        settings=tuple((key, value) for _, key, value in section.string_map("settings")),
    )
    section.finish(rejected)
    return config


def _headers(
    section: Section, issues: Issues, environ: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """``headers``: valid names, ``${VAR}`` resolved, no line break or NUL in a value."""
    headers: list[tuple[str, str]] = []
    for path, key, value in section.string_map("headers"):
        if not HEADER_NAME.match(key):
            issues.add(path, "is not a valid HTTP header name")
        resolved = resolve_references(issues, path, value, environ)
        if any(ch in resolved for ch in "\r\n\0"):
            issues.add(path, "must not contain a line break or NUL (after ${...} resolution)")
        headers.append((key, resolved))
    return tuple(headers)


def _header_paths(adapter: Section) -> tuple[tuple[str, str], ...]:
    """``(header name, path)`` of each entry of an adapter's ``headers`` (already read)."""
    headers = adapter.data.get("headers")
    if not isinstance(headers, Mapping):
        return ()
    return tuple(
        (name, key_path(adapter.path_of("headers"), name))
        for name in headers
        if isinstance(name, str)
    )
