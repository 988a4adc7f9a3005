# -*- test-case-name: iop.test.wire.test_framing -*-
"""
Int32-length-prefixed protobuf ``Envelope`` framing shared by both ends of a node socket.

The protocol only frames: it decodes one envelope and hands it to ``envelope_received``.
An oversized, truncated or undecodable frame closes *this* connection with a logged reason.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import ITransport
from twisted.logger import Logger
from twisted.protocols.basic import Int32StringReceiver
from twisted.python.failure import Failure

from iop.wire.runtime_pb2 import Envelope

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_CONNECTION_DONE = Failure(ConnectionDone())


class FrameTooLarge(ValueError):
    """An outbound envelope is larger than the connection's frame limit."""


class EnvelopeProtocol(Int32StringReceiver):
    """
    Base protocol for node sockets: length-prefixed ``Envelope`` frames, at most
    ``max_frame_bytes`` each. Subclasses implement :meth:`envelope_received`.
    """

    log = Logger()

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.MAX_LENGTH = max_frame_bytes
        self.close_reason: str | None = None

    def makeConnection(self, transport: ITransport) -> None:
        # Frames are small and latency-bound (a token per frame): without TCP_NODELAY, Nagle's
        # algorithm and the peer's delayed ACK hold some of them back by ~40 ms. Through TLS the
        # wrapper forwards the call to the TCP transport; in-memory transports may lack it.
        set_no_delay = getattr(transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            try:
                set_no_delay(True)
            except Exception:
                pass
        super().makeConnection(transport)

    # -- inbound -----------------------------------------------------------------------------

    def stringReceived(self, string: bytes) -> None:
        envelope = Envelope()
        try:
            envelope.ParseFromString(string)
        except DecodeError as e:
            self.drop_connection("undecodable frame", detail=str(e), size=len(string))
            return
        if envelope.WhichOneof("message") is None:
            self.drop_connection("envelope carries no known message", size=len(string))
            return
        self.envelope_received(envelope)

    def lengthLimitExceeded(self, length: int) -> None:
        self.drop_connection("frame exceeds limit", size=length, limit=self.MAX_LENGTH)

    def envelope_received(self, envelope: Envelope) -> None:
        raise NotImplementedError

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        pending = len(self._unprocessed) if self._unprocessed else 0
        if pending and self.close_reason is None:
            self.close_reason = "truncated frame"
            self.log.warn(
                "connection closed inside a frame ({pending} bytes unprocessed)",
                pending=pending,
            )

    # -- outbound ----------------------------------------------------------------------------

    def send_envelope(self, envelope: Envelope) -> None:
        data = envelope.SerializeToString()
        if len(data) > self.MAX_LENGTH:
            raise FrameTooLarge(f"envelope of {len(data)} bytes exceeds {self.MAX_LENGTH}")
        self.sendString(data)

    # -- closing -----------------------------------------------------------------------------

    def drop_connection(self, reason: str, **fields: object) -> None:
        """
        Abort this connection because of bad input, logging why. Idempotent.
        """
        if self.close_reason is None:
            self.close_reason = reason
            self.log.warn(
                "closing node connection: {reason}", reason=reason, peer=self._peer(), **fields
            )
        self.paused = True
        transport: ITransport | None = self.transport
        if transport is not None:
            transport.abortConnection()  # type: ignore[attr-defined]

    def _peer(self) -> str:
        try:
            return str(self.transport.getPeer())  # type: ignore[union-attr]
        except Exception:
            return "?"
