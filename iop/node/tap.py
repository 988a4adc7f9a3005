# -*- test-case-name: iop.test.node.test_tap -*-
"""
``twistd iop-node``: options and the service tree.

The node's service opens its local run store (:class:`~iop.node.store.RunStore`, at
``store.path``) and, once it is open, starts the links to the Edges it dials
(:func:`iop.node.link.build`: one supervised session per Edge, ``edge:`` is one, ``edges:``
several). A store that cannot be opened is fatal (exit 1). The store, the providers' HTTP client
and the lease keys are the same for every Edge's sessions. At shutdown the supervisors stop
first, then the store closes.

In managed mode (``security.mode: managed``) the node loads its recipient private key and the
issuer's public key at startup (:func:`lease_keys`); a missing or unusable key file is a usage
error naming the file, and the node does not start.

When the supervisors have all finished with a non-zero code (fatal error, exhausted finite
reconnect policy: every Edge lost) the reactor is stopped and the process exits with that code
once twistd has cleaned up; while one Edge's session is still supervised the node keeps serving.
A local shutdown (SIGTERM/SIGINT) exits 0.

Configuration is node.yaml (``--config``) or, with no file at all, flags
(:func:`iop.config.node.node_config_from_flags`): ``--join STRING`` (or ``--join-file F``), the
join string ``iop node add`` / ``iop token new --edge`` print (:mod:`iop.config.join`: the Edge's
address, the token and the pin of its CA — no CA file, the node checks the CA the Edge presents
against the pin), or ``--edge HOST:PORT --token-file F --ca-file F`` (``--edge`` repeated or
comma-separated for several Edges). The three are exclusive. ``--server-name``, ``--cert-file``/
``--key-file`` and ``--store`` go with either flag form. What ``--join`` covers: a legacy-mode
node; a managed node (``security.mode: managed``) also needs its lease keys, which only node.yaml
configures (there ``edge.ca_sha256`` takes the pin instead of ``ca_file``).

``--reconnect forever|off|N`` (and ``--reconnect-interval SEC``) set node.yaml's ``reconnect:``
policy from the command line, over node.yaml's own or with the flags: ``forever`` retries until
stopped (``max_attempts: 0``), ``off`` makes one attempt, N gives up after N consecutive failed
attempts. Errors retrying cannot fix (an unknown token, the Edge's certificate refused, not an
Edge at that address) end the node at once whatever the policy.

A local shutdown drains first (:mod:`iop.node.drain`): the node tells its Edges, takes no new
work, lets what runs finish for up to ``drain_timeout_sec`` (``--drain-timeout``; 0 = not at
all), then closes its sessions; the supervisors stop after that.

With ``telemetry:`` (:mod:`iop.telemetry`) the node exports its spans (each run and tunnel,
their upstream calls, a CLI agent's process) over OTLP/HTTP; the telemetry service is the
first child of the tree, so it stops last and flushes the drained work's spans.

Under twistd the service comes wrapped by :func:`iop.logs.twistd.for_twistd`: the log observer
``logging:`` (or ``--log-format``/``--log-level``) asks for.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool

from iop.config import ConfigError, load_node_config
from iop.config.join import JoinString, JoinStringError
from iop.config.join import decode as decode_join
from iop.config.model import DEFAULT_STORE_PATH, NODE_SERVICE_NAME, NodeDaemonConfig
from iop.config.node import DEFAULT_JOIN_SERVER_NAME, node_config_from_flags, reconnect_attempts
from iop.daemon.errors import config_problem
from iop.heap import FrozenStartup
from iop.logs.twistd import LOG_FLAGS, for_twistd
from iop.node import link
from iop.node.adapters.http_client import provider_http_client
from iop.node.drain import NodeDrain
from iop.node.edges import EdgeSupervisors
from iop.node.store import RunStore, StoreExecutor, SynchronousExecutor, ThreadExecutor
from iop.node.supervisor import NodeSupervisor
from iop.runtime.interfaces import AdapterContext, TreqClient
from iop.security.keys import KeyFileError, load_issuer_public, load_recipient_private
from iop.security.lease import NodeLeaseKeys
from iop.telemetry.provider import build as build_telemetry
from iop.version import version_line

# Idle keep-alive connections kept per upstream (host, port). Twisted's default is 2: every
# request beyond the second concurrent one would dial, and then close, its own TCP connection.
UPSTREAM_KEEPALIVE_PER_HOST = 256

log = Logger()


DEFAULT_CONFIG_PATH = "etc/iop/node.yaml"
_EDGE_HELP = (
    "Join without node.yaml: the Edge's listen.nodes HOST:PORT (repeat it, or comma-separate,"
    " to dial several Edges)."
)
# The flags that stand for node.yaml (with --edge or --join; none goes with --config).
_JOIN_FLAGS = ("token-file", "ca-file", "server-name", "cert-file", "key-file", "store")


class Options(usage.Options):
    synopsis = (
        "[--config PATH] | --join STRING | --edge HOST:PORT --token-file FILE --ca-file FILE"
        " [--server-name NAME] [--cert-file FILE --key-file FILE] [--store URI]"
        " [--reconnect forever|off|N] [--drain-timeout SEC]"
    )
    longdesc = (
        "Run an IOP Node: dial the Edge, register, apply the config it sends, serve. Configure"
        " it with node.yaml (--config, default etc/iop/node.yaml) or, without any file, with"
        " --join and the join string `iop node add NODE_ID` printed on the Edge's side (it"
        " carries the Edge's address, this node's token and the pin of the Edge's CA), or with"
        " --edge and the flags after it (everything else defaulted as in node.yaml). Several"
        " Edges (node.yaml edges:, or --edge repeated): one session each, the others serving"
        " while one is lost."
    )
    optParameters = [
        ["config", "c", None, f"Path to node.yaml (default {DEFAULT_CONFIG_PATH})."],
        [
            "join",
            None,
            None,
            "Join without node.yaml: the join string from `iop node add NODE_ID` (it holds the"
            " token: on a shared host prefer --join-file).",
        ],
        ["join-file", None, None, "Like --join, the join string read from this file."],
        [
            "reconnect",
            None,
            None,
            "forever, off (one attempt) or N (give up after N consecutive failed attempts);"
            " overrides node.yaml reconnect.max_attempts (default 10).",
        ],
        [
            "drain-timeout",
            None,
            None,
            "Seconds a stopping node lets its runs and tunnels in flight finish (0: close at"
            " once); overrides node.yaml drain_timeout_sec (default 30).",
        ],
        [
            "reconnect-interval",
            None,
            None,
            "Seconds between attempts; overrides node.yaml reconnect.interval_sec (default 10).",
        ],
        ["edge", None, None, _EDGE_HELP],
        ["token-file", None, None, "With --edge: file holding this node's token (one line)."],
        ["ca-file", None, None, "With --edge: CA certificate that issued the Edge's certificate."],
        [
            "server-name",
            None,
            None,
            "With --edge or --join: the Edge's workload name (default"
            f" {DEFAULT_JOIN_SERVER_NAME}, or the join string's).",
        ],
        ["cert-file", None, None, "With --edge or --join: this node's client certificate (mTLS)."],
        ["key-file", None, None, "With --edge or --join: the client certificate's private key."],
        [
            "store",
            None,
            None,
            f"With --edge or --join: the run store's SQLite URI (default {DEFAULT_STORE_PATH!r}).",
        ],
        *LOG_FLAGS,
    ]

    def opt_edge(self, value: str) -> None:
        # --edge accumulates (the optParameters entry above gives its default None).
        given: list[str] = self["edge"] or []
        self["edge"] = [*given, value]

    opt_edge.__doc__ = _EDGE_HELP  # what --help shows for a method-handled option

    def opt_version(self) -> None:
        """Print IOP's version (and the Python and Twisted under it), then exit."""
        print(version_line("iop-node"))
        raise SystemExit(0)

    def postOptions(self) -> None:
        join = self.join = self._join()
        if self["edge"] is None and join is None:
            given = [f"--{flag}" for flag in _JOIN_FLAGS if self[flag] is not None]
            if given:
                raise usage.UsageError(
                    f"{', '.join(given)} only go with --join STRING or --edge HOST:PORT"
                )
            path = self["config"] or DEFAULT_CONFIG_PATH
            try:
                self.node_config: NodeDaemonConfig = load_node_config(path)
            except ConfigError as e:
                raise usage.UsageError(config_problem(f"invalid config {path}", e, path)) from None
            self.node_config = self._drain(self._reconnect(self.node_config))
            return
        if self["config"] is not None:
            raise usage.UsageError(
                "give either --config (node.yaml) or --join / --edge and their flags, not both"
            )
        try:
            self.node_config = node_config_from_flags(
                edge=self["edge"],
                token_file=self["token-file"],
                ca_file=self["ca-file"],
                server_name=self["server-name"],
                cert_file=self["cert-file"],
                key_file=self["key-file"],
                store=self["store"],
                join=join,
            )
        except ConfigError as e:
            raise usage.UsageError(config_problem("invalid flags", e)) from None
        self.node_config = self._drain(self._reconnect(self.node_config))

    def _drain(self, config: NodeDaemonConfig) -> NodeDaemonConfig:
        """``config`` with --drain-timeout over its ``drain_timeout_sec``."""
        given = self["drain-timeout"]
        if given is None:
            return config
        try:
            seconds = float(given)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise usage.UsageError(
                f"--drain-timeout {given!r}: must be a number of seconds, 0 or more"
            )
        return dataclasses.replace(config, drain_timeout_sec=seconds)

    def _join(self) -> JoinString | None:
        """The decoded --join / --join-file string, if one was given."""
        text, flag = self["join"], "--join"
        if self["join-file"] is not None:
            if text is not None:
                raise usage.UsageError("give either --join or --join-file, not both")
            flag = "--join-file"
            try:
                with open(self["join-file"], encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise usage.UsageError(
                    f"--join-file {self['join-file']}: cannot read: {e.strerror or e}"
                ) from None
        if text is None:
            return None
        try:
            return decode_join(text)
        except JoinStringError as e:
            raise usage.UsageError(f"{flag}: {e}") from None

    def _reconnect(self, config: NodeDaemonConfig) -> NodeDaemonConfig:
        """``config`` with --reconnect / --reconnect-interval over its ``reconnect:``."""
        policy = config.reconnect
        if self["reconnect"] is not None:
            try:
                attempts = reconnect_attempts(self["reconnect"])
            except ValueError as e:
                raise usage.UsageError(f"--reconnect {self['reconnect']!r}: {e}") from None
            policy = dataclasses.replace(policy, max_attempts=attempts)
        if self["reconnect-interval"] is not None:
            try:
                interval = float(self["reconnect-interval"])
            except ValueError:
                interval = 0.0
            if not interval > 0 or interval == float("inf"):
                raise usage.UsageError(
                    f"--reconnect-interval {self['reconnect-interval']!r}: must be a number of "
                    "seconds above 0"
                )
            policy = dataclasses.replace(policy, interval_sec=interval)
        return dataclasses.replace(config, reconnect=policy)


def lease_keys(config: NodeDaemonConfig) -> NodeLeaseKeys | None:
    """
    A managed node's lease keys (None in legacy mode), loaded from ``security``'s files;
    :class:`usage.UsageError` naming what is missing or which file is unusable.
    """
    security = config.security
    if not security.managed:
        return None
    missing = [
        name
        for name, value in (
            ("security.recipient_key_file", security.recipient_key_file),
            ("security.issuer_key_file", security.issuer_key_file),
        )
        if not value
    ]
    if missing:
        raise usage.UsageError(f"security.mode managed needs {' and '.join(missing)}")
    assert security.recipient_key_file and security.issuer_key_file
    try:
        keys = NodeLeaseKeys(
            recipient=load_recipient_private(security.recipient_key_file),
            issuer=load_issuer_public(security.issuer_key_file),
            clock_skew_sec=security.clock_skew_sec,
        )
    except KeyFileError as e:
        raise usage.UsageError(f"managed mode: {e}") from None
    log.info(
        "managed mode: opening credential leases with {kem} recipient key {recipient_key_id},"
        " signed by issuer key {issuer_key_id} (clock skew {skew}s)",
        kem=keys.recipient.kem,
        recipient_key_id=keys.recipient.key_id,
        issuer_key_id=keys.issuer.key_id,
        skew=security.clock_skew_sec,
    )
    return keys


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
            reactor.addSystemEventTrigger("after", "shutdown", self._forget_signal, reactor)

    @staticmethod
    def _forget_signal(reactor: Any) -> None:
        # twistd reads reactor._exitSignal after the reactor stops and kills itself with it.
        if getattr(reactor, "_exitSignal", None) is not None:
            reactor._exitSignal = None

    def _exit(self) -> None:
        if self.code:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.code)


class NodeService(Service):
    """
    Opens the run store, then starts the supervisors; stops them, then closes the store.
    ``on_fatal(1)`` is called when the store cannot be opened (no supervisor starts).
    """

    def __init__(
        self,
        store: RunStore,
        supervisor: EdgeSupervisors | NodeSupervisor,
        on_fatal: Callable[[int], None],
        http_pool: HTTPConnectionPool | None = None,
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self._on_fatal = on_fatal
        self._http_pool = http_pool
        self._supervisor_started = False

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.store.open().addCallbacks(self._store_opened, self._store_failed)

    def _store_opened(self, _: int) -> None:
        if not self.running:
            return
        self._supervisor_started = True
        self.supervisor.startService()

    def _store_failed(self, failure: Failure) -> None:
        log.error(
            "cannot open the run store at {uri}: {error}",
            uri=self.store.uri,
            error=failure.getErrorMessage(),
        )
        self._on_fatal(1)

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        stopped: Deferred[None] = (
            self.supervisor.stopService() if self._supervisor_started else succeed(None)
        )

        def clean_up(_: object) -> Deferred[None]:
            if self._http_pool is not None:
                self._http_pool.closeCachedConnections()
            return self.store.close()

        return stopped.addBoth(clean_up)


def makeService(
    options: Options,
    reactor: Any = None,
    store_executor: StoreExecutor | None = None,
    http: TreqClient | None = None,
) -> IService:
    """
    The node's service tree. ``reactor``, ``store_executor`` and ``http`` (the adapters' and the
    provider tunnel's HTTP client) are the collaborators; by default the global reactor, a
    thread executor (inline on a reactor without threads) and the node's treq client
    (:func:`~iop.node.adapters.http_client.provider_http_client`) on a persistent connection
    pool of :data:`UPSTREAM_KEEPALIVE_PER_HOST` per host, closed at stop.
    """
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor
    config = options.node_config
    join: JoinString | None = getattr(options, "join", None)
    if join is not None:
        tls = config.edges[0].tls
        log.info(
            "joining {edges} with a join string: the Edge's CA is the one pinned as {pin},"
            " its certificate must name {server_name}",
            edges=", ".join(edge.name for edge in config.edges),
            pin=join.ca_pin,
            server_name=tls.server_name if tls is not None else "?",
        )
    endpoints = link.edge_endpoints(config, reactor)
    leases = lease_keys(config)
    if store_executor is None:
        # A reactor without threads (a test's memory reactor) runs the store inline.
        store_executor = (
            ThreadExecutor(reactor)
            if IReactorFromThreads.providedBy(reactor)
            else SynchronousExecutor()
        )
    store = RunStore(config.store_path, reactor, store_executor)
    http_pool: HTTPConnectionPool | None = None
    if http is None:
        http_pool = HTTPConnectionPool(reactor, persistent=True)
        http_pool.maxPersistentPerHost = UPSTREAM_KEEPALIVE_PER_HOST
        http = provider_http_client(reactor, http_pool)
    telemetry = build_telemetry(config.telemetry, NODE_SERVICE_NAME, reactor)
    adapter_context = AdapterContext(reactor=reactor, http=http, tracing=telemetry.tracing)
    drain = NodeDrain(reactor, config.drain_timeout_sec)
    supervisors = link.build(config, endpoints, reactor, adapter_context, store, leases, drain)
    exit_ = _ProcessExit(reactor)

    def finished(code: int) -> None:
        if code == 0:
            return
        log.error("node stopping with exit code {code}", code=code)
        exit_.code = code
        if reactor.running:
            reactor.stop()

    node = NodeService(store, supervisors, finished, http_pool)
    node.setName("node")
    top = MultiService()
    if telemetry.service is not None:
        # First in, last out: the spans of the work the node drains on stop are flushed too.
        telemetry.service.setServiceParent(top)
    node.setServiceParent(top)
    supervisors.when_finished().addCallback(finished)
    if options.parent is not None:
        # Run by twistd: a daemon's startup objects leave the garbage collector's work.
        FrozenStartup().setServiceParent(top)
    return for_twistd(top, config.logging, options)
