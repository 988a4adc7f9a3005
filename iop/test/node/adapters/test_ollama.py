"""
The ``ollama`` adapter against the fake Ollama server (``StubTreq`` around its resource, a
``task.Clock`` for its token delays and the adapter's timers): event mapping with thinking and
usage, tool calls both ways, HTTP and stream errors, idle and request timeouts, cancellation that
reaches the upstream, the Ollama API queries; and a scripted upstream for malformed streams.
"""

from __future__ import annotations

import json
from typing import Any, cast

from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface.verify import verifyObject

from iop.node.adapters.ollama import (
    DEFAULT_IDLE_TIMEOUT,
    OllamaAPIError,
    OllamaProvider,
    build,
    chat_body,
    ollama_messages,
)
from iop.runtime import (
    AdapterContext,
    AdapterSpec,
    Capabilities,
    EventType,
    ExecutionSpec,
    IOllamaAPI,
    IProvider,
    RuntimeEvent,
    TreqClient,
    Usage,
)
from iop.runtime.chat_input import InputError, parse_chat_input
from iop.test.node.fakes import capture_events
from iop.testing.fake_ollama import CONTENT_WORDS, THINKING_WORDS, FakeOllama, prompt_tokens

BASE_URL = "http://ollama.test:11434"
SECRET = "Bearer s3cr3t-ollama-key"
TOKENS = 6
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def config(**fields: Any) -> AdapterSpec:
    values: dict[str, Any] = {
        "name": "local-ollama",
        "type": "ollama",
        "enabled": True,
        "base_url": BASE_URL,
        "headers": {"Authorization": SECRET},
    }
    values.update(fields)
    return AdapterSpec(**values)


def spec(
    target: str = "llama3.2", input: str = "why is the sky blue", **fields: Any
) -> ExecutionSpec:
    return ExecutionSpec(run_id="run-1", target=target, input=input, **fields)


def types(events: list[RuntimeEvent]) -> list[EventType]:
    return [e.type for e in events]


def text(events: list[RuntimeEvent], kind: EventType = EventType.DELTA) -> str:
    return "".join(e.delta for e in events if e.type == kind)


class AdapterTestCase(SynchronousTestCase):
    delay_ms: float = 0
    tokens = TOKENS

    def setUp(self) -> None:
        self.clock = Clock()
        self.fake = FakeOllama(
            self.clock,
            tokens=self.tokens,
            delay_ms=self.delay_ms,
            models=["llama3.2", "qwen3-think"],
        )
        self.http = StubTreq(self.fake.resource)
        self.logged = capture_events(self)
        self.provider = self.build()
        self.addCleanup(self.assertClean)

    def build(self, **fields: Any) -> OllamaProvider:
        provider = build(
            config(**fields), AdapterContext(reactor=self.clock, http=cast(TreqClient, self.http))
        )
        assert isinstance(provider, OllamaProvider)
        return provider

    def assertClean(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])
        for event in self.logged:
            self.assertNotIn(SECRET, formatEvent(event))
            self.assertNotIn(SECRET, repr(event))

    def execute(
        self, run: ExecutionSpec, provider: OllamaProvider | None = None
    ) -> tuple[list[RuntimeEvent], Deferred[None]]:
        events: list[RuntimeEvent] = []
        d = (provider or self.provider).execute(run, events.append)
        return events, d

    def complete(self, run: ExecutionSpec) -> list[RuntimeEvent]:
        events, d = self.execute(run)
        self.http.flush()
        self.assertIsNone(self.successResultOf(d))
        return events

    def last_body(self) -> Any:
        return self.fake.chat_bodies()[-1]


class EventMappingTests(AdapterTestCase):
    def test_startDeltasComplete(self) -> None:
        events = self.complete(spec())
        self.assertEqual(
            types(events),
            [EventType.START] + [EventType.DELTA] * TOKENS + [EventType.COMPLETE],
        )
        self.assertEqual(text(events), " ".join(CONTENT_WORDS[:TOKENS]))
        final = events[-1]
        self.assertEqual(
            final.usage,
            Usage(
                input_tokens=prompt_tokens([{"content": "why is the sky blue"}]), output_tokens=6
            ),
        )
        self.assertIsNone(final.usage and final.usage.reasoning_tokens)
        self.assertIsNone(final.usage and final.usage.cached_input_tokens)
        self.assertEqual(dict(final.metadata), {"finish_reason": "stop"})

    def test_a_collected_run_asks_for_one_answer(self) -> None:
        streamed = self.complete(spec())
        collected = self.complete(spec(collect=True))
        self.assertIs(self.last_body()["stream"], False)
        # One JSON answer, the same text, usage and ending as the stream's.
        self.assertEqual(types(collected), [EventType.START, EventType.DELTA, EventType.COMPLETE])
        self.assertEqual(text(collected), text(streamed))
        self.assertEqual(collected[-1].usage, streamed[-1].usage)
        self.assertEqual(dict(collected[-1].metadata), dict(streamed[-1].metadata))
        self.assertClean()

    def test_a_streamed_run_asks_for_a_stream(self) -> None:
        self.complete(spec())
        self.assertIs(self.last_body()["stream"], True)

    def test_thinkingBecomesReasoningDeltas(self) -> None:
        events = self.complete(spec(target="qwen3-think"))
        n = self.fake.thinking_tokens
        self.assertEqual(
            types(events),
            [EventType.START]
            + [EventType.REASONING_DELTA] * n
            + [EventType.DELTA] * TOKENS
            + [EventType.COMPLETE],
        )
        self.assertEqual(text(events, EventType.REASONING_DELTA), " ".join(THINKING_WORDS[:n]))
        self.assertEqual(events[-1].usage, Usage(input_tokens=6, output_tokens=n + TOKENS))

    def test_requestBody(self) -> None:
        self.complete(spec())
        self.assertEqual(
            self.last_body(),
            {
                "model": "llama3.2",
                "messages": [{"role": "user", "content": "why is the sky blue"}],
                "stream": True,
            },
        )

    def test_headersSentButNeverShown(self) -> None:
        self.complete(spec())
        self.assertEqual(self.fake.received[-1].headers["authorization"], SECRET)
        self.assertEqual(self.fake.received[-1].headers["content-type"], "application/json")
        self.assertNotIn(SECRET, repr(self.provider))
        self.assertNotIn("s3cr3t", repr(self.provider))

    def test_maxTokensIsNumPredict(self) -> None:
        events = self.complete(spec(max_tokens=3))
        self.assertEqual(self.last_body()["options"], {"num_predict": 3})
        self.assertEqual(text(events), " ".join(CONTENT_WORDS[:3]))
        self.assertEqual(events[-1].metadata["finish_reason"], "length")

    def test_thinkingBudgetTurnsThinkOn(self) -> None:
        events = self.complete(spec(thinking_token_budget=1024))
        self.assertIs(self.last_body()["think"], True)
        self.assertIn(EventType.REASONING_DELTA, types(events))

    def test_thinkMetadata(self) -> None:
        for value, expected in [("true", True), ("High", "high"), ("false", False)]:
            self.complete(spec(metadata={"think": value}))
            self.assertEqual(self.last_body()["think"], expected)
        self.complete(spec(metadata={"think": "whatever"}))
        self.assertNotIn("think", self.last_body())

    def test_generationOptions(self) -> None:
        chat = {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 7,
            "stop": "END",
            "response_format": {"type": "json_object"},
        }
        self.complete(spec(input=json.dumps(chat), max_tokens=50))
        body = self.last_body()
        self.assertEqual(
            body["options"],
            {"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["END"], "num_predict": 50},
        )
        self.assertEqual(body["format"], "json")

    def test_capabilities(self) -> None:
        self.assertEqual(
            self.provider.capabilities(),
            Capabilities(max_concurrency=1, streaming=True, tools=True, reasoning=True),
        )
        self.assertEqual(self.build(max_concurrency=4).capabilities().max_concurrency, 4)

    def test_interfaces(self) -> None:
        self.assertTrue(verifyObject(IProvider, self.provider))
        self.assertTrue(verifyObject(IOllamaAPI, self.provider))
        self.assertEqual((self.provider.name, self.provider.type), ("local-ollama", "ollama"))
        self.assertEqual(self.build(name="").name, "ollama")

    def test_baseURLWithV1OrSlash(self) -> None:
        for url in (BASE_URL + "/", BASE_URL + "/v1", BASE_URL + "/v1/"):
            provider = self.build(base_url=url)
            events, d = self.execute(spec(), provider)
            self.http.flush()
            self.successResultOf(d)
            self.assertEqual(events[-1].type, EventType.COMPLETE)
            self.assertEqual(self.fake.received[-1].path, "/api/chat")


class ToolTests(AdapterTestCase):
    def test_nativeToolCallsInOpenAIShape(self) -> None:
        chat = {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER]}
        events = self.complete(spec(input=json.dumps(chat)))
        self.assertEqual(self.last_body()["tools"], [WEATHER])
        calls = json.loads(events[-1].metadata["openai_tool_calls"])
        self.assertEqual(
            calls,
            [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "fake"}'},
                }
            ],
        )
        self.assertEqual(json.loads(calls[0]["function"]["arguments"]), {"city": "fake"})

    def test_toolChoiceNoneDropsTools(self) -> None:
        chat = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                "tool_choice": "none"}  # fmt: skip
        events = self.complete(spec(input=json.dumps(chat)))
        self.assertNotIn("tools", self.last_body())
        self.assertNotIn("openai_tool_calls", events[-1].metadata)

    def test_conversationWithToolResults(self) -> None:
        """OpenAI tool-call history becomes Ollama's: argument objects and ``tool_name``."""
        messages: list[dict[str, Any]] = [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "weather in "},
                                         {"type": "text", "text": "Paris?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "call_b", "type": "function",
                     "function": {"name": "get_time", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "noon"},
        ]  # fmt: skip
        self.assertEqual(
            ollama_messages(messages),
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"function": {"name": "get_time", "arguments": {}}},
                    ],
                },
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
                {"role": "tool", "content": "noon", "tool_name": "get_time"},
            ],
        )

    def test_imagesAsDataURLs(self) -> None:
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ]
        self.assertEqual(
            ollama_messages(messages),
            [{"role": "user", "content": "what is this", "images": ["AAAA"]}],
        )
        remote = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]  # fmt: skip
        self.assertRaises(InputError, ollama_messages, remote)

    def test_badToolArguments(self) -> None:
        messages = [{"role": "assistant", "tool_calls": [
            {"id": "x", "function": {"name": "f", "arguments": "[1, 2]"}}]}]  # fmt: skip
        e = self.assertRaises(InputError, ollama_messages, messages)
        self.assertIn("messages[0].tool_calls[0]", str(e))

    def test_invalidInputIsAnErrorEvent(self) -> None:
        events, d = self.execute(spec(input='{"messages": "nope"}'))
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(types(events), [EventType.ERROR])
        self.assertIn("invalid input", events[0].error)
        self.assertEqual(self.fake.stats().total_requests, 0)

    def test_chatBodyOfAPlainPrompt(self) -> None:
        body = chat_body(spec(input="hello"), parse_chat_input("hello"))
        self.assertEqual(body["messages"], [{"role": "user", "content": "hello"}])


class ErrorTests(AdapterTestCase):
    def test_unknownModel(self) -> None:
        events = self.complete(spec(target="mistral"))
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertEqual(events[1].error, "ollama HTTP 404: model 'mistral' not found")
        self.assertEqual(dict(events[1].metadata), {"http_status": "404"})

    def test_serverError(self) -> None:
        events = self.complete(spec(target="fail-500"))
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertEqual(events[1].error, "ollama HTTP 500: fake internal server error")
        self.assertNotIn(SECRET, events[1].error)

    def test_midstreamDrop(self) -> None:
        events = self.complete(spec(target="fail-midstream"))
        self.assertEqual(
            types(events), [EventType.START] + [EventType.DELTA] * 3 + [EventType.ERROR]
        )
        self.assertIn("ollama response broke off", events[-1].error)
        self.assertEqual(self.fake.stats().dropped, 1)

    def test_connectionRefused(self) -> None:
        class Refusing:
            def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
                from twisted.internet.error import ConnectionRefusedError

                d: Deferred[Any] = Deferred()
                d.errback(ConnectionRefusedError("connection refused"))
                return d

        provider = build(config(), AdapterContext(reactor=self.clock, http=Refusing()))
        events: list[RuntimeEvent] = []
        self.successResultOf(provider.execute(spec(), events.append))
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertIn("ConnectionRefusedError", events[1].error)


class Scripted(Resource):
    """An upstream the test writes by hand: each request is kept for the test to answer."""

    isLeaf = True

    def __init__(self, code: int = 200, headers_now: bool = True) -> None:
        super().__init__()
        self.code = code
        self.headers_now = headers_now
        self.requests: list[Request] = []
        self.lost: list[Request] = []

    def render(self, request: Request) -> int:
        self.requests.append(request)
        request.notifyFinish().addErrback(lambda _: self.lost.append(request))
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", b"application/x-ndjson")
        if self.headers_now:
            request.write(b"")
        return NOT_DONE_YET


class ScriptedTests(AdapterTestCase):
    def scripted(self, **fields: Any) -> tuple[Scripted, StubTreq, OllamaProvider]:
        resource = Scripted(**fields)
        http = StubTreq(resource)
        provider = build(config(), AdapterContext(reactor=self.clock, http=cast(TreqClient, http)))
        assert isinstance(provider, OllamaProvider)
        return resource, http, provider

    def test_byteByByte(self) -> None:
        """Each byte its own chunk: lines are framed across any split, deltas come as they end."""
        resource, http, provider = self.scripted()
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        (request,) = resource.requests
        stream = (
            b'{"message":{"role":"assistant","content":"caf\xc3\xa9"},"done":false}\n'
            b'{"message":{"role":"assistant","content":" \xe2\x98\x95"},"done":false}\n'
            b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
            b'"prompt_eval_count":4,"eval_count":2}\n'
        )
        first_end = stream.index(b"\n")
        for i in range(len(stream)):
            request.write(stream[i : i + 1])
            http.flush()
            if i == first_end - 1:
                self.assertEqual(types(events), [EventType.START])
            if i == first_end:
                self.assertEqual(types(events), [EventType.START, EventType.DELTA])
        self.assertNoResult(d)
        request.finish()
        http.flush()
        self.successResultOf(d)
        self.assertEqual(text(events), "café ☕")
        self.assertEqual(events[-1].usage, Usage(input_tokens=4, output_tokens=2))

    def test_errorLine(self) -> None:
        resource, http, provider = self.scripted()
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        request = resource.requests[0]
        request.write(b'{"message":{"content":"Hi"},"done":false}\n{"error":"out of memory"}\n')
        http.flush()
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.DELTA, EventType.ERROR])
        self.assertEqual(events[-1].error, "ollama error: out of memory")
        # The adapter hung up rather than wait for more.
        self.assertEqual(resource.lost, [request])

    def test_endWithoutDone(self) -> None:
        resource, http, provider = self.scripted()
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        resource.requests[0].write(b'{"message":{"content":"Hi"},"done":false}\n')
        resource.requests[0].finish()
        http.flush()
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.DELTA, EventType.ERROR])
        self.assertIn("ended before the final (done) message", events[-1].error)

    def test_garbageLine(self) -> None:
        resource, http, provider = self.scripted()
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        resource.requests[0].write(b"<html>oops</html>\n")
        http.flush()
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertIn("NDJSON line 1 is not JSON", events[-1].error)

    def test_httpErrorWithPlainBody(self) -> None:
        resource, http, provider = self.scripted(code=502)
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        resource.requests[0].write(b"Bad Gateway from proxy")
        resource.requests[0].finish()
        http.flush()
        self.successResultOf(d)
        self.assertEqual(events[-1].error, "ollama HTTP 502: Bad Gateway from proxy")

    def test_completeThenBrokenTailIsStillComplete(self) -> None:
        resource, http, provider = self.scripted()
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        request = resource.requests[0]
        request.write(b'{"message":{"content":"Hi"},"done":true,"eval_count":1}\n')
        http.flush()
        self.assertEqual(events[-1].type, EventType.COMPLETE)
        request.loseConnection()
        http.flush()
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.DELTA, EventType.COMPLETE])

    def test_idleTimeoutWaitingForHeaders(self) -> None:
        resource, http, provider = self.scripted(headers_now=False)
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        self.clock.advance(DEFAULT_IDLE_TIMEOUT - 1)
        self.assertNoResult(d)
        self.clock.advance(1)
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertEqual(events[-1].error, "no data from ollama for 120s")
        http.flush()
        self.assertEqual(resource.lost, resource.requests)

    def test_cancelWaitingForHeaders(self) -> None:
        resource, http, provider = self.scripted(headers_now=False)
        events: list[RuntimeEvent] = []
        d = provider.execute(spec(), events.append)
        http.flush()
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(types(events), [EventType.START])
        http.flush()
        self.assertEqual(resource.lost, resource.requests)

    def test_queryAnswerNotJSON(self) -> None:
        resource, http, provider = self.scripted()
        d = provider.tags()
        http.flush()
        resource.requests[0].write(b"<html>")
        resource.requests[0].finish()
        http.flush()
        failure = self.failureResultOf(d, OllamaAPIError)
        self.assertEqual(str(failure.value), "ollama /api/tags: answer is not JSON")

    def test_queryTimeout(self) -> None:
        resource, http, provider = self.scripted(headers_now=False)
        d = provider.ps()
        http.flush()
        self.clock.advance(30)
        failure = self.failureResultOf(d, OllamaAPIError)
        self.assertEqual(str(failure.value), "ollama /api/ps: timed out after 30s")
        http.flush()
        self.assertEqual(resource.lost, resource.requests)


class SlowUpstreamTests(AdapterTestCase):
    """Tokens every 500 ms on the shared clock."""

    delay_ms = 500

    def advance(self, seconds: float, step: float = 0.5) -> None:
        for _ in range(round(seconds / step)):
            self.clock.advance(step)
            self.http.flush()

    def test_deltasArriveAsTheyAreProduced(self) -> None:
        events, d = self.execute(spec())
        self.http.flush()
        self.assertEqual(types(events), [EventType.START])
        self.advance(1.0)
        self.assertEqual(types(events), [EventType.START, EventType.DELTA, EventType.DELTA])
        self.assertNoResult(d)
        self.advance(0.5 * (TOKENS - 1))
        self.successResultOf(d)
        self.assertEqual(events[-1].type, EventType.COMPLETE)

    def test_idleTimerIsResetByEveryChunk(self) -> None:
        """Each token comes within the idle bound though the whole run takes longer."""
        provider = self.build(idle_timeout_ms=800)
        events, d = self.execute(spec(), provider)
        self.http.flush()
        self.advance(0.5 * (TOKENS + 1))
        self.successResultOf(d)
        self.assertEqual(events[-1].type, EventType.COMPLETE)

    def test_idleTimeout(self) -> None:
        provider = self.build(idle_timeout_ms=400)
        events, d = self.execute(spec(), provider)
        self.http.flush()
        self.clock.advance(0.4)
        self.successResultOf(d)
        self.assertEqual(types(events), [EventType.START, EventType.ERROR])
        self.assertEqual(events[-1].error, "no data from ollama for 0.4s")
        self.http.flush()
        stats = self.fake.stats()
        self.assertEqual((stats.client_disconnects, stats.active_streams), (1, 0))

    def test_requestTimeoutFromSpec(self) -> None:
        events, d = self.execute(spec(timeout_sec=1.5))
        self.http.flush()
        self.advance(1.5)
        self.successResultOf(d)
        self.assertEqual(
            types(events), [EventType.START, EventType.DELTA, EventType.DELTA, EventType.ERROR]
        )
        self.assertEqual(events[-1].error, "ollama request timed out after 1.5s")
        self.http.flush()
        self.assertEqual(self.fake.stats().client_disconnects, 1)

    def test_requestTimeoutFromConfig(self) -> None:
        provider = self.build(request_timeout_ms=1000)
        events, d = self.execute(spec(), provider)
        self.http.flush()
        self.advance(1.0)
        self.successResultOf(d)
        self.assertEqual(events[-1].error, "ollama request timed out after 1s")
        # The spec's own bound wins over the config's.
        events, d = self.execute(spec(timeout_sec=60), provider)
        self.advance(0.5 * (TOKENS + 1))
        self.successResultOf(d)
        self.assertEqual(events[-1].type, EventType.COMPLETE)

    def test_cancelMidStream(self) -> None:
        events, d = self.execute(spec())
        self.http.flush()
        self.advance(1.0)
        self.assertEqual(text(events), "Hello from")
        d.cancel()
        self.failureResultOf(d, CancelledError)
        seen = list(events)
        # The abort reaches the upstream: the fake sees its client go away and stops.
        self.http.flush()
        stats = self.fake.stats()
        self.assertEqual(
            (stats.client_disconnects, stats.active_streams, stats.completed), (1, 0, 0)
        )
        self.advance(10)
        self.assertEqual(events, seen)
        self.assertEqual(types(events)[-1], EventType.DELTA)


class OllamaAPITests(AdapterTestCase):
    def test_tags(self) -> None:
        d = self.provider.tags()
        self.http.flush()
        names = [m["name"] for m in self.successResultOf(d)["models"]]
        self.assertEqual(names, ["llama3.2:latest", "qwen3-think:latest"])
        self.assertEqual(self.fake.received[-1].headers["authorization"], SECRET)

    def test_ps(self) -> None:
        self.assertEqual(self.successResultOf(self.provider.ps()), {"models": []})
        self.complete(spec(target="qwen3-think"))
        loaded = self.successResultOf(self.provider.ps())["models"]
        self.assertEqual([m["name"] for m in loaded], ["qwen3-think:latest"])

    def test_show(self) -> None:
        shown = self.successResultOf(self.provider.show("llama3.2"))
        self.assertEqual(shown["details"]["family"], "llama")
        self.assertEqual(self.fake.received[-1].body, {"model": "llama3.2"})

    def test_showUnknown(self) -> None:
        failure = self.failureResultOf(self.provider.show("mistral"), OllamaAPIError)
        self.assertEqual(failure.value.status, 404)
        self.assertEqual(
            str(failure.value), "ollama /api/show: HTTP 404: model 'mistral' not found"
        )
        self.assertNotIn(SECRET, str(failure.value))
