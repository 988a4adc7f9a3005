"""
Child processes for the benchmark: start, wait for a port, stop; and what ``/proc`` says about
them (resident memory, CPU seconds), summed over a process and its descendants.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """Something the benchmark needs did not start or did not answer."""


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; return the seconds it took. Raises BenchError on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise BenchError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Child:
    """One child process, its output going to a log file."""

    name: str
    argv: list[str]
    env: Mapping[str, str]
    log: Path
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(self.env),
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BenchError(f"{self.name} was not started")
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        if not self.running():
            raise BenchError(f"{self.name} exited; last lines of its log:\n{self.tail()}")

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the child's process group, then SIGKILL it if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=timeout)

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Children:
    """Every child the benchmark started, stopped in reverse order."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        cwd: Path | None = None,
    ) -> Child:
        child = Child(name, list(argv), env, log, cwd).start()
        self.items.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.items):
            child.stop()
        self.items.clear()


# -- /proc ---------------------------------------------------------------------------------------


def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (live ones)."""
    tree = _children_of()
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(tree.get(current, ()))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of one process in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except OSError:
        return 0


@dataclass(frozen=True)
class ProcSample:
    """RSS and CPU seconds of a process tree at one moment."""

    rss_bytes: int
    cpu_seconds: float
    processes: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "rss_mib": round(self.rss_bytes / 2**20, 2),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "processes": self.processes,
        }


def sample(pid: int) -> ProcSample:
    pids = process_tree(pid)
    return ProcSample(
        rss_bytes=sum(rss_bytes(p) for p in pids),
        cpu_seconds=sum(cpu_seconds(p) for p in pids),
        processes=len(pids),
    )
