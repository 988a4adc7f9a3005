# -*- test-case-name: iop.test.formats.test_sse -*-
"""The SSE parser moved to :mod:`iop.formats.sse`."""

# transitional: removed when ingress moves to iop.formats.sse
from iop.formats.sse import DONE, SSEError, SSEEvent, SSEParser, format_event

__all__ = ["DONE", "SSEError", "SSEEvent", "SSEParser", "format_event"]
