# -*- test-case-name: iop.test.edge.ingress.test_cors -*-
"""
Cross-origin access to the client API from browsers (the Fetch standard's CORS protocol), when
``openai.cors`` allows some origins; without it nothing here runs and ``OPTIONS`` is a 405.

:class:`CorsPolicy` decides, from the request's ``Origin``, which ``Access-Control-*`` headers
an answer carries; :class:`CorsResource` stands in front of the app:

- **preflight** (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) at a path
  the API serves: ``204`` with ``Access-Control-Allow-Origin`` (the origin, or ``*``),
  ``-Allow-Methods`` (the path's), ``-Allow-Headers`` (:data:`ALLOW_HEADERS` — the headers the
  OpenAI and Anthropic SDKs send — and any other header name the browser asks for) and
  ``-Max-Age``; an origin not allowed gets ``403`` in the surface's error shape and no
  ``Access-Control-*`` header, so the browser refuses the request. A preflight needs no key
  (browsers never send one). A plain ``OPTIONS`` (no ``Origin``) is ``204`` with ``Allow``;
  a path the API does not serve is ``404``.
- **every other request** from an allowed origin: ``Access-Control-Allow-Origin`` and
  ``-Expose-Headers`` (:data:`EXPOSE_HEADERS`, the retry advice among them) on the answer —
  JSON, error or stream alike, since they are set before the app writes anything. The
  connection's own refusals (408, 413, 431, 503) carry them too
  (:class:`~iop.edge.ingress.channel.ClientChannel`).

Credentials are API keys in headers, never cookies: ``Access-Control-Allow-Credentials`` is not
sent, which is what lets ``*`` be safe with auth on (a page must still hold a key).
``Vary: Origin`` is on every answer whose headers depend on the origin, so a shared cache never
serves one origin's answer to another.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource

from iop.config.model import CorsConfig
from iop.edge.ingress.errors import ApiError

__all__ = ["ALLOW_HEADERS", "EXPOSE_HEADERS", "CorsPolicy", "CorsResource"]

# Request headers a preflight always allows: the auth and versioning headers of both surfaces
# and what the official SDKs add in a browser.
ALLOW_HEADERS = (
    "authorization",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "content-type",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "idempotency-key",
    # A page's own request id, kept when sane (iop.runtime.requestid).
    "x-request-id",
)
# Response headers a page's script may read besides the CORS-safelisted ones.
EXPOSE_HEADERS = ("retry-after", "x-should-retry", "request-id", "x-request-id")
# At most this many extra header names are taken from one preflight's request.
_MAX_REQUESTED = 64
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")

Header = tuple[str, str]


class CorsPolicy:
    """What ``Access-Control-*`` headers an answer to a request from ``origin`` carries."""

    def __init__(self, config: CorsConfig) -> None:
        self.config = config

    def allowed_origin(self, origin: bytes | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ``origin``; None if it is not allowed."""
        if origin is None:
            return None
        if self.config.any_origin:
            return "*"
        text = origin.decode("latin-1").strip()
        return text if self.config.allows(text) else None

    def vary(self) -> list[Header]:
        return [] if self.config.any_origin else [("Vary", "Origin")]

    def answer_headers(self, origin: bytes | None) -> list[Header]:
        """The headers for an actual (not preflight) answer to a request from ``origin``."""
        allowed = self.allowed_origin(origin)
        headers = self.vary()
        if allowed is not None:
            headers.append(("Access-Control-Allow-Origin", allowed))
            headers.append(("Access-Control-Expose-Headers", ", ".join(EXPOSE_HEADERS)))
        return headers

    def preflight_headers(
        self,
        allowed: str,
        methods: Sequence[str],
        requested_headers: bytes | None,
        private_network: bool,
    ) -> list[Header]:
        """The headers for a preflight from an allowed origin (``allowed``: its ACAO value)."""
        names = list(ALLOW_HEADERS)
        for name in (requested_headers or b"").decode("latin-1").split(",")[:_MAX_REQUESTED]:
            name = name.strip().lower()
            if name and _TOKEN.match(name) and name not in names:
                names.append(name)
        headers = self.vary()
        if requested_headers is not None:
            headers = [("Vary", "Origin, Access-Control-Request-Headers")]
        headers += [
            ("Access-Control-Allow-Origin", allowed),
            ("Access-Control-Allow-Methods", ", ".join(methods)),
            ("Access-Control-Allow-Headers", ", ".join(names)),
            ("Access-Control-Max-Age", str(self.config.max_age_sec)),
        ]
        if private_network:
            # Chromium's Private Network Access: a public page calling a gateway on a private
            # address asks first; an allowed origin may.
            headers.append(("Access-Control-Allow-Private-Network", "true"))
        return headers


def _set(request: IRequest, headers: Sequence[Header]) -> None:
    for name, value in headers:
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))


class CorsResource(Resource):
    """
    ``inner`` (the app) behind the CORS protocol (see the module docstring).
    ``allowed_methods(path)`` names the methods the app serves at ``path`` (none: no route);
    ``surface(request)`` which error shape an answer takes; ``render_error`` renders one.
    """

    isLeaf = True

    def __init__(
        self,
        inner: IResource,
        policy: CorsPolicy,
        allowed_methods: Callable[[str], Sequence[str]],
        surface: Callable[[IRequest], str],
        render_error: Callable[[IRequest, str, ApiError], bytes],
    ) -> None:
        super().__init__()
        self._inner = inner
        self._policy = policy
        self._allowed_methods = allowed_methods
        self._surface = surface
        self._render_error = render_error

    def render(self, request: IRequest) -> Any:
        origin = request.getHeader(b"origin")
        if request.method == b"OPTIONS":
            return self._options(request, origin)
        _set(request, self._policy.answer_headers(origin))
        return self._inner.render(request)

    def _options(self, request: IRequest, origin: bytes | None) -> bytes:
        path = request.path.decode("latin-1")  # type: ignore[attr-defined]
        methods = [m for m in self._allowed_methods(path) if m != "OPTIONS"]
        surface = self._surface(request)
        if not methods:
            _set(request, self._policy.answer_headers(origin))
            missing = ApiError(404, f"no route for OPTIONS {path}")
            return self._render_error(request, surface, missing)
        asked = request.getHeader(b"access-control-request-method")
        if origin is None or asked is None:
            # Not a preflight: RFC 9110 §9.3.7, the methods the resource has.
            request.setResponseCode(204)
            request.setHeader(b"allow", ", ".join([*methods, "OPTIONS"]).encode())
            return b""
        allowed = self._policy.allowed_origin(origin)
        if allowed is None:
            _set(request, self._policy.vary())
            message = "this origin may not call the API (openai.cors.allow_origins)"
            return self._render_error(request, surface, ApiError(403, message, code="forbidden"))
        _set(
            request,
            self._policy.preflight_headers(
                allowed,
                methods,
                request.getHeader(b"access-control-request-headers"),
                request.getHeader(b"access-control-request-private-network") == b"true",
            ),
        )
        request.setResponseCode(204)
        return b""
