# -*- test-case-name: iop.test.edge.test_console -*-
"""
The live web console on the admin listener: one page (``GET /``) and its assets
(``GET /console/<name>``), shipped as package data, plus ``GET /events``, a Server-Sent Events
stream off the Edge's event bus that the page reads beside its ``/status`` polls.

- :mod:`iop.edge.console.assets`: the page and its assets with their security headers (a tight
  Content-Security-Policy, no external URL anywhere), and :func:`public_shell`, which lets a
  browser load that static shell when ``admin.auth`` is on;
- :mod:`iop.edge.console.stream`: the SSE stream (:class:`ConsoleEvents`), one bus
  subscription per open stream, bounded by the client's transport;
- :mod:`iop.edge.console.memory`: what a newly opened console is told first (nodes' connected
  times, per-model totals, the last requests), remembered from the bus since the Edge started.
"""

from iop.edge.console.assets import public_shell
from iop.edge.console.stream import ConsoleEvents

__all__ = ["ConsoleEvents", "public_shell"]
