# -*- test-case-name: iop.test.node.test_tap -*-
"""
``twistd iop-node``: options and the service tree.

The node's only service is its :class:`~iop.node.supervisor.NodeSupervisor`. When the supervisor
finishes with a non-zero code (fatal error, exhausted finite reconnect policy) the reactor is
stopped and the process exits with that code once twistd has cleaned up; a local shutdown
(SIGTERM/SIGINT) exits 0.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from twisted.application.service import IService, MultiService
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python import usage

from iop.config import ConfigError, load_node_config
from iop.config.model import NodeDaemonConfig
from iop.node.supervisor import NodeSupervisor
from iop.node.transport import EdgeConnectionFactory
from iop.security.tls import TLSConfigError, client_connection_creator

log = Logger()


class Options(usage.Options):
    synopsis = "--config PATH"
    longdesc = "Run an IOP Node: dial the Edge, register, apply the config it sends, serve."
    optParameters = [["config", "c", "etc/iop/node.yaml", "Path to node.yaml."]]

    def postOptions(self) -> None:
        try:
            self.nodeConfig: NodeDaemonConfig = load_node_config(self["config"])
        except ConfigError as e:
            raise usage.UsageError(f"invalid config {self['config']}:\n{e}") from None


def edge_endpoint(config: NodeDaemonConfig, reactor: Any) -> IStreamClientEndpoint:
    """TCP to the Edge, wrapped in TLS that checks the Edge's workload name (unless plaintext)."""
    endpoint: IStreamClientEndpoint = HostnameEndpoint(
        reactor, config.edge_host, config.edge_port, timeout=10
    )
    if config.plaintext or config.tls is None:
        return endpoint
    return wrapClientTLS(client_connection_creator(config.tls), endpoint)


class _ProcessExit:
    """
    Make the process exit code follow the supervisor: twistd exits 0 after any clean stop, and
    re-raises SIGTERM/SIGINT on itself after a signalled one. A local shutdown is a normal end
    for a node (exit 0), and a fatal error or exhausted policy must exit 1.
    """

    def __init__(self, reactor: Any) -> None:
        self.code = 0
        atexit.register(self._exit)
        if hasattr(reactor, "addSystemEventTrigger"):
            reactor.addSystemEventTrigger("after", "shutdown", self._forgetSignal, reactor)

    @staticmethod
    def _forgetSignal(reactor: Any) -> None:
        # twistd reads reactor._exitSignal after the reactor stops and kills itself with it.
        if getattr(reactor, "_exitSignal", None) is not None:
            reactor._exitSignal = None

    def _exit(self) -> None:
        if self.code:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.code)


def makeService(options: Options, reactor: Any = None) -> IService:
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor
    config = options.nodeConfig
    try:
        endpoint = edge_endpoint(config, reactor)
    except TLSConfigError as e:
        raise usage.UsageError(str(e)) from None
    factory = EdgeConnectionFactory(reactor, maxFrameBytes=config.max_frame_bytes)
    supervisor = NodeSupervisor(
        endpoint,
        factory,
        config.token,
        config.reconnect,
        reactor,
        handshakeTimeout=config.handshake_timeout_sec,
    )
    supervisor.setName("supervisor")
    top = MultiService()
    supervisor.setServiceParent(top)
    exit_ = _ProcessExit(reactor)

    def finished(code: int) -> None:
        if code == 0:
            return
        log.error("node stopping with exit code {code}", code=code)
        exit_.code = code
        if reactor.running:
            reactor.stop()

    supervisor.whenFinished().addCallback(finished)
    return top
