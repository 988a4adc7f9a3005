# -*- test-case-name: iop.test.node.test_tunnel,iop.test.node.test_tunnel_properties -*-
"""
The Node's provider raw tunnel: one ``ProviderTunnelRequest`` becomes one HTTP request to an
OpenAI-compatible provider, and its response goes back to the Edge as ordered
``ProviderTunnelFrame``s, bytes untouched (in managed mode, but for the lease's secret).

One concept per module:

- :mod:`~iop.node.tunnel.manager` — :class:`TunnelManager`: one session's tunnel requests and
  cancels, admitted through an :class:`~iop.node.admission.Admission`;
- :mod:`~iop.node.tunnel.plan` — what a request asks of its upstream (HTTP provider, method,
  operation → path), checked at admission;
- :mod:`~iop.node.tunnel.credentials` — managed mode's lease checks and credential header;
- :mod:`~iop.node.tunnel.exchange` — one tunnel's life: the upstream exchange, timeouts, body
  frames, echo redaction and its single end;
- :mod:`~iop.node.tunnel.headers` — the header policy, request and response;
- :mod:`~iop.node.tunnel.frames` — :class:`TunnelFrames`, the frame order state;
- :mod:`~iop.node.tunnel.usage` — :class:`UsageObserver`, the usage read on the side.

Frames per run id carry ``sequence`` 1, 2, 3…: at most one ``RESPONSE_START``, first; ``BODY``
frames after it, concatenating to exactly the bytes the upstream sent; then exactly one ``END``
or ``ERROR``. ``USAGE`` (observation only) goes out before ``END`` when the provider reported
any. The body itself is never parsed into anything else, re-encoded or held back beyond the end
of its reactor turn.
"""

from iop.node.tunnel.frames import BODY_FRAME_BYTES, TunnelFrames
from iop.node.tunnel.headers import filter_response_headers, upstream_request_headers
from iop.node.tunnel.manager import TunnelManager
from iop.node.tunnel.usage import UsageObserver

__all__ = [
    "BODY_FRAME_BYTES",
    "TunnelFrames",
    "TunnelManager",
    "UsageObserver",
    "filter_response_headers",
    "upstream_request_headers",
]
