# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
The ``cli`` adapter: CLI coding agents (Claude Code ``claude -p``, ``codex exec --json``,
``gemini -p``) run headless, one subprocess per run.

One module per job: :mod:`.plan` (settings and the launch of one run), :mod:`.interpreter`
(messages → events) over the agent dialects :mod:`.claude`, :mod:`.codex` and :mod:`.gemini`,
:mod:`.decoders` (stdout by output format), :mod:`.process` (one agent process and its group)
and :mod:`.provider` (the provider, its sessions, and the factory :func:`build`).

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

from iop.node.adapters.cli.codex import usage_since
from iop.node.adapters.cli.decoders import JsonDecoder, StreamJsonDecoder, TextDecoder
from iop.node.adapters.cli.interpreter import OutputSink, StreamInterpreter
from iop.node.adapters.cli.plan import (
    BASE_ENV,
    CLISettings,
    LaunchError,
    LaunchPlan,
    build_env,
    expand_args,
    substitute,
)
from iop.node.adapters.cli.process import (
    DRAIN_SECONDS,
    SETSID_SHIM,
    STDERR_TAIL_BYTES,
    AgentProcessProtocol,
    CLIRun,
    exit_description,
)
from iop.node.adapters.cli.provider import CLIProvider, build, signal_process_group

__all__ = [
    "BASE_ENV",
    "DRAIN_SECONDS",
    "SETSID_SHIM",
    "STDERR_TAIL_BYTES",
    "AgentProcessProtocol",
    "CLIProvider",
    "CLIRun",
    "CLISettings",
    "JsonDecoder",
    "LaunchError",
    "LaunchPlan",
    "OutputSink",
    "StreamInterpreter",
    "StreamJsonDecoder",
    "TextDecoder",
    "build",
    "build_env",
    "exit_description",
    "expand_args",
    "signal_process_group",
    "substitute",
    "usage_since",
]
