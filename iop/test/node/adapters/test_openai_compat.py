"""
The openai_compat adapter against the fake upstream and small scripted resources, in memory
(StubTreq) on a task.Clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface.verify import verifyObject

from iop.node.adapters import openai_compat
from iop.node.adapters.openai_compat import (
    OpenAICompatProvider,
    text_tool_instruction,
    upstream_error_message,
)
from iop.runtime import (
    AdapterContext,
    AdapterSpec,
    EventType,
    ExecutionSpec,
    IProvider,
    RuntimeEvent,
    RuntimeProfile,
    TreqClient,
    Usage,
)
from iop.testing.fake_openai import TOOLS_REJECTED, FakeOpenAI, fake_reasoning, fake_text

SECRET = "Bearer sk-test-secret-0123456789"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def config(**fields: Any) -> AdapterSpec:
    values: dict[str, Any] = {
        "name": "upstream",
        "type": "openai_compat",
        "enabled": True,
        "base_url": "http://upstream.test/v1/",
        "headers": {"Authorization": SECRET},
    }
    values.update(fields)
    return AdapterSpec(**values)


class Refusing:
    """An HTTP client whose every request is refused."""

    def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
        return fail(ConnectionRefusedError("connection refused"))


def chat_input(messages: list[dict[str, Any]] | None = None, **fields: Any) -> str:
    body: dict[str, Any] = {"messages": messages or [{"role": "user", "content": "hello world"}]}
    body.update(fields)
    return json.dumps(body)


def sse(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return sse({"object": "chat.completion.chunk", "choices": [choice], **extra})


def usage_chunk(usage: dict[str, Any]) -> bytes:
    return sse({"object": "chat.completion.chunk", "choices": [], "usage": usage})


DONE = sse("[DONE]")


@dataclass
class Reply:
    """One scripted answer: status, body frames, and whether the body ends cleanly."""

    code: int = 200
    frames: tuple[bytes, ...] = ()
    finish: bool = True
    content_type: bytes = b"text/event-stream"


class Scripted(Resource):
    """Answers each POST with the next :class:`Reply` (the last one repeats); records bodies."""

    isLeaf = True

    def __init__(self, *replies: Reply) -> None:
        super().__init__()
        self.replies = list(replies)
        self.bodies: list[Any] = []
        self.lost = 0

    def render_POST(self, request: Request) -> int:
        assert request.content is not None
        self.bodies.append(json.loads(request.content.read()))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        request.setResponseCode(reply.code)
        request.setHeader(b"content-type", reply.content_type)
        request.notifyFinish().addErrback(self._lost)
        for frame in reply.frames:
            request.write(frame)
        if reply.finish:
            request.finish()
        return NOT_DONE_YET

    def _lost(self, _: object) -> None:
        self.lost += 1


class Hanging(Resource):
    """Never answers; counts clients that give up."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def render_POST(self, request: Request) -> int:
        request.notifyFinish().addErrback(self._lost)
        return NOT_DONE_YET

    def _lost(self, _: object) -> None:
        self.lost += 1


class Trickle(Resource):
    """Writes a body one byte per clock tick (``tick`` seconds apart)."""

    isLeaf = True

    def __init__(self, clock: Clock, body: bytes, tick: float) -> None:
        super().__init__()
        self.clock = clock
        self.body = body
        self.tick = tick

    def render_POST(self, request: Request) -> int:
        request.setHeader(b"content-type", b"text/event-stream")

        def step(i: int) -> None:
            if i == len(self.body):
                request.finish()
                return
            request.write(self.body[i : i + 1])
            self.clock.callLater(self.tick, step, i + 1)

        step(0)
        return NOT_DONE_YET


class AdapterCase(SynchronousTestCase):
    build: Callable[[AdapterSpec, AdapterContext], IProvider] = staticmethod(openai_compat.build)
    adapter_type = "openai_compat"

    def setUp(self) -> None:
        self.clock = Clock()
        self.events: list[RuntimeEvent] = []
        self.addCleanup(self.assertNoDelayedCalls)

    def assertNoDelayedCalls(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def use_fake(self, config_fields: dict[str, Any] | None = None, **settings: Any) -> FakeOpenAI:
        self.fake = FakeOpenAI(self.clock, **settings)
        self.use_resource(self.fake.resource(), **(config_fields or {}))
        return self.fake

    def use_resource(self, resource: IResource, **config_fields: Any) -> None:
        self.http = StubTreq(resource)
        config_fields.setdefault("type", self.adapter_type)
        self.provider = self.build(
            config(**config_fields), AdapterContext(self.clock, cast(TreqClient, self.http))
        )

    def execute(
        self, input: str = "hello world", target: str = "demo-model", **spec_fields: Any
    ) -> Deferred[None]:
        spec = ExecutionSpec(run_id="run-1", target=target, input=input, **spec_fields)
        d = self.provider.execute(spec, self.events.append)
        self.http.flush()
        return d

    def advance(self, seconds: float, steps: int = 1) -> None:
        for _ in range(steps):
            self.clock.advance(seconds / steps)
            self.http.flush()

    def types(self) -> list[str]:
        return [e.type.value for e in self.events]

    def text(self, kind: EventType = EventType.DELTA) -> str:
        return "".join(e.delta for e in self.events if e.type == kind)

    def terminal(self) -> RuntimeEvent:
        self.assertTrue(self.events[-1].terminal, self.types())
        self.assertEqual([e for e in self.events if e.terminal], [self.events[-1]])
        return self.events[-1]

    def assertFailed(self, d: Deferred[None], *fragments: str) -> RuntimeEvent:
        self.assertIsNone(self.successResultOf(d))
        event = self.terminal()
        self.assertEqual(event.type, EventType.ERROR, event)
        for fragment in fragments:
            self.assertIn(fragment, event.error)
        self.assertNotIn("sk-test-secret", event.error)
        return event


class BuildTests(AdapterCase):
    def test_providesIProvider(self) -> None:
        self.use_fake()
        self.assertTrue(verifyObject(IProvider, self.provider))
        self.assertEqual((self.provider.name, self.provider.type), ("upstream", self.adapter_type))

    def test_capabilities(self) -> None:
        self.use_fake()
        caps = self.provider.capabilities()
        self.assertEqual(
            (caps.max_concurrency, caps.streaming, caps.tools, caps.reasoning),
            (1, True, True, True),
        )
        self.use_fake({"max_concurrency": 3})
        self.assertEqual(self.provider.capabilities().max_concurrency, 3)

    def test_reprHidesHeadersAndEndpoint(self) -> None:
        self.use_fake()
        text = repr(self.provider)
        self.assertIn("upstream", text)
        self.assertNotIn("sk-test-secret", text)
        self.assertNotIn("upstream.test", text)

    def test_legacyNameIsTheType(self) -> None:
        self.use_fake({"name": ""})
        self.assertEqual(self.provider.name, self.adapter_type)


class StreamingTests(AdapterCase):
    def test_deltasInOrderThenCompleteWithUsage(self) -> None:
        fake = self.use_fake(tokens=4)
        d = self.execute()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.types(), ["start", "delta", "delta", "delta", "delta", "complete"])
        self.assertEqual([e.delta for e in self.events[1:5]], ["tok0", " tok1", " tok2", " tok3"])
        complete = self.terminal()
        self.assertEqual(complete.usage, Usage(input_tokens=2, output_tokens=4))
        self.assertEqual(dict(complete.metadata), {"finish_reason": "stop"})
        self.assertEqual(fake.stats().completed_responses, 1)

    def test_requestShape(self) -> None:
        fake = self.use_fake(tokens=2)
        self.successResultOf(
            self.execute(chat_input(temperature=0.2, seed=7), target="served-x", max_tokens=64)
        )
        [request] = fake.requests
        self.assertEqual(request.headers["authorization"], SECRET)
        self.assertEqual(request.headers["content-type"], "application/json")
        self.assertEqual(
            request.body,
            {
                "model": "served-x",
                "messages": [{"role": "user", "content": "hello world"}],
                "temperature": 0.2,
                "seed": 7,
                "max_tokens": 64,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )

    def test_maxTokensOnlyWhenPositive(self) -> None:
        fake = self.use_fake(tokens=2)
        self.successResultOf(self.execute())
        self.assertNotIn("max_tokens", fake.requests[0].body)

    def test_reasoningAndCachedUsage(self) -> None:
        self.use_fake(tokens=4)
        messages = [
            {"role": "system", "content": "be brief please"},
            {"role": "user", "content": "hi"},
        ]
        self.successResultOf(self.execute(chat_input(messages), target="demo-reasoner"))
        self.assertEqual(
            self.types(),
            ["start", "reasoning_delta", "reasoning_delta"] + ["delta"] * 4 + ["complete"],
        )
        self.assertEqual(self.text(EventType.REASONING_DELTA), fake_reasoning(4))
        self.assertEqual(self.text(), fake_text(4))
        self.assertEqual(
            self.terminal().usage,
            Usage(input_tokens=4, output_tokens=6, reasoning_tokens=2, cached_input_tokens=3),
        )

    def test_reasoningFieldName(self) -> None:
        self.use_resource(
            Scripted(
                Reply(
                    frames=(
                        chunk({"role": "assistant"}),
                        chunk({"reasoning": "hmm"}),
                        chunk({"content": "ok"}),
                        chunk(finish="stop"),
                        DONE,
                    )
                )
            )
        )
        self.successResultOf(self.execute())
        self.assertEqual(self.types(), ["start", "reasoning_delta", "delta", "complete"])
        self.assertIsNone(self.terminal().usage)

    def test_chunkedTokens(self) -> None:
        self.use_fake(tokens=5, chunk_tokens=2)
        self.successResultOf(self.execute())
        self.assertEqual([e.delta for e in self.events[1:-1]], ["tok0 tok1", " tok2 tok3", " tok4"])

    def test_eventsArriveAsTheUpstreamStreams(self) -> None:
        fake = self.use_fake(tokens=3, delay_ms=1000)
        d = self.execute()
        self.assertEqual(self.types(), ["start"])
        self.assertEqual(fake.stats().active_streams, 1)
        self.advance(1)
        self.assertEqual(self.types(), ["start", "delta"])
        self.advance(1)
        self.assertEqual(self.types(), ["start", "delta", "delta"])
        self.assertNoResult(d)
        self.advance(1)
        self.successResultOf(d)
        self.assertEqual(self.types()[-1], "complete")

    def test_byteByByteStream(self) -> None:
        body = (
            chunk({"role": "assistant", "content": ""})
            + chunk({"content": "héllo"})
            + chunk({"content": " wörld"}, finish="stop")
            + usage_chunk({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
            + DONE
        ).replace(b"\n\n", b"\r\n\r\n")
        self.use_resource(Trickle(self.clock, body, 0.5), idle_timeout_ms=1000)
        d = self.execute()
        self.advance(0.5 * len(body), steps=len(body))
        self.successResultOf(d)
        self.assertEqual(self.text(), "héllo wörld")
        self.assertEqual(self.terminal().usage, Usage(input_tokens=3, output_tokens=2))

    def test_finishWithoutDoneCompletes(self) -> None:
        self.use_resource(Scripted(Reply(frames=(chunk({"content": "x"}, finish="length"),))))
        self.successResultOf(self.execute())
        self.assertEqual(self.types(), ["start", "delta", "complete"])
        self.assertEqual(self.terminal().metadata["finish_reason"], "length")

    def test_lastUsageWins(self) -> None:
        frames = (
            chunk({"content": "a"}, usage={"prompt_tokens": 3, "completion_tokens": 1}),
            chunk({"content": "b"}, usage={"prompt_tokens": 3, "completion_tokens": 2}),
            chunk(finish="stop", usage={"prompt_tokens": 3, "completion_tokens": 2}),
            usage_chunk({"prompt_tokens": 3, "completion_tokens": 3}),
            DONE,
        )
        self.use_resource(Scripted(Reply(frames=frames)))
        self.successResultOf(self.execute())
        self.assertEqual(self.terminal().usage, Usage(input_tokens=3, output_tokens=3))

    def test_jsonAnswerToAStreamRequest(self) -> None:
        completion = {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "whole", "reasoning_content": "r"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        }
        reply = Reply(frames=(json.dumps(completion).encode(),), content_type=b"application/json")
        self.use_resource(Scripted(reply))
        self.successResultOf(self.execute())
        self.assertEqual(self.types(), ["start", "reasoning_delta", "delta", "complete"])
        self.assertEqual(self.terminal().usage, Usage(input_tokens=2, output_tokens=1))


class ToolCallTests(AdapterCase):
    def test_nativeToolCallFromTheFake(self) -> None:
        fake = self.use_fake()
        self.successResultOf(self.execute(chat_input(tools=[WEATHER], tool_choice="auto")))
        body = fake.requests[0].body
        self.assertEqual((body["tools"], body["tool_choice"]), ([WEATHER], "auto"))
        complete = self.terminal()
        self.assertEqual(complete.type, EventType.COMPLETE)
        self.assertEqual(complete.metadata["finish_reason"], "tool_calls")
        self.assertNotIn("openai_text_tool_fallback", complete.metadata)
        [call] = json.loads(complete.metadata["openai_tool_calls"])
        self.assertTrue(call["id"].startswith("call_fake_"))
        self.assertEqual(call["type"], "function")
        self.assertEqual(call["function"]["name"], "get_weather")
        self.assertEqual(json.loads(call["function"]["arguments"]), {"city": "fake"})
        self.assertEqual(self.types(), ["start", "complete"])

    def test_accumulatedAcrossChunksByIndex(self) -> None:
        frames = (
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "get_time", "arguments": "{}"},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}),
            chunk(finish="tool_calls"),
            DONE,
        )
        self.use_resource(Scripted(Reply(frames=frames)))
        self.successResultOf(self.execute(chat_input(tools=[WEATHER])))
        self.assertEqual(
            json.loads(self.terminal().metadata["openai_tool_calls"]),
            [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        )

    def test_emptyToolsAreNotSent(self) -> None:
        fake = self.use_fake(tokens=1)
        self.successResultOf(self.execute(chat_input(tools=[], tool_choice="auto")))
        self.assertNotIn("tools", fake.requests[0].body)
        self.assertNotIn("tool_choice", fake.requests[0].body)


class TextToolFallbackTests(AdapterCase):
    def test_retryWithoutToolsAndInstructionInSystemMessage(self) -> None:
        fake = self.use_fake(tokens=3, reject_tools=True)
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "weather in Paris?"},
        ]
        self.successResultOf(
            self.execute(chat_input(messages, tools=[WEATHER], tool_choice="auto"))
        )
        self.assertEqual(fake.stats().total_requests, 2)
        first, retry = (r.body for r in fake.requests)
        self.assertIn("tools", first)
        self.assertNotIn("tools", retry)
        self.assertNotIn("tool_choice", retry)
        self.assertEqual(retry["stream"], True)
        self.assertEqual([m["role"] for m in retry["messages"]], ["system", "user"])
        system = retry["messages"][0]["content"]
        self.assertTrue(system.startswith("You are terse.\n\n"))
        self.assertIn(text_tool_instruction([WEATHER], "auto"), system)
        self.assertIn('{"tool_calls":[{"name":', system)
        self.assertIn("get_weather", system)
        self.assertEqual(retry["messages"][1], messages[1])
        complete = self.terminal()
        self.assertEqual(complete.type, EventType.COMPLETE)
        self.assertEqual(complete.metadata["openai_text_tool_fallback"], "true")
        self.assertEqual(self.text(), fake_text(3))
        self.assertEqual(self.types().count("start"), 1)

    def test_systemMessagePrependedWhenMissing(self) -> None:
        fake = self.use_fake(tokens=1, reject_tools=True)
        self.successResultOf(self.execute(chat_input(tools=[WEATHER], tool_choice="required")))
        retry = fake.requests[1].body
        self.assertEqual([m["role"] for m in retry["messages"]], ["system", "user"])
        self.assertEqual(
            retry["messages"][0]["content"], text_tool_instruction([WEATHER], "required")
        )
        self.assertIn("must call at least one tool", retry["messages"][0]["content"])

    def test_systemMessageWithContentParts(self) -> None:
        fake = self.use_fake(tokens=1, reject_tools=True)
        system = {"role": "system", "content": [{"type": "text", "text": "Be kind."}]}
        user = {"role": "user", "content": "hi"}
        self.successResultOf(self.execute(chat_input([system, user], tools=[WEATHER])))
        parts = fake.requests[1].body["messages"][0]["content"]
        self.assertEqual(parts[0], {"type": "text", "text": "Be kind."})
        self.assertEqual(parts[1]["text"], text_tool_instruction([WEATHER], None))

    def test_toolHistoryBecomesText(self) -> None:
        fake = self.use_fake(tokens=1, reject_tools=True)
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        self.successResultOf(self.execute(chat_input(messages, tools=[WEATHER])))
        retry = fake.requests[1].body["messages"]
        self.assertEqual([m["role"] for m in retry], ["system", "user", "assistant", "user"])
        self.assertEqual(
            json.loads(retry[2]["content"]),
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        )
        self.assertIn("call_1", retry[3]["content"])
        self.assertIn("sunny", retry[3]["content"])

    def test_toolChoiceNoneRetriesWithoutInstructionOrFlag(self) -> None:
        fake = self.use_fake(tokens=1, reject_tools=True)
        self.successResultOf(self.execute(chat_input(tools=[WEATHER], tool_choice="none")))
        retry = fake.requests[1].body
        self.assertEqual([m["role"] for m in retry["messages"]], ["user"])
        self.assertNotIn("openai_text_tool_fallback", self.terminal().metadata)

    def test_retriedOnlyOnce(self) -> None:
        rejection = json.dumps({"error": {"message": "tool use is not enabled"}}).encode()
        resource = Scripted(Reply(code=422, frames=(rejection,), content_type=b"application/json"))
        self.use_resource(resource)
        d = self.execute(chat_input(tools=[WEATHER]))
        self.assertFailed(d, "upstream HTTP 422", "tool use is not enabled")
        self.assertEqual(len(resource.bodies), 2)

    def test_noRetryWithoutTools(self) -> None:
        self.use_fake(reject_tools=True)
        rejection = json.dumps({"error": {"message": "tools are weird"}}).encode()
        resource = Scripted(Reply(code=400, frames=(rejection,), content_type=b"application/json"))
        self.use_resource(resource)
        self.assertFailed(self.execute(), "upstream HTTP 400", "tools are weird")
        self.assertEqual(len(resource.bodies), 1)

    def test_noRetryForOtherErrors(self) -> None:
        rejection = json.dumps({"error": {"message": "temperature out of range"}}).encode()
        resource = Scripted(Reply(code=400, frames=(rejection,), content_type=b"application/json"))
        self.use_resource(resource)
        self.assertFailed(self.execute(chat_input(tools=[WEATHER])), "temperature out of range")
        self.assertEqual(len(resource.bodies), 1)

    def test_rejectionMessageFromTheFake(self) -> None:
        self.assertEqual(
            upstream_error_message(json.dumps({"error": {"message": TOOLS_REJECTED}}).encode()),
            TOOLS_REJECTED,
        )


class ErrorTests(AdapterCase):
    def test_upstream500(self) -> None:
        self.use_fake()
        d = self.execute(target="fail-500")
        self.assertFailed(d, "upstream HTTP 500", "injected upstream failure")
        self.assertEqual(self.types(), ["start", "error"])

    def test_errorBodyThatIsNotJSON(self) -> None:
        body = b"<html>" + b"x" * 2000 + b"</html>"
        self.use_resource(Scripted(Reply(code=502, frames=(body,), content_type=b"text/html")))
        event = self.assertFailed(self.execute(), "upstream HTTP 502", "<html>")
        self.assertLess(len(event.error), 400)

    def test_olderVLLMErrorShape(self) -> None:
        body = json.dumps({"object": "error", "message": "model not found", "code": 404}).encode()
        self.use_resource(Scripted(Reply(code=404, frames=(body,))))
        self.assertFailed(self.execute(), "upstream HTTP 404", "model not found")

    def test_echoedCredentialsAreRedacted(self) -> None:
        body = json.dumps({"error": {"message": f"bad key {SECRET}"}}).encode()
        self.use_resource(Scripted(Reply(code=401, frames=(body,))))
        event = self.assertFailed(self.execute(), "upstream HTTP 401", "[redacted]")
        self.assertNotIn(SECRET, event.error)

    def test_badInput(self) -> None:
        fake = self.use_fake()
        d = self.execute('{"messages": "nope"}')
        self.assertFailed(d, "invalid input", "messages")
        self.assertEqual(self.types(), ["start", "error"])
        self.assertEqual(fake.stats().total_requests, 0)

    def test_streamDroppedMidway(self) -> None:
        fake = self.use_fake(tokens=10)
        d = self.execute(target="fail-midstream")
        self.assertFailed(d, "upstream stream ended early")
        self.assertEqual(self.text(), fake_text(3))
        self.assertEqual(fake.stats().dropped_streams, 1)

    def test_streamEndsCleanlyWithoutFinish(self) -> None:
        self.use_resource(Scripted(Reply(frames=(chunk({"content": "partial"}),))))
        d = self.execute()
        event = self.assertFailed(d, "upstream stream ended early")
        self.assertEqual(event.error, "upstream stream ended early")
        self.assertEqual(self.types(), ["start", "delta", "error"])

    def test_malformedChunk(self) -> None:
        self.use_resource(Scripted(Reply(frames=(sse("{nope"), DONE))))
        self.assertFailed(self.execute(), "malformed stream chunk")

    def test_errorInsideTheStream(self) -> None:
        frames = (chunk({"content": "a"}), sse({"error": {"message": "engine overloaded"}}))
        self.use_resource(Scripted(Reply(frames=frames)))
        self.assertFailed(self.execute(), "upstream stream error", "engine overloaded")

    def test_connectionRefused(self) -> None:
        self.http = StubTreq(Resource())
        self.provider = self.build(config(), AdapterContext(self.clock, Refusing()))
        d = self.execute()
        self.assertFailed(d, "upstream request failed", "refused")


class TimeoutTests(AdapterCase):
    def test_idleTimeout(self) -> None:
        fake = self.use_fake({"idle_timeout_ms": 1000}, tokens=4, delay_ms=5000)
        d = self.execute()
        self.advance(0.999)
        self.assertNoResult(d)
        self.advance(0.001)
        self.assertFailed(d, "upstream idle for 1s")
        stats = fake.stats()
        self.assertEqual((stats.client_disconnects, stats.active_streams), (1, 0))

    def test_idleTimerResetsOnEveryChunk(self) -> None:
        self.use_fake({"idle_timeout_ms": 1000}, tokens=5, delay_ms=900)
        d = self.execute()
        self.advance(0.9 * 5, steps=5)
        self.successResultOf(d)
        self.assertEqual(self.terminal().type, EventType.COMPLETE)

    def test_idleWhileWaitingForHeaders(self) -> None:
        hanging = Hanging()
        self.use_resource(hanging, idle_timeout_ms=2000)
        d = self.execute()
        self.advance(2)
        self.assertFailed(d, "upstream idle for 2s")
        self.assertEqual(hanging.lost, 1)

    def test_defaultIdleTimeout(self) -> None:
        self.use_resource(Hanging())
        d = self.execute()
        self.advance(119.9)
        self.assertNoResult(d)
        self.advance(0.1)
        self.assertFailed(d, "upstream idle for 120s")

    def test_requestTimeoutFromConfig(self) -> None:
        fake = self.use_fake({"request_timeout_ms": 2500}, tokens=4, delay_ms=1000)
        d = self.execute()
        self.advance(2.5, steps=5)
        event = self.assertFailed(d, "request timed out after 2.5s")
        self.assertEqual(self.types(), ["start", "delta", "delta", "error"])
        self.assertEqual(event.type, EventType.ERROR)
        self.assertEqual(fake.stats().client_disconnects, 1)

    def test_specTimeoutWins(self) -> None:
        self.use_fake({"request_timeout_ms": 60000}, tokens=4, delay_ms=1000)
        d = self.execute(timeout_sec=1.5)
        self.advance(1.5, steps=3)
        self.assertFailed(d, "request timed out after 1.5s")

    def test_noRequestTimeoutByDefault(self) -> None:
        self.use_fake(tokens=3, delay_ms=100_000)
        d = self.execute()
        self.advance(300, steps=3)
        self.successResultOf(d)


class CancelTests(AdapterCase):
    def test_cancelMidStream(self) -> None:
        fake = self.use_fake(tokens=6, delay_ms=1000)
        d = self.execute()
        self.advance(2, steps=2)
        self.assertEqual(self.types(), ["start", "delta", "delta"])
        d.cancel()
        self.http.flush()
        self.failureResultOf(d, CancelledError)
        stats = fake.stats()
        self.assertEqual(
            (stats.client_disconnects, stats.active_streams, stats.completed_responses),
            (1, 0, 0),
        )
        self.advance(10, steps=10)
        self.assertEqual(self.types(), ["start", "delta", "delta"])

    def test_cancelBeforeHeaders(self) -> None:
        hanging = Hanging()
        self.use_resource(hanging)
        d = self.execute()
        d.cancel()
        self.http.flush()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(hanging.lost, 1)
        self.assertEqual(self.types(), ["start"])

    def test_cancelDuringFallbackRetry(self) -> None:
        fake = self.use_fake(tokens=4, delay_ms=1000, reject_tools=True)
        d = self.execute(chat_input(tools=[WEATHER]))
        self.advance(1)
        self.assertEqual(fake.stats().total_requests, 2)
        d.cancel()
        self.http.flush()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(fake.stats().client_disconnects, 1)
        self.assertNotIn("complete", self.types())


class HelperTests(SynchronousTestCase):
    def test_errorMessages(self) -> None:
        self.assertEqual(upstream_error_message(b'{"error": {"message": "m"}}'), "m")
        self.assertEqual(upstream_error_message(b'{"error": "plain"}'), "plain")
        self.assertEqual(upstream_error_message(b'{"detail": "fastapi"}'), "fastapi")
        self.assertEqual(upstream_error_message(b""), "(empty body)")
        self.assertTrue(upstream_error_message(b"x" * 1000).endswith("…"))

    def test_instructionNamesAForcedTool(self) -> None:
        choice = {"type": "function", "function": {"name": "get_weather"}}
        self.assertIn("must call the tool get_weather", text_tool_instruction([WEATHER], choice))

    def test_providerClass(self) -> None:
        provider = openai_compat.build(config(), AdapterContext(Clock(), Refusing()))
        assert isinstance(provider, OpenAICompatProvider)
        self.assertEqual(provider.url.to_text(), "http://upstream.test/v1/chat/completions")

    def test_needsAnHTTPClient(self) -> None:
        error = self.assertRaises(
            ValueError, openai_compat.build, config(), AdapterContext(Clock())
        )
        self.assertIn("needs an HTTP client", str(error))

    def test_profileIsTheSpecs(self) -> None:
        profile = RuntimeProfile(name="p", operations={"chat_completions": "/v2/chat"})
        provider = openai_compat.build(config(profile=profile), AdapterContext(Clock(), Refusing()))
        assert isinstance(provider, OpenAICompatProvider)
        self.assertIs(provider.profile, profile)
