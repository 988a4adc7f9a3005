"""
The real Codex CLI (npm ``@openai/codex``, pinned in tests/agents) through IOP. Codex speaks only
``POST /v1/responses``: a private ``CODEX_HOME`` defines an ``iop`` model provider (the Edge's
client URL, the test key in an environment variable, ``wire_api = "responses"``) and
``codex exec`` runs one prompt non-interactively against each provider kind:

- ``chat``: a Chat tunnel provider (the Responses bridge over ``chat_completions``);
- ``resp``: a native Responses provider (the raw tunnel to the fake's ``--responses-api``);
- ``native``: a native Anthropic Messages provider (Responses → Chat → Messages out, the
  Messages answer decoded into the canonical stream and encoded as Responses events);
- ``llama``: an Ollama run; ``cli``: a CLI-agent run (the bridge over normalized runs).

Codex offers its tools on every request; the Chat, Responses, Messages and Ollama fakes call the
first (function) one once (Codex runs it, read-only sandbox, and sends its output back), then
answer in text, so each run ends with the fake's answer as Codex's last message.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from iop.testing.fake_cli_agent import reply_text
from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, agent_cli, wait_until
from tests.test_client_apis import TOKENS, start

PROMPT = "say hello"
TIMEOUT_SEC = 120


def codex_home(cluster: Cluster, model: str) -> Path:
    home = cluster.root / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model_provider = "iop"\n'
        f'model = "{model}"\n'
        f"check_for_update_on_startup = false\n"
        f"\n"
        f"[analytics]\n"
        f"enabled = false\n"
        f"\n"
        f"[model_providers.iop]\n"
        f'name = "IOP"\n'
        f'base_url = "{cluster.client_url}/v1"\n'
        f'env_key = "IOP_TEST_CODEX_KEY"\n'
        f'wire_api = "responses"\n'
        f"request_max_retries = 0\n"
        f"stream_max_retries = 0\n"
    )
    return home


def run_codex(cluster: Cluster, model: str) -> tuple[subprocess.CompletedProcess[str], str]:
    codex = agent_cli("codex")
    home = codex_home(cluster, model)
    work = cluster.root / "codex-work"
    work.mkdir(exist_ok=True)
    last = cluster.root / "codex-last-message.txt"
    env = {
        **os.environ,
        "CODEX_HOME": str(home),
        "IOP_TEST_CODEX_KEY": CLIENT_KEY,
        "NO_COLOR": "1",
    }
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    done = subprocess.run(
        [
            codex,
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--sandbox",
            "read-only",
            "--color",
            "never",
            "--cd",
            str(work),
            "--output-last-message",
            str(last),
            PROMPT,
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SEC,
        check=False,
    )
    return done, last.read_text() if last.exists() else ""


EXPECTED = {
    "chat": fake_text(TOKENS),
    "resp": fake_text(TOKENS),
    "native": fake_text(TOKENS),
    "llama": None,  # the fake Ollama's words; any text
    "cli": reply_text(PROMPT, 5),
}


@pytest.mark.parametrize("model", ["chat", "resp", "native", "llama", "cli"])
def test_codex_exec(cluster: Cluster, model: str) -> None:
    agent_cli("codex")
    openai_port, ollama_port = start(cluster)
    done, last = run_codex(cluster, model)
    report = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    expected = EXPECTED[model]
    if expected is None:
        assert last.strip(), report
    else:
        assert expected in last, report
    # The tool round happened: a call to Codex's first tool, then the text answer.
    if model in ("chat", "resp", "native"):
        assert cluster.fake_stats(openai_port)["total_requests"] == 2, report
    if model == "llama":
        assert cluster.fake_stats(ollama_port)["chat_requests"] == 2, report
    edge = next(d for d in cluster.daemons if d.name == "edge")
    assert "Traceback" not in edge.output()
    for provider in ("p-chat", "p-resp", "p-native", "p-llama"):
        wait_until(lambda p=provider: cluster.provider(p)["in_flight"] == 0, 5, "leases returned")  # type: ignore[misc]
