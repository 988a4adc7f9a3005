# -*- test-case-name: iop.test.edge.ingress.test_openai -*-
"""
The OpenAI-compatible client surface.

- ``GET /v1/models`` (and ``GET /v1/models/{id}``): the catalog — ``models[]`` keys, then
  ``openai.model_routes[]`` ids — in the OpenAI list shape, limited to the models the caller's
  key may use.
- ``POST /v1/chat/completions``, streaming or not. The wire comes from the provider the gateway
  chose:

  - **tunnel** (``openai_compat``/``vllm``): the client's body, with ``model`` replaced by the
    served target and the output-limit policy applied (``max_tokens``/``max_completion_tokens``;
    a request with neither gets ``max_tokens`` when the model has a default), everything else
    as the client sent it — but a stream that does not ask for its usage asks for it
    (``stream_options.include_usage``: the usage settles the key's limits and budgets and goes
    in the ledger) and its usage chunk is kept from the client (:mod:`.stream_usage`). The
    provider's status, content type and body bytes come back untouched otherwise, with
    backpressure.
  - **run** (Ollama, CLI agents): the client's body is the run input (an OpenAI chat request,
    :mod:`iop.runtime.chat_input`); the run's events, converted once into the canonical answer
    stream (:class:`~iop.edge.ingress.canonical.RunDecoder`), become ``chat.completion.chunk``
    SSE or one ``chat.completion`` (:class:`ChatEncoder`). ``delta`` → ``delta.content``,
    ``reasoning_delta`` → ``delta.reasoning_content``, native tool calls
    (``metadata["openai_tool_calls"]``) → ``delta.tool_calls`` / ``message.tool_calls``; tool calls
    written as text are parsed only when ``metadata["openai_text_tool_fallback"] == "true"``
    (and while streaming a request with tools, text that may open such a reply is held back until
    the run completes, so it never reaches the client as content). ``finish_reason`` is
    ``tool_calls`` when there are calls, else the adapter's, else ``stop``; a final usage chunk
    (``choices: []``) follows when the request asked ``stream_options.include_usage``; then
    ``data: [DONE]``. A run that fails after the stream started ends with one
    ``data: {"error": {...}}`` chunk (the OpenAI SDK raises it) and no ``[DONE]``.
  - **bridge** over a native Messages provider (an ``anthropic_messages`` profile: tunnel
    ``messages``, :mod:`iop.edge.ingress.chat_messages`) or a native Responses provider (an
    ``openai_responses`` profile: tunnel ``responses``, :mod:`iop.edge.ingress.chat_responses`):
    the request translated, the provider's answer decoded into canonical events (tool calls as
    start + argument fragments) and encoded by :class:`ChatEncoder` as above; an upstream error
    status comes back with that status in the OpenAI shape.

- ``POST /v1/responses`` (:func:`check_responses` picks the route):

  - **native** (a provider whose protocol profile's driver is ``openai_responses``): tunnel
    operation ``responses``, passed through like a chat tunnel, with the policy applied to
    ``max_output_tokens``.
  - **bridge** (a provider that serves chat completions, or has no profile: tunnels and runs):
    :mod:`iop.edge.ingress.responses` turns the request into a chat request (tunnel
    ``chat_completions``, or the run input) and the answer into Responses events or one
    ``response`` object; a run's canonical events are encoded as Responses events directly
    (:meth:`~iop.edge.ingress.responses.ResponsesEncoder.encode`), a whole answer through the
    Chat encoder's ``chat.completion``.
  - **bridge over Messages** (an ``anthropic_messages`` provider, as Chat's bridge): the chat
    request is translated once more (:func:`~iop.edge.ingress.chat_messages.chat_to_messages`,
    tunnel ``messages``, ``max_tokens`` the policy's limit else
    :data:`~iop.edge.ingress.chat_messages.DEFAULT_MAX_TOKENS`); the streamed answer is decoded
    into canonical events (tool calls as start + argument fragments) and encoded as Responses
    events, a whole answer decoded, made a ``chat.completion`` by the Chat encoder, then a
    ``response``.

Before a provider is chosen, every body is checked by :mod:`iop.edge.ingress.validate` (the
fields the Edge reads, their types and bounds, the shape of messages and tools); unknown fields
pass through untouched.

A model whose candidate providers cannot all serve an operation is refused with 400 before any
provider is chosen: the pool picks by load, never by capability, so a mixed pool would answer
differently from one request to the next.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.interfaces import IReactorTime

from iop.config.model import ModelConfig, ProfileConfig
from iop.edge.ingress.anthropic import DEFAULT_ANTHROPIC_VERSION
from iop.edge.ingress.bridge import BridgeError
from iop.edge.ingress.canonical import Event, Kind, RunDecoder, finish_reason, tool_call
from iop.edge.ingress.chat_messages import DEFAULT_MAX_TOKENS, MessagesDecoder, chat_to_messages
from iop.edge.ingress.chat_responses import ResponsesDecoder, chat_to_responses
from iop.edge.ingress.errors import ApiError, bad_request, run_error, unsupported
from iop.edge.ingress.http import (
    json_bytes,
    optional_bool,
    positive_int,
    render_json,
    required_model,
)
from iop.edge.ingress.pipeline import Call
from iop.edge.ingress.policy import max_tokens_for, thinking_budget_for
from iop.edge.ingress.profiles import Route, Unsupported, thinking_allowed
from iop.edge.ingress.relay import PassThrough, Work, json_headers
from iop.edge.ingress.responses import (
    ResponsesEncoder,
    RunEventsToResponses,
    chat_completion_to_response,
    format_events,
    responses_to_chat,
)
from iop.edge.ingress.sources import Gateway
from iop.edge.ingress.stream_usage import HiddenUsage, ask_for_usage
from iop.edge.ingress.tokens import estimate_prompt_tokens_openai
from iop.edge.ingress.validate import check_openai_chat, check_openai_responses
from iop.runtime.chat_input import InputError, chat_input_from
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.kinds import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES

__all__ = [
    "DRIVER_RESPONSES",
    "ChatCodec",
    "ChatEncoder",
    "OpenAICatalog",
    "ResponsesCodec",
    "RunEventsToChunks",
    "check_chat",
    "check_responses",
    "openai_usage",
]

DRIVER_CHAT = OPENAI_CHAT.name
DRIVER_ANTHROPIC = ANTHROPIC_MESSAGES.name
DRIVER_RESPONSES = OPENAI_RESPONSES.name
DONE = b"data: [DONE]\n\n"
OWNER = "iop"


# -- capability rules --------------------------------------------------------------------------


def check_chat(profile: ProfileConfig | None, *, stream: bool, tools: bool) -> Route:
    """
    How a provider with ``profile`` serves Chat Completions: :attr:`Route.NATIVE` (it speaks
    Chat) or :attr:`Route.BRIDGE` (an ``anthropic_messages`` profile with the ``messages``
    capability and operation: :mod:`.chat_messages` translates; an ``openai_responses``
    profile, the driver alone as for native Responses: :mod:`.chat_responses` translates);
    raises :class:`Unsupported`.
    No profile (a run provider, or an OpenAI-compatible adapter configured without one) is a
    plain chat backend with streaming and tools.
    """
    if profile is None:
        return Route.NATIVE
    route = Route.NATIVE
    chat = profile.driver == DRIVER_CHAT or any(
        name == "chat_completions" for name, _ in profile.operations
    )
    if not chat and profile.driver == DRIVER_ANTHROPIC:
        if "messages" not in profile.capabilities or not any(
            name == "messages" for name, _ in profile.operations
        ):
            raise Unsupported(
                f"protocol profile {profile.name!r} cannot serve chat completions: it needs "
                "the 'messages' capability and a 'messages' operation"
            )
        route = Route.BRIDGE
    elif not chat and profile.driver == DRIVER_RESPONSES:
        route = Route.BRIDGE
    elif not chat:
        raise Unsupported(
            f"protocol profile {profile.name!r} (driver {profile.driver!r}) does not serve "
            "chat completions"
        )
    if stream and "streaming" not in profile.capabilities:
        raise Unsupported(
            f"protocol profile {profile.name!r} does not support streaming "
            "(no 'streaming' capability)"
        )
    if tools and "tools" not in profile.capabilities:
        raise Unsupported(
            f"protocol profile {profile.name!r} does not support tools (no 'tools' capability)"
        )
    return route


def check_responses(profile: ProfileConfig | None, *, stream: bool, tools: bool = False) -> Route:
    """
    How a Responses request reaches a provider with ``profile``: :attr:`Route.NATIVE` (an
    ``openai_responses`` profile: the raw tunnel) or :attr:`Route.BRIDGE` (a provider that
    serves Chat Completions, natively or over a native Messages provider, :func:`check_chat`,
    or no profile: the Responses bridge); raises :class:`Unsupported`.
    """
    if profile is not None and profile.driver == DRIVER_RESPONSES:
        if stream and "streaming" not in profile.capabilities:
            raise Unsupported(
                f"protocol profile {profile.name!r} does not support streaming "
                "(no 'streaming' capability)"
            )
        return Route.NATIVE
    try:
        check_chat(profile, stream=stream, tools=tools)
    except Unsupported as e:
        raise Unsupported(
            f"the Responses API needs a provider with an openai_responses protocol profile or "
            f"one that serves chat completions: {e.message}"
        ) from None
    return Route.BRIDGE


# -- run events → chat completion chunks -------------------------------------------------------


def openai_usage(usage: Usage) -> dict[str, Any]:
    """Usage as OpenAI reports it (details only where the provider reported them)."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }
    if usage.cached_input_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_input_tokens}
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


class ChatEncoder:
    """
    Canonical answer events (:mod:`.canonical`) in, OpenAI ``chat.completion.chunk`` dicts out
    (:meth:`encode`); the same object accumulates the whole answer: :meth:`completion` is the
    ``chat.completion`` of an answer that finished.
    """

    def __init__(
        self,
        *,
        model: str,
        created: int,
        include_usage: bool = False,
        completion_id: str | None = None,
    ) -> None:
        self.id = completion_id or f"chatcmpl-{uuid.uuid4().hex}"
        self.created = created
        self.model = model
        self._include_usage = include_usage
        self._started = False
        self.content = ""
        self.reasoning = ""
        self.tool_calls: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.failed: str | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def _start(self, out: list[dict[str, Any]]) -> None:
        if not self._started:
            self._started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))

    def encode(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            kind = event.kind
            if kind == Kind.TEXT:
                self._start(out)
                self.content += event.text
                out.append(self._chunk({"content": event.text}))
            elif kind == Kind.START:
                self._start(out)
            elif kind == Kind.REASONING:
                if event.text:
                    self._start(out)
                    self.reasoning += event.text
                    out.append(self._chunk({"reasoning_content": event.text}))
            elif kind == Kind.TOOL_CALL:
                converted = tool_call(event.call)
                if converted is not None:
                    index = len(self.tool_calls)
                    self.tool_calls.append(converted)
                    out.append(self._chunk({"tool_calls": [{"index": index, **converted}]}))
            elif kind == Kind.TOOL_CALL_START:
                started = tool_call({**event.call, "arguments": ""})
                if started is not None:
                    index = len(self.tool_calls)
                    self.tool_calls.append(started)
                    # The call accumulates its arguments; the chunk keeps the start as it was.
                    head = {**started, "function": dict(started["function"])}
                    out.append(self._chunk({"tool_calls": [{"index": index, **head}]}))
            elif kind == Kind.TOOL_CALL_DELTA:
                if self.tool_calls and event.text:
                    index = len(self.tool_calls) - 1
                    self.tool_calls[index]["function"]["arguments"] += event.text
                    fragment = {"index": index, "function": {"arguments": event.text}}
                    out.append(self._chunk({"tool_calls": [fragment]}))
            elif kind == Kind.REVISED:
                self.content = event.text
            elif kind == Kind.FINISH:
                self._finish(event, out)
            elif kind == Kind.FAILED:
                assert event.terminal is not None
                self.failed = run_error(event.terminal).message
                out.append(
                    {
                        "error": {
                            "message": self.failed,
                            "type": "server_error",
                            "param": None,
                            "code": "upstream_error",
                        }
                    }
                )
        return out

    def _finish(self, event: Event, out: list[dict[str, Any]]) -> None:
        finish = finish_reason(event.reason, tool_calls=bool(self.tool_calls))
        self.finish_reason = finish
        self.usage = event.usage
        out.append(self._chunk({}, finish))
        if self._include_usage:
            out.append(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": openai_usage(event.usage) if event.usage is not None else None,
                }
            )

    def completion(self) -> dict[str, Any]:
        """The whole ``chat.completion`` (call once the answer finished)."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if self.content or not self.tool_calls else None,
            "refusal": None,
        }
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason or "stop",
                }
            ],
        }
        if self.usage is not None:
            out["usage"] = openai_usage(self.usage)
        return out


class RunEventsToChunks(ChatEncoder):
    """
    A normalized run's events in (:meth:`feed`), chunks out: the run's one conversion
    (:class:`~.canonical.RunDecoder`) and the Chat encoder. ``hold_back``: the request had
    tools and streams, so text that may open a text tool-call reply is held until the run
    completes.
    """

    def __init__(
        self,
        *,
        model: str,
        created: int,
        include_usage: bool = False,
        hold_back: bool = False,
        completion_id: str | None = None,
    ) -> None:
        super().__init__(
            model=model, created=created, include_usage=include_usage, completion_id=completion_id
        )
        self.decoder = RunDecoder(hold_back=hold_back)

    @property
    def terminal(self) -> RuntimeEvent | None:
        return self.decoder.terminal

    @property
    def done(self) -> bool:
        return self.decoder.done

    def feed(self, event: RuntimeEvent) -> list[dict[str, Any]]:
        return self.encode(self.decoder.feed(event))


def sse_chunks(chunks: list[dict[str, Any]], *, done: bool) -> bytes:
    """Chunks as ``data:`` events, then ``data: [DONE]`` when ``done``."""
    data = b"".join(b"data: " + json_bytes(chunk) + b"\n\n" for chunk in chunks)
    return data + DONE if done else data


# -- the surface -------------------------------------------------------------------------------


def _stream_options(body: dict[str, Any]) -> bool:
    """Whether the request asked for a final usage chunk (validating ``stream_options``)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise bad_request(
            "'stream_options.include_usage' must be a boolean", param="stream_options"
        )
    return include is True


class OpenAICatalog:
    """``GET /v1/models`` in the OpenAI list shape."""

    def __init__(self, clock: IReactorTime) -> None:
        self._created = int(clock.seconds())

    def entry(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": self._created, "owned_by": OWNER}

    def listing(self, ids: list[str]) -> dict[str, Any]:
        return {"object": "list", "data": [self.entry(m) for m in ids]}


class ChatCodec:
    """``POST /v1/chat/completions``: native over a chat tunnel, converted from a run."""

    needs_candidates = False
    metered = True

    def __init__(self, gateway: Gateway, clock: IReactorTime) -> None:
        self._gateway = gateway
        self._clock = clock

    def decode(self, body: dict[str, Any]) -> Call:
        model = required_model(body)
        stream = optional_bool(body, "stream")
        include_usage = _stream_options(body)
        check_openai_chat(body)
        try:
            chat = chat_input_from(body)
        except InputError as e:
            raise bad_request(str(e), param="messages") from None
        limits = {
            name: positive_int(body, name) for name in ("max_tokens", "max_completion_tokens")
        }
        return Call(
            model,
            body,
            stream=stream,
            tools=bool(chat.tools),
            prompt_tokens=estimate_prompt_tokens_openai(body),
            max_output_tokens=limits["max_completion_tokens"] or limits["max_tokens"],
            facts={"limits": limits, "include_usage": include_usage},
        )

    def prepare(self, call: Call, policy: ModelConfig | None) -> Call:
        return call

    def local(self, call: Call, policy: ModelConfig | None) -> None:
        return None

    def serves(self, profile: ProfileConfig | None, call: Call) -> None:
        check_chat(profile, stream=call.stream, tools=call.tools)

    async def answer(self, work: Work, call: Call) -> bytes:
        placement = work.placement
        body, stream = call.body, call.stream
        model = placement.model
        try:
            route = check_chat(placement.profile, stream=stream, tools=call.tools)
            over_responses = (
                route == Route.BRIDGE
                and placement.profile is not None
                and placement.profile.driver == DRIVER_RESPONSES
            )
            if over_responses and placement.wire != "tunnel":
                raise Unsupported("a native Responses provider is served only through a tunnel")
            if route == Route.BRIDGE and placement.wire != "tunnel":
                raise Unsupported("a native Messages provider is served only through a tunnel")
            if placement.wire == "run" and body.get("n") not in (None, 1):
                raise Unsupported("'n' other than 1 is not supported by this model's provider")
        except Unsupported as e:
            raise unsupported(e.message) from None
        policy = self._gateway.model(model)
        payload = dict(body)
        payload["model"] = placement.target
        limits: dict[str, int | None] = call.facts["limits"]
        present = {name: value for name, value in limits.items() if value is not None}
        for name, value in present.items():
            payload[name] = max_tokens_for(value, policy)
        if not present:
            default = max_tokens_for(None, policy)
            if default is not None:
                payload["max_tokens"] = default
        if route == Route.BRIDGE:
            limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
            if over_responses:
                return await self._over_responses(work, call, limit)
            return await self._over_messages(work, call, limit or DEFAULT_MAX_TOKENS)
        if placement.wire == "tunnel":
            transform: PassThrough | HiddenUsage = PassThrough()
            if stream and not call.facts["include_usage"]:
                # The usage settles the key's reservation and goes in the ledger: asked for
                # here, its chunk kept from the client that did not ask (.stream_usage).
                ask_for_usage(payload)
                transform = HiddenUsage()
            return await work.relay(
                transform, work.tunnel("chat_completions", payload, stream, json_headers(stream))
            )
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
        thinking = 0 if body.get("reasoning_effort") == "none" else thinking_budget_for(policy)
        converter = RunEventsToChunks(
            model=model,
            include_usage=stream and bool(call.facts["include_usage"]),
            hold_back=stream and call.tools,
            created=int(self._clock.seconds()),
        )

        def convert(event: RuntimeEvent) -> bytes:
            chunks = converter.feed(event)
            return sse_chunks(chunks, done=event.type == EventType.COMPLETE)

        def complete(events: list[RuntimeEvent]) -> bytes:
            for event in events:
                converter.feed(event)
            terminal = converter.terminal
            if terminal is None:
                raise ApiError(502, "the run ended without a result", code="upstream_error")
            if terminal.type != EventType.COMPLETE:
                raise run_error(terminal)
            return render_json(work.request, converter.completion())

        return await work.relay_run(
            stream,
            convert,
            complete,
            input=json_bytes(payload).decode(),
            max_tokens=limit,
            thinking_token_budget=thinking,
        )

    async def _over_messages(self, work: Work, call: Call, limit: int) -> bytes:
        """The call on a native Messages provider: the request translated, the answer decoded
        into canonical events (:mod:`.chat_messages`) and encoded by the Chat encoder."""
        placement = work.placement
        stream = call.stream
        try:
            request = chat_to_messages(call.body, target=placement.target, max_tokens=limit)
        except BridgeError as e:
            raise bad_request(e.message) from None
        encoder = ChatEncoder(
            model=placement.model,
            include_usage=stream and bool(call.facts["include_usage"]),
            created=int(self._clock.seconds()),
        )
        headers = [*json_headers(stream), ("anthropic-version", DEFAULT_ANTHROPIC_VERSION)]
        return await work.relay_decoded(
            "messages",
            request,
            headers,
            stream,
            MessagesDecoder,
            *self._chat_encoding(work, encoder),
        )

    async def _over_responses(self, work: Work, call: Call, limit: int | None) -> bytes:
        """The call on a native Responses provider: the request translated, the answer decoded
        into canonical events (:mod:`.chat_responses`) and encoded by the Chat encoder."""
        placement = work.placement
        stream = call.stream
        try:
            request = chat_to_responses(call.body, target=placement.target, max_output_tokens=limit)
        except BridgeError as e:
            raise bad_request(e.message) from None
        encoder = ChatEncoder(
            model=placement.model,
            include_usage=stream and bool(call.facts["include_usage"]),
            created=int(self._clock.seconds()),
        )
        encode, whole = self._chat_encoding(work, encoder)
        return await work.relay_decoded(
            "responses", request, json_headers(stream), stream, ResponsesDecoder, encode, whole
        )

    @staticmethod
    def _chat_encoding(
        work: Work, encoder: ChatEncoder
    ) -> tuple[Callable[[list[Event]], bytes], Callable[[list[Event]], bytes]]:
        """A decoded answer's events as Chat Completions: streamed chunks (``[DONE]`` after the
        finish), or the whole completion."""

        def encode(events: list[Event]) -> bytes:
            finished = any(event.kind == Kind.FINISH for event in events)
            return sse_chunks(encoder.encode(events), done=finished)

        def whole(events: list[Event]) -> bytes:
            encoder.encode(events)
            return render_json(work.request, encoder.completion())

        return encode, whole


class ResponsesCodec:
    """``POST /v1/responses``: native over an ``openai_responses`` tunnel, else bridged."""

    needs_candidates = False
    metered = True

    def __init__(self, gateway: Gateway, clock: IReactorTime) -> None:
        self._gateway = gateway
        self._clock = clock

    def decode(self, body: dict[str, Any]) -> Call:
        model = required_model(body)
        stream = optional_bool(body, "stream")
        inputs = body.get("input")
        if inputs is not None and not isinstance(inputs, str | list):
            raise bad_request("'input' must be a string or a list of items", param="input")
        requested = positive_int(body, "max_output_tokens")
        check_openai_responses(body)
        return Call(
            model,
            body,
            stream=stream,
            tools=bool(body.get("tools")),
            prompt_tokens=estimate_prompt_tokens_openai(body),
            max_output_tokens=requested,
            facts={"max_output_tokens": requested},
        )

    def prepare(self, call: Call, policy: ModelConfig | None) -> Call:
        return call

    def local(self, call: Call, policy: ModelConfig | None) -> None:
        return None

    def serves(self, profile: ProfileConfig | None, call: Call) -> Route:
        return check_responses(profile, stream=call.stream, tools=call.tools)

    async def answer(self, work: Work, call: Call) -> bytes:
        placement = work.placement
        body, stream = call.body, call.stream
        try:
            route = check_responses(placement.profile, stream=stream, tools=call.tools)
            if route == Route.NATIVE and placement.wire != "tunnel":
                raise Unsupported("the native Responses API is served only through a tunnel")
            # A bridged request on a native Messages provider: Chat's bridge to Messages too.
            over_messages = route == Route.BRIDGE and (
                check_chat(placement.profile, stream=stream, tools=call.tools) == Route.BRIDGE
            )
            if over_messages and placement.wire != "tunnel":
                raise Unsupported("a native Messages provider is served only through a tunnel")
        except Unsupported as e:
            raise unsupported(e.message) from None
        limit = max_tokens_for(call.facts["max_output_tokens"], self._gateway.model(call.model))
        if route == Route.NATIVE:
            payload = dict(body)
            payload["model"] = placement.target
            if limit is not None:
                payload["max_output_tokens"] = limit
            return await work.relay(
                PassThrough(), work.tunnel("responses", payload, stream, json_headers(stream))
            )
        bridge = self._over_messages if over_messages else self._bridged
        return await bridge(work, body, limit, stream)

    async def _over_messages(
        self, work: Work, body: dict[str, Any], limit: int | None, stream: bool
    ) -> bytes:
        """The request bridged to Chat, then to a native Messages provider
        (:func:`.chat_to_messages`); the answer decoded (:class:`.MessagesDecoder`) and encoded
        as Responses events, or, whole, as the Chat encoder's completion made a response."""
        placement = work.placement
        bridged = responses_to_chat(
            body, target=placement.target, reasoning_allowed=False, max_tokens=limit
        )
        created = int(self._clock.seconds())
        try:
            request = chat_to_messages(
                bridged.chat, target=placement.target, max_tokens=limit or DEFAULT_MAX_TOKENS
            )
        except BridgeError as e:
            raise bad_request(e.message) from None
        headers = [*json_headers(stream), ("anthropic-version", DEFAULT_ANTHROPIC_VERSION)]
        converter = ResponsesEncoder(
            model=placement.model, request=body, created=created, names=bridged.names
        )

        def encode(events: list[Event]) -> bytes:
            return format_events(converter.encode(events))

        def whole(events: list[Event]) -> bytes:
            encoder = ChatEncoder(model=placement.model, created=created)
            encoder.encode(events)
            return render_json(
                work.request,
                chat_completion_to_response(
                    encoder.completion(),
                    model=placement.model,
                    request=body,
                    created=created,
                    names=bridged.names,
                ),
            )

        # A whole answer's tool calls come whole (the Chat completion made a response).
        return await work.relay_decoded(
            "messages",
            request,
            headers,
            stream,
            lambda: MessagesDecoder(fragments=stream),
            encode,
            whole,
        )

    async def _bridged(
        self, work: Work, body: dict[str, Any], limit: int | None, stream: bool
    ) -> bytes:
        placement = work.placement
        model = placement.model
        run = placement.wire == "run"
        allowed = not run and thinking_allowed(placement.profile)
        bridged = responses_to_chat(
            body, target=placement.target, reasoning_allowed=allowed, max_tokens=limit
        )
        created = int(self._clock.seconds())
        converter = ResponsesEncoder(
            model=model, request=body, created=created, names=bridged.names
        )
        if not run:

            def encode(events: list[Event]) -> bytes:
                return format_events(converter.encode(events))

            def as_response(events: list[Event]) -> bytes:
                converter.encode(events)
                return render_json(work.request, converter.response())

            return await work.relay_chat(bridged.chat, stream, encode, as_response)
        chunker = RunEventsToChunks(model=model, include_usage=True, created=created)
        events = RunEventsToResponses(
            converter, hold_back=stream and bool(bridged.chat.get("tools"))
        )

        def convert(event: RuntimeEvent) -> bytes:
            return format_events(events.feed(event))

        def complete(items: list[RuntimeEvent]) -> bytes:
            for event in items:
                chunker.feed(event)
            terminal = chunker.terminal
            if terminal is None:
                raise ApiError(502, "the run ended without a result", code="upstream_error")
            if terminal.type != EventType.COMPLETE:
                raise run_error(terminal)
            return render_json(
                work.request,
                chat_completion_to_response(
                    chunker.completion(),
                    model=model,
                    request=body,
                    created=created,
                    names=bridged.names,
                ),
            )

        policy = self._gateway.model(model)
        thinking = 0 if bridged.effort == "none" else thinking_budget_for(policy)
        return await work.relay_run(
            stream,
            convert,
            complete,
            input=json_bytes(bridged.chat).decode(),
            max_tokens=limit or 0,
            thinking_token_budget=thinking,
        )
