# -*- test-case-name: iop.test.edge.ingress.test_app -*-
"""
The client listener's Klein app: the OpenAI- and Anthropic-compatible surfaces on one port.

The route table (:attr:`ClientApp.routes`) names each route once — method, path, surface,
operation, and what serves it — and is both the Klein router's rules and the exact-path fast
path (:meth:`ClientApp.direct`). Every route runs :class:`~.pipeline.Pipeline`'s stages:

=====================================  =========================================================
``GET /v1/models``                      the catalog (OpenAI list; Anthropic list when the
                                        request carries ``anthropic-version``)
``GET /v1/models/{id}``                 one model, same rule
``POST /v1/chat/completions``           :class:`.openai.ChatCodec`
``POST /v1/responses``                  :class:`.openai.ResponsesCodec`
``POST /v1/messages``                   :class:`.anthropic.MessagesCodec`
``POST /v1/messages/count_tokens``      :class:`.anthropic.CountTokensCodec`
``OPTIONS`` any of these                CORS preflight, with ``openai.cors`` only (:mod:`.cors`)
=====================================  =========================================================

Every error is a JSON body in the shape of the surface asked (see :mod:`.errors`); an unknown
path or method gets the Anthropic shape under ``/v1/messages`` or with an ``anthropic-version``
header, the OpenAI shape otherwise. An unexpected failure is logged and answered 500 (or, once a
stream has started, the connection is cut).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from klein import Klein
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET

from iop.config.model import ClientAPIConfig
from iop.edge.descriptors import ClientCaps
from iop.edge.ingress.anthropic import AnthropicCatalog, CountTokensCodec, MessagesCodec
from iop.edge.ingress.cors import CorsPolicy, CorsResource
from iop.edge.ingress.errors import ANTHROPIC, OPENAI, ApiError, bad_request
from iop.edge.ingress.http import ClientSite, header, render_error
from iop.edge.ingress.openai import ChatCodec, OpenAICatalog, ResponsesCodec
from iop.edge.ingress.pipeline import Catalog, Codec, Pipeline
from iop.edge.ingress.record import Publish, RequestRecord
from iop.edge.ingress.relay import Exchange
from iop.edge.ingress.requestid import RequestIdResource
from iop.edge.ingress.sources import Gateway
from iop.edge.quota import QuotaGate
from iop.telemetry.tracing import TRACING_OFF, Tracing

__all__ = ["ApiRoute", "ClientApp"]

# Serves one routed request: the exchange and the path's arguments (``model_id``).
Serve = Callable[[Exchange, dict[str, str]], Awaitable[bytes]]


def surface_of(request: IRequest) -> str:
    """Which surface's error shape a request expects."""
    path = request.path.decode("latin-1", errors="replace")  # type: ignore[attr-defined]
    if path.startswith("/v1/messages") or header(request, "anthropic-version") is not None:
        return ANTHROPIC
    return OPENAI


@dataclass(frozen=True)
class ApiRoute:
    """One client API route: where, which surface's shape (None: by the request), what."""

    method: str
    path: str
    surface: str | None
    operation: str
    serve: Serve

    @property
    def exact(self) -> bool:
        """A path without arguments: found by its bytes alone (the fast path)."""
        return "<" not in self.path


class ClientApp:
    """The client HTTP API; :meth:`site` is what the ``openai.listen`` endpoint serves."""

    log = Logger()

    def __init__(
        self,
        gateway: Gateway,
        config: ClientAPIConfig,
        clock: IReactorTime,
        publish: Publish | None = None,
        gate: QuotaGate | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self._config = config
        self._clock = clock
        # Requests whose handler is running (placed work included): what a drain waits for.
        self.active = 0
        # Each finished request's record goes here (the Edge's event bus); None: not recorded.
        self._publish = publish
        # The Edge's tracing (telemetry:): the pipeline makes each generation request's spans.
        self.pipeline = Pipeline(gateway, config, clock, gate, tracing)
        self.chat = ChatCodec(gateway, clock)
        self.responses = ResponsesCodec(gateway, clock)
        self.messages = MessagesCodec()
        self.count_tokens = CountTokensCodec()
        self._catalogs: dict[str, Catalog] = {
            OPENAI: OpenAICatalog(clock),
            ANTHROPIC: AnthropicCatalog(gateway, clock),
        }
        # The route table: declared once, for the router and the fast path alike.
        self.routes: tuple[ApiRoute, ...] = (
            ApiRoute("GET", "/v1/models", None, "models", self._models),
            ApiRoute("GET", "/v1/models/<path:model_id>", None, "models", self._models),
            ApiRoute(
                "POST", "/v1/chat/completions", OPENAI, "chat", self._generate(self.chat, "chat")
            ),
            ApiRoute(
                "POST",
                "/v1/responses",
                OPENAI,
                "responses",
                self._generate(self.responses, "responses"),
            ),
            ApiRoute(
                "POST",
                "/v1/messages",
                ANTHROPIC,
                "messages",
                self._generate(self.messages, "messages"),
            ),
            ApiRoute(
                "POST",
                "/v1/messages/count_tokens",
                ANTHROPIC,
                "count_tokens",
                self._generate(self.count_tokens, "count_tokens"),
            ),
        )
        self.app = Klein()
        for number, route in enumerate(self.routes):
            self.app.route(route.path, methods=[route.method], endpoint=f"route{number}")(
                self._routed(route)
            )
        self.app.handle_errors(Exception)(self.error)
        # The fast path: the generation routes (POST, exact paths) by path bytes (:meth:`direct`).
        self._direct: dict[bytes, ApiRoute] = {
            r.path.encode(): r for r in self.routes if r.method == "POST" and r.exact
        }

    # The serving functions return the pipeline's coroutine itself: no coroutine of their own.

    def _generate(self, codec: Codec, operation: str) -> Serve:
        def serve(exchange: Exchange, arguments: dict[str, str]) -> Awaitable[bytes]:
            return self.pipeline.generate(exchange, codec, operation)

        return serve

    def _models(self, exchange: Exchange, arguments: dict[str, str]) -> Awaitable[bytes]:
        catalog = self._catalogs[surface_of(exchange.request)]
        return self.pipeline.models(exchange, catalog, arguments.get("model_id"))

    def _routed(self, route: ApiRoute) -> Callable[..., Awaitable[bytes]]:
        async def routed(request: IRequest, **arguments: str) -> bytes:
            return await self._guard(request, route, arguments)

        return routed

    def _record(self, request: IRequest, surface: str, operation: str) -> RequestRecord | None:
        if self._publish is None:
            return None
        return RequestRecord(request, surface, operation, self._clock, self._publish)

    async def _guard(
        self, request: IRequest, route: ApiRoute, arguments: dict[str, str] | None = None
    ) -> bytes:
        surface = route.surface or surface_of(request)
        record = self._record(request, surface, route.operation)
        self.active += 1
        try:
            return await self._handle(Exchange(request, record), surface, route, arguments or {})
        finally:
            self.active -= 1
            if record is not None:
                record.handler_done()

    async def _handle(
        self, exchange: Exchange, surface: str, route: ApiRoute, arguments: dict[str, str]
    ) -> bytes:
        request = exchange.request
        try:
            return await route.serve(exchange, arguments)
        except ApiError as e:
            if exchange.started:
                self.log.warn(
                    "client request failed after its response started: {error}",
                    error=e.message,
                    status=e.status,
                    **exchange.log_context(),
                )
                exchange.abort()
                return b""
            return render_error(request, surface, e)
        except CancelledError:
            raise
        except Exception:
            self.log.failure(
                "client request failed", None, LogLevel.critical, **exchange.log_context()
            )
            if exchange.started:
                exchange.abort()
                return b""
            return render_error(request, surface, ApiError(500, "internal error"))

    def direct(self, request: IRequest) -> object | None:
        """
        Serve a ``POST`` to one of the table's generation routes (``/v1/chat/completions``,
        ``/v1/responses``, ``/v1/messages``, ``/v1/messages/count_tokens``, exactly) without
        the router: found by its exact path, run and answered as Klein would (the same route,
        its bytes written, the request finished, cancelled when the client goes away, an
        unexpected failure answered by :meth:`error`). Anything else — other methods, other
        paths, a path Klein would
        redirect — returns None and goes to the router.
        """
        if request.method != b"POST":
            return None
        route = self._direct.get(request.path)  # type: ignore[attr-defined]
        if route is None:
            return None
        d = Deferred.fromCoroutine(self._guard(request, route))
        finished = False

        def gone(result: object) -> object:
            nonlocal finished
            finished = True
            if isinstance(result, Failure):
                d.cancel()
            return None

        request.notifyFinish().addBoth(gone)  # type: ignore[attr-defined]

        def write(body: bytes) -> None:
            if body:
                request.write(body)
            if not finished:
                request.finish()

        def failed(failure: Failure) -> None:
            if finished:
                if not failure.check(CancelledError):
                    self.log.failure("client request failed after it ended", failure)
                return
            write(self.error(request, failure))

        d.addCallbacks(write, failed)
        d.addErrback(lambda f: self.log.failure("writing a client response failed", f))
        return NOT_DONE_YET

    def error(self, request: IRequest, failure: Any) -> bytes:
        from werkzeug.exceptions import HTTPException, MethodNotAllowed

        exc = failure.value
        surface = surface_of(request)
        if RequestRecord.of(request) is None:
            # Refused before any handler (no route, wrong method): recorded here.
            record = self._record(request, surface, "unrouted")
            if record is not None:
                record.handler_done()
        if isinstance(exc, HTTPException):
            code = exc.code or 500
            method = request.method.decode("latin-1", errors="replace")
            path = request.path.decode("latin-1", errors="replace")  # type: ignore[attr-defined]
            if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
                # RFC 9110 §15.5.6: a 405 names the methods the resource has.
                request.setHeader(b"allow", ", ".join(sorted(exc.valid_methods)).encode())
            if 300 <= code < 400:
                # The router's redirect to a canonical path (``//`` merged): an API names its
                # routes exactly, so a path that is not one of them is not found.
                code = 404
            message = (
                f"no route for {method} {path}"
                if code in (404, 405)
                else (exc.description or exc.name)
            )
            return render_error(request, surface, ApiError(code, message))
        self.log.failure("client request failed", failure)
        return render_error(request, surface, ApiError(500, "internal error"))

    def resource(self) -> IResource:
        resource: IResource = _TextURL(self.app.resource(), self.direct)
        if self._config.cors is not None:
            resource = CorsResource(
                resource,
                CorsPolicy(self._config.cors),
                self.allowed_methods,
                surface_of,
                render_error,
            )
        # Outermost: every answer, a preflight's and a refusal's too, carries the request's id.
        return RequestIdResource(resource, surface_of, self._clock)

    def allowed_methods(self, path: str) -> list[str]:
        """The methods the app serves at ``path`` (none: no route there); with CORS on, every
        route also answers ``OPTIONS`` (:mod:`.cors`)."""
        methods = set(self.app.url_map.bind("").allowed_methods(path))
        if methods and self._config.cors is not None:
            methods.add("OPTIONS")
        return sorted(methods)

    def methods(self) -> set[str]:
        """Every method some route serves."""
        methods = {m for rule in self.app.url_map.iter_rules() for m in rule.methods or ()}
        if self._config.cors is not None:
            methods.add("OPTIONS")
        return methods

    def site(self, caps: ClientCaps | None = None) -> ClientSite:
        """The ``Site`` for the client listener, enforcing ``openai:``'s limits (its connection
        caps as ``caps``, what the Edge can afford; None: as configured)."""
        return ClientSite(
            self.resource(),
            self._config,
            self._clock,
            methods=self.methods(),
            allowed_methods=self.allowed_methods,
            publish=self._publish,
            caps=caps,
        )


class _TextURL(Resource):
    """
    The app's resource, behind a check that the host and path decode as UTF-8: Klein refuses
    them otherwise with a text body and a logged traceback; this answers the surface's 400.
    Then ``direct`` (:meth:`ClientApp.direct`) serves what it knows without the router.
    """

    isLeaf = True

    def __init__(self, inner: IResource, direct: Callable[[IRequest], object | None]) -> None:
        super().__init__()
        self._inner = inner
        self._direct = direct

    def render(self, request: IRequest) -> Any:
        try:
            request.getRequestHostname().decode("utf-8")
            b"/".join(request.prepath + request.postpath).decode("utf-8")  # type: ignore[attr-defined]
        except UnicodeDecodeError:
            message = "the request's host or path is not UTF-8"
            return render_error(request, surface_of(request), bad_request(message))
        served = self._direct(request)
        if served is not None:
            return served
        return self._inner.render(request)
