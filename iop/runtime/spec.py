# -*- test-case-name: iop.test.runtime.test_spec -*-
"""
What one adapter instance is configured to be: :class:`AdapterSpec` and its resolved protocol
:class:`RuntimeProfile`.

These are the runtime vocabulary's form of the ``AdapterConfig`` / ``RuntimeProfile`` messages of
a ``NodeConfigPayload``: the Node converts the payload once, where it applies it
(:func:`iop.wire.convert.adapter_specs`), and adapters see only these frozen objects, never
protobuf. Field names and units are the wire's (``*_ms`` are milliseconds, 0 means "not set").

Both are immutable all the way down: sequences become tuples and maps read-only mappings, whatever
they were built from. Headers, environment and settings can hold credentials: an
:class:`AdapterSpec`'s ``repr`` names the instance only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

__all__ = ["AdapterSpec", "RuntimeProfile"]

_V = TypeVar("_V")


def _frozen_map(value: Mapping[str, _V]) -> Mapping[str, _V]:
    return MappingProxyType(dict(value))


def _freeze(instance: object, maps: Iterable[str], sequences: Iterable[str]) -> None:
    for name in maps:
        object.__setattr__(instance, name, _frozen_map(getattr(instance, name)))
    for name in sequences:
        object.__setattr__(instance, name, tuple(getattr(instance, name)))


@dataclass(frozen=True)
class RuntimeProfile:
    """
    The protocol profile an HTTP provider speaks (``protocol_profiles`` + ``providers[].profile``
    on the Edge): its driver, the provider path of each named operation, and the header that
    carries its credential.
    """

    name: str
    # A name in iop.runtime.kinds.PROTOCOL_DRIVERS: openai_chat, openai_responses, ...
    driver: str = ""
    # Named operations and their provider paths, e.g. chat_completions -> /chat/completions.
    operations: Mapping[str, str] = field(default_factory=dict)
    # chat, messages, streaming, tools, count_tokens.
    capabilities: tuple[str, ...] = ()
    # thinking, reasoning, ...
    extensions: Mapping[str, bool] = field(default_factory=dict)
    # The header that carries the credential, e.g. Authorization or x-api-key ("" = default).
    auth_header: str = ""
    # What precedes a leased credential in ``auth_header`` ("Bearer"); "" = the bare credential.
    auth_scheme: str = ""

    def __post_init__(self) -> None:
        _freeze(self, ("operations", "extensions"), ("capabilities",))


@dataclass(frozen=True)
class AdapterSpec:
    """
    One adapter instance's configuration. An empty ``name`` is the legacy single instance of
    its ``type`` and is named after the type. ``max_concurrency`` 0 means 1.

    HTTP providers use ``base_url``, ``headers``, the timeouts and ``profile``; CLI agents
    ``command``, ``args``, ``env``, ``workspace``, ``mode``, ``resume_args``, ``output_format``
    and ``prompt_placement``; ``settings`` holds adapter-specific extras.
    """

    name: str
    type: str
    enabled: bool = True
    base_url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    request_timeout_ms: int = 0
    idle_timeout_ms: int = 0
    max_concurrency: int = 1
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workspace: str = ""
    mode: str = ""
    resume_args: tuple[str, ...] = ()
    output_format: str = ""
    prompt_placement: str = ""
    context_size: int = 0
    profile: RuntimeProfile | None = None
    settings: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.type)
        _freeze(self, ("headers", "env", "settings"), ("args", "resume_args"))

    def __repr__(self) -> str:
        # Never the headers, environment, settings or URL: they can carry credentials.
        return f"AdapterSpec(name={self.name!r}, type={self.type!r}, enabled={self.enabled!r})"
