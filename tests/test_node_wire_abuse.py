"""
A real node process facing a malicious Edge (real reactor, real TLS): garbage frames, a request
before the registration is answered, a config that does not apply, hostile requests to a ready
node. Each bad connection is closed with a logged reason, the node dials again, a ready node
answers what it can, and it never logs a traceback (the fixture checks its log).
"""

from __future__ import annotations

import struct

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from iop.config.model import ServerTLS
from iop.security.tls import server_context_factory
from iop.wire import runtime_pb2 as pb
from iop.wire.framing import EnvelopeProtocol
from tests.harness import Cluster, wait_until


def frame(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    return struct.pack("!I", len(data)) + data


def accepted(*adapters: pb.AdapterConfig) -> pb.Envelope:
    return pb.Envelope(
        register_response=pb.RegisterResponse(
            accepted=True,
            node_id="node-a",
            config=pb.NodeConfigPayload(node_id="node-a", adapters=list(adapters)),
            heartbeat_interval_ms=1000,
            heartbeat_timeout_ms=5000,
        )
    )


CHAT = pb.AdapterConfig(
    name="chat", type="openai_compat", enabled=True, max_concurrency=1,
    base_url="http://127.0.0.1:9/v1",
)  # fmt: skip
# What the malicious Edge answers each connection's register request with, in order.
SCRIPT = [
    ("garbage", struct.pack("!I", 5) + b"\xff\xff\xff\xff\x0f"),
    ("oversized", struct.pack("!I", 2**31)),
    ("early request", frame(pb.Envelope(run_request=pb.RunRequest(run_id="r", adapter="chat")))),
    ("bad config", frame(accepted(pb.AdapterConfig(name="x", type="no-such-type")))),
    ("no node id", frame(pb.Envelope(register_response=pb.RegisterResponse(accepted=True)))),
    ("ready", frame(accepted(CHAT))),
]


class MaliciousEdge(EnvelopeProtocol):
    def __init__(self, attack: str, answer: bytes, edge: Edge) -> None:
        super().__init__()
        self.attack = attack
        self.answer = answer
        self.edge = edge
        self.received: list[pb.Envelope] = []

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self.received.append(envelope)
        kind = envelope.WhichOneof("message")
        if kind == "register_request":
            self.transport.write(self.answer)  # type: ignore[union-attr]
        elif kind == "node_ready_request":
            self.send_envelope(pb.Envelope(node_ready_response=pb.NodeReadyResponse(ready=True)))
            for hostile in HOSTILE:
                self.send_envelope(hostile)
        if len(self.answers()) >= len(HOSTILE_ANSWERS) and not self.edge.answered.called:
            self.edge.answered.callback(self.answers())

    def answers(self) -> list[str]:
        return [
            k
            for e in self.received
            if (k := e.WhichOneof("message") or "") in ("cancel_response", "node_command_response")
        ]

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)  # type: ignore[arg-type]
        self.edge.lost.append(self.attack)


# Sent to the ready node: out-of-range enums, huge and empty fields, unknown adapters.
HOSTILE = [
    pb.Envelope(cancel_request=pb.CancelRequest(kind=77, run_id="nope")),  # type: ignore[arg-type]
    pb.Envelope(node_command_request=pb.NodeCommandRequest(request_id="q", type=99)),  # type: ignore[arg-type]
    pb.Envelope(run_request=pb.RunRequest(run_id="r1", adapter="x" * 100_000)),
    pb.Envelope(run_request=pb.RunRequest(adapter="chat")),
    pb.Envelope(
        provider_tunnel_request=pb.ProviderTunnelRequest(
            run_id="t1", adapter="chat", method="BREW", operation="../../x", body=b"\xff"
        )
    ),
    pb.Envelope(cancel_request=pb.CancelRequest(kind=pb.CANCEL_RUN, run_id="t1")),
]
HOSTILE_ANSWERS = ["cancel_response", "node_command_response", "cancel_response"]


class Edge(Factory):
    def __init__(self) -> None:
        self.connections = 0
        self.lost: list[str] = []
        self.answered: Deferred[list[str]] = Deferred()

    def buildProtocol(self, addr: object) -> MaliciousEdge:
        attack, answer = SCRIPT[min(self.connections, len(SCRIPT) - 1)]
        self.connections += 1
        return MaliciousEdge(attack, answer, self)


@pytest_twisted.ensureDeferred
async def test_node_survives_a_malicious_edge(cluster: Cluster) -> None:
    tls = ServerTLS(str(cluster.root / "pki" / "edge.crt"), str(cluster.root / "pki" / "edge.key"))
    edge = Edge()
    endpoint = SSL4ServerEndpoint(
        reactor, cluster.node_port, server_context_factory(tls), interface="127.0.0.1"
    )
    port = await endpoint.listen(edge)
    try:
        node = cluster.start_node()
        answers = await edge.answered.addTimeout(60, reactor)
        assert sorted(answers) == sorted(HOSTILE_ANSWERS)
        # Every attack before the last cost one connection, and the node dialled again.
        assert edge.lost[: len(SCRIPT) - 1] == [attack for attack, _ in SCRIPT[:-1]]
        assert node.running()
        log = node.output()
        for reason in (
            "undecodable frame",
            "frame exceeds limit",
            "unexpected run_request while registering",
            "unknown type 'no-such-type'",
            "without a node id",
            "node node-a ready",
        ):
            assert reason in log, reason
    finally:
        await port.stopListening()
    node.stop()
    wait_until(lambda: not node.running(), 10, "node stopped")
