"""
The real Claude Code CLI (``claude -p``, npm ``@anthropic-ai/claude-code``, pinned in
``tests/agents``) against an Edge, on every provider kind: a Chat provider over the tunnel (the
Messages ↔ Chat bridge), a native Anthropic Messages provider (passthrough), a native OpenAI
Responses provider (Messages → Chat → Responses, the answer decoded back), an Ollama run and a
CLI-agent run (both bridged from the normalized run). The cluster is
:func:`tests.test_client_apis.start`'s.

Claude Code runs with its default tools, so its first request carries a mid-conversation
``system`` message, ``cache_control``, adaptive thinking, ``context_management`` and a long
``anthropic-beta`` list, at ``/v1/messages?beta=true``. The fake upstreams do one tool round: a
request with tools gets a call to its first tool with placeholder arguments, a conversation
ending in a tool result the text answer. Claude Code lists ``Agent`` first, and a sub-agent
started with placeholder arguments runs conversations of its own (on the fake Ollama, whose
placeholders fill only required fields, without end), so the default-tools runs leave out
``Agent`` (``--disallowedTools Agent``; the next tool, ``Bash``, runs the command ``fake`` in
the private working directory) and the tool round trip restricts the tools to ``Read`` (of a
file that does not exist).

Claude Code is kept offline and private: its own HOME and config directory under ``tmp_path``,
no telemetry, no auto-update, no nonessential traffic.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from iop.testing.fake_cli_agent import reply_text
from iop.testing.fake_ollama import CONTENT_WORDS
from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, agent_cli
from tests.test_client_apis import TOKENS, start

PROMPT = "say hello"
TIMEOUT_SEC = 120
# What the fake CLI agent answers after "You said: <prompt>." (its default of 5 words).
CLI_TAIL = reply_text(PROMPT, 5).removeprefix(f"You said: {PROMPT}")


def claude(
    cluster: Cluster,
    tmp_path: Path,
    model: str,
    *args: str,
    key: str = CLIENT_KEY,
    output: str = "json",
    timeout: float = TIMEOUT_SEC,
) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "claude-home"
    work = tmp_path / "claude-work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": cluster.client_url,
        "ANTHROPIC_API_KEY": key,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    argv = [agent_cli("claude"), "-p", PROMPT, "--model", model, "--output-format", output]
    if output == "stream-json":
        argv.append("--verbose")
    done = subprocess.run(
        [*argv, *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # Kept for a failing test's reader.
    (tmp_path / "claude.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    return done


def result_of(done: subprocess.CompletedProcess[str], output: str = "json") -> dict[str, Any]:
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    if output == "json":
        result: dict[str, Any] = json.loads(done.stdout)
        return result
    lines: list[dict[str, Any]] = [
        json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")
    ]
    assert lines and lines[0]["type"] == "system" and lines[0]["subtype"] == "init", lines[:1]
    [result] = [line for line in lines if line["type"] == "result"]
    assert lines[-1] is result
    return result


def check_answer(model: str, result: dict[str, Any]) -> None:
    assert result["subtype"] == "success" and result["is_error"] is False, result
    text = result["result"]
    if model in ("chat", "native", "resp"):
        assert text == fake_text(TOKENS)
    elif model == "cli":
        assert text.startswith("You said: ") and text.endswith(CLI_TAIL), text
    else:
        assert text == " ".join(CONTENT_WORDS[:TOKENS]), result


def edge_log_clean(cluster: Cluster) -> None:
    [edge] = [d for d in cluster.daemons if d.name == "edge"]
    assert "Traceback" not in edge.output()


@pytest.mark.parametrize("output", ["json", "stream-json"])
@pytest.mark.parametrize("model", ["chat", "native", "resp", "llama", "cli"])
def test_print_mode_with_default_tools(
    cluster: Cluster, tmp_path: Path, model: str, output: str
) -> None:
    agent_cli("claude")
    start(cluster)
    done = claude(cluster, tmp_path, model, "--disallowedTools", "Agent", output=output)
    result = result_of(done, output)
    check_answer(model, result)
    edge_log_clean(cluster)


def test_tool_round_trip(cluster: Cluster, tmp_path: Path) -> None:
    agent_cli("claude")
    start(cluster)
    done = claude(cluster, tmp_path, "chat", "--tools", "Read", output="stream-json")
    result = result_of(done, "stream-json")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    uses = [
        block
        for line in lines
        if line["type"] == "assistant"
        for block in line["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert [use["name"] for use in uses] == ["Read"], uses
    results = [
        block
        for line in lines
        if line["type"] == "user" and isinstance(line["message"]["content"], list)
        for block in line["message"]["content"]
        if block.get("type") == "tool_result"
    ]
    # Read of a placeholder path fails in the private directory: still a tool result.
    assert [r["tool_use_id"] for r in results] == [uses[0]["id"]]
    assert result["num_turns"] == 2
    check_answer("chat", result)
    edge_log_clean(cluster)


def test_wrong_key_fails_fast(cluster: Cluster, tmp_path: Path) -> None:
    agent_cli("claude")
    start(cluster)
    began = time.monotonic()
    done = claude(cluster, tmp_path, "chat", key="sk-not-a-key", timeout=60)
    took = time.monotonic() - began
    # The Edge's 401 says x-should-retry: false, so Claude Code does not retry for minutes.
    assert took < 10, took
    answer = json.loads(done.stdout) if done.stdout.startswith("{") else {}
    assert done.returncode != 0 or answer.get("is_error") is True, (done.stdout, done.stderr)
    edge_log_clean(cluster)
