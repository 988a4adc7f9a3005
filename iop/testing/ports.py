"""Listening ports for the processes a system test or a benchmark starts.

Binding port 0 and handing the number on is racy: the kernel gives out the
same ephemeral range to every outgoing connection, so between our probe and
the daemon's own bind another process's connection may take the port
(CI once lost a run to exactly that).  Ports here come from below the
ephemeral range, are probed before they are handed out, and are never handed
out twice by one process.
"""

from __future__ import annotations

import random
import socket

# Linux's default ephemeral range starts at 32768; stay below it and above
# the ports services usually take.
_LOW, _HIGH = 20000, 32000
_given: set[int] = set()
_rng = random.Random()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nobody listens on and no connection of ours will take."""
    high = min(_HIGH, _ephemeral_low() - 1)
    for _ in range(1000):
        port = _rng.randint(_LOW, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port between {_LOW} and {high}")
