# -*- test-case-name: iop.test.edge.test_console -*-
"""
Tests for :mod:`iop.edge.console`: the page and its assets (headers, no external URL), the SSE
stream off the event bus (what it writes, that it unsubscribes, that a paused transport drops
instead of buffering), the console's memory, and the admin token in front of the data routes
but not of the static shell.
"""

from __future__ import annotations

import json
import re
from typing import Any

from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Site
from twisted.web.test.requesthelper import DummyRequest

from iop.config.model import AdminConfig, NodeToken
from iop.edge import tap
from iop.edge.admin import AdminApp
from iop.edge.admin_auth import protect
from iop.edge.console import assets
from iop.edge.console.assets import ASSETS, CSP, PAGE, PublicShell, public_shell
from iop.edge.console.memory import ConsoleMemory
from iop.edge.console.payload import console_event, shown
from iop.edge.console.stream import HEARTBEAT_SEC, ConsoleEvents, EventStream
from iop.edge.events import EventBus, NodeEvent, NodeEventKind, RequestFinished
from iop.runtime.events import Usage
from iop.test.edge.test_admin_auth import edge_config

ADMIN_TOKEN = "console-admin-token"
# The SVG namespace is an identifier the DOM needs, never fetched.
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


def finished(model: str = "chat", status: int = 200, **fields: Any) -> RequestFinished:
    values: dict[str, Any] = {
        "surface": "openai",
        "operation": "chat",
        "status": status,
        "outcome": "complete" if status < 400 else "error",
        "duration": 0.25,
        "model": model,
        "provider_id": "p-chat",
        "node_id": "node-a",
        "target": "demo-model",
        "usage_attribution": "provider",
        "stream": True,
        "usage": Usage(input_tokens=7, output_tokens=5, cached_input_tokens=2),
        "time_to_first_token": 0.05,
        "queue_wait": 0.0,
        "at": 1000.0,
    }
    values.update(fields)
    return RequestFinished(**values)


def parse_sse(raw: bytes) -> list[tuple[str, Any]]:
    """``(event name, data)`` for each event; ``(":", comment)`` for comments; retry skipped."""
    out: list[tuple[str, Any]] = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name, data = "message", None
        for line in block.split("\n"):
            if line.startswith(":"):
                out.append((":", line[1:].strip()))
            elif line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        if data is not None:
            out.append((name, data))
    return out


class AssetTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.treq: Any = StubTreq(AdminApp(lambda: {"nodes": []}).resource())

    def get(self, path: str) -> tuple[Any, bytes]:
        response = self.successResultOf(self.treq.get(f"http://admin{path}"))
        return response, self.successResultOf(response.content())

    def assertHeader(self, response: Any, name: str, value: str) -> None:
        self.assertEqual(response.headers.getRawHeaders(name), [value])

    def test_page(self) -> None:
        response, body = self.get("/")
        self.assertEqual(response.code, 200)
        self.assertHeader(response, "content-type", "text/html; charset=utf-8")
        self.assertHeader(response, "content-security-policy", CSP)
        self.assertHeader(response, "x-content-type-options", "nosniff")
        self.assertHeader(response, "x-frame-options", "DENY")
        self.assertIn(b'src="/console/console.js"', body)
        self.assertIn(b'href="/console/console.css"', body)
        for element in (b'id="nodes"', b'id="providers"', b'id="models"', b'id="requests"'):
            self.assertIn(element, body)

    def test_csp_is_tight(self) -> None:
        directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
        self.assertEqual(directives["default-src"], "'self'")
        self.assertEqual(directives["script-src"], "'self'")
        self.assertEqual(directives["connect-src"], "'self'")
        self.assertEqual(directives["frame-ancestors"], "'none'")
        self.assertNotIn("unsafe", CSP)

    def test_assets(self) -> None:
        for name, content_type in ASSETS.items():
            response, body = self.get(f"/console/{name}")
            self.assertEqual(response.code, 200, name)
            self.assertHeader(response, "content-type", content_type)
            self.assertHeader(response, "content-security-policy", CSP)
            self.assertEqual(body, assets.asset_bytes(name))

    def test_unknown_asset(self) -> None:
        for name in ("nope.js", "..%2Fassets.py", "__init__.py"):
            response, body = self.get(f"/console/{name}")
            self.assertEqual(response.code, 404, name)
            self.assertEqual(json.loads(body)["error"]["code"], 404)

    def test_no_external_url(self) -> None:
        """Air-gapped: no asset names another host (no CDN, no web font, no analytics)."""
        for name in ASSETS:
            text = assets.asset_bytes(name).decode().replace(SVG_NAMESPACE, "")
            for pattern in ("http://", "https://", "//cdn", "@import", "url("):
                self.assertNotIn(pattern, text, f"{name} has {pattern!r}")

    def test_no_inline_script_or_style(self) -> None:
        """The CSP forbids inline script and style: the page has neither."""
        page = assets.asset_bytes(PAGE).decode()
        for tag in re.findall(r"<script[^>]*>", page):
            self.assertIn("src=", tag)
        self.assertNotRegex(page, r"<script[^>]*>[^<]+</script>")
        self.assertNotIn("<style", page)
        self.assertNotRegex(page, r"\sstyle=")
        self.assertNotRegex(page, r"\son[a-z]+=")

    def test_events_without_console(self) -> None:
        response, _ = self.get("/events")
        self.assertEqual(response.code, 503)


class PayloadTests(SynchronousTestCase):
    def test_request(self) -> None:
        name, data = console_event(finished()) or ("", {})
        self.assertEqual(name, "request")
        self.assertEqual(
            data,
            {
                "surface": "openai",
                "operation": "chat",
                "model": "chat",
                "provider_id": "p-chat",
                "node_id": "node-a",
                "status": 200,
                "outcome": "complete",
                "error_code": "",
                "stream": True,
                "duration": 0.25,
                "time_to_first_token": 0.05,
                "queue_wait": 0.0,
                "usage": {
                    "input_tokens": 7,
                    "output_tokens": 5,
                    "reasoning_tokens": None,
                    "cached_input_tokens": 2,
                },
                "at": 1000.0,
            },
        )

    def test_node(self) -> None:
        event = NodeEvent(
            NodeEventKind.IDENTITY_REJECTED,
            "node-a",
            "wrong workload",
            12.0,
            expected="node-a.node.iop",
            presented=("other",),
        )
        self.assertEqual(
            console_event(event),
            (
                "node",
                {
                    "kind": "node.identity_rejected",
                    "node_id": "node-a",
                    "reason": "wrong workload",
                    "outcome": "",
                    "at": 12.0,
                },
            ),
        )

    def test_other(self) -> None:
        self.assertIsNone(console_event(object()))
        self.assertIsNone(console_event({"kind": "request.finished"}))

    def test_shown_agrees(self) -> None:
        node = NodeEvent(NodeEventKind.CONNECTED, "node-a")
        for event in (finished(), node, object(), {"kind": "request.finished"}):
            self.assertEqual(shown(event), console_event(event) is not None)


class MemoryTests(SynchronousTestCase):
    def test_connected_since(self) -> None:
        memory = ConsoleMemory()
        memory.observe(NodeEvent(NodeEventKind.CONNECTED, "node-a", at=5.0))
        memory.observe(NodeEvent(NodeEventKind.CONNECTED, "node-b", at=6.0))
        memory.observe(NodeEvent(NodeEventKind.DISCONNECTED, "node-b", "gone", 7.0))
        snap = memory.snapshot()
        self.assertEqual(snap["connected_since"], {"node-a": 5.0})
        self.assertEqual(
            [e["kind"] for e in snap["node_events"]], ["node.connected"] * 2 + ["node.disconnected"]
        )

    def test_totals_and_recent(self) -> None:
        memory = ConsoleMemory(keep_requests=3)
        for i in range(4):
            memory.observe(finished(at=float(i)))
        memory.observe(finished(status=502, at=9.0))
        memory.observe(finished(model="other", status=401, outcome="refused", at=10.0))
        snap = memory.snapshot()
        self.assertEqual(
            snap["models"],
            {"chat": {"requests": 5, "errors": 1}, "other": {"requests": 1, "errors": 1}},
        )
        self.assertEqual([r["at"] for r in snap["requests"]], [3.0, 9.0, 10.0])

    def test_snapshot_is_aCopy(self) -> None:
        memory = ConsoleMemory()
        memory.observe(finished())
        memory.snapshot()["models"]["chat"]["requests"] = 99
        self.assertEqual(memory.snapshot()["models"]["chat"]["requests"], 1)


class StreamRequest(DummyRequest):
    """A DummyRequest that keeps a push producer (DummyRequest's own loops on pull ones)."""

    producer: Any = None
    streaming_producer: bool | None = None

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer, self.streaming_producer = producer, streaming

    def unregisterProducer(self) -> None:
        self.producer = None


class StreamTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.bus = EventBus(self.clock)
        self.events = ConsoleEvents(self.bus.subscribe, self.clock, max_streams=2)

    def open(self) -> tuple[StreamRequest, EventStream]:
        request = StreamRequest([b"events"])
        stream = self.events.resource()
        assert isinstance(stream, EventStream)
        stream.render(request)
        return request, stream

    def written(self, request: DummyRequest) -> list[tuple[str, Any]]:
        return parse_sse(b"".join(request.written))

    def subscriptions(self) -> int:
        return len(self.bus._subscriptions)

    def test_headers_and_snapshot(self) -> None:
        self.bus.publish(finished())
        self.clock.advance(0)
        request, _ = self.open()
        self.assertEqual(
            request.responseHeaders.getRawHeaders(b"content-type"),
            [b"text/event-stream; charset=utf-8"],
        )
        self.assertEqual(request.responseHeaders.getRawHeaders(b"cache-control"), [b"no-store"])
        self.assertTrue(request.written[0].startswith(b"retry: "))
        ((name, snap),) = self.written(request)
        self.assertEqual(name, "snapshot")
        self.assertEqual(snap["models"], {"chat": {"requests": 1, "errors": 0}})
        self.assertEqual(request.finished, 0)

    def test_event_per_bus_event(self) -> None:
        request, _ = self.open()
        self.bus.publish(NodeEvent(NodeEventKind.CONNECTED, "node-a", at=1.0))
        self.bus.publish(finished())
        self.bus.publish(finished(model="other", status=503))
        self.bus.publish(object())  # type: ignore[arg-type]  # not the console's
        self.clock.advance(0)
        events = self.written(request)[1:]
        self.assertEqual([name for name, _ in events], ["node", "request", "request"])
        self.assertEqual(events[0][1]["kind"], "node.connected")
        self.assertEqual(events[2][1]["status"], 503)
        # Each event's data is one line of JSON.
        for chunk in request.written[2:]:
            self.assertEqual(chunk.count(b"\n"), 3)

    def test_unsubscribe_on_disconnect(self) -> None:
        self.assertEqual(self.subscriptions(), 1)  # the memory
        request, _ = self.open()
        self.assertEqual(self.subscriptions(), 2)
        self.assertEqual(self.events.open_streams, 1)
        request.processingFailed(Failure(ConnectionError("client went away")))
        self.assertEqual(self.subscriptions(), 1)
        self.assertEqual(self.events.open_streams, 0)
        count = len(request.written)
        self.bus.publish(finished())
        self.clock.advance(HEARTBEAT_SEC * 3)
        self.assertEqual(len(request.written), count)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_producing_unsubscribes(self) -> None:
        _, stream = self.open()
        stream.stopProducing()
        self.assertEqual(self.subscriptions(), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_heartbeat(self) -> None:
        request, _ = self.open()
        self.clock.advance(HEARTBEAT_SEC - 0.1)
        self.assertNotIn((":", "keepalive"), self.written(request))
        self.clock.advance(0.1)
        self.assertEqual(self.written(request)[-1], (":", "keepalive"))
        self.clock.advance(HEARTBEAT_SEC)
        self.assertEqual(self.written(request).count((":", "keepalive")), 2)

    def test_registered_as_streaming_producer(self) -> None:
        request, stream = self.open()
        self.assertIs(request.producer, stream)
        self.assertTrue(request.streaming_producer)

    def test_paused_drops_and_says_so(self) -> None:
        """A paused transport buffers nothing more: events are dropped, counted, reported."""
        request, stream = self.open()
        stream.pauseProducing()
        count = len(request.written)
        for _ in range(500):
            self.bus.publish(finished())
        self.clock.advance(HEARTBEAT_SEC)
        self.assertEqual(len(request.written), count)
        self.assertEqual(stream.dropped, 500)
        stream.resumeProducing()
        self.assertEqual(self.written(request)[-1], ("dropped", {"dropped": 500}))
        self.bus.publish(finished())
        self.clock.advance(0)
        self.assertEqual(self.written(request)[-1][0], "request")
        stream.resumeProducing()  # nothing new to report
        self.assertEqual(self.written(request)[-1][0], "request")

    def test_too_many_streams(self) -> None:
        self.open()
        self.open()
        request = DummyRequest([b"events"])
        body = self.events.resource().render(request)
        self.assertEqual(request.responseCode, 503)
        self.assertEqual(json.loads(body)["error"]["code"], 503)
        self.assertEqual(self.subscriptions(), 3)


class _Collect(Protocol):
    def __init__(self) -> None:
        self.data = b""

    def dataReceived(self, data: bytes) -> None:
        self.data += data


class HttpStreamTests(SynchronousTestCase):
    """``GET /events`` through the admin app over an in-memory HTTP connection."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.bus = EventBus(self.clock)
        self.events = ConsoleEvents(self.bus.subscribe, self.clock)
        app = AdminApp(lambda: {"nodes": []}, console=self.events).resource()
        self.admin = AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN))
        self.root = public_shell(protect(app, self.admin), app)
        self.treq: Any = StubTreq(self.root)

    def open(self, headers: dict[str, list[str]]) -> tuple[Any, _Collect]:
        response = self.successResultOf(self.treq.get("http://admin/events", headers=headers))
        body = _Collect()
        response.deliverBody(body)
        return response, body

    def test_stream_and_disconnect(self) -> None:
        response, body = self.open({"Authorization": [f"Bearer {ADMIN_TOKEN}"]})
        self.assertEqual(response.code, 200)
        self.bus.publish(finished())
        self.clock.advance(0)
        self.treq.flush()
        self.assertEqual([name for name, _ in parse_sse(body.data)], ["snapshot", "request"])
        self.assertEqual(len(self.bus._subscriptions), 2)
        transport: Any = body.transport
        transport.stopProducing()
        self.treq.flush()
        self.assertEqual(len(self.bus._subscriptions), 1)
        self.assertEqual(self.events.open_streams, 0)

    def test_events_need_the_token(self) -> None:
        for headers in ({}, {"Authorization": ["Bearer wrong"]}):
            response = self.successResultOf(self.treq.get("http://admin/events", headers=headers))
            self.assertEqual(response.code, 401)
        self.assertEqual(len(self.bus._subscriptions), 1)

    def test_shell_without_token(self) -> None:
        """The static shell loads without the token; every data route still needs it."""
        for path in ("/", "/console/console.js", "/console/console.css"):
            response = self.successResultOf(self.treq.get(f"http://admin{path}"))
            self.assertEqual(response.code, 200, path)
        for path in ("/status", "/healthz", "/metrics", "/runs", "/events", "/consolex", "/x/"):
            response = self.successResultOf(self.treq.get(f"http://admin{path}"))
            self.assertEqual(response.code, 401, path)
        response = self.successResultOf(self.treq.post("http://admin/", data=b"{}"))
        self.assertEqual(response.code, 401)

    def test_shell_is_exactly_the_page_and_assets(self) -> None:
        """Raw request lines (no client-side normalisation): nothing else reaches the app."""
        for path in (
            b"/console/../status",
            b"/console/%2e%2e/status",
            b"/console/..%2fstatus",
            b"/console/console.js/../../status",
            b"/console//../status",
            b"/console/",
            b"/console/nope.js",
            b"//status",
            b"/%2e%2e/status",
            b"/events",
        ):
            transport = StringTransport()
            channel = Site(self.root).buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
            channel.makeConnection(transport)
            channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: admin\r\n\r\n")
            status_line = transport.value().split(b"\r\n", 1)[0]
            self.assertEqual(status_line, b"HTTP/1.1 401 Unauthorized", path)

    def test_unprotected_is_the_app(self) -> None:
        app = AdminApp(lambda: {"nodes": []}).resource()
        self.assertIs(public_shell(protect(app, AdminConfig()), app), app)


class ServiceTests(SynchronousTestCase):
    def test_edge_serves_the_console(self) -> None:
        """The service tree mounts the console with the Edge's bus, shell public under auth."""
        options = tap.Options()
        options.edge_config = edge_config(AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN)))
        service: Any = tap.makeService(options, MemoryReactorClock())
        root = service.getServiceNamed("admin").factory.resource
        self.assertIsInstance(root, PublicShell)
        treq: Any = StubTreq(root)
        self.assertEqual(self.successResultOf(treq.get("http://admin/")).code, 200)
        headers = {"Authorization": [f"Bearer {ADMIN_TOKEN}"]}
        response = self.successResultOf(treq.get("http://admin/events", headers=headers))
        self.assertEqual(response.code, 200)
        self.assertEqual(service.admin._console.open_streams, 1)


class ChannelBackpressureTests(SynchronousTestCase):
    """Over Twisted's own HTTP channel: the transport's pause reaches the stream."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.bus = EventBus(self.clock)
        self.events = ConsoleEvents(self.bus.subscribe, self.clock)
        app = AdminApp(lambda: {"nodes": []}, console=self.events).resource()
        self.transport = StringTransport()
        self.channel = Site(app).buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        self.channel.makeConnection(self.transport)
        self.channel.dataReceived(b"GET /events HTTP/1.1\r\nHost: admin\r\n\r\n")

    def test_paused_transport_buffers_nothing(self) -> None:
        self.assertIn(b"event: snapshot", self.transport.value())
        channel: Any = self.transport.producer
        channel.pauseProducing()
        size = len(self.transport.value())
        for _ in range(1000):
            self.bus.publish(finished())
        self.clock.advance(0)
        self.assertEqual(len(self.transport.value()), size)
        channel.resumeProducing()
        self.assertIn(b'event: dropped\ndata: {"dropped": 1000}', self.transport.value())
        self.bus.publish(finished())
        self.clock.advance(0)
        self.assertTrue(self.transport.value().rstrip().endswith(b"}"))
        self.assertIn(b"event: request", self.transport.value()[size:])

    def test_connection_lost_unsubscribes(self) -> None:
        self.assertEqual(len(self.bus._subscriptions), 2)
        self.channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(self.bus._subscriptions), 1)
        self.assertEqual(self.events.open_streams, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
