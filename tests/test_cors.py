"""
CORS from a real browser: headless Chromium loads a page from one origin (a small HTTP server
here) whose script calls the Edge on another origin (its client port) with ``fetch`` — a Chat
Completion, the same streamed and read chunk by chunk, an Anthropic Message with ``x-api-key``
and ``anthropic-version``, and a wrong key whose 401 the page must be able to read, retry
advice included. The Edge allows that origin only: the same page served from a second origin
must be refused by the browser. The page posts what it saw back to its own server.

Skipped, saying why, when Chromium is not installed (``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iop.testing.fake_openai import fake_text
from iop.testing.ports import free_port
from tests.harness import CLIENT_KEY, Cluster, wait_until

TOKENS = 6

# The page's script: every call's outcome, then POST /result to its own origin.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>iop cors</title></head>
<body><pre id="out">running</pre>
<script>
const EDGE = %(edge)s;
const KEY = %(key)s;
const results = {};
async function attempt(name, call) {
  try { results[name] = await call(); }
  catch (e) { results[name] = {error: String(e)}; }
}
const chatBody = (stream) => JSON.stringify({
  model: "chat", messages: [{role: "user", content: "hello"}], stream: stream});
async function main() {
  await attempt("chat", async () => {
    const r = await fetch(EDGE + "/v1/chat/completions", {method: "POST",
      headers: {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
      body: chatBody(false)});
    const body = await r.json();
    return {status: r.status, text: body.choices[0].message.content};
  });
  await attempt("stream", async () => {
    const r = await fetch(EDGE + "/v1/chat/completions", {method: "POST",
      headers: {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
      body: chatBody(true)});
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let raw = "", reads = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      reads += 1;
      raw += decoder.decode(value, {stream: true});
    }
    let text = "", events = 0, finished = false;
    for (const line of raw.split("\\n")) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") { finished = true; continue; }
      events += 1;
      const choice = JSON.parse(data).choices[0];
      if (choice && choice.delta && choice.delta.content) text += choice.delta.content;
    }
    return {status: r.status, type: r.headers.get("content-type"), text, events, reads,
            finished};
  });
  await attempt("messages", async () => {
    const r = await fetch(EDGE + "/v1/messages", {method: "POST",
      headers: {"x-api-key": KEY, "anthropic-version": "2023-06-01",
                "anthropic-beta": "fine-grained-tool-streaming-2025-05-14",
                "Content-Type": "application/json"},
      body: JSON.stringify({model: "chat", max_tokens: 64,
                            messages: [{role: "user", content: "hello"}]})});
    const body = await r.json();
    return {status: r.status, type: body.type, text: body.content[0].text};
  });
  await attempt("wrong_key", async () => {
    const r = await fetch(EDGE + "/v1/chat/completions", {method: "POST",
      headers: {"Authorization": "Bearer sk-wrong", "Content-Type": "application/json"},
      body: chatBody(false)});
    const body = await r.json();
    return {status: r.status, retry: r.headers.get("x-should-retry"), type: body.error.type};
  });
  document.getElementById("out").textContent = JSON.stringify(results);
  await fetch("/result", {method: "POST", body: JSON.stringify(results)});
}
main();
</script></body></html>
"""


class PageServer:
    """Serves :data:`PAGE` at ``/`` on its own port and keeps what the page POSTs to /result."""

    def __init__(self, edge: str) -> None:
        self.port = free_port()
        self.result: dict[str, Any] | None = None
        page = (PAGE % {"edge": json.dumps(edge), "key": json.dumps(CLIENT_KEY)}).encode()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/" else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                owner.result = json.loads(data)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "chromium-headless-shell"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on this machine (Debian package 'chromium'): browser test skipped")


def browse(browser: str, url: str, profile: Path, page: PageServer, timeout: float) -> None:
    """Chromium headless on ``url`` until the page reported (or ``timeout``), then stopped."""
    process = subprocess.Popen(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: page.result is not None, timeout, f"the page at {url} to report")
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture
def edge(cluster: Cluster) -> Iterator[tuple[Cluster, PageServer, PageServer]]:
    browser_edge = f"http://127.0.0.1:{cluster.client_port}"
    allowed = PageServer(browser_edge)
    other = PageServer(browser_edge)
    upstream = cluster.start_fake("fake_openai", "--tokens", str(TOKENS))
    cluster.write_chat_edge_config(
        upstream, openai=cluster.client_api(cors={"allow_origins": [allowed.origin]})
    )
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    try:
        yield cluster, allowed, other
    finally:
        allowed.close()
        other.close()


def test_a_page_on_an_allowed_origin_calls_the_api(
    edge: tuple[Cluster, PageServer, PageServer], tmp_path: Path
) -> None:
    browser = chromium()
    cluster, allowed, _ = edge
    browse(browser, allowed.origin + "/", tmp_path / "profile", allowed, 60)
    result = allowed.result
    assert result is not None
    expected = fake_text(TOKENS)
    assert result["chat"] == {"status": 200, "text": expected}, result
    stream = result["stream"]
    assert stream["status"] == 200, result
    assert stream["type"] == "text/event-stream", result
    assert stream["text"] == expected and stream["finished"], result
    assert stream["events"] > TOKENS // 2, result
    assert result["messages"] == {"status": 200, "type": "message", "text": expected}, result
    # The 401 is readable, and so is the retry advice (Access-Control-Expose-Headers).
    assert result["wrong_key"] == {
        "status": 401,
        "retry": "false",
        "type": "invalid_request_error",
    }, result
    # Everything released.
    wait_until(lambda: cluster.provider("p-chat")["in_flight"] == 0, 10, "p-chat idle")


def test_a_page_on_another_origin_is_refused(
    edge: tuple[Cluster, PageServer, PageServer], tmp_path: Path
) -> None:
    browser = chromium()
    cluster, _, other = edge
    browse(browser, other.origin + "/", tmp_path / "profile", other, 60)
    result = other.result
    assert result is not None
    for name in ("chat", "stream", "messages", "wrong_key"):
        # fetch() rejects: the preflight was refused, nothing was sent.
        assert "error" in result[name] and "TypeError" in result[name]["error"], result
    assert cluster.provider("p-chat")["in_flight"] == 0
