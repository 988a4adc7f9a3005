# -*- test-case-name: iop.test.edge.ingress.test_errors -*-
"""
The client surfaces' errors: one exception, two shapes, and the mapping of the Edge's errors.

:class:`ApiError` is rendered in the shape of the surface that raised it: OpenAI
``{"error": {"message", "type", "param", "code"}}`` or Anthropic
``{"type": "error", "error": {"type", "message"}}``. With the request's id, the Anthropic
shape has it at the top level as ``request_id`` (where Anthropic's API puts it); OpenAI's API
names no such field, and the OpenAI shape has it at the top level too (one rule for both
surfaces), leaving the ``error`` object exactly OpenAI's four fields for clients that decode it
strictly; the openai SDK prints the whole body in its exception's text, so a user pasting an
error pastes the id an operator looks up (both SDKs also read it from the headers).

:func:`client_error` maps the gateway's errors: unknown model ``404``; a full queue
(``Overloaded``) ``429`` with ``retry-after``; no live provider, no ready node, no route or a
queue timeout ``503``; a tunnel that failed before its response started ``502`` (``503`` when
the node says, by the code :attr:`~iop.runtime.codes.ErrorCode.PROVIDER_AT_CAPACITY`, that its
own capacity gate was full, or by :attr:`~iop.runtime.codes.ErrorCode.NODE_DRAINING` that it
is stopping and refused the work before sending anything: ``503 node_draining``, which a client
may retry at once). :func:`run_error` does the same for a run that failed before any
output; upstream HTTP errors keep their status (:func:`upstream_error`). Rendering is
:func:`iop.edge.ingress.http.render_error`. Every error tells a client whether to retry, on both
surfaces: ``x-should-retry: false`` on a client error a retry cannot fix, ``retry-after`` on
429/503/529 (see :class:`ApiError`).

An :class:`ApiError`'s message is text IOP writes itself, often carrying an upstream's or a
node's error text: it goes through :func:`iop.security.redact.redact_secrets`, so a credential an
upstream echoes never reaches a client in IOP's own error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from iop.edge.errors import (
    CredentialRefused,
    DispatchError,
    LeaseRequired,
    NodeUnavailable,
    NoRoute,
    Overloaded,
    PoolError,
    QueueTimeout,
    TunnelFailed,
    Unavailable,
    UnknownModel,
)
from iop.formats.errors import error_message
from iop.runtime.codes import ErrorCode, error_code
from iop.runtime.events import EventType, RuntimeEvent
from iop.security.redact import redact_secrets

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "RETRYABLE_CLIENT_ERRORS",
    "RETRY_AFTER_SEC",
    "RETRY_LATER",
    "ApiError",
    "bad_request",
    "client_error",
    "error_types",
    "run_error",
    "unsupported",
    "upstream_error",
]

OPENAI = "openai"
ANTHROPIC = "anthropic"

# Seconds a client is told to wait after a 429 (the queue was full) or a 503.
RETRY_AFTER_SEC = 1
# Client errors a retry cannot fix get ``x-should-retry: false`` (the official SDKs and Claude
# Code honour it; without it Claude Code retries a 401 for minutes); these few may succeed later.
RETRYABLE_CLIENT_ERRORS = frozenset({408, 409, 429})
# Statuses that say "come back later": ``retry-after`` unless the error already carries one.
RETRY_LATER = frozenset({429, 503, 529})

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
    node address or token: it is redacted here, whatever the caller passed); ``code`` and
    ``param`` fill the OpenAI shape; ``headers`` are added to the response: the caller's, plus
    ``x-should-retry: false`` on a 4xx a retry cannot fix (all but 408, 409, 429) and
    ``retry-after`` (:data:`RETRY_AFTER_SEC`) on 429/503/529 when the caller gave none (and did
    not say ``x-should-retry: false`` itself). ``surface_headers`` are added only on the named
    surface (each API's own rate-limit headers); ``openai_type`` replaces the OpenAI error type
    the status implies (a spent budget is ``insufficient_quota``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
        surface_headers: Mapping[str, Sequence[tuple[str, str]]] | None = None,
        openai_type: str | None = None,
    ) -> None:
        message = redact_secrets(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = _with_retry_hints(status, tuple(headers))
        self._surface_headers = {k: tuple(v) for k, v in (surface_headers or {}).items()}
        self._openai_type = openai_type

    def headers_for(self, surface: str) -> tuple[tuple[str, str], ...]:
        """The response headers on ``surface``: every surface's, then that surface's own."""
        return self.headers + self._surface_headers.get(surface, ())

    def openai_body(self, request_id: str = "") -> dict[str, Any]:
        kind = self._openai_type or error_types(self.status)[0]
        body: dict[str, Any] = {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }
        if request_id:
            # Beside ``error``, as on the Anthropic surface: the error object stays OpenAI's own.
            body["request_id"] = request_id
        return body

    def anthropic_body(self, request_id: str = "") -> dict[str, Any]:
        _, kind = error_types(self.status)
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": self.message}}
        if request_id:
            # Where Anthropic's API puts it: top level, beside ``error``.
            body["request_id"] = request_id
        return body

    def body(self, surface: str, request_id: str = "") -> dict[str, Any]:
        """The error in ``surface``'s shape, naming ``request_id`` (when given) where that
        surface's clients look for it (module docstring)."""
        if surface == ANTHROPIC:
            return self.anthropic_body(request_id)
        return self.openai_body(request_id)


def _with_retry_hints(
    status: int, headers: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    names = {name.lower() for name, _ in headers}
    extra: list[tuple[str, str]] = []
    if 400 <= status < 500 and status not in RETRYABLE_CLIENT_ERRORS:
        if "x-should-retry" not in names:
            extra.append(("x-should-retry", "false"))
    # A caller that said "do not retry" (a spent budget) gets no invented retry-after.
    told_not_to = ("x-should-retry", "false") in ((n.lower(), v) for n, v in headers)
    if status in RETRY_LATER and "retry-after" not in names and not told_not_to:
        extra.append(("retry-after", str(RETRY_AFTER_SEC)))
    return headers + tuple(extra)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(message: str) -> ApiError:
    return ApiError(400, message, code="unsupported")


def client_error(error: BaseException) -> ApiError | None:
    """The client-facing error for a gateway/pool/dispatcher error (None: not one of them)."""
    if isinstance(error, ApiError):
        return error
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
        if error.code == ErrorCode.PROVIDER_AT_CAPACITY:
            return ApiError(503, str(error), code="provider_busy")
        if error.code == ErrorCode.NODE_DRAINING:
            return ApiError(503, str(error), code="node_draining")
        if error.code is not None and error.code.value.startswith("lease_"):
            # Managed mode: the node refused the credential lease (the text names the class).
            return ApiError(502, str(error), code=error.code.value)
        return ApiError(502, str(error), code="upstream_error")
    if isinstance(error, NodeUnavailable):
        return ApiError(503, str(error), code="node_unavailable")
    if isinstance(error, NoRoute):
        return ApiError(503, str(error), code="no_route")
    if isinstance(error, CredentialRefused):
        return ApiError(503, str(error), code="credential_unavailable")
    if isinstance(error, LeaseRequired):
        return ApiError(400, str(error), code="lease_required")
    if isinstance(error, DispatchError):
        return ApiError(502, str(error), code="dispatch_failed")
    return None


def run_error(event: RuntimeEvent) -> ApiError:
    """The HTTP error for a run that ended (``error``/``cancelled``) before any output."""
    if event.type == EventType.CANCELLED:
        reason = event.error or "cancelled"
        return ApiError(502, f"the run was cancelled: {reason}", code="cancelled")
    message = event.error or "the run failed"
    code = error_code(event.metadata)
    if code == ErrorCode.PROVIDER_AT_CAPACITY:
        return ApiError(503, message, code="provider_busy")
    if code == ErrorCode.NODE_DRAINING:
        return ApiError(503, message, code="node_draining")
    if code is not None and code.value.startswith("lease_"):
        # Managed mode: the node refused a run that would reach a provider outside a lease.
        return ApiError(502, message, code=code.value)
    return ApiError(502, message, code="upstream_error")


def upstream_error(status: int, body: bytes) -> ApiError:
    """An upstream HTTP error (non-2xx answer) with its status, its message if it gave one."""
    message = error_message(body)
    if message is None:
        text = body.decode("utf-8", errors="replace").strip()
        message = text[:500] if text else f"the provider answered HTTP {status}"
    return ApiError(status, message, code="upstream_error")
