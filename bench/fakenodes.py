"""
Many idle nodes in one lightweight process, speaking the real node wire to a real Edge.

Each fake node dials the Edge's node listener over TLS (verifying the Edge's certificate for its
workload name against the CA), then exchanges Int32-length-prefixed protobuf ``Envelope`` frames
exactly as :mod:`iop.node.transport` does: ``RegisterRequest`` with its own token →
``RegisterResponse`` (accepted, node id, heartbeat cadence) → ``NodeReadyRequest`` →
``NodeReadyResponse`` → a heartbeat at the Edge's interval, forever. It runs no adapters: the
Edge config gives these nodes none, so nothing is ever dispatched to them.

``python -m bench.fakenodes --port P --ca CA --tokens-file F [--server-name NAME]
[--parallel 50]`` connects one node per line of ``F`` (a token per line), prints one JSON line
``{"ready": N, "failed": K, "seconds": S, "errors": [...]}`` once every node is ready (or has
failed), and then keeps them connected until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from iop.wire import runtime_pb2 as pb

_LENGTH = struct.Struct("!I")


class NodeRejected(Exception):
    """The Edge refused this fake node's registration or ready request."""


@dataclass
class FakeNode:
    index: int
    token: str
    node_id: str = ""
    heartbeat_interval: float = 2.0
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    sequence: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def send(self, envelope: pb.Envelope) -> None:
        assert self.writer is not None
        data = envelope.SerializeToString()
        self.writer.write(_LENGTH.pack(len(data)) + data)

    async def receive(self) -> pb.Envelope:
        assert self.reader is not None
        (length,) = _LENGTH.unpack(await self.reader.readexactly(_LENGTH.size))
        envelope = pb.Envelope()
        envelope.ParseFromString(await self.reader.readexactly(length))
        return envelope

    async def expect(self, kind: str) -> pb.Envelope:
        """The next envelope of ``kind``, skipping the Edge's heartbeats."""
        while True:
            envelope = await self.receive()
            got = envelope.WhichOneof("message")
            if got == kind:
                return envelope
            if got != "heartbeat":
                raise NodeRejected(f"expected {kind}, got {got}")

    async def connect(self, host: str, port: int, context: ssl.SSLContext, name: str) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            host, port, ssl=context, server_hostname=name
        )
        self.send(
            pb.Envelope(
                register_request=pb.RegisterRequest(
                    token=self.token, node_version="bench-fake-node", hostname=f"fake{self.index}"
                )
            )
        )
        registered = (await self.expect("register_response")).register_response
        if not registered.accepted:
            raise NodeRejected(f"registration refused: {registered.reason}")
        self.node_id = registered.node_id
        if registered.heartbeat_interval_ms:
            self.heartbeat_interval = registered.heartbeat_interval_ms / 1000
        self.send(pb.Envelope(node_ready_request=pb.NodeReadyRequest(node_id=self.node_id)))
        ready = (await self.expect("node_ready_response")).node_ready_response
        if not ready.ready:
            raise NodeRejected(f"ready refused: {ready.reason}")
        self.tasks = [
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._drain()),
        ]

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            self.sequence += 1
            self.send(
                pb.Envelope(
                    heartbeat=pb.Heartbeat(
                        sequence=self.sequence, sent_unix_ms=int(time.time() * 1000)
                    )
                )
            )

    async def _drain(self) -> None:
        """Read (and ignore) what the Edge sends: its heartbeats."""
        try:
            while True:
                await self.receive()
        except (asyncio.IncompleteReadError, ConnectionError):
            for task in self.tasks:
                if task is not asyncio.current_task():
                    task.cancel()

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.writer is not None:
            self.writer.close()


def tls_context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def run(args: argparse.Namespace) -> int:
    with open(args.tokens_file) as f:
        tokens = [line.strip() for line in f if line.strip()]
    context = tls_context(args.ca)
    nodes = [FakeNode(i, token) for i, token in enumerate(tokens)]
    gate = asyncio.Semaphore(args.parallel)
    errors: list[str] = []

    async def start(node: FakeNode) -> bool:
        async with gate:
            try:
                await asyncio.wait_for(
                    node.connect(args.host, args.port, context, args.server_name), 30
                )
                return True
            except (OSError, TimeoutError, asyncio.IncompleteReadError, NodeRejected) as e:
                errors.append(f"node {node.index}: {type(e).__name__}: {e}")
                node.close()
                return False

    began = time.monotonic()
    results = await asyncio.gather(*(start(n) for n in nodes))
    report = {
        "ready": sum(results),
        "failed": len(results) - sum(results),
        "seconds": round(time.monotonic() - began, 3),
        "errors": errors[:5],
    }
    print(json.dumps(report), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for node in nodes:
        node.close()
    return 0 if not errors else 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fakenodes", description="Hold many idle fake nodes on an Edge."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="the Edge's node listener")
    parser.add_argument("--ca", required=True, help="CA certificate (PEM) of the Edge")
    parser.add_argument("--server-name", default="edge.iop.internal")
    parser.add_argument("--tokens-file", required=True, help="one node token per line")
    parser.add_argument("--parallel", type=int, default=50, help="handshakes in flight at once")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    raise SystemExit(main())
