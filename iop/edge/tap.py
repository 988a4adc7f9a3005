# -*- test-case-name: iop.test.test_taps,iop.test.edge.test_transport_identity -*-
"""
``twistd iop-edge``: options and the service tree, composed of the parts each subsystem builds.

``makeService(options, reactor=...)`` composes into a MultiService (:class:`EdgeService`), in
this order: the cluster (:mod:`iop.edge.cluster.service`, with ``cluster:``), the usage ledger
(:mod:`iop.usage.service`, unless ``usage.ledger`` turns it off), the node link
(:mod:`iop.edge.link`: registry, dispatchers, the node listener, TLS unless the config asks for
loopback plaintext), the gateway, config refresh (:mod:`iop.edge.refresh.build`: the applier,
the node pusher, ``POST /config/refresh`` and SIGHUP), the admin surface
(:mod:`iop.edge.admin_service`: Klein app, auth, console, metrics, ``GET /usage``) and, when
``openai.listen`` is set, the client API (:mod:`iop.edge.ingress.service`; with
``openai.reuse_port`` it joins the shared port once its nodes are ready,
:mod:`iop.edge.ingress.join`); every finished
client request publishes a :class:`~iop.edge.events.RequestFinished` on the event bus. After a
refresh applied the new config is :attr:`EdgeService.config`.

Stopping (SIGTERM) drains first (:mod:`iop.edge.ingress.drain`): the client listener closes and
the work in flight gets ``edge.drain_timeout_sec`` to finish while everything else — the node
link and its listener, the cluster's Redis, the usage ledger, the admin surface — still runs;
only then does the tree stop as before.

Managed mode (``security.mode: managed``) will not start without mTLS on the node listener
(:func:`~iop.edge.link.check_managed_transport`). Open files (:mod:`iop.edge.descriptors`) are
read, raised and shared out before anything else: the client listener gets the caps that are
left. Once every listener listens, :class:`~iop.edge.banner.Banner` logs one line with the
version and each listener's URL. Under twistd the service comes wrapped by
:func:`iop.logs.twistd.for_twistd` (the log observer ``logging:`` asks for; a refresh switches
its level).

With ``telemetry:`` the Edge builds its trace provider first (:mod:`iop.telemetry.provider`;
:attr:`EdgeService.telemetry` holds its :class:`~iop.telemetry.tracing.Tracing` for the parts
that make spans) and stops it last, flushing within ``telemetry.shutdown_timeout_sec``.
"""

from __future__ import annotations

import functools
from typing import Any

from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python import usage

from iop.config import ConfigError, load_edge_config
from iop.config.edge import split_endpoint
from iop.config.model import EDGE_SERVICE_NAME, EdgeConfig
from iop.daemon.errors import config_problem
from iop.edge import admin_service, link
from iop.edge.banner import Banner
from iop.edge.cluster import service as cluster
from iop.edge.credentials import CredentialIssuer
from iop.edge.descriptors import OpenFiles, descriptor_caps, raise_soft_limit
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.ingress import service as ingress
from iop.edge.ingress.join import JoinGate
from iop.edge.leasetable import InProcessTable
from iop.edge.ledger import LedgerFeed
from iop.edge.link import check_managed_transport
from iop.edge.pool import ProviderPool
from iop.edge.quota import InProcessQuotaTable, QuotaGate
from iop.edge.refresh import build as refresh
from iop.edge.status import snapshot
from iop.heap import FrozenStartup
from iop.logs.twistd import LOG_FLAGS, TwistdLogging, for_twistd
from iop.security.keys import KeyFileError
from iop.telemetry.provider import build as build_telemetry
from iop.usage import service as usage_service
from iop.version import version_line

__all__ = ["EdgeService", "Options", "check_managed_transport", "listen_settings", "makeService"]


class Options(usage.Options):
    synopsis = "--config PATH"
    longdesc = "Run the IOP Edge: node listener (TLS) and admin HTTP surface."
    optParameters = [["config", "c", "etc/iop/edge.yaml", "Path to edge.yaml."], *LOG_FLAGS]

    def opt_version(self) -> None:
        """Print IOP's version (and the Python and Twisted under it), then exit."""
        print(version_line("iop-edge"))
        raise SystemExit(0)

    def postOptions(self) -> None:
        try:
            self.edge_config: EdgeConfig = load_edge_config(self["config"])
        except ConfigError as e:
            path = self["config"]
            raise usage.UsageError(config_problem(f"invalid config {path}", e, path)) from None


class EdgeService(MultiService):
    """The Edge's service tree; its parts are attributes for tests and later wiring."""

    _log = Logger()

    def __init__(self, config: EdgeConfig, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self.bus = EventBus(reactor)
        # Traces (telemetry:): the provider and its exporter thread, or nothing at all. First
        # in, last out: the drained requests' spans are flushed when everything else stopped.
        self.telemetry = build_telemetry(config.telemetry, EDGE_SERVICE_NAME, reactor)
        if self.telemetry.service is not None:
            self.telemetry.service.setServiceParent(self)
        # The provider pool observes node readiness first: fencing returns leases before the
        # dispatchers end that node's runs and tunnels. In a cluster its slots come from the
        # lease table the Edges share through Redis; alone, from its own.
        self.cluster = cluster.build(config, reactor)
        self.pool = ProviderPool(
            config, reactor, self.cluster.table if self.cluster is not None else InProcessTable()
        )
        if self.cluster is not None:
            self.cluster.setServiceParent(self)
        # The usage ledger opens its file before any listener starts, and is stopped (its last
        # records written) after they have.
        self.usage = usage_service.build(config.usage, reactor)
        if self.usage is not None:
            self.usage.setServiceParent(self)
            # One ledger record per finished generation request, off the event bus.
            self.bus.subscribe(LedgerFeed(self.usage).observe)
        # Managed mode: provider credentials leave the Edge only sealed in per-request leases.
        self.credentials = CredentialIssuer.from_config(config, reactor)
        self.link = link.build(config, self.bus, reactor, [self.pool], self.credentials)
        self.registry, self.node_factory = self.link.registry, self.link.factory
        self.runs, self.commands = self.link.runs, self.link.commands
        self.tunnels = self.link.tunnels
        self.gateway = EdgeGateway(
            config, self.pool, self.runs, self.tunnels, credentials=self.credentials
        )
        # The pusher observes readiness last (after every dispatcher).
        self.refresh = refresh.build(
            config,
            self.pool,
            self.gateway,
            self.credentials,
            self.link,
            self.bus,
            reactor,
            listeners=[self._use_config],
        )
        self.applier, self.refresher = self.refresh.applier, self.refresh.refresher
        # The client keys' limits and budgets: counted with the cluster's Redis, else here; the
        # client API reserves through the gate, the admin surface reads it (GET /limits).
        table = self.cluster.quota if self.cluster is not None else None
        self.quota = QuotaGate(config.client_api, table or InProcessQuotaTable(reactor))
        self.admin_surface = admin_service.build(
            self.snapshot,
            self.bus,
            reactor,
            self.link,
            self.pool,
            self.gateway,
            self.refresher,
            usage=self.usage,
            limits=self.quota,
            spans_dropped=(
                (lambda: self.telemetry.dropped) if self.telemetry.service is not None else None
            ),
        )
        self.admin, self.metrics = self.admin_surface.app, self.admin_surface.metrics
        self.metrics.use_config(config)
        self.client_api = ingress.build(
            self.gateway, config.client_api, self.bus, reactor, self.quota, self.telemetry.tracing
        )
        self.applier.add_listener(self.client_api.use_config)
        self.clients = self.client_api.app

    def stopService(self) -> Deferred[Any]:
        """Drain the client API (module docstring), then stop every part."""
        drained = self.client_api.drain.run(self.config.drain_timeout_sec)
        drained.addErrback(lambda failure: self._log.failure("drain failed", failure))
        return drained.addCallback(lambda _: MultiService.stopService(self))

    def _use_config(self, config: EdgeConfig) -> None:
        """The applier's switch (and its undo): the running config is this one."""
        self.config = config
        if getattr(self, "metrics", None) is not None:
            self.metrics.use_config(config)

    def snapshot(self) -> dict[str, Any]:
        view = self.cluster.view() if self.cluster is not None else None
        return snapshot(
            self.config,
            self.registry,
            self.pool,
            cluster=view,
            draining=self.client_api.drain.since,
        )


def makeService(
    options: Options,
    reactor: IReactorTime | None = None,
    open_files: OpenFiles = raise_soft_limit,
) -> IService:
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor  # type: ignore[assignment]
    config = options.edge_config
    check_managed_transport(config)
    report, caps = descriptor_caps(config, reactor, open_files)
    try:
        edge = EdgeService(config, reactor)
    except KeyFileError as e:
        raise usage.UsageError(f"managed mode: {e}") from None
    report.setName("descriptors")
    nodes = edge.link.listener(config, reactor)
    admin = edge.admin_surface.listener(config, reactor)
    join = None
    if config.client_api.reuse_port:
        # A port shared with other Edges: join it once the nodes are ready here.
        gate = JoinGate([node.id for node in config.nodes], reactor)
        edge.registry.add_observer(gate)
        join = gate.wait
    clients = edge.client_api.listener(caps, reactor, join)
    node_scheme = "tls" if config.tls is not None and not config.plaintext_nodes else "tcp"
    listeners = [
        ("clients", "http", clients),
        ("nodes", node_scheme, nodes),
        ("admin", "http", admin),
    ]
    parts = [
        nodes,
        admin,
        clients,
        report,
        edge.refresh.on_signal(reactor),
        # One line once every listener listens: the version and each one's URL.
        Banner([listener for listener in listeners if listener[2] is not None]),
        # Run by twistd: a daemon's startup objects leave the garbage collector's work.
        FrozenStartup() if options.parent is not None else None,
    ]
    for part in parts:
        if part is not None:
            part.setServiceParent(edge)
    top = for_twistd(edge, config.logging, options)
    if isinstance(top, TwistdLogging):
        edge.applier.add_listener(functools.partial(_use_logging, top))
    return top


def listen_settings(options: Options) -> dict[int, str]:
    """The port each listener setting binds (port 0 left out: it cannot be in use), for a
    startup failure to name (:mod:`iop.daemon.errors`)."""
    config = options.edge_config
    endpoints = [
        ("listen.nodes", config.node_listen),
        ("listen.admin", config.admin_listen),
        ("openai.listen", config.client_api.listen or ""),
    ]
    settings: dict[int, str] = {}
    for setting, endpoint in endpoints:
        args, _ = split_endpoint(endpoint) if endpoint else ([], {})
        if len(args) > 1 and args[0] == "tcp" and args[1].isdigit() and int(args[1]):
            settings.setdefault(int(args[1]), setting)
    return settings


def _use_logging(top: TwistdLogging, config: EdgeConfig) -> None:
    """A refresh applied: its ``logging.level`` from the next log event on."""
    top.use_logging(config.logging)
