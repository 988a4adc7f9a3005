"""
The ``ollama`` adapter over a real socket: the fake Ollama runs as its own process (started
through its command line) and the adapter talks to it with real treq on the real reactor. Deltas
arrive while the upstream is still generating, and cancelling a run closes the real connection,
which the fake counts as a client disconnect.

The unit tests (``iop.test.node.adapters.test_ollama``) cover the same paths in memory; this one
proves them on a TCP connection from treq's connection pool, where "abort" is a real FIN.
"""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from twisted.internet import reactor, task
from twisted.internet.defer import CancelledError, Deferred
from twisted.web.client import Agent, HTTPConnectionPool

from iop.node.adapters.ollama import build
from iop.runtime import AdapterContext, AdapterSpec, EventType, ExecutionSpec, RuntimeEvent

TOKENS = 20
DELAY_MS = 50


@pytest.fixture
def fake_ollama() -> Iterator[str]:
    """A fake Ollama process on a free loopback port; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "iop.testing.fake_ollama", "--port", "0",
         "--tokens", str(TOKENS), "--delay-ms", str(DELAY_MS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("fake-ollama listening on "):
        proc.kill()
        pytest.fail(f"fake-ollama did not start: {line!r}")
    address = line.rsplit(" ", 1)[1].strip()
    yield f"http://{address}"
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert b"Traceback" not in out, out.decode(errors="replace")


@pytest.fixture
def http() -> Iterator[HTTPClient]:
    pool = HTTPConnectionPool(reactor, persistent=True)
    yield HTTPClient(Agent(reactor, pool=pool))
    pytest_twisted.blockon(pool.closeCachedConnections())


async def stats(client: HTTPClient, base_url: str) -> dict[str, Any]:
    response = await client.get(base_url + "/_fake/stats")
    value: dict[str, Any] = await treq.json_content(response)
    return value


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


def provider(base_url: str, http: HTTPClient) -> Any:
    config = AdapterSpec(name="ollama-a", type="ollama", base_url=base_url)
    return build(config, AdapterContext(reactor=reactor, http=http))


class Recorder:
    """Records events with their arrival time; ``after(n)`` fires once ``n`` deltas arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, RuntimeEvent]] = []
        self._waiting: list[tuple[int, Deferred[None]]] = []

    def __call__(self, event: RuntimeEvent) -> None:
        self.events.append((time.monotonic(), event))
        count = len(self.deltas())
        for n, d in list(self._waiting):
            if count >= n:
                self._waiting.remove((n, d))
                d.callback(None)

    def deltas(self) -> list[RuntimeEvent]:
        return [e for _, e in self.events if e.type == EventType.DELTA]

    def after(self, n: int) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if len(self.deltas()) >= n:
            d.callback(None)
        else:
            self._waiting.append((n, d))
        return d


@pytest_twisted.ensureDeferred
async def test_deltas_arrive_before_the_stream_ends(fake_ollama: str, http: HTTPClient) -> None:
    recorder = Recorder()
    run = provider(fake_ollama, http).execute(
        ExecutionSpec(run_id="r1", target="llama3.2", input="hello"), recorder
    )
    await recorder.after(3)
    during = await stats(http, fake_ollama)
    assert (during["active_streams"], during["completed"]) == (1, 0)

    await run
    kinds = [e.type for _, e in recorder.events]
    assert kinds == [EventType.START] + [EventType.DELTA] * TOKENS + [EventType.COMPLETE]
    first_delta = next(t for t, e in recorder.events if e.type == EventType.DELTA)
    complete = recorder.events[-1][0]
    # ~20 tokens 50 ms apart: the first one long before the end, not all at once.
    assert complete - first_delta > (TOKENS - 4) * DELAY_MS / 1000 / 2
    usage = recorder.events[-1][1].usage
    assert usage is not None and usage.output_tokens == TOKENS
    after = await stats(http, fake_ollama)
    assert (after["active_streams"], after["completed"]) == (0, 1)


@pytest_twisted.ensureDeferred
async def test_cancel_makes_the_upstream_see_a_disconnect(
    fake_ollama: str, http: HTTPClient
) -> None:
    recorder = Recorder()
    run = provider(fake_ollama, http).execute(
        ExecutionSpec(run_id="r2", target="llama3.2", input="hello"), recorder
    )
    await recorder.after(2)
    run.cancel()
    with pytest.raises(CancelledError):
        await run
    seen = len(recorder.events)

    deadline = time.monotonic() + 5
    while True:
        current = await stats(http, fake_ollama)
        if current["client_disconnects"] == 1 or time.monotonic() > deadline:
            break
        await sleep(0.05)
    assert (current["client_disconnects"], current["active_streams"]) == (1, 0)
    assert current["completed"] == 0
    # Nothing more reaches the caller after the cancel.
    await sleep(3 * DELAY_MS / 1000)
    assert len(recorder.events) == seen
