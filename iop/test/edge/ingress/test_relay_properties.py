# -*- test-case-name: iop.test.edge.ingress.test_relay_properties -*-
"""
Whatever a client sends and whatever the node answers, a request leaks nothing.

Arbitrary JSON bodies (recursive JSON with lone surrogates, huge and non-finite numbers, wrong
types for every known field, random extra fields, bodies that are not objects at all) on every
route of both surfaces, to models on the tunnel wire and the run wire, pooled and direct; the
scripted node then answers each run or tunnel in a way drawn too (a clean answer, garbage, a
failure before or after the start, the node's capacity gate, an upstream error status) or the
client goes away. After the response: no status 500, and every counter is back to zero — pool
in-flight, long in-flight and queued, active tunnels and runs, pending timers — the
response has ended, and every tunnel body and JSON run input the node received is strict JSON
(no ``NaN``/``Infinity``, valid UTF-8).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.codes import ErrorCode
from iop.runtime.events import RuntimeEvent, Usage
from iop.test import examples
from iop.test.edge.ingress.harness import (
    AT_CAPACITY,
    CHAT,
    END,
    MESSAGES,
    Ingress,
    body,
    error,
    sse,
    start,
    usage,
)

MODELS = ["chat", "native", "resp", "plain", "bare", "llama", "counted", "cli", "nope"]
# The models that serve each route (on both wires, pooled and direct).
SERVING = {
    "/v1/chat/completions": ["chat", "bare", "plain", "native", "resp", "llama", "cli"],
    "/v1/responses": ["resp", "chat", "native", "bare", "llama", "cli"],
    "/v1/messages": ["bare", "chat", "native", "resp", "llama", "cli"],
    "/v1/messages/count_tokens": ["native", "counted"],
}
PROVIDERS = ["p-chat", "p-native", "p-resp", "p-plain", "p-bare", "p-llama"]
# Every field a surface reads, to be given values of every type.
FIELDS = [
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "n",
    "reasoning_effort",
    "input",
    "thinking",
    "system",
    "metadata",
    "temperature",
    "stop_sequences",
]
# Number literals json.dumps never writes; put into the body text as they are.
RAW = {"@1e999@": "1e999", "@-1e999@": "-1e999", "@big@": "1" + "0" * 400, "@tiny@": "1e-999"}

texts = st.one_of(
    st.text(max_size=6),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
    st.sampled_from(["a\ud800b", "\udfff", "\ud83d\ude00", "", "user", "assistant", "text"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**32, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
    st.sampled_from(list(RAW)),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(texts, st.sampled_from(FIELDS)), inner, max_size=3),
    ),
    max_leaves=12,
)


def base(path: str, model: str) -> dict[str, Any]:
    if path == "/v1/responses":
        return {"model": model, "input": "hi"}
    if path.startswith("/v1/messages"):
        return {**MESSAGES, "model": model}
    return {**CHAT, "model": model}


def _set_content(value: dict[str, Any], content: Any) -> None:
    if "messages" in value:
        value["messages"][0]["content"] = content
    else:
        value["input"] = content


@st.composite
def requests(draw: Any) -> tuple[str, str, bytes | None]:
    """(method, path, raw body or None) — mostly a valid request with mutations."""
    route = draw(
        st.sampled_from(
            [
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/v1/models",
                "/v1/models/{}",
            ]
        )
    )
    if route.startswith("/v1/models"):
        # (A path that is not UTF-8 never reaches the app: Klein answers it.)
        model = draw(st.one_of(st.sampled_from(MODELS), st.text(max_size=6)))
        return "GET", route.format(quote(model, safe="")), None
    choice = draw(st.integers(0, 9))
    if choice < 7:
        model = draw(st.sampled_from(SERVING[route]))
    else:
        model = draw(st.sampled_from(MODELS)) if choice < 9 else draw(texts)
    value: Any = base(route, model)
    value["stream"] = draw(st.booleans())
    kind = draw(st.sampled_from(["valid"] * 3 + ["wrong"] * 2 + ["extra", "poison", "any"]))
    if kind == "valid":
        _set_content(value, draw(st.text(max_size=8)))
        if draw(st.booleans()):
            value[draw(st.sampled_from(["tools", "max_tokens", "thinking", "n"]))] = draw(
                st.sampled_from(
                    [
                        [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                        [{"name": "f", "input_schema": {"type": "object"}}],
                        1,
                        2**33,
                        {"type": "enabled", "budget_tokens": 2**40},
                        {"type": "disabled"},
                    ]
                )
            )
    elif kind == "wrong":
        for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2)):
            if draw(st.booleans()):
                value.pop(name, None)
            else:
                value[name] = draw(json_values)
    elif kind == "extra":
        value.update(draw(st.dictionaries(texts, json_values, max_size=3)))
    elif kind == "poison":
        poison = draw(st.sampled_from(["a\ud800b", "\udfff", float("nan"), float("inf"), *RAW]))
        if draw(st.booleans()):
            _set_content(value, poison)
        else:
            value[draw(st.one_of(texts, st.sampled_from(FIELDS)))] = [{"x": poison}]
    else:
        value = draw(json_values)
    data = json.dumps(value)
    for marker, literal in RAW.items():
        data = data.replace(f'"{marker}"', literal)
    if draw(st.integers(0, 20)) == 0:
        depth = draw(st.sampled_from([100, 900, 1000, 5000]))
        data = '{"model": "chat", "messages": ' + "[" * depth + "]" * depth + "}"
    return "POST", route, data.encode()


COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
CHUNKS = sse(
    [
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "h"}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        "[DONE]",
    ]
)

# A native Messages provider's answer (Chat over an anthropic_messages profile).
MESSAGE = json.dumps(
    {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "h"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
).encode()
_EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "h"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
    {"type": "message_stop"},
]
MESSAGE_EVENTS = b"".join(
    b"event: " + str(e["type"]).encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
    for e in _EVENTS
)

# A native Responses provider's answer (Chat and Messages over an openai_responses profile;
# a native Responses request passes it through).
_ITEM = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "h", "annotations": []}],
}
_RESPONSE = {
    "id": "r",
    "object": "response",
    "status": "completed",
    "output": [_ITEM],
    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
}
RESPONSE = json.dumps(_RESPONSE).encode()
_RESPONSE_EVENTS: list[dict[str, Any]] = [
    {"type": "response.created", "response": {**_RESPONSE, "status": "in_progress"}},
    {"type": "response.output_item.added", "output_index": 0, "item": {**_ITEM, "content": []}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "h"},
    {"type": "response.output_item.done", "output_index": 0, "item": _ITEM},
    {"type": "response.completed", "response": _RESPONSE},
]
RESPONSE_EVENTS = b"".join(
    b"event: " + str(e["type"]).encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
    for e in _RESPONSE_EVENTS
)


def strict_loads(data: bytes | str) -> Any:
    """JSON as RFC 8259 has it: no NaN/Infinity (Python's decoder accepts them by default)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(data, parse_constant=refuse)


TUNNEL_ANSWERS = ["ok", "garbage", "cut", "fail", "busy", "status", "gone", "gone_silent"]
RUN_ANSWERS = ["ok", "fail", "busy", "fail_mid", "cancelled", "gone", "gone_silent"]


class Scenario:
    """One request against a fresh ingress, with the node's side drawn as it goes."""

    def __init__(self, case: SynchronousTestCase, draw: Any) -> None:
        self.case = case
        self.draw = draw
        self.edge = Ingress()
        self.gone = False
        # The response and its whole body (or the failure that cut it), once checked.
        self.response: Any = None
        self.result: Any = None

    def answer_tunnel(self, request: Any) -> None:
        edge, run_id = self.edge, request.run_id
        kind = self.draw(st.sampled_from(TUNNEL_ANSWERS))
        stream = request.stream
        good = CHUNKS if stream else COMPLETION
        if request.operation == "messages":
            good = MESSAGE_EVENTS if stream else MESSAGE
        elif request.operation == "responses":
            good = RESPONSE_EVENTS if stream else RESPONSE
        if kind == "ok":
            content_type = "text/event-stream" if stream else "application/json"
            edge.frames(run_id, start(200, content_type), body(good), usage(1, 1), END)
        elif kind == "garbage":
            junk = self.draw(st.binary(max_size=40))
            edge.frames(run_id, start(200, "text/event-stream"), body(junk), END)
        elif kind == "cut":
            edge.frames(run_id, start(200), body(good[: len(good) // 2]), error("reset"))
        elif kind == "fail":
            edge.frames(run_id, error("connection refused"))
        elif kind == "busy":
            edge.frames(run_id, error("adapter is at capacity", ErrorCode.PROVIDER_AT_CAPACITY))
        elif kind == "status":
            status = self.draw(st.sampled_from([400, 401, 404, 429, 502, 503]))
            edge.frames(run_id, start(status), body(b'{"error": {"message": "no"}}'), END)
        else:
            self.client_gone(
                confirm=kind == "gone", cancelled=lambda: edge.frames(run_id, error("cancelled"))
            )

    def answer_run(self, request: Any) -> None:
        edge, run_id = self.edge, request.run_id
        kind = self.draw(st.sampled_from(RUN_ANSWERS))
        if kind == "ok":
            edge.events(
                run_id,
                RuntimeEvent.start(),
                RuntimeEvent.text("hi"),
                RuntimeEvent.complete(Usage(1, 1)),
            )
        elif kind == "fail":
            edge.events(run_id, RuntimeEvent.failed("model not found"))
        elif kind == "busy":
            edge.events(run_id, RuntimeEvent.failed("at capacity", AT_CAPACITY))
        elif kind == "fail_mid":
            edge.events(
                run_id, RuntimeEvent.start(), RuntimeEvent.text("h"), RuntimeEvent.failed("x")
            )
        elif kind == "cancelled":
            edge.events(run_id, RuntimeEvent.cancelled("by operator"))
        else:
            self.client_gone(
                confirm=kind == "gone",
                cancelled=lambda: edge.events(
                    run_id, RuntimeEvent.cancelled("client disconnected")
                ),
            )

    def client_gone(self, confirm: bool, cancelled: Any) -> None:
        self.gone = True
        self.edge.disconnect()
        if confirm:
            cancelled()
        # Otherwise the node never confirms: the cancel grace ends the work.

    def run(self, method: str, path: str, data: bytes | None) -> None:
        edge = self.edge
        if method == "GET":
            d: Deferred[Any] = edge.get(path)
        else:
            d = edge.post(path, None, raw=data)
        edge.flush()
        answered: set[str] = set()
        while not self.gone:
            tunnels = [
                t for t in edge.requests("provider_tunnel_request") if t.run_id not in answered
            ]
            runs = [r for r in edge.requests("run_request") if r.run_id not in answered]
            if not tunnels and not runs:
                break
            for request in tunnels:
                answered.add(request.run_id)
                self.answer_tunnel(request)
            for request in runs:
                answered.add(request.run_id)
                self.answer_run(request)
        edge.clock.advance(120)
        edge.flush()
        self.check(d)

    def check(self, d: Deferred[Any]) -> None:
        case, edge = self.case, self.edge
        # Whatever the client sent, what reached the node is JSON (RFC 8259, UTF-8).
        for envelope in edge.sent:
            if envelope.HasField("provider_tunnel_request"):
                strict_loads(envelope.provider_tunnel_request.body.decode("utf-8"))
            elif envelope.HasField("run_request"):
                raw = envelope.run_request.input
                if raw.lstrip().startswith("{"):
                    strict_loads(raw)
        for provider in PROVIDERS:
            counters = edge.pool.counters("node-a", provider)
            case.assertEqual(
                (counters["in_flight"], counters["long_in_flight"], counters["queued"]),
                (0, 0, 0),
                provider,
            )
        # The key's reservation ended exactly once, whatever happened (a second end is logged
        # as a bug and would be flushed as an error by trial).
        case.assertEqual(edge.quota.running, 0)
        case.assertEqual(edge.tunnels.active(), [])
        case.assertEqual(edge.runs.active(), [])
        case.assertEqual(edge.clock.getDelayedCalls(), [])
        if self.gone:
            return
        response = self.response = case.successResultOf(d)
        case.assertNotEqual(response.code, 500)
        ended: list[Any] = []
        response.content().addBoth(ended.append)
        edge.flush()
        # The body ended: cleanly, or cut after a stream started (never left hanging).
        [result] = ended
        self.result = result
        if response.code >= 400:
            case.assertIsInstance(result, bytes)
            case.assertIn("error", json.loads(result))


class LeakProperties(SynchronousTestCase):
    @settings(
        max_examples=examples(200),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests(), st.data())
    def test_nothing_leaks_and_nothing_is_500(
        self, request: tuple[str, str, bytes | None], data: st.DataObject
    ) -> None:
        Scenario(self, data.draw).run(*request)
