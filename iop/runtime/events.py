# -*- test-case-name: iop.test.runtime.test_events -*-
"""
Run events and usage. Their protobuf form lives on the wire side (:mod:`iop.wire.convert`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class EventType(enum.StrEnum):
    START = "start"
    DELTA = "delta"
    REASONING_DELTA = "reasoning_delta"
    COMPLETE = "complete"
    ERROR = "error"
    CANCELLED = "cancelled"


TERMINAL_TYPES = frozenset({EventType.COMPLETE, EventType.ERROR, EventType.CANCELLED})


@dataclass(frozen=True)
class Usage:
    """
    Token counts as the provider reported them, in OpenAI's way of counting:
    ``input_tokens`` is the whole prompt, of which ``cached_input_tokens`` were read from a
    prompt cache and ``cache_write_tokens`` written to one (Anthropic's cache creation);
    ``output_tokens`` is the whole answer, of which ``reasoning_tokens`` were reasoning. The
    details are None unless the provider reported them; never estimated.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None

    def as_dict(self) -> dict[str, int]:
        out = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.reasoning_tokens is not None:
            out["reasoning_tokens"] = self.reasoning_tokens
        if self.cached_input_tokens is not None:
            out["cached_input_tokens"] = self.cached_input_tokens
        if self.cache_write_tokens is not None:
            out["cache_write_tokens"] = self.cache_write_tokens
        return out


@dataclass(frozen=True)
class RuntimeEvent:
    """
    One event of a run. ``delta`` carries text for ``delta``/``reasoning_delta``; ``error`` the
    reason of an ``error``/``cancelled``; ``usage`` usually rides the ``complete`` event;
    ``metadata`` carries adapter facts such as ``openai_tool_calls`` (a JSON array).
    """

    type: EventType
    delta: str = ""
    error: str = ""
    usage: Usage | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    session_id: str = ""

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES

    @classmethod
    def start(cls, session_id: str = "") -> RuntimeEvent:
        return cls(EventType.START, session_id=session_id)

    @classmethod
    def text(cls, delta: str) -> RuntimeEvent:
        return cls(EventType.DELTA, delta=delta)

    @classmethod
    def reasoning(cls, delta: str) -> RuntimeEvent:
        return cls(EventType.REASONING_DELTA, delta=delta)

    @classmethod
    def complete(
        cls,
        usage: Usage | None = None,
        metadata: Mapping[str, str] | None = None,
        session_id: str = "",
    ) -> RuntimeEvent:
        return cls(EventType.COMPLETE, usage=usage, metadata=metadata or {}, session_id=session_id)

    @classmethod
    def failed(cls, error: str, metadata: Mapping[str, str] | None = None) -> RuntimeEvent:
        return cls(EventType.ERROR, error=error, metadata=metadata or {})

    @classmethod
    def cancelled(cls, reason: str = "cancelled") -> RuntimeEvent:
        return cls(EventType.CANCELLED, error=reason)
