# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
The ``cli`` adapter: CLI coding agents (Claude Code ``claude -p``, ``codex exec --json``,
``gemini -p``) run headless, one subprocess per run.

Configuration (:class:`~iop.runtime.spec.AdapterSpec`):

``command``, ``args``
    argv is ``[command, *args]`` (``command`` is looked up on the child's ``PATH``; a relative
    path with a slash is relative to the workspace). ``args`` may hold placeholders, substituted
    in one pass (text that a substitution brings in is never substituted again): ``{model}``
    (the run's target), ``{mode}`` (``spec.mode``), ``{workspace}``, ``{session_id}`` and, with
    ``prompt_placement: placeholder`` only, ``{prompt}``. An argument that is exactly one
    placeholder resolving to an empty value is dropped, together with a directly preceding
    option (``["--permission-mode", "{mode}"]`` disappears when ``mode`` is empty); so is an
    argument ``--flag={x}`` whose value is empty.
``resume_args``
    Appended after ``args`` when the run carries a ``session_id``, with ``{session_id}``
    substituted (``["--resume={session_id}"]`` for Claude: one token, so an id can never become a
    flag; ``["resume", "{session_id}"]`` for Codex). A session id must look like one (letters,
    digits, ``._:-``, not starting with ``-``). A run with a session id on an adapter that has
    neither ``resume_args`` nor ``{session_id}`` in ``args`` fails rather than silently starting
    a new conversation.
``prompt_placement``
    ``arg`` (default): the prompt is the final argument (a prompt starting with ``-`` gets a
    leading space so it cannot parse as a flag). ``stdin``: the prompt is written to stdin, which
    is then closed. ``placeholder``: the prompt goes only where ``{prompt}`` appears in ``args``.
    stdin is the null device unless the prompt is written to it: never left open.
``output_format``
    ``text`` (default): stdout chunks are deltas, exit 0 completes. ``json``: one final object,
    Claude's ``result`` or Gemini's ``{session_id, response, stats}`` (a Claude ``--verbose``
    array is read message by message). ``stream-json``: NDJSON from Claude, Codex or Gemini,
    told apart by the lines themselves.
``workspace``
    The working directory when the run names none (``ExecutionSpec.workspace`` wins); it must
    exist.
``env``
    Added to a minimal inherited base (``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR``,
    ``USER``, ``SYSTEMROOT`` when present). ``CLAUDECODE`` is always dropped (Claude's nesting
    guard).
``request_timeout_ms``, ``idle_timeout_ms``
    Whole-run limit (``ExecutionSpec.timeout_sec`` wins when set) and the longest silence on
    stdout/stderr; 0 = none. Either kills the process group and ends the run with ``error``.
``max_concurrency``
    Capacity (0 means 1).
``settings``
    ``kill_grace_ms`` (default 5000): SIGTERM to SIGKILL. ``exit_grace_ms`` (default 5000): how
    long an agent may keep running after its terminal event before it is stopped.
    ``inherit_env``: comma-separated names of further variables to inherit from the Node's
    environment (for credentials that must not be written into config).
    ``max_line_bytes`` (default 8 MiB): the longest NDJSON line, or the whole ``json`` output.

Process groups: Twisted's ``spawnProcess`` has no ``preexec_fn`` and, without a PTY, leaves the
child in the Node's own process group. Each agent is therefore started through a small Python
shim (``python -I -S -c`` with :data:`SETSID_SHIM`) that calls ``os.setsid()`` and then
``execvp``s the agent, so the agent leads a new session and process group whose id is the pid
Twisted reports. Cancel, timeouts and ``terminate_session`` signal the whole group: SIGTERM,
then SIGKILL after ``kill_grace_ms``. Whenever the agent itself has exited, whatever is left of
its group (tool processes, MCP servers) is sent SIGKILL, and pipes still held open by processes
that escaped the group are closed after a short drain so the run can end.

Events: ``start`` once the process is spawned; ``delta`` / ``reasoning_delta`` as they arrive;
the terminal (``complete`` with usage and session id, or ``error``) as soon as the stream says
so, but the run's Deferred fires only after the process has exited. A stream without a terminal
event is an ``error`` whatever the exit code. Cancelling the Deferred emits nothing further (the
caller reports ``cancelled``) and the Deferred fails with ``CancelledError`` only once the
process is gone.

Usage is normalized to one convention: ``input_tokens`` counts every prompt token and
``cached_input_tokens`` the part read from cache. Claude reports its cache reads and writes
outside ``input_tokens``, so they are added in; Codex reports cumulative thread usage, so a
resumed session reports the difference from the last snapshot this adapter saw.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from iop.formats.ndjson import LineFramer
from iop.formats.usage import anthropic_usage, token_count
from iop.runtime.chat_input import InputError, parse_chat_input
from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.interfaces import (
    AdapterContext,
    Capabilities,
    Emit,
    ExecutionSpec,
    IProvider,
    ISessionTerminator,
)
from iop.runtime.spec import AdapterSpec

OUTPUT_FORMATS = ("text", "json", "stream-json")
PROMPT_PLACEMENTS = ("arg", "stdin", "placeholder")
PLACEHOLDERS = ("model", "mode", "workspace", "session_id", "prompt")
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "SYSTEMROOT")
DROPPED_ENV = frozenset({"CLAUDECODE"})

DEFAULT_KILL_GRACE_MS = 5000
DEFAULT_EXIT_GRACE_MS = 5000
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
STDERR_TAIL_BYTES = 4096
# After the agent exited: how long descendants outside its group may hold stdout/stderr open.
DRAIN_SECONDS = 2.0
# Inactive sessions remembered per adapter instance (oldest forgotten first).
MAX_SESSIONS = 1024

# Run by ``python -I -S -c``: a new session (and process group) led by the agent, then exec.
SETSID_SHIM = (
    "import os, sys\n"
    "try:\n"
    "    os.setsid()\n"
    "except OSError:\n"
    "    pass\n"
    "try:\n"
    "    os.execv(sys.argv[1], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write('cannot run %r: %s\\n' % (sys.argv[1], e.strerror))\n"
    "    os._exit(127)\n"
)

_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_SESSION_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,255}$")

SignalGroup = Callable[[int, int], None]
# Find an executable: (command, PATH) -> absolute path or None.
Which = Callable[[str, str | None], str | None]


def which(command: str, path: str | None) -> str | None:
    return shutil.which(command, path=path)


class LaunchError(ValueError):
    """A run cannot be started (bad input, missing workspace or command); the message says why."""


# -- launch plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    """What one run executes: argv (``argv[0]`` as configured), environment, directory, stdin."""

    executable: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: str
    stdin: bytes | None


def substitute(arg: str, values: Mapping[str, str]) -> str:
    """Replace known ``{placeholder}``s in one pass; unknown braces are left alone."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def expand_args(args: Iterable[str], values: Mapping[str, str]) -> list[str]:
    """
    Substitute placeholders in ``args``. An argument that is exactly one placeholder with an
    empty value is dropped along with a directly preceding option (``-x``/``--xx`` without
    ``=``); ``--flag={x}`` with an empty ``x`` is dropped.
    """
    out: list[str] = []
    previousIsOption = False
    for arg in args:
        whole = _PLACEHOLDER.fullmatch(arg)
        if whole is not None and not values.get(whole.group(1), ""):
            if previousIsOption and out:
                out.pop()
            previousIsOption = False
            continue
        if arg.startswith("-") and "=" in arg:
            rest = arg.partition("=")[2]
            inner = _PLACEHOLDER.fullmatch(rest)
            if inner is not None and not values.get(inner.group(1), ""):
                previousIsOption = False
                continue
        out.append(substitute(arg, values))
        previousIsOption = arg.startswith("-") and "=" not in arg and arg not in ("-", "--")
    return out


def build_env(
    config_env: Mapping[str, str],
    inherit: Iterable[str] = (),
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's environment: a minimal inherited base, named extras, then ``config_env``."""
    source = os.environ if base is None else base
    env = {name: source[name] for name in (*BASE_ENV, *inherit) if name in source}
    env.update(config_env)
    for name in DROPPED_ENV:
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class CLISettings:
    """An adapter instance's validated configuration."""

    command: str
    args: tuple[str, ...]
    resume_args: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    workspace: str
    mode: str
    output_format: str
    prompt_placement: str
    request_timeout: float
    idle_timeout: float
    kill_grace: float
    exit_grace: float
    inherit_env: tuple[str, ...]
    max_line_bytes: int

    @classmethod
    def from_spec(cls, spec: AdapterSpec) -> CLISettings:
        name = spec.name
        if not spec.command:
            raise ValueError(f"cli adapter {name!r}: command is required")
        output_format = spec.output_format or "text"
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(
                f"cli adapter {name!r}: output_format must be one of {', '.join(OUTPUT_FORMATS)}"
            )
        placement = spec.prompt_placement or "arg"
        if placement not in PROMPT_PLACEMENTS:
            raise ValueError(
                f"cli adapter {name!r}: prompt_placement must be one of "
                f"{', '.join(PROMPT_PLACEMENTS)}"
            )
        hasPromptPlaceholder = any("{prompt}" in arg for arg in spec.args)
        if placement == "placeholder" and not hasPromptPlaceholder:
            raise ValueError(f"cli adapter {name!r}: prompt_placement placeholder needs {{prompt}}")
        if placement != "placeholder" and hasPromptPlaceholder:
            raise ValueError(
                f"cli adapter {name!r}: {{prompt}} in args needs prompt_placement placeholder"
            )
        settings = dict(spec.settings)

        def number(key: str, default: int) -> int:
            raw = settings.get(key, "").strip()
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(
                    f"cli adapter {name!r}: settings.{key} must be an integer"
                ) from None
            if value < 0:
                raise ValueError(f"cli adapter {name!r}: settings.{key} must be >= 0")
            return value

        return cls(
            command=spec.command,
            args=tuple(spec.args),
            resume_args=tuple(spec.resume_args),
            env=dict(spec.env),
            workspace=spec.workspace,
            mode=spec.mode,
            output_format=output_format,
            prompt_placement=placement,
            request_timeout=spec.request_timeout_ms / 1000.0,
            idle_timeout=spec.idle_timeout_ms / 1000.0,
            kill_grace=number("kill_grace_ms", DEFAULT_KILL_GRACE_MS) / 1000.0,
            exit_grace=number("exit_grace_ms", DEFAULT_EXIT_GRACE_MS) / 1000.0,
            inherit_env=tuple(
                n.strip() for n in settings.get("inherit_env", "").split(",") if n.strip()
            ),
            max_line_bytes=number("max_line_bytes", DEFAULT_MAX_LINE_BYTES)
            or DEFAULT_MAX_LINE_BYTES,
        )

    def plan(
        self,
        spec: ExecutionSpec,
        which: Which = which,
        environ: Mapping[str, str] | None = None,
    ) -> LaunchPlan:
        """Build the launch of ``spec``; raises :class:`LaunchError` with a clear reason."""
        try:
            prompt = parse_chat_input(spec.input).prompt()
        except InputError as e:
            raise LaunchError(str(e)) from None
        if not prompt.strip():
            raise LaunchError("the input has no user prompt")
        cwd = spec.workspace or self.workspace or "."
        if not os.path.isdir(cwd):
            raise LaunchError(f"workspace {cwd!r} does not exist")
        cwd = os.path.abspath(cwd)
        sessionId = spec.session_id
        if sessionId:
            if not _SESSION_ID.match(sessionId):
                raise LaunchError("invalid session id")
            if not self.resume_args and not any("{session_id}" in a for a in self.args):
                raise LaunchError("this adapter cannot resume sessions (no resume_args)")
        values = {
            "model": spec.target,
            "mode": self.mode,
            "workspace": cwd,
            "session_id": sessionId,
            "prompt": prompt,
        }
        argv = [self.command, *expand_args(self.args, values)]
        if sessionId:
            argv.extend(expand_args(self.resume_args, values))
        stdin: bytes | None = None
        if self.prompt_placement == "arg":
            argv.append(" " + prompt if prompt.startswith("-") else prompt)
        elif self.prompt_placement == "stdin":
            stdin = prompt.encode("utf-8")
        env = build_env(self.env, self.inherit_env, environ)
        command = self.command
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(cwd, command)
        executable = which(command, env.get("PATH", os.defpath))
        if executable is None:
            raise LaunchError(f"command {self.command!r} not found")
        return LaunchPlan(
            executable=os.path.abspath(executable), argv=argv, env=env, cwd=cwd, stdin=stdin
        )


# -- output interpretation ----------------------------------------------------------------------


class OutputSink(Protocol):
    """What the interpreters report to (the run)."""

    def session(self, session_id: str) -> None: ...

    def text(self, delta: str) -> None: ...

    def reasoning(self, delta: str) -> None: ...

    def complete(self, usage: Usage | None) -> None: ...

    def fail(self, reason: str) -> None:
        """The agent reported a failure (it will exit by itself)."""

    def abort(self, reason: str) -> None:
        """The output is unusable: fail the run and stop the process."""


def _index(value: object) -> int:
    """A content block index (0 when absent or not a non-negative integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def claude_usage(raw: object) -> Usage | None:
    """Claude ``usage`` (Anthropic's shape): cache reads and writes are part of the input."""
    usage = _dict(raw)
    return anthropic_usage(usage) if usage else None


def codex_usage(raw: object) -> Usage | None:
    usage = _dict(raw)
    if not usage:
        return None
    return Usage(
        input_tokens=token_count(usage.get("input_tokens")) or 0,
        output_tokens=token_count(usage.get("output_tokens")) or 0,
        reasoning_tokens=token_count(usage.get("reasoning_output_tokens")),
        cached_input_tokens=token_count(usage.get("cached_input_tokens")),
    )


def usage_since(current: Usage, baseline: Usage | None) -> Usage:
    """``current - baseline`` for cumulative counters; ``current`` when it is not cumulative."""
    if baseline is None:
        return current

    def minus(a: int | None, b: int | None) -> int | None:
        if a is None:
            return None
        return a - (b or 0)

    diff = Usage(
        input_tokens=current.input_tokens - baseline.input_tokens,
        output_tokens=current.output_tokens - baseline.output_tokens,
        reasoning_tokens=minus(current.reasoning_tokens, baseline.reasoning_tokens),
        cached_input_tokens=minus(current.cached_input_tokens, baseline.cached_input_tokens),
    )
    counts = (
        diff.input_tokens,
        diff.output_tokens,
        diff.reasoning_tokens or 0,
        diff.cached_input_tokens or 0,
    )
    return current if min(counts) < 0 else diff


def gemini_stream_usage(raw: object) -> Usage | None:
    stats = _dict(raw)
    if not stats:
        return None
    return Usage(
        input_tokens=token_count(stats.get("input_tokens")) or 0,
        output_tokens=token_count(stats.get("output_tokens")) or 0,
        cached_input_tokens=token_count(stats.get("cached")),
    )


def gemini_json_usage(raw: object) -> Usage | None:
    """Gemini ``json`` ``stats.models.*.tokens`` summed over models."""
    models = _dict(_dict(raw).get("models"))
    if not models:
        return None
    totals: dict[str, int | None] = {"prompt": 0, "candidates": 0, "cached": None, "thoughts": None}
    for model in models.values():
        tokens = _dict(_dict(model).get("tokens"))
        for key in totals:
            value = token_count(tokens.get(key))
            if value is not None:
                totals[key] = (totals[key] or 0) + value
    return Usage(
        input_tokens=totals["prompt"] or 0,
        output_tokens=totals["candidates"] or 0,
        reasoning_tokens=totals["thoughts"],
        cached_input_tokens=totals["cached"],
    )


def _error_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("message", "error", "type"):
            text = value.get(key)
            if isinstance(text, str) and text:
                return text
        return json.dumps(value, sort_keys=True)[:500]
    return ""


class StreamInterpreter:
    """
    One run's JSON messages (NDJSON lines, or the objects of a ``json`` output) → sink calls.

    Claude, Codex and Gemini are told apart by the message types themselves; ``result`` is
    Claude's when it has ``subtype``/``is_error`` and Gemini's when it has ``status``. Unknown
    types are ignored; after a terminal message everything is. Text from successive blocks or
    messages is separated by a blank line. Claude's whole ``assistant`` blocks are used only for
    blocks that streamed no deltas (keyed by message id and running block index), and messages
    of sub-agents (``parent_tool_use_id`` set) are not part of the answer.
    """

    def __init__(self, sink: OutputSink, usage_baseline: Usage | None = None) -> None:
        self.sink = sink
        self.session_id = ""
        self.finished = False
        # The last cumulative usage snapshot (Codex), to diff the next one against.
        self.cumulative_usage: Usage | None = usage_baseline
        self.notes: list[str] = []
        self.legacy = False
        self._streamMessageId = ""
        self._streamed: set[tuple[str, int]] = set()
        self._assistantBlocks: dict[str, int] = {}
        self._lastKey: dict[str, object] = {}
        self._textSeen = False
        self._counter = 0
        self._geminiTurn = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "system": self._system,
            "stream_event": self._streamEvent,
            "assistant": self._assistant,
            "result": self._result,
            "thread.started": self._threadStarted,
            "item.completed": self._itemCompleted,
            "turn.completed": self._turnCompleted,
            "turn.failed": self._turnFailed,
            "error": self._error,
            "init": self._init,
            "message": self._message,
            "tool_use": self._geminiTool,
            "tool_result": self._geminiTool,
        }

    # -- entry points -------------------------------------------------------------------------

    def feed(self, message: object) -> None:
        if self.finished or not isinstance(message, dict):
            return
        kind = message.get("type")
        if not isinstance(kind, str):
            if "msg" in message:
                self.legacy = True
            return
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(message)

    def feed_json_document(self, document: object) -> None:
        """A whole ``json`` output: a Claude result, a Claude array, or a Gemini object."""
        if isinstance(document, list):
            for message in document:
                self.feed(message)
        elif isinstance(document, dict) and isinstance(document.get("type"), str):
            self.feed(document)
        elif isinstance(document, dict):
            self._geminiJson(document)

    # -- emission helpers ---------------------------------------------------------------------

    def _session(self, value: object) -> None:
        if isinstance(value, str) and value and value != self.session_id:
            self.session_id = value
            self.sink.session(value)

    def _text(self, text: str, key: object, reasoning: bool = False) -> None:
        if not text:
            return
        channel = "reasoning" if reasoning else "text"
        last = self._lastKey.get(channel)
        if last is not None and last != key:
            text = "\n\n" + text
        self._lastKey[channel] = key
        if reasoning:
            self.sink.reasoning(text)
        else:
            self._textSeen = True
            self.sink.text(text)

    def _fresh(self) -> int:
        self._counter += 1
        return self._counter

    def _complete(self, usage: Usage | None) -> None:
        self.finished = True
        self.sink.complete(usage)

    def _fail(self, reason: str) -> None:
        self.finished = True
        self.sink.fail(reason or "the agent reported an error")

    # -- Claude -------------------------------------------------------------------------------

    def _system(self, message: dict[str, Any]) -> None:
        if message.get("subtype") == "init":
            self._session(message.get("session_id"))

    def _streamEvent(self, message: dict[str, Any]) -> None:
        if message.get("parent_tool_use_id"):
            return
        event = _dict(message.get("event"))
        kind = event.get("type")
        if kind == "message_start":
            messageId = _dict(event.get("message")).get("id")
            self._streamMessageId = messageId if isinstance(messageId, str) else ""
        elif kind == "content_block_delta":
            index = _index(event.get("index"))
            delta = _dict(event.get("delta"))
            key = (self._streamMessageId, index)
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self._streamed.add(key)
                self._text(delta["text"], key)
            elif delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
                self._streamed.add(key)
                self._text(delta["thinking"], key, reasoning=True)

    def _assistant(self, message: dict[str, Any]) -> None:
        if message.get("parent_tool_use_id"):
            return
        body = _dict(message.get("message"))
        error = message.get("error")
        if isinstance(error, str) and error:
            self.notes.append(error)
        rawId = body.get("id")
        messageId = rawId if isinstance(rawId, str) else ""
        content = body.get("content")
        if not isinstance(content, list):
            return
        for block in content:
            index = self._assistantBlocks.get(messageId, 0)
            self._assistantBlocks[messageId] = index + 1
            key = (messageId, index)
            if key in self._streamed:
                continue
            if ("", index) in self._streamed:  # streamed without a message_start to name it
                self._streamed.discard(("", index))
                continue
            block = _dict(block)
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                self._text(block["text"], key)
            elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
                self._text(block["thinking"], key, reasoning=True)

    def _result(self, message: dict[str, Any]) -> None:
        if "status" in message and "subtype" not in message and "is_error" not in message:
            self._geminiResult(message)
            return
        self._session(message.get("session_id"))
        subtype = message.get("subtype")
        if message.get("is_error") is True or (
            isinstance(subtype, str) and subtype not in ("", "success")
        ):
            errors = message.get("errors")
            parts = [_error_text(e) for e in errors] if isinstance(errors, list) else []
            reason = "; ".join(p for p in parts if p)
            if not reason and isinstance(message.get("result"), str):
                reason = message["result"]
            if not reason:
                reason = subtype if isinstance(subtype, str) and subtype else "error"
            status = message.get("api_error_status")
            if status is not None:
                reason = f"{reason} (api_error_status {status})"
            self._fail(reason)
            return
        result = message.get("result")
        if not self._textSeen and isinstance(result, str):
            self._text(result, ("result",))
        self._complete(claude_usage(message.get("usage")))

    # -- Codex --------------------------------------------------------------------------------

    def _threadStarted(self, message: dict[str, Any]) -> None:
        self._session(message.get("thread_id"))

    def _itemCompleted(self, message: dict[str, Any]) -> None:
        item = _dict(message.get("item"))
        kind = item.get("type", item.get("item_type"))
        text = item.get("text")
        key = ("item", item.get("id", self._fresh()))
        if kind in ("agent_message", "assistant_message") and isinstance(text, str):
            self._text(text, key)
        elif kind == "reasoning" and isinstance(text, str):
            self._text(text, key, reasoning=True)
        elif kind == "error":
            self.notes.append(_error_text(item.get("message")))

    def _turnCompleted(self, message: dict[str, Any]) -> None:
        current = codex_usage(message.get("usage"))
        usage = None
        if current is not None:
            usage = usage_since(current, self.cumulative_usage)
            self.cumulative_usage = current
        self._complete(usage)

    def _turnFailed(self, message: dict[str, Any]) -> None:
        self._fail(_error_text(message.get("error")))

    def _error(self, message: dict[str, Any]) -> None:
        # Codex and Gemini: a non-fatal warning; kept for the reason if no terminal follows.
        note = _error_text(message.get("message")) or _error_text(message.get("error"))
        if note:
            self.notes.append(note)

    # -- Gemini -------------------------------------------------------------------------------

    def _init(self, message: dict[str, Any]) -> None:
        self._session(message.get("session_id"))

    def _message(self, message: dict[str, Any]) -> None:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str):
            # Deltas of one reply share a key; a whole (non-delta) message is its own block.
            turn = self._geminiTurn if message.get("delta") else self._fresh()
            self._text(content, ("gemini", turn))

    def _geminiTool(self, message: dict[str, Any]) -> None:
        # Text after a tool call belongs to a new block.
        self._geminiTurn = self._fresh()

    def _geminiResult(self, message: dict[str, Any]) -> None:
        self._session(message.get("session_id"))
        if message.get("status") == "success":
            self._complete(gemini_stream_usage(message.get("stats")))
        else:
            reason = _error_text(message.get("error")) or f"status {message.get('status')}"
            self._fail(reason)

    def _geminiJson(self, document: dict[str, Any]) -> None:
        self._session(document.get("session_id"))
        error = document.get("error")
        if error:
            self._fail(_error_text(error))
            return
        response = document.get("response")
        if isinstance(response, str):
            self._text(response, ("response",))
        self._complete(gemini_json_usage(document.get("stats")))


class OutputDecoder(Protocol):
    """Turns one output format's stdout into sink calls."""

    def feed(self, data: bytes) -> None: ...

    def finish(self, exit_code: int | None) -> None:
        """stdout ended; ``exit_code`` is None when the process died of a signal."""


class TextDecoder:
    """``text``: every chunk is a delta (trailing newlines held back); exit 0 completes."""

    def __init__(self, sink: OutputSink) -> None:
        self.sink = sink
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._heldNewlines = ""

    def feed(self, data: bytes) -> None:
        self._text(self._decoder.decode(data))

    def _text(self, text: str) -> None:
        if not text:
            return
        text = self._heldNewlines + text
        body = text.rstrip("\r\n")
        self._heldNewlines = text[len(body) :]
        if body:
            self.sink.text(body)

    def finish(self, exit_code: int | None) -> None:
        self._text(self._decoder.decode(b"", final=True))
        if exit_code == 0:
            self.sink.complete(None)


class JsonDecoder:
    """``json``: the whole stdout is one JSON document, read at exit."""

    def __init__(self, interpreter: StreamInterpreter, max_bytes: int, sink: OutputSink) -> None:
        self.interpreter = interpreter
        self.max_bytes = max_bytes
        self.sink = sink
        self._buffer = bytearray()
        self._overflowed = False

    def feed(self, data: bytes) -> None:
        if self._overflowed:
            return
        self._buffer += data
        if len(self._buffer) > self.max_bytes:
            self._overflowed = True
            self._buffer.clear()
            self.sink.abort(f"agent output exceeds {self.max_bytes} bytes")

    def finish(self, exit_code: int | None) -> None:
        if self._overflowed:
            return
        raw = bytes(self._buffer).strip()
        if not raw:
            return
        try:
            document = json.loads(raw)
        except ValueError:
            # Some CLIs print log lines before the document; try its last line alone.
            try:
                document = json.loads(raw.rsplit(b"\n", 1)[-1])
            except ValueError:
                self.interpreter.notes.append("agent output is not valid JSON")
                return
        self.interpreter.feed_json_document(document)


class StreamJsonDecoder:
    """
    ``stream-json``: NDJSON, read leniently: lines not starting with ``{`` and lines that are not
    JSON are skipped (agents print log lines); a line over ``max_bytes`` aborts the run.
    """

    def __init__(self, interpreter: StreamInterpreter, max_bytes: int, sink: OutputSink) -> None:
        self.interpreter = interpreter
        self.sink = sink
        self.framer = LineFramer(max_bytes)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"{"):
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        self.interpreter.feed(message)

    def feed(self, data: bytes) -> None:
        if self.framer.overflow is not None:
            return
        for line in self.framer.feed(data):
            self._line(line)
        if self.framer.overflow is not None:
            self.sink.abort(f"agent output line exceeds {self.framer.max_line_length} bytes")

    def finish(self, exit_code: int | None) -> None:
        line = self.framer.finish()
        if line:
            self._line(line)


# -- the process --------------------------------------------------------------------------------


class AgentProcessProtocol(ProcessProtocol):
    """Thin: hands stdout, stderr, exit and end to its :class:`CLIRun`, which decides."""

    def __init__(self, run: CLIRun) -> None:
        self.run = run

    def connectionMade(self) -> None:
        self.run.started(self.transport)

    def outReceived(self, data: bytes) -> None:
        self.run.stdout(data)

    def errReceived(self, data: bytes) -> None:
        self.run.stderr(data)

    def processExited(self, reason: Failure) -> None:
        self.run.exited(reason)

    def processEnded(self, reason: Failure) -> None:
        self.run.ended(reason)


def exit_description(reason: Failure | None) -> tuple[int | None, str]:
    """``(exit code or None, "code N" / "signal N")`` of a process-ended Failure."""
    if reason is None:
        return None, "unknown status"
    value = reason.value
    if isinstance(value, ProcessDone):
        return 0, "code 0"
    if isinstance(value, ProcessTerminated):
        if value.exitCode is not None:
            return value.exitCode, f"code {value.exitCode}"
        if value.signal is not None:
            return None, f"signal {value.signal}"
    return None, "unknown status"


class CLIRun:
    """
    One agent process and its output, from spawn to the moment the process has exited and its
    pipes are closed. Emits the run's events (nothing at all once cancelled) and answers
    :meth:`whenEnded` to every caller.
    """

    def __init__(
        self,
        provider: CLIProvider,
        spec: ExecutionSpec,
        emit: Emit,
        plan: LaunchPlan,
        usage_baseline: Usage | None,
    ) -> None:
        self.provider = provider
        self.spec = spec
        self.plan = plan
        self._emit = emit
        self._reactor = provider.reactor
        settings = provider.settings
        self.interpreter = StreamInterpreter(self, usage_baseline)
        self.decoder: OutputDecoder
        if settings.output_format == "text":
            self.decoder = TextDecoder(self)
        elif settings.output_format == "json":
            self.decoder = JsonDecoder(self.interpreter, settings.max_line_bytes, self)
        else:
            self.decoder = StreamJsonDecoder(self.interpreter, settings.max_line_bytes, self)
        self.session_id = spec.session_id
        self.pid: int | None = None
        self.transport: Any = None
        self._stderr = bytearray()
        self._terminalSent = False
        self._quiet = False
        self._stopping = False
        self._exited = False
        self._finished = False
        self._exitReason: Failure | None = None
        self._waiters: list[Deferred[None]] = []
        self._timers: dict[str, IDelayedCall] = {}

    # -- spawning -----------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process (raises OSError when it cannot be started)."""
        plan = self.plan
        argv = [sys.executable, "-I", "-S", "-c", SETSID_SHIM, plan.executable, *plan.argv]
        nullFd: int | None = None
        childFDs: dict[int, int | str] = {1: "r", 2: "r"}
        if plan.stdin is None:
            nullFd = os.open(os.devnull, os.O_RDONLY)
            childFDs[0] = nullFd
        else:
            childFDs[0] = "w"
        try:
            self.transport = self.provider.processes.spawnProcess(
                AgentProcessProtocol(self),
                sys.executable,
                argv,
                env=plan.env,
                path=plan.cwd,
                usePTY=False,
                childFDs=childFDs,
            )
        finally:
            if nullFd is not None:
                os.close(nullFd)
        if plan.stdin is not None and not self._exited:
            self.transport.write(plan.stdin)
            self.transport.closeStdin()

    def started(self, transport: Any) -> None:
        """The process exists (called while ``spawnProcess`` runs)."""
        self.transport = transport
        pid = getattr(transport, "pid", None)
        self.pid = pid if isinstance(pid, int) else None

    def begin(self) -> None:
        """The process is running: emit ``start`` and arm the timers."""
        settings = self.provider.settings
        if self._finished:
            return
        self.emit(RuntimeEvent.start(session_id=self.session_id))
        timeout = self.spec.timeout_sec or settings.request_timeout
        if timeout > 0:
            self._timers["timeout"] = self._reactor.callLater(timeout, self._timedOut, timeout)
        if settings.idle_timeout > 0:
            self._timers["idle"] = self._reactor.callLater(settings.idle_timeout, self._idle)

    # -- events -------------------------------------------------------------------------------

    def emit(self, event: RuntimeEvent) -> None:
        if self._quiet or self._terminalSent:
            return
        if event.terminal:
            self._terminalSent = True
            self._cancelTimer("timeout")
            self._cancelTimer("idle")
            if not self._exited and not self._stopping:
                grace = self.provider.settings.exit_grace
                self._timers["exit"] = self._reactor.callLater(grace, self.stop)
        try:
            self._emit(event)
        except Exception:
            self.provider.log.failure("cli run {run_id}: emit failed", run_id=self.spec.run_id)

    # OutputSink

    def session(self, session_id: str) -> None:
        self.session_id = session_id
        if not self._stopping and not self._finished:
            self.provider._noteSession(self, session_id)

    def text(self, delta: str) -> None:
        self.emit(RuntimeEvent.text(delta))

    def reasoning(self, delta: str) -> None:
        self.emit(RuntimeEvent.reasoning(delta))

    def complete(self, usage: Usage | None) -> None:
        self.emit(RuntimeEvent.complete(usage=usage, session_id=self.session_id))

    def fail(self, reason: str) -> None:
        self.emit(RuntimeEvent(EventType.ERROR, error=reason, session_id=self.session_id))

    def abort(self, reason: str) -> None:
        self.fail(reason)
        self.stop()

    # -- process I/O --------------------------------------------------------------------------

    def stdout(self, data: bytes) -> None:
        self._touch()
        if not self._terminalSent and not self._quiet:
            self.decoder.feed(data)

    def stderr(self, data: bytes) -> None:
        self._touch()
        self._stderr += data
        if len(self._stderr) > STDERR_TAIL_BYTES:
            del self._stderr[: len(self._stderr) - STDERR_TAIL_BYTES]

    def stderr_tail(self) -> str:
        return bytes(self._stderr).decode("utf-8", errors="replace").strip()

    def exited(self, reason: Failure) -> None:
        """The agent itself has exited: sweep its group, give stray pipe holders a moment."""
        self._exited = True
        self._exitReason = reason
        self._cancelTimer("exit")
        self._cancelTimer("kill")
        if self.pid is not None:
            self._signalGroup(signal.SIGKILL)
        self._timers["drain"] = self._reactor.callLater(DRAIN_SECONDS, self._drain)

    def ended(self, reason: Failure) -> None:
        """Process exited and pipes closed: settle the outcome, then every waiter."""
        if self._finished:
            return
        if not self._exited:
            self._exited = True
            self._exitReason = reason
        for name in list(self._timers):
            self._cancelTimer(name)
        code, description = exit_description(self._exitReason)
        if not self._terminalSent and not self._quiet:
            self.decoder.finish(code)
        if not self._terminalSent and not self._quiet:
            self.fail(self._missingResult(description))
        self._finished = True
        self.provider._runEnded(self)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _missingResult(self, description: str) -> str:
        if self.provider.settings.output_format == "text":
            reason = f"agent exited ({description})"
        else:
            reason = f"agent exited ({description}) without a result"
        if self.interpreter.legacy:
            reason += " (legacy Codex --json output; Codex 0.44 or later is needed)"
        notes = [n for n in self.interpreter.notes if n]
        if notes:
            reason += ": " + "; ".join(notes[-3:])
        tail = self.stderr_tail()
        if tail:
            reason += f"\nstderr: {tail}"
        return reason

    # -- stopping -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def active(self) -> bool:
        return not self._exited

    def whenEnded(self) -> Deferred[None]:
        """A fresh Deferred that fires once the process has exited and its pipes are closed."""
        if self._finished:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def cancel(self) -> None:
        """The caller cancelled: emit nothing further, stop the process group."""
        self._quiet = True
        self.stop()

    def terminate_session(self) -> None:
        self.emit(RuntimeEvent.cancelled("session terminated"))
        self.stop()

    def stop(self) -> None:
        """SIGTERM the group now, SIGKILL after the grace. Idempotent."""
        if self._stopping or self._exited:
            return
        self._stopping = True
        self._cancelTimer("exit")
        self._signalGroup(signal.SIGTERM)
        grace = self.provider.settings.kill_grace
        self._timers["kill"] = self._reactor.callLater(grace, self._kill)

    def _kill(self) -> None:
        self._timers.pop("kill", None)
        if not self._exited:
            self._signalGroup(signal.SIGKILL)

    def _signalGroup(self, signum: int) -> None:
        """Signal the agent's process group; before the shim's ``setsid``, the agent alone."""
        if self.pid is None:
            return
        try:
            self.provider.signal_group(self.pid, signum)
            return
        except ProcessLookupError:
            pass
        except PermissionError:
            self.provider.log.warn(
                "cli run {run_id}: not allowed to signal process group {pgid}",
                run_id=self.spec.run_id,
                pgid=self.pid,
            )
        if not self._exited and self.transport is not None:
            try:
                self.transport.signalProcess(signum)
            except (ProcessExitedAlready, OSError):
                pass

    def _drain(self) -> None:
        # The agent is gone but something outside its group still holds stdout/stderr open.
        self._timers.pop("drain", None)
        if not self._finished and self.transport is not None:
            self.transport.loseConnection()

    # -- timers -------------------------------------------------------------------------------

    def _cancelTimer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _touch(self) -> None:
        timer = self._timers.get("idle")
        if timer is not None and timer.active():
            timer.reset(self.provider.settings.idle_timeout)

    def _timedOut(self, seconds: float) -> None:
        self._timers.pop("timeout", None)
        self.abort(f"timed out after {seconds:g}s")

    def _idle(self) -> None:
        self._timers.pop("idle", None)
        self.abort(f"timed out: no output for {self.provider.settings.idle_timeout:g}s")


# -- the provider -------------------------------------------------------------------------------


@dataclass
class _Session:
    target: str
    session_id: str
    last_used: float
    runs: set[CLIRun] = field(default_factory=set)
    cumulative_usage: Usage | None = None


def signal_process_group(pgid: int, signum: int) -> None:
    """``os.killpg``; raises ProcessLookupError when no such group exists (yet)."""
    os.killpg(pgid, signum)


@implementer(IProvider, ISessionTerminator)
class CLIProvider:
    """A CLI coding agent as a provider: one process per run, sessions remembered per target."""

    log = Logger()
    type = "cli"

    def __init__(
        self,
        spec: AdapterSpec,
        reactor: IReactorTime,
        signal_group: SignalGroup = signal_process_group,
        which: Which = which,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """
        ``reactor`` runs the timers and, adapted to ``IReactorProcess``, spawns the agents;
        ValueError when it cannot spawn processes or ``spec`` is not a usable configuration.
        """
        self.name = spec.name or "cli"
        self.settings = CLISettings.from_spec(spec)
        self.max_concurrency = spec.max_concurrency or 1
        processes = IReactorProcess(reactor, None)
        if processes is None:
            raise ValueError(f"cli adapter {self.name!r}: the reactor cannot spawn processes")
        self.reactor = reactor
        self.processes: IReactorProcess = processes
        self.signal_group = signal_group
        self._which = which
        self._environ = environ
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._runs: set[CLIRun] = set()

    def __repr__(self) -> str:
        return f"<CLIProvider {self.name!r}>"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            max_concurrency=self.max_concurrency, streaming=True, tools=False, sessions=True
        )

    def execute(self, spec: ExecutionSpec, emit: Emit) -> Deferred[None]:
        return Deferred.fromCoroutine(self._execute(spec, emit))

    async def _execute(self, spec: ExecutionSpec, emit: Emit) -> None:
        try:
            plan = self.settings.plan(spec, self._which, self._environ)
        except LaunchError as e:
            emit(RuntimeEvent.failed(str(e)))
            return
        baseline = None
        if spec.session_id:
            known = self._sessions.get((spec.target, spec.session_id))
            baseline = known.cumulative_usage if known is not None else None
        run = CLIRun(self, spec, emit, plan, baseline)
        try:
            run.spawn()
        except OSError as e:
            emit(RuntimeEvent.failed(f"cannot start {self.settings.command!r}: {e.strerror or e}"))
            return
        if not run.finished:  # (Twisted may report an instant exit from within spawnProcess)
            self._runs.add(run)
            self.log.info(
                "cli run {run_id} started: adapter {adapter}, pid {pid}",
                run_id=spec.run_id,
                adapter=self.name,
                pid=run.pid,
            )
            if spec.session_id:
                self._noteSession(run, spec.session_id)
            run.begin()
        try:
            await run.whenEnded()
        except CancelledError:
            run.cancel()
            while not run.finished:
                try:
                    await run.whenEnded()
                except CancelledError:
                    continue
            raise

    # -- sessions -----------------------------------------------------------------------------

    def _noteSession(self, run: CLIRun, session_id: str) -> None:
        key = (run.spec.target, session_id)
        record = self._sessions.get(key)
        if record is None:
            record = self._sessions[key] = _Session(run.spec.target, session_id, 0.0)
            self._forgetOldSessions()
        record.runs.add(run)
        record.last_used = self.reactor.seconds()

    def _runEnded(self, run: CLIRun) -> None:
        self._runs.discard(run)
        now = self.reactor.seconds()
        for record in self._sessions.values():
            if run in record.runs:
                record.runs.discard(run)
                record.last_used = now
        if run.interpreter.cumulative_usage is not None and run.session_id:
            latest = self._sessions.get((run.spec.target, run.session_id))
            if latest is not None:
                latest.cumulative_usage = run.interpreter.cumulative_usage
        _, description = exit_description(run._exitReason)
        self.log.info(
            "cli run {run_id} ended: {status}", run_id=run.spec.run_id, status=description
        )

    def _forgetOldSessions(self) -> None:
        if len(self._sessions) <= MAX_SESSIONS:
            return
        idle = sorted((r for r in self._sessions.values() if not r.runs), key=lambda r: r.last_used)
        for record in idle[: len(self._sessions) - MAX_SESSIONS]:
            del self._sessions[(record.target, record.session_id)]

    def list_sessions(self) -> list[dict[str, object]]:
        return [
            {
                "session_id": record.session_id,
                "target": record.target,
                "active": bool(record.runs),
                "last_used": record.last_used,
            }
            for record in sorted(self._sessions.values(), key=lambda r: -r.last_used)
        ]

    def terminate_session(self, target: str, session_id: str) -> Deferred[bool]:
        record = self._sessions.pop((target, session_id), None)
        if record is None:
            return succeed(False)
        runs = list(record.runs)
        for run in runs:
            self.log.info(
                "cli run {run_id}: terminating session {session_id}",
                run_id=run.spec.run_id,
                session_id=session_id,
            )
            run.terminate_session()
        if not runs:
            return succeed(True)
        done = DeferredList([run.whenEnded() for run in runs], consumeErrors=True)
        return done.addCallback(lambda _: True)


def build(spec: AdapterSpec, ctx: AdapterContext) -> IProvider:
    """The ``cli`` adapter factory; raises ValueError for an unusable configuration."""
    return CLIProvider(spec, ctx.reactor)
