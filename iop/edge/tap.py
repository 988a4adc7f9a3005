# -*- test-case-name: iop.test.edge.test_tap -*-
"""
``twistd iop-edge``: options and the service tree.

``makeService(options, reactor=...)`` wires config → registry → node listener (TLS unless the
config explicitly asks for loopback plaintext), the Klein admin listener and, when
``openai.listen`` is set, the client API listener (OpenAI- and Anthropic-compatible) into a
MultiService. Every finished client request publishes a
:class:`~iop.edge.events.RequestFinished` on the event bus.

Live config refresh (:mod:`iop.edge.refresh`): the service builds a
:class:`~iop.edge.refresh.service.ConfigRefresher` over the config file it was started with —
``POST /config/refresh`` on the admin listener, and SIGHUP to the process (an apply, its result
logged; a broken file leaves the Edge serving on its running config). After an apply the new
config is :attr:`EdgeService.config`.

Managed mode (``security.mode: managed``) will not start without mTLS on the node listener:
node TLS with a client CA, so that every node presents a certificate the registry can check.

Open files (:mod:`iop.edge.descriptors`): at start the Edge reads ``RLIMIT_NOFILE``, raises
its soft limit toward the hard one as far as ``openai.max_connections`` asks, keeps a reserve
for its nodes, the admin listener and itself, and caps the client listener below the rest; one
start log line says what it took, and a warning names each config value it had to clamp.

Under twistd the service comes wrapped by :func:`iop.logs.twistd.for_twistd`: the log observer
``logging:`` (or ``--log-format``/``--log-level``) asks for; a refresh switches its level.
"""

from __future__ import annotations

import functools
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.web.server import Site

from iop.config import ConfigError, load_edge_config
from iop.config.model import EdgeConfig
from iop.edge.accesslog import AccessLog
from iop.edge.admin import AdminApp
from iop.edge.admin_auth import protect
from iop.edge.cluster import service as cluster
from iop.edge.commands import NodeCommander
from iop.edge.console import ConsoleEvents, public_shell
from iop.edge.credentials import CredentialIssuer
from iop.edge.descriptors import OpenFiles, descriptor_caps, raise_soft_limit
from iop.edge.events import EventBus
from iop.edge.gateway import EdgeGateway
from iop.edge.ingress.app import ClientApp
from iop.edge.ingress.listen import ObservedEndpoint, ReusePortUnavailable, client_endpoint
from iop.edge.leasetable import InProcessTable
from iop.edge.metrics import EdgeMetrics
from iop.edge.payload import build_node_payload
from iop.edge.pool import ProviderPool
from iop.edge.refresh.apply import LiveApplier
from iop.edge.refresh.classify import classify
from iop.edge.refresh.push import NodePusher
from iop.edge.refresh.service import ConfigRefresher, RefreshOnSignal
from iop.edge.registry import NodeRegistry
from iop.edge.runs import RunDispatcher
from iop.edge.status import snapshot
from iop.edge.transport import NodeConnectionFactory
from iop.edge.tunnel import TunnelDispatcher
from iop.heap import FrozenStartup
from iop.logs.twistd import LOG_FLAGS, TwistdLogging, for_twistd
from iop.security.keys import KeyFileError
from iop.security.tls import TLSConfigError, server_context_factory


class Options(usage.Options):
    synopsis = "--config PATH"
    longdesc = "Run the IOP Edge: node listener (TLS) and admin HTTP surface."
    optParameters = [["config", "c", "etc/iop/edge.yaml", "Path to edge.yaml."], *LOG_FLAGS]

    def postOptions(self) -> None:
        try:
            self.edge_config: EdgeConfig = load_edge_config(self["config"])
        except ConfigError as e:
            raise usage.UsageError(f"invalid config {self['config']}:\n{e}") from None


class EdgeService(MultiService):
    """The Edge's service tree; its parts are attributes for tests and later wiring."""

    def __init__(self, config: EdgeConfig, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self._clock = reactor
        self.bus = EventBus(reactor)
        # The provider pool observes node readiness first: fencing returns leases before the
        # dispatchers end that node's runs and tunnels. In a cluster its slots come from the
        # lease table the Edges share through Redis; alone, from its own.
        self.cluster = cluster.build(config, reactor)
        self.pool = ProviderPool(
            config, reactor, self.cluster.table if self.cluster is not None else InProcessTable()
        )
        if self.cluster is not None:
            self.cluster.setServiceParent(self)
        # Managed mode: provider credentials leave the Edge only sealed in per-request leases;
        # a registering node must announce the lease keys this issuer seals to and signs for.
        self.credentials = CredentialIssuer.from_config(config, reactor)
        self.registry = NodeRegistry(
            config,
            lambda node: build_node_payload(config, node),
            self.bus,
            reactor,
            [self.pool],
            lease_check=(
                self.credentials.lease_support_problem if self.credentials is not None else None
            ),
        )
        self.node_factory = NodeConnectionFactory(
            self.registry,
            reactor,
            heartbeat_interval=config.heartbeat.interval_sec,
            heartbeat_timeout=config.heartbeat.timeout_sec,
            register_timeout=config.register_timeout_sec,
            max_frame_bytes=config.max_frame_bytes,
        )
        # The services send on the node connection itself (INodeConnection.send_envelope).
        self.runs = RunDispatcher(config, self.registry, reactor)
        self.commands = NodeCommander(self.registry, reactor)
        # Provider raw tunnels: registered as a lifecycle observer, so a fenced node ends them.
        self.tunnels = TunnelDispatcher(self.registry, reactor)
        handlers = self.node_factory.handlers
        handlers["run_event"] = lambda conn, env: self.runs.run_event(conn, env.run_event)
        handlers["node_command_response"] = lambda conn, env: self.commands.command_response(
            conn, env.node_command_response
        )
        handlers["cancel_response"] = lambda conn, env: self.commands.cancel_response(
            conn, env.cancel_response
        )
        handlers["provider_tunnel_frame"] = lambda conn, env: self.tunnels.frame(
            conn, env.provider_tunnel_frame
        )
        self.gateway = EdgeGateway(
            config,
            self.pool,
            self.runs,
            self.tunnels,
            credentials=self.credentials,
        )
        # Every finished client request is published on the bus (metrics, access log).
        self.clients = ClientApp(self.gateway, config.client_api, reactor, self.bus.publish)
        # Live config refresh: the applier switches the running parts, the pusher tells the
        # ready nodes; the pusher observes readiness last (after every dispatcher).
        self.applier = LiveApplier(
            config,
            self.pool,
            self.gateway,
            self.credentials,
            self.registry,
            listeners=[self._use_config],
        )
        self.pusher = NodePusher(
            self.registry,
            self.applier.payload,
            self.bus,
            reactor,
            node_ids=lambda: [n.id for n in self.config.nodes],
        )
        pusher = self.pusher
        handlers["node_config_refresh_response"] = lambda conn, env: pusher.response_received(
            conn, env.node_config_refresh_response
        )
        # A config read from a file can be read again (a config built in code cannot).
        self.refresher: ConfigRefresher | None = None
        if config.source_path:
            source = config.source_path
            self.refresher = ConfigRefresher(
                lambda: load_edge_config(source), classify, self.applier, self.pusher, reactor
            )
        # Prometheus metrics: state read from the status snapshot, counts off the bus.
        self.metrics = EdgeMetrics(
            self.snapshot,
            self.bus.dropped,
            pool_stats=self.pool.stats,
            registry_stats=self.registry.stats,
            tunnel_stats=self.tunnels.stats,
            run_stats=self.runs.stats,
            echo_stats=self.tunnels.echo_stats,
            tls_refusal_stats=self.node_factory.tls_refusals.stats,
        )
        self.bus.subscribe(self.metrics.observe)
        # One access log line per finished client request.
        self.access_log = AccessLog()
        self.bus.subscribe(self.access_log.observe)
        self.admin = AdminApp(
            self.snapshot,
            self.runs,
            self.commands,
            self.tunnels,
            self.gateway,
            self.refresher,
            metrics=self.metrics,
            console=ConsoleEvents(self.bus.subscribe, reactor),
        )

    def _use_config(self, config: EdgeConfig) -> None:
        """The applier's switch (and its undo): the running config is this one."""
        self.config = config

    def snapshot(self) -> dict[str, Any]:
        view = self.cluster.view() if self.cluster is not None else None
        return snapshot(self.config, self.registry, self.pool, cluster=view)


class AdminSite(Site):
    """The admin listener's ``Site``: its reads (``/status``, ``/metrics``, the console's
    polls, every few seconds) are not logged one line each; its writes (runs, commands,
    refreshes) are."""

    def log(self, request: Any) -> None:
        if request.method not in (b"GET", b"HEAD"):
            super().log(request)


def check_managed_transport(config: EdgeConfig) -> None:
    """
    Managed mode needs node TLS with a client CA (mTLS); the config loader refuses the rest
    already, this is the service's own guard.

    @raise usage.UsageError: naming what is missing.
    """
    if not config.security.managed:
        return
    if config.tls is None or config.plaintext_nodes:
        raise usage.UsageError(
            "security.mode managed: node_transport.tls is required (plaintext node transport "
            "cannot carry workload identity)"
        )
    if config.tls.client_ca_file is None:
        raise usage.UsageError(
            "security.mode managed: node_transport.tls.client_ca_file is required (mTLS: nodes "
            "prove their workload name with a client certificate from that CA)"
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

    node_factory: Any = edge.node_factory
    if config.tls is not None and not config.plaintext_nodes:
        try:
            context_factory = server_context_factory(config.tls)
        except TLSConfigError as e:
            raise usage.UsageError(str(e)) from None
        node_factory = TLSMemoryBIOFactory(context_factory, False, edge.node_factory)
    nodes = StreamServerEndpointService(
        serverFromString(reactor, config.node_listen_endpoint), node_factory
    )
    nodes._raiseSynchronously = True
    nodes.setName("nodes")
    nodes.setServiceParent(edge)

    admin_app = edge.admin.resource()
    admin = StreamServerEndpointService(
        serverFromString(reactor, config.admin_listen_endpoint),
        AdminSite(public_shell(protect(admin_app, config.admin), admin_app)),
    )
    admin._raiseSynchronously = True
    admin.setName("admin")
    admin.setServiceParent(edge)

    if config.client_api.listen:
        try:
            # openai.reuse_port: a port shared with this host's other Edge processes.
            client_listen = client_endpoint(reactor, config.client_api)
        except ReusePortUnavailable as e:
            raise usage.UsageError(str(e)) from None
        site = edge.clients.site(caps)
        clients = StreamServerEndpointService(ObservedEndpoint(client_listen, site.listening), site)
        clients._raiseSynchronously = True
        clients.setName("clients")
        clients.setServiceParent(edge)

    report.setName("descriptors")
    report.setServiceParent(edge)

    if edge.refresher is not None and IReactorFromThreads.providedBy(reactor):
        sighup = RefreshOnSignal(edge.refresher, reactor)
        sighup.setName("sighup")
        sighup.setServiceParent(edge)
    if options.parent is not None:
        # Run by twistd: a daemon's startup objects leave the garbage collector's work.
        FrozenStartup().setServiceParent(edge)
    top = for_twistd(edge, config.logging, options)
    if isinstance(top, TwistdLogging):
        edge.applier.add_listener(functools.partial(_use_logging, top))
    return top


def _use_logging(top: TwistdLogging, config: EdgeConfig) -> None:
    """A refresh applied: its ``logging.level`` from the next log event on."""
    top.use_logging(config.logging)
