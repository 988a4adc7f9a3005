# -*- test-case-name: iop.test.edge.ingress.test_http -*-
"""The request-reading layer: the body limit over a real HTTP channel, and read_json."""

from __future__ import annotations

import json

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.ingress.http import ClientSite, LimitedRequest
from iop.test.edge.ingress.harness import BODY_LIMIT, KEY, Ingress


class ClientSiteTests(SynchronousTestCase):
    """The listener's ``Site``, over an in-memory HTTP connection: the body limit is enforced."""

    def exchange(self, raw: bytes) -> bytes:
        self.edge = Ingress()
        site = ClientSite(self.edge.resource, BODY_LIMIT)
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(raw)
        return transport.value()  # type: ignore[no-any-return]

    def tooLarge(self) -> bool:
        request = self.edge.resource.requests[-1]
        self.assertIsInstance(request, LimitedRequest)
        return bool(getattr(request, "bodyTooLarge", False))

    def head(self, extra: str) -> bytes:
        return (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n{extra}\r\n"
        ).encode()

    def test_declared_length_over_limit(self) -> None:
        data = b"x" * (BODY_LIMIT + 1)
        out = self.exchange(self.head(f"Content-Length: {len(data)}\r\n") + data)
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertIn(b"request_too_large", out)
        self.assertTrue(self.tooLarge())

    def test_chunked_body_over_limit(self) -> None:
        chunk = b"x" * 4096
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))
        out = self.exchange(self.head("Transfer-Encoding: chunked\r\n") + chunks + b"0\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out[:100])
        self.assertTrue(self.tooLarge())

    def test_within_limit_reaches_the_app(self) -> None:
        data = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        out = self.exchange(self.head(f"Content-Length: {len(data)}\r\n") + data.encode())
        self.assertTrue(out.startswith(b"HTTP/1.1 404 "), out[:100])
        self.assertFalse(self.tooLarge())

    def test_app_site(self) -> None:
        site = Ingress().app.site()
        self.assertIsInstance(site, ClientSite)
        self.assertEqual(site.requestFactory.maxBodyBytes, BODY_LIMIT)  # type: ignore[attr-defined]
