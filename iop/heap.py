# -*- test-case-name: iop.test.test_heap -*-
"""
The daemons' heap: what exists once a daemon has started is kept out of every later garbage
collection.

A started Edge or Node holds hundreds of thousands of long-lived objects (modules, protobuf
descriptors, config, routes) that no collection will ever free; every full collection of the
cyclic garbage collector still walks them all, and does so at an allocation of whatever request
happens to be running — a pause in its latency. :class:`FrozenStartup` moves them into the
collector's permanent generation (:func:`gc.freeze`) once, when the daemon's services have
started; garbage made afterwards is collected as before.
"""

from __future__ import annotations

import gc

from twisted.application.service import Service

__all__ = ["FrozenStartup"]


class FrozenStartup(Service):
    """Freezes the heap when it starts: make it the last child of a daemon's top service."""

    name = "frozen-startup"

    def startService(self) -> None:
        super().startService()
        gc.collect()
        gc.freeze()
