# -*- test-case-name: iop.test.edge.ingress.test_anthropic -*-
"""
The Anthropic-compatible client surface.

``POST /v1/messages``, streaming or not. The provider the gateway chose decides the route
(:func:`iop.edge.ingress.profiles.check_messages`):

- **native** (an ``anthropic_messages`` profile): tunnel operation ``messages``; the client's
  body with ``model`` replaced by the served target and the output-limit policy applied, the
  client's ``anthropic-version`` (default ``2023-06-01``) and ``anthropic-beta`` headers; the
  provider's status, content type and bytes come back untouched.
- **bridge** on a tunnel provider (an ``openai_chat`` profile, or none):
  :func:`~iop.edge.ingress.bridge.messages_to_chat` → tunnel ``chat_completions`` → the SSE
  parsed with :class:`~iop.node.adapters.sse.SSEParser` and converted by
  :class:`~iop.edge.ingress.bridge.ChatStreamToMessages` (or one ``chat.completion`` by
  :func:`~iop.edge.ingress.bridge.chat_completion_to_message`). An upstream error status comes
  back with that status in the Anthropic error shape.
- **bridge** on a run provider (Ollama, CLI agents): the converted chat request is the run input;
  :class:`~iop.edge.ingress.bridge.RunEventsToMessages` /
  :func:`~iop.edge.ingress.bridge.run_events_to_message` answer.

Thinking blocks reach the client only when the profile allows them over the bridge
(:func:`~iop.edge.ingress.profiles.thinking_allowed`) and the request asked for thinking. A
normalized run's thinking budget is the request's ``budget_tokens`` when thinking is enabled,
0 when it is disabled, else the model's ``default_thinking_token_budget``.

``max_tokens`` is required by the Messages API; a model with ``default_max_tokens`` fills it in
when the request has none, and ``min_max_tokens`` is a floor.

``POST /v1/messages/count_tokens``: a model with a ``token_counter`` answers locally
(``{"input_tokens": N}``, :func:`~iop.edge.ingress.tokens.count_tokens`) without choosing a
provider. Otherwise every candidate must be an ``anthropic_messages`` provider with
``count_tokens`` (:func:`~iop.edge.ingress.profiles.check_count_tokens`) and the request is
tunneled (operation ``count_tokens``); else 400 ``unsupported``.

``GET /v1/models`` asked with an ``anthropic-version`` header (as the Anthropic SDK does) gets
the Anthropic list shape (:meth:`AnthropicSurface.models`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from twisted.internet.interfaces import IReactorTime

from iop.config.model import ClientAPIConfig, ModelConfig, ProfileConfig
from iop.edge.dispatch import RunHandle
from iop.edge.gateway import Dispatch
from iop.edge.ingress.bridge import (
    BridgeError,
    ChatStreamToMessages,
    Event,
    RunEventsToMessages,
    UpstreamError,
    chat_completion_to_message,
    format_sse,
    messages_to_chat,
    run_events_to_message,
    thinking_requested,
)
from iop.edge.ingress.common import (
    ApiError,
    Exchange,
    Gateway,
    authenticate,
    authorize,
    bad_request,
    collect_body,
    collect_run,
    dispatch,
    dispatch_error,
    header,
    json_bytes,
    max_tokens_for,
    open_tunnel,
    optional_bool,
    positive_int,
    read_json,
    relay_tunnel,
    render_json,
    required_model,
    stream_run,
    thinking_budget_for,
    unsupported,
    upstream_error,
)
from iop.edge.ingress.profiles import (
    Route,
    Unsupported,
    check_count_tokens,
    check_messages,
    thinking_allowed,
)
from iop.edge.ingress.tokens import count_tokens, estimate_prompt_tokens_messages
from iop.edge.tunnel import TunnelFailed, TunnelStream
from iop.node.adapters.sse import SSEError, SSEEvent, SSEParser
from iop.runtime.events import RuntimeEvent

__all__ = ["DEFAULT_ANTHROPIC_VERSION", "AnthropicSurface"]

DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


def _is_success(status: int) -> bool:
    return 200 <= status < 300


class AnthropicSurface:
    """The Anthropic-compatible routes' logic (Klein routing lives in :mod:`.app`)."""

    def __init__(self, gateway: Gateway, config: ClientAPIConfig, clock: IReactorTime) -> None:
        self._gateway = gateway
        self._config = config
        self._clock = clock
        self._created = datetime.fromtimestamp(int(clock.seconds()), UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    # -- catalog -----------------------------------------------------------------------------

    def _model_entry(self, model_id: str) -> dict[str, Any]:
        config = self._gateway.model(model_id)
        display = config.display_name if config is not None and config.display_name else model_id
        return {
            "type": "model",
            "id": model_id,
            "display_name": display,
            "created_at": self._created,
        }

    async def models(self, exchange: Exchange) -> bytes:
        key = authenticate(exchange.request, self._config)
        ids = [m for m in self._gateway.model_ids() if key is None or key.allows(m)]
        return render_json(
            exchange.request,
            {
                "data": [self._model_entry(m) for m in ids],
                "has_more": False,
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
            },
        )

    async def model(self, exchange: Exchange, model_id: str) -> bytes:
        key = authenticate(exchange.request, self._config)
        authorize(key, model_id)
        self._require(model_id)
        return render_json(exchange.request, self._model_entry(model_id))

    def _require(self, model: str) -> None:
        if model not in self._gateway.model_ids():
            raise ApiError(404, f"model {model!r} does not exist", code="model_not_found")

    def _check_candidates(
        self, model: str, check: Callable[[ProfileConfig | None], object]
    ) -> None:
        profiles = self._gateway.candidate_profiles(model)
        if not profiles:
            raise unsupported(f"model {model!r} has no provider that can serve this request")
        for profile in profiles:
            try:
                check(profile)
            except Unsupported as e:
                raise unsupported(e.message) from None

    @staticmethod
    def _headers(stream: bool) -> list[tuple[str, str]]:
        return [
            ("content-type", "application/json"),
            ("accept", "text/event-stream" if stream else "application/json"),
        ]

    def _native_headers(self, exchange: Exchange, stream: bool) -> list[tuple[str, str]]:
        headers = self._headers(stream)
        version = header(exchange.request, "anthropic-version") or DEFAULT_ANTHROPIC_VERSION
        headers.append(("anthropic-version", version))
        beta = header(exchange.request, "anthropic-beta")
        if beta:
            headers.append(("anthropic-beta", beta))
        return headers

    def _tunnel(
        self,
        chosen: Dispatch,
        operation: str,
        payload: dict[str, Any],
        stream: bool,
        headers: list[tuple[str, str]],
    ) -> TunnelStream:
        return open_tunnel(self._gateway, chosen, operation, payload, stream, headers)

    # -- messages ----------------------------------------------------------------------------

    async def messages(self, exchange: Exchange) -> bytes:
        request = exchange.request
        key = authenticate(request, self._config)
        body = read_json(request, self._config.max_body_bytes)
        model = required_model(body)
        authorize(key, model)
        stream = optional_bool(body, "stream")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty list")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("'tools' must be a list")
        hasTools = bool(tools)
        self._require(model)
        policy = self._gateway.model(model)
        limit = max_tokens_for(positive_int(body, "max_tokens"), policy)
        if limit is None:
            raise bad_request("'max_tokens' is required")
        body = {**body, "max_tokens": limit}
        self._check_candidates(
            model, lambda profile: check_messages(profile, stream=stream, tools=hasTools)
        )
        chosen = await dispatch(
            self._gateway, exchange, model, estimate_prompt_tokens_messages(body)
        )
        try:
            route = check_messages(chosen.profile, stream=stream, tools=hasTools)
            if route == Route.NATIVE and chosen.wire != "tunnel":
                raise Unsupported("native Anthropic Messages are served only through a tunnel")
        except Unsupported as e:
            chosen.release()
            raise unsupported(e.message) from None
        if route == Route.NATIVE:
            payload = dict(body)
            payload["model"] = chosen.target
            tunnel = self._tunnel(
                chosen, "messages", payload, stream, self._native_headers(exchange, stream)
            )
            await relay_tunnel(exchange, tunnel)
            return b""
        allowed = thinking_allowed(chosen.profile)
        try:
            chat = messages_to_chat(body, target=chosen.target, thinking_allowed=allowed)
        except BridgeError as e:
            chosen.release()
            raise bad_request(e.message) from None
        show = allowed and thinking_requested(body)
        if chosen.wire == "tunnel":
            tunnel = self._tunnel(chosen, "chat_completions", chat, stream, self._headers(stream))
            if stream:
                await self._bridgeStream(exchange, tunnel, model, show)
                return b""
            status, _, data = await collect_body(exchange, tunnel)
            if not _is_success(status):
                raise upstream_error(status, data)
            try:
                completion = json.loads(data)
                message = chat_completion_to_message(completion, model=model, thinking_allowed=show)
            except (ValueError, UpstreamError) as e:
                text = e.message if isinstance(e, UpstreamError) else "not JSON"
                raise ApiError(
                    502, f"the provider's answer could not be converted: {text}"
                ) from None
            return render_json(exchange.request, message)
        handle = self._run(chosen, chat, body, policy)
        if stream:
            converter = RunEventsToMessages(model=model, thinking_allowed=show)

            def convert(event: RuntimeEvent) -> bytes:
                return _sse(converter.feed(event))

            await stream_run(exchange, handle, "text/event-stream", convert)
            return b""
        events = await collect_run(exchange, handle)
        try:
            message = run_events_to_message(events, model=model, thinking_allowed=show)
        except UpstreamError as e:
            raise ApiError(502, e.message, code="upstream_error") from None
        return render_json(exchange.request, message)

    def _run(
        self,
        chosen: Dispatch,
        chat: dict[str, Any],
        body: dict[str, Any],
        policy: ModelConfig | None,
    ) -> RunHandle:
        thinking = body.get("thinking")
        budget = thinking_budget_for(policy)
        if isinstance(thinking, dict):
            if thinking.get("type") == "disabled":
                budget = 0
            elif thinking.get("type") == "enabled" and isinstance(
                thinking.get("budget_tokens"), int
            ):
                budget = int(thinking["budget_tokens"])
        try:
            return self._gateway.run(
                chosen,
                input=json_bytes(chat).decode(),
                max_tokens=int(chat.get("max_tokens") or 0),
                thinking_token_budget=budget,
            )
        except Exception as e:
            mapped = dispatch_error(e)
            if mapped is None:
                raise
            raise mapped from None

    async def _bridgeStream(
        self, exchange: Exchange, tunnel: TunnelStream, model: str, show: bool
    ) -> None:
        """A streamed Chat answer through a tunnel, converted to Anthropic stream events."""
        exchange.onGone(lambda: tunnel.cancel("client disconnected"))
        try:
            status, _ = await tunnel.whenStarted()
        except TunnelFailed as e:
            raise dispatch_error(e) or e from None
        if not _is_success(status):
            chunks: list[bytes] = []
            tunnel.deliverBody(chunks.append)
            await tunnel.whenDone()
            raise upstream_error(status, b"".join(chunks))
        converter = ChatStreamToMessages(model=model, thinking_allowed=show)
        parser = SSEParser()
        exchange.start(200, "text/event-stream")
        request = exchange.request
        registered = not exchange.gone
        if registered:
            request.registerProducer(tunnel, True)  # type: ignore[attr-defined]

        def emit(events: list[Event]) -> None:
            exchange.write(_sse(events))
            if any(name == "error" for name, _ in events) and tunnel.outcome is None:
                # The answer failed before the provider's body ended: stop the provider.
                tunnel.cancel("the provider's stream could not be converted")

        def events(items: list[SSEEvent]) -> None:
            for item in items:
                if converter.done:
                    return
                if item.is_done:
                    emit(converter.finish())
                    continue
                try:
                    chunk = json.loads(item.data)
                except ValueError:
                    emit(converter.fail("the provider sent a malformed stream chunk"))
                    return
                emit(converter.feed(chunk))

        def take(data: bytes) -> None:
            if converter.done:
                return
            try:
                items = parser.feed(data)
            except SSEError as e:
                emit(converter.fail(f"the provider's stream is malformed: {e}"))
                return
            events(items)

        tunnel.deliverBody(take)
        outcome = await tunnel.whenDone()
        if registered and not exchange.gone:
            request.unregisterProducer()  # type: ignore[attr-defined]
        if not converter.done:
            events(parser.finish())
        if not converter.done:
            if outcome.ok:
                emit(converter.finish())
            else:
                emit(converter.fail(f"the provider's stream failed: {outcome.error}"))

    # -- count_tokens ------------------------------------------------------------------------

    async def count_tokens(self, exchange: Exchange) -> bytes:
        request = exchange.request
        key = authenticate(request, self._config)
        body = read_json(request, self._config.max_body_bytes)
        model = required_model(body)
        authorize(key, model)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty list")
        self._require(model)
        policy = self._gateway.model(model)
        if policy is not None and policy.token_counter:
            return render_json(request, {"input_tokens": count_tokens(body)})
        self._check_candidates(model, check_count_tokens)
        chosen = await dispatch(self._gateway, exchange, model, 0)
        try:
            check_count_tokens(chosen.profile)
            if chosen.wire != "tunnel":
                raise Unsupported("count_tokens is served only through a provider tunnel")
        except Unsupported as e:
            chosen.release()
            raise unsupported(e.message) from None
        payload = dict(body)
        payload["model"] = chosen.target
        tunnel = self._tunnel(
            chosen, "count_tokens", payload, False, self._native_headers(exchange, False)
        )
        await relay_tunnel(exchange, tunnel)
        return b""


def _sse(events: list[Event]) -> bytes:
    return b"".join(format_sse(name, data) for name, data in events)
