# -*- test-case-name: tests.test_cli_adapter -*-
"""
A scripted CLI coding agent that behaves like ``claude -p`` (or, on request, ``codex exec
--json``), for tests, the bench and the demo::

    python -m iop.testing.fake_cli_agent -p --output-format stream-json --verbose "hello"

Flags (Claude's): ``-p/--print``, ``--output-format text|json|stream-json`` (stream-json needs
``--verbose``, otherwise Claude's own error and exit 1), ``--verbose``,
``--include-partial-messages`` (accepted; partial messages are on unless ``FAKE_CLI_PARTIAL=0``),
``--model M``, ``--permission-mode M``, ``--resume=<id>`` (keep that session id; otherwise a new
uuid is minted), and the prompt as the last positional argument, or from stdin when none is given.

The environment scripts the behaviour:

``FAKE_CLI_MODE``
    ``ok`` (default); ``error`` (a ``result`` with ``is_error`` true, exit 1); ``hang`` (emit
    ``system/init``, then block); ``crash`` (emit ``system/init``, write to stderr, exit 3 with no
    result); ``child`` (spawn a grandchild Python process in the same process group that would
    outlive this one, then hang); ``codex`` (emit the ``codex exec --json`` event shape);
    ``codex-error`` (Codex shape ending in ``turn.failed``, exit 1).
``FAKE_CLI_TOKENS``
    Number of words after the echo of the prompt (default 5).
``FAKE_CLI_DELAY_MS``
    Pause between deltas (default 0).
``FAKE_CLI_PIDFILE``
    Append this process's pid, and any grandchild's pid, one per line.
``FAKE_CLI_IGNORE_TERM``
    ``1``: ignore SIGTERM (the grandchild too). Otherwise SIGTERM exits at once with 143.
``FAKE_CLI_ERROR``
    The error text of ``error`` mode (default ``fake agent error``).
``FAKE_CLI_SESSION_ID``
    The session id to mint instead of a random uuid (``--resume`` still wins).
``FAKE_CLI_PARTIAL``
    ``0``: emit no ``stream_event`` lines, only whole ``assistant`` messages.

Everything but a minted session id is deterministic: :func:`reply_pieces`, :func:`reply_text`,
:func:`thinking_pieces` and :func:`usage_for` say what a run prints, so tests can assert it. A
prompt containing "think" gets a thinking block (Claude) or a reasoning item (Codex) first.
In ``codex`` mode a resumed thread reports twice the usage, as Codex reports cumulative thread
usage (one earlier turn is pretended).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

VOCABULARY = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
THINKING = "Considering the request carefully."
CACHE_READ_TOKENS = 4
CACHE_CREATION_TOKENS = 2
MESSAGE_ID = "msg_fake_1"
MODES = ("ok", "error", "hang", "crash", "child", "codex", "codex-error")
STREAM_JSON_NEEDS_VERBOSE = (
    "Error: When using --print, --output-format=stream-json requires --verbose"
)
# The grandchild of ``child`` mode: sleeps until killed, ignoring SIGTERM when asked to.
GRANDCHILD = (
    "import os, signal, time\n"
    "if os.environ.get('FAKE_CLI_IGNORE_TERM') == '1':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(1)\n"
)


def reply_pieces(prompt: str, tokens: int) -> list[str]:
    """The text deltas of a reply: an echo of the prompt, then ``tokens`` vocabulary words."""
    pieces = [f"You said: {prompt}."]
    pieces.extend(f" {VOCABULARY[i % len(VOCABULARY)]}" for i in range(tokens))
    return pieces


def reply_text(prompt: str, tokens: int) -> str:
    return "".join(reply_pieces(prompt, tokens))


def thinking_pieces(prompt: str) -> list[str]:
    """The thinking deltas (empty unless the prompt mentions "think")."""
    if "think" not in prompt.lower():
        return []
    words = THINKING.split(" ")
    return [words[0], *(f" {w}" for w in words[1:])]


def usage_for(prompt: str, tokens: int) -> dict[str, int]:
    """Claude-shaped usage of one turn (``input_tokens`` excludes the cache, as Claude's does)."""
    return {
        "input_tokens": len(prompt.split()) + 10,
        "output_tokens": len(reply_pieces(prompt, tokens)) + len(thinking_pieces(prompt)),
        "cache_creation_input_tokens": CACHE_CREATION_TOKENS,
        "cache_read_input_tokens": CACHE_READ_TOKENS,
    }


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message}\n")
        sys.exit(1)


def _parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="fake_cli_agent", allow_abbrev=False, add_help=False)
    p.add_argument("-p", "--print", action="store_true", dest="print_mode")
    p.add_argument("--output-format", choices=("text", "json", "stream-json"), default="text")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--include-partial-messages", action="store_true")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--permission-mode", default="default")
    p.add_argument("--resume", default="")
    p.add_argument("prompt", nargs="?")
    return p


class _Agent:
    def __init__(self, options: argparse.Namespace, prompt: str, env: dict[str, str]) -> None:
        self.options = options
        self.prompt = prompt
        self.mode = env.get("FAKE_CLI_MODE", "ok") or "ok"
        self.tokens = int(env.get("FAKE_CLI_TOKENS", "5") or "5")
        self.delay = int(env.get("FAKE_CLI_DELAY_MS", "0") or "0") / 1000.0
        self.pidfile = env.get("FAKE_CLI_PIDFILE", "")
        self.error_text = env.get("FAKE_CLI_ERROR", "fake agent error")
        self.partial = env.get("FAKE_CLI_PARTIAL", "1") != "0"
        self.resumed = bool(options.resume)
        self.session_id = options.resume or env.get("FAKE_CLI_SESSION_ID") or str(uuid.uuid4())

    # -- output helpers -----------------------------------------------------------------------

    def line(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def pause(self) -> None:
        if self.delay > 0:
            time.sleep(self.delay)

    def record_pid(self, pid: int) -> None:
        if self.pidfile:
            with open(self.pidfile, "a", encoding="ascii") as f:
                f.write(f"{pid}\n")

    @staticmethod
    def block_forever() -> NoReturn:
        while True:
            time.sleep(3600)

    # -- Claude -------------------------------------------------------------------------------

    def init_line(self) -> dict[str, Any]:
        return {
            "type": "system",
            "subtype": "init",
            "session_id": self.session_id,
            "model": self.options.model,
            "cwd": os.getcwd(),
            "tools": [],
            "mcp_servers": [],
            "permissionMode": self.options.permission_mode,
        }

    def stream_event(self, event: dict[str, Any]) -> None:
        if self.partial:
            self.line(
                {
                    "type": "stream_event",
                    "event": event,
                    "session_id": self.session_id,
                    "parent_tool_use_id": None,
                }
            )

    def assistant_line(self, block: dict[str, Any]) -> None:
        self.line(
            {
                "type": "assistant",
                "message": {
                    "id": MESSAGE_ID,
                    "type": "message",
                    "role": "assistant",
                    "model": self.options.model,
                    "content": [block],
                    "usage": usage_for(self.prompt, self.tokens),
                },
                "parent_tool_use_id": None,
                "session_id": self.session_id,
            }
        )

    def stream_block(self, index: int, kind: str, pieces: list[str]) -> None:
        field = "thinking" if kind == "thinking" else "text"
        delta_type = f"{field}_delta"
        start: dict[str, Any] = {"type": kind, field: ""}
        self.stream_event({"type": "content_block_start", "index": index, "content_block": start})
        for piece in pieces:
            self.pause()
            self.stream_event(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": delta_type, field: piece},
                }
            )
        self.stream_event({"type": "content_block_stop", "index": index})
        block: dict[str, Any] = {"type": kind, field: "".join(pieces)}
        if kind == "thinking":
            block["signature"] = "fake-signature"
        self.assistant_line(block)

    def result(self) -> dict[str, Any]:
        usage = usage_for(self.prompt, self.tokens)
        out: dict[str, Any] = {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "duration_ms": 1,
            "duration_api_ms": 1,
            "num_turns": 1,
            "result": reply_text(self.prompt, self.tokens),
            "session_id": self.session_id,
            "total_cost_usd": 0.0,
            "usage": usage,
        }
        if self.mode == "error":
            out.update(subtype="error_during_execution", is_error=True, errors=[self.error_text])
            del out["result"]
        return out

    def run_claude(self) -> int:
        fmt = self.options.output_format
        if fmt == "stream-json" and not self.options.verbose:
            sys.stderr.write(STREAM_JSON_NEEDS_VERBOSE + "\n")
            return 1
        streaming = fmt == "stream-json"
        if streaming:
            self.line(self.init_line())
        if self.mode in ("hang", "child"):
            if self.mode == "child":
                self.spawn_grandchild()
            self.block_forever()
        if self.mode == "crash":
            sys.stderr.write("fake agent crashed: segmentation fault (simulated)\n")
            sys.stderr.flush()
            return 3
        if streaming:
            self.stream_event(
                {
                    "type": "message_start",
                    "message": {"id": MESSAGE_ID, "role": "assistant", "content": []},
                }
            )
            index = 0
            thinking = thinking_pieces(self.prompt)
            if thinking:
                self.stream_block(index, "thinking", thinking)
                index += 1
            if self.mode != "error":
                self.stream_block(index, "text", reply_pieces(self.prompt, self.tokens))
            self.stream_event({"type": "message_stop"})
            self.line(self.result())
        elif fmt == "json":
            self.line(self.result())
        elif self.mode == "error":
            sys.stderr.write(f"Error: {self.error_text}\n")
        else:
            for piece in reply_pieces(self.prompt, self.tokens):
                self.pause()
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
        return 1 if self.mode == "error" else 0

    def spawn_grandchild(self) -> None:
        child = subprocess.Popen([sys.executable, "-c", GRANDCHILD], stdin=subprocess.DEVNULL)
        self.record_pid(child.pid)

    # -- Codex --------------------------------------------------------------------------------

    def run_codex(self) -> int:
        self.line({"type": "thread.started", "thread_id": self.session_id})
        self.line({"type": "turn.started"})
        if self.mode == "codex-error":
            self.line({"type": "turn.failed", "error": {"message": self.error_text}})
            return 1
        thinking = "".join(thinking_pieces(self.prompt))
        n = 0
        if thinking:
            self.pause()
            self.line(
                {
                    "type": "item.completed",
                    "item": {"id": f"item_{n}", "type": "reasoning", "text": thinking},
                }
            )
            n += 1
        self.pause()
        self.line(
            {
                "type": "item.completed",
                "item": {
                    "id": f"item_{n}",
                    "type": "agent_message",
                    "text": reply_text(self.prompt, self.tokens),
                },
            }
        )
        claude = usage_for(self.prompt, self.tokens)
        factor = 2 if self.resumed else 1  # Codex reports the thread's cumulative usage
        cached = claude["cache_read_input_tokens"]
        usage = {
            "input_tokens": factor * (claude["input_tokens"] + cached),
            "cached_input_tokens": factor * cached,
            "output_tokens": factor * claude["output_tokens"],
            "reasoning_output_tokens": factor * len(thinking_pieces(self.prompt)),
        }
        self.line({"type": "turn.completed", "usage": usage})
        return 0


def _on_term(signum: int, frame: object) -> None:
    os._exit(143)


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    if env.get("FAKE_CLI_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_term)
    options = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    mode = env.get("FAKE_CLI_MODE", "ok") or "ok"
    if mode not in MODES:
        sys.stderr.write(f"fake_cli_agent: unknown FAKE_CLI_MODE {mode!r}\n")
        return 2
    prompt = options.prompt if options.prompt is not None else sys.stdin.read()
    prompt = prompt.strip()
    agent = _Agent(options, prompt, env)
    agent.record_pid(os.getpid())
    if not prompt:
        sys.stderr.write(
            "Error: Input must be provided either through stdin or as a prompt "
            "argument when using --print\n"
        )
        return 1
    if mode.startswith("codex"):
        return agent.run_codex()
    return agent.run_claude()


if __name__ == "__main__":
    sys.exit(main())
