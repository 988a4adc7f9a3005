# -*- test-case-name: iop.test.wire.test_convert -*-
"""
The runtime vocabulary (:mod:`iop.runtime`) in its protobuf form and back: ``Usage`` and
``RunEvent``. The one place that knows both, so adapters and the runtime never see protobuf.
"""

from __future__ import annotations

from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.wire import runtime_pb2 as pb

__all__ = ["event_from_proto", "event_to_proto", "usage_from_proto", "usage_to_proto"]


def usage_to_proto(usage: Usage) -> pb.Usage:
    message = pb.Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    if usage.reasoning_tokens is not None:
        message.reasoning_tokens = usage.reasoning_tokens
    if usage.cached_input_tokens is not None:
        message.cached_input_tokens = usage.cached_input_tokens
    return message


def usage_from_proto(message: pb.Usage) -> Usage:
    return Usage(
        input_tokens=message.input_tokens,
        output_tokens=message.output_tokens,
        reasoning_tokens=(
            message.reasoning_tokens if message.HasField("reasoning_tokens") else None
        ),
        cached_input_tokens=(
            message.cached_input_tokens if message.HasField("cached_input_tokens") else None
        ),
    )


def event_to_proto(
    event: RuntimeEvent, run_id: str, sequence: int, timestamp_ms: int = 0
) -> pb.RunEvent:
    message = pb.RunEvent(
        run_id=run_id,
        sequence=sequence,
        type=event.type.value,
        delta=event.delta,
        error=event.error,
        session_id=event.session_id,
        timestamp_unix_ms=timestamp_ms,
    )
    if event.usage is not None:
        message.usage.CopyFrom(usage_to_proto(event.usage))
    message.metadata.update(dict(event.metadata))
    return message


def event_from_proto(message: pb.RunEvent) -> RuntimeEvent:
    """A wire event; an unknown ``type`` becomes an ``error`` event that says so."""
    try:
        kind = EventType(message.type)
    except ValueError:
        kind = EventType.ERROR
    return RuntimeEvent(
        type=kind,
        delta=message.delta,
        error=message.error
        if kind.value == message.type
        else f"unknown event type {message.type!r}",
        usage=usage_from_proto(message.usage) if message.HasField("usage") else None,
        metadata=dict(message.metadata),
        session_id=message.session_id,
    )
