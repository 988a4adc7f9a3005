"""The fake OpenAI-compatible upstream, driven in memory through StubTreq and a task.Clock."""

from __future__ import annotations

import json
from typing import Any

import treq
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.formats.sse import SSEParser
from iop.testing.fake_openai import (
    TOOLS_REJECTED,
    FakeOpenAI,
    FakeStats,
    fake_reasoning,
    fake_text,
    parse_args,
)

URL = "http://fake.test/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}


def chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "demo-model", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return body


class FakeCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()

    def serve(self, **settings: Any) -> tuple[FakeOpenAI, Any]:
        # StubTreq grows its request methods at runtime: typed Any for mypy.
        fake = FakeOpenAI(self.clock, **settings)
        http: Any = StubTreq(fake.resource())
        return fake, http

    def post(self, http: Any, body: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        d = http.post(URL, data=data, headers={"Authorization": "Bearer x"}, unbuffered=True)
        http.flush()
        return self.successResultOf(d)

    def json(self, http: Any, response: Any) -> Any:
        d = treq.json_content(response)
        http.flush()
        return self.successResultOf(d)

    def stream(self, http: Any, response: Any) -> tuple[list[Any], list[bytes]]:
        """Collect an SSE answer: parsed JSON chunks and the raw data lines."""
        raw: list[bytes] = []
        d = treq.collect(response, raw.append)
        http.flush()
        self.successResultOf(d)
        chunks: list[Any] = []
        datas: list[str] = []
        parser = SSEParser()
        for event in parser.feed(b"".join(raw)) + parser.finish():
            datas.append(event.data)
            if not event.is_done:
                chunks.append(json.loads(event.data))
        return chunks, [d.encode() for d in datas]


class ModelsTests(FakeCase):
    def test_defaultModelList(self) -> None:
        _, http = self.serve()
        response = self.successResultOf(http.get("http://fake.test/v1/models"))
        self.assertEqual(response.code, 200)
        body = self.successResultOf(treq.json_content(response))
        self.assertEqual(body["object"], "list")
        self.assertEqual(
            [(m["id"], m["object"], m["owned_by"]) for m in body["data"]],
            [("demo-model", "model", "fake")],
        )

    def test_configuredModels(self) -> None:
        _, http = self.serve(models=["a", "b"])
        response = self.successResultOf(http.get("http://fake.test/v1/models"))
        body = self.successResultOf(treq.json_content(response))
        self.assertEqual([m["id"] for m in body["data"]], ["a", "b"])

    def test_unknownRouteIsOpenAIShaped404(self) -> None:
        _, http = self.serve()
        response = self.successResultOf(http.get("http://fake.test/v1/nope"))
        self.assertEqual(response.code, 404)
        body = self.successResultOf(treq.json_content(response))
        self.assertIn("/v1/nope", body["error"]["message"])


class CompletionTests(FakeCase):
    def test_nonStreaming(self) -> None:
        fake, http = self.serve(tokens=5)
        response = self.post(http, chat(messages=[{"role": "user", "content": "one two three"}]))
        self.assertEqual(response.code, 200)
        body = self.json(http, response)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["model"], "demo-model")
        choice = body["choices"][0]
        self.assertEqual(choice["message"], {"role": "assistant", "content": fake_text(5)})
        self.assertEqual(choice["finish_reason"], "stop")
        self.assertEqual(
            body["usage"], {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        )
        self.assertEqual(fake.stats().completed_responses, 1)

    def test_text(self) -> None:
        self.assertEqual(fake_text(3), "tok0 tok1 tok2")
        self.assertEqual(fake_text(0), "")
        self.assertEqual(fake_reasoning(4), "think0 think1")

    def test_streamingFrames(self) -> None:
        fake, http = self.serve(tokens=4)
        response = self.post(http, chat(stream=True, stream_options={"include_usage": True}))
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"text/event-stream"])
        chunks, datas = self.stream(http, response)
        self.assertEqual(datas[-1], b"[DONE]")
        self.assertEqual({c["object"] for c in chunks}, {"chat.completion.chunk"})
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        self.assertEqual(chunks[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        pieces = [c["choices"][0]["delta"]["content"] for c in chunks[1:5]]
        self.assertEqual(pieces, ["tok0", " tok1", " tok2", " tok3"])
        final = chunks[5]["choices"][0]
        self.assertEqual((final["delta"], final["finish_reason"]), ({}, "stop"))
        self.assertEqual(chunks[6]["choices"], [])
        self.assertEqual(
            chunks[6]["usage"], {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
        )
        self.assertEqual(len(chunks), 7)
        stats = fake.stats()
        self.assertEqual((stats.completed_responses, stats.active_streams), (1, 0))

    def test_chunkTokensAndNoUsageChunk(self) -> None:
        _, http = self.serve(tokens=5, chunk_tokens=2)
        chunks, _ = self.stream(http, self.post(http, chat(stream=True)))
        pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
        self.assertEqual(pieces, ["tok0 tok1", " tok2 tok3", " tok4"])
        self.assertNotIn("usage", chunks[-1])
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "stop")

    def test_maxTokensCapsTheAnswer(self) -> None:
        _, http = self.serve(tokens=8)
        body = self.json(http, self.post(http, chat(max_tokens=3)))
        self.assertEqual(body["choices"][0]["message"]["content"], fake_text(3))
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        body = self.json(http, self.post(http, chat(max_completion_tokens=2)))
        self.assertEqual(body["choices"][0]["message"]["content"], fake_text(2))

    def test_reasoningModelStreamsReasoningFirst(self) -> None:
        _, http = self.serve(tokens=4)
        request = chat(model="demo-reasoner", stream=True, stream_options={"include_usage": True})
        chunks, _ = self.stream(http, self.post(http, request))
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        self.assertEqual([d.get("reasoning_content") for d in deltas[1:3]], ["think0", " think1"])
        self.assertEqual("".join(d.get("content") or "" for d in deltas), fake_text(4))
        usage = chunks[-1]["usage"]
        self.assertEqual(usage["completion_tokens"], 6)
        self.assertEqual(usage["completion_tokens_details"], {"reasoning_tokens": 2})
        self.assertNotIn("prompt_tokens_details", usage)

    def test_leadingSystemMessageIsCached(self) -> None:
        _, http = self.serve(tokens=2)
        messages = [
            {"role": "system", "content": "you are a careful helper"},
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
        ]
        body = self.json(http, self.post(http, chat(messages=messages)))
        self.assertEqual(body["usage"]["prompt_tokens"], 7)
        self.assertEqual(body["usage"]["prompt_tokens_details"], {"cached_tokens": 5})

    def test_requestsAreRecorded(self) -> None:
        fake, http = self.serve()
        self.post(http, chat(temperature=0.5))
        self.assertEqual(len(fake.requests), 1)
        self.assertEqual(fake.requests[0].body["temperature"], 0.5)
        self.assertEqual(fake.requests[0].headers["authorization"], "Bearer x")


class ToolTests(FakeCase):
    def test_streamedToolCall(self) -> None:
        _, http = self.serve()
        request = chat(tools=[WEATHER], stream=True, stream_options={"include_usage": True})
        chunks, _ = self.stream(http, self.post(http, request))
        calls = [
            c["choices"][0]["delta"]["tool_calls"]
            for c in chunks
            if c["choices"][:1] and "tool_calls" in c["choices"][0]["delta"]
        ]
        head = calls[0][0]
        self.assertEqual(
            (head["index"], head["type"], head["function"]["name"]),
            (0, "function", "get_weather"),
        )
        self.assertTrue(head["id"].startswith("call_"))
        pieces = [c[0]["function"]["arguments"] for c in calls[1:]]
        self.assertGreaterEqual(len(pieces), 2)
        self.assertNotIn("id", calls[1][0])
        self.assertEqual(json.loads("".join(pieces)), {"city": "fake", "days": 1})
        finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        self.assertEqual(finals[-1], "tool_calls")
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], len(pieces))

    def test_nonStreamingToolCall(self) -> None:
        _, http = self.serve()
        body = self.json(http, self.post(http, chat(tools=[WEATHER])))
        message = body["choices"][0]["message"]
        self.assertIsNone(message["content"])
        [call] = message["tool_calls"]
        self.assertEqual(call["function"]["name"], "get_weather")
        self.assertEqual(json.loads(call["function"]["arguments"]), {"city": "fake", "days": 1})
        self.assertEqual(body["choices"][0]["finish_reason"], "tool_calls")

    def test_aToolResultEndsTheToolRound(self) -> None:
        _, http = self.serve(tokens=2)
        messages = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]  # fmt: skip
        body = self.json(http, self.post(http, chat(tools=[WEATHER], messages=messages)))
        self.assertEqual(body["choices"][0]["message"]["content"], fake_text(2))
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")

    def test_toolChoiceNoneAnswersText(self) -> None:
        _, http = self.serve(tokens=2)
        body = self.json(http, self.post(http, chat(tools=[WEATHER], tool_choice="none")))
        self.assertEqual(body["choices"][0]["message"]["content"], fake_text(2))

    def test_rejectTools(self) -> None:
        fake, http = self.serve(reject_tools=True)
        response = self.post(http, chat(tools=[WEATHER], stream=True))
        self.assertEqual(response.code, 400)
        error = self.json(http, response)["error"]
        self.assertEqual(error["message"], TOOLS_REJECTED)
        self.assertEqual(error["type"], "invalid_request_error")
        self.assertEqual(fake.stats().rejected_requests, 1)
        # Without tools the same fake answers.
        self.assertEqual(self.post(http, chat()).code, 200)


class ErrorTests(FakeCase):
    def test_badJSON(self) -> None:
        fake, http = self.serve()
        response = self.post(http, b"{not json")
        self.assertEqual(response.code, 400)
        self.assertEqual(
            set(self.json(http, response)["error"]), {"message", "type", "param", "code"}
        )
        self.assertEqual(fake.stats().total_requests, 1)

    def test_missingMessages(self) -> None:
        _, http = self.serve()
        bodies: list[Any] = [
            {"model": "m"},
            {"model": "m", "messages": []},
            [1],
            {"messages": [{}]},
        ]
        for body in bodies:
            response = self.post(http, body)
            self.assertEqual(response.code, 400, body)
            error = self.json(http, response)["error"]
            self.assertEqual(error["type"], "invalid_request_error")
            self.assertIsNone(error["code"])

    def test_fail500(self) -> None:
        _, http = self.serve()
        response = self.post(http, chat(model="fail-500", stream=True))
        self.assertEqual(response.code, 500)
        self.assertEqual(self.json(http, response)["error"]["type"], "server_error")

    def test_failMidstreamDropsTheConnection(self) -> None:
        fake, http = self.serve(tokens=10)
        response = self.post(http, chat(model="fail-midstream", stream=True))
        raw: list[bytes] = []
        d = treq.collect(response, raw.append)
        http.flush()
        self.failureResultOf(d)
        body = b"".join(raw)
        self.assertIn(b"tok2", body)
        self.assertNotIn(b"tok3", body)
        self.assertNotIn(b"[DONE]", body)
        stats = fake.stats()
        self.assertEqual(
            (stats.dropped_streams, stats.client_disconnects, stats.active_streams), (1, 0, 0)
        )


class TimingTests(FakeCase):
    def test_perTokenDelayOnTheClock(self) -> None:
        fake, http = self.serve(tokens=3, delay_ms=100)
        response = self.post(http, chat(stream=True))
        raw: list[bytes] = []
        d = treq.collect(response, raw.append)
        http.flush()
        self.assertEqual(len(raw), 1)  # the role chunk only
        self.assertEqual(fake.stats().active_streams, 1)
        self.clock.advance(0.099)
        http.flush()
        self.assertEqual(len(raw), 1)
        self.clock.advance(0.001)
        http.flush()
        self.assertIn(b'"tok0"', raw[-1])
        self.clock.pump([0.1, 0.1])
        http.flush()
        self.successResultOf(d)
        self.assertIn(b"[DONE]", b"".join(raw))
        self.assertEqual(fake.stats().completed_responses, 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_nonStreamingWaitsForAllTokens(self) -> None:
        _, http = self.serve(tokens=3, delay_ms=100)
        d = http.post(URL, data=json.dumps(chat()).encode(), unbuffered=True)
        http.flush()
        self.assertNoResult(d)  # headers and body come together, once every token is "made"
        self.clock.advance(0.3)
        http.flush()
        body = self.json(http, self.successResultOf(d))
        self.assertEqual(body["choices"][0]["message"]["content"], fake_text(3))

    def test_clientDisconnectStopsGenerating(self) -> None:
        fake, http = self.serve(tokens=5, delay_ms=100)
        response = self.post(http, chat(stream=True))
        raw: list[bytes] = []
        self.assertEqual(fake.stats().active_streams, 1)
        reader = _Recorder(raw)
        response.deliverBody(reader)
        http.flush()
        self.clock.advance(0.1)
        http.flush()
        self.assertEqual(len(raw), 2)
        reader.transport.stopProducing()
        http.flush()
        stats = fake.stats()
        self.assertEqual((stats.client_disconnects, stats.active_streams), (1, 0))
        self.assertEqual(stats.completed_responses, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class _Recorder:
    """A body protocol that records chunks; the test stops its transport."""

    def __init__(self, raw: list[bytes]) -> None:
        self.raw = raw
        self.transport: Any = None

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport

    def dataReceived(self, data: bytes) -> None:
        self.raw.append(data)

    def connectionLost(self, reason: Any) -> None:
        pass


class StatsTests(FakeCase):
    def test_statsEndpointAndAccessor(self) -> None:
        fake, http = self.serve(tokens=1)
        self.post(http, chat())
        self.post(http, chat(model="fail-500"))
        response = self.successResultOf(http.get("http://fake.test/_fake/stats"))
        body = self.successResultOf(treq.json_content(response))
        self.assertEqual(body, fake.stats().as_dict())
        self.assertEqual(
            fake.stats(),
            FakeStats(
                total_requests=2,
                completed_responses=1,
                rejected_requests=1,
                max_active_answers=1,
                reported_input_tokens=1,
                reported_output_tokens=1,
            ),
        )

    def test_max_active_answers_is_the_high_water_mark(self) -> None:
        fake, http = self.serve(tokens=2, delay_ms=10)
        data = json.dumps(chat()).encode()
        pending = [http.post(URL, data=data, unbuffered=True) for _ in "abc"]
        http.flush()
        self.assertEqual(fake.stats().active_answers, 3)
        self.clock.pump([0.01] * 5)
        http.flush()
        for d in pending:
            self.successResultOf(d)
        self.assertEqual((fake.stats().active_answers, fake.stats().max_active_answers), (0, 3))

    def test_reported_usage_adds_up(self) -> None:
        """Every answer written whole adds the usage it reported; a Chat stream that was not
        asked to report usage adds nothing."""
        fake, http = self.serve(tokens=3, responses_api=True, anthropic_api=True)
        self.json(http, self.post(http, chat()))  # 1 in, 3 out
        self.stream(http, self.post(http, chat(stream=True)))  # no usage reported
        options = {"include_usage": True}
        self.stream(http, self.post(http, chat(stream=True, stream_options=options, max_tokens=2)))
        posted = http.post(
            "http://fake.test/v1/responses",
            data=json.dumps({"model": "m", "input": "one two", "stream": True}).encode(),
            unbuffered=True,
        )
        http.flush()
        self.stream(http, self.successResultOf(posted))  # 2 in, 3 out
        posted = http.post(
            "http://fake.test/v1/messages",
            data=json.dumps(
                {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "a b c"}]}
            ).encode(),
            headers={"anthropic-version": "2023-06-01"},
            unbuffered=True,
        )
        http.flush()
        self.json(http, self.successResultOf(posted))  # 3 in, 1 out
        stats = fake.stats()
        self.assertEqual(stats.completed_responses, 5)
        self.assertEqual((stats.reported_input_tokens, stats.reported_output_tokens), (7, 9))

    def test_statsIsASnapshot(self) -> None:
        fake, http = self.serve(tokens=1)
        before = fake.stats()
        self.post(http, chat())
        self.assertEqual(before.total_requests, 0)


class CommandLineTests(SynchronousTestCase):
    def test_flags(self) -> None:
        args = parse_args(
            [
                "--port", "9001", "--host", "0.0.0.0", "--tokens", "4", "--chunk-tokens", "2",
                "--delay-ms", "5", "--reject-tools", "--models", "a,b",
            ]
        )  # fmt: skip
        self.assertEqual(
            (args.port, args.host, args.tokens, args.chunk_tokens, args.delay_ms),
            (9001, "0.0.0.0", 4, 2, 5),
        )
        self.assertTrue(args.reject_tools)
        self.assertEqual(args.models, "a,b")

    def test_defaults(self) -> None:
        args = parse_args(["--port", "0"])
        self.assertEqual(
            (args.host, args.tokens, args.chunk_tokens, args.delay_ms, args.reject_tools),
            ("127.0.0.1", 16, 1, 0, False),
        )

    def test_badSettings(self) -> None:
        self.assertRaises(ValueError, FakeOpenAI, Clock(), chunk_tokens=0)
        self.assertRaises(ValueError, FakeOpenAI, Clock(), delay_ms=-1)


class ExpectedCredentialTests(FakeCase):
    def test_only_the_exact_credential_is_answered(self) -> None:
        fake, http = self.serve(expect_header="Authorization", expect_value="Bearer x")
        self.assertEqual(self.post(http, chat()).code, 200)
        d = http.post(URL, data=json.dumps(chat()).encode(), headers={"Authorization": "Bearer y"})
        http.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 401)
        self.assertEqual(self.json(http, response)["error"]["type"], "authentication_error")
        stats = fake.stats()
        self.assertEqual((stats.authorized_requests, stats.unauthorized_requests), (1, 1))
        self.assertNotIn("Bearer x", repr(fake.settings))


class EchoCredentialTests(FakeCase):
    """The ``echo-auth-*`` models reflect the request's credential (``Bearer x`` here)."""

    def test_401_echoes_in_the_reason_and_the_message(self) -> None:
        _, http = self.serve()
        response = self.post(http, chat(model="echo-auth-401"))
        self.assertEqual(response.code, 401)
        self.assertEqual(response.phrase, b"Unauthorized (Bearer x)")
        self.assertIn("Bearer x", self.json(http, response)["error"]["message"])

    def test_500_dumps_the_request_headers(self) -> None:
        _, http = self.serve()
        response = self.post(http, chat(model="echo-auth-500", stream=True))
        self.assertEqual(response.code, 500)
        debug = self.json(http, response)["error"]["debug"]
        self.assertEqual(debug["request_headers"]["authorization"], "Bearer x")

    def test_the_expected_header_is_the_one_echoed(self) -> None:
        _, http = self.serve(expect_header="Authorization", expect_value="Bearer x")
        response = self.post(http, chat(model="echo-auth-401"))
        self.assertIn("Bearer x", self.json(http, response)["error"]["message"])

    def test_header_echo_on_an_ordinary_answer(self) -> None:
        _, http = self.serve(tokens=2)
        response = self.post(http, chat(model="echo-auth-header"))
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"x-request-id"), [b"req-Bearer x"])
        self.assertEqual(response.headers.getRawHeaders(b"x-echo-authorization"), [b"Bearer x"])
        self.assertEqual(
            self.json(http, response)["choices"][0]["message"]["content"], fake_text(2)
        )

    def test_stream_splits_the_credential_across_writes(self) -> None:
        _, http = self.serve()
        response = self.post(http, chat(model="echo-auth-stream", stream=True))
        raw: list[bytes] = []
        d = treq.collect(response, raw.append)
        http.flush()
        seen: list[bytes] = []
        for _ in range(12):
            self.clock.advance(0.05)
            http.flush()
            seen.append(b"".join(raw))
        # The pieces come ECHO_PAUSE_MS apart: for one pause, the credential was cut.
        self.assertTrue(any(b"Bear" in body and b"Bearer x" not in body for body in seen))
        self.successResultOf(d)
        body = b"".join(raw)
        self.assertIn(b"Bearer x", body)
        self.assertTrue(body.endswith(b"data: [DONE]\n\n"))
        self.assertFalse(any(b"Bearer x" in piece for piece in raw))
        self.assertEqual(self.clock.getDelayedCalls(), [])
