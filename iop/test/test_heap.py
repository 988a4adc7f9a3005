"""Tests for :mod:`iop.heap`: the daemons' startup objects leave the collector's work."""

from __future__ import annotations

import gc

from twisted.application.service import MultiService
from twisted.trial.unittest import SynchronousTestCase

from iop.heap import FrozenStartup


class FrozenStartupTests(SynchronousTestCase):
    def test_freezes_once_started_after_a_collection(self) -> None:
        calls: list[str] = []

        def collect(*args: object) -> int:
            calls.append("collect")
            return 0

        self.patch(gc, "collect", collect)
        self.patch(gc, "freeze", lambda: calls.append("freeze"))
        top = MultiService()
        FrozenStartup().setServiceParent(top)
        self.assertEqual(calls, [])
        top.startService()
        self.assertEqual(calls, ["collect", "freeze"])
        top.stopService()
