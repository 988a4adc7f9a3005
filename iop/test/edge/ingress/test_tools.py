"""
Text tool calls: the ``{"tool_calls": [...]}`` reply the node's text-tool fallback asks for,
parsed into OpenAI-shaped tool calls, and the marker that lets a stream hold such a reply back.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.tools import (
    MARKER_MATCH,
    MARKER_NO,
    MARKER_PARTIAL,
    new_call_id,
    parse_text_tool_calls,
    tool_call_marker_state,
)
from iop.node.adapters.openai_compat import TEXT_TOOL_REPLY_SHAPE, text_tool_instruction


def shape(calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, parsed arguments) of each call, after checking the OpenAI shape."""
    out = []
    for call in calls:
        assert set(call) == {"id", "type", "function"}, call
        assert call["type"] == "function"
        assert isinstance(call["id"], str) and call["id"]
        assert set(call["function"]) == {"name", "arguments"}
        assert isinstance(call["function"]["arguments"], str)
        out.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
    return out


class ParseTextToolCallsTests(SynchronousTestCase):
    def test_bareObject(self) -> None:
        text = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}'
        remaining, calls = parse_text_tool_calls(text)
        self.assertEqual(remaining, "")
        self.assertEqual(shape(calls), [("get_weather", {"city": "Paris"})])
        self.assertTrue(calls[0]["id"].startswith("call_"))

    def test_matchesTheAdapterInstruction(self) -> None:
        """The shape the node's instruction asks for is the shape parsed here."""
        self.assertIn('{"tool_calls":[{"name":', TEXT_TOOL_REPLY_SHAPE)
        instruction = text_tool_instruction(
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "auto",
        )
        self.assertIn(TEXT_TOOL_REPLY_SHAPE, instruction)
        reply = TEXT_TOOL_REPLY_SHAPE.replace("<tool name>", "f").replace(
            "{<arguments>}", '{"a": 1}'
        )
        self.assertEqual(shape(parse_text_tool_calls(reply)[1]), [("f", {"a": 1})])

    def test_fenced(self) -> None:
        text = (
            "I'll look that up.\n\n```json\n"
            '{"tool_calls": [{"name": "a", "arguments": {}}, '
            '{"name": "b", "arguments": {"x": [1, 2]}}]}\n'
            "```\nDone."
        )
        remaining, calls = parse_text_tool_calls(text)
        self.assertEqual(remaining, "I'll look that up.\n\nDone.")
        self.assertEqual(shape(calls), [("a", {}), ("b", {"x": [1, 2]})])
        self.assertNotEqual(calls[0]["id"], calls[1]["id"])

    def test_fenceWithoutLanguage(self) -> None:
        text = '```\n{"tool_calls":[{"name":"a","arguments":{"q":"x"}}]}\n```'
        remaining, calls = parse_text_tool_calls(text)
        self.assertEqual(remaining, "")
        self.assertEqual(shape(calls), [("a", {"q": "x"})])

    def test_afterText(self) -> None:
        text = 'Calling now: {"tool_calls":[{"name":"a","arguments":"{\\"k\\": 2}"}]} ok'
        remaining, calls = parse_text_tool_calls(text)
        self.assertEqual(remaining, "Calling now:\n\nok")
        self.assertEqual(shape(calls), [("a", {"k": 2})])

    def test_openAIFormAndIds(self) -> None:
        text = json.dumps(
            {
                "tool_calls": [
                    {
                        "id": "call_given",
                        "type": "function",
                        "function": {"name": "a", "arguments": '{"z": true}'},
                    }
                ]
            }
        )
        _, calls = parse_text_tool_calls(text)
        self.assertEqual(calls[0]["id"], "call_given")
        self.assertEqual(shape(calls), [("a", {"z": True})])

    def test_missingArguments(self) -> None:
        _, calls = parse_text_tool_calls('{"tool_calls":[{"name":"now"}]}')
        self.assertEqual(shape(calls), [("now", {})])

    def test_notToolCalls(self) -> None:
        for text in [
            "",
            "plain text",
            '{"answer": 42}',
            '{"tool_calls": []}',
            '{"tool_calls": "x"}',
            '{"tool_calls": [{"arguments": {}}]}',
            '{"tool_calls": [{"name": "", "arguments": {}}]}',
            '{"tool_calls": [{"name": "a", "arguments": [1]}]}',
            '{"tool_calls": [{"name": "a", "arguments": "not json"}]}',
            '{"tool_calls": [{"name": "a", "arguments": {}}, 5]}',
            '{"tool_calls": [{"name": "a", "arguments": {}}',
            'say "tool_calls" please',
        ]:
            self.assertEqual(parse_text_tool_calls(text), (text, []), text)

    def test_firstValidCandidateWins(self) -> None:
        text = (
            '{"tool_calls": "no"} then {"tool_calls":[{"name":"a","arguments":{}}]} '
            'and {"tool_calls":[{"name":"b","arguments":{}}]}'
        )
        remaining, calls = parse_text_tool_calls(text)
        self.assertEqual(shape(calls), [("a", {})])
        self.assertIn('{"tool_calls": "no"} then', remaining)
        self.assertIn('"b"', remaining)

    def test_newCallId(self) -> None:
        first, second = new_call_id(), new_call_id("toolu_")
        self.assertTrue(first.startswith("call_"))
        self.assertTrue(second.startswith("toolu_"))
        self.assertEqual(len(first), len("call_") + 24)
        self.assertTrue(first[5:].isalnum())
        self.assertNotEqual(first, new_call_id())


class MarkerStateTests(SynchronousTestCase):
    def test_states(self) -> None:
        cases = {
            "{": MARKER_PARTIAL,
            "{ ": MARKER_PARTIAL,
            '{"': MARKER_PARTIAL,
            '{"tool_c': MARKER_PARTIAL,
            '{"tool_calls"': MARKER_MATCH,
            '{\n  "tool_calls": [': MARKER_MATCH,
            "`": MARKER_PARTIAL,
            "``": MARKER_PARTIAL,
            "```": MARKER_PARTIAL,
            "```json": MARKER_PARTIAL,
            "```json\n": MARKER_PARTIAL,
            '```json\n{"tool': MARKER_PARTIAL,
            '```json\n{"tool_calls":': MARKER_MATCH,
            '```\n{"tool_calls":': MARKER_MATCH,
            '{"name"': MARKER_NO,
            "{x": MARKER_NO,
            "{}": MARKER_NO,
            "`x`": MARKER_NO,
            "``x": MARKER_NO,
            "```python\nprint": MARKER_NO,
            "```json\n[": MARKER_NO,
            "plain": MARKER_NO,
        }
        for text, expected in cases.items():
            self.assertEqual(tool_call_marker_state(text), expected, text)
