"""
The request id on the client API (iop.edge.ingress.requestid): on every answer's headers, in
error bodies, the request's record (its access log line and ledger row), the run or tunnel
request's metadata and, where the profile allows, the upstream request's headers; for each
surface over a tunnel and a run, streamed and not, refused and cancelled.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred

from iop.edge.accesslog import AccessLog
from iop.edge.ingress.relay import UPSTREAM_REQUEST_ID
from iop.edge.ledger import LedgerFeed
from iop.runtime.events import RuntimeEvent
from iop.test.edge.ingress.harness import (
    CHAT,
    END,
    MESSAGES,
    IngressCase,
    body,
    sse,
    start,
)
from iop.test.edge.ingress.test_channel import ChannelCase
from iop.usage.store import UsageRecord
from iop.wire import runtime_pb2 as pb

CLIENT_ID = "client-trace-42:7"
NEW_ID = r"\Areq_[0-9A-HJKMNP-TV-Z]{26}\Z"
LLAMA = {**CHAT, "model": "llama"}
NATIVE = {**MESSAGES, "model": "native"}


class _Ledger:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, record: UsageRecord) -> None:
        self.records.append(record)


class RequestIdCase(IngressCase):
    def ids(self, headers: Any, name: str = "x-request-id") -> list[str]:
        return [v.decode() for v in headers.getRawHeaders(name.encode(), [])]

    def assertEverywhere(self, request_id: str, surface: str = "openai") -> None:
        """``request_id`` is the last record's, its access line's and its ledger row's."""
        record = self.edge.records[-1]
        self.assertEqual(record.request_id, request_id)
        fields = AccessLog.fields(record)
        self.assertEqual(fields["request_id"], request_id)
        self.assertTrue(fields["request_id_text"].endswith(request_id))
        ledger = _Ledger()
        LedgerFeed(ledger).observe(record)  # type: ignore[arg-type]
        if record.operation in ("chat", "responses", "messages") and record.status != 401:
            self.assertEqual([r.request_id for r in ledger.records], [request_id])

    def answered(
        self, d: Deferred[Any], surface: str = "openai", sent: str | None = None
    ) -> tuple[int, str, bytes]:
        """The answer's status, its one request id (the client's ``sent`` when given, else a
        new one) and body; on the Anthropic surface ``request-id`` says the same."""
        code, headers, data = self.answer(d)
        ids = self.ids(headers)
        self.assertEqual(len(ids), 1, ids)
        if sent is not None:
            self.assertEqual(ids, [sent])
        else:
            self.assertRegex(ids[0], NEW_ID)
        if surface == "anthropic":
            self.assertEqual(self.ids(headers, "request-id"), ids)
        else:
            self.assertEqual(self.ids(headers, "request-id"), [])
        return code, ids[0], data


class TunnelTests(RequestIdCase):
    def test_chat_over_a_tunnel_keeps_the_clients_id_to_the_upstream(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT, headers={"x-request-id": CLIENT_ID})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(sent.metadata["request_id"], CLIENT_ID)
        self.assertIn(("x-request-id", CLIENT_ID), [(h.name, h.value) for h in sent.headers])
        self.assertEqual(self.edge.tunnels.get(sent.run_id).request_id, CLIENT_ID)  # type: ignore[union-attr]
        self.edge.frames(sent.run_id, start(), body(b'{"id":"x"}'), END)
        code, _, _ = self.answered(d, sent=CLIENT_ID)
        self.assertEqual(code, 200)
        self.assertEverywhere(CLIENT_ID)

    def test_a_stream_carries_it_in_its_head(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(
            sent.run_id,
            start(content_type="text/event-stream"),
            body(sse([{"choices": []}, "[DONE]"])),
            END,
        )
        code, request_id, _ = self.answered(d)
        self.assertEqual((code, sent.metadata["request_id"]), (200, request_id))
        self.assertTrue(self.edge.records[-1].stream)
        self.assertEverywhere(request_id)

    def test_the_upstreams_own_id_is_kept_beside_ours(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        head = start()
        head["headers"] = [*head["headers"], pb.Header(name="x-request-id", value="vllm-1")]
        self.edge.frames(sent.run_id, head, body(b"{}"), END)
        code, headers, _ = self.answer(d)
        self.assertEqual(code, 200)
        self.assertEqual(self.ids(headers), [sent.metadata["request_id"]])
        self.assertEqual(self.ids(headers, UPSTREAM_REQUEST_ID), ["vllm-1"])

    def test_messages_native_both_headers_and_no_upstream_header_by_default(self) -> None:
        d = self.edge.post("/v1/messages", NATIVE, headers={"x-request-id": CLIENT_ID})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(sent.metadata["request_id"], CLIENT_ID)
        # The anthropic_messages driver's default: the id is not sent on to the provider.
        self.assertNotIn("x-request-id", [h.name for h in sent.headers])
        self.edge.frames(sent.run_id, start(), body(b'{"type":"message"}'), END)
        code, _, _ = self.answered(d, "anthropic", sent=CLIENT_ID)
        self.assertEqual(code, 200)
        self.assertEverywhere(CLIENT_ID, "anthropic")

    def test_an_upstream_error_names_it_in_the_body(self) -> None:
        d = self.edge.post("/v1/messages", NATIVE)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, {"kind": pb.ERROR, "end": True, "error": "upstream down"})
        code, request_id, data = self.answered(d, "anthropic")
        self.assertEqual(code, 502)
        self.assertEqual(json.loads(data)["request_id"], request_id)
        self.assertEverywhere(request_id, "anthropic")

    def test_cancelled_when_the_client_goes(self) -> None:
        self.edge.post(
            "/v1/chat/completions", {**CHAT, "stream": True}, headers={"x-request-id": CLIENT_ID}
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(content_type="text/event-stream"))
        self.edge.disconnect()
        self.assertEqual(self.edge.cancels(), [sent.run_id])
        self.edge.frames(sent.run_id, {"kind": pb.ERROR, "end": True, "error": "cancelled"})
        self.assertEqual(self.edge.records[-1].outcome, "cancelled")
        self.assertEverywhere(CLIENT_ID)


class RunTests(RequestIdCase):
    def test_chat_over_a_run(self) -> None:
        d = self.edge.post("/v1/chat/completions", LLAMA, headers={"x-request-id": CLIENT_ID})
        self.edge.flush()
        sent = self.edge.run_request()
        self.assertEqual(sent.metadata["request_id"], CLIENT_ID)
        self.assertEqual([h.request_id for h in self.edge.runs.active()], [CLIENT_ID])
        self.edge.events(
            sent.run_id, RuntimeEvent.start(), RuntimeEvent.text("hi"), RuntimeEvent.complete()
        )
        code, _, _ = self.answered(d, sent=CLIENT_ID)
        self.assertEqual(code, 200)
        self.assertEverywhere(CLIENT_ID)

    def test_responses_streamed_over_a_run(self) -> None:
        d = self.edge.post("/v1/responses", {"model": "llama", "input": "hi", "stream": True})
        self.edge.flush()
        sent = self.edge.run_request()
        self.edge.events(
            sent.run_id, RuntimeEvent.start(), RuntimeEvent.text("hi"), RuntimeEvent.complete()
        )
        code, request_id, _ = self.answered(d)
        self.assertEqual((code, sent.metadata["request_id"]), (200, request_id))
        self.assertEverywhere(request_id)

    def test_messages_over_a_run_failing_before_output(self) -> None:
        d = self.edge.post("/v1/messages", {**MESSAGES, "model": "llama"})
        self.edge.flush()
        sent = self.edge.run_request()
        self.edge.events(sent.run_id, RuntimeEvent.failed("model not loaded"))
        code, request_id, data = self.answered(d, "anthropic")
        self.assertEqual(code, 502)
        answer = json.loads(data)
        self.assertEqual((answer["type"], answer["request_id"]), ("error", request_id))
        self.assertEqual(sent.metadata["request_id"], request_id)
        self.assertEverywhere(request_id, "anthropic")


class RefusalTests(RequestIdCase):
    def test_refused_before_a_model_is_known(self) -> None:
        for path, surface in (("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")):
            d = self.edge.post(path, CHAT, key="sk-wrong", headers={"x-request-id": CLIENT_ID})
            code, _, data = self.answered(d, surface, sent=CLIENT_ID)
            self.assertEqual((code, json.loads(data)["request_id"]), (401, CLIENT_ID))
            self.assertEverywhere(CLIENT_ID, surface)

    def test_unknown_model_and_route_and_models_listing(self) -> None:
        d = self.edge.post("/v1/chat/completions", {**CHAT, "model": "nope"})
        code, request_id, data = self.answered(d)
        self.assertEqual((code, json.loads(data)["request_id"]), (404, request_id))
        code, request_id, data = self.answered(self.edge.get("/v1/nowhere"))
        self.assertEqual((code, json.loads(data)["request_id"]), (404, request_id))
        code, _, _ = self.answered(
            self.edge.get("/v1/models", x_request_id=CLIENT_ID), sent=CLIENT_ID
        )
        self.assertEqual(code, 200)
        code, _, _ = self.answered(
            self.edge.get("/v1/models", anthropic_version="2023-06-01"), "anthropic"
        )
        self.assertEqual(code, 200)

    def test_a_hostile_id_is_replaced_never_echoed(self) -> None:
        for hostile in ("a b", "x" * 129, "évil", "a,b", "<script>"):
            d = self.edge.post(
                "/v1/chat/completions", {**CHAT, "model": "nope"}, headers={"x-request-id": hostile}
            )
            code, request_id, data = self.answered(d)
            self.assertEqual(code, 404)
            self.assertNotIn(hostile.encode(), data)
            self.assertEqual(json.loads(data)["request_id"], request_id)

    def test_two_headers_are_replaced_by_one(self) -> None:
        d = self.edge.http.post(
            "http://edge.test/v1/chat/completions",
            data=json.dumps({**CHAT, "model": "nope"}).encode(),
            headers={"authorization": "Bearer sk-test-all-models", "x-request-id": ["a", "b"]},
        )
        code, request_id, _ = self.answered(d)
        self.assertEqual(code, 404)
        self.assertNotIn(request_id, ("a", "b"))


class ListenerRefusalTests(ChannelCase):
    def test_a_refusal_keeps_a_sane_id_and_replaces_a_hostile_one(self) -> None:
        big = b"POST /v1/messages HTTP/1.1\r\nx-request-id: %s\r\nContent-Length: 99999999\r\n\r\n"
        response = self.exchange(big % CLIENT_ID.encode()).only()
        self.assertEqual(response.status, 413)
        self.assertEqual(response.header("x-request-id"), CLIENT_ID)
        self.assertEqual(response.header("request-id"), CLIENT_ID)
        self.assertEqual(response.json()["request_id"], CLIENT_ID)
        response = self.exchange(big % b"bad id").only()
        self.assertRegex(response.header("x-request-id") or "", NEW_ID)
        self.assertNotIn(b"bad id", response.body)
