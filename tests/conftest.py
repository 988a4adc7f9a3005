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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    create_dev_pki(tmp_path / "pki", node_names=["node-a"])
    token = secrets.token_urlsafe(24)
    env = dict(os.environ, IOP_TEST_NODE_TOKEN=token, PYTHONUNBUFFERED="1")
    c = Cluster(tmp_path, token, free_port(), free_port(), env)
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
    # A short directory: a unix socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="iop-redis-")
    server = RedisServer(directory, secrets.token_urlsafe(16))
    server.start()
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)
