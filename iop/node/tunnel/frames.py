# -*- test-case-name: iop.test.node.test_tunnel,iop.test.node.test_tunnel_properties -*-
"""
A provider tunnel's frames: :class:`TunnelFrames`, the frame order state of one tunnel.

Frames per run id carry ``sequence`` 1, 2, 3…: at most one ``RESPONSE_START``, first; ``BODY``
frames only after it, each at most :data:`BODY_FRAME_BYTES`; at most one ``USAGE``, after
``RESPONSE_START``; then exactly one ``END`` or ``ERROR``, and nothing after it. An ``ERROR``
may come first (a refusal, or a failure before any response).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

from twisted.logger import Logger

from iop.runtime.events import Usage
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import usage_to_proto

__all__ = ["BODY_FRAME_BYTES", "TunnelFrames"]

# A BODY frame carries at most this many bytes; larger upstream chunks are split.
BODY_FRAME_BYTES = 256 * 1024


class _FrameState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    ENDED = "ended"


class TunnelFrames:
    """
    The frames of one tunnel, in an order that is always valid: every method sends its frame
    only when it may come next (and says whether it did), so no caller can produce
    ``BODY`` before ``RESPONSE_START``, a second ``RESPONSE_START``, or anything after
    ``END``/``ERROR``. Sequences are 1, 2, 3…; a ``BODY`` larger than ``body_frame_bytes`` is
    split over several frames.
    """

    log = Logger()

    def __init__(
        self,
        run_id: str,
        send: Callable[[pb.ProviderTunnelFrame], None],
        body_frame_bytes: int = BODY_FRAME_BYTES,
    ) -> None:
        if body_frame_bytes < 1:
            raise ValueError("body_frame_bytes must be at least 1")
        self.run_id = run_id
        self._send = send
        self._body_frame_bytes = body_frame_bytes
        self._state = _FrameState.NEW
        self.sequence = 0
        self.body_bytes = 0
        self.status_code: int | None = None

    @property
    def started(self) -> bool:
        return self._state is not _FrameState.NEW

    @property
    def ended(self) -> bool:
        return self._state is _FrameState.ENDED

    def start(self, status_code: int, headers: Sequence[tuple[str, str]]) -> bool:
        if not self._expect(_FrameState.NEW, "RESPONSE_START"):
            return False
        self._state = _FrameState.STARTED
        self.status_code = status_code
        self._emit(
            pb.ProviderTunnelFrame(
                kind=pb.RESPONSE_START,
                status_code=status_code,
                headers=[pb.Header(name=name, value=value) for name, value in headers],
            )
        )
        return True

    def body(self, data: bytes) -> bool:
        if not self._expect(_FrameState.STARTED, "BODY"):
            return False
        step = self._body_frame_bytes
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            self.body_bytes += len(piece)
            self._emit(pb.ProviderTunnelFrame(kind=pb.BODY, body=piece))
        return True

    def usage(self, usage: Usage) -> bool:
        if not self._expect(_FrameState.STARTED, "USAGE"):
            return False
        self._emit(pb.ProviderTunnelFrame(kind=pb.USAGE, usage=usage_to_proto(usage)))
        return True

    def end(self, metadata: Mapping[str, str] | None = None) -> bool:
        """The last frame of a complete response: END, with ``metadata`` if given."""
        if not self._expect(_FrameState.STARTED, "END"):
            return False
        self._state = _FrameState.ENDED
        self._emit(pb.ProviderTunnelFrame(kind=pb.END, end=True, metadata=metadata))
        return True

    def error(self, message: str, metadata: Mapping[str, str] | None = None) -> bool:
        """The last frame: ERROR ``message``, with ``metadata`` (an error code) if given."""
        if self._state is _FrameState.ENDED:
            self._dropped("ERROR")
            return False
        self._state = _FrameState.ENDED
        self._emit(
            pb.ProviderTunnelFrame(kind=pb.ERROR, end=True, error=message, metadata=metadata)
        )
        return True

    def _expect(self, state: _FrameState, kind: str) -> bool:
        if self._state is state:
            return True
        self._dropped(kind)
        return False

    def _dropped(self, kind: str) -> None:
        self.log.warn(
            "not sending {kind} frame of tunnel {run_id}: the tunnel is {state}",
            kind=kind,
            run_id=self.run_id,
            state=self._state.value,
        )

    def _emit(self, frame: pb.ProviderTunnelFrame) -> None:
        self.sequence += 1
        frame.run_id = self.run_id
        frame.sequence = self.sequence
        self._send(frame)
