# -*- test-case-name: iop.test.wire.test_convert -*-
"""
The runtime vocabulary (:mod:`iop.runtime`) in its protobuf form and back: ``Usage`` and
``RunEvent`` both ways, and a config payload's adapters as :class:`AdapterSpec`. The one place
that knows both, so adapters and the runtime never see protobuf.
"""

from __future__ import annotations

from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.spec import AdapterSpec, RuntimeProfile
from iop.wire import runtime_pb2 as pb

__all__ = [
    "adapter_spec",
    "adapter_specs",
    "event_from_proto",
    "event_to_proto",
    "runtime_profile",
    "usage_from_proto",
    "usage_to_proto",
]


def usage_to_proto(usage: Usage) -> pb.Usage:
    message = pb.Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    if usage.reasoning_tokens is not None:
        message.reasoning_tokens = usage.reasoning_tokens
    if usage.cached_input_tokens is not None:
        message.cached_input_tokens = usage.cached_input_tokens
    if usage.cache_write_tokens is not None:
        message.cache_write_tokens = usage.cache_write_tokens
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
        cache_write_tokens=(
            message.cache_write_tokens if message.HasField("cache_write_tokens") else None
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


def runtime_profile(message: pb.RuntimeProfile) -> RuntimeProfile:
    return RuntimeProfile(
        name=message.name,
        driver=message.driver,
        operations=dict(message.operations),
        capabilities=tuple(message.capabilities),
        extensions=dict(message.extensions),
        auth_header=message.auth_header,
        auth_scheme=message.auth_scheme,
    )


def adapter_spec(message: pb.AdapterConfig) -> AdapterSpec:
    """
    One ``AdapterConfig`` as an :class:`AdapterSpec` (an unnamed one is named after its type;
    ``max_concurrency`` 0, unset on the wire, becomes 1). Nothing is checked here: the Node's
    adapter registry refuses duplicate names and unknown types, each adapter its own fields.
    """
    return AdapterSpec(
        name=message.name or message.type,
        type=message.type,
        enabled=message.enabled,
        base_url=message.base_url,
        headers=dict(message.headers),
        request_timeout_ms=message.request_timeout_ms,
        idle_timeout_ms=message.idle_timeout_ms,
        max_concurrency=message.max_concurrency or 1,
        command=message.command,
        args=tuple(message.args),
        env=dict(message.env),
        workspace=message.workspace,
        mode=message.mode,
        resume_args=tuple(message.resume_args),
        output_format=message.output_format,
        prompt_placement=message.prompt_placement,
        context_size=message.context_size,
        profile=runtime_profile(message.profile) if message.HasField("profile") else None,
        settings=dict(message.settings),
    )


def adapter_specs(payload: pb.NodeConfigPayload) -> list[AdapterSpec]:
    """The adapters of a config payload, in payload order."""
    return [adapter_spec(message) for message in payload.adapters]
