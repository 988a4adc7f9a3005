"""
The fake Ollama server, driven through ``StubTreq`` and a ``task.Clock``: the streamed and
whole chat answers, thinking, tools, token limits, injected failures, a client that goes away,
the model endpoints, the stats and the command line.
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone

from iop.testing.fake_ollama import (
    CONTENT_WORDS,
    FAKE_VERSION,
    THINKING_WORDS,
    FakeOllama,
    canonical_name,
    parse_args,
    parse_keep_alive,
    prompt_tokens,
)

URL = "http://ollama.test:11434"
USER = [{"role": "user", "content": "why is the sky blue"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "note": {"type": "string"},
            },
            "required": ["city", "days", "metric"],
        },
    },
}


class Body(Protocol):
    """Collects a response body as it arrives; ``abort()`` hangs up like a client going away."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.reason: Failure | None = None
        self.finished: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.reason = reason
        self.finished.callback(None)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in b"".join(self.chunks).splitlines() if line.strip()]

    def abort(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()


class FakeTestCase(SynchronousTestCase):
    tokens = 5
    delay_ms: float = 0
    models: tuple[str, ...] = ("llama3.2", "qwen3-think")

    def setUp(self) -> None:
        self.clock = Clock()
        self.fake = FakeOllama(
            self.clock, tokens=self.tokens, delay_ms=self.delay_ms, models=self.models
        )
        # StubTreq grows its treq functions at run time; mypy cannot see them.
        self.http: Any = StubTreq(self.fake.resource)
        self.addCleanup(self.assertNoDelayedCalls)

    def assertNoDelayedCalls(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def post(self, path: str, body: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.successResultOf(self.http.post(URL + path, data=data, unbuffered=True))

    def get(self, path: str) -> Any:
        return self.successResultOf(self.http.get(URL + path, unbuffered=True))

    def body(self, response: Any) -> Body:
        body = Body()
        response.deliverBody(body)
        return body

    def json(self, response: Any) -> Any:
        body = self.body(response)
        self.http.flush()
        return json.loads(b"".join(body.chunks))

    def chat(self, **fields: Any) -> tuple[Any, Body]:
        request = {"model": "llama3.2", "messages": USER, **fields}
        response = self.post("/api/chat", request)
        return response, self.body(response)


class StreamTests(FakeTestCase):
    def test_streamsNDJSONByDefault(self) -> None:
        response, body = self.chat()
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/x-ndjson"])
        self.http.flush()
        self.assertTrue(body.reason is not None and body.reason.check(ResponseDone))
        lines = body.lines()
        self.assertEqual(len(lines), self.tokens + 1)
        for line in lines[:-1]:
            self.assertEqual(line["model"], "llama3.2")
            self.assertIs(line["done"], False)
            self.assertEqual(line["message"]["role"], "assistant")
            self.assertNotIn("thinking", line["message"])
        text = "".join(line["message"]["content"] for line in lines)
        self.assertEqual(text, " ".join(CONTENT_WORDS[: self.tokens]))
        final = lines[-1]
        self.assertIs(final["done"], True)
        self.assertEqual(final["done_reason"], "stop")
        self.assertEqual(final["message"], {"role": "assistant", "content": ""})
        self.assertEqual(final["prompt_eval_count"], prompt_tokens(USER))
        self.assertEqual(final["eval_count"], self.tokens)
        for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
            self.assertIsInstance(final[key], int)
        self.assertEqual(final["created_at"], "1970-01-01T00:00:00Z")
        stats = self.fake.stats()
        self.assertEqual((stats.chat_requests, stats.completed, stats.active_streams), (1, 1, 0))

    def test_streamFalseAnswersOneObject(self) -> None:
        response = self.post("/api/chat", {"model": "llama3.2", "messages": USER, "stream": False})
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["application/json; charset=utf-8"]
        )
        answer = self.json(response)
        self.assertIs(answer["done"], True)
        self.assertEqual(answer["message"]["content"], " ".join(CONTENT_WORDS[: self.tokens]))
        self.assertEqual(answer["eval_count"], self.tokens)

    def test_thinkRequested(self) -> None:
        _, body = self.chat(think=True)
        self.http.flush()
        lines = body.lines()
        thinking = [line["message"].get("thinking", "") for line in lines]
        n = self.fake.thinking_tokens
        self.assertEqual("".join(thinking), " ".join(THINKING_WORDS[:n]))
        # Thinking comes first, then the content.
        self.assertTrue(all(line["message"]["content"] == "" for line in lines[:n]))
        self.assertTrue(all("thinking" not in line["message"] for line in lines[n:]))
        self.assertEqual(lines[-1]["eval_count"], n + self.tokens)

    def test_thinkingModelThinksUnlessTold(self) -> None:
        _, body = self.chat(model="qwen3-think")
        self.http.flush()
        self.assertIn("thinking", body.lines()[0]["message"])
        _, body = self.chat(model="qwen3-think", think=False)
        self.http.flush()
        self.assertNotIn("thinking", body.lines()[0]["message"])

    def test_toolsGiveToolCallsOnTheFinalMessage(self) -> None:
        _, body = self.chat(tools=[WEATHER])
        self.http.flush()
        lines = body.lines()
        self.assertTrue(all("tool_calls" not in line["message"] for line in lines[:-1]))
        self.assertEqual(
            lines[-1]["message"]["tool_calls"],
            [{"function": {"name": "get_weather", "arguments": {
                "city": "fake", "days": 1, "metric": True}}}],
        )  # fmt: skip

    def test_aToolResultEndsTheToolRound(self) -> None:
        messages = [
            *USER,
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {}}}]},
            {"role": "tool", "content": "sunny"},
        ]  # fmt: skip
        _, body = self.chat(tools=[WEATHER], messages=messages)
        self.http.flush()
        self.assertNotIn("tool_calls", body.lines()[-1]["message"])

    def test_numPredictCapsTheAnswer(self) -> None:
        _, body = self.chat(options={"num_predict": 2})
        self.http.flush()
        lines = body.lines()
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[-1]["done_reason"], "length")
        self.assertEqual(lines[-1]["eval_count"], 2)

    def test_emptyMessagesLoadsTheModel(self) -> None:
        _, body = self.chat(messages=[])
        self.http.flush()
        (line,) = body.lines()
        self.assertEqual(line["done_reason"], "load")

    def test_recordsWhatItReceived(self) -> None:
        self.successResultOf(
            self.http.post(
                URL + "/api/chat",
                data=json.dumps({"model": "llama3.2", "messages": USER}).encode(),
                headers={"Authorization": "Bearer t0ken"},
            )
        )
        self.assertEqual(self.fake.chat_bodies(), [{"model": "llama3.2", "messages": USER}])
        self.assertEqual(self.fake.received[-1].headers["authorization"], "Bearer t0ken")
        self.assertEqual(self.fake.received[-1].method, "POST")

    def test_keepsOnlyTheLatestRequests(self) -> None:
        fake = FakeOllama(self.clock, keep_received=2)
        http: Any = StubTreq(fake.resource)
        for path in ("/api/tags", "/api/ps", "/api/version"):
            self.successResultOf(http.get(URL + path))
        self.assertEqual([r.path for r in fake.received], ["/api/ps", "/api/version"])


class DelayedStreamTests(FakeTestCase):
    delay_ms = 250
    step = 0.25

    def test_oneLinePerDelay(self) -> None:
        _, body = self.chat()
        self.http.flush()
        self.assertEqual(body.lines(), [])
        self.assertEqual(self.fake.stats().active_streams, 1)
        for n in range(1, self.tokens + 1):
            self.clock.advance(self.step)
            self.http.flush()
            self.assertEqual(len(body.lines()), n)
            self.assertIsNone(body.reason)
        self.clock.advance(self.step)
        self.http.flush()
        self.assertIs(body.lines()[-1]["done"], True)
        self.assertIsNotNone(body.reason)
        self.assertEqual(
            body.lines()[-1]["eval_duration"], int(self.step * (self.tokens + 1) * 1e9)
        )
        stats = self.fake.stats()
        self.assertEqual((stats.active_streams, stats.completed), (0, 1))

    def test_clientGoingAwayStopsTheGeneration(self) -> None:
        _, body = self.chat()
        for _ in range(2):
            self.clock.advance(self.step)
            self.http.flush()
        self.assertEqual(len(body.lines()), 2)
        body.abort()
        self.http.flush()
        stats = self.fake.stats()
        self.assertEqual(stats.client_disconnects, 1)
        self.assertEqual(stats.active_streams, 0)
        self.assertEqual(stats.completed, 0)
        # Nothing is left scheduled: the generation stopped (assertNoDelayedCalls).

    def test_streamFalseWaitsForTheWholeAnswer(self) -> None:
        """The one object comes after as long as the streamed lines would have taken."""
        request = {"model": "llama3.2", "messages": USER, "stream": False}
        d = self.http.post(URL + "/api/chat", data=json.dumps(request).encode())
        self.clock.advance(self.step * self.tokens)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(self.step)
        self.http.flush()
        response = self.successResultOf(d)
        self.assertEqual(self.json(response)["done"], True)

    def test_midstreamDropAfterAFewLines(self) -> None:
        _, body = self.chat(model="fail-midstream")
        for _ in range(10):
            self.clock.advance(self.step)
            self.http.flush()
        self.assertEqual(len(body.lines()), 3)
        self.assertTrue(all(line["done"] is False for line in body.lines()))
        self.assertIsNotNone(body.reason)
        self.assertFalse(body.reason is not None and body.reason.check(ResponseDone))
        stats = self.fake.stats()
        self.assertEqual((stats.dropped, stats.client_disconnects, stats.completed), (1, 0, 0))


class ErrorTests(FakeTestCase):
    def assertError(self, response: Any, code: int, message: str) -> None:
        self.assertEqual(response.code, code)
        self.assertEqual(self.json(response), {"error": message})

    def test_unknownModel(self) -> None:
        response = self.post("/api/chat", {"model": "nope", "messages": USER})
        self.assertError(response, 404, "model 'nope' not found")

    def test_badJSON(self) -> None:
        response = self.post("/api/chat", b"{not json")
        self.assertEqual(response.code, 400)
        self.assertIn("invalid JSON body", self.json(response)["error"])

    def test_notAnObject(self) -> None:
        self.assertError(self.post("/api/chat", [1]), 400, "request body must be a JSON object")

    def test_missingModel(self) -> None:
        self.assertError(self.post("/api/chat", {"messages": USER}), 400, "model is required")

    def test_fail500(self) -> None:
        response = self.post("/api/chat", {"model": "fail-500", "messages": USER})
        self.assertError(response, 500, "fake internal server error")
        self.assertEqual(self.fake.stats().errors, 1)

    def test_midstreamDropWithoutDelay(self) -> None:
        _, body = self.chat(model="fail-midstream")
        self.http.flush()
        self.assertEqual(len(body.lines()), 3)
        self.assertFalse(body.reason is not None and body.reason.check(ResponseDone))
        self.assertEqual(self.fake.stats().dropped, 1)

    def test_wrongMethod(self) -> None:
        self.assertEqual(self.get("/api/chat").code, 405)


class ModelEndpointTests(FakeTestCase):
    def test_tags(self) -> None:
        models = self.json(self.get("/api/tags"))["models"]
        self.assertEqual([m["name"] for m in models], ["llama3.2:latest", "qwen3-think:latest"])
        for m in models:
            self.assertEqual(m["model"], m["name"])
            self.assertEqual(len(m["digest"]), 64)
            self.assertIsInstance(m["size"], int)
            self.assertIn("modified_at", m)
            self.assertEqual(m["details"]["format"], "gguf")
        self.assertEqual(models[1]["details"]["family"], "qwen")

    def test_psListsRecentlyUsedModels(self) -> None:
        self.assertEqual(self.json(self.get("/api/ps")), {"models": []})
        self.chat(model="llama3.2:latest")
        self.http.flush()
        (loaded,) = self.json(self.get("/api/ps"))["models"]
        self.assertEqual(loaded["name"], "llama3.2:latest")
        self.assertEqual(loaded["expires_at"], "1970-01-01T00:05:00Z")
        self.assertEqual(loaded["size_vram"], loaded["size"])
        self.clock.advance(301)
        self.assertEqual(self.json(self.get("/api/ps")), {"models": []})

    def test_psKeepAlive(self) -> None:
        self.chat(keep_alive=0)
        self.http.flush()
        self.assertEqual(self.json(self.get("/api/ps")), {"models": []})
        self.chat(keep_alive="1h")
        self.http.flush()
        self.clock.advance(3599)
        self.assertEqual(len(self.json(self.get("/api/ps"))["models"]), 1)
        self.chat(keep_alive=-1)
        self.http.flush()
        self.clock.advance(10**6)
        self.assertEqual(len(self.json(self.get("/api/ps"))["models"]), 1)

    def test_show(self) -> None:
        response = self.post("/api/show", {"model": "qwen3-think"})
        self.assertEqual(response.code, 200)
        shown = self.json(response)
        self.assertEqual(shown["details"]["family"], "qwen")
        self.assertIn("thinking", shown["capabilities"])
        self.assertIn("modelfile", shown)
        self.assertIn("model_info", shown)
        # The legacy "name" field works too.
        legacy = self.post("/api/show", {"name": "llama3.2:latest"})
        self.assertEqual(legacy.code, 200)
        self.assertNotIn("thinking", self.json(legacy)["capabilities"])

    def test_showUnknown(self) -> None:
        response = self.post("/api/show", {"model": "mistral"})
        self.assertEqual(response.code, 404)
        self.assertEqual(self.json(response), {"error": "model 'mistral' not found"})

    def test_version(self) -> None:
        self.assertEqual(self.json(self.get("/api/version")), {"version": FAKE_VERSION})

    def test_root(self) -> None:
        response = self.get("/")
        body = self.body(response)
        self.http.flush()
        self.assertEqual(b"".join(body.chunks), b"Ollama is running")


class StatsTests(FakeTestCase):
    def test_statsEndpointAndAccessor(self) -> None:
        self.chat()
        self.http.flush()
        self.post("/api/chat", {"model": "nope", "messages": USER})
        self.get("/api/tags")
        stats = self.json(self.get("/_fake/stats"))
        self.assertEqual(stats, self.fake.stats().as_dict())
        self.assertEqual(
            stats,
            {
                "total_requests": 4,
                "chat_requests": 2,
                "active_streams": 0,
                "completed": 1,
                "client_disconnects": 0,
                "dropped": 0,
                "errors": 1,
            },
        )


class HelperTests(SynchronousTestCase):
    def test_canonicalName(self) -> None:
        self.assertEqual(canonical_name("llama3.2"), "llama3.2:latest")
        self.assertEqual(canonical_name("llama3.2:1b"), "llama3.2:1b")
        self.assertEqual(canonical_name("host:5000/ns/model"), "host:5000/ns/model:latest")

    def test_parseKeepAlive(self) -> None:
        self.assertEqual(parse_keep_alive(None), 300.0)
        self.assertEqual(parse_keep_alive(10), 10.0)
        self.assertEqual(parse_keep_alive("30s"), 30.0)
        self.assertEqual(parse_keep_alive("5m"), 300.0)
        self.assertEqual(parse_keep_alive("2h"), 7200.0)
        self.assertEqual(parse_keep_alive("0"), 0.0)
        self.assertIsNone(parse_keep_alive(-1))
        self.assertIsNone(parse_keep_alive("-1m"))
        self.assertEqual(parse_keep_alive("soon"), 300.0)

    def test_negativeSettingsRefused(self) -> None:
        self.assertRaises(ValueError, FakeOllama, Clock(), tokens=-1)
        self.assertRaises(ValueError, FakeOllama, Clock(), delay_ms=-1)


class CommandLineTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        options = parse_args([])
        self.assertEqual(
            (options.host, options.port, options.tokens, options.delay_ms, options.models),
            ("127.0.0.1", 11434, 16, 0, ["llama3.2"]),
        )

    def test_flags(self) -> None:
        options = parse_args(
            ["--port", "0", "--host", "0.0.0.0", "--tokens", "3", "--delay-ms", "25",
             "--models", "a, b:7b,"]
        )  # fmt: skip
        self.assertEqual(
            (options.host, options.port, options.tokens, options.delay_ms, options.models),
            ("0.0.0.0", 0, 3, 25.0, ["a", "b:7b"]),
        )

    def test_badFlags(self) -> None:
        self.patch(__import__("sys"), "stderr", __import__("io").StringIO())
        self.assertRaises(SystemExit, parse_args, ["--tokens", "-1"])
        self.assertRaises(SystemExit, parse_args, ["--models", ","])
        self.assertRaises(SystemExit, parse_args, ["--port", "x"])
