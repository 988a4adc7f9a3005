# -*- test-case-name: iop.test.edge.test_accesslog -*-
"""
The Edge's access log: one structured log event per finished client request, from its
:class:`~iop.edge.events.RequestFinished` (an event bus subscriber, so it never runs inside a
request's own call stack).

The text line reads ``openai chat chat → 200 complete in 812.4 ms (first token 40.1 ms, queue
0.0 ms, tokens 12/64, p-chat@node-a)``; the event also carries every fact as its own key
(``surface``, ``operation``, ``model``, ``provider_id``, ``node_id``, ``status``, ``outcome``,
``error_code``, ``stream``, ``duration_ms``, ``ttft_ms``, ``queue_ms``, ``input_tokens``,
``output_tokens``, ``reasoning_tokens``, ``cached_input_tokens``) for a structured (JSON)
log observer. It holds nothing a client sent but the configured model name it was matched
to: never a key, principal, prompt or header.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from iop.edge.events import RequestFinished

__all__ = ["NAMESPACE", "AccessLog"]

FORMAT = (
    "{surface} {operation} {model_text} \N{RIGHTWARDS ARROW} {status} {outcome} in "
    "{duration_text} ({details})"
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


# Not a class attribute: a Logger on a class takes the class's name as its namespace.
NAMESPACE = "iop.edge.access"


class AccessLog:
    """Subscribe :meth:`observe` to the Edge's event bus; lines go to ``log``."""

    def __init__(self, log: Logger | None = None) -> None:
        self.log = log if log is not None else Logger(namespace=NAMESPACE)

    def observe(self, event: object) -> None:
        if isinstance(event, RequestFinished):
            self.log.info(FORMAT, **self.fields(event))

    @staticmethod
    def fields(event: RequestFinished) -> dict[str, Any]:
        """The log event's keys for ``event`` (its text parts included)."""
        usage = event.usage
        duration_ms = _ms(event.duration)
        ttft_ms = _ms(event.time_to_first_token)
        queue_ms = _ms(event.queue_wait)
        details: list[str] = []
        if ttft_ms is not None:
            details.append(f"first token {ttft_ms} ms")
        if queue_ms is not None:
            details.append(f"queue {queue_ms} ms")
        if usage is not None:
            details.append(f"tokens {usage.input_tokens}/{usage.output_tokens}")
        if event.error_code:
            details.append(event.error_code)
        if event.node_id:
            details.append(f"{event.provider_id or '-'}@{event.node_id}")
        return {
            "surface": event.surface,
            "operation": event.operation,
            "model": event.model,
            "provider_id": event.provider_id,
            "node_id": event.node_id,
            "status": event.status,
            "outcome": event.outcome,
            "error_code": event.error_code,
            "stream": event.stream,
            "duration_ms": duration_ms,
            "ttft_ms": ttft_ms,
            "queue_ms": queue_ms,
            "input_tokens": usage.input_tokens if usage is not None else None,
            "output_tokens": usage.output_tokens if usage is not None else None,
            "reasoning_tokens": usage.reasoning_tokens if usage is not None else None,
            "cached_input_tokens": usage.cached_input_tokens if usage is not None else None,
            "model_text": event.model or "-",
            "duration_text": f"{duration_ms} ms",
            "details": ", ".join(details) if details else "-",
        }
