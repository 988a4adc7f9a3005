# -*- test-case-name: iop.test.testing.test_fake_openai -*-
"""
A fake OpenAI-compatible upstream: a real ``twisted.web`` resource tree, served on a real port
(the CLI, system tests, the demo, the benchmark) or in memory through ``treq.testing.StubTreq``.

Routes:

- ``GET /v1/models``: the configured model list.
- ``POST /v1/chat/completions``: a deterministic answer, streamed as SSE (``stream: true``) or as
  one ``chat.completion`` object. The text is ``tok0 tok1 …`` (:func:`fake_text`), capped by
  ``max_tokens``/``max_completion_tokens``. A model whose name contains ``reason`` first streams
  ``reasoning_content`` (:func:`fake_reasoning`) and reports ``reasoning_tokens``; a leading
  system message is reported as cached (``cached_tokens`` = its word count). A request with
  ``tools`` gets a native call to its first tool, arguments split over several chunks — unless
  the fake rejects tools, then it answers 400 — and, once its last message is a tool result
  (``role: tool``), the text answer (one tool round, so agent loops end). Model ``fail-500``
  answers 500; model ``fail-midstream`` sends a few chunks and drops the connection.
  The ``echo-auth-*`` models reflect the request's credential (the ``--expect-header``'s value,
  else ``Authorization``) the ways providers and proxies do: ``echo-auth-401`` in a 401's
  reason phrase and error message, ``echo-auth-500`` in a 500 whose body dumps the request
  headers, ``echo-auth-header`` in the ``x-request-id`` and ``x-echo-authorization`` headers of
  an ordinary answer, ``echo-auth-stream`` in a streamed answer's text, its SSE event written in
  two pieces cut in the middle of the credential, :data:`ECHO_PAUSE_MS` apart (so they arrive as
  separate chunks).
- ``POST /v1/responses`` (only with ``responses_api`` / ``--responses-api``; otherwise 404 like
  any unknown route): a minimal OpenAI Responses API answer of the same text (one ``message``
  output item with one ``output_text`` part; ``max_output_tokens`` caps it, then the status is
  ``incomplete``), streamed as the Responses API's semantic SSE events (``response.created`` …
  ``response.output_text.delta`` … ``response.completed``, no ``[DONE]``) or as one
  ``response`` object. ``instructions`` count into ``input_tokens`` and are reported as
  ``cached_tokens``. A request offering ``function`` tools gets one ``function_call`` item
  calling the first of them (arguments as on the Chat route; streamed as ``output_item.added``,
  ``function_call_arguments.delta`` in three pieces, ``.done``, ``output_item.done``) unless
  ``tool_choice`` is ``none`` or the input already carries a ``function_call_output`` (one tool
  round). Model ``fail-500`` answers 500. No reasoning items.
- ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (only with ``anthropic_api`` /
  ``--anthropic-api``; otherwise 404): a minimal **Anthropic-shaped** upstream, so the Edge's
  native Messages path (an ``anthropic_messages`` protocol profile over the raw tunnel) has
  something real to talk to: one text block of the same text (``max_tokens`` required and
  capping it), streamed as Anthropic stream events or as one ``message``; the token count is
  the fake's usual word count. Requests without an ``anthropic-version`` header are refused
  (400) as the real API does; errors use the Anthropic error shape. A request with ``tools``
  gets a ``tool_use`` block calling its first tool (``input_json_delta`` in three pieces when
  streamed), unless ``tool_choice`` is ``none`` or the last turn carries a ``tool_result`` (one
  tool round); model ``fail-500`` answers 500. No thinking.
- ``GET /_fake/stats``: :class:`FakeStats` as JSON.
- ``GET /_fake/requests``: the headers of the last :data:`SHOWN_REQUESTS` generation requests
  received (chat, responses, messages), oldest first, as ``{"requests": [{"headers": {...}}]}``
  (names lower-cased; a credential header's value shown as ``<set>``): what a system test
  asks of what reached the provider, such as the ``x-request-id`` a gateway sent on.

With ``expect_header`` (``--expect-header NAME``, the value from ``$IOP_FAKE_EXPECT_VALUE``),
a chat completion without exactly that credential is answered 401 — a provider that checks
its API key, for managed mode's credential leases.

Token delays run on the injected clock, so unit tests drive them with ``task.Clock``.

CLI: ``python -m iop.testing.fake_openai --port 9001 [--host 127.0.0.1] [--tokens N]
[--chunk-tokens N] [--delay-ms N] [--reject-tools] [--models a,b] [--responses-api]
[--anthropic-api] [--expect-header NAME]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from iop.runtime.chat_input import content_text

REASONING_MARKER = "reason"
FAIL_500_MODEL = "fail-500"
FAIL_MIDSTREAM_MODEL = "fail-midstream"
# The models whose answers echo the request's credential (see the module docstring).
ECHO_401_MODEL = "echo-auth-401"
ECHO_500_MODEL = "echo-auth-500"
ECHO_HEADER_MODEL = "echo-auth-header"
ECHO_STREAM_MODEL = "echo-auth-stream"
ECHO_MODELS = (ECHO_401_MODEL, ECHO_500_MODEL, ECHO_HEADER_MODEL, ECHO_STREAM_MODEL)
# The pause between the pieces of an echo-auth-stream answer.
ECHO_PAUSE_MS = 50
# Token chunks a ``fail-midstream`` answer sends before it drops the connection.
MIDSTREAM_CHUNKS = 3
TOOLS_REJECTED = "tools are not supported by this backend"


def fake_tokens(count: int, word: str = "tok") -> list[str]:
    """The fake's tokens: ``["tok0", " tok1", " tok2", …]`` (joined they read ``tok0 tok1 …``)."""
    return [f"{word}{i}" if i == 0 else f" {word}{i}" for i in range(count)]


def fake_text(count: int) -> str:
    """The answer text of ``count`` tokens."""
    return "".join(fake_tokens(count))


def reasoning_token_count(tokens: int) -> int:
    """How many reasoning tokens a reasoning model's answer of ``tokens`` tokens has."""
    return max(1, tokens // 2)


def fake_reasoning(tokens: int) -> str:
    """The reasoning text that precedes an answer of ``tokens`` tokens on a reasoning model."""
    return "".join(fake_tokens(reasoning_token_count(tokens), "think"))


def word_count(content: Any) -> int:
    return len(content_text(content).split())


def fake_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Deterministic arguments for a tool: one placeholder value per declared property."""
    function = tool.get("function") if isinstance(tool.get("function"), dict) else {}
    parameters = function.get("parameters") if isinstance(function, dict) else None
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return {}
    placeholders: dict[str, Any] = {
        "string": "fake",
        "integer": 1,
        "number": 1,
        "boolean": True,
        "array": [],
        "object": {},
    }
    out: dict[str, Any] = {}
    for name, schema in properties.items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        out[str(name)] = placeholders.get(kind, None) if isinstance(kind, str) else None
    return out


def split_arguments(arguments: str) -> list[str]:
    """Split a tool call's argument JSON into (up to) three pieces, as a streaming server does."""
    step = max(1, -(-len(arguments) // 3))
    return [arguments[i : i + step] for i in range(0, len(arguments), step)] or [""]


@dataclass(frozen=True)
class FakeSettings:
    tokens: int = 16
    chunk_tokens: int = 1
    delay_ms: int = 0
    reject_tools: bool = False
    models: tuple[str, ...] = ("demo-model",)
    responses_api: bool = False
    anthropic_api: bool = False
    # A credential every chat completion must carry: header name (lowercase) and exact value.
    expect_header: str = ""
    expect_value: str = field(default="", repr=False)


@dataclass
class FakeStats:
    """
    ``total_requests`` counts requests to the answering routes (chat completions, responses,
    messages; rejected ones too). A stream is active from its first byte until it finishes, the
    client goes away, or the fake drops it. ``active_answers`` counts every answer being written
    (streamed or not) the same way, ``max_active_answers`` its high-water mark: the most requests
    the fake ever served at once (what a capacity limit in front of it must bound).
    ``reported_input_tokens`` / ``reported_output_tokens`` add up the usage the fake reported in
    the answers it wrote to their end (a Chat stream reports usage only when asked,
    ``stream_options.include_usage``; the echo models' answers are not counted): what a gateway
    in front of it must have charged.
    """

    total_requests: int = 0
    active_streams: int = 0
    active_answers: int = 0
    max_active_answers: int = 0
    completed_responses: int = 0
    client_disconnects: int = 0
    dropped_streams: int = 0
    rejected_requests: int = 0
    # With an expected credential: requests that carried it exactly, and those that did not.
    authorized_requests: int = 0
    unauthorized_requests: int = 0
    reported_input_tokens: int = 0
    reported_output_tokens: int = 0
    # The W3C ``traceparent`` of the last request that carried one ("" before): whether a
    # tracing gateway in front of it joined its trace.
    last_traceparent: str = ""

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


@dataclass(frozen=True)
class ReceivedRequest:
    """One chat completion request as the fake received it (header names lower-cased)."""

    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None
) -> bytes:
    """The OpenAI error shape."""
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": None}}
    ).encode()


@dataclass(frozen=True)
class _Answer:
    """What the fake decided to say to one request, before it is framed."""

    model: str
    reasoning: list[str]
    content: list[str]
    tool_call: dict[str, Any] | None
    arguments: list[str]
    finish_reason: str
    usage: dict[str, Any]


class FakeOpenAI:
    """The fake's state and settings; :meth:`resource` is what a ``Site`` or ``StubTreq`` serves."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        tokens: int = 16,
        chunk_tokens: int = 1,
        delay_ms: int = 0,
        reject_tools: bool = False,
        models: Sequence[str] = ("demo-model",),
        responses_api: bool = False,
        anthropic_api: bool = False,
        expect_header: str = "",
        expect_value: str = "",
    ) -> None:
        if tokens < 0 or chunk_tokens < 1 or delay_ms < 0:
            raise ValueError("tokens >= 0, chunk_tokens >= 1 and delay_ms >= 0, please")
        self.clock = clock
        self.settings = FakeSettings(
            tokens,
            chunk_tokens,
            delay_ms,
            reject_tools,
            tuple(models),
            responses_api,
            anthropic_api,
            expect_header.lower(),
            expect_value,
        )
        self.requests: list[ReceivedRequest] = []
        self._stats = FakeStats()
        self._ids = itertools.count(1)

    def _received(self, request: ReceivedRequest) -> None:
        self.requests.append(request)
        if "traceparent" in request.headers:
            self._stats.last_traceparent = request.headers["traceparent"]

    def stats(self) -> FakeStats:
        """A snapshot of the counters."""
        return dataclasses.replace(self._stats)

    def resource(self) -> IResource:
        root = _Directory()
        v1 = _Directory()
        chat = _Directory()
        fake = _Directory()
        root.putChild(b"v1", v1)
        root.putChild(b"_fake", fake)
        v1.putChild(b"models", _Models(self))
        v1.putChild(b"chat", chat)
        if self.settings.responses_api:
            v1.putChild(b"responses", _Post(self._responses))
        if self.settings.anthropic_api:
            messages = _Post(self._messages)
            v1.putChild(b"messages", messages)
            messages.putChild(b"count_tokens", _Post(self._count_tokens))
        chat.putChild(b"completions", _ChatCompletions(self))
        fake.putChild(b"stats", _Stats(self))
        fake.putChild(b"requests", _Requests(self))
        return root

    def site(self) -> Site:
        return Site(self.resource())

    # -- chat completions -------------------------------------------------------------------

    def _chat(self, request: Request) -> bytes | int:
        self._stats.total_requests += 1
        raw = request.content.read() if request.content is not None else b""
        headers = {
            name.decode("latin-1").lower(): values[0].decode("latin-1")
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        expected = self.settings.expect_header
        if expected:
            if headers.get(expected) != self.settings.expect_value:
                self._stats.unauthorized_requests += 1
                return self._reject(
                    request, 401, f"missing or wrong {expected}", kind="authentication_error"
                )
            self._stats.authorized_requests += 1
        try:
            body = json.loads(raw)
        except ValueError:
            self.requests.append(ReceivedRequest(None, headers))
            return self._reject(request, 400, "request body is not valid JSON")
        self._received(ReceivedRequest(body, headers))
        problem = _validate(body)
        if problem is not None:
            return self._reject(request, 400, problem, param="messages")
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        if model in ECHO_MODELS:
            return self._echo(request, model, body, headers)
        if model == FAIL_500_MODEL:
            return self._reject(request, 500, "injected upstream failure", kind="server_error")
        tools = body.get("tools")
        if tools and self.settings.reject_tools:
            return self._reject(request, 400, TOOLS_REJECTED, param="tools")
        answer = self._answer(model, body)
        delay = self.settings.delay_ms
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            steps = self._stream_steps(answer, include_usage)
            drop_at = (
                min(len(steps) - 1, 1 + MIDSTREAM_CHUNKS) if model == FAIL_MIDSTREAM_MODEL else None
            )
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"text/event-stream")
            request.setHeader(b"cache-control", b"no-cache")
            reported = _chat_usage(answer.usage) if include_usage else None
            _Writer(self, request, steps, delay, drop_at, stream=True, usage=reported).start()
        else:
            completion = json.dumps(self._completion(answer)).encode()
            tokens = len(answer.reasoning) + len(answer.content) + len(answer.arguments)
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/json")
            if model == FAIL_MIDSTREAM_MODEL:
                steps = [(completion[: len(completion) // 2], tokens)]
                _Writer(self, request, steps, delay, drop_at=1, stream=False).start()
            else:
                _Writer(
                    self,
                    request,
                    [(completion, tokens)],
                    delay,
                    None,
                    stream=False,
                    usage=_chat_usage(answer.usage),
                ).start()
        return NOT_DONE_YET

    def _echo(
        self, request: Request, model: str, body: dict[str, Any], headers: dict[str, str]
    ) -> bytes | int:
        """An answer that reflects the request's credential (an ``echo-auth-*`` model)."""
        credential = headers.get(self.settings.expect_header or "authorization", "")
        if model == ECHO_401_MODEL:
            self._stats.rejected_requests += 1
            request.setResponseCode(401, f"Unauthorized ({credential})".encode("latin-1"))
            request.setHeader(b"content-type", b"application/json")
            return error_body(f"Incorrect API key provided: {credential}", "invalid_request_error")
        if model == ECHO_500_MODEL:
            self._stats.rejected_requests += 1
            request.setResponseCode(500)
            request.setHeader(b"content-type", b"application/json")
            debug = {"request_headers": headers, "request_body": body}
            return json.dumps(
                {"error": {"message": "internal error", "type": "server_error", "debug": debug}}
            ).encode()
        stream = body.get("stream") is True
        if model == ECHO_HEADER_MODEL:
            request.setHeader(b"x-request-id", f"req-{credential}".encode("latin-1"))
            request.setHeader(b"x-echo-authorization", credential.encode("latin-1"))
            answer = self._answer(model, body)
        else:
            base = self._answer(model, body)
            content = ["Your ", "key ", "is ", credential, "."]
            answer = _Answer(model, [], content, None, [], "stop", base.usage)
        if not stream:
            completion = json.dumps(self._completion(answer)).encode()
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/json")
            _Writer(self, request, [(completion, 1)], 0, None, stream=False).start()
            return NOT_DONE_YET
        steps = self._stream_steps(answer, include_usage=False)
        pause = 0
        if model == ECHO_STREAM_MODEL and credential:
            # The event carrying the credential, cut in the middle of it.
            needle = credential.encode("latin-1")
            at = next(i for i, (data, _) in enumerate(steps) if needle in data)
            data, tokens = steps[at]
            cut = data.index(needle) + len(needle) // 2
            steps[at : at + 1] = [(data[:cut], 0), (data[cut:], tokens)]
            pause = ECHO_PAUSE_MS
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream")
        _Writer(self, request, steps, 0, None, stream=True, pause_ms=pause).start()
        return NOT_DONE_YET

    def _reject(
        self,
        request: Request,
        code: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> bytes:
        self._stats.rejected_requests += 1
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return error_body(message, kind, param)

    def _answer(self, model: str, body: dict[str, Any]) -> _Answer:
        messages: list[dict[str, Any]] = body["messages"]
        prompt_tokens = sum(word_count(m.get("content")) for m in messages)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        count = self.settings.tokens
        finish = "stop"
        if isinstance(limit, int) and 0 < limit < count:
            count, finish = limit, "length"
        reasoning = (
            fake_tokens(reasoning_token_count(count), "think") if REASONING_MARKER in model else []
        )
        tools = body.get("tools")
        tool_call: dict[str, Any] | None = None
        arguments: list[str] = []
        content: list[str] = []
        # One tool round: once the conversation carries a tool result, answer with text, so an
        # agent client's tool loop ends.
        answered = bool(messages) and messages[-1].get("role") == "tool"
        if isinstance(tools, list) and tools and body.get("tool_choice") != "none" and not answered:
            first: dict[str, Any] = tools[0] if isinstance(tools[0], dict) else {}
            function = first.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            name = name if isinstance(name, str) and name else "tool"
            argument_text = json.dumps(fake_arguments(first))
            arguments = split_arguments(argument_text)
            tool_call = {
                "id": f"call_fake_{next(self._ids)}",
                "type": "function",
                "function": {"name": name, "arguments": argument_text},
            }
            finish = "tool_calls"
        else:
            content = fake_tokens(count)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(reasoning) + len(content) + len(arguments),
            "total_tokens": prompt_tokens + len(reasoning) + len(content) + len(arguments),
        }
        if messages and messages[0].get("role") == "system":
            usage["prompt_tokens_details"] = {
                "cached_tokens": word_count(messages[0].get("content"))
            }
        if reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": len(reasoning)}
        return _Answer(model, reasoning, content, tool_call, arguments, finish, usage)

    def _envelope(self, answer: _Answer, kind: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": kind,
            "created": int(self.clock.seconds()),
            "model": answer.model,
        }

    def _stream_steps(self, answer: _Answer, include_usage: bool) -> list[tuple[bytes, int]]:
        """The SSE frames of an answer, each with the number of tokens it carries."""
        base = self._envelope(answer, "chat.completion.chunk")

        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

        size = self.settings.chunk_tokens
        steps: list[tuple[bytes, int]] = [(frame({"role": "assistant", "content": ""}), 0)]
        for i in range(0, len(answer.reasoning), size):
            piece = answer.reasoning[i : i + size]
            steps.append((frame({"reasoning_content": "".join(piece)}), len(piece)))
        for i in range(0, len(answer.content), size):
            piece = answer.content[i : i + size]
            steps.append((frame({"content": "".join(piece)}), len(piece)))
        if answer.tool_call is not None:
            call = answer.tool_call
            head = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            steps.append((frame({"tool_calls": [head]}), 0))
            for argument_piece in answer.arguments:
                arg_delta = {"index": 0, "function": {"arguments": argument_piece}}
                steps.append((frame({"tool_calls": [arg_delta]}), 1))
        steps.append((frame({}, answer.finish_reason), 0))
        if include_usage:
            chunk = {**base, "choices": [], "usage": answer.usage}
            steps.append((b"data: " + json.dumps(chunk).encode() + b"\n\n", 0))
        steps.append((b"data: [DONE]\n\n", 0))
        return steps

    def _completion(self, answer: _Answer) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(answer.content) if answer.tool_call is None else None,
        }
        if answer.reasoning:
            message["reasoning_content"] = "".join(answer.reasoning)
        if answer.tool_call is not None:
            message["tool_calls"] = [answer.tool_call]
        choice = {"index": 0, "message": message, "logprobs": None}
        choice["finish_reason"] = answer.finish_reason
        return {
            **self._envelope(answer, "chat.completion"),
            "choices": [choice],
            "usage": answer.usage,
        }

    # -- responses (minimal) ----------------------------------------------------------------

    def _read_json(self, request: Request) -> Any:
        self._stats.total_requests += 1
        raw = request.content.read() if request.content is not None else b""
        headers = {
            name.decode("latin-1").lower(): values[0].decode("latin-1")
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self._received(ReceivedRequest(body, headers))
        return body

    def _text_answer(self, limit: Any) -> tuple[list[str], bool]:
        """The answer tokens, and whether ``limit`` cut them short."""
        count = self.settings.tokens
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < count:
            return fake_tokens(limit), True
        return fake_tokens(count), False

    def _responses_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The function tool to call: the first one offered, unless ``tool_choice`` is none or
        the conversation already carries a ``function_call_output`` (one tool round, as on the
        Chat route)."""
        tools = body.get("tools")
        if not isinstance(tools, list) or body.get("tool_choice") == "none":
            return None
        inputs = body["input"]
        if isinstance(inputs, list) and any(
            isinstance(item, dict) and item.get("type") == "function_call_output" for item in inputs
        ):
            return None
        for tool in tools:
            if isinstance(tool, dict) and tool.get("type") == "function":
                name = tool.get("name")
                return {**tool, "name": name if isinstance(name, str) and name else "tool"}
        return None

    def _responses(self, request: Request) -> bytes | int:
        body = self._read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("input"), str | list):
            return self._reject(request, 400, "'input' is required", param="input")
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        if model == FAIL_500_MODEL:
            return self._reject(request, 500, "injected upstream failure", kind="server_error")
        inputs = body["input"]
        if isinstance(inputs, str):
            prompt_tokens = len(inputs.split())
        else:
            prompt_tokens = sum(
                word_count(item.get("content")) for item in inputs if isinstance(item, dict)
            )
        instructions = body.get("instructions")
        # Instructions are counted into the prompt, and reported as read from a cache.
        cached = len(instructions.split()) if isinstance(instructions, str) else 0
        prompt_tokens += cached
        tokens, cut = self._text_answer(body.get("max_output_tokens"))
        number = next(self._ids)
        response_id = f"resp_fake_{number}"
        tool = self._responses_tool(body)
        pieces: list[str] = []
        item: dict[str, Any]
        if tool is not None:
            tokens, cut = [], False
            arguments = json.dumps(fake_arguments({"function": tool}))
            pieces = split_arguments(arguments)
            item_id = f"fc_fake_{number}"
            item = {
                "type": "function_call",
                "id": item_id,
                "call_id": f"call_fake_{number}",
                "name": tool["name"],
                "arguments": arguments,
                "status": "completed",
            }
        else:
            item_id = f"msg_fake_{number}"
            part = {"type": "output_text", "text": "".join(tokens), "annotations": []}
            item = {
                "type": "message",
                "id": item_id,
                "status": "incomplete" if cut else "completed",
                "role": "assistant",
                "content": [part],
            }
        output_tokens = len(tokens) + len(pieces)
        usage = {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        }

        def response(status: str, output: list[Any], final: bool) -> dict[str, Any]:
            return {
                "id": response_id,
                "object": "response",
                "created_at": int(self.clock.seconds()),
                "status": status,
                "model": model,
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if cut and final else None,
                "instructions": body.get("instructions"),
                "metadata": {},
                "temperature": 1.0,
                "top_p": 1.0,
                "usage": usage if final else None,
            }

        done = response("incomplete" if cut else "completed", [item], True)
        if body.get("stream") is not True:
            data = json.dumps(done).encode()
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/json")
            _Writer(
                self,
                request,
                [(data, output_tokens)],
                self.settings.delay_ms,
                None,
                False,
                usage=(prompt_tokens, output_tokens),
            ).start()
            return NOT_DONE_YET
        events: list[tuple[dict[str, Any], int]] = [
            ({"type": "response.created", "response": response("in_progress", [], False)}, 0),
            ({"type": "response.in_progress", "response": response("in_progress", [], False)}, 0),
        ]
        if tool is not None:
            events += _function_call_events(item, pieces)
        else:
            events += _message_events(item, tokens)
        events += [
            ({"type": "response.output_item.done", "output_index": 0, "item": item}, 0),
            (
                {
                    "type": "response.incomplete" if cut else "response.completed",
                    "response": done,
                },
                0,
            ),
        ]
        steps = [
            (_named_event(event["type"], {**event, "sequence_number": i}), weight)
            for i, (event, weight) in enumerate(events)
        ]
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream")
        _Writer(
            self,
            request,
            steps,
            self.settings.delay_ms,
            None,
            stream=True,
            usage=(prompt_tokens, output_tokens),
        ).start()
        return NOT_DONE_YET

    # -- Anthropic Messages (minimal) -------------------------------------------------------

    def _anthropic_reject(self, request: Request, code: int, message: str) -> bytes:
        self._stats.rejected_requests += 1
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        ).encode()

    def _anthropic_request(
        self, request: Request, needs_max_tokens: bool
    ) -> dict[str, Any] | bytes:
        """The request body, or the bytes of the error answer."""
        body = self._read_json(request)
        if not request.requestHeaders.hasHeader(b"anthropic-version"):
            return self._anthropic_reject(request, 400, "anthropic-version: header is required")
        if not isinstance(body, dict):
            return self._anthropic_reject(request, 400, "request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._anthropic_reject(request, 400, "messages: field required")
        max_tokens = body.get("max_tokens")
        if needs_max_tokens and (not isinstance(max_tokens, int) or max_tokens < 1):
            return self._anthropic_reject(request, 400, "max_tokens: field required")
        return body

    def _anthropic_prompt_tokens(self, body: dict[str, Any]) -> int:
        system = body.get("system")
        total = word_count(system) if system is not None else 0
        for message in body["messages"]:
            if isinstance(message, dict):
                total += word_count(message.get("content"))
        return total

    def _anthropic_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The tool to call: the first one, unless ``tool_choice`` is none or the last user turn
        carries a tool result (one tool round, as on the Chat route)."""
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
            return None
        if isinstance(choice, dict) and choice.get("type") == "none":
            return None
        last = body["messages"][-1]
        content = last.get("content") if isinstance(last, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            return None
        name = tools[0].get("name")
        return {**tools[0], "name": name if isinstance(name, str) and name else "tool"}

    def _count_tokens(self, request: Request) -> bytes:
        body = self._anthropic_request(request, needs_max_tokens=False)
        if isinstance(body, bytes):
            return body
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"application/json")
        self._stats.completed_responses += 1
        return json.dumps({"input_tokens": self._anthropic_prompt_tokens(body)}).encode()

    def _messages(self, request: Request) -> bytes | int:
        body = self._anthropic_request(request, needs_max_tokens=True)
        if isinstance(body, bytes):
            return body
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        if model == FAIL_500_MODEL:
            self._stats.rejected_requests += 1
            request.setResponseCode(500)
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(
                {"type": "error", "error": {"type": "api_error", "message": "injected failure"}}
            ).encode()
        tokens, cut = self._text_answer(body["max_tokens"])
        prompt_tokens = self._anthropic_prompt_tokens(body)
        stop_reason = "max_tokens" if cut else "end_turn"
        message_id = f"msg_fake_{next(self._ids)}"
        tool = self._anthropic_tool(body)
        block: dict[str, Any] = {"type": "text", "text": "".join(tokens)}
        if tool is not None:
            tokens, stop_reason = [], "tool_use"
            block = {
                "type": "tool_use",
                "id": f"toolu_fake_{next(self._ids)}",
                "name": tool["name"],
                "input": fake_arguments({"function": {"parameters": tool.get("input_schema")}}),
            }
        message: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": len(tokens)},
        }
        if body.get("stream") is not True:
            data = json.dumps(message).encode()
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/json")
            _Writer(
                self,
                request,
                [(data, len(tokens))],
                self.settings.delay_ms,
                None,
                False,
                usage=(prompt_tokens, len(tokens)),
            ).start()
            return NOT_DONE_YET
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        opening = {**block, "input": {}} if tool is not None else {"type": "text", "text": ""}
        events: list[tuple[dict[str, Any], int]] = [
            ({"type": "message_start", "message": started}, 0),
            ({"type": "content_block_start", "index": 0, "content_block": opening}, 0),
        ]
        if tool is not None:
            for piece in split_arguments(json.dumps(block["input"])):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(({"type": "content_block_delta", "index": 0, "delta": delta}, 1))
        for token in tokens:
            delta = {"type": "text_delta", "text": token}
            events.append(({"type": "content_block_delta", "index": 0, "delta": delta}, 1))
        events += [
            ({"type": "content_block_stop", "index": 0}, 0),
            (
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": len(tokens)},
                },
                0,
            ),
            ({"type": "message_stop"}, 0),
        ]
        steps = [(_named_event(event["type"], event), weight) for event, weight in events]
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream")
        _Writer(
            self,
            request,
            steps,
            self.settings.delay_ms,
            None,
            stream=True,
            usage=(prompt_tokens, len(tokens)),
        ).start()
        return NOT_DONE_YET


def _message_events(item: dict[str, Any], tokens: list[str]) -> list[tuple[dict[str, Any], int]]:
    """A Responses stream's events for a message item, up to its ``output_item.done``."""
    part = item["content"][0]
    located = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    events: list[tuple[dict[str, Any], int]] = [
        (
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
            0,
        ),
        ({"type": "response.content_part.added", **located, "part": {**part, "text": ""}}, 0),
    ]
    for token in tokens:
        delta = {"type": "response.output_text.delta", **located, "delta": token, "logprobs": []}
        events.append((delta, 1))
    text = part["text"]
    events += [
        ({"type": "response.output_text.done", **located, "text": text, "logprobs": []}, 0),
        ({"type": "response.content_part.done", **located, "part": part}, 0),
    ]
    return events


def _function_call_events(
    item: dict[str, Any], pieces: list[str]
) -> list[tuple[dict[str, Any], int]]:
    """A Responses stream's events for a function_call item, up to its ``output_item.done``:
    the item added with no arguments, the arguments in pieces, then all of them."""
    located = {"item_id": item["id"], "output_index": 0}
    added = {**item, "arguments": "", "status": "in_progress"}
    events: list[tuple[dict[str, Any], int]] = [
        ({"type": "response.output_item.added", "output_index": 0, "item": added}, 0)
    ]
    for piece in pieces:
        events.append(
            ({"type": "response.function_call_arguments.delta", **located, "delta": piece}, 1)
        )
    done = {
        "type": "response.function_call_arguments.done",
        **located,
        "name": item["name"],
        "arguments": item["arguments"],
    }
    events.append((done, 0))
    return events


def _chat_usage(usage: dict[str, Any]) -> tuple[int, int]:
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


def _named_event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event with an ``event:`` line, as the Responses and Messages APIs send them."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _validate(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' is required and must be a non-empty list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{i}] must be an object with a 'role'"
    return None


class _Writer:
    """
    Writes one answer's frames, waiting ``delay_ms`` milliseconds per token before each
    token-bearing frame (and ``pause_ms`` before every frame but the first); stops when the
    client goes away. ``drop_at``: drop the connection after that many frames (error injection).
    ``usage``: the (input, output) tokens the answer reports, counted once it is written whole.
    """

    def __init__(
        self,
        fake: FakeOpenAI,
        request: Request,
        steps: list[tuple[bytes, int]],
        delay_ms: int,
        drop_at: int | None,
        stream: bool,
        pause_ms: int = 0,
        usage: tuple[int, int] | None = None,
    ) -> None:
        self._fake = fake
        self._usage = usage
        self._request = request
        self._steps = steps
        self._delay_ms = delay_ms
        self._drop_at = drop_at
        self._stream = stream
        self._pause_ms = pause_ms
        self._index = 0
        self._waited = False
        self._call: IDelayedCall | None = None
        self._over = False
        self._dropping = False

    def start(self) -> None:
        stats = self._fake._stats
        stats.active_answers += 1
        stats.max_active_answers = max(stats.max_active_answers, stats.active_answers)
        if self._stream:
            stats.active_streams += 1
        self._request.notifyFinish().addCallbacks(self._finished, self._lost)
        self._pump()

    def _pump(self) -> None:
        self._call = None
        while not self._over:
            if self._index >= len(self._steps):
                self._request.finish()
                return
            data, tokens = self._steps[self._index]
            wait_ms = tokens * self._delay_ms + (self._pause_ms if self._index else 0)
            if wait_ms > 0 and not self._waited:
                self._waited = True
                self._call = self._fake.clock.callLater(wait_ms / 1000.0, self._pump)
                return
            self._waited = False
            self._request.write(data)
            self._index += 1
            if self._drop_at is not None and self._index >= self._drop_at:
                self._dropping = True
                self._request.loseConnection()
                return

    def _end(self) -> None:
        self._over = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._fake._stats.active_answers -= 1
        if self._stream:
            self._fake._stats.active_streams -= 1

    def _finished(self, _: object) -> None:
        self._end()
        stats = self._fake._stats
        stats.completed_responses += 1
        if self._usage is not None:
            stats.reported_input_tokens += self._usage[0]
            stats.reported_output_tokens += self._usage[1]

    def _lost(self, reason: Failure) -> None:
        self._end()
        if self._dropping:
            self._fake._stats.dropped_streams += 1
        else:
            self._fake._stats.client_disconnects += 1


class _JSONResource(Resource):
    def _json(self, request: Request, code: int, body: bytes) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return body


class _Directory(_JSONResource):
    """A path segment with children; unknown children answer an OpenAI-shaped 404."""

    def getChild(self, path: bytes, request: Request) -> IResource:
        return _NotFound()

    def render(self, request: Request) -> bytes:
        return _NotFound().render(request)


class _NotFound(_JSONResource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        path = request.path.decode("latin-1", errors="replace")
        return self._json(request, 404, error_body(f"no route for {path}", "not_found_error"))


class _Models(_JSONResource):
    isLeaf = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__()
        self._fake = fake

    def render_GET(self, request: Request) -> bytes:
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "fake"}
            for model in self._fake.settings.models
        ]
        return self._json(request, 200, json.dumps({"object": "list", "data": data}).encode())


class _ChatCompletions(Resource):
    isLeaf = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__()
        self._fake = fake

    def render_POST(self, request: Request) -> bytes | int:
        return self._fake._chat(request)


class _Post(_Directory):
    """A POST-only route answered by one of the fake's methods (children: more routes)."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self._answer = answer

    def getChild(self, path: bytes, request: Request) -> IResource:
        if not path:
            return self
        return super().getChild(path, request)

    def render_POST(self, request: Request) -> bytes | int:
        result: bytes | int = self._answer(request)
        return result

    def render(self, request: Request) -> bytes:
        if request.method == b"POST":
            return self.render_POST(request)  # type: ignore[return-value]
        return _NotFound().render(request)


# How many received requests ``GET /_fake/requests`` shows, and the headers whose value it hides.
SHOWN_REQUESTS = 100
_HIDDEN_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})


class _Requests(_JSONResource):
    isLeaf = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__()
        self._fake = fake

    def render_GET(self, request: Request) -> bytes:
        shown = [
            {
                "headers": {
                    name: "<set>" if name in _HIDDEN_HEADERS else value
                    for name, value in received.headers.items()
                }
            }
            for received in self._fake.requests[-SHOWN_REQUESTS:]
        ]
        return self._json(request, 200, json.dumps({"requests": shown}).encode())


class _Stats(_JSONResource):
    isLeaf = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__()
        self._fake = fake

    def render_GET(self, request: Request) -> bytes:
        return self._json(request, 200, json.dumps(self._fake.stats().as_dict()).encode())


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m iop.testing.fake_openai",
        description="Serve a fake OpenAI-compatible upstream.",
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--chunk-tokens", type=int, default=1, help="tokens per SSE chunk")
    parser.add_argument("--delay-ms", type=int, default=0, help="delay per token")
    parser.add_argument("--reject-tools", action="store_true", help="answer 400 to tools")
    parser.add_argument("--models", default="demo-model", help="comma-separated model ids")
    parser.add_argument(
        "--responses-api", action="store_true", help="also answer POST /v1/responses"
    )
    parser.add_argument(
        "--anthropic-api",
        action="store_true",
        help="also answer POST /v1/messages and /v1/messages/count_tokens (Anthropic-shaped)",
    )
    parser.add_argument(
        "--expect-header",
        default="",
        help="answer chat completions 401 unless this header carries exactly the value in "
        "$IOP_FAKE_EXPECT_VALUE (a credential, kept off the command line)",
    )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    from twisted.internet import reactor as _reactor

    reactor: Any = _reactor

    args = parse_args(sys.argv[1:] if argv is None else argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    fake = FakeOpenAI(
        reactor,
        tokens=args.tokens,
        chunk_tokens=args.chunk_tokens,
        delay_ms=args.delay_ms,
        reject_tools=args.reject_tools,
        responses_api=args.responses_api,
        anthropic_api=args.anthropic_api,
        models=models or ["demo-model"],
        expect_header=args.expect_header,
        expect_value=os.environ.get("IOP_FAKE_EXPECT_VALUE", ""),
    )
    port = reactor.listenTCP(args.port, fake.site(), interface=args.host)
    print(f"fake-openai listening on {args.host}:{port.getHost().port}", flush=True)
    reactor.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
