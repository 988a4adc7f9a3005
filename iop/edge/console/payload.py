# -*- test-case-name: iop.test.edge.test_console -*-
"""
The console's view of a bus event: the SSE event name and the JSON object it carries.

``node`` for a :class:`~iop.edge.events.NodeEvent` (kind, node_id, reason, outcome, at);
``request`` for a finished client request (surface, operation, model, provider_id, node_id,
status, outcome, error_code, stream, duration, time_to_first_token, queue_wait, the token
counts, at). Only those fields, by name: never a principal, a key or anything else an event
might grow. Any other event is not the console's (``None``).

"""

from __future__ import annotations

from typing import Any

from iop.edge.events import NodeEvent, RequestFinished

NODE = "node"
REQUEST = "request"

_REQUEST_FIELDS = (
    "surface",
    "operation",
    "model",
    "provider_id",
    "node_id",
    "status",
    "outcome",
    "error_code",
    "stream",
    "duration",
    "time_to_first_token",
    "queue_wait",
    "at",
)
_TOKEN_FIELDS = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")


def shown(event: object) -> bool:
    """Whether the console shows ``event`` (cheap: nothing is built)."""
    return isinstance(event, (NodeEvent, RequestFinished))


def console_event(event: object) -> tuple[str, dict[str, Any]] | None:
    """``(name, data)`` for an event the console shows, else ``None``."""
    if isinstance(event, NodeEvent):
        return NODE, {
            "kind": event.kind.value,
            "node_id": event.node_id,
            "reason": event.reason,
            "outcome": event.outcome,
            "at": event.at,
        }
    if isinstance(event, RequestFinished):
        return REQUEST, request_data(event)
    return None


def request_data(event: RequestFinished) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(event, name) for name in _REQUEST_FIELDS}
    usage = event.usage
    data["usage"] = (
        None if usage is None else {name: getattr(usage, name) for name in _TOKEN_FIELDS}
    )
    return data


def is_error(data: dict[str, Any]) -> bool:
    """A request the console counts as an error: it failed, was refused or answered >= 400."""
    status = data.get("status") or 0
    return data.get("outcome") in ("error", "refused") or status >= 400
