# -*- test-case-name: iop.test.runtime.test_kinds -*-
"""
What a provider kind is, stated once: the adapter types a node runs (:data:`PROVIDER_KINDS`) and
the protocol drivers an HTTP provider's profile speaks (:data:`PROTOCOL_DRIVERS`).

Both sides read this table: the Edge's config (which ``type`` and ``driver`` values exist, which
providers may name a credential slot), its routes and gateway (which wire a provider takes, which
adapters managed mode reaches only through a lease), the client surfaces (what images a provider
takes, which driver a profile-less provider speaks), the admin API (which operations carry
``stream``), and the node (which adapter types its registry builds, an operation's default
provider path, which operations report usage). Adding a provider kind is one row here and one
adapter module (``iop.node.adapters.<name>`` with ``build(spec, ctx)``).

A row per adapter kind (:class:`ProviderKind`):

- ``wire``: :attr:`Wire.TUNNEL` — the Edge sends the client's HTTP request through a raw
  provider tunnel, and the node's adapter is an ``ITunnelProvider``; :attr:`Wire.RUN` — a
  normalized ``RunRequest`` that the adapter turns into the provider's own API.
- ``leased_credential``: in managed mode the provider's credential comes per request, sealed in
  a lease (only a tunnel carries one), and the provider is reached no other way.
- ``images``: what a request bridged to this kind may carry as images.
- ``default_driver``: the protocol driver a provider of this kind speaks when its config names
  no profile ("" for run kinds: a run has no protocol of its own on the wire).

A row per protocol driver (:class:`ProtocolDriver`): the operation that generates
(``generate``) and every operation it serves with its default provider path (a profile's
``operations`` override the path).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ADAPTER_KINDS",
    "ANTHROPIC_MESSAGES",
    "DRIVER_NAMES",
    "GENERATE_OPERATIONS",
    "LEASED_KINDS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "OPERATION_PATHS",
    "PROTOCOL_DRIVERS",
    "PROVIDER_KINDS",
    "TUNNEL_KINDS",
    "Images",
    "ProtocolDriver",
    "ProviderKind",
    "Wire",
    "default_operation_path",
    "images_of",
    "wire_of",
]


class Wire(enum.StrEnum):
    """How the Edge reaches a provider through its node."""

    TUNNEL = "tunnel"
    RUN = "run"


class Images(enum.StrEnum):
    """What a provider takes as images in a bridged request."""

    ANY = "any"
    BASE64 = "base64"
    NONE = "none"


@dataclass(frozen=True)
class ProtocolDriver:
    """One protocol driver a profile names (``protocol_profiles[].driver``)."""

    name: str
    # The operation that generates: what a client's generation request becomes upstream.
    generate: str
    # Every operation the driver serves and its default provider path.
    operations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "operations", MappingProxyType(dict(self.operations)))


@dataclass(frozen=True)
class ProviderKind:
    """One adapter kind (``nodes[].adapters[].type``, ``nodes[].providers[].type``)."""

    name: str
    wire: Wire
    leased_credential: bool
    images: Images
    # The driver of a provider configured without a profile; "" for run kinds.
    default_driver: str = ""


OPENAI_CHAT = ProtocolDriver(
    "openai_chat",
    "chat_completions",
    {"chat_completions": "/chat/completions", "models": "/models"},
)
OPENAI_RESPONSES = ProtocolDriver(
    "openai_responses", "responses", {"responses": "/responses", "models": "/models"}
)
ANTHROPIC_MESSAGES = ProtocolDriver(
    "anthropic_messages",
    "messages",
    {"messages": "/messages", "count_tokens": "/messages/count_tokens", "models": "/models"},
)

#: Every protocol driver, by name.
PROTOCOL_DRIVERS: Mapping[str, ProtocolDriver] = MappingProxyType(
    {d.name: d for d in (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC_MESSAGES)}
)

#: Every provider kind (adapter type), by name.
PROVIDER_KINDS: Mapping[str, ProviderKind] = MappingProxyType(
    {
        k.name: k
        for k in (
            # OpenAI-compatible HTTP APIs (hosted or local servers).
            ProviderKind(
                "openai_compat",
                wire=Wire.TUNNEL,
                leased_credential=True,
                images=Images.ANY,
                default_driver=OPENAI_CHAT.name,
            ),
            # A vLLM server: openai_compat plus vLLM's own usage dialect.
            ProviderKind(
                "vllm",
                wire=Wire.TUNNEL,
                leased_credential=True,
                images=Images.ANY,
                default_driver=OPENAI_CHAT.name,
            ),
            # Ollama's own API, driven by the node's adapter (images as base64 only).
            ProviderKind("ollama", wire=Wire.RUN, leased_credential=False, images=Images.BASE64),
            # A CLI coding agent (claude, codex, gemini) run as a process; text only.
            ProviderKind("cli", wire=Wire.RUN, leased_credential=False, images=Images.NONE),
        )
    }
)

# Views of the table, for the places that ask one question of every row.

#: The adapter types config accepts and a node's registry builds.
ADAPTER_KINDS = frozenset(PROVIDER_KINDS)
#: The kinds reached through the raw provider tunnel.
TUNNEL_KINDS = frozenset(k.name for k in PROVIDER_KINDS.values() if k.wire is Wire.TUNNEL)
#: The kinds whose credential comes sealed in a lease (managed mode), and only that way.
LEASED_KINDS = frozenset(k.name for k in PROVIDER_KINDS.values() if k.leased_credential)
#: The drivers a protocol profile may name.
DRIVER_NAMES = frozenset(PROTOCOL_DRIVERS)
#: The operations that generate (their request body carries ``stream``; their answer usage).
GENERATE_OPERATIONS = frozenset(d.generate for d in PROTOCOL_DRIVERS.values())


def _operation_paths(drivers: Mapping[str, ProtocolDriver]) -> Mapping[str, str]:
    """Every operation's default path; an operation two drivers share has one path."""
    paths: dict[str, str] = {}
    for driver in drivers.values():
        for operation, path in driver.operations.items():
            if paths.setdefault(operation, path) != path:
                raise ValueError(f"operation {operation!r} has two default paths")
    return MappingProxyType(paths)


#: Each operation's default provider path, whichever driver serves it.
OPERATION_PATHS = _operation_paths(PROTOCOL_DRIVERS)


def wire_of(kind: str) -> Wire:
    """The wire a provider of ``kind`` takes; an unknown kind (or none) takes a run."""
    row = PROVIDER_KINDS.get(kind)
    return row.wire if row is not None else Wire.RUN


def images_of(kind: str) -> Images:
    """What a provider of ``kind`` takes as images; an unknown kind (or none) takes none."""
    row = PROVIDER_KINDS.get(kind)
    return row.images if row is not None else Images.NONE


def default_operation_path(operation: str) -> str:
    """The provider path of ``operation`` when the adapter's profile names none, or ""."""
    return OPERATION_PATHS.get(operation, "")
