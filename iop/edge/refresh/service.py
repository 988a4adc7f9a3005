# -*- test-case-name: iop.test.edge.refresh.test_service -*-
"""
The one code path behind every way into a config refresh — ``POST /config/refresh`` on the
admin listener, ``iop config refresh`` (which calls that endpoint) and SIGHUP to ``iop-edge``:
:class:`ConfigRefresher`, and :class:`RefreshOnSignal`, the service that turns SIGHUP into an
apply.

``refresh(mode)``:

1. an unknown mode is ``rejected`` (nothing is read);
2. the Edge's config file is read again and validated by the config loader (every rule, the
   same messages); a file that does not load is ``rejected`` with the loader's messages in
   ``errors``, and nothing changes;
3. the candidate is classified against the running config; ``dry_run`` stops here and answers
   the classification (``applied`` meaning "would apply");
4. ``apply``: any restart-required or rejected change answers that result and applies nothing
   (its reports say which changes block); otherwise the applier switches every live change at
   once — an applier that raises is ``rejected`` and has changed nothing;
5. the ready nodes whose payload changed are pushed the new payload — sent inside the apply,
   after the switch and before the pool's first grant under the new config, so a node has
   its gate resized before the work a raised capacity lets through reaches it — and their
   answers awaited (each bounded by the pusher's timeout); the result is ``applied`` with
   ``node_pushes``.

Refreshes are serialized: one that arrives while another runs waits for it, then reads the file
itself, so the last edit is always the one that ends up applied and each caller gets its own
answer. Every result is logged, one line per error, report and node push (reports carry display
values only: a secret is ``<secret changed>``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.config import ConfigError
from iop.config.model import EdgeConfig
from iop.edge.refresh.report import MODES, ChangeReport, NodePush, RefreshResult, rejected_result
from iop.security.redact import redact_secrets

__all__ = [
    "Applier",
    "Classify",
    "ConfigRefresher",
    "Decide",
    "Load",
    "Pusher",
    "RefreshOnSignal",
]

#: Reads and validates the Edge's config file again; raises ConfigError.
Load = Callable[[], EdgeConfig]
#: Every change from the running config to a candidate, classified.
Classify = Callable[[EdgeConfig, EdgeConfig], list[ChangeReport]]
#: The outcome of a classified candidate (``iop.edge.refresh.classify.candidate_result``).
Decide = Callable[[str, list[ChangeReport]], RefreshResult]


class Applier(Protocol):
    """The running Edge parts a live candidate switches (``LiveApplier``)."""

    @property
    def config(self) -> EdgeConfig:
        "The running config."

    @property
    def generation(self) -> int:
        "The running config's generation: 1 at start, one more per apply."

    def apply(
        self, candidate: EdgeConfig, before_grants: Callable[[list[str]], object] | None = None
    ) -> list[str] | None:
        """
        Switch every live change of ``candidate`` at once, or raise having changed nothing;
        returns the ids of the nodes whose ``NodeConfigPayload`` changed, after calling
        ``before_grants`` with them (if given) between the switch and the first grant under
        the new config.
        """


class Pusher(Protocol):
    """Pushes the current payload to ready nodes (:class:`~iop.edge.refresh.push.NodePusher`)."""

    def push(self, node_ids: Iterable[str]) -> Deferred[list[NodePush]]:
        "One outcome per ready node pushed."


class ConfigRefresher:
    """See the module docstring."""

    log = Logger()

    def __init__(
        self,
        load: Load,
        classify: Classify,
        applier: Applier,
        pusher: Pusher,
        clock: IReactorTime,
        decide: Decide | None = None,
    ) -> None:
        if decide is None:
            from iop.edge.refresh.classify import candidate_result

            decide = candidate_result
        self._load = load
        self._classify = classify
        self._decide = decide
        self._applier = applier
        self._pusher = pusher
        self._clock = clock
        self._lock = DeferredLock()

    @property
    def busy(self) -> bool:
        """Whether a refresh is running now."""
        return bool(self._lock.locked)

    def refresh(self, mode: str, trigger: str = "admin API") -> Deferred[RefreshResult]:
        """
        Refresh in ``mode`` (``dry_run`` or ``apply``); fires with the result document, never
        fails. ``trigger`` names the way in for the log.
        """

        async def serialized() -> RefreshResult:
            await self._lock.acquire()
            try:
                started = self._clock.seconds()
                result = await self._refresh(mode)
                self._log_result(result, trigger, self._clock.seconds() - started)
                return result
            finally:
                self._lock.release()

        return Deferred.fromCoroutine(serialized())

    async def _refresh(self, mode: str) -> RefreshResult:
        if mode not in MODES:
            return rejected_result(
                mode, [f"unknown refresh mode {mode!r}: use {' or '.join(MODES)}"]
            )
        try:
            candidate = self._load()
        except ConfigError as e:
            return rejected_result(mode, [str(issue) for issue in e.issues] or [str(e)])
        except Exception as e:
            self.log.failure("config refresh: loading the config file failed")
            return rejected_result(
                mode, [f"the config file could not be loaded: {type(e).__name__}"]
            )
        try:
            result = self._decide(mode, self._classify(self._applier.config, candidate))
        except Exception as e:
            self.log.failure("config refresh: classifying the candidate failed")
            return rejected_result(
                mode, [f"the candidate could not be classified: {type(e).__name__}"]
            )
        if mode != "apply" or result.result != "applied":
            return result
        pushing: list[Deferred[list[NodePush]]] = []

        def push_before_grants(nodes: list[str]) -> None:
            pushing.append(self._pusher.push(nodes))

        try:
            changed = self._applier.apply(candidate, push_before_grants)
        except Exception as e:
            if isinstance(e, ValueError):
                # The applier's own refusal (a change it cannot make live): no traceback.
                self.log.warn(
                    "config refresh: the applier refused the candidate: {error}",
                    error=_message(e),
                )
            else:
                self.log.failure("config refresh: apply failed; the running config is unchanged")
            result.result = "rejected"
            result.errors.append(f"apply failed, nothing changed: {_message(e)}")
            return result
        nodes = result.changed_nodes if changed is None else changed
        try:
            pushed = pushing[0] if pushing else self._pusher.push(nodes)
            result.node_pushes = list(await pushed)
        except Exception as e:
            self.log.failure("config refresh: pushing to the nodes failed")
            result.errors.append(f"applied, but the node push failed: {type(e).__name__}")
        return result

    def _log_result(self, result: RefreshResult, trigger: str, took: float) -> None:
        level = self.log.info if result.result == "applied" else self.log.warn
        lines = result.describe()
        level(
            "{line} [{trigger}, generation {generation}, {took:.3f} s]",
            line=lines[0],
            trigger=trigger,
            generation=self._applier.generation,
            took=took,
            result=result.result,
            mode=result.mode,
        )
        for line in lines[1:]:
            level("config refresh: {line}", line=line)


def _message(e: BaseException) -> str:
    text = redact_secrets(str(e))
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- SIGHUP -----------------------------------------------------------------------------------

# signal.signal's shape: install a handler, return the previous one.
InstallSignal = Callable[[int, Any], Any]


class RefreshOnSignal(Service):
    """
    SIGHUP (by default) to the process applies the config file again: the handler is installed
    when the service starts and the previous one restored when it stops. The signal handler only
    schedules the refresh on the reactor thread (``callFromThread``); the refresher logs its
    result, and a file that does not load leaves the Edge serving on its running config.
    """

    log = Logger()

    def __init__(
        self,
        refresher: ConfigRefresher,
        reactor: Any,
        signum: int | None = getattr(signal, "SIGHUP", None),
        install: InstallSignal = signal.signal,
    ) -> None:
        self._refresher = refresher
        self._reactor = reactor
        self._signum = signum
        self._install = install
        self._previous: Any = None
        self._installed = False

    def startService(self) -> None:
        super().startService()
        if self._signum is None:
            return
        try:
            self._previous = self._install(self._signum, self._received)
        except ValueError as e:  # not the main thread
            self.log.warn("config refresh on signal not installed: {error}", error=str(e))
            return
        self._installed = True

    def stopService(self) -> None:
        if self._installed and self._signum is not None:
            self._install(
                self._signum, self._previous if self._previous is not None else signal.SIG_DFL
            )
            self._installed = False
        super().stopService()

    def _received(self, signum: int, frame: FrameType | None) -> None:
        self._reactor.callFromThread(self._refresh)

    def _refresh(self) -> None:
        self.log.info("SIGHUP: applying the config file again")
        d = self._refresher.refresh("apply", trigger="SIGHUP")

        def failed(failure: Failure) -> None:
            self.log.failure("config refresh on SIGHUP failed", failure)

        d.addErrback(failed)
