"""
The systemd units give a stopping Edge time to drain: ``TimeoutStopSec`` exceeds the default
``edge.drain_timeout_sec`` plus the grace the drain gives cancelled work after its bound.
"""

from __future__ import annotations

import configparser
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import DEFAULT_DRAIN_TIMEOUT_SEC
from iop.edge.ingress.drain import CUT_GRACE_SEC

UNITS = Path(__file__).resolve().parents[3] / "etc" / "systemd"


class StopTimeoutTests(SynchronousTestCase):
    def test_edge_units_outlast_the_drain(self) -> None:
        for name in ("iop-edge.service", "iop-edge@.service"):
            parser = configparser.ConfigParser(interpolation=None, strict=True)
            parser.optionxform = str  # type: ignore[assignment,method-assign]
            parser.read_string((UNITS / name).read_text())
            stop = float(parser["Service"]["TimeoutStopSec"])
            self.assertGreater(stop, DEFAULT_DRAIN_TIMEOUT_SEC + CUT_GRACE_SEC, name)
