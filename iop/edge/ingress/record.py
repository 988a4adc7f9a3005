# -*- test-case-name: iop.test.edge.ingress.test_record -*-
"""
One client request's record, from its arrival at a handler to its end: the one source of the
per-request metrics and the access log line.

A :class:`RequestRecord` is created by the app for each routed request and filled in by
whoever knows each fact — :func:`~iop.edge.ingress.relay.with_placement` (the model, the
placement, the time spent waiting for it), :class:`~iop.edge.ingress.relay.Exchange` (whether
the answer streams, the first streamed byte), the source that carried the work
(:mod:`iop.edge.ingress.sources`: how it ended and what it used),
:func:`~iop.edge.ingress.http.render_error` (the error code) — and published exactly once as a
:class:`~iop.edge.events.RequestFinished` when **both** the response has ended (finished, or
the client went away) **and** the handler has returned, so that the usage and outcome of work
that outlives its client (a cancel on its way to the node) are in it. Nothing here decides or
releases anything: it observes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from iop.edge.events import RequestFinished
from iop.edge.ingress.requestid import request_id_of
from iop.edge.placement import Placement
from iop.runtime.events import Usage

__all__ = ["Publish", "RequestRecord"]

Publish = Callable[[RequestFinished], object]

# Error codes become metric labels: IOP's own vocabulary only (anything else is "other").
_CODE = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
# Where a record rides on its request (read back by render_error).
_ATTRIBUTE = "_iop_record"


def bounded_code(code: str) -> str:
    """``code`` when it is a plain identifier of IOP's vocabulary, else ``other``."""
    return code if _CODE.match(code) else "other"


class RequestRecord:
    """What one client request did; published once (module docstring)."""

    def __init__(
        self,
        request: IRequest,
        surface: str,
        operation: str,
        clock: IReactorTime,
        publish: Publish,
    ) -> None:
        self._request = request
        self.clock = clock
        self._publish = publish
        self.surface = surface
        self.operation = operation
        self.started_at = clock.seconds()
        self.model = ""
        # The client key the request authenticated with, and its team ("": none).
        self.key = ""
        self.team = ""
        # What the reported usage cost (the pipeline prices it; None: unknown).
        self.cost_micros: int | None = None
        self.placement: Placement | None = None
        self.queue_wait: float | None = None
        # How the placed work ended and what it used (its source says; "" while it has not).
        self.outcome = ""
        self.usage: Usage | None = None
        self.stream = False
        self.first_body_at: float | None = None
        self.error_code = ""
        # The id the request was stamped with on arrival ("" when it was not: tests' requests).
        self.request_id = request_id_of(request)
        # Its trace's ids when the Edge traces it ("": not traced), for exemplars and log lines.
        self.trace_id = ""
        self.span_id = ""
        # When the work was dispatched to its node, and how long it took there (the Edge→
        # provider leg, gen_ai.client.operation.duration; None: not dispatched or not ended).
        self.dispatched_at: float | None = None
        self.provider_duration: float | None = None
        self._ended_at: float | None = None
        self._status = 0
        self._handler_done = False
        self._published = False
        setattr(request, _ATTRIBUTE, self)
        request.notifyFinish().addBoth(self._response_ended)  # type: ignore[attr-defined]

    @staticmethod
    def of(request: IRequest) -> RequestRecord | None:
        """The record riding on ``request``, if the app made one."""
        record = getattr(request, _ATTRIBUTE, None)
        return record if isinstance(record, RequestRecord) else None

    # -- facts, from whoever knows them ---------------------------------------------------------

    def authenticated(self, key: str, team: str) -> None:
        """The request presented client key ``key`` (of ``team``)."""
        self.key, self.team = key, team

    def priced(self, cost_micros: int | None) -> None:
        """The placed work's reported usage cost ``cost_micros``."""
        self.cost_micros = cost_micros

    def placed(self, placement: Placement, waited: float | None) -> None:
        """The request got ``placement`` after ``waited`` seconds (None: not a pool lease)."""
        self.placement = placement
        self.model = placement.model
        self.queue_wait = waited

    def traced(self, trace_id: str, span_id: str) -> None:
        """The request is traced: its server span's ids."""
        self.trace_id, self.span_id = trace_id, span_id

    def dispatched(self) -> None:
        """The placed work was sent to its node now."""
        self.dispatched_at = self.clock.seconds()

    def ended(self, outcome: str, usage: Usage | None) -> None:
        """The placed work ended: how (complete, error, cancelled), and what it used (the
        first report wins)."""
        if not self.outcome:
            self.outcome = outcome
            self.usage = usage
            if self.dispatched_at is not None:
                self.provider_duration = self.clock.seconds() - self.dispatched_at

    def streaming(self, content_type: str | None) -> None:
        """The response started with ``content_type``: an SSE answer is a stream."""
        self.stream = content_type is not None and content_type.startswith("text/event-stream")

    def body_written(self) -> None:
        """A piece of a started response went out; the first one of a stream is its first
        token as far as the gateway can see."""
        if self.first_body_at is None and self.stream:
            self.first_body_at = self.clock.seconds()

    def error(self, code: str) -> None:
        """The response is an error whose machine code is ``code``."""
        self.error_code = bounded_code(code)

    # -- the end ---------------------------------------------------------------------------------

    def handler_done(self) -> None:
        """The handler returned (or raised): everything it started has ended."""
        self._handler_done = True
        self._maybe_publish()

    def _response_ended(self, result: Any) -> None:
        self._ended_at = self.clock.seconds()
        request: Any = self._request
        self._status = int(request.code) if getattr(request, "startedWriting", False) else 0
        self._maybe_publish()

    def _maybe_publish(self) -> None:
        if self._published or not self._handler_done or self._ended_at is None:
            return
        self._published = True
        self._publish(self.finished())

    def finished(self) -> RequestFinished:
        """The event this record publishes (the response must have ended)."""
        ended = self._ended_at if self._ended_at is not None else self.clock.seconds()
        placement = self.placement
        status = self._status
        if self.outcome:
            outcome = self.outcome
        elif status == 0:
            outcome = "cancelled"
        elif status >= 400:
            outcome = "refused"
        else:
            outcome = "complete"
        ttft = None
        if self.first_body_at is not None:
            ttft = self.first_body_at - self.started_at
        return RequestFinished(
            surface=self.surface,
            operation=self.operation,
            status=status,
            outcome=outcome,
            duration=ended - self.started_at,
            model=self.model,
            provider_id=(placement.provider_id or "") if placement is not None else "",
            node_id=placement.node_id if placement is not None else "",
            target=placement.target if placement is not None else "",
            usage_attribution=placement.usage_attribution if placement is not None else "",
            error_code=self.error_code,
            stream=self.stream,
            usage=self.usage,
            time_to_first_token=ttft,
            queue_wait=self.queue_wait,
            at=ended,
            key=self.key,
            team=self.team,
            cost_micros=self.cost_micros,
            request_id=self.request_id,
            trace_id=self.trace_id,
            span_id=self.span_id,
            provider_duration=self.provider_duration,
        )
