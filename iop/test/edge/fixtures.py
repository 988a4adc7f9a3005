"""Small EdgeConfig builders for edge unit tests (no YAML, no files)."""

from __future__ import annotations

from zope.interface import implementer

from iop.config.model import (
    AdapterConfig,
    EdgeConfig,
    HeartbeatConfig,
    ModelConfig,
    ModelProviderRef,
    NodeConfig,
    NodeToken,
    ProviderConfig,
)
from iop.edge.interfaces import INodeConnection
from iop.wire import runtime_pb2 as pb

TOKENS = {"node-a": "token-for-node-a", "node-b": "token-for-node-b"}


def provider(pid: str, *, enabled: bool = True, capacity: int = 2) -> ProviderConfig:
    return ProviderConfig(
        id=pid,
        adapter="fake",
        category="api",
        adapter_instance="fake",
        type="openai_compat",
        models=("demo-model",),
        enabled=enabled,
        capacity=capacity,
        long_capacity=1,
    )


def node(node_id: str, *providers: ProviderConfig) -> NodeConfig:
    return NodeConfig(
        id=node_id,
        token=NodeToken.from_plaintext(TOKENS[node_id]),
        alias=node_id.upper(),
        adapters=(
            AdapterConfig(name="fake", type="openai_compat", base_url="http://127.0.0.1:1/v1"),
        ),
        providers=providers,
    )


def edge_config() -> EdgeConfig:
    return EdgeConfig(
        id="edge-test",
        node_listen="tcp:0:interface=127.0.0.1",
        admin_listen="tcp:0:interface=127.0.0.1",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(2.0, 5.0),
        max_frame_bytes=1024 * 1024,
        register_timeout_sec=10.0,
        nodes=(
            node("node-a", provider("a-chat"), provider("a-off", enabled=False)),
            node("node-b", provider("b-chat")),
        ),
        models=(
            ModelConfig(
                id="pool",
                providers=(
                    ModelProviderRef("a-chat", "demo-model"),
                    ModelProviderRef("b-chat", "demo-model"),
                ),
            ),
        ),
    )


@implementer(INodeConnection)
class FakeConnection:
    """A node connection stand-in: records what is sent to it; ``fail`` makes sending raise."""

    def __init__(self, fail: bool = False) -> None:
        self.node_id: str | None = None
        self.sent: list[pb.Envelope] = []
        self.fail = fail

    def send_envelope(self, envelope: pb.Envelope) -> None:
        if self.fail:
            raise ConnectionError("socket gone")
        self.sent.append(envelope)
