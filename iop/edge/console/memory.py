# -*- test-case-name: iop.test.edge.test_console -*-
"""
What the console remembers from the event bus, so that a console opened now starts with the
Edge's recent past rather than an empty page.

One :class:`ConsoleMemory` per Edge, subscribed from its start: when each node became ready
(``connected_since``, cleared when it disconnects), requests and errors per model since the
start, the last error of each model and of each provider (``last_errors``: status, code, when —
the reason a person reads, which the last requests alone lose once 50 good ones have passed),
the last :data:`KEEP_REQUESTS` requests and the last :data:`KEEP_NODE_EVENTS` node events, as
the SSE stream sends them (:mod:`iop.edge.console.payload`). Bounded: models, providers and
nodes are the config's ids (and ``(none)``), the rest are fixed-length deques. Since when a node
is down is not remembered here: ``/status`` has it from the registry.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from iop.edge.console.payload import NODE, REQUEST, console_event, error_reason, is_error

KEEP_REQUESTS = 50
KEEP_NODE_EVENTS = 20


class ConsoleMemory:
    def __init__(
        self, keep_requests: int = KEEP_REQUESTS, keep_node_events: int = KEEP_NODE_EVENTS
    ) -> None:
        self._requests: deque[dict[str, Any]] = deque(maxlen=keep_requests)
        self._node_events: deque[dict[str, Any]] = deque(maxlen=keep_node_events)
        self._connected_since: dict[str, float] = {}
        self._totals: dict[str, dict[str, int]] = {}
        self._model_errors: dict[str, dict[str, Any]] = {}
        self._provider_errors: dict[str, dict[str, Any]] = {}

    def observe(self, event: object) -> None:
        """The event bus subscriber."""
        shown = console_event(event)
        if shown is None:
            return
        name, data = shown
        if name == NODE:
            self._node_events.append(data)
            if data["kind"] == "node.connected":
                self._connected_since[data["node_id"]] = data["at"]
            elif data["kind"] == "node.disconnected":
                self._connected_since.pop(data["node_id"], None)
        elif name == REQUEST:
            self._requests.append(data)
            totals = self._totals.setdefault(data["model"], {"requests": 0, "errors": 0})
            totals["requests"] += 1
            if is_error(data):
                totals["errors"] += 1
                reason = error_reason(data)
                self._model_errors[data["model"]] = reason
                if data["provider_id"]:
                    self._provider_errors[data["provider_id"]] = reason

    def snapshot(self) -> dict[str, Any]:
        """The stream's first event: copies, oldest request first."""
        return {
            "connected_since": dict(self._connected_since),
            "models": {model: dict(totals) for model, totals in self._totals.items()},
            "last_errors": {
                "models": {model: dict(e) for model, e in self._model_errors.items()},
                "providers": {provider: dict(e) for provider, e in self._provider_errors.items()},
            },
            "requests": list(self._requests),
            "node_events": list(self._node_events),
        }
