"""
The Edge under the common default open-file limit (a soft and hard ``RLIMIT_NOFILE`` of 1024)
against 1,100 slow-header connections, from one client address and then from six: while they
are held, normal clients are served, the admin port answers and the node stays ready, and the
Edge never runs out of descriptors (no ``EMFILE``). A single address gets only its per-peer cap;
several addresses fill the total cap, and a connection that never sent its head makes room for a
new client. With a hard limit above the soft one, the Edge raises its soft limit as far as
``openai.max_connections`` asks and says so at start.
"""

from __future__ import annotations

import http.client
import json
import re
import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from iop.config.model import DEFAULT_MAX_CONNECTIONS
from iop.edge.accesslog import FLOOD_BURST
from iop.edge.descriptors import ClientCaps, client_caps, reserve, wanted_limit
from iop.edge.ingress.channel import EVICT_AFTER_SEC
from iop.testing.fake_openai import fake_text
from tests.harness import CLIENT_KEY, Cluster, wait_until

LIMIT = 1024
ATTACKERS = 1100
TOKENS = 8
PROBES = 6
# What the Edge may never log: its accept() ran out of descriptors.
OUT_OF_FILES = ("EMFILE", "Too many open files", "Could not accept new connection", "Out of files")
START_LINE = re.compile(
    r"open files: limit (\d+) \(found (\d+), hard (\w+)\), (\d+) reserved for nodes, admin and "
    r"the process; client listener: (\d+) connections served, (\d+) per address, (\d+) open"
)


@pytest.fixture(autouse=True)
def enough_files_here() -> Iterator[None]:
    """This process holds the 1,100 attacking sockets: its own soft limit must allow them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * ATTACKERS
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard open-file limit here ({hard}) is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Slowloris:
    """
    ``count`` connections from ``sources`` in turn, each sending a request line and a header a
    byte at a time and never ending its head; a background thread trickles the bytes and notes
    what each connection gets back (an answer, or a close).
    """

    HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200

    def __init__(self, port: int, sources: list[str], count: int) -> None:
        self.sockets: list[socket.socket] = []
        self.sent = [0] * count
        self.answers: dict[int, bytes] = {}
        self.closed: set[int] = set()
        self.lock = threading.Lock()
        for i in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((sources[i % len(sources)], 0))
            sock.connect_ex(("127.0.0.1", port))
            self.sockets.append(sock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.is_set():
            for i, sock in enumerate(self.sockets):
                if i in self.closed:
                    continue
                try:
                    if self.sent[i] < len(self.HEAD):
                        self.sent[i] += sock.send(self.HEAD[self.sent[i] : self.sent[i] + 1])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    pass  # not connected yet, or reset: the read below tells
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                with self.lock:
                    if data:
                        self.answers[i] = self.answers.get(i, b"") + data
                    else:
                        self.closed.add(i)
            self._stop.wait(0.2)

    def held(self) -> int:
        """Connections still open with no answer: those the Edge is serving (reading)."""
        with self.lock:
            over = self.closed | set(self.answers)
            return len(self.sockets) - len(over)

    def statuses(self) -> dict[int, int]:
        with self.lock:
            return {
                i: int(data.split(b" ", 2)[1])
                for i, data in self.answers.items()
                if data.startswith(b"HTTP/1.1 ")
            }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.sockets:
            sock.close()


def expected_caps(cluster: Cluster) -> ClientCaps:
    """What the Edge should take under LIMIT, with one node (as the start log must say)."""
    reserved = reserve(1, cluster=cluster.cluster_section is not None)
    return client_caps(DEFAULT_MAX_CONNECTIONS, None, LIMIT - reserved)


def chat_probe() -> bytes:
    return json.dumps(
        {"model": "chat", "messages": [{"role": "user", "content": "say hello"}]}
    ).encode()


def probe(cluster: Cluster) -> tuple[int, str]:
    """A normal client (from 127.0.0.1): one chat completion, its status and text."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", cluster.client_port, timeout=20, source_address=("127.0.0.1", 0)
    )
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=chat_probe(),
            headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
        )
        response = connection.getresponse()
        body = json.loads(response.read())
    finally:
        connection.close()
    if response.status != 200:
        return response.status, json.dumps(body)
    return 200, body["choices"][0]["message"]["content"]


def admin_answers(cluster: Cluster) -> None:
    with urllib.request.urlopen(cluster.admin + "/healthz", timeout=5) as response:
        assert response.status == 200
    assert cluster.node_connected(), "node-a is no longer connected"


def edge_log(cluster: Cluster) -> str:
    return next(d for d in cluster.daemons if d.name == "edge").output()


def start(cluster: Cluster, nofile: tuple[int, int]) -> None:
    upstream = cluster.start_fake("fake_openai", "--tokens", str(TOKENS))
    # A head deadline longer than the test: only the caps stand between the attack and EMFILE.
    cluster.write_chat_edge_config(
        upstream, openai=cluster.client_api(request_head_timeout_sec=120)
    )
    cluster.start_edge(nofile=nofile)
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")
    assert probe(cluster) == (200, fake_text(TOKENS))


def serve_probes_while_held(cluster: Cluster) -> None:
    for _ in range(PROBES):
        assert probe(cluster) == (200, fake_text(TOKENS))
        admin_answers(cluster)


def test_slowloris_under_1024_files_leaves_clients_admin_and_nodes_served(
    cluster: Cluster,
) -> None:
    start(cluster, (LIMIT, LIMIT))
    caps = expected_caps(cluster)
    assert caps.max_connections_per_peer < ATTACKERS < caps.max_connections + ATTACKERS

    # One attacking address: it gets its per-peer cap, every other connection is refused.
    attack = Slowloris(cluster.client_port, ["127.0.0.2"], ATTACKERS)
    try:
        wait_until(
            lambda: attack.held() <= caps.max_connections_per_peer,
            30,
            "the connections past the per-peer cap refused",
        )
        time.sleep(1)
        assert attack.held() == caps.max_connections_per_peer
        refused = attack.statuses()
        assert refused and set(refused.values()) == {503}, set(refused.values())
        serve_probes_while_held(cluster)
        assert attack.held() == caps.max_connections_per_peer  # held all along
    finally:
        attack.close()

    # Six attacking addresses, each under its per-peer cap: the total cap is what holds.
    sources = [f"127.0.0.{n}" for n in range(2, 8)]
    assert ATTACKERS // len(sources) < caps.max_connections_per_peer
    attack = Slowloris(cluster.client_port, sources, ATTACKERS)
    try:
        wait_until(
            lambda: attack.held() <= caps.max_connections,
            30,
            "the connections past the total cap refused",
        )
        time.sleep(EVICT_AFTER_SEC + 1)
        assert attack.held() == caps.max_connections
        # A normal client takes the place of a connection that never sent its head.
        serve_probes_while_held(cluster)
        # (the first took one place; each next one the place the one before it left)
        wait_until(lambda: attack.held() < caps.max_connections, 5, "a connection evicted")
        time.sleep(0.5)
        assert attack.held() == caps.max_connections - 1
    finally:
        attack.close()

    # Let go: served as before.
    assert probe(cluster) == (200, fake_text(TOKENS))
    log = edge_log(cluster)
    for marker in OUT_OF_FILES:
        assert marker not in log, f"the Edge logged {marker!r}"
    found = START_LINE.search(log)
    assert found is not None, log
    assert found.groups() == (
        str(LIMIT),
        str(LIMIT),
        str(LIMIT),
        str(reserve(1, cluster=cluster.cluster_section is not None)),
        str(caps.max_connections),
        str(caps.max_connections_per_peer),
        str(caps.descriptors),
    )
    assert f"openai.max_connections: {DEFAULT_MAX_CONNECTIONS} is more than" in log
    # Hundreds of refusals, a handful of access-log lines: the flood is summed up, not logged
    # line by line (each refusal is still counted in /metrics).
    refusal_lines = log.count("(too_many_connections)")
    assert 0 < refusal_lines <= 2 * FLOOD_BURST, refusal_lines


def test_the_edge_raises_its_soft_limit_for_the_configured_caps(cluster: Cluster) -> None:
    reserved = reserve(1, cluster=cluster.cluster_section is not None)
    wanted = wanted_limit(reserved, DEFAULT_MAX_CONNECTIONS)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-file limit here ({hard}) is below {wanted}")
    cluster.write_chat_edge_config(1)
    cluster.start_edge(nofile=(LIMIT, wanted + 1000))
    wait_until(lambda: START_LINE.search(edge_log(cluster)) is not None, 10, "the start line")
    found = START_LINE.search(edge_log(cluster))
    assert found is not None
    caps = client_caps(DEFAULT_MAX_CONNECTIONS, None)
    assert found.groups() == (
        str(wanted),
        str(LIMIT),
        str(wanted + 1000),
        str(reserved),
        str(caps.max_connections),
        str(caps.max_connections_per_peer),
        str(caps.descriptors),
    )
    assert "is more than" not in edge_log(cluster)
