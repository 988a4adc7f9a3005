"""Tests for :mod:`iop.node.adapters.http_client`: the node's treq client for providers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from hyperlink import EncodedURL
from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import URI, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Request

from iop.node.adapters.http_client import (
    CachedEndpoints,
    NoCookies,
    PreparedURL,
    _NoDelay,
    bytes_producer,
    prepared_url,
    provider_http_client,
)


class SetsCookies(Resource):
    """Answers every request with a cookie, and remembers the Cookie headers it was sent."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.cookies: list[Sequence[bytes] | None] = []

    def render(self, request: Request) -> bytes:
        self.cookies.append(request.requestHeaders.getRawHeaders(b"cookie"))
        request.setHeader(b"set-cookie", b"session=client-a-secret; Path=/")
        return b"{}"


class CookieTests(SynchronousTestCase):
    def requests(self, client: HTTPClient, agent: RequestTraversalAgent) -> None:
        for _ in range(2):
            d = client.request("POST", "http://upstream.test/v1/chat/completions", data=b"{}")
            agent.flush()
            self.successResultOf(d)

    def test_one_clients_cookie_never_reaches_the_next(self) -> None:
        upstream = SetsCookies()
        agent = RequestTraversalAgent(upstream)
        self.requests(
            HTTPClient(agent, cookiejar=NoCookies(), data_to_body_producer=bytes_producer), agent
        )
        self.assertEqual(upstream.cookies, [None, None])

    def test_treqs_default_jar_would_replay_it(self) -> None:
        # What NoCookies prevents: the default client sends client A's cookie with request 2.
        upstream = SetsCookies()
        agent = RequestTraversalAgent(upstream)
        self.requests(HTTPClient(agent, data_to_body_producer=bytes_producer), agent)
        self.assertEqual(upstream.cookies, [None, [b"session=client-a-secret"]])


class BodyTests(SynchronousTestCase):
    def test_bytes_are_written_at_once(self) -> None:
        producer = bytes_producer(b'{"model": "m"}')
        self.assertEqual(producer.length, 14)
        consumer = StringTransport()
        d = producer.startProducing(consumer)
        self.assertEqual(consumer.value(), b'{"model": "m"}')
        self.assertIsNone(self.successResultOf(d))

    def test_other_bodies_as_treq_does(self) -> None:
        import io

        producer = bytes_producer(io.BytesIO(b"abc"))
        self.assertEqual(producer.length, 3)


class URLTests(SynchronousTestCase):
    def test_same_text_as_treqs_own_parse(self) -> None:
        for text in (
            "http://127.0.0.1:8000/v1/chat/completions",
            "https://bücher.example/v1/responses?x=1&y=ä",
            "http://user:pw@upstream.test/v1/models",
        ):
            with self.subTest(text=text):
                url = prepared_url(text)
                self.assertIsInstance(url, PreparedURL)
                self.assertIsInstance(url, EncodedURL)
                expected = EncodedURL.from_text(text).to_uri()
                self.assertIs(url.to_uri(), url)
                self.assertEqual(url.to_text(), expected.to_text())
                self.assertEqual(url.to_text(with_password=True), expected.to_text(True))

    def test_parsed_once(self) -> None:
        self.assertIs(prepared_url("http://a.test/v1/x"), prepared_url("http://a.test/v1/x"))


class RecordingTransport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.no_delay: bool | None = None

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class EndpointTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.endpoints = CachedEndpoints(self.reactor)

    def uri(self, text: bytes) -> URI:
        return cast(URI, URI.fromBytes(text))

    def test_made_once_per_scheme_host_and_port(self) -> None:
        a = self.endpoints.endpointForURI(self.uri(b"http://a.test:8000/v1/chat"))
        self.assertIs(a, self.endpoints.endpointForURI(self.uri(b"http://a.test:8000/v1/other")))
        self.assertIsNot(a, self.endpoints.endpointForURI(self.uri(b"http://a.test:8001/v1/chat")))
        self.assertIsNot(a, self.endpoints.endpointForURI(self.uri(b"https://a.test:8000/v1")))

    def test_https_is_tls_and_other_schemes_are_refused(self) -> None:
        endpoint = self.endpoints.endpointForURI(self.uri(b"https://a.test/v1"))
        self.assertNotIsInstance(endpoint, _NoDelay)
        with self.assertRaises(ValueError):
            self.endpoints.endpointForURI(self.uri(b"ftp://a.test/v1"))

    def test_connections_have_no_delay(self) -> None:
        transport = RecordingTransport()

        class Inner:
            def connect(self, factory: Any) -> Any:
                protocol = Protocol()
                protocol.makeConnection(transport)
                return succeed(protocol)

        endpoint = cast(IStreamClientEndpoint, Inner())
        connected = _NoDelay(endpoint).connect(Factory.forProtocol(Protocol))
        protocol = cast(Protocol, self.successResultOf(connected))
        self.assertIs(protocol.transport, transport)
        self.assertTrue(transport.no_delay)

    def test_a_request_connects_through_the_cached_endpoint(self) -> None:
        pool = HTTPConnectionPool(self.reactor, persistent=True)
        client = provider_http_client(self.reactor, pool)
        client.request("GET", prepared_url("http://127.0.0.1:8000/v1/models"))
        [(host, port, *_)] = self.reactor.tcpClients
        self.assertEqual((host, port), ("127.0.0.1", 8000))
