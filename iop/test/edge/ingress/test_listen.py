# -*- test-case-name: iop.test.edge.ingress.test_listen -*-
"""
The client listener's endpoint: ``openai.reuse_port`` in the config, the ``SO_REUSEPORT``
socket the endpoint makes and hands to the reactor, and ``twistd iop-edge``'s wiring of it.
No real socket: a recording stand-in and a memory reactor.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.edge.ingress import listen
from iop.edge.ingress.http import ClientSite
from iop.edge.ingress.join import JOIN_WAIT_SEC
from iop.edge.ingress.listen import (
    ReusePortEndpoint,
    ReusePortUnavailable,
    check_reuse_port,
    client_endpoint,
    reuse_port_endpoint,
)
from iop.test.config.test_openai_section import parse_openai
from iop.test.edge.ingress.harness import ingress_config

OPTION = 15  # SO_REUSEPORT's number on Linux; the tests pass it, whatever the host.


class RecordingSocket:
    """What the endpoint does to its socket, in order; ``fail`` names a call that raises."""

    def __init__(self, family: int, kind: int, fail: str = "") -> None:
        self.family, self.kind, self.fail = family, kind, fail
        self.calls: list[tuple[Any, ...]] = []
        self.closed = False

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        if call[0] == self.fail:
            raise OSError(98, "Address already in use")

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self._call("setsockopt", level, option, value)

    def bind(self, address: tuple[str, int]) -> None:
        self._call("bind", address)

    def listen(self, backlog: int) -> None:
        self._call("listen", backlog)

    def setblocking(self, flag: bool) -> None:
        self._call("setblocking", flag)

    def fileno(self) -> int:
        return 42

    def close(self) -> None:
        self.closed = True


class Sockets:
    def __init__(self, fail: str = "") -> None:
        self.made: list[RecordingSocket] = []
        self.fail = fail

    def __call__(self, family: int, kind: int) -> RecordingSocket:
        sock = RecordingSocket(family, kind, self.fail)
        self.made.append(sock)
        return sock


class ReusePortConfigTests(SynchronousTestCase):
    """``openai.reuse_port``: a boolean, off by default, only beside ``openai.listen``."""

    OPEN = {"listen": "tcp:8080:interface=127.0.0.1", "auth": {"enabled": False}}

    def test_default_off(self) -> None:
        self.assertFalse(parse_openai(dict(self.OPEN)).client_api.reuse_port)

    def test_on(self) -> None:
        api = parse_openai({**self.OPEN, "reuse_port": True}).client_api
        self.assertTrue(api.reuse_port)
        self.assertEqual(api.listen_endpoint, "tcp:8080:interface=127.0.0.1:backlog=1024")

    def test_rules(self) -> None:
        for section, fragment in [
            ({**self.OPEN, "reuse_port": "yes"}, "must be a boolean"),
            ({"reuse_port": True}, "set openai.listen too"),
        ]:
            e = self.assertRaises(ConfigError, parse_openai, section)
            self.assertIn("openai.reuse_port: ", str(e))
            self.assertIn(fragment, str(e))


class ReusePortEndpointTests(SynchronousTestCase):
    """The socket is made, shared, bound and listening before the reactor adopts it."""

    def listen(
        self, description: str, sockets: Sockets | None = None
    ) -> tuple[MemoryReactorClock, Sockets, Any]:
        reactor = MemoryReactorClock()
        sockets = sockets or Sockets()
        endpoint = reuse_port_endpoint(
            reactor, description, reuse_port_option=OPTION, socket_factory=sockets
        )
        self.assertTrue(IStreamServerEndpoint.providedBy(endpoint))
        d = endpoint.listen(Factory.forProtocol(Protocol))
        return reactor, sockets, d

    def test_ipv4(self) -> None:
        reactor, sockets, d = self.listen("tcp:8081:interface=127.0.0.1:backlog=99")
        self.successResultOf(d)
        [sock] = sockets.made
        self.assertEqual((sock.family, sock.kind), (socket.AF_INET, socket.SOCK_STREAM))
        self.assertEqual(
            sock.calls,
            [
                ("setsockopt", socket.SOL_SOCKET, socket.SO_REUSEADDR, 1),
                ("setsockopt", socket.SOL_SOCKET, OPTION, 1),
                ("bind", ("127.0.0.1", 8081)),
                ("listen", 99),
                ("setblocking", False),
            ],
        )
        [(fileno, family, _factory)] = reactor.adoptedPorts
        self.assertEqual((fileno, family), (42, socket.AF_INET))
        # The reactor listens on its own copy of the descriptor: ours is closed.
        self.assertTrue(sock.closed)

    def test_all_interfaces_and_default_backlog(self) -> None:
        _reactor, sockets, d = self.listen("tcp:8081")
        self.successResultOf(d)
        self.assertIn(("bind", ("", 8081)), sockets.made[0].calls)
        self.assertIn(("listen", 1024), sockets.made[0].calls)

    def test_ipv6(self) -> None:
        reactor, sockets, d = self.listen("tcp:8081:interface=\\:\\:1")
        self.successResultOf(d)
        self.assertEqual(sockets.made[0].family, socket.AF_INET6)
        self.assertIn(("bind", ("::1", 8081)), sockets.made[0].calls)
        self.assertEqual(reactor.adoptedPorts[0][1], socket.AF_INET6)

    def test_bind_fails(self) -> None:
        reactor, sockets, d = self.listen("tcp:8081:interface=127.0.0.1", Sockets(fail="bind"))
        failure = self.failureResultOf(d, CannotListenError)
        self.assertIn("8081", str(failure.value))
        self.assertEqual(reactor.adoptedPorts, [])
        self.assertTrue(sockets.made[0].closed)

    def test_reactor_without_adopt(self) -> None:
        e = self.assertRaises(
            ReusePortUnavailable, ReusePortEndpoint, object(), 8081, reuse_port_option=OPTION
        )
        self.assertIn("cannot adopt a listening socket", str(e))

    def test_not_tcp(self) -> None:
        self.assertRaises(
            ValueError, reuse_port_endpoint, MemoryReactorClock(), "unix:/x", reuse_port_option=1
        )


class PlatformTests(SynchronousTestCase):
    """Linux's load-balancing ``SO_REUSEPORT`` or a clear refusal."""

    def test_linux(self) -> None:
        self.assertEqual(check_reuse_port("linux", OPTION), OPTION)

    def test_other_systems(self) -> None:
        for platform, option in [("darwin", OPTION), ("win32", None), ("linux", None)]:
            e = self.assertRaises(ReusePortUnavailable, check_reuse_port, platform, option)
            self.assertIn("openai.reuse_port: needs Linux's SO_REUSEPORT", str(e))


class ClientEndpointTests(SynchronousTestCase):
    """Which endpoint ``openai.listen`` gets, and ``twistd iop-edge``'s client listener."""

    def api(self, reuse_port: bool) -> Any:
        config = ingress_config()
        return dataclasses.replace(
            config.client_api, listen="tcp:8081:interface=127.0.0.1", reuse_port=reuse_port
        )

    def test_plain_tcp(self) -> None:
        reactor = MemoryReactorClock()
        endpoint = client_endpoint(reactor, self.api(False))
        self.assertNotIsInstance(endpoint, ReusePortEndpoint)
        endpoint.listen(Factory.forProtocol(Protocol))
        self.assertEqual(reactor.tcpServers[0][0], 8081)

    def test_reuse_port(self) -> None:
        self.patch(listen, "check_reuse_port", lambda: OPTION)
        endpoint = client_endpoint(MemoryReactorClock(), self.api(True))
        self.assertIsInstance(endpoint, ReusePortEndpoint)
        self.assertEqual(repr(endpoint), "<ReusePortEndpoint 127.0.0.1:8081>")

    def make_service(self, reuse_port: bool) -> tuple[MemoryReactorClock, Any]:
        from iop.edge import tap as edge_tap

        config = ingress_config()
        options = edge_tap.Options()
        options.edge_config = dataclasses.replace(config, client_api=self.api(reuse_port))
        reactor = MemoryReactorClock()
        return reactor, edge_tap.makeService(options, reactor=reactor)

    def test_tap_adopts_the_shared_socket(self) -> None:
        sockets = Sockets()
        self.patch(listen, "check_reuse_port", lambda: OPTION)
        self.patch(listen, "make_socket", sockets)
        reactor, service = self.make_service(True)
        service.startService()
        self.addCleanup(service.stopService)
        # Bound at once, listening once its nodes are ready or the join bound has passed.
        self.assertIn(("bind", ("127.0.0.1", 8081)), sockets.made[0].calls)
        self.assertEqual(reactor.adoptedPorts, [])
        reactor.advance(JOIN_WAIT_SEC)
        [(fileno, family, factory)] = reactor.adoptedPorts
        self.assertEqual((fileno, family), (42, socket.AF_INET))
        self.assertIsInstance(factory, ClientSite)
        self.assertIn(("bind", ("127.0.0.1", 8081)), sockets.made[0].calls)
        # The client listener is the only one adopted; nodes and admin listen as before.
        self.assertNotIn(8081, [port for port, *_ in reactor.tcpServers])

    def test_tap_refuses_without_reuse_port(self) -> None:
        def unavailable() -> int:
            raise ReusePortUnavailable("openai.reuse_port: needs Linux's SO_REUSEPORT")

        self.patch(listen, "check_reuse_port", unavailable)
        e = self.assertRaises(usage.UsageError, self.make_service, True)
        self.assertIn("openai.reuse_port", str(e))
