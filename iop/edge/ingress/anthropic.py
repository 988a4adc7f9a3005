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
  :func:`~iop.edge.ingress.bridge.messages_to_chat` → tunnel ``chat_completions``; the answer,
  streamed or one ``chat.completion``, decoded into canonical events
  (:class:`~iop.edge.ingress.chat_decode.ChatDecoder`) and encoded by
  :class:`~iop.edge.ingress.messages_encode.MessagesEncoder` (:meth:`.Work.relay_chat`). An
  upstream error status comes back with that status in the Anthropic error shape.
- **bridge** on a run provider (Ollama, CLI agents): the converted chat request is the run input;
  :class:`~iop.edge.ingress.messages_encode.RunEventsToMessages` /
  :func:`~iop.edge.ingress.messages_encode.run_events_to_message` answer (the run's canonical
  events through the Messages encoder).
- **over Responses** (an ``openai_responses`` profile): :func:`over_responses` — the bridge's
  Chat request translated once more (:func:`~iop.edge.ingress.chat_responses.chat_to_responses`),
  tunnel ``responses``, the answer decoded into canonical events
  (:class:`~iop.edge.ingress.chat_responses.ResponsesDecoder`) and encoded by
  :class:`~iop.edge.ingress.messages_encode.MessagesEncoder`. An upstream error status comes
  back with that status in the Anthropic error shape.

Thinking blocks reach the client only when the profile allows them over the bridge
(:func:`~iop.edge.ingress.profiles.thinking_allowed`) and the request asked for thinking. A
normalized run's thinking budget is the request's ``budget_tokens`` when thinking is enabled,
0 when it is disabled, else the model's ``default_thinking_token_budget``.

Before a provider is chosen, every body is checked by :mod:`iop.edge.ingress.validate` (the
fields the Edge reads, their types and bounds, the shape of messages, system, tools and
thinking); unknown fields pass through untouched.

``max_tokens`` is required by the Messages API; a model with ``default_max_tokens`` fills it in
when the request has none, and ``min_max_tokens`` is a floor.

``POST /v1/messages/count_tokens``: a model with a ``token_counter`` answers locally
(``{"input_tokens": N}``, :func:`~iop.edge.ingress.tokens.count_tokens`) without choosing a
provider. Otherwise every candidate must be an ``anthropic_messages`` provider with
``count_tokens`` (:func:`~iop.edge.ingress.profiles.check_count_tokens`) and the request is
tunneled (operation ``count_tokens``); else 400 ``unsupported``.

``GET /v1/models`` asked with an ``anthropic-version`` header (as the Anthropic SDK does) gets
the Anthropic list shape (:class:`AnthropicCatalog`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from iop.config.model import ModelConfig, ProfileConfig
from iop.edge.ingress import canonical
from iop.edge.ingress.bridge import BridgeError, messages_to_chat, thinking_requested
from iop.edge.ingress.chat_responses import ResponsesDecoder, chat_to_responses
from iop.edge.ingress.errors import ApiError, bad_request, unsupported
from iop.edge.ingress.http import (
    header,
    json_bytes,
    optional_bool,
    positive_int,
    render_json,
    required_model,
)
from iop.edge.ingress.messages_encode import (
    Event,
    MessagesEncoder,
    RunEventsToMessages,
    UpstreamError,
    format_sse,
    run_events_to_message,
)
from iop.edge.ingress.pipeline import Call
from iop.edge.ingress.policy import max_tokens_for, thinking_budget_for
from iop.edge.ingress.profiles import (
    Route,
    Unsupported,
    check_count_tokens,
    check_messages,
    thinking_allowed,
)
from iop.edge.ingress.relay import PassThrough, Work, json_headers
from iop.edge.ingress.sources import Gateway
from iop.edge.ingress.tokens import count_tokens, estimate_prompt_tokens_messages
from iop.edge.ingress.validate import check_anthropic_count_tokens, check_anthropic_messages
from iop.edge.placement import Placement
from iop.runtime.events import RuntimeEvent
from iop.runtime.kinds import images_of

__all__ = [
    "DEFAULT_ANTHROPIC_VERSION",
    "AnthropicCatalog",
    "CountTokensCodec",
    "MessagesCodec",
]

DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


def _is_success(status: int) -> bool:
    return 200 <= status < 300


class AnthropicCatalog:
    """``GET /v1/models`` asked with ``anthropic-version``: the Anthropic list shape."""

    def __init__(self, gateway: Gateway, clock: IReactorTime) -> None:
        self._gateway = gateway
        self._created = datetime.fromtimestamp(int(clock.seconds()), UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def entry(self, model_id: str) -> dict[str, Any]:
        config = self._gateway.model(model_id)
        display = config.display_name if config is not None and config.display_name else model_id
        return {
            "type": "model",
            "id": model_id,
            "display_name": display,
            "created_at": self._created,
        }

    def listing(self, ids: list[str]) -> dict[str, Any]:
        return {
            "data": [self.entry(m) for m in ids],
            "has_more": False,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
        }


def _native_headers(request: IRequest, stream: bool) -> list[tuple[str, str]]:
    headers = json_headers(stream)
    version = header(request, "anthropic-version") or DEFAULT_ANTHROPIC_VERSION
    headers.append(("anthropic-version", version))
    beta = header(request, "anthropic-beta")
    if beta:
        headers.append(("anthropic-beta", beta))
    return headers


def _messages_list(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty list")


class MessagesCodec:
    """``POST /v1/messages``: native over an ``anthropic_messages`` tunnel, else bridged."""

    needs_candidates = True
    metered = True

    def decode(self, body: dict[str, Any]) -> Call:
        model = required_model(body)
        stream = optional_bool(body, "stream")
        _messages_list(body)
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("'tools' must be a list")
        check_anthropic_messages(body)
        return Call(
            model,
            body,
            stream=stream,
            tools=bool(tools),
            max_output_tokens=positive_int(body, "max_tokens"),
        )

    def prepare(self, call: Call, policy: ModelConfig | None) -> Call:
        limit = max_tokens_for(positive_int(call.body, "max_tokens"), policy)
        if limit is None:
            raise bad_request("'max_tokens' is required")
        body = {**call.body, "max_tokens": limit}
        # The policy the body was shaped by stays the request's, also while it waits in the pool.
        return replace(
            call,
            body=body,
            prompt_tokens=estimate_prompt_tokens_messages(body),
            facts={"policy": policy},
        )

    def local(self, call: Call, policy: ModelConfig | None) -> None:
        return None

    def serves(self, profile: ProfileConfig | None, call: Call) -> Route:
        return check_messages(profile, stream=call.stream, tools=call.tools)

    async def answer(self, work: Work, call: Call) -> bytes:
        placement = work.placement
        body, stream = call.body, call.stream
        policy: ModelConfig | None = call.facts["policy"]
        model = placement.model
        try:
            route = check_messages(placement.profile, stream=stream, tools=call.tools)
            if route == Route.NATIVE and placement.wire != "tunnel":
                raise Unsupported("native Anthropic Messages are served only through a tunnel")
            if route == Route.OVER_RESPONSES and placement.wire != "tunnel":
                raise Unsupported("a native Responses provider is served only through a tunnel")
        except Unsupported as e:
            raise unsupported(e.message) from None
        if route == Route.NATIVE:
            payload = dict(body)
            payload["model"] = placement.target
            return await work.relay(
                PassThrough(),
                work.tunnel("messages", payload, stream, _native_headers(work.request, stream)),
            )
        if route == Route.OVER_RESPONSES:
            return await over_responses(work, body)
        allowed = thinking_allowed(placement.profile)
        try:
            chat = messages_to_chat(
                body,
                target=placement.target,
                thinking_allowed=allowed,
                images=_images_for(placement),
            )
        except BridgeError as e:
            raise bad_request(e.message) from None
        show = allowed and thinking_requested(body)
        if placement.wire == "tunnel":
            encoder = MessagesEncoder(model=model, thinking_allowed=show)

            def encode(events: list[canonical.Event]) -> bytes:
                return _sse(encoder.encode(events))

            def as_message(events: list[canonical.Event]) -> bytes:
                encoder.encode(events)
                return render_json(work.request, encoder.message())

            return await work.relay_chat(chat, stream, encode, as_message)
        converter = RunEventsToMessages(model=model, thinking_allowed=show)

        def feed(event: RuntimeEvent) -> bytes:
            return _sse(converter.feed(event))

        def whole(events: list[RuntimeEvent]) -> bytes:
            try:
                message = run_events_to_message(events, model=model, thinking_allowed=show)
            except UpstreamError as e:
                raise ApiError(502, e.message, code="upstream_error") from None
            return render_json(work.request, message)

        return await work.relay_run(
            stream,
            feed,
            whole,
            input=json_bytes(chat).decode(),
            max_tokens=int(chat.get("max_tokens") or 0),
            thinking_token_budget=_thinking_budget(body, policy),
        )


async def over_responses(work: Work, body: dict[str, Any]) -> bytes:
    """
    A Messages request on a native Responses provider: Messages → Chat (the bridge's request
    rules) → Responses (:func:`~.chat_responses.chat_to_responses`), tunnel ``responses``; the
    answer decoded into canonical events (:class:`~.chat_responses.ResponsesDecoder`) and
    encoded by :class:`~.messages_encode.MessagesEncoder`, streamed or whole. An upstream
    error status comes back with that status in the Anthropic shape.
    """
    placement = work.placement
    stream = body.get("stream") is True
    allowed = thinking_allowed(placement.profile)
    try:
        chat = messages_to_chat(
            body, target=placement.target, thinking_allowed=allowed, images=_images_for(placement)
        )
        request = chat_to_responses(
            chat, target=placement.target, max_output_tokens=chat.get("max_tokens")
        )
    except BridgeError as e:
        raise bad_request(e.message) from None
    encoder = MessagesEncoder(
        model=placement.model, thinking_allowed=allowed and thinking_requested(body)
    )

    def encode(events: list[canonical.Event]) -> bytes:
        return _sse(encoder.encode(events))

    def whole(events: list[canonical.Event]) -> bytes:
        encoder.encode(events)
        return render_json(work.request, encoder.message())

    # Tool calls stream as they come (the Messages encoder reads their fragments).
    return await work.relay_decoded(
        "responses", request, json_headers(stream), stream, ResponsesDecoder, encode, whole
    )


class CountTokensCodec:
    """``POST /v1/messages/count_tokens``: counted locally, or tunneled to a native provider."""

    needs_candidates = True
    # count_tokens generates nothing: no key's limits or budgets apply.
    metered = False

    def decode(self, body: dict[str, Any]) -> Call:
        model = required_model(body)
        _messages_list(body)
        check_anthropic_count_tokens(body)
        return Call(model, body)

    def prepare(self, call: Call, policy: ModelConfig | None) -> Call:
        return call

    def local(self, call: Call, policy: ModelConfig | None) -> dict[str, Any] | None:
        if policy is not None and policy.token_counter:
            return {"input_tokens": count_tokens(call.body)}
        return None

    def serves(self, profile: ProfileConfig | None, call: Call) -> Route:
        return check_count_tokens(profile)

    async def answer(self, work: Work, call: Call) -> bytes:
        placement = work.placement
        try:
            check_count_tokens(placement.profile)
            if placement.wire != "tunnel":
                raise Unsupported("count_tokens is served only through a provider tunnel")
        except Unsupported as e:
            raise unsupported(e.message) from None
        payload = dict(call.body)
        payload["model"] = placement.target
        return await work.relay(
            PassThrough(),
            work.tunnel("count_tokens", payload, False, _native_headers(work.request, False)),
        )


def _images_for(placement: Placement) -> str:
    """What images the provider's kind takes (:mod:`iop.runtime.kinds`)."""
    return str(images_of(placement.provider_type))


def _thinking_budget(body: dict[str, Any], policy: ModelConfig | None) -> int:
    """A run's thinking budget: the request's when enabled, 0 when disabled, else the model's."""
    thinking = body.get("thinking")
    budget = thinking_budget_for(policy)
    if isinstance(thinking, dict):
        if thinking.get("type") == "disabled":
            budget = 0
        elif thinking.get("type") == "enabled" and isinstance(thinking.get("budget_tokens"), int):
            budget = int(thinking["budget_tokens"])
    return budget


def _sse(events: list[Event]) -> bytes:
    return b"".join(format_sse(name, data) for name, data in events)
