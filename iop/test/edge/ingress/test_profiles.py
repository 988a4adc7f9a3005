"""
The protocol-profile rules of the Anthropic surface: native vs Chat bridge, streaming and tools
capabilities, the thinking extensions, count_tokens, and the no-profile default.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import ProfileConfig
from iop.edge.ingress.profiles import (
    Route,
    Unsupported,
    check_count_tokens,
    check_messages,
    thinking_allowed,
)

ALL = ("chat", "messages", "streaming", "tools", "count_tokens")


def profile(
    driver: str,
    capabilities: tuple[str, ...] = ALL,
    operations: tuple[str, ...] = ("messages", "chat_completions", "count_tokens"),
    thinking: bool = False,
    reasoning: bool = False,
) -> ProfileConfig:
    return ProfileConfig(
        name="p",
        driver=driver,
        operations=tuple((name, f"/{name}") for name in operations),
        capabilities=capabilities,
        extensions=(("reasoning", reasoning), ("thinking", thinking)),
    )


NATIVE = profile("anthropic_messages", ("messages", "streaming", "tools", "count_tokens"))
CHAT = profile("openai_chat", ("chat", "streaming", "tools"), ("chat_completions",))


class CheckMessagesTests(SynchronousTestCase):
    def test_table(self) -> None:
        """(profile, stream, tools) → route, or None for Unsupported."""
        table: list[tuple[ProfileConfig | None, bool, bool, Route | None]] = [
            (None, False, False, Route.BRIDGE),
            (None, True, True, Route.BRIDGE),
            (NATIVE, False, False, Route.NATIVE),
            (NATIVE, True, True, Route.NATIVE),
            (CHAT, False, False, Route.BRIDGE),
            (CHAT, True, True, Route.BRIDGE),
            # Native without the messages capability, or without the operation.
            (profile("anthropic_messages", ("streaming", "tools")), False, False, None),
            (profile("anthropic_messages", operations=("count_tokens",)), False, False, None),
            # Chat without the chat capability, or without the chat_completions operation.
            (profile("openai_chat", ("messages", "streaming", "tools")), False, False, None),
            (profile("openai_chat", operations=("messages",)), False, False, None),
            # Streaming and tools need their capabilities, on either route.
            (profile("openai_chat", ("chat", "tools")), True, False, None),
            (profile("openai_chat", ("chat", "tools")), False, True, Route.BRIDGE),
            (profile("openai_chat", ("chat", "streaming")), False, True, None),
            (profile("openai_chat", ("chat", "streaming")), True, False, Route.BRIDGE),
            (profile("anthropic_messages", ("messages",)), True, False, None),
            (profile("anthropic_messages", ("messages",)), False, True, None),
            (profile("anthropic_messages", ("messages",)), False, False, Route.NATIVE),
            # The Responses driver: over Responses, the driver alone (no capability names it).
            (profile("openai_responses"), True, True, Route.OVER_RESPONSES),
            (profile("openai_responses", (), ()), False, False, Route.OVER_RESPONSES),
            (profile("openai_responses", ("tools",), ()), True, False, None),
            (profile("openai_responses", ("streaming",), ()), False, True, None),
        ]
        for p, stream, tools, expected in table:
            where = (p and (p.driver, p.capabilities, p.operations), stream, tools)
            if expected is None:
                error = self.assertRaises(
                    Unsupported, check_messages, p, stream=stream, tools=tools
                )
                self.assertTrue(error.message, where)
            else:
                self.assertEqual(check_messages(p, stream=stream, tools=tools), expected, where)

    def test_messagesNameWhatIsMissing(self) -> None:
        error = self.assertRaises(
            Unsupported,
            check_messages,
            profile("openai_chat", ("streaming",), ()),
            stream=False,
            tools=False,
        )
        self.assertIn("'chat' capability", error.message)
        self.assertIn("'chat_completions' operation", error.message)
        streaming = self.assertRaises(
            Unsupported,
            check_messages,
            profile("openai_chat", ("chat",), ("chat_completions",)),
            stream=True,
            tools=False,
        )
        self.assertIn("streaming", streaming.message)


class ThinkingTests(SynchronousTestCase):
    def test_extensions(self) -> None:
        self.assertFalse(thinking_allowed(None))
        self.assertFalse(thinking_allowed(CHAT))
        self.assertTrue(thinking_allowed(profile("openai_chat", thinking=True)))
        self.assertTrue(thinking_allowed(profile("openai_chat", reasoning=True)))
        self.assertFalse(thinking_allowed(ProfileConfig(name="bare", driver="openai_chat")))


class CountTokensTests(SynchronousTestCase):
    def test_table(self) -> None:
        self.assertEqual(check_count_tokens(NATIVE), Route.NATIVE)
        for p in [
            None,
            CHAT,
            profile("openai_chat"),
            profile("openai_responses"),
            profile("anthropic_messages", ("messages", "streaming")),
            profile("anthropic_messages", operations=("messages",)),
        ]:
            error = self.assertRaises(Unsupported, check_count_tokens, p)
            self.assertIn("count", error.message)
