# -*- test-case-name: iop.test.edge.ingress.test_profiles -*-
"""
What a provider's protocol profile lets the Anthropic surface do.

A ``/v1/messages`` request reaches a provider one of three ways:

- :attr:`Route.NATIVE`: the profile's driver is ``anthropic_messages`` and it has the ``messages``
  capability and a ``messages`` operation; the request body goes to the provider as it is.
- :attr:`Route.BRIDGE`: the profile's driver is ``openai_chat`` with the ``chat`` capability and a
  ``chat_completions`` operation; :mod:`iop.edge.ingress.bridge` turns the request into a Chat
  Completions request and the answer back into a Messages answer.
- :attr:`Route.OVER_RESPONSES`: the profile's driver is ``openai_responses``; the bridge's Chat
  request is translated once more (:mod:`iop.edge.ingress.chat_responses`) and the provider's
  Responses answer decoded back. The driver is all it needs, as for the native Responses route
  (its one generating operation is ``responses``, at the profile's path or the driver's
  default): no capability names it.

Every way, a streaming request needs the ``streaming`` capability and a request with ``tools``
the ``tools`` capability. Thinking blocks cross the Chat bridge only when the profile's
``extensions.thinking`` or ``extensions.reasoning`` is true. ``/v1/messages/count_tokens`` is
answered upstream (the native fallback, when the model has no local token counter) only by an
``anthropic_messages`` profile with the ``count_tokens`` capability and operation; a Chat profile
never answers it.

A provider **without a profile** (Ollama and CLI agents reached through normalized runs, or an
``openai_compat`` adapter configured without one) is treated as a plain chat backend: the bridge
is allowed, with streaming and tools; thinking blocks are not; native count_tokens is not
available.
"""

from __future__ import annotations

import enum

from iop.config.model import ProfileConfig
from iop.runtime.kinds import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES

__all__ = [
    "Route",
    "Unsupported",
    "check_count_tokens",
    "check_messages",
    "thinking_allowed",
]

DRIVER_ANTHROPIC = ANTHROPIC_MESSAGES.name
DRIVER_CHAT = OPENAI_CHAT.name
DRIVER_RESPONSES = OPENAI_RESPONSES.name
THINKING_EXTENSIONS = ("thinking", "reasoning")
# For error messages: what a profile needs for thinking over the Chat bridge.
THINKING_REQUIREMENT = "extensions.thinking or extensions.reasoning"


class Route(enum.StrEnum):
    NATIVE = "native"
    BRIDGE = "bridge"
    OVER_RESPONSES = "over_responses"


class Unsupported(Exception):
    """The provider's profile cannot serve the request; ``message`` is safe to show a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _has(profile: ProfileConfig, capability: str, operation: str) -> bool:
    return capability in profile.capabilities and any(
        name == operation for name, _ in profile.operations
    )


def _missing(profile: ProfileConfig, capability: str, operation: str) -> str:
    parts = []
    if capability not in profile.capabilities:
        parts.append(f"the {capability!r} capability")
    if not any(name == operation for name, _ in profile.operations):
        parts.append(f"a {operation!r} operation")
    return " and ".join(parts)


def check_messages(profile: ProfileConfig | None, *, stream: bool, tools: bool) -> Route:
    """
    How a Messages request (``stream``, with ``tools``) reaches a provider with ``profile``;
    raises :class:`Unsupported` when it cannot.
    """
    if profile is None:
        return Route.BRIDGE
    if profile.driver == DRIVER_RESPONSES:
        _check_features(profile, stream=stream, tools=tools)
        return Route.OVER_RESPONSES
    if profile.driver == DRIVER_ANTHROPIC:
        route, capability, operation = Route.NATIVE, "messages", "messages"
    elif profile.driver == DRIVER_CHAT:
        route, capability, operation = Route.BRIDGE, "chat", "chat_completions"
    else:
        raise Unsupported(
            f"protocol profile {profile.name!r} (driver {profile.driver!r}) cannot serve "
            "Anthropic Messages: it needs driver anthropic_messages, openai_chat or "
            "openai_responses"
        )
    if not _has(profile, capability, operation):
        raise Unsupported(
            f"protocol profile {profile.name!r} cannot serve Anthropic Messages: it lacks "
            f"{_missing(profile, capability, operation)}"
        )
    _check_features(profile, stream=stream, tools=tools)
    return route


def _check_features(profile: ProfileConfig, *, stream: bool, tools: bool) -> None:
    """Streaming needs the ``streaming`` capability, tools the ``tools`` capability."""
    if stream and "streaming" not in profile.capabilities:
        raise Unsupported(
            f"protocol profile {profile.name!r} does not support streaming "
            "(no 'streaming' capability)"
        )
    if tools and "tools" not in profile.capabilities:
        raise Unsupported(
            f"protocol profile {profile.name!r} does not support tools (no 'tools' capability)"
        )


def thinking_allowed(profile: ProfileConfig | None) -> bool:
    """Whether thinking blocks may cross the Chat bridge for ``profile``."""
    if profile is None:
        return False
    return any(name in THINKING_EXTENSIONS and on for name, on in profile.extensions)


def check_count_tokens(profile: ProfileConfig | None) -> Route:
    """
    Whether a provider with ``profile`` can answer ``/v1/messages/count_tokens`` upstream:
    :attr:`Route.NATIVE`, or :class:`Unsupported`. (A model with a local token counter never
    asks: see :mod:`iop.edge.ingress.tokens`.)
    """
    if profile is None:
        raise Unsupported(
            "count_tokens needs a provider with an anthropic_messages protocol profile"
        )
    if profile.driver != DRIVER_ANTHROPIC:
        raise Unsupported(
            f"protocol profile {profile.name!r} (driver {profile.driver!r}) cannot count tokens: "
            "count_tokens needs driver anthropic_messages"
        )
    if not _has(profile, "count_tokens", "count_tokens"):
        raise Unsupported(
            f"protocol profile {profile.name!r} cannot count tokens: it lacks "
            f"{_missing(profile, 'count_tokens', 'count_tokens')}"
        )
    return Route.NATIVE
