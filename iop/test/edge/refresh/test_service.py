# -*- test-case-name: iop.test.edge.refresh.test_service -*-
"""
The refresh service (L{iop.edge.refresh.service}) with a fake loader, classifier, applier and
pusher: every mode, load and validation failures, restart-required blocks, an applier that
raises, node pushes, serialization, the log lines; and SIGHUP's service.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.config.errors import ConfigIssue
from iop.config.model import EdgeConfig
from iop.edge.refresh.report import ChangeReport, NodePush, RefreshResult
from iop.edge.refresh.service import ConfigRefresher, RefreshOnSignal
from iop.test.edge.fixtures import edge_config
from iop.test.node.fakes import capture_events

LIVE = ChangeReport(
    "nodes[0].providers[0].capacity", "2", "3", "live", node="node-a", provider="a-chat"
)
RESTART = ChangeReport("admin_listen", "tcp:8081", "tcp:9091", "restart_required")
REJECTED = ChangeReport("models[0].providers", "a-chat", "nope", "rejected", model="pool")
SECRET = ChangeReport("credentials[0].secret", "<secret changed>", "<secret changed>", "live")


class FakeApplier:
    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.generation = 1
        self.applied: list[EdgeConfig] = []
        self.changed_nodes: list[str] | None = ["node-a"]
        self.error: Exception | None = None

    def apply(
        self, candidate: EdgeConfig, before_grants: Callable[[list[str]], object] | None = None
    ) -> list[str] | None:
        # before_grants is not called: the refresher then pushes after the apply.
        if self.error is not None:
            raise self.error
        self.applied.append(candidate)
        self.config = candidate
        self.generation += 1
        return self.changed_nodes


class FakePusher:
    def __init__(self) -> None:
        self.pushed: list[list[str]] = []
        self.answer: Deferred[list[NodePush]] | None = None

    def push(self, node_ids: Iterable[str]) -> Deferred[list[NodePush]]:
        ids = list(node_ids)
        self.pushed.append(ids)
        if self.answer is not None:
            return self.answer
        return succeed([NodePush(n, "applied") for n in ids])


class RefresherTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.running = edge_config()
        self.candidate = dataclasses.replace(self.running, register_timeout_sec=11.0)
        self.reports: list[ChangeReport] = [LIVE]
        self.loads = 0
        self.load_error: Exception | None = None
        self.applier = FakeApplier(self.running)
        self.pusher = FakePusher()
        self.events = capture_events(self)
        self.refresher = ConfigRefresher(
            self.load, self.classify, self.applier, self.pusher, self.clock
        )

    def load(self) -> EdgeConfig:
        self.loads += 1
        if self.load_error is not None:
            raise self.load_error
        return self.candidate

    def classify(self, running: EdgeConfig, candidate: EdgeConfig) -> list[ChangeReport]:
        self.assertIs(running, self.applier.config)
        self.assertIs(candidate, self.candidate)
        return list(self.reports)

    def refresh(self, mode: str) -> RefreshResult:
        return self.successResultOf(self.refresher.refresh(mode))

    def logged(self) -> str:
        return "\n".join(formatEvent(e) for e in self.events)

    def test_dryRunChangesNothing(self) -> None:
        result = self.refresh("dry_run")
        self.assertEqual((result.result, result.mode), ("applied", "dry_run"))
        self.assertEqual(result.reports, [LIVE])
        self.assertEqual((result.changed_nodes, result.changed_providers), (["node-a"], ["a-chat"]))
        self.assertEqual((self.applier.applied, self.pusher.pushed), ([], []))

    def test_noOp(self) -> None:
        self.reports = []
        document = self.refresh("dry_run").as_dict()
        for key in ("changed_nodes", "changed_providers", "changed_models", "reports"):
            self.assertEqual(document[key], [])

    def test_applyLive(self) -> None:
        result = self.refresh("apply")
        self.assertEqual(result.result, "applied")
        self.assertEqual(self.applier.applied, [self.candidate])
        self.assertEqual(self.pusher.pushed, [["node-a"]])
        self.assertEqual(result.node_pushes, [NodePush("node-a", "applied")])
        self.assertIn("config refresh (apply): applied", self.logged())
        self.assertIn("nodes[0].providers[0].capacity: 2 → 3 (live)", self.logged())
        self.assertIn("node node-a: applied", self.logged())

    def test_applyWaitsForNodeAnswers(self) -> None:
        self.pusher.answer = Deferred()
        d = self.refresher.refresh("apply")
        self.assertNoResult(d)
        self.assertTrue(self.refresher.busy)
        self.pusher.answer.callback([NodePush("node-a", "timeout", "no answer within 10 s")])
        result = self.successResultOf(d)
        self.assertEqual(result.result, "applied")
        self.assertEqual(result.node_pushes[0].outcome, "timeout")
        self.assertFalse(self.refresher.busy)

    def test_applierReturnsNothing(self) -> None:
        """An applier that does not say which nodes changed: the result's changed nodes."""
        self.applier.changed_nodes = None
        self.refresh("apply")
        self.assertEqual(self.pusher.pushed, [["node-a"]])

    def test_unknownModeRejectedWithoutLoad(self) -> None:
        result = self.refresh("yolo")
        self.assertEqual((result.result, result.mode), ("rejected", "yolo"))
        self.assertIn("unknown refresh mode 'yolo'", result.errors[0])
        self.assertEqual(self.loads, 0)
        self.assertEqual(result.as_dict()["reports"], [])

    def test_loadFailureRejected(self) -> None:
        self.load_error = ConfigError(
            [
                ConfigIssue("nodes[0].providers[0].capacity", "must be >= 1"),
                ConfigIssue("models[0].id", "is required"),
            ]
        )
        for mode in ("dry_run", "apply"):
            result = self.refresh(mode)
            self.assertEqual(result.result, "rejected")
            self.assertEqual(
                result.errors,
                ["nodes[0].providers[0].capacity: must be >= 1", "models[0].id: is required"],
            )
        self.assertEqual(self.applier.applied, [])
        self.assertIn("error: models[0].id: is required", self.logged())

    def test_unexpectedLoadFailureRejected(self) -> None:
        self.load_error = RuntimeError("boom")
        result = self.refresh("apply")
        self.assertEqual(result.result, "rejected")
        self.assertEqual(result.errors, ["the config file could not be loaded: RuntimeError"])
        self.flushLoggedErrors(RuntimeError)

    def test_classifierFailureRejected(self) -> None:
        def broken(running: EdgeConfig, candidate: EdgeConfig) -> list[ChangeReport]:
            raise TypeError("bug")

        self.refresher._classify = broken
        self.assertEqual(self.refresh("apply").result, "rejected")
        self.assertEqual(self.applier.applied, [])
        self.flushLoggedErrors(TypeError)

    def test_restartRequiredBlocksApply(self) -> None:
        self.reports = [LIVE, RESTART]
        result = self.refresh("apply")
        self.assertEqual(result.result, "restart_required")
        self.assertEqual(result.blocking, [RESTART])
        self.assertEqual((self.applier.applied, self.pusher.pushed), ([], []))
        self.assertEqual(self.refresh("dry_run").result, "restart_required")

    def test_rejectedChangeBlocksApply(self) -> None:
        self.reports = [LIVE, RESTART, REJECTED]
        result = self.refresh("apply")
        self.assertEqual(result.result, "rejected")
        self.assertEqual(self.applier.applied, [])

    def test_applierFailureRejected(self) -> None:
        self.applier.error = ValueError("node set changed")
        result = self.refresh("apply")
        self.assertEqual(result.result, "rejected")
        self.assertEqual(
            result.errors, ["apply failed, nothing changed: ValueError: node set changed"]
        )
        self.assertIs(self.applier.config, self.running)
        self.assertEqual(self.pusher.pushed, [])
        self.flushLoggedErrors(ValueError)

    def test_pushFailureStillApplied(self) -> None:
        self.pusher.answer = Deferred()
        d = self.refresher.refresh("apply")
        self.pusher.answer.errback(RuntimeError("bug"))
        result = self.successResultOf(d)
        self.assertEqual(result.result, "applied")
        self.assertEqual(result.errors, ["applied, but the node push failed: RuntimeError"])
        self.flushLoggedErrors(RuntimeError)

    def test_serialized(self) -> None:
        """A refresh asked while one runs waits for it, then reads the file itself."""
        self.pusher.answer = Deferred()
        first = self.refresher.refresh("apply")
        second = self.refresher.refresh("dry_run")
        self.assertEqual(self.loads, 1)
        self.assertNoResult(second)
        self.pusher.answer.callback([])
        self.successResultOf(first)
        self.assertEqual(self.loads, 2)
        self.assertEqual(self.successResultOf(second).mode, "dry_run")

    def test_noSecretLogged(self) -> None:
        self.reports = [SECRET]
        self.refresh("apply")
        self.assertIn("credentials[0].secret: <secret changed> → <secret changed>", self.logged())


class FakeReactor:
    def __init__(self) -> None:
        self.calls: list[Callable[[], object]] = []

    def callFromThread(self, f: Callable[..., object], *args: Any) -> None:
        self.calls.append(lambda: f(*args))


class StubRefresher:
    def __init__(self) -> None:
        self.modes: list[tuple[str, str]] = []
        self.answer: Deferred[RefreshResult] = Deferred()

    def refresh(self, mode: str, trigger: str = "admin API") -> Deferred[RefreshResult]:
        self.modes.append((mode, trigger))
        return self.answer


class SignalTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.handlers: dict[int, Any] = {signal.SIGHUP: "previous"}
        self.reactor = FakeReactor()
        self.refresher = StubRefresher()

    def install(self, signum: int, handler: Any) -> Any:
        previous = self.handlers.get(signum)
        self.handlers[signum] = handler
        return previous

    def test_sighupAppliesOnReactorThread(self) -> None:
        service = RefreshOnSignal(self.refresher, self.reactor, install=self.install)  # type: ignore[arg-type]
        service.startService()
        handler = self.handlers[signal.SIGHUP]
        handler(signal.SIGHUP, None)
        # Nothing runs in the signal handler itself.
        self.assertEqual(self.refresher.modes, [])
        [call] = self.reactor.calls
        call()
        self.assertEqual(self.refresher.modes, [("apply", "SIGHUP")])
        service.stopService()
        self.assertEqual(self.handlers[signal.SIGHUP], "previous")

    def test_failureLogged(self) -> None:
        service = RefreshOnSignal(self.refresher, self.reactor, install=self.install)  # type: ignore[arg-type]
        service.startService()
        self.handlers[signal.SIGHUP](signal.SIGHUP, None)
        self.reactor.calls[0]()
        self.refresher.answer.errback(RuntimeError("bug"))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        service.stopService()

    def test_notMainThread(self) -> None:
        def refuse(signum: int, handler: Any) -> Any:
            raise ValueError("signal only works in main thread")

        service = RefreshOnSignal(self.refresher, self.reactor, install=refuse)  # type: ignore[arg-type]
        service.startService()
        service.stopService()

    def test_noSignal(self) -> None:
        service = RefreshOnSignal(self.refresher, self.reactor, signum=None, install=self.install)  # type: ignore[arg-type]
        service.startService()
        service.stopService()
        self.assertEqual(self.handlers, {signal.SIGHUP: "previous"})
