# -*- test-case-name: iop.test.edge.test_commands -*-
"""
Node commands and session termination from the Edge: request/response over a ready node's
socket, bounded by a timeout, failed at once when that node's generation is fenced.

Commands are queries and control (capabilities, transport/usage status, session list, Ollama
``tags``/``ps``/``show``); they never carry execution.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from iop.edge.errors import CommandFailed, NodeUnavailable, NoRoute
from iop.edge.interfaces import INodeConnection, INodeLifecycleObserver, Send, send_envelope
from iop.edge.registry import NodeRegistry
from iop.wire import runtime_pb2 as pb

COMMAND_TIMEOUT_SEC = 30.0

COMMAND_TYPES: Mapping[str, int] = {
    "capabilities": pb.NODE_COMMAND_CAPABILITIES,
    "transport": pb.NODE_COMMAND_TRANSPORT_STATUS,
    "usage": pb.NODE_COMMAND_USAGE_STATUS,
    "sessions": pb.NODE_COMMAND_SESSION_LIST,
    "ollama-tags": pb.NODE_COMMAND_OLLAMA_TAGS,
    "ollama-ps": pb.NODE_COMMAND_OLLAMA_PS,
    "ollama-show": pb.NODE_COMMAND_OLLAMA_SHOW,
}


@dataclass(frozen=True)
class SessionTermination:
    """A node's answer to a session termination: ``ok``, or why not."""

    ok: bool
    reason: str = ""


@dataclass
class _Pending:
    node_id: str
    generation: int
    deferred: Deferred[Any]


@implementer(INodeLifecycleObserver)
class NodeCommander:
    log = Logger()

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        send: Send = send_envelope,
        timeout: float = COMMAND_TIMEOUT_SEC,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._send = send
        self._timeout = timeout
        self._pending: dict[str, _Pending] = {}
        registry.add_observer(self)

    def command(
        self,
        node_id: str,
        kind: str,
        *,
        adapter: str = "",
        target: str = "",
        arguments: Mapping[str, str] | None = None,
    ) -> Deferred[Any]:
        """Run a named command on a ready node; fires with the decoded JSON result."""
        command_type = COMMAND_TYPES.get(kind)
        if command_type is None:
            raise NoRoute(f"unknown command {kind!r} (one of: {', '.join(COMMAND_TYPES)})")
        connection, generation = self._ready(node_id)
        request_id = f"cmd-{uuid.uuid4().hex}"
        request = pb.NodeCommandRequest(
            request_id=request_id,
            type=command_type,  # type: ignore[arg-type]
            adapter=adapter,
            target=target,
        )
        request.arguments.update(dict(arguments or {}))
        d = self._track(request_id, node_id, generation)
        self._send(connection, pb.Envelope(node_command_request=request))
        return d.addCallback(self._decode)

    def terminate_session(
        self, node_id: str, adapter: str, target: str, session_id: str
    ) -> Deferred[SessionTermination]:
        connection, generation = self._ready(node_id)
        key = f"session:{adapter}:{session_id}"
        if key in self._pending:
            raise NoRoute(f"session {session_id!r} is already being terminated")
        d: Deferred[pb.CancelResponse] = self._track(key, node_id, generation)
        self._send(
            connection,
            pb.Envelope(
                cancel_request=pb.CancelRequest(
                    kind=pb.TERMINATE_SESSION, adapter=adapter, target=target, session_id=session_id
                )
            ),
        )
        return d.addCallback(lambda response: SessionTermination(response.ok, response.reason))

    # -- inbound -----------------------------------------------------------------------------

    def command_response(
        self, connection: INodeConnection, response: pb.NodeCommandResponse
    ) -> None:
        self._resolve(connection, response.request_id, response)

    def cancel_response(self, connection: INodeConnection, response: pb.CancelResponse) -> None:
        if response.kind == pb.TERMINATE_SESSION:
            # CancelResponse carries no adapter; a session id is unique enough per node.
            for key in list(self._pending):
                if key.startswith("session:") and key.endswith(f":{response.session_id}"):
                    self._resolve(connection, key, response)
                    return

    def node_ready(self, node_id: str, generation: int) -> None:
        pass

    def node_fenced(self, node_id: str, generation: int) -> None:
        for key, pending in list(self._pending.items()):
            if pending.node_id == node_id and pending.generation == generation:
                del self._pending[key]
                pending.deferred.errback(CommandFailed(f"node {node_id} disconnected"))

    # -- helpers -----------------------------------------------------------------------------

    def _ready(self, node_id: str) -> tuple[INodeConnection, int]:
        connection = self._registry.ready_connection(node_id)
        ownership = self._registry.ownership_of(connection) if connection is not None else None
        if connection is None or ownership is None:
            raise NodeUnavailable(f"node {node_id!r} is not connected")
        return connection, ownership.generation

    def _track(self, key: str, node_id: str, generation: int) -> Deferred[Any]:
        def forget(_: Deferred[Any]) -> None:
            self._pending.pop(key, None)

        d: Deferred[Any] = Deferred(forget)
        self._pending[key] = _Pending(node_id, generation, d)
        return d.addTimeout(self._timeout, self._clock)

    def _resolve(self, connection: INodeConnection, key: str, response: Any) -> None:
        pending = self._pending.get(key)
        if pending is None or self._registry.ready_connection(pending.node_id) is not connection:
            self.log.debug("dropping a response nobody waits for ({key})", key=key)
            return
        del self._pending[key]
        pending.deferred.callback(response)

    @staticmethod
    def _decode(response: pb.NodeCommandResponse) -> Any:
        if not response.ok:
            raise CommandFailed(response.error or "command failed")
        return json.loads(response.result_json) if response.result_json else {}
