"""
The ``cli`` adapter against real processes (real reactor): ``python -m
iop.testing.fake_cli_agent`` run through the adapter, streaming, resuming, failing, crashing,
being cancelled, timing out and having its session terminated, with every process of the run's
group gone afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater

from iop.node.adapters.cli import CLIProvider, build
from iop.runtime import AdapterContext, AdapterSpec, EventType, ExecutionSpec, RuntimeEvent, Usage
from iop.testing import fake_cli_agent as fake

AGENT = ["-m", "iop.testing.fake_cli_agent", "-p"]
STREAM = [*AGENT, "--output-format", "stream-json", "--verbose", "--model", "{model}"]


def make_provider(
    workspace: Path,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    **fields: object,
) -> CLIProvider:
    values: dict[str, object] = {
        "name": "fake",
        "type": "cli",
        "command": sys.executable,
        "args": STREAM if args is None else args,
        "resume_args": ["--resume={session_id}"],
        "output_format": "stream-json",
        "workspace": str(workspace),
        "env": env or {},
        **fields,
    }
    config = AdapterSpec(**values)  # type: ignore[arg-type]
    provider = build(config, AdapterContext(reactor=reactor, http=None))
    assert isinstance(provider, CLIProvider)
    return provider


def spec(prompt: str = "hello there", **fields: object) -> ExecutionSpec:
    return ExecutionSpec(run_id="r1", target="fake-model", input=prompt, **fields)  # type: ignore[arg-type]


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def eventually(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await sleep(0.02)


def pids(pidfile: Path) -> list[int]:
    if not pidfile.exists():
        return []
    return [int(line) for line in pidfile.read_text().split()]


def gone(pid: int) -> bool:
    """
    The process no longer exists. A killed grandchild is reparented to init, which may take a
    while to reap it (some container inits poll); until then it is a zombie: dead, holding
    nothing but its process table entry, so a zombie counts as gone.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


async def all_gone(pid_list: list[int], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(p) for p in pid_list):
            return True
        await sleep(0.02)
    return all(gone(p) for p in pid_list)


def texts(events: list[RuntimeEvent], kind: EventType) -> str:
    return "".join(e.delta for e in events if e.type == kind)


@pytest_twisted.ensureDeferred
async def test_streams_deltas_and_completes(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_TOKENS": "4", "FAKE_CLI_DELAY_MS": "5"})
    events: list[RuntimeEvent] = []
    prompt = "please think about it"
    await provider.execute(spec(prompt), events.append)

    assert events[0].type == EventType.START
    deltas = [e for e in events if e.type == EventType.DELTA]
    assert len(deltas) == len(fake.reply_pieces(prompt, 4))
    assert texts(events, EventType.DELTA) == fake.reply_text(prompt, 4)
    assert texts(events, EventType.REASONING_DELTA) == fake.THINKING
    final = events[-1]
    assert final.type == EventType.COMPLETE
    assert [e.type for e in events].count(EventType.COMPLETE) == 1
    raw = fake.usage_for(prompt, 4)
    cached = raw["cache_read_input_tokens"]
    assert final.usage == Usage(
        input_tokens=raw["input_tokens"] + cached + raw["cache_creation_input_tokens"],
        output_tokens=raw["output_tokens"],
        cached_input_tokens=cached,
        cache_write_tokens=raw["cache_creation_input_tokens"],
    )
    assert final.session_id
    [session] = provider.list_sessions()
    assert session["session_id"] == final.session_id
    assert session["target"] == "fake-model"
    assert session["active"] is False


@pytest_twisted.ensureDeferred
async def test_whole_messages_without_partial_stream(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_PARTIAL": "0"})
    events: list[RuntimeEvent] = []
    await provider.execute(spec("think it over"), events.append)
    assert [e.type for e in events] == [
        EventType.START,
        EventType.REASONING_DELTA,
        EventType.DELTA,
        EventType.COMPLETE,
    ]
    assert events[1].delta == fake.THINKING
    assert events[2].delta == fake.reply_text("think it over", 5)


@pytest_twisted.ensureDeferred
async def test_resume_keeps_the_session_id(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    first: list[RuntimeEvent] = []
    await provider.execute(spec("one"), first.append)
    session_id = first[-1].session_id
    second: list[RuntimeEvent] = []
    await provider.execute(spec("two", session_id=session_id), second.append)
    assert second[0] == RuntimeEvent.start(session_id=session_id)
    assert second[-1].type == EventType.COMPLETE
    assert second[-1].session_id == session_id
    assert texts(second, EventType.DELTA) == fake.reply_text("two", 5)
    assert [s["session_id"] for s in provider.list_sessions()] == [session_id]


@pytest_twisted.ensureDeferred
async def test_error_result_is_an_error_event(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_MODE": "error", "FAKE_CLI_ERROR": "quota gone"})
    events: list[RuntimeEvent] = []
    await provider.execute(spec(), events.append)
    final = events[-1]
    assert final.type == EventType.ERROR
    assert final.error == "quota gone"
    assert final.session_id


@pytest_twisted.ensureDeferred
async def test_crash_reports_stderr(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_MODE": "crash"})
    events: list[RuntimeEvent] = []
    await provider.execute(spec(), events.append)
    final = events[-1]
    assert final.type == EventType.ERROR
    assert "agent exited (code 3) without a result" in final.error
    assert "segmentation fault (simulated)" in final.error


@pytest_twisted.ensureDeferred
async def test_stream_json_without_verbose(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, args=[*AGENT, "--output-format", "stream-json"])
    events: list[RuntimeEvent] = []
    await provider.execute(spec(), events.append)
    assert events[-1].type == EventType.ERROR
    assert fake.STREAM_JSON_NEEDS_VERBOSE in events[-1].error


@pytest_twisted.ensureDeferred
async def test_text_output_with_prompt_on_stdin(tmp_path: Path) -> None:
    provider = make_provider(
        tmp_path,
        {"FAKE_CLI_TOKENS": "2"},
        args=[*AGENT, "--output-format", "text"],
        output_format="text",
        prompt_placement="stdin",
    )
    events: list[RuntimeEvent] = []
    await provider.execute(spec("-from stdin"), events.append)
    assert texts(events, EventType.DELTA) == fake.reply_text("-from stdin", 2)
    assert events[-1] == RuntimeEvent.complete()


@pytest_twisted.ensureDeferred
async def test_json_output(tmp_path: Path) -> None:
    provider = make_provider(
        tmp_path, args=[*AGENT, "--output-format", "json"], output_format="json"
    )
    events: list[RuntimeEvent] = []
    await provider.execute(spec("json please"), events.append)
    assert texts(events, EventType.DELTA) == fake.reply_text("json please", 5)
    assert events[-1].type == EventType.COMPLETE
    assert events[-1].usage is not None
    assert events[-1].usage.cached_input_tokens == fake.CACHE_READ_TOKENS


@pytest_twisted.ensureDeferred
async def test_codex_shape_and_cumulative_usage(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_MODE": "codex"})
    prompt = "think first"
    first: list[RuntimeEvent] = []
    await provider.execute(spec(prompt), first.append)
    assert texts(first, EventType.DELTA) == fake.reply_text(prompt, 5)
    assert texts(first, EventType.REASONING_DELTA) == fake.THINKING
    usage = first[-1].usage
    assert usage is not None
    assert usage.reasoning_tokens == len(fake.thinking_pieces(prompt))
    assert usage.cached_input_tokens == fake.CACHE_READ_TOKENS
    # The resumed thread reports cumulative usage; the adapter reports this turn's share.
    second: list[RuntimeEvent] = []
    await provider.execute(spec(prompt, session_id=first[-1].session_id), second.append)
    assert second[-1].type == EventType.COMPLETE
    assert second[-1].usage == usage


@pytest_twisted.ensureDeferred
async def test_cancel_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    provider = make_provider(
        tmp_path,
        {"FAKE_CLI_MODE": "child", "FAKE_CLI_PIDFILE": str(pidfile), "FAKE_CLI_IGNORE_TERM": "0"},
    )
    events: list[RuntimeEvent] = []
    d = provider.execute(spec(), events.append)
    await eventually(lambda: len(pids(pidfile)) == 2)
    settled: list[object] = []
    d.addBoth(settled.append)
    d.cancel()
    await eventually(lambda: bool(settled))
    assert settled[0].check(CancelledError)  # type: ignore[attr-defined]
    assert await all_gone(pids(pidfile)), "a process of the run outlived the cancel"
    assert all(not e.terminal for e in events)
    assert provider.list_sessions()[0]["active"] is False


@pytest_twisted.ensureDeferred
async def test_sigterm_ignored_then_sigkill_after_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    provider = make_provider(
        tmp_path,
        {"FAKE_CLI_MODE": "child", "FAKE_CLI_PIDFILE": str(pidfile), "FAKE_CLI_IGNORE_TERM": "1"},
        settings={"kill_grace_ms": "300"},
    )
    d = provider.execute(spec(), lambda e: None)
    await eventually(lambda: len(pids(pidfile)) == 2)
    settled: list[object] = []
    d.addBoth(settled.append)
    started = time.monotonic()
    d.cancel()
    await sleep(0.15)
    assert not settled, "settled before the process exited"
    assert not any(gone(p) for p in pids(pidfile))
    await eventually(lambda: bool(settled))
    assert time.monotonic() - started >= 0.3
    assert await all_gone(pids(pidfile))


@pytest_twisted.ensureDeferred
async def test_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    provider = make_provider(
        tmp_path,
        {"FAKE_CLI_MODE": "hang", "FAKE_CLI_PIDFILE": str(pidfile)},
        settings={"kill_grace_ms": "500"},
    )
    events: list[RuntimeEvent] = []
    started = time.monotonic()
    await provider.execute(spec(timeout_sec=0.5), events.append)
    assert 0.5 <= time.monotonic() - started < 5
    assert events[-1].type == EventType.ERROR
    assert events[-1].error == "timed out after 0.5s"
    assert await all_gone(pids(pidfile))


@pytest_twisted.ensureDeferred
async def test_idle_timeout(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, {"FAKE_CLI_MODE": "hang"}, idle_timeout_ms=400)
    events: list[RuntimeEvent] = []
    await provider.execute(spec(), events.append)
    assert events[-1].type == EventType.ERROR
    assert events[-1].error.startswith("timed out: no output for 0.4s")


@pytest_twisted.ensureDeferred
async def test_terminate_session_kills_a_running_session(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    provider = make_provider(
        tmp_path,
        {"FAKE_CLI_MODE": "hang", "FAKE_CLI_PIDFILE": str(pidfile), "FAKE_CLI_SESSION_ID": "s-1"},
    )
    events: list[RuntimeEvent] = []
    d: Deferred[None] = provider.execute(spec(), events.append)
    await eventually(lambda: any(s["active"] for s in provider.list_sessions()))
    assert provider.list_sessions()[0]["session_id"] == "s-1"

    assert await provider.terminate_session("fake-model", "s-1") is True
    assert d.called
    assert await all_gone(pids(pidfile))
    assert events[-1] == RuntimeEvent.cancelled("session terminated")
    assert provider.list_sessions() == []
    assert await provider.terminate_session("fake-model", "s-1") is False
