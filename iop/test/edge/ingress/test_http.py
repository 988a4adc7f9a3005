# -*- test-case-name: iop.test.edge.ingress.test_http -*-
"""The request-reading layer: the body limit over a real HTTP channel, and read_json."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyChannel

from iop.edge.ingress.errors import ApiError
from iop.edge.ingress.http import ClientSite, LimitedRequest, json_bytes, read_json
from iop.test.edge.ingress.harness import BODY_LIMIT, KEY, Ingress, ingress_config


class ClientSiteTests(SynchronousTestCase):
    """The listener's ``Site``, over an in-memory HTTP connection: the body limit is enforced."""

    def exchange(self, raw: bytes) -> bytes:
        self.edge = Ingress()
        site = ClientSite(self.edge.resource, self.edge.config.client_api, self.edge.clock)
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(raw)
        return transport.value()  # type: ignore[no-any-return]

    def head(self, extra: str) -> bytes:
        return (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n{extra}\r\n"
        ).encode()

    def test_declared_length_over_limit(self) -> None:
        # Refused from the head alone (it used to be read and dropped first): the app never
        # sees the request.
        out = self.exchange(self.head(f"Content-Length: {BODY_LIMIT + 1}\r\n"))
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertIn(b"request_too_large", out)
        self.assertEqual(self.edge.resource.requests, [])

    def test_chunked_body_over_limit(self) -> None:
        chunk = b"x" * 4096
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))
        out = self.exchange(self.head("Transfer-Encoding: chunked\r\n") + chunks + b"0\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertEqual(self.edge.resource.requests, [])

    def test_within_limit_reaches_the_app(self) -> None:
        data = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        out = self.exchange(self.head(f"Content-Length: {len(data)}\r\n") + data.encode())
        self.assertTrue(out.startswith(b"HTTP/1.1 404 "), out[:100])
        [request] = self.edge.resource.requests
        self.assertIsInstance(request, LimitedRequest)
        self.assertFalse(request.body_too_large)  # type: ignore[attr-defined]

    def test_request_over_limit(self) -> None:
        # The request's own limit, behind the channel's.
        request = LimitedRequest(DummyChannel())
        request.gotLength(LimitedRequest.max_body_bytes + 1)
        self.assertTrue(request.body_too_large)
        request = LimitedRequest(DummyChannel())
        request.gotLength(None)
        request.handleContentChunk(b"x" * (LimitedRequest.max_body_bytes + 1))
        self.assertTrue(request.body_too_large)

    def test_app_site(self) -> None:
        edge = Ingress()
        site = edge.app.site()
        self.assertIsInstance(site, ClientSite)
        self.assertEqual(site.requestFactory.max_body_bytes, BODY_LIMIT)  # type: ignore[attr-defined]
        self.assertIs(site.config, edge.config.client_api)
        self.assertIs(site.reactor, edge.clock)
        self.assertEqual(site.timeOut, edge.config.client_api.idle_timeout_sec)


class FakeRequest:
    """Just what :func:`read_json` reads of a request."""

    def __init__(self, data: bytes, too_large: bool = False) -> None:
        self.content = io.BytesIO(data)
        self.body_too_large = too_large


class ReadJsonTests(SynchronousTestCase):
    def read(self, data: bytes) -> dict[str, Any]:
        return read_json(FakeRequest(data), BODY_LIMIT)  # type: ignore[arg-type]

    def refused(self, data: bytes, status: int = 400) -> ApiError:
        e: ApiError = self.assertRaises(ApiError, self.read, data)
        self.assertEqual(e.status, status, e.message)
        return e

    def test_an_object(self) -> None:
        self.assertEqual(self.read(b'{"a": [1, 2.5, "x"]}'), {"a": [1, 2.5, "x"]})
        # A surrogate pair is one character; big but finite numbers are numbers.
        body = self.read(b'{"a": "\\ud83d\\ude00", "b": 1e308, "c": -1e-400}')
        self.assertEqual(body["a"], "\U0001f600")
        self.assertEqual(json_bytes(body), '{"a":"\U0001f600","b":1e+308,"c":-0.0}'.encode())

    def test_not_an_object_or_not_json(self) -> None:
        for data in (b"{nope", b"[1, 2]", b"", b'"x"', b"\xff\xfe"):
            self.assertEqual(self.refused(data).code, "invalid_json", data)

    def test_too_large(self) -> None:
        self.assertEqual(self.refused(b"{}" + b" " * BODY_LIMIT, 413).code, "request_too_large")
        e = self.assertRaises(ApiError, read_json, FakeRequest(b"{}", True), BODY_LIMIT)
        self.assertEqual(e.status, 413)

    def test_lone_surrogates(self) -> None:
        for data in (
            b'{"a": "a\\ud800b"}',
            b'{"a": "\\udfff"}',
            b'{"\\ud800": 1}',
            b'{"a": [{"b": ["\\ude00\\ud83d"]}]}',
        ):
            e = self.refused(data)
            self.assertEqual(e.code, "invalid_json")
            self.assertIn("surrogate", e.message)

    def test_numbers_json_cannot_carry(self) -> None:
        for data in (
            b'{"a": NaN}',
            b'{"a": Infinity}',
            b'{"a": [-Infinity]}',
            b'{"a": 1e999}',
            b'{"a": -1.5e400}',
            b'{"a": ' + b"9" * 5000 + b"}",
        ):
            self.assertEqual(self.refused(data).code, "invalid_json", data)

    def test_nesting_too_deep(self) -> None:
        for depth in (1000, 100_000):
            data = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
            e = self.assertRaises(
                ApiError,
                read_json,
                FakeRequest(data),  # type: ignore[arg-type]
                len(data),
            )
            self.assertEqual((e.status, e.message), (400, "request body is nested too deeply"))

    def test_what_it_returns_serializes(self) -> None:
        body = self.read(b'{"a": "\\u0000\\u2028\\\\ud800", "b": [true, null, 0.1]}')
        self.assertEqual(json.loads(json_bytes(body)), body)


class ListenerWiringTests(SynchronousTestCase):
    """``twistd iop-edge`` listens for clients with the configured backlog and the site's limits."""

    def listen(self, listen: str, **limits: Any) -> tuple[Any, Any]:
        from iop.edge import tap as edge_tap

        config = ingress_config()
        options = edge_tap.Options()
        options.edge_config = dataclasses.replace(
            config, client_api=dataclasses.replace(config.client_api, listen=listen, **limits)
        )
        reactor = MemoryReactorClock()
        service: Any = edge_tap.makeService(options, reactor=reactor)
        service.startService()
        self.addCleanup(service.stopService)
        port, factory, backlog, interface = reactor.tcpServers[-1]
        site: Any = factory
        self.assertEqual((port, interface), (8081, "127.0.0.1"))
        self.assertIsInstance(site, ClientSite)
        self.assertIs(site.reactor, reactor)
        # The counter holds the listening port, to pause it at the descriptor cap.
        self.assertIsNotNone(site.connections.port)
        self.assertEqual(site.caps, service.getServiceNamed("descriptors").caps)
        return site, backlog

    def test_default_backlog(self) -> None:
        site, backlog = self.listen("tcp:8081:interface=127.0.0.1", max_connections=7)
        self.assertEqual(backlog, 1024)
        self.assertEqual(site.connections.max_total, 7)

    def test_backlog_option_and_endpoint(self) -> None:
        self.assertEqual(self.listen("tcp:8081:interface=127.0.0.1", listen_backlog=99)[1], 99)
        self.assertEqual(self.listen("tcp:8081:interface=127.0.0.1:backlog=7")[1], 7)
