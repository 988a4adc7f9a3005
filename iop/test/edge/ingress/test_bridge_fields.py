# -*- test-case-name: iop.test.edge.ingress.test_bridge_fields -*-
"""
The Messages → Chat field table: one row per row of the README's table (mapped, ignored,
refused), each checked on :func:`~iop.edge.ingress.bridge.messages_to_chat`, and a check that
the README's table and this one name the same fields.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

import iop
from iop.edge.ingress.bridge import (
    IMAGES_ANY,
    IMAGES_BASE64,
    IMAGES_NONE,
    BridgeError,
    messages_to_chat,
)

Body = dict[str, Any]
Chat = dict[str, Any]

USER = {"role": "user", "content": "hi"}
TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
URL = {"type": "url", "url": "https://example.com/a.png"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def req(**fields: Any) -> Body:
    body: Body = {"model": "m", "max_tokens": 64, "messages": [USER]}
    body.update(fields)
    return body


def user(*blocks: Any) -> Body:
    return req(messages=[{"role": "user", "content": list(blocks)}])


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


@dataclass(frozen=True)
class Row:
    """``field`` as the README names it; ``verdict`` mapped / ignored / refused."""

    field: str
    verdict: str
    body: Body
    # mapped/ignored: a check of the Chat body; refused: the field the error must name.
    check: Callable[[Chat], object] | str
    thinking: bool = False
    images: str = IMAGES_ANY


def same_as_plain(chat: Chat) -> bool:
    return chat == messages_to_chat(req(), target="t", thinking_allowed=False)


ROWS = [
    # -- mapped ----------------------------------------------------------------------------
    Row(
        "system",
        "mapped",
        req(system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        lambda c: c["messages"][0] == {"role": "system", "content": "a\n\nb"},
    ),
    Row(
        "messages[].role: system",
        "mapped",
        req(
            system="first",
            messages=[
                USER,
                {"role": "system", "content": [{"type": "text", "text": "mid"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": "later"},
            ],
        ),
        lambda c: (
            [(m["role"], m["content"]) for m in c["messages"]]
            == [
                ("system", "first"),
                ("user", "hi"),
                ("system", "mid"),
                ("assistant", "ok"),
                ("system", "later"),
            ]
        ),
    ),
    Row(
        "text blocks",
        "mapped",
        user({"type": "text", "text": "a"}, {"type": "text", "text": "b"}),
        lambda c: c["messages"] == [{"role": "user", "content": "a\n\nb"}],
    ),
    Row(
        "image blocks",
        "mapped",
        user(image(PNG), image(URL)),
        lambda c: (
            [p["image_url"]["url"] for p in c["messages"][0]["content"]]
            == ["data:image/png;base64,iVBORw0KGgo=", URL["url"]]
        ),
    ),
    Row(
        "document blocks (text)",
        "mapped",
        user({"type": "document", "source": {"type": "text", "data": "doc"}}),
        lambda c: c["messages"] == [{"role": "user", "content": "doc"}],
    ),
    Row(
        "tool_use, tool_result",
        "mapped",
        req(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
                },
            ]
        ),
        lambda c: (
            c["messages"][1]["tool_calls"][0]["id"] == "t1"
            and c["messages"][2] == {"role": "tool", "tool_call_id": "t1", "content": "r"}
        ),
    ),
    Row(
        "tools",
        "mapped",
        req(tools=[TOOL]),
        lambda c: c["tools"][0]["function"]["name"] == "f",
    ),
    Row(
        "tool_choice",
        "mapped",
        req(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        lambda c: c["tool_choice"] == "required" and c["parallel_tool_calls"] is False,
    ),
    Row(
        "stop_sequences",
        "mapped",
        req(stop_sequences=["END"]),
        lambda c: c["stop"] == ["END"],
    ),
    Row(
        "temperature, top_p",
        "mapped",
        req(temperature=0.5, top_p=0.9),
        lambda c: (c["temperature"], c["top_p"]) == (0.5, 0.9),
    ),
    Row("max_tokens", "mapped", req(max_tokens=7), lambda c: c["max_tokens"] == 7),
    Row(
        "stream",
        "mapped",
        req(stream=True),
        lambda c: c["stream"] is True and c["stream_options"] == {"include_usage": True},
    ),
    Row(
        "metadata.user_id",
        "mapped",
        req(metadata={"user_id": "u-1"}),
        lambda c: c["user"] == "u-1",
    ),
    Row(
        "thinking",
        "mapped",
        req(thinking={"type": "enabled", "budget_tokens": 8000}),
        lambda c: c["reasoning_effort"] == "medium",
        thinking=True,
    ),
    Row(
        "output_config.effort",
        "mapped",
        req(output_config={"effort": "low"}),
        lambda c: c["reasoning_effort"] == "low",
        thinking=True,
    ),
    Row(
        "output_config.format, output_format",
        "mapped",
        req(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}),
        lambda c: c["response_format"]["json_schema"]["schema"] == SCHEMA,
    ),
    Row(
        "tools[].defer_loading, tool_reference",
        "mapped",
        req(
            tools=[
                {**TOOL, "name": "g", "defer_loading": True},
                {**TOOL, "name": "h", "defer_loading": True},
                TOOL,
            ],
            messages=[
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "s1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "s1",
                            "content": [{"type": "tool_reference", "tool_name": "h"}],
                        }
                    ],
                },
            ],
        ),
        lambda c: (
            [t["function"]["name"] for t in c["tools"]] == ["h", "f"]
            and c["messages"][2]["content"] == "[tool loaded: h]"
            and "defer_loading" not in repr(c)
        ),
    ),
    # -- ignored ---------------------------------------------------------------------------
    Row(
        "cache_control",
        "ignored",
        req(
            system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
            tools=[{**TOOL, "cache_control": {"type": "ephemeral"}}],
        ),
        lambda c: "cache_control" not in repr(c),
    ),
    Row(
        "thinking, redacted_thinking blocks",
        "ignored",
        req(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "x", "signature": "s"},
                        {"type": "text", "text": "a"},
                    ],
                },
            ]
        ),
        lambda c: c["messages"][1] == {"role": "assistant", "content": "a"},
    ),
    Row(
        "thinking: adaptive, disabled",
        "ignored",
        req(thinking={"type": "adaptive", "display": "omitted"}),
        same_as_plain,
    ),
    Row(
        "output_config.effort (no thinking)",
        "ignored",
        req(output_config={"effort": "high"}),
        same_as_plain,
    ),
    Row("top_k", "ignored", req(top_k=5), same_as_plain),
    Row("service_tier", "ignored", req(service_tier="auto"), same_as_plain),
    Row(
        "context_management",
        "ignored",
        req(context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
        same_as_plain,
    ),
    Row(
        "citations",
        "ignored",
        req(
            messages=[
                USER,
                {"role": "assistant", "content": [{"type": "text", "text": "a", "citations": []}]},
            ]
        ),
        lambda c: c["messages"][1] == {"role": "assistant", "content": "a"},
    ),
    Row("unknown fields", "ignored", req(some_future_field={"x": 1}), same_as_plain),
    # -- refused ---------------------------------------------------------------------------
    Row("container", "refused", req(container="c-1"), "container"),
    Row("mcp_servers", "refused", req(mcp_servers=[{"type": "url"}]), "mcp_servers"),
    Row(
        "server tools",
        "refused",
        req(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "tools[0]",
    ),
    Row(
        "image blocks (file source)",
        "refused",
        user(image({"type": "file", "file_id": "f1"})),
        "messages[0].content[0]",
    ),
    Row(
        "image blocks (CLI agents)",
        "refused",
        user(image(PNG)),
        "messages[0].content[0]",
        images=IMAGES_NONE,
    ),
    Row(
        "image blocks (url, Ollama)",
        "refused",
        user(image(URL)),
        "messages[0].content[0]",
        images=IMAGES_BASE64,
    ),
    Row(
        "document blocks (PDF, file)",
        "refused",
        user({"type": "document", "source": {"type": "base64", "data": "JVBER"}}),
        "messages[0].content[0]",
    ),
    Row(
        "thinking: enabled (profile without thinking)",
        "refused",
        req(thinking={"type": "enabled", "budget_tokens": 2048}),
        "thinking",
    ),
    Row(
        "other block types",
        "refused",
        user({"type": "search_result", "source": "s", "title": "t", "content": []}),
        "messages[0].content[0]",
    ),
    Row(
        "output_config.format (not json_schema)",
        "refused",
        req(output_config={"format": {"type": "xml"}}),
        "output_config.format.type",
    ),
]


README = Path(iop.__file__).resolve().parent.parent / "README.md"
_TABLE_ROW = re.compile(r"^\s*\| `?(?P<field>[^|]+?)`? \| (?P<verdict>mapped|ignored|refused) \|")


def readme_rows() -> list[tuple[str, str]]:
    """The (field, verdict) rows of the README's Messages bridge field table."""
    rows = []
    for line in README.read_text().splitlines():
        match = _TABLE_ROW.match(line)
        if match:
            rows.append((match["field"].replace("`", ""), match["verdict"]))
    return rows


class FieldTableTests(SynchronousTestCase):
    def test_rows(self) -> None:
        for row in ROWS:

            def convert(row: Row = row) -> Chat:
                return messages_to_chat(
                    row.body, target="t", thinking_allowed=row.thinking, images=row.images
                )

            if row.verdict == "refused":
                assert isinstance(row.check, str)
                error = self.assertRaises(BridgeError, convert)
                self.assertTrue(error.message.startswith(row.check + ":"), (row, error.message))
            else:
                assert callable(row.check)
                self.assertTrue(row.check(convert()), row.field)

    def test_readme_names_the_same_rows(self) -> None:
        if not README.exists():
            self.skipTest("README.md is not beside the package")
        self.assertEqual(readme_rows(), [(row.field, row.verdict) for row in ROWS])
