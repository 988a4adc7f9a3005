"""
System-test fixtures. Processes are stopped at teardown and their logs checked: a test fails
when a daemon logged a traceback or the node token.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iop.testing.pki import create_dev_pki
from iop.testing.ports import free_port
from tests.harness import Cluster

ERROR_MARKERS = ("Traceback (most recent call last)", "Unhandled Error", "Unhandled error")


# IOP_TEST_CLUSTER=1: every Edge the harness configures joins a cluster (a ``cluster:`` section on
# one shared redis-server, a key prefix of its own per test): the single-Edge suite, run with
# the Redis lease table under it (`make system-cluster`).
WITH_CLUSTER = os.environ.get("IOP_TEST_CLUSTER", "") not in ("", "0")


@pytest.fixture(scope="session")
def shared_redis() -> Iterator[RedisServer]:
    """One redis-server for the whole session (IOP_TEST_CLUSTER runs)."""
    if shutil.which("redis-server") is None:
        pytest.fail("IOP_TEST_CLUSTER=1 needs redis-server (Debian: apt-get install redis-server)")
    yield from private_redis()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    create_dev_pki(tmp_path / "pki", node_names=["node-a"])
    token = secrets.token_urlsafe(24)
    env = dict(os.environ, IOP_TEST_NODE_TOKEN=token, PYTHONUNBUFFERED="1")
    c = Cluster(tmp_path, token, free_port(), free_port(), env)
    if WITH_CLUSTER:
        redis: RedisServer = request.getfixturevalue("shared_redis")
        prefix = f"t{secrets.token_hex(6)}"
        redis.establish(prefix)
        c.env["IOP_TEST_REDIS_PASSWORD"] = redis.password
        c.cluster_section = {
            "redis": f"unix://{redis.socket}",
            "password": "${IOP_TEST_REDIS_PASSWORD}",
            "key_prefix": prefix,
        }
    yield c
    for d in c.daemons:
        d.stop()
    for d in c.daemons:
        out = d.output()
        assert token not in out, f"{d.name} logged the node token"
        for marker in ERROR_MARKERS:
            assert marker not in out, f"{d.name} logged an error:\n{out}"


class RedisServer:
    """
    A private ``redis-server`` on a unix socket only (no TCP port, no persistence), with a
    password. :meth:`stop`, :meth:`start` (same socket), :meth:`pause`/:meth:`resume` (SIGSTOP:
    a server that accepts nothing and answers nothing).
    """

    def __init__(self, directory: str, password: str) -> None:
        self.directory = directory
        self.socket = os.path.join(directory, "redis.sock")
        self.password = password
        self.log = os.path.join(directory, "redis.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = ["redis-server", "--port", "0", "--unixsocket", self.socket,
                "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                "--requirepass", self.password, "--dir", self.directory,
                "--logfile", self.log]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited: {Path(self.log).read_text(errors='replace')}")
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(self.socket)
                    return
            except OSError:
                time.sleep(0.02)
        pytest.fail("redis-server did not open its socket in 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def establish(self, prefix: str = "iop", db: int = 0) -> None:
        """Mark the lease table of ``prefix`` established (an epoch whose recovery is over), as
        a running cluster's is; a new table otherwise waits one lease TTL before its first grant."""
        key = f"{{{prefix}}}:epoch"
        commands = [("AUTH", self.password), ("SELECT", str(db)), ("SET", key, "0")]
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.socket)
            for command in commands:
                frame = f"*{len(command)}\r\n" + "".join(
                    f"${len(part.encode())}\r\n{part}\r\n" for part in command
                )
                conn.sendall(frame.encode())
                reply = conn.recv(1024)
                if not reply.startswith(b"+OK"):
                    raise RuntimeError(f"redis-server answered {command[0]}: {reply!r}")

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server for one test; skips without the Debian package ``redis-server``."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    yield from private_redis()


def private_redis() -> Iterator[RedisServer]:
    """A redis-server in a fresh directory, running until the generator is closed."""
    # A short directory: a unix socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="iop-redis-")
    server = RedisServer(directory, secrets.token_urlsafe(16))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
