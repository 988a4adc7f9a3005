# -*- test-case-name: iop.test.edge.test_console -*-
"""
The console's view of a bus event: the SSE event name and the JSON object it carries.

``node`` for a :class:`~iop.edge.events.NodeEvent` (kind, node_id, reason, outcome, at);
``request`` for a finished client request (surface, operation, model, provider_id, node_id,
status, outcome, error_code, stream, duration, time_to_first_token, queue_wait, the token
counts, at). Only those fields, by name: never a principal, a key or anything else an event
might grow. Any other event is not the console's (``None``). A request that named no configured
model shows under :data:`~iop.edge.events.NO_MODEL` (``(none)``), as the metrics count it.

:func:`error_reason` is the short reason a failed request shows (its status and error code, or
how it ended), which the console keeps per model and per provider as their last error.

"""

from __future__ import annotations

from typing import Any

from iop.edge.events import NO_MODEL, NodeEvent, RequestFinished

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
    data["model"] = event.model or NO_MODEL
    usage = event.usage
    data["usage"] = (
        None if usage is None else {name: getattr(usage, name) for name in _TOKEN_FIELDS}
    )
    return data


def is_error(data: dict[str, Any]) -> bool:
    """A request the console counts as an error: it failed, was refused or answered >= 400."""
    status = data.get("status") or 0
    return data.get("outcome") in ("error", "refused") or status >= 400


def _code(data: dict[str, Any]) -> str:
    """The error code; without one, how the request ended, or ``upstream`` for an error status
    the provider answered itself (relayed as it was: IOP wrote no error body of its own)."""
    if data.get("error_code"):
        return str(data["error_code"])
    outcome = data.get("outcome")
    return "upstream" if outcome in ("complete", None, "") else str(outcome)


def error_reason(data: dict[str, Any]) -> dict[str, Any]:
    """A failed request's reason as the console keeps it: when, the status, the error code (or,
    with none, how it ended: ``upstream`` for the provider's own error answer) and where it was
    going."""
    return {
        "at": data.get("at", 0.0),
        "status": data.get("status") or 0,
        "code": _code(data),
        "model": data.get("model", ""),
        "provider_id": data.get("provider_id", ""),
        "node_id": data.get("node_id", ""),
    }
