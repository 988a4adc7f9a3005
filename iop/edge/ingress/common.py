# -*- test-case-name: iop.test.edge.ingress.test_common -*-
"""
HTTP plumbing shared by the client surfaces (OpenAI- and Anthropic-compatible).

Request side
    :class:`ClientSite` serves the app with :class:`LimitedRequest`, which stops storing a request
    body past ``openai.max_body_bytes`` (a ``Content-Length`` over the limit is not stored at
    all); :func:`read_json` then answers ``413``. A body that is not a JSON object is ``400``.

Authentication (:func:`authenticate`, :func:`authorize`)
    Either header works on either surface: ``Authorization: Bearer <key>`` (the OpenAI SDK) or
    ``x-api-key: <key>`` (the Anthropic SDK). No key or an unknown key is ``401``; a key whose
    ``models`` list does not include the requested model is ``403`` — whether or not that model
    exists, so a restricted key learns nothing about the rest of the catalog. Keys are compared
    in constant time (:meth:`ClientAPIConfig.key_for`). With ``openai.auth.enabled: false``
    (only allowed on a loopback listener) nothing is checked.

Errors (:class:`ApiError`)
    One exception, rendered in the shape of the surface that raised it: OpenAI
    ``{"error": {"message", "type", "param", "code"}}`` or Anthropic
    ``{"type": "error", "error": {"type", "message"}}``. :func:`dispatch_error` maps the
    gateway's errors: unknown model ``404``; a full queue (``Overloaded``) ``429`` with
    ``retry-after``; no live provider, no ready node, no route or a queue timeout ``503``; a
    tunnel that failed before its response started ``502`` (``503`` when the node's own capacity
    gate was full). Upstream HTTP errors keep their status (:func:`upstream_error`).

Generation policy (:func:`max_tokens_for`, :func:`thinking_budget_for`)
    ``models[].default_max_tokens`` fills a request that sets no output limit;
    ``min_max_tokens`` raises any smaller limit to itself (a floor, not a rejection);
    ``default_thinking_token_budget`` is the thinking budget of a normalized run whose request
    does not turn thinking off.

Client gone (:class:`Exchange`)
    Klein cancels a handler's Deferred when its client disconnects: a request still waiting in
    the provider queue is withdrawn by that cancel. Once a run or tunnel is open, the handler
    registers its cancel with :meth:`Exchange.onGone`, so the node aborts the upstream request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import INonQueuedRequestFactory, IRequest
from twisted.web.resource import IResource
from twisted.web.server import Request, Site
from zope.interface import provider

from iop.config.model import ClientAPIConfig, ClientKey, ModelConfig, ProfileConfig
from iop.edge.dispatch import DispatchError, NodeUnavailable, NoRoute, RunHandle
from iop.edge.gateway import Dispatch
from iop.edge.pool import Overloaded, PoolError, QueueTimeout, Unavailable, UnknownModel
from iop.edge.tunnel import TunnelFailed, TunnelOutcome, TunnelStream
from iop.runtime.events import EventType, RuntimeEvent

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "ApiError",
    "ClientSite",
    "Exchange",
    "Gateway",
    "LimitedRequest",
    "authenticate",
    "authorize",
    "collect_body",
    "collect_run",
    "dispatch",
    "dispatch_error",
    "max_tokens_for",
    "read_json",
    "relay_tunnel",
    "render_error",
    "render_json",
    "run_error",
    "stream_run",
    "thinking_budget_for",
    "upstream_error",
]

OPENAI = "openai"
ANTHROPIC = "anthropic"

# Seconds a client is told to wait after a 429 (the queue was full).
RETRY_AFTER_SEC = 1
# A non-streaming upstream answer the Edge must read whole (to convert it) may be this large.
MAX_COLLECTED_BYTES = 32 * 1024 * 1024
# Upstream response headers a passthrough keeps (besides its status and body).
PASSTHROUGH_HEADERS = frozenset({"content-type", "retry-after", "request-id", "x-request-id"})

# status → (OpenAI error type, Anthropic error type).
_STATUS_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_request_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("invalid_request_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    502: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
    504: ("server_error", "api_error"),
    529: ("server_error", "overloaded_error"),
}


def error_types(status: int) -> tuple[str, str]:
    """The OpenAI and Anthropic error types for an HTTP status."""
    if status in _STATUS_TYPES:
        return _STATUS_TYPES[status]
    if 400 <= status < 500:
        return "invalid_request_error", "invalid_request_error"
    return "server_error", "api_error"


class ApiError(Exception):
    """
    A request that ends with an HTTP error. ``message`` is shown to the client (never a secret,
    node address or token); ``code`` and ``param`` fill the OpenAI shape; ``headers`` are added
    to the response (``retry-after``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = tuple(headers)

    def openai_body(self) -> dict[str, Any]:
        kind, _ = error_types(self.status)
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }

    def anthropic_body(self) -> dict[str, Any]:
        _, kind = error_types(self.status)
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body(self, surface: str) -> dict[str, Any]:
        return self.anthropic_body() if surface == ANTHROPIC else self.openai_body()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(message: str) -> ApiError:
    return ApiError(400, message, code="unsupported")


def json_bytes(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def render_json(request: IRequest, body: Any, status: int = 200) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json_bytes(body)


def render_error(request: IRequest, surface: str, error: ApiError) -> bytes:
    """Set the status and headers of ``error`` on ``request``; return its body."""
    for name, value in error.headers:
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
    return render_json(request, error.body(surface), error.status)


# -- request bodies ----------------------------------------------------------------------------


class LimitedRequest(Request):
    """
    A ``twisted.web`` request that stores at most ``maxBodyBytes`` of its body: past the limit
    it keeps nothing and sets ``bodyTooLarge`` (the handler answers 413). Memory and temporary
    files stay bounded whatever a client sends.
    """

    maxBodyBytes: int = 10 * 1024 * 1024
    bodyTooLarge: bool = False
    _bodyReceived: int = 0

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.maxBodyBytes:
            self.bodyTooLarge = True
            super().gotLength(0)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.bodyTooLarge:
            return
        self._bodyReceived += len(data)
        if self._bodyReceived > self.maxBodyBytes:
            self.bodyTooLarge = True
            if self.content is not None:
                self.content.seek(0)
                self.content.truncate()
            return
        super().handleContentChunk(data)


class ClientSite(Site):
    """The client listener's ``Site``: every request is a :class:`LimitedRequest`."""

    def __init__(self, resource: IResource, maxBodyBytes: int) -> None:
        limit = maxBodyBytes

        @provider(INonQueuedRequestFactory)
        class _Request(LimitedRequest):
            maxBodyBytes = limit

        super().__init__(resource, requestFactory=_Request)
        self.displayTracebacks = False

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.makeConnection = _noDelayFirst(protocol.makeConnection)
        return protocol


def _noDelayFirst(makeConnection: Any) -> Any:
    """Streams are many small writes: send each at once (TCP_NODELAY) rather than wait on ACKs."""

    def noDelayMakeConnection(transport: Any) -> None:
        setNoDelay = getattr(transport, "setTcpNoDelay", None)
        if setNoDelay is not None:
            setNoDelay(True)
        makeConnection(transport)

    return noDelayMakeConnection


def read_json(request: IRequest, limit: int) -> dict[str, Any]:
    """The request body as a JSON object: 413 past ``limit`` bytes, 400 when not an object."""
    if getattr(request, "bodyTooLarge", False):
        raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    content = getattr(request, "content", None)
    data = content.read(limit + 1) if content is not None else b""
    if len(data) > limit:
        raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    try:
        body = json.loads(data)
    except ValueError:
        raise bad_request("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return body


def header(request: IRequest, name: str) -> str | None:
    values = request.requestHeaders.getRawHeaders(name.encode("latin-1"))
    if not values:
        return None
    value: bytes | str = values[0]
    return value.decode("latin-1") if isinstance(value, bytes) else value


def required_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", param="model")
    return model


def optional_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", param=name)
    return value


# -- authentication ----------------------------------------------------------------------------


def presented_keys(request: IRequest) -> list[str]:
    """The API keys a request presents: a bearer token and/or an ``x-api-key``."""
    keys: list[str] = []
    authorization = header(request, "authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            keys.append(value.strip())
    apiKey = header(request, "x-api-key")
    if apiKey and apiKey.strip():
        keys.append(apiKey.strip())
    return keys


def authenticate(request: IRequest, config: ClientAPIConfig) -> ClientKey | None:
    """
    The client key the request presents; None when auth is off. Raises a 401 :class:`ApiError`
    for a missing or unknown key.
    """
    if not config.auth:
        return None
    keys = presented_keys(request)
    if not keys:
        raise ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            code="missing_api_key",
        )
    for presented in keys:
        found = config.key_for(presented)
        if found is not None:
            return found
    raise ApiError(401, "invalid API key", code="invalid_api_key")


def authorize(key: ClientKey | None, model: str) -> None:
    """403 when ``key`` may not use ``model`` (checked before whether the model exists)."""
    if key is not None and not key.allows(model):
        raise ApiError(403, f"this API key may not use model {model!r}", code="model_not_allowed")


# -- generation policy -------------------------------------------------------------------------


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request(f"'{name}' must be a positive integer", param=name)
    return value


def max_tokens_for(requested: int | None, policy: ModelConfig | None) -> int | None:
    """
    The output limit to use: ``requested``, or the model's ``default_max_tokens`` when the request
    set none; raised to ``min_max_tokens`` when below it. None: no limit anywhere.
    """
    value = requested
    if value is None and policy is not None:
        value = policy.default_max_tokens
    if value is not None and policy is not None and policy.min_max_tokens:
        value = max(value, policy.min_max_tokens)
    return value


def thinking_budget_for(policy: ModelConfig | None) -> int:
    """The model's default thinking budget for a normalized run (0: none)."""
    if policy is None or not policy.default_thinking_token_budget:
        return 0
    return policy.default_thinking_token_budget


# -- the gateway and its errors ----------------------------------------------------------------


class Gateway(Protocol):
    """What the client surfaces use of :class:`~iop.edge.gateway.EdgeGateway`."""

    def model_ids(self) -> list[str]: ...

    def model(self, model_id: str) -> ModelConfig | None: ...

    def candidate_profiles(self, model_id: str) -> list[ProfileConfig | None]: ...

    def dispatch(self, model_id: str, *, prompt_tokens: int = 0) -> Deferred[Dispatch]: ...

    def run(self, dispatch: Dispatch, *, input: str, **options: Any) -> RunHandle: ...

    def tunnel(
        self,
        dispatch: Dispatch,
        *,
        operation: str,
        body: bytes,
        stream: bool,
        headers: Iterable[tuple[str, str]] = (),
        method: str = "POST",
        timeout_sec: int = 0,
    ) -> TunnelStream: ...


def open_tunnel(
    gateway: Gateway,
    chosen: Dispatch,
    operation: str,
    payload: dict[str, Any],
    stream: bool,
    headers: list[tuple[str, str]],
) -> TunnelStream:
    """Open the provider tunnel for ``payload``, turning dispatch failures into client errors."""
    try:
        return gateway.tunnel(
            chosen, operation=operation, body=json_bytes(payload), stream=stream, headers=headers
        )
    except Exception as e:
        mapped = dispatch_error(e)
        if mapped is None:
            raise
        raise mapped from None


def dispatch_error(error: BaseException) -> ApiError | None:
    """The client-facing error for a gateway/pool/dispatcher error (None: not one of them)."""
    if isinstance(error, UnknownModel):
        return ApiError(404, f"model {error.model_id!r} does not exist", code=error.code)
    if isinstance(error, Overloaded):
        return ApiError(
            429, error.message, code=error.code, headers=[("retry-after", str(RETRY_AFTER_SEC))]
        )
    if isinstance(error, Unavailable | QueueTimeout):
        return ApiError(503, error.message, code=error.code)
    if isinstance(error, PoolError):
        return ApiError(503, error.message, code=error.code)
    if isinstance(error, TunnelFailed):
        message = str(error)
        if "at capacity" in message:
            return ApiError(503, message, code="provider_busy")
        return ApiError(502, message, code="upstream_error")
    if isinstance(error, NodeUnavailable):
        return ApiError(503, str(error), code="node_unavailable")
    if isinstance(error, NoRoute):
        return ApiError(503, str(error), code="no_route")
    if isinstance(error, DispatchError):
        return ApiError(502, str(error), code="dispatch_failed")
    return None


def _mapped(error: BaseException) -> BaseException:
    return dispatch_error(error) or error


async def dispatch(
    gateway: Gateway, exchange: Exchange, model: str, prompt_tokens: int
) -> Dispatch:
    """
    Choose where ``model`` runs (waiting in the provider queue if need be), as an
    :class:`ApiError` when it cannot. A client that goes away while queued cancels this (Klein
    cancels the handler), which withdraws the request from the queue.
    """
    try:
        waiting = gateway.dispatch(model, prompt_tokens=prompt_tokens)
    except Exception as e:
        raise _mapped(e) from None
    try:
        chosen = await waiting
    except (PoolError, DispatchError) as e:
        raise _mapped(e) from None
    if exchange.gone:
        chosen.release()
        raise CancelledError("the client went away")
    return chosen


def upstream_error(status: int, body: bytes) -> ApiError:
    """An upstream HTTP error (non-2xx answer) with its status, its message if it gave one."""
    message = ""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
        elif isinstance(decoded.get("message"), str):
            message = decoded["message"]
    if not message:
        text = body.decode("utf-8", errors="replace").strip()
        message = text[:500] if text else f"the provider answered HTTP {status}"
    return ApiError(status, message, code="upstream_error")


# -- the exchange with one client --------------------------------------------------------------


class Exchange:
    """
    One client request/response: writes that stop once the client is gone, and callbacks for
    when it goes (the handler's cancel of its run or tunnel).
    """

    log = Logger()

    def __init__(self, request: IRequest) -> None:
        self.request = request
        self.gone = False
        self.started = False
        self._onGone: list[Callable[[], object]] = []
        request.notifyFinish().addErrback(self._lost)  # type: ignore[attr-defined]

    def onGone(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the client disconnects (at once if it already has)."""
        if self.gone:
            callback()
        else:
            self._onGone.append(callback)

    def _lost(self, failure: Failure) -> None:
        self.gone = True
        callbacks, self._onGone = self._onGone, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                self.log.failure("cancelling the work of a departed client failed")

    def start(
        self, status: int, content_type: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        """Send the status line and headers now (a stream's first bytes may come later)."""
        request = self.request
        request.setResponseCode(status)
        request.setHeader(b"content-type", content_type.encode("latin-1"))
        request.setHeader(b"cache-control", b"no-store")
        for name, value in headers:
            request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
        self.started = True
        if not self.gone:
            request.write(b"")

    def write(self, data: bytes) -> None:
        if not self.gone and data:
            self.request.write(data)

    def abort(self) -> None:
        """Cut the connection: a client must see a truncated body, not a clean end."""
        transport = getattr(self.request, "transport", None)
        if transport is not None and not self.gone:
            getattr(transport, "abortConnection", transport.loseConnection)()


@dataclass
class Relay:
    """How a passthrough tunnel ended, for the caller's log."""

    outcome: TunnelOutcome | None = None
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)


async def relay_tunnel(exchange: Exchange, tunnel: TunnelStream) -> Relay:
    """
    Pass a tunnel's response through: the provider's status, content type and body bytes as
    they arrive, with the tunnel registered as the response's producer (backpressure). A
    tunnel that fails before its response starts raises an :class:`ApiError` (nothing was
    sent); one that fails after aborts the connection.
    """
    exchange.onGone(lambda: tunnel.cancel("client disconnected"))
    try:
        status, headers = await tunnel.whenStarted()
    except TunnelFailed as e:
        raise _mapped(e) from None
    kept = [(n, v) for n, v in headers if n.lower() in PASSTHROUGH_HEADERS]
    contentType = next((v for n, v in kept if n.lower() == "content-type"), "application/json")
    exchange.start(status, contentType, [(n, v) for n, v in kept if n.lower() != "content-type"])
    request = exchange.request
    registered = not exchange.gone
    if registered:
        request.registerProducer(tunnel, True)  # type: ignore[attr-defined]
    tunnel.deliverBody(exchange.write)
    outcome = await tunnel.whenDone()
    if registered and not exchange.gone:
        request.unregisterProducer()  # type: ignore[attr-defined]
    if not outcome.ok and not exchange.gone:
        Exchange.log.warn(
            "tunnel {run_id} failed after its response started: {error}",
            run_id=tunnel.run_id,
            node_id=tunnel.node_id,
            error=outcome.error,
        )
        exchange.abort()
    return Relay(outcome, status, headers)


async def collect_body(
    exchange: Exchange, tunnel: TunnelStream
) -> tuple[int, list[tuple[str, str]], bytes]:
    """
    A tunnel's whole response (status, headers, body), for a caller that converts it. Raises an
    :class:`ApiError` when the tunnel fails (before or after its start) or the body is too big.
    """
    exchange.onGone(lambda: tunnel.cancel("client disconnected"))
    try:
        status, headers = await tunnel.whenStarted()
    except TunnelFailed as e:
        raise _mapped(e) from None
    chunks: list[bytes] = []
    size = [0]

    def take(data: bytes) -> None:
        size[0] += len(data)
        if size[0] > MAX_COLLECTED_BYTES:
            tunnel.cancel("the provider's answer is too large")
            return
        chunks.append(data)

    tunnel.deliverBody(take)
    outcome = await tunnel.whenDone()
    if not outcome.ok:
        raise ApiError(502, f"the provider's answer failed: {outcome.error}", code="upstream_error")
    return status, headers, b"".join(chunks)


# -- normalized runs ---------------------------------------------------------------------------


def run_error(event: RuntimeEvent) -> ApiError:
    """The HTTP error for a run that ended (``error``/``cancelled``) before any output."""
    if event.type == EventType.CANCELLED:
        reason = event.error or "cancelled"
        return ApiError(502, f"the run was cancelled: {reason}", code="cancelled")
    message = event.error or "the run failed"
    if "at capacity" in message:
        return ApiError(503, message, code="provider_busy")
    return ApiError(502, message, code="upstream_error")


async def stream_run(
    exchange: Exchange,
    handle: RunHandle,
    content_type: str,
    convert: Callable[[RuntimeEvent], bytes],
) -> None:
    """
    Stream a run: the response starts (200, ``content_type``) with the run's first event, unless
    that event already ends it with an error, which raises :class:`ApiError` before anything
    was sent. Then every event goes through ``convert`` to the client, in order, until the
    terminal one. A client that goes away cancels the run on its node.
    """
    exchange.onGone(lambda: handle.cancel("client disconnected"))
    first: Deferred[None] = Deferred()
    buffered: list[RuntimeEvent] = []
    live: list[bool] = []

    def onEvent(event: RuntimeEvent) -> None:
        if live:
            exchange.write(convert(event))
            return
        buffered.append(event)
        if not first.called:
            first.callback(None)

    handle.subscribe(onEvent)
    await first
    if buffered[0].terminal and buffered[0].type != EventType.COMPLETE:
        raise run_error(buffered[0])
    exchange.start(200, content_type)
    for event in buffered:
        exchange.write(convert(event))
    live.append(True)
    await handle.whenDone()


async def collect_run(exchange: Exchange, handle: RunHandle) -> list[RuntimeEvent]:
    """Every event of a run, once it ended (a client that goes away cancels it)."""
    exchange.onGone(lambda: handle.cancel("client disconnected"))
    events: list[RuntimeEvent] = []
    handle.subscribe(events.append)
    await handle.whenDone()
    return events
