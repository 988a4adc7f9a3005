"""The vllm adapter: the openai_compat behaviour plus vLLM's usage dialect."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters import vllm
from iop.node.adapters.openai_compat import OpenAICompatProvider
from iop.node.adapters.vllm import VLLMProvider
from iop.runtime import AdapterContext, AdapterSpec, EventType, IProvider, Usage
from iop.test.node.adapters.test_openai_compat import (
    DONE,
    WEATHER,
    AdapterCase,
    Refusing,
    Reply,
    Scripted,
    chat_input,
    chunk,
    config,
    usage_chunk,
)


class VLLMCase(AdapterCase):
    build: Callable[[AdapterSpec, AdapterContext], IProvider] = staticmethod(vllm.build)
    adapter_type = "vllm"

    def usage_for(self, usage: dict[str, Any], reasoning: bool = False) -> Usage | None:
        self.events.clear()
        frames = [chunk({"role": "assistant", "content": ""})]
        if reasoning:
            frames.append(chunk({"reasoning": "thinking"}))
        frames += [chunk({"content": "answer"}, finish="stop"), usage_chunk(usage), DONE]
        self.use_resource(Scripted(Reply(frames=tuple(frames))))
        self.successResultOf(self.execute())
        complete = self.terminal()
        self.assertEqual(complete.type, EventType.COMPLETE)
        return complete.usage


class VLLMBuildTests(VLLMCase):
    def test_subclassOfOpenAICompat(self) -> None:
        provider = vllm.build(config(type="vllm", name="gpu"), AdapterContext(Clock(), Refusing()))
        self.assertIsInstance(provider, VLLMProvider)
        self.assertIsInstance(provider, OpenAICompatProvider)
        self.assertEqual((provider.type, provider.name), ("vllm", "gpu"))
        self.assertEqual(repr(provider), "<VLLMProvider 'gpu'>")


class VLLMUsageTests(VLLMCase):
    def test_openAILocations(self) -> None:
        usage = self.usage_for(
            {
                "prompt_tokens": 10,
                "completion_tokens": 7,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 8},
                "completion_tokens_details": {"reasoning_tokens": 5},
            },
            reasoning=True,
        )
        self.assertEqual(usage, Usage(10, 7, reasoning_tokens=5, cached_input_tokens=8))

    def test_plainUsage(self) -> None:
        usage = self.usage_for({"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17})
        self.assertEqual(usage, Usage(10, 7))

    def test_nullCachedTokensIsNotReported(self) -> None:
        # vLLM without --enable-prompt-tokens-details, or with nothing cached.
        usage = self.usage_for(
            {
                "prompt_tokens": 10,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": None},
            }
        )
        self.assertEqual(usage, Usage(10, 7))
        usage = self.usage_for(
            {"prompt_tokens": 10, "completion_tokens": 7, "prompt_tokens_details": None}
        )
        self.assertEqual(usage, Usage(10, 7))

    def test_zeroCachedTokensIsReported(self) -> None:
        usage = self.usage_for(
            {
                "prompt_tokens": 10,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
        )
        self.assertEqual(usage, Usage(10, 7, cached_input_tokens=0))

    def test_topLevelReasoningTokens(self) -> None:
        usage = self.usage_for(
            {"prompt_tokens": 4, "completion_tokens": 9, "reasoning_tokens": 6}, reasoning=True
        )
        self.assertEqual(usage, Usage(4, 9, reasoning_tokens=6))

    def test_zeroReasoningNextToReasoningTextIsNotReported(self) -> None:
        usage = self.usage_for(
            {
                "prompt_tokens": 4,
                "completion_tokens": 9,
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
            reasoning=True,
        )
        self.assertEqual(usage, Usage(4, 9))

    def test_zeroReasoningWithoutReasoningTextIsReported(self) -> None:
        usage = self.usage_for(
            {
                "prompt_tokens": 4,
                "completion_tokens": 9,
                "completion_tokens_details": {"reasoning_tokens": 0},
            }
        )
        self.assertEqual(usage, Usage(4, 9, reasoning_tokens=0))

    def test_continuousUsageStatsLastWins(self) -> None:
        frames = (
            chunk({"content": "a"}, usage={"prompt_tokens": 5, "completion_tokens": 1}),
            chunk({"content": "b"}, usage={"prompt_tokens": 5, "completion_tokens": 2}),
            chunk(finish="stop", usage={"prompt_tokens": 5, "completion_tokens": 2}),
            DONE,
        )
        self.use_resource(Scripted(Reply(frames=frames)))
        self.successResultOf(self.execute())
        self.assertEqual(self.terminal().usage, Usage(5, 2))

    def test_openaiCompatIgnoresTheVLLMOnlyLocation(self) -> None:
        # The hook is the vLLM subclass's own: the base adapter reads only OpenAI's places.
        raw = {"prompt_tokens": 4, "completion_tokens": 9, "reasoning_tokens": 6}
        base = OpenAICompatProvider(config(), AdapterContext(Clock(), Refusing()))
        self.assertEqual(base.usage_from(raw, True), Usage(4, 9))


class VLLMBehaviourTests(VLLMCase):
    def test_endToEndWithTheFake(self) -> None:
        self.use_fake(tokens=3)
        messages = [{"role": "system", "content": "sys prompt"}, {"role": "user", "content": "q"}]
        self.successResultOf(self.execute(chat_input(messages), target="qwen-reasoner"))
        self.assertEqual(self.text(), "tok0 tok1 tok2")
        self.assertEqual(self.text(EventType.REASONING_DELTA), "think0")
        self.assertEqual(
            self.terminal().usage, Usage(3, 4, reasoning_tokens=1, cached_input_tokens=2)
        )

    def test_autoToolChoiceRejectionFallsBackToText(self) -> None:
        # What vLLM says to tools when started without --enable-auto-tool-choice.
        message = (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
        rejection = json.dumps(
            {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
        ).encode()
        answer = (chunk({"content": '{"tool_calls": []}'}, finish="stop"), DONE)
        resource = Scripted(
            Reply(code=400, frames=(rejection,), content_type=b"application/json"),
            Reply(frames=answer),
        )
        self.use_resource(resource)
        self.successResultOf(self.execute(chat_input(tools=[WEATHER], tool_choice="auto")))
        self.assertEqual(len(resource.bodies), 2)
        self.assertNotIn("tools", resource.bodies[1])
        self.assertEqual(self.terminal().metadata["openai_text_tool_fallback"], "true")

    def test_olderTopLevelErrorShape(self) -> None:
        body = json.dumps(
            {"object": "error", "message": "The model `x` does not exist.", "code": 404}
        ).encode()
        self.use_resource(Scripted(Reply(code=404, frames=(body,))))
        self.assertFailed(self.execute(), "upstream HTTP 404", "does not exist")


class NoSocketsTests(SynchronousTestCase):
    def test_moduleHasBuild(self) -> None:
        self.assertTrue(callable(vllm.build))
