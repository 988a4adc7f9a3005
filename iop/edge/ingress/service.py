# -*- test-case-name: iop.test.edge.ingress.test_service,iop.test.edge.ingress.test_listen -*-
"""
The client API as a part of an Edge: :func:`build` makes the
:class:`~iop.edge.ingress.app.ClientApp` over the gateway (every finished request published on
the event bus) with the access log that reads the bus, and :meth:`ClientApi.listener` its
listener on ``openai.listen`` (or a port shared with ``openai.reuse_port``) under the
connection caps the Edge's open-file limit affords — so the Edge's composition root only hands
the service to its tree. :attr:`ClientApi.drain` winds that listener down when the Edge stops
(:mod:`iop.edge.ingress.drain`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.defer import Deferred
from twisted.python import usage

from iop.config.model import ClientAPIConfig, EdgeConfig
from iop.edge.accesslog import AccessLog
from iop.edge.descriptors import ClientCaps
from iop.edge.events import EventBus
from iop.edge.ingress.app import ClientApp
from iop.edge.ingress.drain import Drain
from iop.edge.ingress.listen import ObservedEndpoint, ReusePortUnavailable, client_endpoint
from iop.edge.ingress.sources import Gateway
from iop.edge.quota import InProcessQuotaTable, QuotaGate
from iop.telemetry.tracing import TRACING_OFF, Tracing

__all__ = ["ClientApi", "build"]


@dataclass(frozen=True)
class ClientApi:
    """The client API's parts, built and not listening."""

    config: ClientAPIConfig
    app: ClientApp
    access_log: AccessLog
    # The keys' and teams' limits and budgets the pipeline reserves against.
    gate: QuotaGate
    # The listener's drain when the Edge stops (it knows the site once listener() made it).
    drain: Drain

    def use_config(self, config: EdgeConfig) -> None:
        """A refresh applied: the client keys, their limits and budgets follow it."""
        self.gate.use_config(config)
        self.app.pipeline.use_config(config)

    def listener(
        self,
        caps: ClientCaps | None,
        reactor: Any,
        join: Callable[[], Deferred[None]] | None = None,
    ) -> StreamServerEndpointService | None:
        """
        The client listener (named ``clients``) with the connection caps ``caps`` (None: as
        configured); ``None`` without ``openai.listen``. It raises at start when its port
        cannot be had. With ``openai.reuse_port`` and ``join``, it listens once ``join()``
        fires (:mod:`iop.edge.ingress.join`).

        @raise usage.UsageError: ``openai.reuse_port`` where this system cannot share a port.
        """
        if not self.config.listen:
            return None
        try:
            # openai.reuse_port: a port shared with this host's other Edge processes.
            endpoint = client_endpoint(reactor, self.config, join)
        except ReusePortUnavailable as e:
            raise usage.UsageError(str(e)) from None
        site = self.app.site(caps)
        self.drain.attach(site)
        clients = StreamServerEndpointService(ObservedEndpoint(endpoint, site.listening), site)
        clients._raiseSynchronously = True
        clients.setName("clients")
        return clients


def build(
    gateway: Gateway,
    config: ClientAPIConfig,
    bus: EventBus,
    reactor: Any,
    gate: QuotaGate | None = None,
    tracing: Tracing = TRACING_OFF,
) -> ClientApi:
    """The client API over ``gateway``; its access log subscribes to ``bus`` at once. The keys'
    limits and budgets are counted through ``gate`` (None: a gate over an in-process table)."""
    if gate is None:
        gate = QuotaGate(config, InProcessQuotaTable(reactor))
    # Every finished client request is published on the bus (metrics, access log, console).
    app = ClientApp(gateway, config, reactor, bus.publish, gate, tracing)
    # One access log line per finished client request.
    access_log = AccessLog(clock=reactor)
    bus.subscribe(access_log.observe)
    return ClientApi(config, app, access_log, gate, Drain(reactor, lambda: app.active))
