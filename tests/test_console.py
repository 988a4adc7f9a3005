"""
The web console in a real browser: a real Edge and node with a fake OpenAI-compatible upstream,
known traffic through the openai SDK, and headless Chromium on the admin listener's ``/``. The
test reads what the page rendered (its stable ids and ``data-`` attributes): node-a ready and
since when, p-chat available with its capacity, the model's request count equal to the requests
sent — those sent before the page opened (from the stream's snapshot) and those sent while it
was open (live ``request`` events) — and the recent-requests table. A screenshot is saved in the
test's tmp dir and its path printed.

Skipped, saying why, when Chromium is not installed (``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from iop.testing.fake_openai import fake_text
from tests.browser import Browser, chromium
from tests.harness import CLIENT_KEY, Cluster, wait_until

TOKENS = 6
BEFORE = 4
WHILE_OPEN = 3
ADMIN_TOKEN = "systest-console-admin-token"


def configure(cluster: Cluster, **extra: Any) -> None:
    upstream = cluster.start_fake("fake_openai", "--tokens", str(TOKENS))
    cluster.write_chat_edge_config(upstream, **extra)


@pytest.fixture
def edge(cluster: Cluster) -> Iterator[Cluster]:
    # The client key has limits and a budget: the console's Keys table shows its standing.
    section = cluster.client_api()
    section["auth"]["keys"][0].update(
        limits={"requests_per_minute": 100}, budgets=[{"period": "day", "tokens": 1_000_000}]
    )
    configure(cluster, openai=section)
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    yield cluster


def chat(cluster: Cluster, count: int) -> None:
    client = openai.OpenAI(base_url=cluster.client_url + "/v1", api_key=CLIENT_KEY)
    for i in range(count):
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": f"hello {i}"}
        ]
        if i % 2:
            chunks = client.chat.completions.create(model="chat", messages=messages, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            answer = client.chat.completions.create(model="chat", messages=messages)
            text = answer.choices[0].message.content or ""
        assert text == fake_text(TOKENS)


def cell(row: str, field: str) -> str:
    """A JS expression: the text of ``field``'s cell in the row matched by ``row``, or ''."""
    selector = json.dumps(f"{row} td[data-field={field}]")
    return f"((document.querySelector({selector}) || {{}}).textContent || '')"


def test_console_shows_nodes_providers_and_traffic(edge: Cluster, tmp_path: Path) -> None:
    chromium()
    chat(edge, BEFORE)
    with Browser(tmp_path / "profile") as browser:
        browser.open(edge.admin + "/")
        browser.wait_for("document.body.dataset.stream === 'live'", 20, "the event stream")
        node = 'tr[data-node-id="node-a"]'
        browser.wait_for(f"{cell(node, 'state')} === 'ready'", 10, "node-a ready")
        browser.wait_for(cell(node, "connected_since"), 10, "node-a's connected-since time")
        assert "p-chat" in browser.evaluate(cell(node, "providers"))
        provider = 'tr[data-provider-id="p-chat"][data-node-id="node-a"]'
        assert browser.evaluate(cell(provider, "status")) == "available"
        assert browser.evaluate(cell(provider, "health")) == "healthy"
        assert browser.evaluate(cell(provider, "capacity")) == "4"
        assert browser.evaluate(cell(provider, "in_flight")) == "0"
        assert browser.evaluate(cell(provider, "queued")) == "0"
        model = 'tr[data-model="chat"]'
        browser.wait_for(f"{cell(model, 'requests')} === '{BEFORE}'", 10, "the snapshot's count")

        # Live: requests sent now arrive as events.
        chat(edge, WHILE_OPEN)
        total = BEFORE + WHILE_OPEN
        browser.wait_for(f"{cell(model, 'requests')} === '{total}'", 10, f"{total} requests")
        # The key's standing (GET /limits, polled): its requests this minute, its day budget.
        key = 'tr[data-subject="key:all"]'
        browser.wait_for(
            f"{cell(key, 'requests_per_minute')} === '{total} / 100'", 10, "the key's standing"
        )
        budget = browser.evaluate(cell(key, "budgets"))
        assert budget.startswith("day: ") and budget.endswith(" / 1000000 tokens"), budget
        assert browser.evaluate(cell(model, "errors")) == "0"
        assert browser.evaluate(cell(model, "rate")) == str(total)
        rows = browser.evaluate(
            "Array.from(document.querySelectorAll('#requests tr[data-request]'))"
            ".map(r => [r.dataset.model, r.dataset.outcome,"
            " r.querySelector('td[data-field=provider]').textContent,"
            " r.querySelector('td[data-field=node]').textContent])"
        )
        assert rows == [["chat", "complete", "p-chat", "node-a"]] * total, rows
        # The provider's chart has drawn its in-flight samples and request buckets.
        points = browser.evaluate(
            "document.querySelector('svg[data-chart=\"node-a/p-chat\"] polyline.rate')"
            ".getAttribute('points').split(' ').length"
        )
        assert points == 30
        # Something a real operator looks at: saved, never into the repository.
        shot = browser.screenshot(tmp_path / "console.png")
    print(f"console screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert "console event stream opened" in edge.daemons[1].output()


def test_console_with_admin_auth(cluster: Cluster, tmp_path: Path) -> None:
    """admin.auth on: the shell loads, asks for the token, then streams with it."""
    chromium()
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    configure(cluster, admin={"auth": {"token_sha256": digest}})
    cluster.start_edge()
    for path in ("/status", "/events"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(cluster.admin + path, timeout=5)
        assert refused.value.code == 401
    with Browser(tmp_path / "profile") as browser:
        browser.open(cluster.admin + "/")
        browser.wait_for("!document.getElementById('auth').hidden", 20, "the token form")
        assert browser.evaluate("document.body.dataset.stream") == "unauthorized"
        browser.evaluate(
            f"document.getElementById('auth-token').value = {json.dumps(ADMIN_TOKEN)};"
            "document.getElementById('auth').requestSubmit(); true"
        )
        browser.wait_for("document.body.dataset.stream === 'live'", 20, "the event stream")
        node = 'tr[data-node-id="node-a"]'
        browser.wait_for(f"{cell(node, 'state')} === 'disconnected'", 10, "node-a listed")
        # The token stays in this tab's session storage, nowhere else.
        assert browser.evaluate("sessionStorage.getItem('iop-admin-token')") == ADMIN_TOKEN
        assert browser.evaluate("localStorage.length") == 0
        assert browser.evaluate("document.cookie") == ""
