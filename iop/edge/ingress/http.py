# -*- test-case-name: iop.test.edge.ingress.test_http -*-
"""
The client listener's HTTP plumbing: the body limit, the ``Site``, JSON in and out.

:class:`ClientSite` serves the app over :class:`~iop.edge.ingress.channel.ClientChannel`
connections (framing, deadlines, connection caps: that module) with :class:`LimitedRequest`,
which stops storing a request body past ``openai.max_body_bytes`` (the channel refuses a
declared length over the limit before it is read).
:func:`read_json` is the one place a request body becomes data: ``413`` past the limit; ``400``
for a body that is not a JSON object, or that is JSON the Edge could not send on as JSON — a
lone UTF-16 surrogate escape (``"\\ud800"``), ``NaN``/``Infinity`` or a number too large for a
double (``1e999``), nesting deeper than the decoder goes. What it returns re-serializes with
:func:`json_bytes` whatever a handler does with it. The field readers (:func:`required_model`,
:func:`optional_bool`, :func:`positive_int`) answer ``400`` for a field of the wrong type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import INonQueuedRequestFactory, IRequest
from twisted.web.resource import IResource
from twisted.web.server import Request, Site
from zope.interface import provider

from iop.config.model import ClientAPIConfig
from iop.edge.descriptors import ClientCaps, client_caps
from iop.edge.ingress.channel import ClientChannel, ConnectionCounter
from iop.edge.ingress.cors import CorsPolicy
from iop.edge.ingress.errors import ApiError, bad_request, error_types
from iop.edge.ingress.record import Publish, RequestRecord
from iop.edge.ingress.requestid import request_id_of

__all__ = [
    "ClientSite",
    "LimitedRequest",
    "header",
    "json_bytes",
    "optional_bool",
    "positive_int",
    "read_json",
    "render_error",
    "render_json",
    "required_model",
]


def json_bytes(body: Any) -> bytes:
    """``body`` as compact UTF-8 JSON (what the Edge sends on and answers)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def render_json(request: IRequest, body: Any, status: int = 200) -> bytes:
    """Set ``status`` and the JSON headers on ``request``; return ``body`` encoded."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json_bytes(body)


def render_error(request: IRequest, surface: str, error: ApiError) -> bytes:
    """Set the status and headers of ``error`` on ``request``; return its body in ``surface``'s
    shape, naming the request's id (:mod:`.requestid`). The request's record (if any) notes the
    error's code: its own, else the OpenAI error type of its status."""
    record = RequestRecord.of(request)
    if record is not None:
        record.error(error.code or error_types(error.status)[0])
    for name, value in error.headers_for(surface):
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
    return render_json(request, error.body(surface, request_id_of(request)), error.status)


# -- the body limit ----------------------------------------------------------------------------


class LimitedRequest(Request):
    """
    A ``twisted.web`` request that stores at most ``max_body_bytes`` of its body: past the limit
    it keeps nothing and sets ``body_too_large`` (the handler answers 413). Memory and temporary
    files stay bounded whatever a client sends.
    """

    max_body_bytes: int = 10 * 1024 * 1024
    body_too_large: bool = False
    _body_received: int = 0

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_body_bytes:
            self.body_too_large = True
            super().gotLength(0)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.body_too_large:
            return
        self._body_received += len(data)
        if self._body_received > self.max_body_bytes:
            self.body_too_large = True
            if self.content is not None:
                self.content.seek(0)
                self.content.truncate()
            return
        super().handleContentChunk(data)


class ClientSite(Site):
    """
    The client listener's ``Site``: every connection is a
    :class:`~iop.edge.ingress.channel.ClientChannel` held to ``config``'s limits and counted by
    :attr:`connections` against ``caps`` (what the Edge can afford under its open-file limit,
    :mod:`iop.edge.descriptors`; None: the config's own); every request is a
    :class:`LimitedRequest`. ``allowed_methods(path)`` names the methods the app serves at a
    path (for ``Allow``); ``methods`` is all of them. :meth:`listening` hands it the port, which
    the counter pauses at its descriptor cap. :attr:`live` holds every open connection and
    :attr:`draining` says the Edge is stopping (:mod:`.drain`).
    """

    protocol = ClientChannel  # type: ignore[assignment]  # an HTTPChannel, not the H2 switch
    # No "Starting factory <... at 0x...>" lines: the Edge's start banner names its listeners.
    noisy = False

    def __init__(
        self,
        resource: IResource,
        config: ClientAPIConfig,
        reactor: IReactorTime,
        *,
        methods: Iterable[str] = ("GET", "HEAD", "POST"),
        allowed_methods: Callable[[str], Sequence[str]] = lambda path: (),
        publish: Publish | None = None,
        caps: ClientCaps | None = None,
    ) -> None:
        limit = config.max_body_bytes

        @provider(INonQueuedRequestFactory)
        class _Request(LimitedRequest):
            max_body_bytes = limit

        # Bodies are never parsed as HTML forms: the APIs take JSON only, and twisted.web's form
        # parsing costs every POST a Content-Type parse through ``email`` (~14 % of the Edge's
        # busy CPU per request) and refuses a malformed multipart body before the app sees it.
        super().__init__(
            resource,
            requestFactory=_Request,
            timeout=config.idle_timeout_sec,
            reactor=reactor,
            parsePOSTFormSubmission=False,
        )
        self.displayTracebacks = False
        self.config = config
        if caps is None:
            caps = client_caps(config.max_connections, config.max_connections_per_peer)
        self.caps = caps
        self.connections = ConnectionCounter(
            caps.max_connections, caps.max_connections_per_peer, caps.descriptors, reactor
        )
        self._methods = frozenset(m.encode("ascii") for m in methods)
        self._cors = CorsPolicy(config.cors) if config.cors is not None else None
        self._allowed_methods = allowed_methods
        self._publish = publish
        # Every open connection (what a drain waits on), and whether the Edge is draining.
        self.live: set[ClientChannel] = set()
        self.draining = False

    def log(self, request: Any) -> None:
        """No combined-log line per request: the Edge's access log has one for each, with what
        it did (:mod:`iop.edge.accesslog`)."""

    def listening(self, port: Any) -> None:
        """The client listener's port: paused at the descriptor cap, resumed below it."""
        self.connections.port = port

    def buildProtocol(self, addr: Any) -> Any:
        if not self.connections.open():
            # At the descriptor cap: the port closes this one at once, unanswered.
            return None
        channel = super().buildProtocol(addr)
        channel.holds_descriptor = True
        channel.config = self.config
        channel.clock = self.reactor
        channel.counter = self.connections
        channel.cors = self._cors
        channel.methods = self._methods
        channel.allowed_methods = self._allowed_methods
        channel.publish = self._publish
        channel.draining = self.draining
        channel.live = self.live
        self.live.add(channel)
        return channel


# -- JSON in -----------------------------------------------------------------------------------


class _NotSendable(ValueError):
    """JSON the Edge could not send on as JSON."""


def _no_constant(name: str) -> Any:
    raise _NotSendable(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotSendable(f"the number {text[:40]} is too large")
    return value


def read_json(request: IRequest, limit: int) -> dict[str, Any]:
    """
    The request body as a JSON object that re-serializes as JSON: 413 past ``limit`` bytes,
    400 for anything else that is not such an object (see the module docstring).
    """
    if getattr(request, "body_too_large", False):
        raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    content = getattr(request, "content", None)
    data = content.read(limit + 1) if content is not None else b""
    if len(data) > limit:
        raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    try:
        body = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except _NotSendable as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("request body is nested too deeply", code="invalid_json") from None
    except ValueError:
        raise bad_request("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    if b"\\u" in data:
        # Only an escape can decode to a lone surrogate (UTF-8 input cannot hold one).
        try:
            json_bytes(body)
        except UnicodeEncodeError:
            raise bad_request(
                "request body is not valid JSON: it contains a lone UTF-16 surrogate escape",
                code="invalid_json",
            ) from None
        except RecursionError:
            raise bad_request("request body is nested too deeply", code="invalid_json") from None
    return body


def header(request: IRequest, name: str) -> str | None:
    values = request.requestHeaders.getRawHeaders(name.encode("latin-1"))
    if not values:
        return None
    value: bytes | str = values[0]
    return value.decode("latin-1") if isinstance(value, bytes) else value


# -- fields ------------------------------------------------------------------------------------


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


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request(f"'{name}' must be a positive integer", param=name)
    return value
