# -*- test-case-name: iop.test.edge.ingress.test_listen -*-
"""
The client listener's endpoint: ``openai.listen`` as Twisted parses it, or — with
``openai.reuse_port: true`` — one port shared by several Edge processes on the same host.
Either way wrapped in :class:`ObservedEndpoint`, which hands the listening port to the site (it
pauses the port at its descriptor cap).

:class:`ReusePortEndpoint` is an ``IStreamServerEndpoint`` like the ``tcp:`` one: it creates
the socket itself with ``SO_REUSEPORT`` (and ``SO_REUSEADDR``, as Twisted's ``tcp.Port`` sets),
binds and listens, and hands it to ``reactor.adoptStreamPort``; the reactor serves a copy of the
descriptor and the endpoint closes its own. Every Edge process binding the same address this way
joins one group: the kernel spreads new connections over the group's listening sockets, and
when one process stops the others keep the port.

With a ``join`` (:class:`~iop.edge.ingress.join.JoinGate`'s ``wait``), the endpoint binds at once
— a port held by a listener without ``SO_REUSEPORT`` is refused at start, as without one — but
listens only when ``join`` fires: until then the socket is in no group and gets no connection.

Linux only: the kernel balances connections over ``SO_REUSEPORT`` sockets there (3.9 and
later); other systems either lack the option or give a port's connections to one socket, so
:func:`client_endpoint` refuses them (:class:`ReusePortUnavailable`). Linux also requires every
process of a group to run as the same user.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.abstract import isIPv6Address
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IReactorSocket,
    IStreamServerEndpoint,
)
from zope.interface import implementer

from iop.config.edge import split_endpoint
from iop.config.model import DEFAULT_LISTEN_BACKLOG, ClientAPIConfig

__all__ = [
    "ObservedEndpoint",
    "ReusePortEndpoint",
    "ReusePortUnavailable",
    "client_endpoint",
    "reuse_port_endpoint",
]

# socket.socket, or a test's stand-in with the same calls.
SocketFactory = Callable[[int, int], Any]
make_socket: SocketFactory = socket.socket


class ReusePortUnavailable(Exception):
    """``openai.reuse_port`` asked for on a system without Linux's ``SO_REUSEPORT``."""


def check_reuse_port(
    platform: str = sys.platform, option: int | None = getattr(socket, "SO_REUSEPORT", None)
) -> int:
    """
    The ``SO_REUSEPORT`` option number on this system (``option``: None = it has none).

    @raise ReusePortUnavailable: not Linux, or the socket module has no ``SO_REUSEPORT``.
    """
    if not platform.startswith("linux") or option is None:
        raise ReusePortUnavailable(
            "openai.reuse_port: needs Linux's SO_REUSEPORT (this system is "
            f"{platform!r}); run one Edge per port here, or put an L4 balancer in front"
        )
    return option


@implementer(IStreamServerEndpoint)
class ReusePortEndpoint:
    """
    A TCP server endpoint on ``interface:port`` whose socket has ``SO_REUSEPORT`` set, adopted
    by ``reactor`` (an ``IReactorSocket``). ``interface`` ``""`` = every IPv4 interface, as for
    ``tcp:``; an IPv6 address listens on IPv6.
    """

    def __init__(
        self,
        reactor: Any,
        port: int,
        interface: str = "",
        backlog: int = DEFAULT_LISTEN_BACKLOG,
        *,
        reuse_port_option: int | None = None,
        socket_factory: SocketFactory | None = None,
        join: Callable[[], defer.Deferred[None]] | None = None,
    ) -> None:
        if not IReactorSocket.providedBy(reactor):
            raise ReusePortUnavailable(
                f"openai.reuse_port: the reactor ({type(reactor).__name__}) cannot adopt a "
                "listening socket (IReactorSocket); run the Edge on the default (epoll) reactor"
            )
        # An IReactorSocket; adoptStreamPort's own hints want a ServerFactory, not any factory.
        self._reactor: Any = reactor
        self._port = port
        self._interface = interface
        self._backlog = backlog
        self._option = check_reuse_port() if reuse_port_option is None else reuse_port_option
        self._socket_factory = socket_factory or make_socket
        self._join = join

    def __repr__(self) -> str:
        return f"<ReusePortEndpoint {self._interface or '0.0.0.0'}:{self._port}>"

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if isIPv6Address(self._interface) else socket.AF_INET

    def listen(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        try:
            sock = self._bind()
        except CannotListenError:
            return defer.fail()
        if self._join is None:
            return defer.execute(self._listen, sock, protocolFactory)
        joined = self._join()
        # Stopped before joining: the bound socket is closed, never listened on.
        joined.addErrback(lambda failure: (sock.close(), failure)[1])
        return joined.addCallback(lambda _: self._listen(sock, protocolFactory))

    def _bind(self) -> Any:
        sock = self._socket_factory(self.family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, self._option, 1)
            sock.bind((self._interface, self._port))
        except OSError as e:
            sock.close()
            raise CannotListenError(self._interface, self._port, e) from None
        return sock

    def _listen(self, sock: Any, factory: IProtocolFactory) -> IListeningPort:
        try:
            try:
                sock.listen(self._backlog)
                sock.setblocking(False)
            except OSError as e:
                raise CannotListenError(self._interface, self._port, e) from None
            port: IListeningPort = self._reactor.adoptStreamPort(
                sock.fileno(), self.family, factory
            )
            return port
        finally:
            # The reactor listens on its own duplicate of the descriptor.
            sock.close()


def reuse_port_endpoint(reactor: Any, description: str, **kwargs: Any) -> ReusePortEndpoint:
    """
    A :class:`ReusePortEndpoint` for a ``tcp:PORT[:interface=ADDR][:backlog=N]`` description
    (the form the config loader accepts for ``openai.listen``).
    """
    args, options = split_endpoint(description)
    if args[0] != "tcp":
        raise ValueError(f"not a tcp: endpoint: {description!r}")
    values = dict(zip(("port", "interface", "backlog"), args[1:], strict=False))
    values.update(options)
    return ReusePortEndpoint(
        reactor,
        int(values["port"]),
        values.get("interface", ""),
        int(values.get("backlog", DEFAULT_LISTEN_BACKLOG)),
        **kwargs,
    )


def client_endpoint(
    reactor: Any,
    config: ClientAPIConfig,
    join: Callable[[], defer.Deferred[None]] | None = None,
) -> IStreamServerEndpoint:
    """
    The endpoint ``openai.listen`` names: Twisted's own for it, or a :class:`ReusePortEndpoint`
    (listening once ``join`` fires, if given) when ``openai.reuse_port`` is on.

    @raise ReusePortUnavailable: ``reuse_port`` on a system without it.
    """
    description = config.listen_endpoint
    if description is None:
        raise ValueError("openai.listen is not set")
    if config.reuse_port:
        return reuse_port_endpoint(reactor, description, join=join)
    endpoint: IStreamServerEndpoint = serverFromString(reactor, description)
    return endpoint


@implementer(IStreamServerEndpoint)
class ObservedEndpoint:
    """``endpoint``, telling ``on_listening`` the port once it listens."""

    def __init__(
        self, endpoint: IStreamServerEndpoint, on_listening: Callable[[IListeningPort], None]
    ) -> None:
        self._endpoint = endpoint
        self._on_listening = on_listening

    def __repr__(self) -> str:
        return f"<ObservedEndpoint {self._endpoint!r}>"

    def listen(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        d = self._endpoint.listen(protocolFactory)

        def listening(port: IListeningPort) -> IListeningPort:
            self._on_listening(port)
            return port

        return d.addCallback(listening)
