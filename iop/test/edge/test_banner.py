"""The Edge's start banner (iop.edge.banner): its text, and that it waits for every listener."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop import __version__
from iop.edge.banner import Banner, banner_line, listener_url


class FakePort:
    def __init__(self, address: Any) -> None:
        self.address = address

    def getHost(self) -> Any:
        return self.address


class FakeListener:
    """What the banner reads of a StreamServerEndpointService."""

    def __init__(self) -> None:
        self._waitingForPort: Deferred[Any] = Deferred()


class BannerTextTests(SynchronousTestCase):
    def test_urls(self) -> None:
        self.assertEqual(
            listener_url("http", IPv4Address("TCP", "127.0.0.1", 8080)), "http://127.0.0.1:8080"
        )
        self.assertEqual(listener_url("tls", IPv6Address("TCP", "::1", 7443)), "tls://[::1]:7443")
        self.assertEqual(
            listener_url("http", UNIXAddress(b"/run/iop/admin.sock")), "unix:/run/iop/admin.sock"
        )

    def test_line(self) -> None:
        self.assertEqual(
            banner_line(
                "iop-edge",
                "1.2.3",
                [("clients", "http://0.0.0.0:8080"), ("nodes", "tls://0.0.0.0:7443")],
            ),
            "iop-edge 1.2.3 up: clients http://0.0.0.0:8080, nodes tls://0.0.0.0:7443",
        )


class BannerServiceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events = EventLoggingObserver()
        globalLogPublisher.addObserver(self.events)
        self.addCleanup(globalLogPublisher.removeObserver, self.events)

    def test_once_every_listener_listens_with_the_bound_port(self) -> None:
        clients, nodes = FakeListener(), FakeListener()
        banner = Banner([("clients", "http", clients), ("nodes", "tcp", nodes)])
        banner.startService()
        clients._waitingForPort.callback(FakePort(IPv4Address("TCP", "127.0.0.1", 41234)))
        self.assertIsNone(banner.line)
        port = FakePort(IPv4Address("TCP", "127.0.0.1", 7443))
        nodes._waitingForPort.callback(port)
        self.assertEqual(
            banner.line,
            f"iop-edge {__version__} up: clients http://127.0.0.1:41234, nodes tcp://127.0.0.1:7443",
        )
        lines = [e for e in self.events if e.get("banner")]
        self.assertEqual(len(lines), 1)
        # The services' own chains still hold their ports.
        held: list[Any] = []
        nodes._waitingForPort.addCallback(held.append)
        self.assertEqual(held, [port])

    def test_no_banner_when_a_listener_fails(self) -> None:
        clients = FakeListener()
        banner = Banner([("clients", "http", clients)])
        banner.startService()
        clients._waitingForPort.errback(RuntimeError("cannot bind"))
        clients._waitingForPort.addErrback(lambda f: None)
        self.assertIsNone(banner.line)


class QuietFactoryTests(SynchronousTestCase):
    """The banner names the listeners: our factories log no "Starting factory <... at 0x...>"."""

    def test_our_factories_are_quiet(self) -> None:
        from iop.edge.admin_service import AdminSite
        from iop.edge.cluster.redis import _LeaseFactory, _WakeFactory
        from iop.edge.ingress.http import ClientSite
        from iop.edge.transport import NodeConnectionFactory

        for factory in (AdminSite, ClientSite, NodeConnectionFactory, _LeaseFactory, _WakeFactory):
            self.assertFalse(factory.noisy, factory)
