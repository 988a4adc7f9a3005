"""Int32 envelope framing: byte-by-byte delivery, limits and malformed frames."""

from __future__ import annotations

import struct
from typing import cast

from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop.wire import runtime_pb2 as pb
from iop.wire.framing import DEFAULT_MAX_FRAME_BYTES, EnvelopeProtocol, FrameTooLarge


class Recorder(EnvelopeProtocol):
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)
        self.received: list[pb.Envelope] = []

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self.received.append(envelope)


def frame(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    return struct.pack("!I", len(data)) + data


def connect(proto: EnvelopeProtocol) -> StringTransport:
    transport = StringTransport()
    proto.makeConnection(transport)
    return transport


class FramingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, object]] = []
        observer = cast(ILogObserver, self.events.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)

    def test_default_limit_is_16_mib(self) -> None:
        self.assertEqual(Recorder().MAX_LENGTH, 16 * 1024 * 1024)

    def test_byte_by_byte(self) -> None:
        """Frames split at every byte boundary still decode, in order."""
        proto = Recorder()
        transport = connect(proto)
        first = pb.Envelope(heartbeat=pb.Heartbeat(sequence=1))
        second = pb.Envelope(register_request=pb.RegisterRequest(hostname="h" * 300))
        data = frame(first) + frame(second)
        for i in range(len(data)):
            proto.dataReceived(data[i : i + 1])
        self.assertEqual(proto.received, [first, second])
        self.assertFalse(transport.disconnecting)

    def test_many_frames_in_one_write(self) -> None:
        proto = Recorder()
        connect(proto)
        envelopes = [pb.Envelope(heartbeat=pb.Heartbeat(sequence=i)) for i in range(1, 50)]
        proto.dataReceived(b"".join(frame(e) for e in envelopes))
        self.assertEqual(proto.received, envelopes)

    def test_frame_at_limit_accepted(self) -> None:
        envelope = pb.Envelope(register_request=pb.RegisterRequest(hostname="x" * 100))
        size = len(envelope.SerializeToString())
        proto = Recorder(max_frame_bytes=size)
        transport = connect(proto)
        proto.dataReceived(frame(envelope))
        self.assertEqual(proto.received, [envelope])
        self.assertFalse(transport.disconnecting)

    def test_oversized_frame_aborts(self) -> None:
        """A length prefix over the limit aborts before the body is buffered."""
        proto = Recorder(max_frame_bytes=64)
        transport = StringTransport()
        aborted: list[bool] = []
        transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
        proto.makeConnection(transport)
        proto.dataReceived(struct.pack("!I", 65) + b"\x00" * 10)
        self.assertEqual(aborted, [True])
        self.assertEqual(proto.received, [])
        self.assertEqual(proto.close_reason, "frame exceeds limit")
        self.assertTrue(any(e.get("reason") == "frame exceeds limit" for e in self.events))

    def test_undecodable_frame_aborts_and_stops_processing(self) -> None:
        proto = Recorder()
        transport = StringTransport()
        aborted: list[bool] = []
        transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
        proto.makeConnection(transport)
        garbage = b"\xff\xff\xff\xff\x0f"
        good = frame(pb.Envelope(heartbeat=pb.Heartbeat(sequence=1)))
        proto.dataReceived(struct.pack("!I", len(garbage)) + garbage + good)
        self.assertEqual(aborted, [True])
        self.assertEqual(proto.received, [])
        self.assertEqual(proto.close_reason, "undecodable frame")

    def test_empty_envelope_aborts(self) -> None:
        proto = Recorder()
        transport = StringTransport()
        aborted: list[bool] = []
        transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
        proto.makeConnection(transport)
        proto.dataReceived(struct.pack("!I", 0))
        self.assertEqual(aborted, [True])
        self.assertEqual(proto.close_reason, "envelope carries no known message")

    def test_truncated_frame_logged_on_close(self) -> None:
        proto = Recorder()
        connect(proto)
        data = frame(pb.Envelope(heartbeat=pb.Heartbeat(sequence=7)))
        proto.dataReceived(data[:-1])
        proto.connectionLost()
        self.assertEqual(proto.received, [])
        self.assertEqual(proto.close_reason, "truncated frame")

    def test_send_round_trip_and_limit(self) -> None:
        proto = Recorder(max_frame_bytes=32)
        transport = connect(proto)
        small = pb.Envelope(heartbeat=pb.Heartbeat(sequence=3))
        proto.send_envelope(small)
        self.assertEqual(transport.value(), frame(small))
        big = pb.Envelope(register_request=pb.RegisterRequest(hostname="y" * 64))
        self.assertRaises(FrameTooLarge, proto.send_envelope, big)

    def test_connections_are_independent(self) -> None:
        """A bad frame on one connection leaves another untouched."""
        bad, good = Recorder(), Recorder()
        bad_transport, good_transport = StringTransport(), StringTransport()
        aborted: list[bool] = []
        bad_transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
        bad.makeConnection(bad_transport)
        good.makeConnection(good_transport)
        bad.dataReceived(struct.pack("!I", DEFAULT_MAX_FRAME_BYTES + 1))
        envelope = pb.Envelope(heartbeat=pb.Heartbeat(sequence=1))
        good.dataReceived(frame(envelope))
        self.assertEqual(aborted, [True])
        self.assertEqual(good.received, [envelope])
        self.assertFalse(good_transport.disconnecting)
