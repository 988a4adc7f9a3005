# -*- test-case-name: iop.test.node.adapters.test_http_client -*-
"""
The Node's HTTP client for providers: treq's ``HTTPClient`` on an ``Agent`` set up for what a
node does — many short requests, and streams, to a few upstreams over persistent connections.

:func:`provider_http_client` gives the client every HTTP adapter and the provider tunnel use.
Against treq's defaults it changes what costs per request and what a gateway must not do:

- **No cookies.** treq keeps one cookie jar per client; on a node that jar would take an
  upstream's ``Set-Cookie`` from one client's answer and send it with every later client's
  request. :class:`NoCookies` keeps nothing and sends nothing.
- **Bodies written at once.** treq writes a ``bytes`` body through the global cooperator, a
  reactor turn after the headers; :func:`bytes_producer` writes it with them, in one segment.
- **Endpoints made once** per scheme, host and port (:class:`CachedEndpoints`), not once per
  request (each ``HostnameEndpoint`` IDNA-encodes its host), and every connection has
  ``TCP_NODELAY``: a request's last segment and a stream's small chunks are not held back by
  Nagle's algorithm waiting on the peer's delayed ACK.
- **URLs parsed once**: :func:`prepared_url` turns a URL into a hyperlink URL already in URI
  form, which treq then uses as it is (treq otherwise parses and IDNA-encodes the text of every
  request's URL).
"""

from __future__ import annotations

import functools
from typing import Any, cast

from hyperlink import EncodedURL
from treq.client import HTTPClient
from treq.cookies import IndexableCookieJar
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import (
    IConsumer,
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
)
from twisted.web.client import URI, Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IPolicyForHTTPS
from zope.interface import implementer

__all__ = [
    "CachedEndpoints",
    "NoCookies",
    "PreparedURL",
    "bytes_producer",
    "prepared_url",
    "provider_http_client",
]


class NoCookies(IndexableCookieJar):
    """A cookie jar that keeps no cookie and adds none to a request."""

    def add_cookie_header(self, request: Any) -> None:
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Any) -> None:
        return None


@implementer(IBodyProducer)
class _BytesProducer:
    """A request body known in full: written in one piece as soon as the request starts."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def bytes_producer(data: Any) -> IBodyProducer:
    """treq's ``data_to_body_producer``: ``bytes`` written at once, anything else as treq does."""
    if isinstance(data, bytes):
        return _BytesProducer(data)
    return IBodyProducer(data)


@implementer(IStreamClientEndpoint)
class _NoDelay:
    """An endpoint whose connections send small writes at once (``TCP_NODELAY``), and whose
    factories (the connection pool makes one per upstream connection) log no "Starting
    factory <...>" / "Stopping factory" line each."""

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self._endpoint = endpoint

    def connect(self, protocol_factory: IProtocolFactory) -> Deferred[IProtocol]:
        if hasattr(protocol_factory, "noisy"):
            protocol_factory.noisy = False

        def no_delay(protocol: IProtocol) -> IProtocol:
            set_no_delay = getattr(getattr(protocol, "transport", None), "setTcpNoDelay", None)
            if set_no_delay is not None:
                set_no_delay(True)
            return protocol

        return self._endpoint.connect(protocol_factory).addCallback(no_delay)


@implementer(IAgentEndpointFactory)
class CachedEndpoints:
    """
    The endpoints of an ``Agent``: TCP for ``http``, TLS over TCP for ``https`` (verified by
    ``tls_policy``), each made once per scheme, host and port.
    """

    def __init__(
        self, reactor: Any, tls_policy: IPolicyForHTTPS | None = None, max_endpoints: int = 1024
    ) -> None:
        self._reactor = reactor
        self._tls_policy = tls_policy if tls_policy is not None else BrowserLikePolicyForHTTPS()
        self._max = max_endpoints
        self._endpoints: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = self._make(uri)
            if len(self._endpoints) >= self._max:
                self._endpoints.clear()
            self._endpoints[key] = endpoint
        return endpoint

    def _make(self, uri: URI) -> IStreamClientEndpoint:
        try:
            host = uri.host.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(
                f"the host of {uri.toBytes()!r} is not ASCII: it must be IDNA-encoded"
            ) from None
        endpoint: IStreamClientEndpoint = _NoDelay(HostnameEndpoint(self._reactor, host, uri.port))
        if uri.scheme == b"https":
            creator = self._tls_policy.creatorForNetloc(uri.host, uri.port)
            endpoint = wrapClientTLS(creator, endpoint)
        elif uri.scheme != b"http":
            raise ValueError(f"unsupported scheme {uri.scheme!r}: only http and https")
        return endpoint


class PreparedURL(EncodedURL):
    """A URL already in URI form: ``to_uri()`` is itself and its text is made once."""

    _text: str | None = None

    def to_uri(self) -> PreparedURL:
        return self

    def to_text(self, with_password: bool = False) -> str:
        if with_password:
            return super().to_text(with_password=True)
        if self._text is None:
            self._text = super().to_text()
        return self._text


@functools.lru_cache(maxsize=1024)
def prepared_url(url: str) -> PreparedURL:
    """``url`` parsed and IDNA-encoded once (treq's own way); cached by its text."""
    uri_text = EncodedURL.from_text(url).to_uri().to_text(with_password=True)
    return cast(PreparedURL, PreparedURL.from_text(uri_text))


def provider_http_client(reactor: Any, pool: HTTPConnectionPool) -> HTTPClient:
    """The treq client of a node's adapters and tunnels, on ``pool``'s connections."""
    agent = Agent.usingEndpointFactory(reactor, CachedEndpoints(reactor), pool=pool)
    return HTTPClient(agent, cookiejar=NoCookies(), data_to_body_producer=bytes_producer)
