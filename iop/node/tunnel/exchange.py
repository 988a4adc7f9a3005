# -*- test-case-name: iop.test.node.test_tunnel,iop.test.node.test_tunnel_echo -*-
"""
One provider tunnel's life, once admitted: the upstream HTTP exchange, its time bounds, its
body frames, and its single end.

::

    open ─┬─ response ─▶ RESPONSE_START(status, headers) ─▶ BODY… ─┬─ body complete ─▶ [USAGE] END
          │                                                        └─ connection broke ─▶ ERROR
          ├─ connect failure (no response) ───────────────────────────────────────────────▶ ERROR
          ├─ CANCEL_RUN ──────────────▶ ERROR "cancelled…"   (request aborted / connection closed)
          ├─ idle / overall timeout ──▶ ERROR "upstream idle…" / "request timed out…"  (aborted,
          │                              error_code upstream_timeout)
          └─ edge session lost ───────▶ aborted; nothing can be sent
                                         │
                           ended: timers stopped, slot released, exactly once

``BODY`` frames concatenate to exactly the bytes the upstream sent (managed mode: with its
echoes of the lease's secret replaced); a turn's first chunk goes out at once, the rest of that
turn's in one frame. An upstream non-2xx answer is not an error: it is passed through
(``RESPONSE_START`` with its status, its body, ``END``). The slot is released before the last
frame goes out, so an Edge that dispatches the next request on seeing ``END``/``ERROR`` finds
it free.

Managed mode: immediately before the provider call the lease is checked and opened and its
credential header put on this one request (:mod:`iop.node.tunnel.credentials`); the plaintext
``bytearray`` is zeroed as soon as the request has been handed to the HTTP client. What the
upstream sends back may echo that secret (a 401 quoting the header, a debug 500, a proxy): for
the rest of the tunnel an :class:`~iop.security.echo.EchoRedactor` holds a copy, replaces every
occurrence in the response headers and body chunks (one split across chunks too) with
``[redacted]``, and is zeroed when the tunnel ends; the count goes to the Edge in the last
frame's metadata (:data:`~iop.security.echo.ECHOES_METADATA_KEY`) and into one warning. The
body bytes are then the upstream's except for those replacements, and a chunk's tail that may
still become the secret waits for the next chunk. Any lease failure ends the tunnel with one
ERROR frame whose text starts with the failure class (``lease_expired: …``) and whose
``error_code`` metadata is that class; nothing reaches the upstream.

Traces (``telemetry:``): the tunnel's span, ``iop.node.tunnel`` (kind SERVER), is the child of
the Edge's context in ``ProviderTunnelRequest.metadata``; under it, the upstream call's HTTP
client span (:mod:`iop.telemetry.http`), whose ``traceparent`` goes upstream with the request.
The tunnel span carries the GenAI attributes the node knows (operation, provider, requested
model, the usage read on the side) and its outcome; both end in :meth:`Tunnel._end`. Header
values, the body and the URL's query are never recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse

from iop.node.adapters.http_client import prepared_url
from iop.node.adapters.http_stream import ended_cleanly, read_body
from iop.node.adapters.openai_compat import describe_failure
from iop.node.admission import CONNECTION_LOST_REASON, Admitted
from iop.node.tunnel.credentials import open_lease, with_credential
from iop.node.tunnel.frames import TunnelFrames
from iop.node.tunnel.headers import (
    filter_response_headers,
    logged_header_names,
    upstream_request_headers,
)
from iop.node.tunnel.plan import TunnelPlan
from iop.node.tunnel.usage import usage_observer
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode
from iop.runtime.requestid import carried, log_context
from iop.security.echo import ECHOES_METADATA_KEY, EchoRedactor
from iop.security.lease import LeaseError, LeaseVerifier, zero
from iop.telemetry import semconv
from iop.telemetry.http import client_span, end_client_span, traced_header_object
from iop.telemetry.propagation import log_ids
from iop.telemetry.tracing import TRACING_OFF, Span, SpanKind, Tracing, end_span, set_attributes
from iop.wire import runtime_pb2 as pb

__all__ = ["CANCELLED", "DEFAULT_IDLE_TIMEOUT", "Tunnel", "TunnelContext", "tunnel_span"]

DEFAULT_IDLE_TIMEOUT = 120.0
CANCELLED = "cancelled"


def _seconds(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class TunnelContext:
    """
    What every tunnel of one session is given by its manager: the clock, where its frames go,
    the largest ``BODY`` frame, the lease verifier (managed mode), and the two calls of its end —
    ``leave`` (out of the active table, before the last frame goes out) and ``ended`` (its
    outcome, ``completed``, ``cancelled`` or ``error``, after).
    """

    clock: IReactorTime
    send_frame: Callable[[pb.ProviderTunnelFrame], None]
    leave: Callable[[Tunnel], None]
    ended: Callable[[str], None]
    body_frame_bytes: int
    leases: LeaseVerifier | None = None
    node_id: str = ""
    tracing: Tracing = TRACING_OFF


def tunnel_span(
    context: TunnelContext, request: pb.ProviderTunnelRequest, kind: str, adapter: str
) -> Span | None:
    """A tunnel's span, the child of the Edge's context in the request's metadata."""
    attributes: dict[str, str | bool] = {
        semconv.GEN_AI_OPERATION_NAME: semconv.operation_name(request.operation),
        semconv.GEN_AI_REQUEST_MODEL: request.target,
        semconv.GEN_AI_REQUEST_STREAM: request.stream,
        semconv.IOP_RUN_ID: request.run_id,
        semconv.IOP_ADAPTER: adapter,
        semconv.IOP_NODE_ID: context.node_id,
    }
    if kind:
        attributes[semconv.GEN_AI_PROVIDER_NAME] = semconv.provider_name(kind)
    request_id = carried(request.metadata)
    if request_id:
        attributes[semconv.IOP_REQUEST_ID] = request_id
    return context.tracing.start_remote(
        "iop.node.tunnel", request.metadata, SpanKind.SERVER, attributes
    )


class Tunnel:
    """
    One admitted tunnel: what it sends upstream, its timers, its upstream exchange, and its
    single end. Built from what admission found (``admitted``, its slot held) and started by
    its manager once it is in the active table.
    """

    log = Logger()

    def __init__(
        self,
        context: TunnelContext,
        request: pb.ProviderTunnelRequest,
        admitted: Admitted[TunnelPlan],
    ) -> None:
        plan = admitted.plan
        provider = plan.provider
        profile = provider.profile
        self._context = context
        self._clock = context.clock
        self._body_frame_bytes = context.body_frame_bytes
        self.run_id = request.run_id
        # The client request's id this tunnel serves (its metadata's; "" when none): on each of
        # its log lines (the upstream gets it as a request header when the Edge sends one).
        self.request_id = carried(request.metadata)
        self.instance = admitted.instance
        self.provider = provider
        self.target = request.target
        self.operation = request.operation
        self.stream = request.stream
        self.timeout_sec = float(request.timeout_sec)
        self.method = plan.method
        self.path = plan.path
        self._url = prepared_url(provider.base_url + plan.path)
        self._headers, dropped = upstream_request_headers(
            provider.configured_headers(),
            request.headers,
            auth_header=profile.auth_header if profile is not None else "",
            has_body=bool(request.body),
        )
        self._body = request.body
        self._slot = admitted.slot
        self._request = request if context.leases is not None else None
        self.started_at = context.clock.seconds()
        # For the one log line at the end: the gate's occupancy when admitted, the request
        # header names not forwarded (a bounded number, each clipped).
        self.gate_in_use = self.instance.gate.in_use
        self.dropped_headers = logged_header_names(dropped) if dropped else []
        self.frames = TunnelFrames(self.run_id, context.send_frame, context.body_frame_bytes)
        self.over = False
        self._inner: Deferred[None] | None = None
        self._idle_call: IDelayedCall | None = None
        self._last_data = 0.0
        self._bound_call: IDelayedCall | None = None
        self._idle = float(provider.idle_timeout or DEFAULT_IDLE_TIMEOUT)
        # Body bytes of this reactor turn, not yet in a frame (:meth:`_held_body`).
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_call: IDelayedCall | None = None
        # Managed mode: the lease's secret, removed from everything relayed back (status line,
        # headers, body) until the tunnel ends.
        self._echo: EchoRedactor | None = None
        # Traces: the tunnel's span and its upstream call's (None: tracing off).
        self.span: Span | None = None
        self._client_span: Span | None = None
        self._usage_attributes: dict[str, int] = {}
        self._trace_ids: dict[str, str] = {}
        if context.tracing.tracer is not None:
            self.span = tunnel_span(context, request, self.instance.type, self.instance.name)
            self._trace_ids = log_ids(self.span)

    @property
    def adapter(self) -> str:
        return self.instance.name

    @property
    def context(self) -> dict[str, str]:
        """What each log line about this tunnel adds (the request's id; traced, the span's)."""
        return log_context(self.request_id, self._trace_ids)

    def start(self) -> None:
        self._arm()
        self._inner = Deferred.fromCoroutine(self._main())
        self._inner.addErrback(self._failed)

    def abort(self, reason: str, metadata: Mapping[str, str] | None = None) -> bool:
        """
        End now with ERROR ``reason`` (and ``metadata``) and abort the upstream exchange;
        False if over.
        """
        if self.over:
            return False
        self._end(reason, metadata)
        inner = self._inner
        if inner is not None and not inner.called:
            inner.cancel()
        return True

    # -- the exchange ------------------------------------------------------------------------

    async def _main(self) -> None:
        provider = self.provider
        headers = self._headers
        secret: bytearray | None = None
        if self.span is not None:
            self._client_span = client_span(
                self._context.tracing, self.span, self.method, provider.base_url + self.path
            )
            headers = traced_header_object(self._client_span, headers)
        request = self._request
        if request is not None:
            context = self._context
            try:
                assert context.leases is not None  # a request is kept only in managed mode
                secret = open_lease(
                    context.leases, request, self.instance, provider, self._clock.seconds()
                )
                slot = request.credential_binding.slot
                headers = with_credential(headers, provider.profile, slot, secret)
                redactor = EchoRedactor(secret)
                self._echo = redactor if redactor.active else None
            except LeaseError as e:
                if secret is not None:
                    zero(secret)
                self.log.warn(
                    "tunnel {run_id} on adapter {adapter}: credential lease refused: {error}",
                    run_id=self.run_id,
                    **self.context,
                    adapter=self.adapter,
                    error=str(e),
                    error_code=e.code,
                    node_id=context.node_id,
                )
                self._end(str(e), {ERROR_CODE_KEY: e.code})
                return
            finally:
                self._request = request = None
        try:
            sent = provider.http.request(
                self.method,
                self._url,
                headers=headers,
                data=self._body if self._body else None,
                unbuffered=True,
                allow_redirects=False,
                reactor=provider.clock,
            )
        finally:
            # The request (and its headers) is the HTTP client's now: the plaintext goes.
            if secret is not None:
                zero(secret)
            del headers
        response: IResponse = await sent
        if self.over:
            return
        self._touch()
        # Only the status code goes back (the Edge writes its own reason phrase): the
        # upstream's status line, which may echo too, is not relayed at all.
        echo = self._echo
        self.frames.start(
            response.code, filter_response_headers(response.headers, provider.redact, echo)
        )
        observer = usage_observer(self.operation, self.stream, response)

        def on_data(data: bytes) -> None:
            if observer is not None:
                observer.feed(data)
            if echo is not None:
                # At most a tail that may still become the secret is held back here.
                data = echo.feed(data)
                if not data:
                    self._touch()
                    return
            self._held_body(data)

        reason = await read_body(response, on_data)
        if self.over:
            return
        if echo is not None:
            if ended_cleanly(reason):
                # What was held could not become the secret: the body ended first.
                tail = echo.finish()
                if tail:
                    self._held_body(tail)
            else:
                # A body cut mid-echo: the secret's first bytes are not handed out.
                echo.discard()
        self._send_held_body()
        if not ended_cleanly(reason):
            self._end(
                f"upstream connection lost after {self.frames.body_bytes} body bytes: "
                f"{describe_failure(reason)}"
            )
            return
        usage = observer.finish() if observer is not None else None
        if usage is not None:
            self.frames.usage(usage)
            if self.span is not None:
                self._usage_attributes = semconv.usage_attributes(usage)
        self._end(None)

    # -- body frames -------------------------------------------------------------------------

    def _held_body(self, data: bytes) -> None:
        """
        The first chunk of a reactor turn goes out at once; the chunks that follow it in the
        same turn (a burst of SSE events in one TCP read) are held and go out together, as
        one ``BODY`` frame, when the turn ends. A token stream's chunks, one per turn, are
        never delayed; a burst costs two frames, not one per chunk. Bytes and order are
        untouched.
        """
        if self._flush_call is None:
            # Data arrived: the idle timer restarts (once per turn is enough).
            self._touch()
            self._flush_call = self._clock.callLater(0, self._send_held_body)
            self.frames.body(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= self._body_frame_bytes:
            self._send_held_body()

    def _send_held_body(self) -> None:
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held = []
        self._held_bytes = 0
        self.frames.body(data)

    def _failed(self, failure: Failure) -> None:
        if self.over:
            return
        why = describe_failure(failure.value) if failure.value is not None else "unknown failure"
        if self.frames.started:
            self._end(f"upstream connection lost after {self.frames.body_bytes} body bytes: {why}")
        else:
            self._end(f"upstream request failed: {why}")

    # -- time bounds -------------------------------------------------------------------------

    def _arm(self) -> None:
        clock = self._clock
        if self.timeout_sec > 0:
            self._bound_call = clock.callLater(
                self.timeout_sec,
                self._expired,
                f"request timed out after {_seconds(self.timeout_sec)}s",
            )
        self._last_data = clock.seconds()
        self._idle_call = clock.callLater(self._idle, self._idle_check)

    def _touch(self) -> None:
        # Only the time is noted: the idle timer looks at it when it fires (no timer reset
        # per chunk).
        self._last_data = self._clock.seconds()

    def _idle_check(self) -> None:
        left = self._last_data + self._idle - self._clock.seconds()
        if left > 0:
            self._idle_call = self._clock.callLater(left, self._idle_check)
        else:
            self._idle_call = None
            self._expired(f"upstream idle for {_seconds(self._idle)}s")

    def _disarm(self) -> None:
        for call in (self._idle_call, self._bound_call):
            if call is not None and call.active():
                call.cancel()
        self._idle_call = self._bound_call = None

    def _expired(self, reason: str) -> None:
        self.log.warn(
            "tunnel {run_id} on adapter {adapter}: {error}",
            run_id=self.run_id,
            **self.context,
            adapter=self.adapter,
            error=reason,
            node_id=self._context.node_id,
        )
        self.abort(reason, {ERROR_CODE_KEY: ErrorCode.UPSTREAM_TIMEOUT.value})

    # -- the one end -------------------------------------------------------------------------

    def _end(self, error: str | None, metadata: Mapping[str, str] | None = None) -> None:
        """
        Stop timers, release the slot, send END (``error`` None) or ERROR (with ``metadata``),
        exactly once.
        """
        if self.over:
            return
        # What the upstream sent before the end goes first.
        self._send_held_body()
        self.over = True
        self._request = None
        self._disarm()
        self._slot.release()
        self._context.leave(self)
        echoes = self._forget_secret()
        if echoes:
            metadata = {**(metadata or {}), ECHOES_METADATA_KEY: str(echoes)}
        if error is None:
            self.frames.end(metadata)
        else:
            self.frames.error(self.provider.redact(error), metadata)
        if self.span is not None:
            self._end_spans(error, metadata)
        self._ended(error)

    def _end_spans(self, error: str | None, metadata: Mapping[str, str] | None) -> None:
        """The upstream call's span and the tunnel's, with how it ended."""
        status = self.frames.status_code if self.frames.started else None
        client, self._client_span = self._client_span, None
        if client is not None:
            failure = None if error is None or status is not None else _Failed(error)
            end_client_span(client, status, failure)
        span, self.span = self.span, None
        attributes: dict[str, str | int] = {
            semconv.IOP_OUTCOME: _outcome(error),
            semconv.IOP_BODY_BYTES: self.frames.body_bytes,
            **self._usage_attributes,
        }
        if status is not None:
            attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = status
        code = (metadata or {}).get(ERROR_CODE_KEY, "")
        if code:
            attributes[semconv.IOP_ERROR_CODE] = code
        set_attributes(span, attributes)
        if _outcome(error) == "error":
            end_span(span, code or "_OTHER", self.provider.redact(error or ""))
        elif status is not None and status >= 400:
            # An upstream's non-2xx answer is relayed, not an IOP error; the span says it failed.
            end_span(span, str(status), f"upstream answered {status}")
        else:
            end_span(span)

    def _forget_secret(self) -> int:
        """Zero the lease secret's copies; how many echoes of it were removed (logged once)."""
        echo, self._echo = self._echo, None
        if echo is None:
            return 0
        echo.discard()
        echo.forget()
        if echo.count:
            self.log.warn(
                "tunnel {run_id} on adapter {adapter}: the upstream echoed the leased credential;"
                " {echoes} occurrence(s) redacted from the response",
                run_id=self.run_id,
                **self.context,
                adapter=self.adapter,
                echoes=echo.count,
                status_code=self.frames.status_code,
                node_id=self._context.node_id,
            )
        return echo.count

    def _ended(self, error: str | None) -> None:
        """Its outcome to the manager, and the tunnel's one log line: what it was, how it ended,
        how much and how long."""
        outcome = _outcome(error)
        self._context.ended(outcome)
        frames = self.frames
        self.log.info(
            "tunnel {run_id} {adapter}/{target} {method} {path} ended: {outcome}{detail},"
            " status {status_code}, {body_bytes} bytes in {duration_sec} s",
            run_id=self.run_id,
            **self.context,
            adapter=self.adapter,
            target=self.target,
            operation=self.operation or "path",
            method=self.method,
            path=self.path,
            stream=self.stream,
            outcome=outcome,
            detail=f" ({self.provider.redact(error)})" if error else "",
            status_code=frames.status_code,
            body_bytes=frames.body_bytes,
            frames=frames.sequence,
            duration_sec=round(self._clock.seconds() - self.started_at, 3),
            in_use=self.gate_in_use,
            limit=self.instance.gate.limit,
            dropped_headers=self.dropped_headers or None,
            node_id=self._context.node_id,
        )


def _outcome(error: str | None) -> str:
    """``completed``, ``cancelled`` or ``error``: how a tunnel that ended with ``error`` ended."""
    if error is None:
        return "completed"
    if error.startswith(CANCELLED) or error == CONNECTION_LOST_REASON:
        return "cancelled"
    return "error"


class _Failed(Exception):
    """The upstream exchange failed before a response (the client span's ``error.type``)."""
