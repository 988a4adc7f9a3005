# -*- test-case-name: iop.test.edge.test_accesslog -*-
"""
The Edge's access log: one structured log event per finished client request, from its
:class:`~iop.edge.events.RequestFinished` (an event bus subscriber, so it never runs inside a
request's own call stack).

The text line reads ``openai chat chat → 200 complete in 812.4 ms (first token 40.1 ms, queue
0.0 ms, tokens 12/64, p-chat@node-a) req_01JD…``, ending with the request's id (the one its
answer's ``x-request-id`` carried; nothing when it had none); the event also carries every fact
as its own key (``request_id``, ``surface``, ``operation``, ``model``, ``provider_id``,
``node_id``, ``status``, ``outcome``, ``error_code``, ``stream``, ``duration_ms``, ``ttft_ms``,
``queue_ms``, ``input_tokens``, ``output_tokens``, ``reasoning_tokens``,
``cached_input_tokens``; and, when the Edge traced the request, ``trace_id`` and ``span_id``
of its server span, so a line leads to its trace) for a structured (JSON) log observer. It
holds nothing a client sent but the configured model name it was matched to and a request id
the gateway judged sane (:mod:`iop.runtime.requestid`): never a key, principal, prompt or
other header.

Connections the client listener refuses before any request (past its connection caps, or
timed out before a whole request head: :data:`FLOOD_CODES`) come in floods when someone
attacks the port — 1,100 slow-header connections wrote 804 lines. Given a clock, those get a
line of their own at most once per code every :data:`FLOOD_INTERVAL_SEC` (and at most
:data:`FLOOD_BURST` such lines in that time), and one summary line says how many more there were.
Every one of them is still counted in ``/metrics`` (``iop_client_errors_total``).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from iop.edge.events import RequestFinished
from iop.logs.limiter import LogLimiter

__all__ = ["FLOOD_CODES", "NAMESPACE", "AccessLog"]

# The client listener's own refusals, which an attacker can make by the thousand.
FLOOD_CODES = frozenset({"too_many_connections", "request_timeout"})
FLOOD_INTERVAL_SEC = 10.0
FLOOD_BURST = 5

FORMAT = (
    "{surface} {operation} {model_text} \N{RIGHTWARDS ARROW} {status} {outcome} in "
    "{duration_text} ({details}){request_id_text}"
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


# Not a class attribute: a Logger on a class takes the class's name as its namespace.
NAMESPACE = "iop.edge.access"


class AccessLog:
    """Subscribe :meth:`observe` to the Edge's event bus; lines go to ``log``. With ``clock``,
    floods of the listener's own refusals are summed up (module docstring)."""

    def __init__(self, log: Logger | None = None, clock: IReactorTime | None = None) -> None:
        self.log = log if log is not None else Logger(namespace=NAMESPACE)
        self._limiter = (
            LogLimiter(clock, self._summary, interval=FLOOD_INTERVAL_SEC, burst=FLOOD_BURST)
            if clock is not None
            else None
        )

    def observe(self, event: object) -> None:
        if not isinstance(event, RequestFinished):
            return
        code = event.error_code
        if self._limiter is not None and code in FLOOD_CODES:
            if not self._limiter.admit(code, code):
                return
        self.log.info(FORMAT, **self.fields(event))

    def _summary(self, count: int, by_code: dict[str, int], since: float) -> None:
        self.log.warn(
            "{count} more client connections refused in {interval:g} s, not logged one by one "
            "({codes})",
            count=count,
            interval=FLOOD_INTERVAL_SEC,
            codes=", ".join(f"{code}: {n}" for code, n in sorted(by_code.items())),
            refused=dict(by_code),
        )

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
        fields = {
            "request_id": event.request_id,
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
            "request_id_text": f" {event.request_id}" if event.request_id else "",
        }
        if event.trace_id:
            fields["trace_id"] = event.trace_id
            fields["span_id"] = event.span_id
        return fields
