"""
Fakes for the node tests: a scripted Edge that answers the register/ready handshake, and an
endpoint that counts dials and connects each one to a fresh fake Edge in memory (iosim).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.wire import runtime_pb2 as pb
from iop.wire.framing import EnvelopeProtocol

TOKEN = "node-token-that-must-never-be-logged"
NODE_ID = "node-1"


# -- messages ---------------------------------------------------------------------------------


def adapter(
    name: str = "", type: str = "vllm", enabled: bool = True, max_concurrency: int = 2
) -> pb.AdapterConfig:
    return pb.AdapterConfig(
        name=name,
        type=type,
        enabled=enabled,
        max_concurrency=max_concurrency,
        base_url="http://10.0.0.5:8000/v1",
        headers={"Authorization": "Bearer upstream-secret"},
    )


def payload(*adapters: pb.AdapterConfig, node_id: str = NODE_ID) -> pb.NodeConfigPayload:
    if not adapters:
        adapters = (adapter("gpu", "vllm"),)
    return pb.NodeConfigPayload(
        node_id=node_id, alias="lab", adapters=list(adapters), config_revision=7
    )


def accepted(
    config: pb.NodeConfigPayload | None = None,
    node_id: str = NODE_ID,
    interval_ms: int = 2000,
    timeout_ms: int = 5000,
) -> pb.Envelope:
    return pb.Envelope(
        register_response=pb.RegisterResponse(
            accepted=True,
            node_id=node_id,
            config=config if config is not None else payload(node_id=node_id),
            heartbeat_interval_ms=interval_ms,
            heartbeat_timeout_ms=timeout_ms,
        )
    )


def rejected(code: int, reason: str = "rejected by test edge") -> pb.Envelope:
    return pb.Envelope(
        register_response=pb.RegisterResponse(
            accepted=False,
            reason=reason,
            reject_code=code,  # type: ignore[arg-type]
        )
    )


def ready_response(ready: bool = True, reason: str = "", node_id: str = NODE_ID) -> pb.Envelope:
    return pb.Envelope(
        node_ready_response=pb.NodeReadyResponse(ready=ready, node_id=node_id, reason=reason)
    )


def frame(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    return struct.pack("!I", len(data)) + data


def drain(transport: StringTransport) -> list[pb.Envelope]:
    """Decode and clear everything written to ``transport``."""
    data = transport.value()
    transport.clear()
    envelopes = []
    while data:
        (length,) = struct.unpack("!I", data[:4])
        envelope = pb.Envelope()
        envelope.ParseFromString(data[4 : 4 + length])
        envelopes.append(envelope)
        data = data[4 + length :]
    return envelopes


def kinds(envelopes: Iterable[pb.Envelope], heartbeats: bool = False) -> list[str | None]:
    return [
        e.WhichOneof("message")
        for e in envelopes
        if heartbeats or e.WhichOneof("message") != "heartbeat"
    ]


# -- a fake Edge ------------------------------------------------------------------------------


class FakeEdge(EnvelopeProtocol):
    """
    Answers ``RegisterRequest`` with ``register`` (closing after a rejection, as the Edge does)
    and ``NodeReadyRequest`` with ``ready``. ``None`` means stay silent.
    """

    def __init__(
        self,
        register: pb.Envelope | None = None,
        ready: pb.Envelope | None = None,
    ) -> None:
        super().__init__()
        self.register = register
        self.ready = ready
        self.received: list[pb.Envelope] = []
        self.lost = False

    def envelope_received(self, envelope: pb.Envelope) -> None:
        self.received.append(envelope)
        kind = envelope.WhichOneof("message")
        if kind == "register_request" and self.register is not None:
            self.send_envelope(self.register)
            if not self.register.register_response.accepted:
                self.transport.loseConnection()  # type: ignore[union-attr]
        elif kind == "node_ready_request" and self.ready is not None:
            self.send_envelope(self.ready)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost = True

    def kinds(self) -> list[str | None]:
        return kinds(self.received)


def accepting_edge() -> FakeEdge:
    return FakeEdge(accepted(), ready_response())


def rejecting_edge(code: int) -> Callable[[], FakeEdge]:
    return lambda: FakeEdge(rejected(code))


def silent_edge() -> FakeEdge:
    return FakeEdge()


# -- a counting endpoint ----------------------------------------------------------------------

Outcome = Callable[[], FakeEdge] | None


@implementer(IStreamClientEndpoint)
class FakeEndpoint:
    """
    Counts dials. Each dial takes the next scripted outcome (then ``default``): ``None`` refuses
    the connection, a callable builds the :class:`FakeEdge` the dial connects to in memory.
    """

    def __init__(self, clock: Clock, outcomes: Iterable[Outcome] = (), default: Outcome = None):
        self.clock = clock
        self.outcomes = list(outcomes)
        self.default = default
        self.attempts = 0
        self.edges: list[FakeEdge] = []
        self.pumps: list[iosim.IOPump] = []

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        self.attempts += 1
        outcome = self.outcomes.pop(0) if self.outcomes else self.default
        if outcome is None:
            return fail(ConnectionRefusedError("fake edge refused the connection"))
        edge = outcome()
        client = protocolFactory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 7443))
        assert client is not None
        pump = iosim.connect(
            edge,
            iosim.makeFakeServer(edge),
            client,
            iosim.makeFakeClient(client),
            greet=False,
            clock=self.clock,
        )
        self.edges.append(edge)
        self.pumps.append(pump)
        return succeed(client)

    def flush(self) -> None:
        """Move all pending bytes and disconnects, on every connection made so far."""
        for pump in self.pumps:
            pump.flush()


def capture_events(testCase: SynchronousTestCase) -> EventLoggingObserver:
    """Record every log event for the rest of ``testCase``."""
    observer = EventLoggingObserver()
    globalLogPublisher.addObserver(observer)
    testCase.addCleanup(globalLogPublisher.removeObserver, observer)
    return observer
