"""
The openai_compat adapter against the fake OpenAI upstream on a real loopback port, with a real
treq client: events arrive while the upstream is still streaming, and cancelling a run closes the
connection so that the upstream sees the client go away. Also the fake's command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool

from iop.node.adapters import openai_compat
from iop.runtime import (
    AdapterContext,
    AdapterSpec,
    EventType,
    ExecutionSpec,
    IProvider,
    RuntimeEvent,
)
from iop.testing.fake_openai import FakeOpenAI, fake_text

reactor: Any = cast(Any, _reactor)


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await deferLater(reactor, 0.01)


class Upstream:
    """A fake upstream on a loopback port and an adapter pointed at it."""

    def __init__(self, **settings: Any) -> None:
        self.fake = FakeOpenAI(reactor, **settings)
        self.port = reactor.listenTCP(0, self.fake.site(), interface="127.0.0.1")
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        http = HTTPClient(Agent(reactor, pool=self.pool))
        config = AdapterSpec(
            name="fake",
            type="openai_compat",
            enabled=True,
            base_url=f"http://127.0.0.1:{self.port.getHost().port}/v1",
            headers={"Authorization": "Bearer system-test-key"},
        )
        self.provider: IProvider = openai_compat.build(config, AdapterContext(reactor, http))
        self.events: list[tuple[float, RuntimeEvent]] = []

    def execute(self, target: str = "demo-model") -> Deferred[None]:
        spec = ExecutionSpec(run_id="sys-1", target=target, input="hello there")
        return self.provider.execute(
            spec, lambda event: self.events.append((time.monotonic(), event))
        )

    def types(self) -> list[str]:
        return [event.type.value for _, event in self.events]

    async def close(self) -> None:
        await self.pool.closeCachedConnections()
        await self.port.stopListening()


@pytest_twisted.async_yield_fixture
async def upstream() -> AsyncIterator[Callable[..., Upstream]]:
    made: list[Upstream] = []

    def make(**settings: Any) -> Upstream:
        made.append(Upstream(**settings))
        return made[-1]

    yield make
    for u in made:
        await u.close()


@pytest_twisted.ensureDeferred
async def test_events_arrive_while_the_upstream_streams(
    upstream: Callable[..., Upstream],
) -> None:
    u = upstream(tokens=10, delay_ms=30)
    await u.execute()
    assert u.types() == ["start"] + ["delta"] * 10 + ["complete"]
    text = "".join(event.delta for _, event in u.events if event.type == EventType.DELTA)
    assert text == fake_text(10)
    first_delta = u.events[1][0]
    complete = u.events[-1][0]
    # Nine more token delays (30 ms each) passed after the first delta reached us.
    assert complete - first_delta >= 0.2
    assert u.events[-1][1].usage is not None
    stats = u.fake.stats()
    assert (stats.completed_responses, stats.active_streams, stats.client_disconnects) == (1, 0, 0)
    assert u.fake.requests[0].headers["authorization"] == "Bearer system-test-key"


@pytest_twisted.ensureDeferred
async def test_cancel_mid_stream_disconnects_the_upstream(
    upstream: Callable[..., Upstream],
) -> None:
    u = upstream(tokens=200, delay_ms=20)
    d = u.execute()
    await wait_for(lambda: u.types().count("delta") >= 3, 10, "three deltas")
    assert u.fake.stats().active_streams == 1
    d.cancel()
    with pytest.raises(CancelledError):
        await d
    seen = len(u.events)
    await wait_for(lambda: u.fake.stats().client_disconnects == 1, 10, "the upstream to notice")
    stats = u.fake.stats()
    assert (stats.active_streams, stats.completed_responses) == (0, 0)
    await deferLater(reactor, 0.1)
    assert len(u.events) == seen
    assert "complete" not in u.types() and "error" not in u.types()


@pytest_twisted.ensureDeferred
async def test_upstream_error_and_dropped_stream(upstream: Callable[..., Upstream]) -> None:
    u = upstream(tokens=10)
    await u.execute("fail-500")
    assert u.types() == ["start", "error"]
    assert "upstream HTTP 500" in u.events[-1][1].error
    u.events.clear()
    await u.execute("fail-midstream")
    assert u.types()[-1] == "error"
    assert "upstream stream ended early" in u.events[-1][1].error
    assert u.fake.stats().dropped_streams == 1


def test_command_line_serves_and_prints_its_address() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "iop.testing.fake_openai", "--port", "0", "--models", "m1,m2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("fake-openai listening on 127.0.0.1:"), line
        address = line.rsplit(" ", 1)[1]
        with urllib.request.urlopen(f"http://{address}/v1/models", timeout=10) as response:
            models = json.load(response)
        assert [m["id"] for m in models["data"]] == ["m1", "m2"]
        request = urllib.request.Request(
            f"http://{address}/v1/chat/completions",
            data=json.dumps(
                {"model": "m1", "messages": [{"role": "user", "content": "x"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.load(response)
        assert answer["choices"][0]["message"]["content"] == fake_text(16)
        with urllib.request.urlopen(f"http://{address}/_fake/stats", timeout=10) as response:
            assert json.load(response)["completed_responses"] == 1
    finally:
        proc.terminate()
        proc.wait(10)
