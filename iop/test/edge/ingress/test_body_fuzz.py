# -*- test-case-name: iop.test.edge.ingress.test_body_fuzz -*-
"""
Mutated request bodies on every route: a clean answer, never a 500, and never a body upstream
that is not JSON.

Each example starts from a valid request for the route and mutates it where it hurts: a known
field (top level or nested — ``messages[0].content[0].type``, ``tools[0]``,
``thinking.budget_tokens``, ``stream_options.include_usage``, …) set to a value of another type
or out of bounds, or a poison put anywhere in the body text (``NaN``, ``Infinity``, ``1e999``,
a lone surrogate escape, an array nested a thousand levels deep). The scripted node answers what
reaches it as :mod:`.test_relay_properties` draws it. The properties:

- the answer ends (never a hang) and is never a 500; an error the Edge wrote itself (nothing
  reached the node) is in the route's own surface shape (OpenAI or Anthropic);
- a body :mod:`iop.edge.ingress.validate` refuses is a 400 before any lease or node message;
- every tunnel body and every JSON run input sent to the node parses with a strict JSON parser
  (RFC 8259: no ``NaN``/``Infinity``) and is valid UTF-8;
- afterwards every counter is zero (pool, queue, active runs and tunnels, timers).
"""

from __future__ import annotations

import copy
import itertools
import json
from io import BytesIO
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.errors import ApiError
from iop.edge.ingress.http import read_json
from iop.edge.ingress.validate import (
    check_anthropic_count_tokens,
    check_anthropic_messages,
    check_openai_chat,
    check_openai_responses,
)
from iop.test import examples
from iop.test.edge.ingress.test_relay_properties import SERVING, Scenario, json_values, texts

ROUTES = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/responses")
CHECKS = {
    "/v1/chat/completions": check_openai_chat,
    "/v1/responses": check_openai_responses,
    "/v1/messages": check_anthropic_messages,
    "/v1/messages/count_tokens": check_anthropic_count_tokens,
}

TOOL_OPENAI = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOL_ANTHROPIC = {"name": "f", "input_schema": {"type": "object"}}


def valid(route: str, model: str, stream: bool) -> dict[str, Any]:
    """A full valid request for ``route``, with the fields the mutations aim at."""
    if route == "/v1/responses":
        return {
            "model": model,
            "stream": stream,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "instructions": "be brief",
            "max_output_tokens": 50,
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "tool_choice": "auto",
            "temperature": 0.5,
        }
    if route.startswith("/v1/messages"):
        return {
            "model": model,
            "stream": stream,
            "max_tokens": 100,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "tools": [TOOL_ANTHROPIC],
            "tool_choice": {"type": "auto"},
            "thinking": {"type": "disabled"},
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u"},
        }
    return {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [TOOL_OPENAI],
        "tool_choice": "auto",
        "stream_options": {"include_usage": True},
        "max_tokens": 100,
        "n": 1,
        "stop": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 1,
    }


# Where a mutation lands: a path of keys and indexes into the body.
PATHS: dict[str, list[tuple[Any, ...]]] = {
    "/v1/chat/completions": [
        ("model",), ("stream",), ("messages",), ("messages", 0), ("messages", 0, "role"),
        ("messages", 0, "content"), ("messages", 0, "content", 0),
        ("messages", 0, "content", 0, "type"), ("messages", 0, "tool_calls"), ("tools",),
        ("tools", 0), ("tools", 0, "function"), ("tool_choice",), ("stream_options",),
        ("stream_options", "include_usage"), ("max_tokens",), ("max_completion_tokens",),
        ("n",), ("stop",), ("stop", 0), ("temperature",), ("top_p",), ("seed",),
        ("presence_penalty",), ("reasoning_effort",), ("response_format",), ("metadata",),
        ("logit_bias",), ("user",),
    ],
    "/v1/responses": [
        ("model",), ("stream",), ("input",), ("input", 0), ("input", 0, "content"),
        ("instructions",), ("max_output_tokens",), ("tools",), ("tools", 0), ("tool_choice",),
        ("temperature",), ("top_p",), ("metadata",), ("reasoning",),
    ],
    "/v1/messages": [
        ("model",), ("stream",), ("max_tokens",), ("system",), ("system", 0),
        ("system", 0, "type"), ("messages",), ("messages", 0), ("messages", 0, "role"),
        ("messages", 0, "content"), ("messages", 0, "content", 0),
        ("messages", 0, "content", 0, "type"), ("messages", 0, "content", 0, "text"),
        ("tools",), ("tools", 0), ("tools", 0, "input_schema"), ("tool_choice",),
        ("tool_choice", "type"), ("thinking",), ("thinking", "type"),
        ("thinking", "budget_tokens"), ("temperature",), ("top_p",), ("top_k",),
        ("stop_sequences",), ("stop_sequences", 0), ("metadata",),
    ],
}  # fmt: skip
PATHS["/v1/messages/count_tokens"] = PATHS["/v1/messages"]

# Values of the wrong type or out of bounds for some field; json_values adds everything else.
HOSTILE: st.SearchStrategy[Any] = st.sampled_from(
    [
        None, True, False, 0, -1, 1.5, 2**31, 2**32, 2**63, 2**64, 10**30, -(10**30), "", "x",
        "1", [], [1], ["x"], [{}], {}, {"type": 1}, {"type": "enabled", "budget_tokens": 10**30},
        [{"type": "text"}], [{"role": "user"}],
    ]
)  # fmt: skip
# Literals json.dumps never writes, put into the body text where a marker string was.
POISONS = [
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999",
    '"\\ud800"', '"a\\udfffb"', '"\\udc00\\ud800"',
    "[" * 990 + "]" * 990, "[" * 1500 + "]" * 1500, '{"a":' * 1200 + "1" + "}" * 1200,
    "1" + "0" * 500,
]  # fmt: skip
MARKER = "@@poison@@"


def put(body: Any, path: tuple[Any, ...], value: Any) -> None:
    """Set ``value`` at ``path`` in ``body``, replacing what is in the way."""
    target = body
    for step, following in itertools.pairwise(path):
        container: Any = [] if isinstance(following, int) else {}
        if isinstance(target, dict):
            if not isinstance(target.get(step), list | dict):
                target[step] = container
            target = target[step]
        else:
            if not isinstance(step, int):
                # An earlier mutation put a list where this path expects an object: it stays.
                return
            while len(target) <= step:
                target.append(container)
            if not isinstance(target[step], list | dict):
                target[step] = container
            target = target[step]
    last = path[-1]
    if isinstance(target, dict) and not isinstance(last, int):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int):
        while len(target) <= last:
            target.append(None)
        target[last] = value


@st.composite
def mutated(draw: Any) -> tuple[str, bytes]:
    route = draw(st.sampled_from(ROUTES))
    model = draw(st.sampled_from(SERVING[route]))
    request = copy.deepcopy(valid(route, model, draw(st.booleans())))
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(PATHS[route]))
        kind = draw(st.sampled_from(["hostile", "hostile", "any", "poison", "drop"]))
        if kind == "hostile":
            put(request, path, copy.deepcopy(draw(HOSTILE)))
        elif kind == "any":
            put(request, path, copy.deepcopy(draw(json_values)))
        elif kind == "poison":
            put(request, path, MARKER)
        elif len(path) == 1:
            request.pop(path[0], None)
    if draw(st.integers(0, 5)) == 0:
        request[draw(texts)] = copy.deepcopy(draw(json_values))
    text = json.dumps(request)
    while f'"{MARKER}"' in text:
        text = text.replace(f'"{MARKER}"', draw(st.sampled_from(POISONS)), 1)
    # Markers json_values drew (see test_relay_properties.RAW) stay plain strings here.
    return route, text.encode()


class _Request:
    """What :func:`read_json` needs of a request."""

    def __init__(self, data: bytes) -> None:
        self.content = BytesIO(data)


def refused_by_validation(route: str, data: bytes) -> bool:
    """Whether the Edge's own checks refuse ``data`` (a body that may never reach a node)."""
    try:
        body = read_json(_Request(data), 1 << 20)  # type: ignore[arg-type]
        CHECKS[route](body)
    except ApiError as e:
        return e.status == 400
    return False


class BodyScenario(Scenario):
    def __init__(self, case: SynchronousTestCase, draw: Any, route: str, data: bytes) -> None:
        super().__init__(case, draw)
        self.route = route
        self.data = data

    def check(self, d: Deferred[Any]) -> None:
        case, edge = self.case, self.edge
        reached = any(e.HasField("provider_tunnel_request") or e.HasField("run_request")
                      for e in edge.sent)  # fmt: skip
        refused = len(self.data) <= 8192 and refused_by_validation(self.route, self.data)
        if refused:
            case.assertFalse(reached, "a body validation refuses reached the node")
        super().check(d)  # strict JSON on the node's side, counters, no 500, no hang
        if self.gone:
            return
        response = self.response
        if refused:
            case.assertEqual(response.code, 400)
        if response.code < 400 or reached:
            return
        # The Edge's own error: the route's surface shape.
        answer = json.loads(self.result)
        if self.route in OPENAI_ROUTES:
            case.assertEqual(set(answer), {"error", "request_id"})
            case.assertEqual(set(answer["error"]), {"message", "type", "param", "code"})
        else:
            case.assertEqual(answer["type"], "error")
            case.assertEqual(set(answer["error"]), {"type", "message"})
        case.assertIsInstance(answer["error"]["message"], str)


class BodyFuzzProperties(SynchronousTestCase):
    @settings(
        max_examples=examples(150),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutated(), st.data())
    def test_mutated_bodies(self, request: tuple[str, bytes], data: st.DataObject) -> None:
        route, raw = request
        BodyScenario(self, data.draw, route, raw).run("POST", route, raw)
