# -*- test-case-name: iop.test.node.adapters.test_openai_compat -*-
"""
The ``openai_compat`` adapter: one normalized run becomes one streaming
``POST {base_url}/chat/completions`` on an OpenAI-compatible server.

Events: ``start`` first; ``delta.content`` → ``delta``; ``delta.reasoning_content`` (or
``delta.reasoning``) → ``reasoning_delta``; then ``complete`` with the reported usage,
``metadata["finish_reason"]`` and, when the model called tools, ``metadata["openai_tool_calls"]``
(a JSON array in OpenAI ``message.tool_calls`` shape, accumulated across chunks by index). Any
failure is one ``error`` event: the upstream's HTTP status and error message, a stream that ended
before ``[DONE]``/``finish_reason``, an idle upstream (``idle_timeout_ms``, reset on every chunk)
or a run over its time bound (``spec.timeout_sec``, else ``request_timeout_ms``).

Text-tool fallback: when the upstream rejects a request that carried ``tools`` with HTTP 400/422
and an error message about tools, the run is retried once without native tools, with a text
tool-call instruction merged into the leading system message, and the ``complete`` event says
``metadata["openai_text_tool_fallback"] = "true"``.

Cancelling the Deferred that :meth:`OpenAICompatProvider.execute` returns aborts the HTTP request
(or stops reading the body, which closes the connection) and emits nothing more; the caller emits
the ``cancelled`` terminal. Configured headers carry credentials: they are sent, never logged,
and appear in no ``repr`` and no error text.

The provider is also an :class:`~iop.runtime.interfaces.ITunnelProvider`: the Node's provider
tunnel (:mod:`iop.node.tunnel`) opens raw requests on its base URL with its configured headers.

Traces: with the node's tracing on, each upstream call is an HTTP client span
(:mod:`iop.telemetry.http`), the child of the run's span named in ``spec.metadata``, and the
request carries its ``traceparent``; a text-tool retry is a second span.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed
from twisted.web.iweb import IResponse
from zope.interface import implementer

from iop.formats.errors import error_message
from iop.formats.sse import SSEError, SSEEvent, SSEParser
from iop.formats.usage import openai_chat_usage

# The cancellable body reader, shared with the provider tunnel.
from iop.node.adapters.http_client import prepared_url
from iop.node.adapters.http_stream import ended_cleanly, read_body, read_limited
from iop.runtime.chat_input import ChatInput, InputError, content_text, parse_chat_input
from iop.runtime.events import RuntimeEvent, Usage
from iop.runtime.interfaces import (
    AdapterContext,
    Capabilities,
    Emit,
    ExecutionSpec,
    IProvider,
    IResizable,
    ITunnelProvider,
    TreqClient,
)
from iop.runtime.spec import AdapterSpec, RuntimeProfile
from iop.telemetry.http import ClientCall, client_span, traced_headers

DEFAULT_IDLE_TIMEOUT = 120.0
# How much of an error body is read, and how much of its text an error event quotes.
ERROR_BODY_LIMIT = 64 * 1024
ERROR_TEXT_LIMIT = 300
# A non-streaming (JSON) answer larger than this is refused.
JSON_BODY_LIMIT = 32 * 1024 * 1024
# HTTP statuses with which a backend says it cannot take the request as sent.
TOOL_REJECTION_STATUSES = frozenset({400, 422})

TEXT_TOOL_REPLY_SHAPE = '{"tool_calls":[{"name":"<tool name>","arguments":{<arguments>}}]}'


def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
    """The ``openai_compat`` adapter factory."""
    return OpenAICompatProvider(spec, ctx)


class UpstreamFailure(Exception):
    """A run failed for a reason its ``error`` event states (the exception's text)."""


def truncate(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def upstream_error_message(raw: bytes) -> str:
    """
    What an error event quotes of an upstream error body: its message
    (:func:`iop.formats.errors.error_message`), else the start of the body.
    """
    message = error_message(raw)
    if message is not None:
        return truncate(message)
    return truncate(raw.decode("utf-8", errors="replace")) or "(empty body)"


def describe_failure(error: BaseException) -> str:
    """A short reason for a transport-level failure (no URLs with secrets, no headers)."""
    if isinstance(error, ResponseFailed) and error.reasons:
        return "; ".join(reason.getErrorMessage() for reason in error.reasons)
    return truncate(str(error) or type(error).__name__)


# -- the text-tool fallback -------------------------------------------------------------------


def _function(tool: Any) -> dict[str, Any]:
    if isinstance(tool, dict):
        function = tool.get("function")
        return function if isinstance(function, dict) else tool
    return {}


def text_tool_instruction(tools: list[dict[str, Any]], tool_choice: Any) -> str:
    """The instruction that asks for a JSON tool-call reply instead of native tool calls."""
    lines = ["You can call these tools:"]
    for tool in tools:
        function = _function(tool)
        name = function.get("name", "")
        description = function.get("description") or ""
        lines.append(f"- {name}: {description}" if description else f"- {name}")
        parameters = function.get("parameters")
        if parameters:
            lines.append(f"  arguments (JSON Schema): {json.dumps(parameters, sort_keys=True)}")
    lines.append("")
    lines.append("To call tools, reply with only this JSON object and no other text:")
    lines.append(TEXT_TOOL_REPLY_SHAPE)
    if tool_choice == "required":
        lines.append("You must call at least one tool.")
    elif isinstance(tool_choice, dict) and _function(tool_choice).get("name"):
        lines.append(f"You must call the tool {_function(tool_choice)['name']}.")
    else:
        lines.append("If no tool is needed, answer in plain text.")
    return "\n".join(lines)


def _merge_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    existing = content_text(content)
    return f"{existing}\n\n{text}" if existing else text


def _tool_history_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """Native tool-call history rewritten as text, for a backend without tool support."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id") or ""
        result = content_text(message.get("content"))
        return {"role": "user", "content": f"Tool result for call {call_id}:\n{result}"}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        replayed = []
        for call in calls:
            function = _function(call)
            arguments: Any = function.get("arguments", "")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                pass
            replayed.append({"name": function.get("name", ""), "arguments": arguments})
        text = content_text(message.get("content"))
        reply = json.dumps({"tool_calls": replayed})
        return {"role": "assistant", "content": f"{text}\n{reply}" if text else reply}
    return message


def text_tool_request(body: dict[str, Any], chat: ChatInput) -> tuple[dict[str, Any], bool]:
    """
    The retry body for a backend that rejected native tools: no ``tools``/``tool_choice``, tool
    history as text, and (unless ``tool_choice`` is ``"none"``) the instruction merged into the
    leading system message. Returns the body and whether the instruction was added.
    """
    retry = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    messages = [_tool_history_as_text(m) for m in chat.messages]
    instructed = chat.tool_choice != "none"
    if instructed:
        instruction = text_tool_instruction(chat.tools or [], chat.tool_choice)
        if messages and messages[0].get("role") == "system":
            first = dict(messages[0])
            first["content"] = _merge_text(first.get("content"), instruction)
            messages[0] = first
        else:
            messages.insert(0, {"role": "system", "content": instruction})
    retry["messages"] = messages
    return retry, instructed


# -- one run ----------------------------------------------------------------------------------


@dataclass
class _ToolCall:
    id: str = ""
    type: str = "function"
    name: str = ""
    arguments: str = ""

    def as_openai(self, index: int) -> dict[str, Any]:
        return {
            "id": self.id or f"call_{index}",
            "type": self.type or "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class _Answer:
    """What a run has learned from the upstream so far."""

    done: bool = False
    finish_reason: str = ""
    usage: dict[str, Any] | None = None
    saw_reasoning: bool = False
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)

    def add_tool_delta(self, position: int, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        index = delta.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = position
        call = self.tool_calls.setdefault(index, _ToolCall())
        if isinstance(delta.get("id"), str) and delta["id"] and not call.id:
            call.id = delta["id"]
        if isinstance(delta.get("type"), str) and delta["type"]:
            call.type = delta["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            # Servers send the name once; some repeat it whole, a few split it.
            if isinstance(name, str) and name and name != call.name:
                call.name = name if not call.name else call.name + name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments += arguments
            elif isinstance(arguments, dict):
                call.arguments += json.dumps(arguments)

    def tool_calls_json(self) -> str | None:
        if not self.tool_calls:
            return None
        return json.dumps([self.tool_calls[i].as_openai(i) for i in sorted(self.tool_calls)])


class _Run:
    """One ``execute`` call: its timers, its emit guard, and the request/response exchange."""

    def __init__(self, provider: OpenAICompatProvider, spec: ExecutionSpec, emit: Emit) -> None:
        self._provider = provider
        self._spec = spec
        self._emit = emit
        self._outer: Deferred[None] = Deferred(self._cancel)
        self._inner: Deferred[None] | None = None
        self._timeout_reason: str | None = None
        self._idle_call: IDelayedCall | None = None
        self._bound_call: IDelayedCall | None = None
        # Set when the caller cancels: from then on nothing is emitted.
        self._silenced = False

    def start(self) -> Deferred[None]:
        """
        The caller's Deferred wraps the coroutine's, so that a caller's cancel is told apart
        from a timeout (both cancel the coroutine, and an HTTP request cancelled before its
        response fails with ``ResponseNeverReceived``, not ``CancelledError``).
        """
        self._inner = Deferred.fromCoroutine(self._main())
        self._inner.addBoth(self._relay)
        return self._outer

    def _cancel(self, _: Deferred[None]) -> None:
        self._silenced = True
        if self._inner is not None:
            self._inner.cancel()

    def _relay(self, result: object) -> None:
        if self._outer.called:
            return
        if self._silenced:
            self._outer.errback(CancelledError())
        elif isinstance(result, Failure):
            self._outer.errback(result)
        else:
            self._outer.callback(None)

    def _send(self, event: RuntimeEvent) -> None:
        if not self._silenced:
            self._emit(event)

    def _fail(self, reason: str) -> None:
        self._send(RuntimeEvent.failed(self._provider.redact(reason)))

    async def _main(self) -> None:
        self._send(RuntimeEvent.start())
        try:
            chat = parse_chat_input(self._spec.input)
        except InputError as e:
            self._fail(f"invalid input: {e}")
            return
        self._arm()
        try:
            body = self._provider.request_body(self._spec, chat)
            await self._exchange(body, chat, retried=False, fallback=False)
        except Exception as e:
            if self._silenced:
                # Cancelled by the caller: it emits the terminal; we emit nothing more.
                raise
            if self._timeout_reason is not None:
                self._fail(self._timeout_reason)
            elif isinstance(e, UpstreamFailure):
                self._fail(str(e))
            elif isinstance(e, SSEError):
                self._fail(f"upstream stream is malformed: {e}")
            else:
                self._fail(f"upstream request failed: {describe_failure(e)}")
        finally:
            self._disarm()

    # -- time bounds ---------------------------------------------------------------------

    def _arm(self) -> None:
        clock = self._provider.clock
        bound = self._spec.timeout_sec or self._provider.request_timeout
        if bound and bound > 0:
            self._bound_call = clock.callLater(
                bound, self._expire, f"request timed out after {bound:g}s"
            )
        idle = self._provider.idle_timeout
        self._idle_call = clock.callLater(idle, self._expire, f"upstream idle for {idle:g}s")

    def _touch(self) -> None:
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.reset(self._provider.idle_timeout)

    def _disarm(self) -> None:
        for call in (self._idle_call, self._bound_call):
            if call is not None and call.active():
                call.cancel()
        self._idle_call = self._bound_call = None

    def _expire(self, reason: str) -> None:
        if self._timeout_reason is None and self._inner is not None:
            self._timeout_reason = reason
            self._inner.cancel()

    # -- the exchange --------------------------------------------------------------------

    async def _exchange(
        self, body: dict[str, Any], chat: ChatInput, retried: bool, fallback: bool
    ) -> None:
        """One upstream call, with its HTTP client span when tracing (a retry is another)."""
        provider = self._provider
        if provider.tracing.tracer is None:
            await self._call(body, chat, retried, fallback, None)
            return
        call = ClientCall(
            client_span(provider.tracing, self._spec.metadata, "POST", provider.chat_url)
        )
        try:
            await self._call(body, chat, retried, fallback, call)
        except BaseException as e:
            call.end(e)
            raise
        call.end()

    async def _call(
        self,
        body: dict[str, Any],
        chat: ChatInput,
        retried: bool,
        fallback: bool,
        traced: ClientCall | None,
    ) -> None:
        provider = self._provider
        headers = provider.request_headers()
        if traced is not None:
            traced_headers(traced.span, headers)
        response: IResponse = await provider.http.request(
            "POST",
            provider.url,
            data=json.dumps(body).encode("utf-8"),
            headers=headers,
            unbuffered=True,
            reactor=provider.clock,
        )
        self._touch()
        if traced is not None:
            traced.status = response.code
        if 200 <= response.code < 300:
            content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
            if content_type.lower().startswith(b"application/json"):
                await self._read_json(response, fallback)
            else:
                await self._read_stream(response, fallback)
            return
        raw, _ = await read_limited(response, ERROR_BODY_LIMIT)
        message = upstream_error_message(raw)
        if (
            not retried
            and response.code in TOOL_REJECTION_STATUSES
            and chat.tools
            and "tool" in message.lower()
        ):
            retry, instructed = text_tool_request(body, chat)
            provider.log.info(
                "adapter {adapter} run {run_id}: upstream rejected native tools "
                "(HTTP {status}); retrying with a text tool-call instruction",
                adapter=provider.name,
                run_id=self._spec.run_id,
                status=response.code,
            )
            if traced is not None:
                traced.end()
            await self._exchange(retry, chat, retried=True, fallback=instructed)
            return
        raise UpstreamFailure(f"upstream HTTP {response.code}: {message}")

    async def _read_stream(self, response: IResponse, fallback: bool) -> None:
        answer = _Answer()
        parser = SSEParser()

        def on_data(data: bytes) -> None:
            self._touch()
            for event in parser.feed(data):
                self._on_event(event, answer)

        reason = await read_body(response, on_data)
        if not answer.done:
            for event in parser.finish():
                self._on_event(event, answer)
        if not (answer.done or answer.finish_reason):
            why = "" if ended_cleanly(reason) else f": {describe_failure(reason)}"
            raise UpstreamFailure(f"upstream stream ended early{why}")
        self._complete(answer, fallback)

    def _on_event(self, event: SSEEvent, answer: _Answer) -> None:
        if answer.done:
            return
        if event.is_done:
            answer.done = True
            return
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise UpstreamFailure(
                f"upstream sent a malformed stream chunk: {truncate(event.data, 120)}"
            ) from None
        if not isinstance(chunk, dict):
            raise UpstreamFailure("upstream sent a stream chunk that is not a JSON object")
        if chunk.get("error") or event.event == "error":
            message = upstream_error_message(event.data.encode("utf-8"))
            raise UpstreamFailure(f"upstream stream error: {message}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # Last one wins: vLLM's continuous_usage_stats repeats a running total per chunk.
            answer.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._on_delta(delta, answer)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                answer.finish_reason = finish

    def _on_delta(self, delta: Mapping[str, Any], answer: _Answer) -> None:
        reasoning = self._provider.reasoning_text(delta)
        if reasoning:
            answer.saw_reasoning = True
            self._send(RuntimeEvent.reasoning(reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._send(RuntimeEvent.text(content))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                answer.add_tool_delta(position, call)

    async def _read_json(self, response: IResponse, fallback: bool) -> None:
        """A server that ignored ``stream: true`` and answered one ``chat.completion``."""
        raw, truncated = await read_limited(response, JSON_BODY_LIMIT)
        if truncated:
            raise UpstreamFailure(f"upstream response larger than {JSON_BODY_LIMIT} bytes")
        try:
            completion = json.loads(raw)
        except ValueError:
            raise UpstreamFailure(
                f"upstream sent malformed JSON: {upstream_error_message(raw)}"
            ) from None
        if not isinstance(completion, dict):
            raise UpstreamFailure("upstream sent JSON that is not an object")
        if completion.get("error"):
            raise UpstreamFailure(f"upstream error: {upstream_error_message(raw)}")
        answer = _Answer(done=True)
        usage = completion.get("usage")
        answer.usage = usage if isinstance(usage, dict) else None
        choices = completion.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else {}
        message = first.get("message") if isinstance(first, dict) else None
        if isinstance(message, dict):
            self._on_delta(message, answer)
        finish = first.get("finish_reason") if isinstance(first, dict) else None
        answer.finish_reason = finish if isinstance(finish, str) else ""
        self._complete(answer, fallback)

    def _complete(self, answer: _Answer, fallback: bool) -> None:
        metadata: dict[str, str] = {}
        if answer.finish_reason:
            metadata["finish_reason"] = answer.finish_reason
        tool_calls = answer.tool_calls_json()
        if tool_calls is not None:
            metadata["openai_tool_calls"] = tool_calls
        if fallback:
            metadata["openai_text_tool_fallback"] = "true"
        usage = (
            self._provider.usage_from(answer.usage, answer.saw_reasoning)
            if answer.usage is not None
            else None
        )
        self._send(RuntimeEvent.complete(usage=usage, metadata=metadata))


@implementer(IProvider, ITunnelProvider, IResizable)
class OpenAICompatProvider:
    """
    An OpenAI-compatible chat completions upstream. Subclasses adjust one server's dialect
    through the hooks :meth:`request_body`, :meth:`reasoning_text` and :meth:`usage_from`.
    """

    type = "openai_compat"
    log = Logger()

    def __init__(self, spec: AdapterSpec, ctx: AdapterContext) -> None:
        self.name: str = spec.name or self.type
        self.base_url: str = spec.base_url.rstrip("/")
        # Parsed once: every run's request reuses it.
        self.chat_url = self.base_url + "/chat/completions"
        self.url = prepared_url(self.chat_url)
        self.profile: RuntimeProfile | None = spec.profile
        self._headers = dict(spec.headers)
        self.idle_timeout = (spec.idle_timeout_ms / 1000.0) or DEFAULT_IDLE_TIMEOUT
        self.request_timeout = spec.request_timeout_ms / 1000.0
        self.max_concurrency = spec.max_concurrency or 1
        self.clock: IReactorTime = ctx.reactor
        self.http: TreqClient = ctx.require_http(self.type)
        self.tracing = ctx.tracing

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            max_concurrency=self.max_concurrency, streaming=True, tools=True, reasoning=True
        )

    def resize(self, max_concurrency: int) -> None:
        """The adapter's ``max_concurrency`` changed live (``IResizable``)."""
        self.max_concurrency = max(1, max_concurrency)

    def execute(self, spec: ExecutionSpec, emit: Emit) -> Deferred[None]:
        return _Run(self, spec, emit).start()

    def configured_headers(self) -> dict[str, str]:
        """The configured upstream headers (credentials): sent, never logged or echoed."""
        return dict(self._headers)

    def request_headers(self) -> dict[str, list[str]]:
        headers = {"Content-Type": ["application/json"], "Accept": ["text/event-stream"]}
        for name, value in self._headers.items():
            headers[name] = [value]
        return headers

    def redact(self, text: str) -> str:
        """``text`` without any configured header value (an upstream may echo credentials)."""
        for value in self._headers.values():
            for secret in (value, *value.split()):
                if len(secret) >= 8:
                    text = text.replace(secret, "[redacted]")
        return text

    # -- hooks ---------------------------------------------------------------------------

    def request_body(self, spec: ExecutionSpec, chat: ChatInput) -> dict[str, Any]:
        body: dict[str, Any] = dict(chat.options)
        body["model"] = spec.target
        body["messages"] = chat.messages
        if chat.tools:
            body["tools"] = chat.tools
            if chat.tool_choice is not None:
                body["tool_choice"] = chat.tool_choice
        if spec.max_tokens > 0:
            body["max_tokens"] = spec.max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return body

    def reasoning_text(self, delta: Mapping[str, Any]) -> str:
        """Reasoning text of a delta (or message): ``reasoning_content``, else ``reasoning``."""
        for key in ("reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                return value
        return ""

    def usage_from(self, raw: Mapping[str, Any], saw_reasoning: bool) -> Usage:
        """
        Usage as reported: ``prompt_tokens``/``completion_tokens``, and reasoning and cached
        tokens only where the upstream reported them (OpenAI's ``*_tokens_details``).
        """
        return openai_chat_usage(raw)
