# -*- test-case-name: iop.test.node.adapters.test_ollama -*-
"""
The ``ollama`` adapter: runs a normalized request against Ollama's native ``POST /api/chat``
(NDJSON streaming) and answers Ollama's own API queries (``/api/tags``, ``/api/ps``,
``/api/show``).

Events: ``start``; ``reasoning_delta`` for ``message.thinking``; ``delta`` for
``message.content``; on the ``done: true`` line ``complete`` with ``Usage(prompt_eval_count,
eval_count)`` (Ollama does not report reasoning or cached tokens apart, so those stay None),
``metadata["finish_reason"]`` from ``done_reason`` and, when the model called tools,
``metadata["openai_tool_calls"]`` in OpenAI shape. An ``{"error": ...}`` line, an HTTP error, a
broken stream, a stream that ends without ``done: true`` or a timeout give one ``error`` event.

Cancelling the Deferred from :meth:`OllamaProvider.execute` closes the HTTP connection (Ollama
sees the client go away and stops generating) and emits nothing more: the caller emits
``cancelled``. The configured headers are sent on every request and appear nowhere else (not in
logs, errors or ``repr``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import quote

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from zope.interface import implementer

from iop.formats.ndjson import NDJSONDecoder
from iop.formats.usage import token_count
from iop.node.adapters.http_client import PreparedURL, prepared_url
from iop.runtime import (
    AdapterContext,
    Capabilities,
    ExecutionSpec,
    IOllamaAPI,
    IProvider,
    IResizable,
    RuntimeEvent,
    Usage,
)
from iop.runtime.chat_input import ChatInput, InputError, content_text, parse_chat_input
from iop.runtime.interfaces import Emit, TreqClient
from iop.runtime.spec import AdapterSpec
from iop.telemetry.http import ClientCall, client_span, traced_header_object

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:11434"
DEFAULT_IDLE_TIMEOUT = 120.0
# Bound for the API queries (tags/ps/show) when the config sets no request timeout.
DEFAULT_QUERY_TIMEOUT = 30.0
MAX_ERROR_BODY = 64 * 1024
MAX_QUERY_BODY = 16 * 1024 * 1024
MAX_LINE = 4 * 1024 * 1024
# Generation options of an OpenAI-shaped input that Ollama takes under ``options``.
OLLAMA_OPTIONS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty")
THINK_ON = frozenset({"true", "1", "yes", "on"})
THINK_OFF = frozenset({"false", "0", "no", "off"})
THINK_LEVELS = frozenset({"low", "medium", "high"})


def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
    """The adapter factory: one :class:`OllamaProvider` per configured instance."""
    return OllamaProvider(spec, ctx)


class OllamaAPIError(Exception):
    """An Ollama API query failed. ``status`` is the HTTP status, 0 when there was none."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _UpstreamError(Exception):
    """The run failed upstream; the message is what the ``error`` event says."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _Expired(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


# -- request translation ------------------------------------------------------------------------


def _arguments_object(arguments: Any, where: str) -> dict[str, Any]:
    """OpenAI carries tool-call arguments as a JSON string; Ollama wants the object."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            raise InputError(f"{where}: arguments are not valid JSON") from None
        if isinstance(value, dict):
            return value
    raise InputError(f"{where}: arguments must be a JSON object")


def _image_data(part: dict[str, Any], where: str) -> str:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise InputError(f"{where}: Ollama takes images only as base64 data: URLs")
    header, data = url.split(",", 1)
    if not header.endswith(";base64"):
        raise InputError(f"{where}: Ollama takes images only as base64 data: URLs")
    return data


def ollama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    OpenAI chat messages in Ollama's shape: content parts flattened to text plus ``images``;
    ``developer`` becomes ``system``; assistant ``tool_calls`` carry argument objects; a ``tool``
    message names its tool (``tool_name``), found from the call it answers.
    """
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message["role"]
        role = {"developer": "system", "function": "tool"}.get(role, role)
        content = message.get("content")
        converted: dict[str, Any] = {"role": role, "content": content_text(content)}
        if isinstance(content, list):
            images = [
                _image_data(part, where)
                for part in content
                if isinstance(part, dict) and part.get("type") == "image_url"
            ]
            if images:
                converted["images"] = images
        elif content is not None and not isinstance(content, str):
            raise InputError(f"{where}: content must be a string or a list of parts")
        if isinstance(message.get("images"), list):
            converted["images"] = converted.get("images", []) + message["images"]
        reasoning = message.get("reasoning_content", message.get("thinking"))
        if role == "assistant" and isinstance(reasoning, str) and reasoning:
            converted["thinking"] = reasoning
        tool_calls = message.get("tool_calls")
        if role == "assistant" and tool_calls:
            if not isinstance(tool_calls, list):
                raise InputError(f"{where}: tool_calls must be a list")
            calls = []
            for j, call in enumerate(tool_calls):
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                if not isinstance(name, str) or not name:
                    raise InputError(f"{where}.tool_calls[{j}] needs a function name")
                assert isinstance(function, dict)
                arguments = _arguments_object(function.get("arguments"), f"{where}.tool_calls[{j}]")
                call_id = call.get("id") if isinstance(call, dict) else None
                if isinstance(call_id, str) and call_id:
                    call_names[call_id] = name
                calls.append({"function": {"name": name, "arguments": arguments}})
            converted["tool_calls"] = calls
        if role == "tool":
            name = message.get("name")
            if not isinstance(name, str) or not name:
                name = call_names.get(str(message.get("tool_call_id", "")), "")
            if name:
                converted["tool_name"] = name
        out.append(converted)
    return out


def _think(spec: ExecutionSpec) -> bool | str | None:
    requested = str(spec.metadata.get("think", "")).strip().lower()
    if spec.thinking_token_budget > 0 or requested in THINK_ON:
        return True
    if requested in THINK_LEVELS:
        return requested
    if requested in THINK_OFF:
        return False
    return None


def chat_body(spec: ExecutionSpec, chat: ChatInput) -> dict[str, Any]:
    """The ``/api/chat`` request body for one run (raises :class:`InputError`)."""
    body: dict[str, Any] = {
        "model": spec.target,
        "messages": ollama_messages(chat.messages),
        # A caller that reads only the whole answer gets it in one piece: one JSON object,
        # the same shape as a stream's final line (so one parser reads both).
        "stream": not spec.collect,
    }
    if chat.tools and chat.tool_choice != "none":
        body["tools"] = chat.tools
    options = {k: chat.options[k] for k in OLLAMA_OPTIONS if k in chat.options}
    if isinstance(options.get("stop"), str):
        options["stop"] = [options["stop"]]
    if spec.max_tokens > 0:
        options["num_predict"] = spec.max_tokens
    if options:
        body["options"] = options
    response_format = chat.options.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        schema = response_format.get("json_schema")
        if kind == "json_object":
            body["format"] = "json"
        elif kind == "json_schema" and isinstance(schema, dict) and "schema" in schema:
            body["format"] = schema["schema"]
    think = _think(spec)
    if think is not None:
        body["think"] = think
    return body


# -- response translation -----------------------------------------------------------------------


def openai_tool_calls(calls: list[Any]) -> list[dict[str, Any]]:
    """Ollama's native tool calls in OpenAI shape (arguments as a JSON string)."""
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments", {})
        call_id = call.get("id") if isinstance(call, dict) else None
        out.append(
            {
                "id": call_id if isinstance(call_id, str) and call_id else f"call_{i}",
                "type": "function",
                "function": {
                    "name": str(function.get("name", "")),
                    "arguments": (
                        arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments, ensure_ascii=False)
                    ),
                },
            }
        )
    return out


def _error_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        return str(value["message"])
    return json.dumps(value)


class _ChatStream:
    """Turns ``/api/chat`` NDJSON into run events; raises :class:`_UpstreamError` on failure."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._decoder = NDJSONDecoder(MAX_LINE)
        self._tool_calls: list[Any] = []
        self.completed = False

    def feed(self, data: bytes) -> None:
        for value in self._decoder.feed(data):
            self._line(value)

    def finish(self) -> None:
        for value in self._decoder.finish():
            self._line(value)
        if not self.completed:
            raise _UpstreamError("ollama stream ended before the final (done) message")

    def _line(self, value: Any) -> None:
        if self.completed:
            return
        if not isinstance(value, dict):
            raise _UpstreamError("ollama sent a stream line that is not a JSON object")
        if "error" in value:
            raise _UpstreamError(f"ollama error: {_error_text(value['error'])}")
        message = value.get("message")
        if isinstance(message, dict):
            thinking = message.get("thinking")
            if isinstance(thinking, str) and thinking:
                self._emit(RuntimeEvent.reasoning(thinking))
            content = message.get("content")
            if isinstance(content, str) and content:
                self._emit(RuntimeEvent.text(content))
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                self._tool_calls.extend(calls)
        if value.get("done") is True:
            self.completed = True
            metadata = {"finish_reason": str(value.get("done_reason") or "stop")}
            calls = openai_tool_calls(self._tool_calls)
            if calls:
                metadata["openai_tool_calls"] = json.dumps(calls, ensure_ascii=False)
            usage = Usage(
                input_tokens=token_count(value.get("prompt_eval_count")) or 0,
                output_tokens=token_count(value.get("eval_count")) or 0,
            )
            self._emit(RuntimeEvent.complete(usage=usage, metadata=metadata))


# -- HTTP plumbing ------------------------------------------------------------------------------


class _BodyReader(Protocol):
    """
    Hands each chunk of a response body to ``on_data`` as it arrives. ``done`` fires at the end
    of the body; cancelling it closes the connection. If ``on_data`` raises, the connection is
    closed and ``done`` fails with that error.
    """

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        self._on_data = on_data
        self._closing = False
        self.done: Deferred[None] = Deferred(self._cancel)

    def dataReceived(self, data: bytes) -> None:
        if self._closing or self.done.called:
            return
        try:
            self._on_data(data)
        except BaseException:
            failure = Failure()
            self._close()
            if not self.done.called:
                self.done.errback(failure)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self._closing or self.done.called:
            return
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(None)
        else:
            self.done.errback(reason)

    def _cancel(self, _: Deferred[None]) -> None:
        self._close()

    def _close(self) -> None:
        # Closing may report connectionLost synchronously; _closing makes that a no-op.
        self._closing = True
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.loseConnection()


class _Limit(Exception):
    pass


def _read_body(response: Any, on_data: Callable[[bytes], None]) -> Deferred[None]:
    reader = _BodyReader(on_data)
    response.deliverBody(reader)
    return reader.done


class _Call:
    """
    One upstream call's bounds: an idle timer (restarted by :meth:`touch`) and an overall bound,
    plus cancellation by the caller. Every Deferred the call waits on goes through :meth:`wait`;
    when a timer expires or the caller cancels, the awaited step is cancelled (which closes the
    connection) and :meth:`wait` raises :class:`_Expired` or ``CancelledError`` whatever error
    the step failed with.
    """

    def __init__(self, clock: IReactorTime, idle: float | None, overall: float | None) -> None:
        self._idle_seconds = idle
        self._current: Deferred[Any] | None = None
        self.expired: str | None = None
        self.cancelled = False
        self._idle: IDelayedCall | None = (
            clock.callLater(idle, self._expire, f"no data from ollama for {idle:g}s")
            if idle
            else None
        )
        self._overall: IDelayedCall | None = (
            clock.callLater(overall, self._expire, f"ollama request timed out after {overall:g}s")
            if overall
            else None
        )

    def run(self, coroutine: Coroutine[Any, Any, T]) -> Deferred[T]:
        """Run ``coroutine`` under this call: cancelling the result cancels the call."""
        inner = Deferred.fromCoroutine(coroutine)
        outer: Deferred[T] = Deferred(lambda _: self.cancel())
        inner.chainDeferred(outer)
        return outer

    def touch(self) -> None:
        if self._idle is not None and self._idle.active() and self._idle_seconds:
            self._idle.reset(self._idle_seconds)

    async def wait(self, d: Deferred[T]) -> T:
        if self.cancelled or self.expired is not None:
            d.cancel()
        self._current = d
        try:
            return await d
        except BaseException:
            if self.cancelled:
                raise CancelledError() from None
            if self.expired is not None:
                raise _Expired(self.expired) from None
            raise
        finally:
            self._current = None

    def cancel(self) -> None:
        self.cancelled = True
        self._abort()

    def stop(self) -> None:
        for call in (self._idle, self._overall):
            if call is not None and call.active():
                call.cancel()
        self._idle = self._overall = None

    def _expire(self, message: str) -> None:
        self.expired = message
        self._abort()

    def _abort(self) -> None:
        self.stop()
        if self._current is not None:
            self._current.cancel()


def _describe(error: BaseException) -> str:
    """A short reason for a transport failure (no URLs, no headers)."""
    reasons = getattr(error, "reasons", None)
    if isinstance(reasons, list) and reasons:
        inner = reasons[0]
        value = getattr(inner, "value", inner)
        cause = f"{type(value).__name__}: {value}"
        if isinstance(error, ResponseFailed):
            return f"ollama response broke off ({cause})"
        if isinstance(error, ResponseNeverReceived):
            return f"ollama sent no response ({cause})"
        return f"ollama request failed ({type(error).__name__}: {cause})"
    text = str(error)
    cause = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return f"ollama request failed ({cause})"


# -- the provider -------------------------------------------------------------------------------


@implementer(IProvider, IOllamaAPI, IResizable)
class OllamaProvider:
    """One ``ollama`` adapter instance (see the module docstring)."""

    log = Logger()
    type = "ollama"

    def __init__(self, spec: AdapterSpec, ctx: AdapterContext) -> None:
        self.name = spec.name or "ollama"
        base = (spec.base_url or DEFAULT_BASE_URL).rstrip("/")
        # An OpenAI-style base URL points at Ollama's compatibility layer; the native API is at
        # the root.
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        self._base_url = base
        self._headers: dict[str, str] = dict(spec.headers)
        self._reactor: IReactorTime = ctx.reactor
        self._http: TreqClient = ctx.require_http(self.type)
        self._tracing = ctx.tracing
        self._idle_timeout = (
            spec.idle_timeout_ms / 1000.0 if spec.idle_timeout_ms else DEFAULT_IDLE_TIMEOUT
        )
        self._request_timeout = spec.request_timeout_ms / 1000.0
        self._max_concurrency = spec.max_concurrency or 1

    def __repr__(self) -> str:
        return f"<OllamaProvider name={self.name!r}>"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            max_concurrency=self._max_concurrency, streaming=True, tools=True, reasoning=True
        )

    def resize(self, max_concurrency: int) -> None:
        """The adapter's ``max_concurrency`` changed live (``IResizable``)."""
        self._max_concurrency = max(1, max_concurrency)

    # -- execution -------------------------------------------------------------------------

    def execute(self, spec: ExecutionSpec, emit: Emit) -> Deferred[None]:
        overall = spec.timeout_sec if spec.timeout_sec > 0 else self._request_timeout
        call = _Call(self._reactor, self._idle_timeout, overall or None)
        return call.run(self._execute(spec, emit, call))

    async def _execute(self, spec: ExecutionSpec, emit: Emit, call: _Call) -> None:
        try:
            try:
                body = chat_body(spec, parse_chat_input(spec.input))
            except InputError as e:
                emit(RuntimeEvent.failed(f"invalid input: {e}"))
                return
            emit(RuntimeEvent.start())
            stream = _ChatStream(emit)
            traced: ClientCall | None = None
            if self._tracing.tracer is not None:
                url = self._base_url + "/api/chat"
                traced = ClientCall(client_span(self._tracing, spec.metadata, "POST", url))
            try:
                await self._chat(body, stream, call, traced)
                if traced is not None:
                    traced.end()
            except CancelledError as e:
                # The caller cancelled: the connection is closed and it emits `cancelled`.
                if traced is not None:
                    traced.end(e)
                raise
            except Exception as e:
                if traced is not None:
                    # A broken tail after a complete answer is no failure (below).
                    traced.end(None if stream.completed else e)
                if stream.completed:
                    # The answer was complete; a broken tail of the stream changes nothing.
                    self.log.debug("ollama run {run_id}: stream tail failed", run_id=spec.run_id)
                    return
                if isinstance(e, _UpstreamError | _Expired):
                    self._failed(spec, emit, str(e), getattr(e, "status", 0))
                else:
                    self._failed(spec, emit, _describe(e), 0)
        finally:
            call.stop()

    async def _chat(
        self, body: dict[str, Any], stream: _ChatStream, call: _Call, traced: ClientCall | None
    ) -> None:
        headers = self._request_headers("application/x-ndjson")
        if traced is not None:
            headers = traced_header_object(traced.span, headers)
        response = await call.wait(
            self._http.request(
                "POST",
                self._url("/api/chat"),
                data=json.dumps(body).encode("utf-8"),
                headers=headers,
                unbuffered=True,
                reactor=self._reactor,
            )
        )
        call.touch()
        if traced is not None:
            traced.status = response.code
        if response.code != 200:
            text = await call.wait(self._error_body(response))
            raise _UpstreamError(f"ollama HTTP {response.code}: {text}", response.code)

        def received(data: bytes) -> None:
            call.touch()
            stream.feed(data)

        await call.wait(_read_body(response, received))
        stream.finish()

    def _failed(self, spec: ExecutionSpec, emit: Emit, message: str, status: int) -> None:
        self.log.info(
            "ollama run {run_id} on {adapter} failed: {reason}",
            run_id=spec.run_id,
            adapter=self.name,
            reason=message,
        )
        metadata = {"http_status": str(status)} if status else None
        emit(RuntimeEvent.failed(message, metadata=metadata))

    # -- Ollama API queries ----------------------------------------------------------------

    def tags(self) -> Deferred[dict[str, Any]]:
        return self._query("GET", "/api/tags")

    def ps(self) -> Deferred[dict[str, Any]]:
        return self._query("GET", "/api/ps")

    def show(self, model: str) -> Deferred[dict[str, Any]]:
        return self._query("POST", "/api/show", {"model": model})

    def _query(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> Deferred[dict[str, Any]]:
        timeout = self._request_timeout or DEFAULT_QUERY_TIMEOUT
        call = _Call(self._reactor, None, timeout)
        return call.run(self._query_bounded(method, path, body, call, timeout))

    async def _query_bounded(
        self, method: str, path: str, body: dict[str, Any] | None, call: _Call, timeout: float
    ) -> dict[str, Any]:
        try:
            return await self._query_once(method, path, body, call)
        except _Expired:
            raise OllamaAPIError(f"ollama {path}: timed out after {timeout:g}s") from None
        except (OllamaAPIError, CancelledError):
            raise
        except Exception as e:
            raise OllamaAPIError(f"ollama {path}: {_describe(e)}") from None
        finally:
            call.stop()

    async def _query_once(
        self, method: str, path: str, body: dict[str, Any] | None, call: _Call
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = json.dumps(body).encode("utf-8")
        response = await call.wait(
            self._http.request(
                method,
                self._url(path),
                headers=self._request_headers("application/json"),
                unbuffered=True,
                reactor=self._reactor,
                **kwargs,
            )
        )
        if response.code != 200:
            text = await call.wait(self._error_body(response))
            raise OllamaAPIError(f"ollama {path}: HTTP {response.code}: {text}", response.code)
        chunks: list[bytes] = []
        size = [0]

        def received(data: bytes) -> None:
            size[0] += len(data)
            if size[0] > MAX_QUERY_BODY:
                raise OllamaAPIError(f"ollama {path}: answer larger than {MAX_QUERY_BODY} bytes")
            chunks.append(data)

        await call.wait(_read_body(response, received))
        try:
            value = json.loads(b"".join(chunks))
        except ValueError:
            raise OllamaAPIError(f"ollama {path}: answer is not JSON") from None
        if not isinstance(value, dict):
            raise OllamaAPIError(f"ollama {path}: answer is not a JSON object")
        return value

    # -- helpers ---------------------------------------------------------------------------

    def _url(self, path: str) -> PreparedURL:
        return prepared_url(self._base_url + quote(path))

    def _request_headers(self, accept: str) -> Headers:
        headers = Headers()
        for name, value in self._headers.items():
            headers.addRawHeader(name, value)
        if not headers.hasHeader("accept"):
            headers.setRawHeaders("accept", [accept])
        headers.setRawHeaders("content-type", ["application/json"])
        return headers

    def _error_body(self, response: Any) -> Deferred[str]:
        """The message of an error answer: Ollama's ``{"error": ...}``, else the text, truncated."""
        chunks: list[bytes] = []
        size = [0]

        def received(data: bytes) -> None:
            room = MAX_ERROR_BODY - size[0]
            chunks.append(data[:room])
            size[0] += min(len(data), room)
            if size[0] >= MAX_ERROR_BODY:
                raise _Limit()

        def message(_: object) -> str:
            raw = b"".join(chunks)
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            if isinstance(value, dict) and "error" in value:
                return _error_text(value["error"])
            text = raw.decode("utf-8", "replace").strip()
            return text or (response.phrase or b"").decode("latin-1", "replace") or "no details"

        def partial(failure: Failure) -> Failure | None:
            # Whatever arrived before the body broke off (or was cut at the limit) will do.
            return failure if failure.check(CancelledError) else None

        d = _read_body(response, received)
        d.addErrback(partial)
        return d.addCallback(message)


__all__ = [
    "DEFAULT_BASE_URL",
    "OllamaAPIError",
    "OllamaProvider",
    "build",
    "chat_body",
    "ollama_messages",
    "openai_tool_calls",
]
