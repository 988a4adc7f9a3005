"""
System-test fixtures. Processes are stopped at teardown and their logs checked: a test fails
when a daemon logged a traceback or the node token.
"""

from __future__ import annotations

import os
import secrets
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
