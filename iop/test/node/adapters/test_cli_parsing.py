"""
The ``cli`` adapter without processes: the Claude / Codex / Gemini stream interpreters, the
``json`` and ``text`` decoders, NDJSON framing fed byte by byte, missing terminals, argv /
environment / prompt placement, and the run lifecycle (timeouts, cancel, group signals,
sessions) driven through the ProcessProtocol with a ``task.Clock``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.node.adapters import cli
from iop.node.adapters.cli import (
    DRAIN_SECONDS,
    SETSID_SHIM,
    STDERR_TAIL_BYTES,
    CLIProvider,
    CLISettings,
    LaunchError,
    LaunchPlan,
    StreamInterpreter,
    build_env,
    expand_args,
    usage_since,
)
from iop.runtime import AdapterContext, AdapterSpec, EventType, ExecutionSpec, RuntimeEvent, Usage

# -- fixtures -----------------------------------------------------------------------------------


class RecordingSink:
    """An OutputSink that records calls as tuples."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def session(self, session_id: str) -> None:
        self.calls.append(("session", session_id))

    def text(self, delta: str) -> None:
        self.calls.append(("text", delta))

    def reasoning(self, delta: str) -> None:
        self.calls.append(("reasoning", delta))

    def complete(self, usage: Usage | None) -> None:
        self.calls.append(("complete", usage))

    def fail(self, reason: str) -> None:
        self.calls.append(("fail", reason))

    def abort(self, reason: str) -> None:
        self.calls.append(("abort", reason))

    def of(self, kind: str) -> list[Any]:
        return [c[1] for c in self.calls if c[0] == kind]


def interpret(*messages: dict[str, Any], baseline: Usage | None = None) -> RecordingSink:
    sink = RecordingSink()
    interpreter = StreamInterpreter(sink, baseline)
    for message in messages:
        interpreter.feed(message)
    return sink


def ndjson(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def delta(index: int, text: str, kind: str = "text") -> dict[str, Any]:
    field = "thinking" if kind == "thinking" else "text"
    return {
        "type": "stream_event",
        "event": {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": f"{kind}_delta", field: text},
        },
        "session_id": "S",
        "parent_tool_use_id": None,
    }


def message_start(message_id: str) -> dict[str, Any]:
    return {
        "type": "stream_event",
        "event": {"type": "message_start", "message": {"id": message_id}},
        "parent_tool_use_id": None,
    }


def assistant(
    message_id: str, *blocks: dict[str, Any], parent: str | None = None
) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"id": message_id, "content": list(blocks), "usage": {"output_tokens": 99}},
        "parent_tool_use_id": parent,
        "session_id": "S",
    }


INIT: dict[str, Any] = {"type": "system", "subtype": "init", "session_id": "S", "model": "claude-x"}
CLAUDE_USAGE = {
    "input_tokens": 12,
    "output_tokens": 310,
    "cache_creation_input_tokens": 2087,
    "cache_read_input_tokens": 14016,
}
RESULT: dict[str, Any] = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "result": "Hello world",
    "session_id": "S",
    "usage": CLAUDE_USAGE,
}
EXPECTED_CLAUDE_USAGE = Usage(
    input_tokens=12 + 2087 + 14016,
    output_tokens=310,
    cached_input_tokens=14016,
    cache_write_tokens=2087,
)
CLAUDE_STREAM: list[dict[str, Any]] = [
    INIT,
    {"type": "system", "subtype": "api_retry", "attempt": 1},
    message_start("msg_1"),
    delta(0, "Let me ", "thinking"),
    delta(0, "see.", "thinking"),
    assistant("msg_1", {"type": "thinking", "thinking": "Let me see.", "signature": "x"}),
    delta(1, "Hello"),
    delta(1, " world"),
    assistant("msg_1", {"type": "text", "text": "Hello world"}),
    {"type": "rate_limit_event", "whatever": 1},
    RESULT,
]

CODEX_STREAM: list[dict[str, Any]] = [
    {"type": "thread.started", "thread_id": "0199a213-81c0"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "Scanning"}},
    {
        "type": "item.started",
        "item": {"id": "item_1", "type": "command_execution", "command": "ls", "status": "x"},
    },
    {
        "type": "item.completed",
        "item": {"id": "item_2", "type": "agent_message", "text": "Looking"},
    },
    {"type": "error", "message": "reconnecting"},
    {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "Done."}},
    {
        "type": "turn.completed",
        "usage": {
            "input_tokens": 24763,
            "cached_input_tokens": 24448,
            "output_tokens": 122,
            "reasoning_output_tokens": 64,
        },
    },
]

GEMINI_STREAM: list[dict[str, Any]] = [
    {"type": "init", "timestamp": "t", "session_id": "G", "model": "gemini-2.5-pro"},
    {"type": "message", "timestamp": "t", "role": "user", "content": "hi"},
    {"type": "message", "timestamp": "t", "role": "assistant", "content": "Hel", "delta": True},
    {"type": "message", "timestamp": "t", "role": "assistant", "content": "lo", "delta": True},
    {"type": "tool_use", "timestamp": "t", "tool_name": "ls", "tool_id": "t1", "parameters": {}},
    {"type": "tool_result", "timestamp": "t", "tool_id": "t1", "status": "success", "output": "a"},
    {"type": "message", "timestamp": "t", "role": "assistant", "content": "Bye", "delta": True},
    {
        "type": "result",
        "timestamp": "t",
        "status": "success",
        "stats": {"total_tokens": 900, "input_tokens": 800, "output_tokens": 100, "cached": 500},
    },
]


class FakeProcessTransport:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.written = b""
        self.stdin_closed = False
        self.signals: list[int | str] = []
        self.lost_connection = False

    def write(self, data: bytes) -> None:
        self.written += data

    def closeStdin(self) -> None:
        self.stdin_closed = True

    def signalProcess(self, signum: int | str) -> None:
        self.signals.append(signum)

    def loseConnection(self) -> None:
        self.lost_connection = True


@implementer(IReactorProcess)
class ProcessClock(Clock):
    """A Clock that also records ``spawnProcess`` calls and connects a fake transport."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[dict[str, Any]] = []
        self.next_pid = 4000

    def spawnProcess(  # type: ignore[override]  # a recording fake, loosely typed
        self, process_protocol: Any, executable: Any, args: Any, **kw: Any
    ) -> Any:
        self.next_pid += 1
        transport = FakeProcessTransport(self.next_pid)
        self.spawned.append(
            dict(
                kw, protocol=process_protocol, executable=executable, args=args, transport=transport
            )
        )
        process_protocol.makeConnection(transport)
        return transport


def config(**fields: Any) -> AdapterSpec:
    values: dict[str, Any] = {
        "name": "claude",
        "type": "cli",
        "command": "claude",
        "args": ["-p", "--output-format", "stream-json", "--verbose", "--model", "{model}"],
        "resume_args": ["--resume={session_id}"],
        "output_format": "stream-json",
    }
    values.update(fields)
    return AdapterSpec(**values)


def fake_which(command: str, path: str | None) -> str | None:
    if command == "missing":
        return None
    return command if os.path.isabs(command) else "/opt/agents/bin/" + command


ENVIRON = {
    "PATH": "/usr/bin",
    "HOME": "/home/node",
    "LANG": "C.UTF-8",
    "USER": "node",
    "CLAUDECODE": "1",
    "SECRET_TOKEN": "must-not-leak",
    "ANTHROPIC_API_KEY": "from-node-env",
}


class Harness:
    """A provider on a ProcessClock whose group signals are recorded instead of sent."""

    def __init__(self, case: SynchronousTestCase, **fields: Any) -> None:
        self.clock = ProcessClock()
        self.group_signals: list[tuple[int, int]] = []
        self.group_gone = False
        self.workspace = os.path.abspath(case.mktemp())
        os.makedirs(self.workspace)
        fields.setdefault("workspace", self.workspace)
        self.provider = CLIProvider(
            config(**fields),
            self.clock,
            signal_group=self.signal_group,
            which=fake_which,
            environ=ENVIRON,
        )
        self.events: list[RuntimeEvent] = []

    def signal_group(self, pgid: int, signum: int) -> None:
        if self.group_gone:
            raise ProcessLookupError(pgid)
        self.group_signals.append((pgid, signum))

    def execute(self, prompt: str = "hello", **fields: Any) -> Deferred[None]:
        spec = ExecutionSpec(run_id="r1", target="claude-x", input=prompt, **fields)
        return self.provider.execute(spec, self.events.append)

    @property
    def last(self) -> dict[str, Any]:
        return self.clock.spawned[-1]

    def out(self, data: bytes, byte_by_byte: bool = False) -> None:
        protocol = self.last["protocol"]
        if byte_by_byte:
            for i in range(len(data)):
                protocol.outReceived(data[i : i + 1])
        else:
            protocol.outReceived(data)

    def err(self, data: bytes) -> None:
        self.last["protocol"].errReceived(data)

    def exit(self, code: int | None = 0, signum: int | None = None) -> None:
        protocol = self.last["protocol"]
        if code == 0:
            reason = Failure(ProcessDone(0))
        else:
            reason = Failure(ProcessTerminated(code, signum))
        protocol.processExited(reason)
        protocol.processEnded(reason)

    def types(self) -> list[EventType]:
        return [e.type for e in self.events]

    def text(self, kind: EventType = EventType.DELTA) -> str:
        return "".join(e.delta for e in self.events if e.type == kind)


# -- stream interpreters ------------------------------------------------------------------------


class ClaudeStreamTests(SynchronousTestCase):
    def test_deltasThenCompleteWithoutDoubleEmission(self) -> None:
        sink = interpret(*CLAUDE_STREAM)
        self.assertEqual(
            sink.calls,
            [
                ("session", "S"),
                ("reasoning", "Let me "),
                ("reasoning", "see."),
                ("text", "Hello"),
                ("text", " world"),
                ("complete", EXPECTED_CLAUDE_USAGE),
            ],
        )

    def test_assistantMessagesWhenNothingStreamed(self) -> None:
        sink = interpret(
            INIT,
            assistant("msg_1", {"type": "thinking", "thinking": "Hmm."}),
            assistant("msg_1", {"type": "text", "text": "I'll look."}),
            assistant("msg_1", {"type": "tool_use", "id": "tu", "name": "Bash", "input": {}}),
            {"type": "user", "message": {"role": "user", "content": [{"type": "tool_result"}]}},
            assistant("msg_2", {"type": "text", "text": "Hello world"}),
            RESULT,
        )
        self.assertEqual(sink.of("reasoning"), ["Hmm."])
        # Blocks of separate messages are separated; the result text is not repeated.
        self.assertEqual(sink.of("text"), ["I'll look.", "\n\nHello world"])
        self.assertEqual(sink.of("complete"), [EXPECTED_CLAUDE_USAGE])

    def test_streamedBlocksWithoutMessageStart(self) -> None:
        sink = interpret(
            INIT,
            delta(0, "Hel"),
            delta(0, "lo"),
            assistant("msg_1", {"type": "text", "text": "Hello"}),
            assistant("msg_1", {"type": "text", "text": "Unstreamed"}),
            RESULT,
        )
        self.assertEqual(sink.of("text"), ["Hel", "lo", "\n\nUnstreamed"])

    def test_mixedStreamedAndWholeBlocks(self) -> None:
        # Keyed by message id and running block index: only block 1 streamed.
        sink = interpret(
            message_start("m"),
            delta(1, "streamed"),
            assistant("m", {"type": "text", "text": "whole"}),
            assistant("m", {"type": "text", "text": "streamed"}),
        )
        self.assertEqual(sink.of("text"), ["streamed", "\n\nwhole"])

    def test_subagentMessagesIgnored(self) -> None:
        subagent = dict(delta(0, "inner"), parent_tool_use_id="tu_1")
        sink = interpret(
            INIT,
            subagent,
            assistant("sub", {"type": "text", "text": "inner"}, parent="tu_1"),
            RESULT,
        )
        self.assertEqual(sink.of("text"), ["Hello world"])

    def test_resultAloneEmitsItsText(self) -> None:
        sink = interpret(RESULT)
        self.assertEqual(sink.calls[:2], [("session", "S"), ("text", "Hello world")])
        self.assertEqual(sink.of("complete"), [EXPECTED_CLAUDE_USAGE])

    def test_usageWithoutCache(self) -> None:
        result = dict(RESULT, usage={"input_tokens": 5, "output_tokens": 7})
        self.assertEqual(interpret(result).of("complete"), [Usage(input_tokens=5, output_tokens=7)])

    def test_errorSubtypeCarriesErrors(self) -> None:
        failed = {
            "type": "result",
            "subtype": "error_max_turns",
            "is_error": True,
            "errors": ["Reached maximum number of turns (3)", {"message": "and more"}],
            "session_id": "S2",
        }
        sink = interpret(INIT, failed)
        self.assertEqual(
            sink.calls,
            [
                ("session", "S"),
                ("session", "S2"),
                ("fail", "Reached maximum number of turns (3); and more"),
            ],
        )

    def test_isErrorTrustedOverSuccessSubtype(self) -> None:
        failed = dict(
            RESULT, is_error=True, result="API Error: 529 overloaded", api_error_status=529
        )
        sink = interpret(failed)
        self.assertEqual(sink.of("fail"), ["API Error: 529 overloaded (api_error_status 529)"])
        self.assertEqual(sink.of("text"), [])

    def test_errorSubtypeWithoutDetails(self) -> None:
        sink = interpret({"type": "result", "subtype": "error_during_execution"})
        self.assertEqual(sink.of("fail"), ["error_during_execution"])

    def test_nothingAfterTheTerminal(self) -> None:
        sink = interpret(RESULT, delta(0, "late"), RESULT)
        self.assertEqual(len(sink.of("complete")), 1)
        self.assertEqual(sink.of("text"), ["Hello world"])

    def test_unknownAndMalformedMessagesIgnored(self) -> None:
        sink = interpret(
            {"type": "brand_new_type", "x": 1},
            {"no_type": True},
            {"type": 5},
            {"type": "stream_event", "event": "not an object"},
            {"type": "assistant", "message": {"content": "not a list"}},
        )
        self.assertEqual(sink.calls, [])


class CodexStreamTests(SynchronousTestCase):
    def test_stream(self) -> None:
        sink = interpret(*CODEX_STREAM)
        self.assertEqual(
            sink.calls,
            [
                ("session", "0199a213-81c0"),
                ("reasoning", "Scanning"),
                ("text", "Looking"),
                ("text", "\n\nDone."),
                (
                    "complete",
                    Usage(
                        input_tokens=24763,
                        output_tokens=122,
                        reasoning_tokens=64,
                        cached_input_tokens=24448,
                    ),
                ),
            ],
        )

    def test_usageWithoutReasoningCount(self) -> None:
        done = {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 4}}
        self.assertEqual(interpret(done).of("complete"), [Usage(input_tokens=3, output_tokens=4)])

    def test_cumulativeUsageIsDiffedAgainstTheBaseline(self) -> None:
        baseline = Usage(
            input_tokens=100, output_tokens=10, reasoning_tokens=4, cached_input_tokens=80
        )
        sink = interpret(CODEX_STREAM[-1], baseline=baseline)
        self.assertEqual(
            sink.of("complete"),
            [
                Usage(
                    input_tokens=24663,
                    output_tokens=112,
                    reasoning_tokens=60,
                    cached_input_tokens=24368,
                )
            ],
        )

    def test_usageSince(self) -> None:
        now = Usage(input_tokens=10, output_tokens=5)
        self.assertEqual(usage_since(now, None), now)
        # Counters that went down were not cumulative: reported as they are.
        self.assertEqual(usage_since(now, Usage(input_tokens=20, output_tokens=1)), now)

    def test_turnFailed(self) -> None:
        sink = interpret(CODEX_STREAM[0], {"type": "turn.failed", "error": {"message": "boom"}})
        self.assertEqual(sink.of("fail"), ["boom"])

    def test_legacyItemTypeShape(self) -> None:
        item = {"id": "i", "item_type": "assistant_message", "text": "old"}
        self.assertEqual(interpret({"type": "item.completed", "item": item}).of("text"), ["old"])

    def test_legacyEventsAreNoted(self) -> None:
        sink = RecordingSink()
        interpreter = StreamInterpreter(sink)
        interpreter.feed({"id": "0", "msg": {"type": "agent_message_delta", "delta": "x"}})
        self.assertTrue(interpreter.legacy)
        self.assertEqual(sink.calls, [])

    def test_nonFatalErrorsAreKeptAsNotes(self) -> None:
        sink = RecordingSink()
        interpreter = StreamInterpreter(sink)
        for message in CODEX_STREAM[:-1]:
            interpreter.feed(message)
        self.assertEqual(interpreter.notes, ["reconnecting"])
        self.assertEqual(sink.of("fail"), [])


class GeminiStreamTests(SynchronousTestCase):
    def test_stream(self) -> None:
        sink = interpret(*GEMINI_STREAM)
        self.assertEqual(
            sink.calls,
            [
                ("session", "G"),
                ("text", "Hel"),
                ("text", "lo"),
                ("text", "\n\nBye"),
                ("complete", Usage(input_tokens=800, output_tokens=100, cached_input_tokens=500)),
            ],
        )

    def test_failedResult(self) -> None:
        failed = {
            "type": "result",
            "status": "error",
            "error": {"type": "FatalTurnLimitedError", "message": "turn limit"},
        }
        self.assertEqual(interpret(GEMINI_STREAM[0], failed).of("fail"), ["turn limit"])

    def test_jsonDocument(self) -> None:
        sink = RecordingSink()
        StreamInterpreter(sink).feed_json_document(
            {
                "session_id": "G",
                "response": "The answer.",
                "stats": {
                    "models": {
                        "gemini-2.5-pro": {
                            "api": {},
                            "tokens": {"prompt": 10, "candidates": 5, "cached": 4, "thoughts": 3},
                        },
                        "gemini-2.5-flash": {"tokens": {"prompt": 1, "candidates": 1}},
                    },
                    "tools": {},
                },
            }
        )
        self.assertEqual(
            sink.calls,
            [
                ("session", "G"),
                ("text", "The answer."),
                (
                    "complete",
                    Usage(
                        input_tokens=11,
                        output_tokens=6,
                        reasoning_tokens=3,
                        cached_input_tokens=4,
                    ),
                ),
            ],
        )

    def test_jsonDocumentError(self) -> None:
        sink = RecordingSink()
        StreamInterpreter(sink).feed_json_document(
            {"session_id": "G", "error": {"type": "AuthError", "message": "no auth", "code": 41}}
        )
        self.assertEqual(sink.of("fail"), ["no auth"])


# -- framing and decoders through the ProcessProtocol ------------------------------------------


class StreamJsonRunTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness(self)

    def tearDown(self) -> None:
        self.assertEqual(self.h.clock.getDelayedCalls(), [])

    def run_stream(self, data: bytes, byte_by_byte: bool = False) -> Deferred[None]:
        d = self.h.execute()
        self.h.out(data, byte_by_byte)
        self.h.exit(0)
        return d

    def test_byteByByteEqualsOneChunk(self) -> None:
        data = b"Warning: not json\n" + ndjson(*CLAUDE_STREAM)
        self.successResultOf(self.run_stream(data))
        whole = list(self.h.events)
        self.h = Harness(self)
        self.successResultOf(self.run_stream(data, byte_by_byte=True))
        self.assertEqual(self.h.events, whole)
        self.assertEqual(
            whole,
            [
                RuntimeEvent.start(),
                RuntimeEvent.reasoning("Let me "),
                RuntimeEvent.reasoning("see."),
                RuntimeEvent.text("Hello"),
                RuntimeEvent.text(" world"),
                RuntimeEvent.complete(usage=EXPECTED_CLAUDE_USAGE, session_id="S"),
            ],
        )

    def test_crlfBlankAndGarbageLinesAndUnterminatedLastLine(self) -> None:
        data = (
            b"\r\n   \n[1,2]\n{not json\n"
            + json.dumps(INIT).encode()
            + b"\r\n"
            + json.dumps(RESULT).encode()
        )
        self.successResultOf(self.run_stream(data))
        self.assertEqual(self.h.types(), [EventType.START, EventType.DELTA, EventType.COMPLETE])
        self.assertEqual(self.h.events[-1].session_id, "S")

    def test_longLineWithinTheLimit(self) -> None:
        big = "x" * (200 * 1024)
        data = ndjson(dict(RESULT, result=big))
        self.successResultOf(self.run_stream(data))
        self.assertEqual(self.h.text(), big)

    def test_lineOverTheLimit(self) -> None:
        self.h = Harness(self, settings={"max_line_bytes": "1000", "kill_grace_ms": "100"})
        d = self.h.execute()
        self.h.out(b"{" + b"x" * 600)
        self.assertEqual(self.h.group_signals, [])
        self.h.out(b"y" * 600)
        self.assertEqual(self.h.events[-1].type, EventType.ERROR)
        self.assertEqual(self.h.events[-1].error, "agent output line exceeds 1000 bytes")
        pid = self.h.last["transport"].pid
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGTERM)])
        self.h.clock.advance(0.1)
        self.assertEqual(self.h.group_signals[-1], (pid, signal.SIGKILL))
        self.h.exit(None, signal.SIGKILL)
        self.successResultOf(d)
        self.assertEqual([e.type for e in self.h.events].count(EventType.ERROR), 1)

    def test_missingTerminalIsAnErrorWhateverTheExitCode(self) -> None:
        d = self.h.execute()
        self.h.out(ndjson(INIT, delta(0, "partial")))
        self.h.err(b"some warning\n")
        self.h.exit(0)
        self.successResultOf(d)
        final = self.h.events[-1]
        self.assertEqual(final.type, EventType.ERROR)
        self.assertEqual(
            final.error, "agent exited (code 0) without a result\nstderr: some warning"
        )
        self.assertEqual(final.session_id, "S")

    def test_missingTerminalNamesNotesAndSignal(self) -> None:
        d = self.h.execute()
        self.h.out(ndjson(CODEX_STREAM[0], {"type": "error", "message": "stream disconnected"}))
        self.h.exit(None, signal.SIGSEGV)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[-1].error,
            f"agent exited (signal {int(signal.SIGSEGV)}) without a result: stream disconnected",
        )

    def test_stderrIsBounded(self) -> None:
        d = self.h.execute()
        self.h.err(b"a" * 10000)
        self.h.err(b"THE END")
        self.h.exit(1)
        self.successResultOf(d)
        tail = self.h.events[-1].error.split("stderr: ", 1)[1]
        self.assertEqual(len(tail), STDERR_TAIL_BYTES)
        self.assertTrue(tail.endswith("THE END"))

    def test_goodResultThenNonZeroExitStillCompletes(self) -> None:
        d = self.h.execute()
        self.h.out(ndjson(RESULT))
        self.h.exit(1)
        self.successResultOf(d)
        self.assertEqual(self.h.types()[-1], EventType.COMPLETE)


class JsonAndTextRunTests(SynchronousTestCase):
    def tearDown(self) -> None:
        self.assertEqual(self.h.clock.getDelayedCalls(), [])

    def test_jsonClaudeResult(self) -> None:
        self.h = Harness(self, output_format="json")
        d = self.h.execute()
        for byte in json.dumps(RESULT).encode():
            self.h.out(bytes([byte]))
        self.assertEqual(self.h.types(), [EventType.START])
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[1:],
            [
                RuntimeEvent.text("Hello world"),
                RuntimeEvent.complete(usage=EXPECTED_CLAUDE_USAGE, session_id="S"),
            ],
        )

    def test_jsonVerboseArray(self) -> None:
        self.h = Harness(self, output_format="json")
        d = self.h.execute()
        self.h.out(json.dumps(CLAUDE_STREAM).encode())
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(self.h.text(), "Hello world")
        self.assertEqual(self.h.text(EventType.REASONING_DELTA), "Let me see.")

    def test_jsonGemini(self) -> None:
        self.h = Harness(self, output_format="json")
        d = self.h.execute()
        self.h.out(b'Loaded cached credentials.\n{"session_id": "G", "response": "ok"}\n')
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[1:], [RuntimeEvent.text("ok"), RuntimeEvent.complete(session_id="G")]
        )

    def test_jsonNotJson(self) -> None:
        self.h = Harness(self, output_format="json")
        d = self.h.execute()
        self.h.out(b"oops")
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[-1].error,
            "agent exited (code 0) without a result: agent output is not valid JSON",
        )

    def test_jsonEmptyOutput(self) -> None:
        self.h = Harness(self, output_format="json")
        d = self.h.execute()
        self.h.err(b"Error: not logged in")
        self.h.exit(1)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[-1].error,
            "agent exited (code 1) without a result\nstderr: Error: not logged in",
        )

    def test_textChunksAreDeltas(self) -> None:
        self.h = Harness(self, output_format="text")
        d = self.h.execute()
        # "café" split inside the é, and the final newline held back and dropped.
        self.h.out(b"caf\xc3")
        self.h.out(b"\xa9 au\n")
        self.h.out(b"lait\n")
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events,
            [
                RuntimeEvent.start(),
                RuntimeEvent.text("caf"),
                RuntimeEvent.text("é au"),
                RuntimeEvent.text("\nlait"),
                RuntimeEvent.complete(),
            ],
        )

    def test_textNonZeroExit(self) -> None:
        self.h = Harness(self, output_format="text")
        d = self.h.execute()
        self.h.out(b"half an answer")
        self.h.err(b"Error: credit balance too low\n")
        self.h.exit(2)
        self.successResultOf(d)
        self.assertEqual(
            self.h.events[-1].error, "agent exited (code 2)\nstderr: Error: credit balance too low"
        )


# -- argv, environment, placement ---------------------------------------------------------------


class LaunchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.workspace = os.path.abspath(self.mktemp())
        os.makedirs(self.workspace)

    def plan(self, prompt: str = "fix the bug", session_id: str = "", **fields: Any) -> LaunchPlan:
        fields.setdefault("workspace", self.workspace)
        settings = CLISettings.from_spec(config(**fields))
        spec = ExecutionSpec(run_id="r", target="claude-x", input=prompt, session_id=session_id)
        return settings.plan(spec, fake_which, ENVIRON)

    def test_argPlacement(self) -> None:
        plan = self.plan(mode="plan", args=["-p", "--permission-mode", "{mode}", "--model={model}"])
        self.assertEqual(plan.executable, "/opt/agents/bin/claude")
        self.assertEqual(
            plan.argv,
            ["claude", "-p", "--permission-mode", "plan", "--model=claude-x", "fix the bug"],
        )
        self.assertIsNone(plan.stdin)
        self.assertEqual(plan.cwd, self.workspace)

    def test_resumeArgsBeforeThePrompt(self) -> None:
        plan = self.plan(session_id="abc-123", args=["-p"])
        self.assertEqual(plan.argv, ["claude", "-p", "--resume=abc-123", "fix the bug"])

    def test_codexStyleResume(self) -> None:
        plan = self.plan(
            session_id="0199a213-81c0",
            command="codex",
            args=["exec", "--json", "--model", "{model}"],
            resume_args=["resume", "{session_id}"],
        )
        self.assertEqual(
            plan.argv,
            [
                "codex",
                "exec",
                "--json",
                "--model",
                "claude-x",
                "resume",
                "0199a213-81c0",
                "fix the bug",
            ],
        )

    def test_flagLikePromptCannotBecomeAFlag(self) -> None:
        self.assertEqual(self.plan("--help me", args=["-p"]).argv[-1], " --help me")

    def test_chatInputPromptIsTheLastUserMessage(self) -> None:
        chat = json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": [{"type": "text", "text": "second"}]},
                ]
            }
        )
        self.assertEqual(self.plan(chat, args=["-p"]).argv[-1], "second")

    def test_stdinPlacement(self) -> None:
        plan = self.plan("héllo", args=["-p"], prompt_placement="stdin")
        self.assertEqual(plan.argv, ["claude", "-p"])
        self.assertEqual(plan.stdin, "héllo".encode())

    def test_placeholderPlacementSubstitutesOnce(self) -> None:
        plan = self.plan(
            "use {model} and {mode}",
            args=["run", "--prompt={prompt}", "--", "{prompt}"],
            prompt_placement="placeholder",
            mode="fast",
        )
        self.assertEqual(
            plan.argv,
            ["claude", "run", "--prompt=use {model} and {mode}", "--", "use {model} and {mode}"],
        )

    def test_emptyPlaceholdersDropTheirOption(self) -> None:
        values = {"model": "m", "mode": "", "session_id": ""}
        self.assertEqual(
            expand_args(
                [
                    "-p",
                    "--permission-mode",
                    "{mode}",
                    "--sandbox={mode}",
                    "--resume={session_id}",
                    "--model",
                    "{model}",
                    "x{mode}y",
                    "{unknown}",
                ],
                values,
            ),
            ["-p", "--model", "m", "xy", "{unknown}"],
        )

    def test_workspaceFromSpecWins(self) -> None:
        other = os.path.abspath(self.mktemp())
        os.makedirs(other)
        settings = CLISettings.from_spec(config(workspace=self.workspace, args=["{workspace}"]))
        spec = ExecutionSpec(run_id="r", target="t", input="hi", workspace=other)
        plan = settings.plan(spec, fake_which, ENVIRON)
        self.assertEqual((plan.cwd, plan.argv[1]), (other, other))

    def test_relativeCommandIsRelativeToTheWorkspace(self) -> None:
        plan = self.plan(command=os.path.join("bin", "agent"), args=[])
        self.assertEqual(plan.executable, os.path.join(self.workspace, "bin", "agent"))

    def test_launchErrors(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"input": "   "}, "the input has no user prompt"),
            ({"input": '{"messages": 3}'}, "input JSON needs a non-empty 'messages' list"),
            ({"workspace": "/nonexistent/ws"}, "workspace '/nonexistent/ws' does not exist"),
            ({"session_id": "-rf"}, "invalid session id"),
            ({"session_id": "a b"}, "invalid session id"),
        ]
        settings = CLISettings.from_spec(config(workspace=self.workspace))
        for fields, message in cases:
            values: dict[str, Any] = {"run_id": "r", "target": "t", "input": "hi", **fields}
            spec = ExecutionSpec(**values)
            with self.assertRaises(LaunchError) as caught:
                settings.plan(spec, fake_which, ENVIRON)
            self.assertEqual(str(caught.exception), message)
        missing = CLISettings.from_spec(config(command="missing", workspace=self.workspace))
        with self.assertRaises(LaunchError) as caught:
            missing.plan(ExecutionSpec(run_id="r", target="t", input="hi"), fake_which, ENVIRON)
        self.assertEqual(str(caught.exception), "command 'missing' not found")
        no_resume = CLISettings.from_spec(config(resume_args=[], workspace=self.workspace))
        with self.assertRaises(LaunchError) as caught:
            no_resume.plan(
                ExecutionSpec(run_id="r", target="t", input="hi", session_id="s1"),
                fake_which,
                ENVIRON,
            )
        self.assertEqual(
            str(caught.exception), "this adapter cannot resume sessions (no resume_args)"
        )

    def test_environment(self) -> None:
        plan = self.plan(
            env={"CLAUDE_CONFIG_DIR": "/etc/claude", "CLAUDECODE": "1", "LANG": "en_US.UTF-8"},
            settings={"inherit_env": "ANTHROPIC_API_KEY, NOT_SET"},
        )
        self.assertEqual(
            plan.env,
            {
                "PATH": "/usr/bin",
                "HOME": "/home/node",
                "LANG": "en_US.UTF-8",
                "USER": "node",
                "ANTHROPIC_API_KEY": "from-node-env",
                "CLAUDE_CONFIG_DIR": "/etc/claude",
            },
        )
        self.assertNotIn("must-not-leak", repr(plan))

    def test_buildEnvDefaultsToTheNodeEnvironment(self) -> None:
        env = build_env({})
        self.assertNotIn("CLAUDECODE", env)
        self.assertLessEqual(set(env), set(cli.BASE_ENV))

    def test_configValidation(self) -> None:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"command": ""}, "command is required"),
            ({"output_format": "xml"}, "output_format must be one of"),
            ({"prompt_placement": "file"}, "prompt_placement must be one of"),
            ({"prompt_placement": "placeholder"}, "needs {prompt}"),
            ({"args": ["{prompt}"]}, "needs prompt_placement placeholder"),
            ({"settings": {"kill_grace_ms": "soon"}}, "settings.kill_grace_ms must be an integer"),
            ({"settings": {"exit_grace_ms": "-1"}}, "settings.exit_grace_ms must be >= 0"),
        ]
        for fields, message in bad:
            with self.assertRaises(ValueError) as caught:
                CLISettings.from_spec(config(**fields))
            self.assertIn(message, str(caught.exception))
            self.assertIn("'claude'", str(caught.exception))

    def test_defaults(self) -> None:
        settings = CLISettings.from_spec(AdapterSpec(name="", type="cli", command="agent"))
        self.assertEqual(
            (
                settings.output_format,
                settings.prompt_placement,
                settings.kill_grace,
                settings.exit_grace,
                settings.max_line_bytes,
                settings.request_timeout,
                settings.idle_timeout,
            ),
            ("text", "arg", 5.0, 5.0, 8 * 1024 * 1024, 0.0, 0.0),
        )


# -- the run lifecycle --------------------------------------------------------------------------


class LifecycleTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness(
            self,
            request_timeout_ms=60000,
            settings={"kill_grace_ms": "2000", "exit_grace_ms": "3000"},
        )

    def tearDown(self) -> None:
        self.assertEqual(self.h.clock.getDelayedCalls(), [])

    def test_spawn(self) -> None:
        self.h.execute()
        spawned = self.h.last
        self.assertEqual(spawned["executable"], sys.executable)
        self.assertEqual(
            spawned["args"],
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                SETSID_SHIM,
                "/opt/agents/bin/claude",
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                "claude-x",
                "hello",
            ],
        )
        self.assertIs(spawned["usePTY"], False)
        self.assertEqual(spawned["path"], self.h.workspace)
        # stdin is the null device (an fd), never a pipe left open.
        self.assertIsInstance(spawned["childFDs"][0], int)
        self.assertEqual((spawned["childFDs"][1], spawned["childFDs"][2]), ("r", "r"))
        self.assertFalse(spawned["transport"].stdin_closed)
        self.assertEqual(self.h.events, [RuntimeEvent.start()])
        self.h.exit(0)

    def test_stdinPromptIsWrittenThenClosed(self) -> None:
        self.h = Harness(self, prompt_placement="stdin")
        self.h.execute("from stdin")
        self.assertEqual(self.h.last["childFDs"][0], "w")
        self.assertEqual(self.h.last["transport"].written, b"from stdin")
        self.assertTrue(self.h.last["transport"].stdin_closed)
        self.h.exit(0)

    def test_launchErrorIsAnErrorEvent(self) -> None:
        d = self.h.execute("hi", workspace="/nonexistent/ws")
        self.successResultOf(d)
        self.assertEqual(
            self.h.events, [RuntimeEvent.failed("workspace '/nonexistent/ws' does not exist")]
        )
        self.assertEqual(self.h.clock.spawned, [])

    def test_timeout(self) -> None:
        d = self.h.execute()
        pid = self.h.last["transport"].pid
        self.h.out(ndjson(INIT))
        self.h.clock.advance(59.9)
        self.assertEqual(self.h.group_signals, [])
        self.h.clock.advance(0.1)
        self.assertEqual(
            self.h.events[-1],
            RuntimeEvent(EventType.ERROR, error="timed out after 60s", session_id="S"),
        )
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGTERM)])
        self.assertNoResult(d)
        self.h.clock.advance(2)
        self.assertEqual(self.h.group_signals[-1], (pid, signal.SIGKILL))
        self.assertNoResult(d)
        self.h.exit(None, signal.SIGKILL)
        self.successResultOf(d)
        self.assertEqual(self.h.types().count(EventType.ERROR), 1)

    def test_specTimeoutWins(self) -> None:
        d = self.h.execute(timeout_sec=5)
        self.h.clock.advance(5)
        self.assertEqual(self.h.events[-1].error, "timed out after 5s")
        self.h.exit(None, signal.SIGTERM)
        self.successResultOf(d)

    def test_idleTimeoutIsResetByOutput(self) -> None:
        self.h = Harness(self, idle_timeout_ms=1000)
        d = self.h.execute()
        for _ in range(5):
            self.h.clock.advance(0.9)
            self.h.out(b"{}\n")
        self.h.clock.advance(0.9)
        self.h.err(b"still working\n")
        self.assertEqual(self.h.group_signals, [])
        self.h.clock.advance(1)
        self.assertEqual(self.h.events[-1].error, "timed out: no output for 1s")
        self.h.exit(None, signal.SIGTERM)
        self.successResultOf(d)

    def test_cancel(self) -> None:
        d = self.h.execute()
        transport = self.h.last["transport"]
        self.h.out(ndjson(INIT, delta(0, "Hel")))
        d.cancel()
        self.assertEqual(self.h.group_signals, [(transport.pid, signal.SIGTERM)])
        self.assertNoResult(d)
        # Output after cancel is not emitted, nor is anything at the end.
        self.h.out(ndjson(delta(0, "lo"), RESULT))
        self.h.clock.advance(1.9)
        self.assertNoResult(d)
        self.h.clock.advance(0.1)
        self.assertEqual(self.h.group_signals[-1], (transport.pid, signal.SIGKILL))
        self.h.exit(None, signal.SIGKILL)
        self.failureResultOf(d, CancelledError)
        self.assertEqual(self.h.types(), [EventType.START, EventType.DELTA])

    def test_cancelTwiceStillWaitsForTheProcess(self) -> None:
        d = self.h.execute()
        d.cancel()
        d.cancel()
        self.assertNoResult(d)
        self.h.exit(None, signal.SIGTERM)
        self.failureResultOf(d, CancelledError)

    def test_cancelledAgentThatExitsPromptlyStopsTheKillTimer(self) -> None:
        d = self.h.execute()
        d.cancel()
        self.h.exit(143)
        self.failureResultOf(d, CancelledError)
        # SIGTERM, then the sweep of whatever was left in the group; no SIGKILL timer pending.
        pid = self.h.last["transport"].pid
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGTERM), (pid, signal.SIGKILL)])

    def test_groupNotYetFormedFallsBackToTheProcess(self) -> None:
        d = self.h.execute()
        self.h.group_gone = True
        d.cancel()
        self.assertEqual(self.h.last["transport"].signals, [signal.SIGTERM])
        self.h.exit(None, signal.SIGTERM)
        self.failureResultOf(d, CancelledError)

    def test_exitSweepsTheGroup(self) -> None:
        d = self.h.execute()
        self.h.out(ndjson(RESULT))
        self.h.exit(0)
        self.successResultOf(d)
        pid = self.h.last["transport"].pid
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGKILL)])

    def test_agentLingeringAfterItsResultIsStopped(self) -> None:
        d = self.h.execute()
        pid = self.h.last["transport"].pid
        self.h.out(ndjson(RESULT))
        self.assertEqual(self.h.types()[-1], EventType.COMPLETE)
        self.h.clock.advance(3)
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGTERM)])
        self.h.exit(None, signal.SIGTERM)
        self.successResultOf(d)
        self.assertEqual(self.h.types().count(EventType.COMPLETE), 1)
        self.assertEqual(len(self.h.events), 3)

    def test_pipesHeldOpenAfterExitAreClosed(self) -> None:
        d = self.h.execute()
        protocol = self.h.last["protocol"]
        self.h.out(ndjson(RESULT))
        protocol.processExited(Failure(ProcessDone(0)))
        self.h.clock.advance(DRAIN_SECONDS)
        self.assertTrue(self.h.last["transport"].lost_connection)
        self.assertNoResult(d)
        protocol.processEnded(Failure(ProcessDone(0)))
        self.successResultOf(d)

    def test_emitFailureIsLoggedNotRaised(self) -> None:
        def broken(event: RuntimeEvent) -> None:
            raise RuntimeError("downstream broke")

        spec = ExecutionSpec(run_id="r1", target="claude-x", input="hi")
        d = self.h.provider.execute(spec, broken)
        self.h.out(ndjson(RESULT))
        self.h.exit(0)
        self.successResultOf(d)
        # start, the result text and complete: each failed emit is logged, the run goes on.
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 3)


class SessionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness(self)

    def tearDown(self) -> None:
        self.assertEqual(self.h.clock.getDelayedCalls(), [])

    def test_reactorMustSpawnProcesses(self) -> None:
        error = self.assertRaises(ValueError, cli.build, config(), AdapterContext(Clock()))
        self.assertIn("cannot spawn processes", str(error))

    def test_capabilities(self) -> None:
        caps = self.h.provider.capabilities()
        self.assertEqual(
            (caps.max_concurrency, caps.streaming, caps.tools, caps.sessions),
            (1, True, False, True),
        )
        provider = cli.build(
            config(max_concurrency=3), AdapterContext(reactor=self.h.clock, http=None)
        )
        self.assertEqual(provider.capabilities().max_concurrency, 3)
        self.assertEqual((provider.name, provider.type), ("claude", "cli"))

    def test_sessionsAreRememberedPerTarget(self) -> None:
        self.h.clock.advance(100)
        d = self.h.execute()
        self.h.out(ndjson(INIT))
        self.assertEqual(
            self.h.provider.list_sessions(),
            [{"session_id": "S", "target": "claude-x", "active": True, "last_used": 100.0}],
        )
        self.h.clock.advance(5)
        self.h.out(ndjson(RESULT))
        self.h.exit(0)
        self.successResultOf(d)
        self.assertEqual(
            self.h.provider.list_sessions(),
            [{"session_id": "S", "target": "claude-x", "active": False, "last_used": 105.0}],
        )

    def test_resumedSessionIsActiveFromTheStart(self) -> None:
        d = self.h.execute(session_id="S")
        self.assertEqual(self.h.events, [RuntimeEvent.start(session_id="S")])
        self.assertTrue(self.h.provider.list_sessions()[0]["active"])
        self.h.out(ndjson(RESULT))
        self.h.exit(0)
        self.successResultOf(d)

    def test_terminateUnknownSession(self) -> None:
        self.assertFalse(self.successResultOf(self.h.provider.terminate_session("claude-x", "S")))

    def test_terminateIdleSession(self) -> None:
        d = self.h.execute()
        self.h.out(ndjson(RESULT))
        self.h.exit(0)
        self.successResultOf(d)
        self.assertFalse(self.successResultOf(self.h.provider.terminate_session("other", "S")))
        self.assertTrue(self.successResultOf(self.h.provider.terminate_session("claude-x", "S")))
        self.assertEqual(self.h.provider.list_sessions(), [])

    def test_terminateRunningSession(self) -> None:
        d = self.h.execute()
        pid = self.h.last["transport"].pid
        self.h.out(ndjson(INIT))
        terminated = self.h.provider.terminate_session("claude-x", "S")
        self.assertNoResult(terminated)
        self.assertEqual(self.h.group_signals, [(pid, signal.SIGTERM)])
        self.assertEqual(self.h.events[-1], RuntimeEvent.cancelled("session terminated"))
        # The result that raced the termination is not emitted and does not revive the session.
        self.h.out(ndjson(RESULT))
        self.h.exit(None, signal.SIGTERM)
        self.assertTrue(self.successResultOf(terminated))
        self.successResultOf(d)
        self.assertEqual(self.h.types(), [EventType.START, EventType.CANCELLED])
        self.assertEqual(self.h.provider.list_sessions(), [])

    def test_codexCumulativeUsageAcrossRuns(self) -> None:
        first = self.h.execute()
        self.h.out(ndjson(CODEX_STREAM[0], CODEX_STREAM[-1]))
        self.h.exit(0)
        self.successResultOf(first)
        second = self.h.execute(session_id="0199a213-81c0")
        doubled = {
            "input_tokens": 2 * 24763,
            "cached_input_tokens": 2 * 24448,
            "output_tokens": 2 * 122,
            "reasoning_output_tokens": 2 * 64,
        }
        self.h.out(ndjson(CODEX_STREAM[0], {"type": "turn.completed", "usage": doubled}))
        self.h.exit(0)
        self.successResultOf(second)
        usages = [e.usage for e in self.h.events if e.type == EventType.COMPLETE]
        self.assertEqual(usages[0], usages[1])
