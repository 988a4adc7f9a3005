# -*- test-case-name: iop.test.edge.test_banner -*-
"""
The Edge's start banner: one info line, once every listener listens, with IOP's version and
each listener's URL as bound — the real port when the config asks for port 0::

    iop-edge 0.4.0 up: clients http://127.0.0.1:8080, nodes tls://0.0.0.0:7443, admin http://127.0.0.1:8081

``nodes`` is ``tls://`` unless the node listener is loopback plaintext (``tcp://``); a UNIX
socket listener shows as ``unix:PATH``. :class:`Banner` is a service placed after the
listeners in the Edge's tree: they have bound by the time it starts (twistd binds in
``privilegedStartService``), and it waits on each one's port all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.application.service import Service
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from iop import __version__

__all__ = ["Banner", "banner_line", "listener_url"]


def listener_url(scheme: str, address: Any) -> str:
    """``address`` (a listening port's ``getHost()``) as a URL of ``scheme``."""
    if isinstance(address, IPv6Address):
        return f"{scheme}://[{address.host}]:{address.port}"
    if isinstance(address, IPv4Address):
        return f"{scheme}://{address.host}:{address.port}"
    if isinstance(address, UNIXAddress):
        name = address.name.decode() if isinstance(address.name, bytes) else address.name
        return f"unix:{name}"
    return f"{scheme}://{address}"


def banner_line(program: str, version: str, urls: Sequence[tuple[str, str]]) -> str:
    """``<program> <version> up: <name> <url>, ...``."""
    listeners = ", ".join(f"{name} {url}" for name, url in urls)
    return f"{program} {version} up: {listeners}"


class Banner(Service):
    """Logs :func:`banner_line` once every listener of ``listeners`` (name, URL scheme, its
    ``StreamServerEndpointService``) is listening."""

    name = "banner"
    log = Logger()

    def __init__(
        self, listeners: Sequence[tuple[str, str, Any]], program: str = "iop-edge"
    ) -> None:
        self._listeners = list(listeners)
        self._program = program
        self.line: str | None = None

    def startService(self) -> None:
        super().startService()
        ports = [_port_of(service) for _, _, service in self._listeners]
        # A listener that fails to bind stops the Edge with its own error: no banner then.
        gatherResults(ports, consumeErrors=True).addCallbacks(self._announce, lambda _: None)

    def _announce(self, ports: list[Any]) -> None:
        if any(port is None for port in ports):
            # A listener stopped before it listened (the Edge stopped while starting).
            return
        urls = [
            (name, listener_url(scheme, port.getHost()))
            for (name, scheme, _), port in zip(self._listeners, ports, strict=True)
        ]
        self.line = banner_line(self._program, __version__, urls)
        self.log.info("{banner}", banner=self.line, listeners=dict(urls))


def _port_of(service: Any) -> Deferred[Any]:
    """The listening port of a ``StreamServerEndpointService`` once it has one."""
    # Twisted keeps the listen Deferred there from privilegedStartService on; a callback that
    # hands the port back leaves the service's own chain as it was.
    waiting: Deferred[Any] | None = getattr(service, "_waitingForPort", None)
    if waiting is None:
        return succeed(None).addCallback(lambda _: _no_port(service))
    port: Deferred[Any] = Deferred()

    def got(result: Any) -> Any:
        port.callback(result)
        return result

    def failed(failure: Any) -> Any:
        port.errback(failure)
        return failure

    waiting.addCallbacks(got, failed)
    return port


def _no_port(service: Any) -> Any:
    raise RuntimeError(f"{service!r} is not listening")
