"""
Bad input on a real Edge socket (real reactor, real TLS): a malformed or oversized frame, or a
silent unregistered client, closes that one connection; the ready node is untouched.
"""

from __future__ import annotations

import struct

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from iop.config.model import ClientTLS
from iop.security.tls import client_connection_creator
from iop.wire import runtime_pb2 as pb
from tests.harness import Cluster, wait_until


class RawClient(Protocol):
    def __init__(self) -> None:
        self.lost: Deferred[None] = Deferred()
        self.received = b""

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost.callback(None)


async def connect_raw(cluster: Cluster) -> RawClient:
    creator = client_connection_creator(
        ClientTLS(str(cluster.root / "pki" / "ca.crt"), "edge.iop.internal")
    )
    endpoint = wrapClientTLS(creator, TCP4ClientEndpoint(reactor, "127.0.0.1", cluster.node_port))
    client = RawClient()
    await connectProtocol(endpoint, client)
    return client


def frame(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    return struct.pack("!I", len(data)) + data


def frames(data: bytes) -> list[pb.Envelope]:
    out = []
    while len(data) >= 4:
        (size,) = struct.unpack("!I", data[:4])
        envelope = pb.Envelope()
        envelope.ParseFromString(data[4 : 4 + size])
        out.append(envelope)
        data = data[4 + size :]
    return out


async def closed_within(client: RawClient, seconds: float) -> None:
    await client.lost.addTimeout(seconds, reactor)


@pytest_twisted.ensureDeferred
async def test_bad_frames_close_only_their_connection(cluster: Cluster) -> None:
    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    oversized = await connect_raw(cluster)
    oversized.transport.write(struct.pack("!I", 64 * 1024 * 1024))  # type: ignore[union-attr]
    await closed_within(oversized, 5)

    garbage = await connect_raw(cluster)
    garbage.transport.write(struct.pack("!I", 5) + b"\xff\xff\xff\xff\x0f")  # type: ignore[union-attr]
    await closed_within(garbage, 5)

    impostor = await connect_raw(cluster)
    impostor.transport.write(  # type: ignore[union-attr]
        frame(pb.Envelope(register_request=pb.RegisterRequest(token="guess")))
    )
    await closed_within(impostor, 5)
    [response] = [e for e in frames(impostor.received) if e.HasField("register_response")]
    assert response.register_response.accepted is False
    assert response.register_response.reject_code == pb.REGISTER_REJECT_UNKNOWN_TOKEN

    # A duplicate connection for the live node is refused; the live one stays.
    duplicate = await connect_raw(cluster)
    duplicate.transport.write(  # type: ignore[union-attr]
        frame(pb.Envelope(register_request=pb.RegisterRequest(token=cluster.token)))
    )
    await closed_within(duplicate, 5)

    assert cluster.node_connected()
    edge_log = cluster.daemons[0].output()
    for reason in (
        "frame exceeds limit",
        "undecodable frame",
        "unknown token",
        "already has a live",
    ):
        assert reason in edge_log
