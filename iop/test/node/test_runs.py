"""
The RunManager: admission, relay, sequencing, start/terminal synthesis, cancel, timeout,
and connection loss, driven with scripted fake providers and a task.Clock.

The fake providers here are shared with the command, registry and session termination tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import alsoProvides, implementer

from iop.node.adapters.registry import AdapterRegistry
from iop.node.errors import RetryableError
from iop.node.handlers import make_session_setup
from iop.node.runs import RunManager
from iop.node.session import NodeSession, SessionBuilder
from iop.node.store import RunStatus, RunStore, SynchronousExecutor
from iop.node.transport import EdgeConnectionFactory
from iop.runtime import (
    AdapterContext,
    AdapterSpec,
    Capabilities,
    ExecutionSpec,
    IOllamaAPI,
    IProvider,
    ISessionTerminator,
    ITunnelProvider,
    RuntimeEvent,
    Usage,
)
from iop.runtime.codes import ErrorCode, error_code
from iop.runtime.events import EventType
from iop.test.node.fakes import TOKEN, accepted, capture_events, drain, frame, ready_response
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_specs

# -- fake providers ---------------------------------------------------------------------------


@dataclass
class Execution:
    """One call of a fake provider's ``execute``: drive it with ``emit`` and ``deferred``."""

    spec: ExecutionSpec
    emit: Callable[[RuntimeEvent], None]
    deferred: Deferred[None]
    cancelled: bool = False

    def finish(self) -> None:
        self.deferred.callback(None)


@implementer(IProvider)
class ScriptedProvider:
    """
    Records every execution and returns a Deferred the test fires. ``script`` events are
    emitted synchronously inside ``execute``; ``on_cancel`` events are emitted when the Deferred
    is cancelled (as real adapters do); ``result`` replaces the Deferred when given.
    """

    def __init__(
        self,
        name: str = "gpu",
        type: str = "vllm",
        max_concurrency: int = 2,
        script: Iterable[RuntimeEvent] = (),
        on_cancel: Iterable[RuntimeEvent] = (),
        result: Callable[[], Deferred[None]] | None = None,
        raises: Exception | None = None,
    ) -> None:
        self.name = name
        self.type = type
        self.max_concurrency = max_concurrency
        self.script = list(script)
        self.on_cancel = list(on_cancel)
        self.result = result
        self.raises = raises
        self.executions: list[Execution] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(max_concurrency=self.max_concurrency)

    def execute(self, spec: ExecutionSpec, emit: Callable[[RuntimeEvent], None]) -> Deferred[None]:
        if self.raises is not None:
            raise self.raises

        def cancel(d: Deferred[None]) -> None:
            execution.cancelled = True
            for event in self.on_cancel:
                emit(event)

        d: Deferred[None] = Deferred(cancel)
        execution = Execution(spec, emit, d)
        self.executions.append(execution)
        for event in self.script:
            emit(event)
        if self.result is not None:
            return self.result()
        return d

    @property
    def last(self) -> Execution:
        return self.executions[-1]


@implementer(IProvider, ISessionTerminator)
class SessionProvider(ScriptedProvider):
    """A provider with logical sessions (like a CLI agent)."""

    def __init__(self, name: str = "agent", type: str = "cli", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self.sessions: dict[tuple[str, str], bool] = {}
        self.terminated: list[tuple[str, str]] = []
        self.terminate_result: Callable[[], Deferred[bool]] | None = None

    def list_sessions(self) -> list[dict[str, object]]:
        return [
            {"session_id": sid, "target": target, "active": active}
            for (target, sid), active in self.sessions.items()
        ]

    def terminate_session(self, target: str, session_id: str) -> Deferred[bool]:
        self.terminated.append((target, session_id))
        if self.terminate_result is not None:
            return self.terminate_result()
        return succeed(self.sessions.pop((target, session_id), None) is not None)


@implementer(IProvider, IOllamaAPI)
class FakeOllama(ScriptedProvider):
    """A provider answering Ollama's API queries from canned documents."""

    def __init__(self, name: str = "local", type: str = "ollama", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self.queries: list[tuple[str, str]] = []
        self.pending: Deferred[dict[str, Any]] | None = None

    def tags(self) -> Deferred[dict[str, Any]]:
        self.queries.append(("tags", ""))
        return succeed({"models": [{"name": "llama3:8b"}]})

    def ps(self) -> Deferred[dict[str, Any]]:
        self.queries.append(("ps", ""))
        if self.pending is not None:
            return self.pending
        return succeed({"models": []})

    def show(self, model: str) -> Deferred[dict[str, Any]]:
        self.queries.append(("show", model))
        if model == "missing":
            return fail(RuntimeError("ollama: model 'missing' not found"))
        return succeed({"details": {"family": "llama"}, "model": model})


def adapter_config(provider: ScriptedProvider, enabled: bool = True) -> pb.AdapterConfig:
    return pb.AdapterConfig(
        name=provider.name,
        type=provider.type,
        enabled=enabled,
        max_concurrency=provider.max_concurrency,
        base_url="http://10.0.0.5:8000/v1",
        headers={"Authorization": "Bearer upstream-secret"},
    )


def factories_for(*providers: ScriptedProvider) -> dict[str, Callable[..., Any]]:
    """Factories (for every known type) that return the given providers by instance name."""
    by_name = {p.name: p for p in providers}

    def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
        return by_name[spec.name]

    return {t: build for t in ("openai_compat", "vllm", "ollama", "cli")}


def registry_of(*providers: ScriptedProvider, disabled: Iterable[str] = ()) -> AdapterRegistry:
    off = set(disabled)
    config = pb.NodeConfigPayload(
        node_id="node-1",
        adapters=[adapter_config(p, enabled=p.name not in off) for p in providers],
    )
    return AdapterRegistry.from_specs(
        adapter_specs(config), AdapterContext(reactor=Clock(), http=None), factories_for(*providers)
    )


def open_store(testCase: SynchronousTestCase, clock: Clock) -> RunStore:
    store = RunStore(":memory:", clock, SynchronousExecutor())
    testCase.successResultOf(store.open())
    testCase.addCleanup(store.close)
    return store


class FailingExecutor(SynchronousExecutor):
    """An executor whose every job fails after the store opened (a broken disk)."""

    broken = False

    def submit(self, job: Callable[[], Any]) -> Deferred[Any]:
        if self.broken:
            return fail(OSError("disk I/O error"))
        return super().submit(job)


def run_request(
    run_id: str = "r1",
    adapter: str = "gpu",
    target: str = "llama-70b",
    session_id: str = "",
    timeout_sec: int = 0,
    **kwargs: Any,
) -> pb.RunRequest:
    return pb.RunRequest(
        run_id=run_id,
        adapter=adapter,
        target=target,
        input="hello",
        session_id=session_id,
        timeout_sec=timeout_sec,
        **kwargs,
    )


# -- tests ------------------------------------------------------------------------------------


class RunManagerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.sent: list[pb.Envelope] = []
        self.gpu = ScriptedProvider("gpu", "vllm", max_concurrency=2)
        self.agent = SessionProvider("agent", "cli", max_concurrency=1)
        self.store = open_store(self, self.clock)
        self.registry = registry_of(self.gpu, self.agent)
        self.manager = RunManager(self.registry, self.sent.append, self.store, self.clock, "n1")
        self.addCleanup(self.assertNoTimers)

    def assertNoTimers(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def submit(self, request: pb.RunRequest | None = None, **kwargs: Any) -> None:
        self.manager.run_request_received(
            pb.Envelope(run_request=request if request is not None else run_request(**kwargs))
        )

    def events(self, run_id: str | None = None) -> list[pb.RunEvent]:
        """
        The RunEvents sent so far (optionally of one run), and forget everything sent. The
        reactor turn ends first: held text deltas go out.
        """
        self.clock.advance(0)
        sent, self.sent[:] = list(self.sent), []
        events = [e.run_event for e in sent if e.WhichOneof("message") == "run_event"]
        return [e for e in events if run_id is None or e.run_id == run_id]

    def shape(self, events: list[pb.RunEvent]) -> list[tuple[int, str]]:
        return [(e.sequence, e.type) for e in events]

    def record(self, run_id: str) -> Any:
        return self.successResultOf(self.store.get(run_id))

    def cancel(self, **kwargs: Any) -> pb.CancelResponse:
        before = len(self.sent)
        self.manager.cancel_request_received(pb.Envelope(cancel_request=pb.CancelRequest(**kwargs)))
        responses = [
            e.cancel_response
            for e in self.sent[before:]
            if e.WhichOneof("message") == "cancel_response"
        ]
        self.assertEqual(len(responses), 1)
        return responses[0]

    def assertGateFree(self, provider: str = "gpu") -> None:
        self.assertEqual(self.registry.get(provider).gate.in_use, 0)


class RelayTests(RunManagerTestCase):
    def test_happyPath(self) -> None:
        """start, delta, complete relayed in order with sequence 1, 2, 3."""
        self.submit(session_id="s1", metadata={"k": "v"}, max_tokens=64, workspace="/w")
        execution = self.gpu.last
        self.assertEqual(
            (execution.spec.run_id, execution.spec.target, execution.spec.input),
            ("r1", "llama-70b", "hello"),
        )
        self.assertEqual(dict(execution.spec.metadata), {"k": "v"})
        self.assertEqual((execution.spec.max_tokens, execution.spec.session_id), (64, "s1"))
        self.assertEqual(self.registry.get("gpu").gate.in_use, 1)
        self.assertEqual(self.record("r1").status, RunStatus.RUNNING)

        execution.emit(RuntimeEvent.start(session_id="s1"))
        execution.emit(RuntimeEvent.text("Hel"))
        execution.emit(RuntimeEvent.reasoning("hmm"))
        execution.emit(RuntimeEvent.text("lo"))
        execution.emit(RuntimeEvent.complete(Usage(10, 5, reasoning_tokens=2)))
        execution.finish()

        events = self.events("r1")
        self.assertEqual(
            self.shape(events),
            [(1, "start"), (2, "delta"), (3, "reasoning_delta"), (4, "delta"), (5, "complete")],
        )
        self.assertEqual([e.delta for e in events[1:4]], ["Hel", "hmm", "lo"])
        self.assertEqual(events[-1].usage.input_tokens, 10)
        self.assertEqual(events[-1].usage.reasoning_tokens, 2)
        self.assertEqual({e.timestamp_unix_ms for e in events}, {1_700_000_000_000})
        self.assertEqual(events[0].session_id, "s1")
        self.assertGateFree()
        record = self.record("r1")
        self.assertEqual((record.status, record.error), (RunStatus.COMPLETED, ""))
        self.assertEqual(
            (record.adapter, record.target, record.session_id), ("gpu", "llama-70b", "s1")
        )
        self.assertIsNotNone(record.finished_at)
        usage = self.manager.usage()
        self.assertEqual((usage["completed"], usage["error"], usage["active_runs"]), (1, 0, 0))
        self.assertEqual(
            usage["tokens"],
            {
                "input_tokens": 10,
                "output_tokens": 5,
                "reasoning_tokens": 2,
                "cached_input_tokens": 0,
            },
        )

    def test_sequencesArePerRun(self) -> None:
        self.submit(run_id="a")
        first = self.gpu.last
        self.submit(run_id="b")
        second = self.gpu.last
        for emit, event in (
            (first.emit, RuntimeEvent.text("1")),
            (second.emit, RuntimeEvent.text("x")),
            (first.emit, RuntimeEvent.text("2")),
            (second.emit, RuntimeEvent.complete()),
            (first.emit, RuntimeEvent.complete()),
        ):
            emit(event)
            self.clock.advance(0)  # each in its own reactor turn
        sent = self.events()
        self.assertEqual(
            [(e.run_id, e.sequence, e.type) for e in sent],
            [
                ("a", 1, "start"),
                ("a", 2, "delta"),
                ("b", 1, "start"),
                ("b", 2, "delta"),
                ("a", 3, "delta"),
                ("b", 3, "complete"),
                ("a", 4, "complete"),
            ],
        )

    def test_deltas_of_one_turn_go_as_one_event(self) -> None:
        self.submit()
        run = self.gpu.last
        for text in ("He", "llo", " wor", "ld"):
            run.emit(RuntimeEvent.text(text))
        run.emit(RuntimeEvent.reasoning("hmm"))
        run.emit(RuntimeEvent.reasoning("…"))
        run.emit(RuntimeEvent(EventType.DELTA, delta="!", metadata={"k": "v"}))
        run.emit(RuntimeEvent.text("a"))
        self.assertEqual(
            [(e.type, e.delta) for e in self.events()],
            [
                ("start", ""),
                ("delta", "Hello world"),
                ("reasoning_delta", "hmm…"),
                ("delta", "!"),
                ("delta", "a"),
            ],
        )
        run.emit(RuntimeEvent.text("b"))
        run.emit(RuntimeEvent.complete())
        # The terminal never overtakes held text, and nothing is left scheduled.
        self.assertEqual(
            [(e.type, e.delta) for e in self.events()], [("delta", "b"), ("complete", "")]
        )
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_deltas_of_separate_turns_stay_separate(self) -> None:
        self.submit()
        for text in ("a", "b"):
            self.gpu.last.emit(RuntimeEvent.text(text))
            self.clock.advance(0)
        self.assertEqual([e.delta for e in self.events()], ["", "a", "b"])

    def test_startSynthesized(self) -> None:
        """An adapter whose first event is not start gets one, carrying the run's session."""
        self.submit(session_id="s9")
        self.gpu.last.emit(RuntimeEvent.text("hi"))
        [start, delta] = self.events()
        self.assertEqual((start.sequence, start.type, start.session_id), (1, "start", "s9"))
        self.assertEqual((delta.sequence, delta.type), (2, "delta"))

    def test_secondStartDropped(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.start())
        self.gpu.last.emit(RuntimeEvent.start())
        self.gpu.last.emit(RuntimeEvent.complete())
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "complete")])

    def test_adapterSessionIdRecorded(self) -> None:
        """A session id assigned by the adapter (on its start) reaches the store."""
        self.submit(adapter="agent")
        self.agent.last.emit(RuntimeEvent.start(session_id="new-session"))
        self.agent.last.emit(RuntimeEvent.complete())
        self.assertEqual(self.record("r1").session_id, "new-session")

    def test_eventsEmittedInsideExecute(self) -> None:
        """A provider may emit synchronously, before execute() returns (and fire at once)."""
        provider = ScriptedProvider(
            "quick",
            "openai_compat",
            script=[RuntimeEvent.text("a"), RuntimeEvent.complete()],
            result=lambda: succeed(None),
        )
        manager = RunManager(registry_of(provider), self.sent.append, self.store, self.clock)
        manager.submit(run_request(adapter="quick"))
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "delta"), (3, "complete")])
        self.assertEqual(manager.usage()["completed"], 1)


class TerminalTests(RunManagerTestCase):
    def test_successWithoutTerminalCompletes(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.text("x"))
        self.gpu.last.finish()
        events = self.events()
        self.assertEqual(self.shape(events), [(1, "start"), (2, "delta"), (3, "complete")])
        self.assertEqual(self.record("r1").status, RunStatus.COMPLETED)
        self.assertGateFree()

    def test_successWithoutAnyEvent(self) -> None:
        self.submit()
        self.gpu.last.finish()
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "complete")])

    def test_failureBecomesError(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.start())
        self.gpu.last.deferred.errback(RuntimeError("upstream said 502"))
        events = self.events()
        self.assertEqual(self.shape(events), [(1, "start"), (2, "error")])
        self.assertEqual(events[-1].error, "upstream said 502")
        record = self.record("r1")
        self.assertEqual((record.status, record.error), (RunStatus.ERROR, "upstream said 502"))
        self.assertEqual(self.manager.usage()["error"], 1)
        self.assertGateFree()

    def test_failureWithoutMessageNamesTheType(self) -> None:
        self.submit()
        self.gpu.last.deferred.errback(ValueError())
        self.assertEqual(self.events()[-1].error, "ValueError")

    def test_executeRaises(self) -> None:
        provider = ScriptedProvider("bad", "vllm", raises=RuntimeError("cannot spawn"))
        registry = registry_of(provider)
        manager = RunManager(registry, self.sent.append, self.store, self.clock)
        manager.submit(run_request(adapter="bad"))
        events = self.events()
        self.assertEqual(self.shape(events), [(1, "start"), (2, "error")])
        self.assertEqual(events[-1].error, "cannot spawn")
        self.assertEqual(registry.get("bad").gate.in_use, 0)

    def test_adapterTwoTerminals(self) -> None:
        """Only the first terminal goes out; everything after it is dropped (and logged)."""
        self.submit()
        execution = self.gpu.last
        execution.emit(RuntimeEvent.complete(Usage(1, 2)))
        execution.emit(RuntimeEvent.failed("late"))
        execution.emit(RuntimeEvent.text("later"))
        execution.emit(RuntimeEvent.cancelled())
        execution.deferred.errback(RuntimeError("even later"))
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "complete")])
        usage = self.manager.usage()
        self.assertEqual((usage["completed"], usage["error"], usage["cancelled"]), (1, 0, 0))
        self.assertEqual(self.record("r1").status, RunStatus.COMPLETED)
        self.assertGateFree()

    def test_adapterErrorTerminalPassesThrough(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.failed("context length exceeded", {"code": "400"}))
        self.gpu.last.finish()
        [_, error] = self.events()
        self.assertEqual((error.type, error.error), ("error", "context length exceeded"))
        self.assertEqual(dict(error.metadata), {"code": "400"})
        self.assertEqual(self.record("r1").error, "context length exceeded")

    def test_adapterCancelledTerminal(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.cancelled("session terminated"))
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "cancelled")])
        self.assertEqual(self.record("r1").status, RunStatus.CANCELLED)
        self.assertEqual(self.manager.usage()["cancelled"], 1)

    def test_usageTakesTheLastReport(self) -> None:
        """Usage reported more than once in a run counts once (the last report)."""
        self.submit()
        self.gpu.last.emit(RuntimeEvent(RuntimeEvent.text("").type, usage=Usage(3, 1)))
        self.gpu.last.emit(RuntimeEvent.complete(Usage(3, 4, cached_input_tokens=2)))
        tokens = self.manager.usage()["tokens"]
        self.assertEqual(
            tokens,
            {
                "input_tokens": 3,
                "output_tokens": 4,
                "reasoning_tokens": 0,
                "cached_input_tokens": 2,
            },
        )


class LogLineTests(RunManagerTestCase):
    """A finished run logs exactly one line, with what it was, its result, size and time."""

    def test_one_line_per_finished_run(self) -> None:
        logged = capture_events(self)
        self.submit(run_id="r1", adapter="gpu", target="demo-model")
        self.clock.advance(2.5)
        self.gpu.last.emit(RuntimeEvent.text("hi"))
        self.gpu.last.emit(RuntimeEvent.complete(Usage(input_tokens=3, output_tokens=1)))
        [event] = list(logged)
        self.assertEqual(event["log_level"].name, "info")
        self.assertEqual(
            {k: event[k] for k in ("run_id", "adapter", "target", "status", "events")},
            {
                "run_id": "r1",
                "adapter": "gpu",
                "target": "demo-model",
                "status": "completed",
                "events": 3,
            },
        )
        self.assertEqual((event["input_tokens"], event["output_tokens"]), (3, 1))
        self.assertEqual(event["duration_sec"], 2.5)
        self.assertEqual(
            formatEvent(event), "run r1 gpu/demo-model ended: completed, 3 events in 2.5 s"
        )


class AdmissionTests(RunManagerTestCase):
    def test_atCapacityRefusedThenAdmittedAfterTerminal(self) -> None:
        self.submit(run_id="a")
        self.submit(run_id="b")
        self.events()
        self.submit(run_id="c")
        [refusal] = self.events()
        self.assertEqual((refusal.run_id, refusal.sequence, refusal.type), ("c", 1, "error"))
        self.assertEqual(refusal.error, "adapter 'gpu' is at capacity (2/2)")
        self.assertEqual(error_code(refusal.metadata), ErrorCode.PROVIDER_AT_CAPACITY)
        self.assertEqual(len(self.gpu.executions), 2)
        self.assertEqual(self.record("c").status, RunStatus.ERROR)
        self.assertIsNone(self.record("c").started_at)
        self.assertEqual(self.manager.usage()["rejected"], 1)

        self.gpu.executions[0].emit(RuntimeEvent.complete())
        self.assertEqual(self.registry.get("gpu").gate.in_use, 1)
        self.submit(run_id="c")
        self.assertEqual(len(self.gpu.executions), 3)
        self.assertEqual(self.registry.get("gpu").gate.in_use, 2)
        self.assertEqual(self.record("c").status, RunStatus.RUNNING)

    def test_slotFreeWhenTerminalIsSent(self) -> None:
        """The slot is back before the terminal reaches the Edge."""
        seen: list[int] = []
        gate = self.registry.get("gpu").gate

        def send(envelope: pb.Envelope) -> None:
            if envelope.run_event.type == "complete":
                seen.append(gate.in_use)

        manager = RunManager(self.registry, send, self.store, self.clock)
        manager.submit(run_request())
        self.gpu.last.emit(RuntimeEvent.complete())
        self.assertEqual(seen, [0])

    def test_unknownAdapter(self) -> None:
        self.submit(adapter="nope", session_id="s1")
        [refusal] = self.events()
        self.assertEqual(
            (refusal.sequence, refusal.type, refusal.error, refusal.session_id),
            (1, "error", "unknown adapter 'nope'", "s1"),
        )
        record = self.record("r1")
        self.assertEqual((record.adapter, record.status), ("nope", RunStatus.ERROR))
        self.assertEqual(record.error, "unknown adapter 'nope'")
        # Only a full gate is a coded refusal: this one has no code.
        self.assertEqual(dict(refusal.metadata), {})

    def test_disabledAdapter(self) -> None:
        registry = registry_of(self.gpu, disabled=["gpu"])
        self.assertIsNone(registry.get("gpu").provider)
        manager = RunManager(registry, self.sent.append, self.store, self.clock)
        manager.submit(run_request())
        [refusal] = self.events()
        self.assertEqual(refusal.error, "adapter 'gpu' is disabled")
        self.assertEqual(self.gpu.executions, [])

    def test_legacyTypeName(self) -> None:
        self.submit(adapter="vllm")
        self.assertEqual(len(self.gpu.executions), 1)
        self.assertEqual(self.record("r1").adapter, "gpu")

    def test_duplicateRunId(self) -> None:
        """A second request for an active run id is refused; the first run goes on."""
        self.submit()
        self.gpu.last.emit(RuntimeEvent.start())
        self.submit()
        [_, refusal] = self.events()
        self.assertEqual((refusal.sequence, refusal.type), (1, "error"))
        self.assertEqual(refusal.error, "run 'r1' is already active on this node")
        self.assertEqual(len(self.gpu.executions), 1)
        self.assertEqual(self.record("r1").status, RunStatus.RUNNING)
        self.gpu.last.emit(RuntimeEvent.complete())
        self.assertEqual(self.shape(self.events()), [(2, "complete")])
        self.assertGateFree()

    def test_runIdReusableAfterFinish(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.complete())
        self.submit()
        self.assertEqual(len(self.gpu.executions), 2)
        self.assertEqual(self.record("r1").status, RunStatus.RUNNING)

    def test_missingRunId(self) -> None:
        self.submit(run_id="")
        [refusal] = self.events()
        self.assertEqual(refusal.error, "run request without a run_id")
        self.assertEqual(self.gpu.executions, [])


class ManagedTests(RunManagerTestCase):
    """A managed node never reaches an HTTP provider outside a leased tunnel."""

    def setUp(self) -> None:
        super().setUp()
        # ``gpu`` stands for an HTTP provider adapter: it serves provider tunnels.
        alsoProvides(self.gpu, ITunnelProvider)
        self.manager = RunManager(
            self.registry, self.sent.append, self.store, self.clock, "n1", managed=True
        )

    def test_a_run_on_an_http_provider_is_refused(self) -> None:
        self.submit(run_id="r1")
        [refusal] = self.events()
        self.assertEqual((refusal.sequence, refusal.type), (1, "error"))
        self.assertTrue(refusal.error.startswith("lease_missing: "), refusal.error)
        self.assertIn("'gpu'", refusal.error)
        self.assertEqual(error_code(refusal.metadata), ErrorCode.LEASE_MISSING)
        self.assertEqual(self.gpu.executions, [], "the provider is never called")
        self.assertGateFree()
        self.assertEqual(self.record("r1").status, RunStatus.ERROR)
        self.assertEqual(self.manager.usage()["rejected"], 1)

    def test_a_run_on_another_adapter_is_served(self) -> None:
        self.submit(run_id="r2", adapter="agent")
        self.assertEqual(len(self.agent.executions), 1)

    def test_a_legacy_node_serves_both(self) -> None:
        manager = RunManager(self.registry, self.sent.append, self.store, self.clock, "n1")
        manager.submit(run_request(run_id="r3"))
        self.assertEqual(len(self.gpu.executions), 1)
        self.gpu.last.emit(RuntimeEvent.complete())


class CancelTests(RunManagerTestCase):
    def test_cancelMidRun(self) -> None:
        self.gpu.on_cancel = [RuntimeEvent.cancelled("adapter saw the cancel")]
        self.submit()
        execution = self.gpu.last
        execution.emit(RuntimeEvent.text("partial"))
        response = self.cancel(kind=pb.CANCEL_RUN, run_id="r1", reason="client went away")
        self.assertEqual(
            (response.kind, response.run_id, response.ok, response.reason),
            (pb.CANCEL_RUN, "r1", True, ""),
        )
        self.assertTrue(execution.cancelled)
        self.assertTrue(execution.deferred.called)
        events = self.events()
        self.assertEqual(self.shape(events), [(1, "start"), (2, "delta"), (3, "cancelled")])
        self.assertEqual(events[-1].error, "client went away")
        record = self.record("r1")
        self.assertEqual((record.status, record.error), (RunStatus.CANCELLED, "client went away"))
        self.assertEqual(self.manager.usage()["cancelled"], 1)
        self.assertGateFree()

    def test_cancelBeforeAnyEvent(self) -> None:
        self.submit()
        self.cancel(kind=pb.CANCEL_RUN, run_id="r1")
        events = self.events()
        self.assertEqual(self.shape(events), [(1, "start"), (2, "cancelled")])
        self.assertEqual(events[-1].error, "cancelled by edge")

    def test_cancelAfterTerminal(self) -> None:
        self.submit()
        self.gpu.last.emit(RuntimeEvent.complete())
        self.events()
        response = self.cancel(kind=pb.CANCEL_RUN, run_id="r1")
        self.assertFalse(response.ok)
        self.assertEqual(response.reason, "no active run 'r1' on this node")
        self.assertEqual(self.events(), [])
        self.assertFalse(self.gpu.last.cancelled)
        self.assertEqual(self.record("r1").status, RunStatus.COMPLETED)

    def test_cancelUnknownRun(self) -> None:
        response = self.cancel(kind=pb.CANCEL_RUN, run_id="ghost")
        self.assertEqual((response.ok, response.run_id), (False, "ghost"))
        self.assertIn("ghost", response.reason)

    def test_cancelTwice(self) -> None:
        self.submit()
        self.assertTrue(self.cancel(kind=pb.CANCEL_RUN, run_id="r1").ok)
        self.assertFalse(self.cancel(kind=pb.CANCEL_RUN, run_id="r1").ok)
        self.assertEqual([e.type for e in self.events()], ["start", "cancelled"])

    def test_unspecifiedKind(self) -> None:
        response = self.cancel(run_id="r1")
        self.assertFalse(response.ok)
        self.assertIn("unknown cancel kind", response.reason)

    def test_cancelWhileExecuteRuns(self) -> None:
        """A cancel that arrives re-entrantly, before execute() returned, still cancels."""
        provider = ScriptedProvider("re", "vllm", script=[RuntimeEvent.start()])
        registry = registry_of(provider)
        manager: RunManager

        def send(envelope: pb.Envelope) -> None:
            self.sent.append(envelope)
            if envelope.run_event.type == "start":
                manager.cancel(pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="r1"))

        manager = RunManager(registry, send, self.store, self.clock)
        manager.submit(run_request(adapter="re"))
        self.assertTrue(provider.last.cancelled)
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "cancelled")])
        self.assertEqual(registry.get("re").gate.in_use, 0)


class TimeoutTests(RunManagerTestCase):
    def test_timeout(self) -> None:
        self.gpu.on_cancel = [RuntimeEvent.cancelled()]
        self.submit(timeout_sec=5)
        execution = self.gpu.last
        execution.emit(RuntimeEvent.text("slow"))
        self.clock.advance(4.9)
        self.assertEqual(self.shape(self.events()), [(1, "start"), (2, "delta")])
        self.clock.advance(0.1)
        self.assertTrue(execution.cancelled)
        events = self.events()
        self.assertEqual(self.shape(events), [(3, "error")])
        self.assertEqual(events[0].error, "timed out after 5 s")
        self.assertEqual(error_code(events[0].metadata), ErrorCode.UPSTREAM_TIMEOUT)
        record = self.record("r1")
        self.assertEqual((record.status, record.error), (RunStatus.ERROR, "timed out after 5 s"))
        self.assertGateFree()
        # A cancel or terminal after the timeout changes nothing.
        execution.emit(RuntimeEvent.complete())
        self.assertFalse(self.cancel(kind=pb.CANCEL_RUN, run_id="r1").ok)
        self.assertEqual(self.events(), [])

    def test_timerStoppedByTerminal(self) -> None:
        self.submit(timeout_sec=30)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.gpu.last.emit(RuntimeEvent.complete())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_timerStoppedByCancel(self) -> None:
        self.submit(timeout_sec=30)
        self.cancel(kind=pb.CANCEL_RUN, run_id="r1")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_noTimeoutMeansNoTimer(self) -> None:
        self.submit()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.gpu.last.finish()


class ConnectionLostTests(RunManagerTestCase):
    def test_held_text_is_dropped_with_its_timer(self) -> None:
        self.submit(run_id="a")
        self.events()
        self.gpu.last.emit(RuntimeEvent.text("never sent"))
        self.manager.connection_lost()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # The start went out with the first delta; the held text never does.
        self.assertEqual([e.type for e in self.events()], ["start"])
        self.assertEqual(self.record("a").status, RunStatus.CANCELLED)

    def test_activeRunsCancelledAndRecorded(self) -> None:
        self.gpu.on_cancel = [RuntimeEvent.cancelled()]
        self.submit(run_id="a", timeout_sec=60)
        self.submit(run_id="b")
        self.submit(run_id="c", adapter="agent")
        self.gpu.executions[1].emit(RuntimeEvent.complete())
        self.events()
        self.manager.connection_lost()
        self.assertEqual(self.events(), [])
        self.assertTrue(self.gpu.executions[0].cancelled)
        self.assertFalse(self.gpu.executions[1].cancelled)
        self.assertTrue(self.agent.last.cancelled)
        for run_id in ("a", "c"):
            record = self.record(run_id)
            self.assertEqual(
                (record.status, record.error), (RunStatus.CANCELLED, "edge connection lost")
            )
        self.assertEqual(self.record("b").status, RunStatus.COMPLETED)
        self.assertGateFree("gpu")
        self.assertGateFree("agent")
        usage = self.manager.usage()
        self.assertEqual((usage["active_runs"], usage["cancelled"], usage["completed"]), (0, 2, 1))
        # Late events and requests after the loss go nowhere.
        self.gpu.executions[0].emit(RuntimeEvent.text("late"))
        self.submit(run_id="d")
        self.assertEqual(self.events(), [])
        self.assertEqual(len(self.gpu.executions), 2)


class StoreFailureTests(SynchronousTestCase):
    def test_brokenStoreNeverBreaksARun(self) -> None:
        clock = Clock()
        executor = FailingExecutor()
        store = RunStore(":memory:", clock, executor)
        self.successResultOf(store.open())
        self.addCleanup(store.close)
        self.addCleanup(setattr, executor, "broken", False)
        executor.broken = True
        provider = ScriptedProvider()
        sent: list[pb.Envelope] = []
        registry = registry_of(provider)
        manager = RunManager(registry, sent.append, store, clock)
        manager.submit(run_request())
        provider.last.emit(RuntimeEvent.complete())
        manager.submit(run_request(run_id="r2", adapter="nope"))
        self.assertEqual(
            [(e.run_event.run_id, e.run_event.type) for e in sent],
            [("r1", "start"), ("r1", "complete"), ("r2", "error")],
        )
        self.assertEqual(registry.get("gpu").gate.in_use, 0)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 3)

    def test_unopenedStoreNeverBreaksARun(self) -> None:
        clock = Clock()
        store = RunStore(":memory:", clock, SynchronousExecutor())
        provider = ScriptedProvider()
        sent: list[pb.Envelope] = []
        manager = RunManager(registry_of(provider), sent.append, store, clock)
        manager.submit(run_request())
        provider.last.finish()
        self.assertEqual([e.run_event.type for e in sent], ["start", "complete"])


class DescribeTests(RunManagerTestCase):
    def test_describeAndUsage(self) -> None:
        self.submit(run_id="a", session_id="s1")
        self.submit(run_id="b", adapter="agent", background=True)
        self.gpu.last.emit(RuntimeEvent.text("x"))
        self.clock.advance(0)
        self.submit(run_id="c", adapter="nope")
        described = self.manager.describe()
        self.assertEqual(
            described["active"],
            [
                {
                    "run_id": "a",
                    "adapter": "gpu",
                    "target": "llama-70b",
                    "session_id": "s1",
                    "background": False,
                    "request_id": "",
                    "started_unix_ms": 1_700_000_000_000,
                    "events": 2,
                },
                {
                    "run_id": "b",
                    "adapter": "agent",
                    "target": "llama-70b",
                    "session_id": "",
                    "background": True,
                    "request_id": "",
                    "started_unix_ms": 1_700_000_000_000,
                    "events": 0,
                },
            ],
        )
        usage = self.manager.usage()
        self.assertEqual(usage["active_runs"], 2)
        self.assertEqual(usage["active_by_adapter"], {"gpu": 1, "agent": 1})
        self.assertEqual((usage["error"], usage["rejected"]), (1, 1))
        self.assertEqual(self.manager.active_count("gpu"), 1)
        self.assertEqual(self.manager.active_count(), 2)
        self.assertEqual(self.record("b").background, True)
        self.manager.connection_lost()


# -- the session hook through a real handshake -------------------------------------------------


class SessionSetupTests(SynchronousTestCase):
    """make_session_setup installed on a real protocol: runs, cancels and commands over the wire."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = open_store(self, self.clock)
        self.gpu = ScriptedProvider("gpu", "vllm", max_concurrency=1)

    def connect(self, session_setup: Callable[[NodeSession], None]) -> Any:
        factory = EdgeConnectionFactory(
            self.clock,
            SessionBuilder(
                AdapterContext(reactor=self.clock, http=None),
                factories_for(self.gpu),
                setup=session_setup,
            ),
            hostname="h",
        )
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        self.addCleanup(protocol.connectionLost, Failure(ConnectionDone()))
        return protocol, transport

    def payload(self) -> pb.NodeConfigPayload:
        return pb.NodeConfigPayload(
            node_id="node-1", adapters=[adapter_config(self.gpu)], config_revision=3
        )

    def test_handlersInstalledBeforeReady(self) -> None:
        protocol, transport = self.connect(make_session_setup(self.store, self.clock))
        d = protocol.handshake(TOKEN, self.clock, 10)
        drain(transport)
        protocol.dataReceived(frame(accepted(self.payload())))
        [ready] = drain(transport)
        self.assertEqual(ready.WhichOneof("message"), "node_ready_request")
        protocol.dataReceived(frame(ready_response()))
        session = self.successResultOf(d)
        self.assertIsNotNone(session.ready_at)

        protocol.dataReceived(frame(pb.Envelope(run_request=run_request(timeout_sec=60))))
        self.gpu.last.emit(RuntimeEvent.text("hi"))
        self.clock.advance(0)
        protocol.dataReceived(
            frame(
                pb.Envelope(
                    node_command_request=pb.NodeCommandRequest(
                        request_id="q1", type=pb.NODE_COMMAND_USAGE_STATUS
                    )
                )
            )
        )
        sent = [e for e in drain(transport) if e.WhichOneof("message") != "heartbeat"]
        self.assertEqual(
            [e.WhichOneof("message") for e in sent],
            ["run_event", "run_event", "node_command_response"],
        )
        self.assertTrue(sent[-1].node_command_response.ok)
        self.assertIn('"in_use":1', sent[-1].node_command_response.result_json)

        protocol.dataReceived(
            frame(pb.Envelope(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="r1")))
        )
        sent = [e for e in drain(transport) if e.WhichOneof("message") != "heartbeat"]
        self.assertEqual(
            [(e.WhichOneof("message"), e.run_event.type) for e in sent],
            [("run_event", "cancelled"), ("cancel_response", "")],
        )
        self.assertTrue(sent[-1].cancel_response.ok)

    def test_connectionLossCancelsRuns(self) -> None:
        protocol, _ = self.connect(make_session_setup(self.store, self.clock))
        d = protocol.handshake(TOKEN, self.clock, 10)
        protocol.dataReceived(frame(accepted(self.payload())))
        protocol.dataReceived(frame(ready_response()))
        session = self.successResultOf(d)
        protocol.dataReceived(frame(pb.Envelope(run_request=run_request(timeout_sec=60))))
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertTrue(self.gpu.last.cancelled)
        self.assertEqual(session.registry.get("gpu").gate.in_use, 0)
        record = self.successResultOf(self.store.get("r1"))
        assert record is not None
        self.assertEqual(
            (record.status, record.error), (RunStatus.CANCELLED, "edge connection lost")
        )
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_setupFailureFailsTheHandshake(self) -> None:
        def broken(session: NodeSession) -> None:
            raise RuntimeError("no handlers today")

        protocol, transport = self.connect(broken)
        d = protocol.handshake(TOKEN, self.clock, 10)
        drain(transport)
        protocol.dataReceived(frame(accepted(self.payload())))
        failure = self.failureResultOf(d, RetryableError)
        self.assertEqual(failure.getErrorMessage(), "session setup failed: no handlers today")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(drain(transport), [])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_sessionClosedAfterFailedHandshake(self) -> None:
        """A session that was set up but never became ready is still told when it closes."""
        sessions: list[NodeSession] = []
        protocol, _ = self.connect(sessions.append)
        d = protocol.handshake(TOKEN, self.clock, 10)
        protocol.dataReceived(frame(accepted(self.payload())))
        closed = sessions[0].when_closed()
        protocol.dataReceived(frame(ready_response(ready=False, reason="superseded")))
        self.failureResultOf(d, RetryableError)
        self.assertNoResult(closed)
        protocol.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(closed)
        self.assertTrue(sessions[0].closed)
