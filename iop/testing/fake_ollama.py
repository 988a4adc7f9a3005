# -*- test-case-name: iop.test.testing.test_fake_ollama -*-
"""
A fake Ollama server: a real ``twisted.web`` resource tree that speaks enough of Ollama's native
API for tests, the benchmark and the demo. Serve :attr:`FakeOllama.resource` behind a real port
(:meth:`FakeOllama.site`) or wrap it in ``treq.testing.StubTreq``.

Routes, shaped like the real API:

- ``POST /api/chat``: streams NDJSON (``stream`` defaults to true) — one line per token with
  ``message.thinking`` pieces first when thinking is on (``"think"`` truthy, or a model name
  containing ``think``), then ``message.content`` pieces, then a final ``done: true`` line with
  ``done_reason``, durations, ``prompt_eval_count`` and ``eval_count``. With ``"tools"`` the final
  message carries ``tool_calls`` for the first tool (unless the last message is already a tool
  result: then the text answer, one tool round). ``options.num_predict`` caps the content
  tokens (``done_reason: "length"``). ``"stream": false`` answers one object. An empty
  ``messages`` list "loads" the model (``done_reason: "load"``).
- ``GET /api/tags``, ``GET /api/ps`` (models used within their keep-alive), ``POST /api/show``,
  ``GET /api/version``, and ``GET /`` ("Ollama is running").
- ``GET /_fake/stats``: the counters of :class:`FakeOllamaStats` as JSON.

Failure injection: an unknown model answers 404 ``{"error": "model 'x' not found"}``; a body that
is not a JSON object answers 400; model ``fail-500`` answers 500; model ``fail-midstream`` streams
a few lines and then drops the connection.

Each token waits ``delay_ms`` on the given clock (``callLater``), so a ``task.Clock`` drives it in
tests. A client that goes away (``request.notifyFinish()`` fails) stops the generation and is
counted in ``client_disconnects``.

Run it on its own::

    python -m iop.testing.fake_ollama --port 11434 [--host 127.0.0.1] [--tokens N]
        [--delay-ms N] [--models a,b]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

DEFAULT_MODELS = ("llama3.2",)
DEFAULT_TOKENS = 16
DEFAULT_THINKING_TOKENS = 4
FAKE_VERSION = "0.11.0-fake"
# Ollama keeps a model loaded five minutes after its last use unless told otherwise.
DEFAULT_KEEP_ALIVE = 300.0
# Models that exist whatever the configured list says, to inject failures.
FAIL_500 = "fail-500"
FAIL_MIDSTREAM = "fail-midstream"
MIDSTREAM_LINES = 3
DEFAULT_KEEP_RECEIVED = 1000

CONTENT_WORDS = (
    "Hello", "from", "the", "fake", "Ollama", "server", "streaming", "one", "token", "at",
    "a", "time", "for", "the", "tests", "here.",
)  # fmt: skip
THINKING_WORDS = ("Let", "me", "think", "about", "this", "request", "carefully", "first.")

NDJSON = b"application/x-ndjson"
JSON = b"application/json; charset=utf-8"


@dataclass(frozen=True)
class FakeOllamaStats:
    """
    ``active_streams`` counts chat generations in progress (streamed or not); ``completed`` the
    ones that sent their final object; ``client_disconnects`` the ones whose client went away
    first; ``dropped`` the ``fail-midstream`` connections the fake cut itself; ``errors`` the
    4xx/5xx answers; ``total_requests`` every request, ``chat_requests`` those to ``/api/chat``.
    """

    total_requests: int = 0
    chat_requests: int = 0
    active_streams: int = 0
    completed: int = 0
    client_disconnects: int = 0
    dropped: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the fake saw it (for tests to assert on what a client sent)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any = None


@dataclass
class _Counters:
    total_requests: int = 0
    chat_requests: int = 0
    active_streams: int = 0
    completed: int = 0
    client_disconnects: int = 0
    dropped: int = 0
    errors: int = 0


@dataclass
class _Model:
    name: str  # canonical, with a tag: "llama3.2:latest"
    loaded_until: float | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()

    @property
    def family(self) -> str:
        base = self.name.split(":", 1)[0].split("/")[-1]
        letters = ""
        for c in base:
            if not c.isalpha():
                break
            letters += c.lower()
        return letters or "llama"

    @property
    def size(self) -> int:
        return 1_000_000_000 + int(self.digest[:6], 16)

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": "3.2B",
            "quantization_level": "Q4_K_M",
        }

    def capabilities(self) -> list[str]:
        out = ["completion", "tools"]
        if "think" in self.name:
            out.append("thinking")
        return out


def canonical_name(name: str) -> str:
    """Ollama's name for a model: a name without a tag means ``:latest``."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, the way Ollama writes ``created_at``."""
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def parse_keep_alive(value: Any) -> float | None:
    """Seconds to keep a model loaded; None means forever (a negative value). Defaults to 5 m."""
    if value is None:
        return DEFAULT_KEEP_ALIVE
    seconds: float
    if isinstance(value, bool):
        return DEFAULT_KEEP_ALIVE
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        scale = 1.0
        for suffix in ("ms", "s", "m", "h"):
            if text.endswith(suffix):
                text, scale = text[: -len(suffix)], units[suffix]
                break
        try:
            seconds = float(text) * scale
        except ValueError:
            return DEFAULT_KEEP_ALIVE
    else:
        return DEFAULT_KEEP_ALIVE
    return None if seconds < 0 else seconds


def prompt_tokens(messages: Iterable[Any]) -> int:
    """The fake's prompt token count: words of every message's content, plus one per message."""
    count = 0
    for message in messages:
        count += 1
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                count += len(content.split())
    return count


def _fake_arguments(tool: Any) -> tuple[str, dict[str, Any]]:
    """A call of ``tool`` (OpenAI/Ollama tool shape) with a plausible value per required field."""
    function = tool.get("function", {}) if isinstance(tool, dict) else {}
    name = function.get("name") if isinstance(function, dict) else None
    parameters = function.get("parameters", {}) if isinstance(function, dict) else {}
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    required = parameters.get("required", []) if isinstance(parameters, dict) else []
    samples: dict[str, Any] = {"integer": 1, "number": 1, "boolean": True}
    arguments: dict[str, Any] = {}
    for key in required if isinstance(required, list) else []:
        spec = properties.get(key, {}) if isinstance(properties, dict) else {}
        kind = spec.get("type") if isinstance(spec, dict) else None
        arguments[str(key)] = samples.get(kind, "fake") if isinstance(kind, str) else "fake"
    return (name if isinstance(name, str) else "tool"), arguments


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


class FakeOllama:
    """
    The fake server's state and its resource tree.

    :param clock: when tokens are produced (``callLater``) and what "now" is for ``created_at``
        and ``/api/ps``.
    :param tokens: content tokens per response.
    :param delay_ms: wait before each streamed line (0: the whole answer is written at once).
    :param models: model names served (a name without a tag is ``name:latest``).
    :param thinking_tokens: thinking pieces streamed before the content when thinking is on.
    :param keep_received: how many of the latest requests :attr:`received` keeps.
    """

    def __init__(
        self,
        clock: IReactorTime,
        tokens: int = DEFAULT_TOKENS,
        delay_ms: float = 0,
        models: Sequence[str] = DEFAULT_MODELS,
        thinking_tokens: int = DEFAULT_THINKING_TOKENS,
        keep_received: int = DEFAULT_KEEP_RECEIVED,
    ) -> None:
        if tokens < 0 or delay_ms < 0 or thinking_tokens < 0:
            raise ValueError("tokens, delay_ms and thinking_tokens must not be negative")
        self.clock = clock
        self.tokens = tokens
        self.delay_ms = delay_ms
        self.thinking_tokens = thinking_tokens
        self._models = {canonical_name(m): _Model(canonical_name(m)) for m in models}
        self._counters = _Counters()
        # The latest requests (bounded: a long benchmark run must not grow without limit).
        self.received: deque[ReceivedRequest] = deque(maxlen=keep_received)
        self.resource: IResource = _Root(self)

    # -- the Python accessors ----------------------------------------------------------------

    def stats(self) -> FakeOllamaStats:
        return FakeOllamaStats(**asdict(self._counters))

    def chat_bodies(self) -> list[Any]:
        """The JSON bodies received by ``/api/chat``, in order."""
        return [r.body for r in self.received if r.path == "/api/chat"]

    def site(self) -> Site:
        """A ``Site`` to listen with."""
        return Site(self.resource)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    # -- the parts the resources use ---------------------------------------------------------

    def _lookup(self, name: Any) -> _Model | None:
        if not isinstance(name, str) or not name:
            return None
        canonical = canonical_name(name)
        if canonical in self._models:
            return self._models[canonical]
        if name in (FAIL_500, FAIL_MIDSTREAM):
            return _Model(canonical)
        return None

    def _loaded(self) -> list[_Model]:
        now = self.clock.seconds()
        return [
            m for m in self._models.values() if m.loaded_until is not None and m.loaded_until > now
        ]

    def _touch(self, model: _Model, keep_alive: Any) -> None:
        if model.name not in self._models:
            return
        seconds = parse_keep_alive(keep_alive)
        model.loaded_until = float("inf") if seconds is None else self.clock.seconds() + seconds

    def _model_entry(self, model: _Model) -> dict[str, Any]:
        return {
            "name": model.name,
            "model": model.name,
            "modified_at": "2025-01-01T00:00:00Z",
            "size": model.size,
            "digest": model.digest,
            "details": model.details(),
        }

    def _record(self, request: Request, body: Any) -> None:
        headers = {
            name.decode("latin-1").lower(): b", ".join(values).decode("latin-1")
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        self.received.append(
            ReceivedRequest(
                method=(request.method or b"").decode("ascii", "replace"),
                path=(request.path or b"").decode("utf-8", "replace"),
                headers=headers,
                body=body,
            )
        )

    def _error(self, request: Request, code: int, message: str) -> bytes:
        self._counters.errors += 1
        request.setResponseCode(code)
        request.setHeader(b"content-type", JSON)
        return _json_bytes({"error": message})

    def _read_json(self, request: Request) -> tuple[Any, bytes | None]:
        """The request body as a JSON object, or an error answer to return."""
        raw = request.content.read() if request.content is not None else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            self._record(request, None)
            return None, self._error(request, 400, f"invalid JSON body: {e}")
        self._record(request, body)
        if not isinstance(body, dict):
            return None, self._error(request, 400, "request body must be a JSON object")
        return body, None

    # -- /api/chat ---------------------------------------------------------------------------

    def _chat(self, request: Request) -> bytes | int:
        self._counters.chat_requests += 1
        body, error = self._read_json(request)
        if error is not None:
            return error
        name = body.get("model")
        if not isinstance(name, str) or not name:
            return self._error(request, 400, "model is required")
        model = self._lookup(name)
        if model is None:
            return self._error(request, 404, f"model '{name}' not found")
        messages = body.get("messages") or []
        if not isinstance(messages, list):
            return self._error(request, 400, "messages must be a list")
        if name == FAIL_500:
            return self._error(request, 500, "fake internal server error")
        self._touch(model, body.get("keep_alive"))
        stream = body.get("stream", True) is not False
        generation = _Generation(self, request, name, body, messages, stream)
        return generation.begin()


class _Generation:
    """One ``/api/chat`` generation: precomputed lines, written one per delay."""

    def __init__(
        self,
        fake: FakeOllama,
        request: Request,
        model: str,
        body: dict[str, Any],
        messages: list[Any],
        stream: bool,
    ) -> None:
        self.fake = fake
        self.request = request
        self.model = model
        self.stream = stream
        self.started = fake.clock.seconds()
        self.finished = False
        self.call: IDelayedCall | None = None
        self.midstream = model == FAIL_MIDSTREAM
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        think = body.get("think")
        thinking = (bool(think) and think != "false") or (think is None and "think" in model)
        n_think = fake.thinking_tokens if thinking and messages else 0
        n_content = fake.tokens if messages else 0
        limit = options.get("num_predict") if isinstance(options, dict) else None
        self.done_reason = "stop" if messages else "load"
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < n_content:
            n_content, self.done_reason = limit, "length"
        self.thinking = [
            ("" if i == 0 else " ") + THINKING_WORDS[i % len(THINKING_WORDS)]
            for i in range(n_think)
        ]
        self.content = [
            ("" if i == 0 else " ") + CONTENT_WORDS[i % len(CONTENT_WORDS)]
            for i in range(n_content)
        ]
        tools = body.get("tools")
        self.tool_calls: list[dict[str, Any]] = []
        # One tool round: once the last message is a tool result, answer with text.
        answered = (
            bool(messages)
            and isinstance(messages[-1], dict)
            and (messages[-1].get("role") == "tool")
        )
        if isinstance(tools, list) and tools and messages and not answered:
            tool_name, arguments = _fake_arguments(tools[0])
            self.tool_calls = [{"function": {"name": tool_name, "arguments": arguments}}]
        self.prompt_eval_count = prompt_tokens(messages)
        self.eval_count = n_think + n_content
        self.pieces: list[tuple[str, str]] = [("thinking", t) for t in self.thinking] + [
            ("content", c) for c in self.content
        ]
        # What is left to write: ("thinking"|"content", text), ("final", ""), ("whole", "").
        self.lines: list[tuple[str, str]] = []

    # -- lifecycle ----------------------------------------------------------------------------

    def begin(self) -> int:
        counters = self.fake._counters
        counters.active_streams += 1
        self.request.notifyFinish().addErrback(self._client_gone)
        self.request.setResponseCode(200)
        self.request.setHeader(b"content-type", NDJSON if self.stream else JSON)
        if self.stream:
            # The status and headers go out now; the lines follow one per delay.
            self.request.write(b"")
            self.lines = [*self.pieces, ("final", "")]
            if self.midstream:
                self.lines = self.lines[:MIDSTREAM_LINES]
        else:
            self.lines = [("whole", "")]
        self._next()
        return NOT_DONE_YET

    def _next(self) -> None:
        self.call = None
        delay = self.fake.delay_ms / 1000.0
        if delay <= 0:
            while not self.finished and self.lines:
                self._write(self.lines.pop(0))
            if not self.finished:
                self._end()
            return
        if not self.lines:
            self._end()
            return
        # Non-streamed answers take as long as the streamed ones would have.
        wait = delay * (max(1, len(self.pieces) + 1) if not self.stream else 1)
        self.call = self.fake.clock.callLater(wait, self._tick)

    def _tick(self) -> None:
        self.call = None
        if self.finished:
            return
        self._write(self.lines.pop(0))
        if self.lines:
            self._next()
        else:
            self._end()

    def _write(self, item: tuple[str, str]) -> None:
        kind, text = item
        if kind == "final":
            line = self._final()
        elif kind == "whole":
            line = self._whole()
        else:
            line = self._line(kind, text)
        self.request.write(line + (b"\n" if self.stream else b""))

    def _end(self) -> None:
        if self.finished:
            return
        self.finished = True
        counters = self.fake._counters
        counters.active_streams -= 1
        if self.midstream:
            counters.dropped += 1
            self.request.loseConnection()
            return
        counters.completed += 1
        self.request.finish()

    def _client_gone(self, reason: Failure) -> None:
        if self.finished:
            return
        self.finished = True
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        counters = self.fake._counters
        counters.active_streams -= 1
        counters.client_disconnects += 1

    # -- the lines ----------------------------------------------------------------------------

    def _now(self) -> str:
        return timestamp(self.fake.clock.seconds())

    def _line(self, kind: str, text: str) -> bytes:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if kind == "content" else "",
        }
        if kind == "thinking":
            message["thinking"] = text
        return _json_bytes(
            {"model": self.model, "created_at": self._now(), "message": message, "done": False}
        )

    def _stats(self) -> dict[str, Any]:
        eval_ns = int((self.fake.clock.seconds() - self.started) * 1e9)
        load_ns, prompt_ns = 1_000_000, 2_000_000
        return {
            "done_reason": self.done_reason,
            "total_duration": load_ns + prompt_ns + eval_ns,
            "load_duration": load_ns,
            "prompt_eval_count": self.prompt_eval_count,
            "prompt_eval_duration": prompt_ns,
            "eval_count": self.eval_count,
            "eval_duration": eval_ns,
        }

    def _final(self) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        line = {"model": self.model, "created_at": self._now(), "message": message, "done": True}
        line.update(self._stats())
        return _json_bytes(line)

    def _whole(self) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.thinking:
            message["thinking"] = "".join(self.thinking)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        line = {"model": self.model, "created_at": self._now(), "message": message, "done": True}
        line.update(self._stats())
        return _json_bytes(line)


# -- the resource tree --------------------------------------------------------------------------


class _Root(Resource):
    def __init__(self, fake: FakeOllama) -> None:
        super().__init__()
        self.fake = fake
        api = Resource()
        api.putChild(b"chat", _ChatResource(fake))
        api.putChild(b"tags", _Tags(fake))
        api.putChild(b"ps", _Ps(fake))
        api.putChild(b"show", _Show(fake))
        api.putChild(b"version", _Version(fake))
        self.putChild(b"api", api)
        private = Resource()
        private.putChild(b"stats", _Stats(fake))
        self.putChild(b"_fake", private)
        self.putChild(b"", _Hello(fake))

    def getChildWithDefault(self, path: bytes, request: Any) -> IResource:
        self.fake._counters.total_requests += 1
        return super().getChildWithDefault(path, request)  # type: ignore[no-any-return]


class _Leaf(Resource):
    isLeaf = True

    def __init__(self, fake: FakeOllama) -> None:
        super().__init__()
        self.fake = fake

    def _json(self, request: Request, value: Any) -> bytes:
        request.setHeader(b"content-type", JSON)
        return _json_bytes(value)


class _Hello(_Leaf):
    def render_GET(self, request: Request) -> bytes:
        self.fake._record(request, None)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return b"Ollama is running"


class _ChatResource(_Leaf):
    def render_POST(self, request: Request) -> bytes | int:
        return self.fake._chat(request)


class _Tags(_Leaf):
    def render_GET(self, request: Request) -> bytes:
        self.fake._record(request, None)
        models = [self.fake._model_entry(m) for m in self.fake._models.values()]
        return self._json(request, {"models": models})


class _Ps(_Leaf):
    def render_GET(self, request: Request) -> bytes:
        self.fake._record(request, None)
        models = []
        for model in self.fake._loaded():
            entry = self.fake._model_entry(model)
            del entry["modified_at"]
            until = model.loaded_until
            entry["expires_at"] = (
                "2318-01-01T00:00:00Z"
                if until is None or until == float("inf")
                else timestamp(until)
            )
            entry["size_vram"] = model.size
            entry["context_length"] = 4096
            models.append(entry)
        return self._json(request, {"models": models})


class _Show(_Leaf):
    def render_POST(self, request: Request) -> bytes:
        body, error = self.fake._read_json(request)
        if error is not None:
            return error
        name = body.get("model") or body.get("name")
        model = self.fake._lookup(name)
        if model is None or name in (FAIL_500, FAIL_MIDSTREAM):
            return self.fake._error(request, 404, f"model '{name}' not found")
        return self._json(
            request,
            {
                "modelfile": f"# Modelfile generated by the fake\nFROM {model.name}\n",
                "parameters": "num_ctx 4096",
                "template": "{{ .Prompt }}",
                "details": model.details(),
                "model_info": {
                    "general.architecture": model.family,
                    "general.parameter_count": 3_200_000_000,
                    f"{model.family}.context_length": 4096,
                },
                "capabilities": model.capabilities(),
                "modified_at": "2025-01-01T00:00:00Z",
            },
        )


class _Version(_Leaf):
    def render_GET(self, request: Request) -> bytes:
        self.fake._record(request, None)
        return self._json(request, {"version": FAKE_VERSION})


class _Stats(_Leaf):
    def render_GET(self, request: Request) -> bytes:
        return self._json(request, self.fake.stats().as_dict())


# -- the command line ---------------------------------------------------------------------------


@dataclass
class CommandLine:
    host: str = "127.0.0.1"
    port: int = 11434
    tokens: int = DEFAULT_TOKENS
    delay_ms: float = 0
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))


def parse_args(argv: Sequence[str]) -> CommandLine:
    parser = argparse.ArgumentParser(
        prog="python -m iop.testing.fake_ollama", description="Serve a fake Ollama API."
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=11434, help="port (0: any free port)")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="tokens per answer")
    parser.add_argument("--delay-ms", type=float, default=0, help="delay before each token")
    parser.add_argument(
        "--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names"
    )
    args = parser.parse_args(list(argv))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.tokens < 0 or args.delay_ms < 0:
        parser.error("--tokens and --delay-ms must not be negative")
    if not models:
        parser.error("--models needs at least one name")
    return CommandLine(args.host, args.port, args.tokens, args.delay_ms, models)


def main(argv: Sequence[str] | None = None) -> None:
    from twisted.internet import reactor as _reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    options = parse_args(sys.argv[1:] if argv is None else argv)
    reactor: Any = _reactor
    fake = FakeOllama(
        reactor, tokens=options.tokens, delay_ms=options.delay_ms, models=options.models
    )
    endpoint = TCP4ServerEndpoint(reactor, options.port, interface=options.host)

    def listening(port: Any) -> None:
        address = port.getHost()
        print(f"fake-ollama listening on {address.host}:{address.port}", flush=True)

    status = [0]

    def failed(reason: Failure) -> None:
        print(f"fake-ollama: cannot listen: {reason.getErrorMessage()}", file=sys.stderr)
        status[0] = 1
        reactor.stop()

    def start() -> None:
        endpoint.listen(fake.site()).addCallbacks(listening, failed)

    reactor.callWhenRunning(start)
    reactor.run()
    if status[0]:
        sys.exit(status[0])


if __name__ == "__main__":
    main()
