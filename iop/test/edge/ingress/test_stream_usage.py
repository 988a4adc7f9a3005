"""
A Chat stream passed through with the usage the Edge asked for
(:mod:`iop.edge.ingress.stream_usage`): the request asks for it, the client never sees the usage
chunk it did not ask for, every other byte is the provider's.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.stream_usage import HiddenUsage, ask_for_usage
from iop.edge.tunnel import TunnelOutcome
from iop.test.edge.ingress.harness import CHAT, END, IngressCase, body, start, usage

CONTENT = [
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": w}}],
    }
    for w in ("Hel", "lo")
]
USAGE_CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def event(chunk: Any) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


STREAM = b"".join(event(c) for c in CONTENT) + event(USAGE_CHUNK) + b"data: [DONE]\n\n"
WITHOUT = b"".join(event(c) for c in CONTENT) + b"data: [DONE]\n\n"


def relay(pieces: list[bytes], status: int = 200, ctype: str = "text/event-stream") -> bytes:
    transform = HiddenUsage()
    transform.head((status, [("content-type", ctype)]))
    out = b"".join(transform.feed(p) for p in pieces)
    return out + transform.end(TunnelOutcome(ok=True))


class HiddenUsageTests(SynchronousTestCase):
    def test_the_usage_chunk_is_dropped(self) -> None:
        self.assertEqual(relay([STREAM]), WITHOUT)

    @given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), unique=True, max_size=8))
    def test_however_the_bytes_arrive(self, cuts: list[int]) -> None:
        points = [0, *sorted(cuts), len(STREAM)]
        pieces = [STREAM[a:b] for a, b in itertools.pairwise(points)]
        self.assertEqual(relay(pieces), WITHOUT)

    def test_usage_on_content_chunks_stays(self) -> None:
        # vLLM's continuous usage: usage on every chunk with choices; nothing is dropped.
        running = [{**c, "usage": {"prompt_tokens": 3, "completion_tokens": 1}} for c in CONTENT]
        stream = b"".join(event(c) for c in running) + b"data: [DONE]\n\n"
        self.assertEqual(relay([stream]), stream)

    def test_error_answers_and_other_framing_pass_untouched(self) -> None:
        error = json.dumps({"error": {"message": "no", "usage": {}}}).encode()
        self.assertEqual(relay([error], status=400, ctype="application/json"), error)
        crlf = STREAM.replace(b"\n", b"\r\n")
        self.assertEqual(relay([crlf[:10], crlf[10:]]), crlf)

    def test_a_cut_stream_keeps_what_it_had(self) -> None:
        transform = HiddenUsage()
        transform.head((200, [("content-type", "text/event-stream")]))
        self.assertEqual(transform.feed(event(CONTENT[0]) + b"data: {"), event(CONTENT[0]))
        self.assertEqual(transform.end(TunnelOutcome(ok=True)), b"data: {")

    def test_ask_for_usage_keeps_other_options(self) -> None:
        payload: dict[str, Any] = {"stream_options": {"continuous_usage_stats": True}}
        ask_for_usage(payload)
        self.assertEqual(
            payload["stream_options"], {"continuous_usage_stats": True, "include_usage": True}
        )
        fresh: dict[str, Any] = {}
        ask_for_usage(fresh)
        self.assertEqual(fresh["stream_options"], {"include_usage": True})


class ChatStreamUsageTests(IngressCase):
    def stream(self, **extra: Any) -> tuple[dict[str, Any], bytes]:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True, **extra})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(
            sent.run_id, start(200, "text/event-stream"), body(STREAM), usage(3, 2), END
        )
        _, _, data = self.answer(d)
        return json.loads(sent.body), data

    def test_a_stream_that_did_not_ask_gets_no_usage_chunk_but_is_settled(self) -> None:
        payload, data = self.stream()
        self.assertEqual(payload["stream_options"], {"include_usage": True})
        self.assertEqual(data, WITHOUT)
        [finished] = self.edge.records
        self.assertEqual((finished.usage.input_tokens, finished.usage.output_tokens), (3, 2))  # type: ignore[union-attr]

    def test_a_stream_that_asked_gets_it_as_sent(self) -> None:
        payload, data = self.stream(stream_options={"include_usage": True})
        self.assertEqual(payload["stream_options"], {"include_usage": True})
        self.assertEqual(data, STREAM)
