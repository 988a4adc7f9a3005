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

Configuration is node.yaml (``--config``) or, for a one-line join, ``--edge HOST:PORT
--token-file F --ca-file F`` and friends with no file at all (``--edge`` repeated or
comma-separated for several Edges)
(:func:`iop.config.node.node_config_from_flags`); the two are exclusive. Under twistd the service
comes wrapped by :func:`iop.logs.twistd.for_twistd`: the log observer ``logging:`` (or
``--log-format``/``--log-level``) asks for.
"""

from __future__ import annotations

import atexit
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
from iop.config.model import DEFAULT_STORE_PATH, NodeDaemonConfig
from iop.config.node import DEFAULT_JOIN_SERVER_NAME, node_config_from_flags
from iop.daemon.errors import config_problem
from iop.heap import FrozenStartup
from iop.logs.twistd import LOG_FLAGS, for_twistd
from iop.node import link
from iop.node.adapters.http_client import provider_http_client
from iop.node.edges import EdgeSupervisors
from iop.node.store import RunStore, StoreExecutor, SynchronousExecutor, ThreadExecutor
from iop.node.supervisor import NodeSupervisor
from iop.runtime.interfaces import AdapterContext, TreqClient
from iop.security.keys import KeyFileError, load_issuer_public, load_recipient_private
from iop.security.lease import NodeLeaseKeys
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
# The one-line join flags (everything but --edge needs --edge; none goes with --config).
_JOIN_FLAGS = ("token-file", "ca-file", "server-name", "cert-file", "key-file", "store")


class Options(usage.Options):
    synopsis = (
        "[--config PATH] | --edge HOST:PORT --token-file FILE --ca-file FILE"
        " [--server-name NAME] [--cert-file FILE --key-file FILE] [--store URI]"
    )
    longdesc = (
        "Run an IOP Node: dial the Edge, register, apply the config it sends, serve. Configure"
        " it with node.yaml (--config, default etc/iop/node.yaml) or, without any file, with"
        " --edge and the flags after it (everything else defaulted as in node.yaml). Several"
        " Edges (node.yaml edges:, or --edge repeated): one session each, the others serving"
        " while one is lost."
    )
    optParameters = [
        ["config", "c", None, f"Path to node.yaml (default {DEFAULT_CONFIG_PATH})."],
        ["edge", None, None, _EDGE_HELP],
        ["token-file", None, None, "With --edge: file holding this node's token (one line)."],
        ["ca-file", None, None, "With --edge: CA certificate that issued the Edge's certificate."],
        [
            "server-name",
            None,
            None,
            f"With --edge: the Edge's workload name (default {DEFAULT_JOIN_SERVER_NAME}).",
        ],
        ["cert-file", None, None, "With --edge: this node's client certificate (mTLS)."],
        ["key-file", None, None, "With --edge: the client certificate's private key."],
        [
            "store",
            None,
            None,
            f"With --edge: the run store's SQLite URI (default {DEFAULT_STORE_PATH!r}).",
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
        if self["edge"] is None:
            given = [f"--{flag}" for flag in _JOIN_FLAGS if self[flag] is not None]
            if given:
                raise usage.UsageError(f"{', '.join(given)} only go with --edge HOST:PORT")
            path = self["config"] or DEFAULT_CONFIG_PATH
            try:
                self.node_config: NodeDaemonConfig = load_node_config(path)
            except ConfigError as e:
                raise usage.UsageError(config_problem(f"invalid config {path}", e, path)) from None
            return
        if self["config"] is not None:
            raise usage.UsageError(
                "give either --config (node.yaml) or --edge and its flags, not both"
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
            )
        except ConfigError as e:
            raise usage.UsageError(config_problem("invalid flags", e)) from None


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
    adapter_context = AdapterContext(reactor=reactor, http=http)
    supervisors = link.build(config, endpoints, reactor, adapter_context, store, leases)
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
    node.setServiceParent(top)
    supervisors.when_finished().addCallback(finished)
    if options.parent is not None:
        # Run by twistd: a daemon's startup objects leave the garbage collector's work.
        FrozenStartup().setServiceParent(top)
    return for_twistd(top, config.logging, options)
