# -*- test-case-name: iop.test.node.test_commands -*-
"""
Node commands: the Edge's queries and controls that are not execution.

:class:`NodeCommandHandler` answers each ``NodeCommandRequest`` with one ``NodeCommandResponse``
whose ``result_json`` is a JSON object; ``ok=False`` with ``error`` when the command cannot be
answered (unknown type, unknown or unsuitable adapter, a failing adapter query). It never runs
anything on an adapter's capacity gate.

``result_json`` shapes:

- ``CAPABILITIES``: ``{"adapters": [{"name", "type", "enabled", "sessions", "ollama",
  "capabilities": {"max_concurrency", "streaming", "tools", "reasoning", "sessions"} | null}]}``
  (``capabilities`` is null for a disabled adapter, which has no provider).
- ``TRANSPORT_STATUS``: ``{"node_id", "state" ("ready" | "closed"), "connected_since_unix_ms",
  "heartbeat_interval_sec", "heartbeat_timeout_sec", "alias", "config_revision", ...}`` plus
  whatever the daemon's ``transport_info`` adds (never a token).
- ``USAGE_STATUS``: ``{"adapters": [{"name", "type", "enabled", "in_use", "limit",
  "active_runs"}], "runs": RunManager.usage(), "active_runs": RunManager.describe()["active"]}``.
- ``SESSION_LIST``: ``{"sessions": [{"adapter", "session_id", "target", "active", ...}]}`` from
  every enabled adapter with a session terminator, or only ``request.adapter`` (which must then
  support sessions); filtered by ``request.target`` when given.
- ``OLLAMA_TAGS`` / ``OLLAMA_PS`` / ``OLLAMA_SHOW``: ``{"adapter": name, "result": <Ollama's
  JSON>}`` from the named ollama adapter, or the only one when ``request.adapter`` is empty.
  ``SHOW`` takes ``arguments["model"]`` (``request.target`` as a fallback).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.registry import AdapterInstance, AdapterRegistry, UnknownAdapter
from iop.node.errors import failure_message
from iop.node.runs import RunManager
from iop.node.session import NodeSession
from iop.runtime.interfaces import IOllamaAPI, ISessionTerminator
from iop.wire import runtime_pb2 as pb

# Bound on a command that asks an adapter (Ollama queries), in seconds.
DEFAULT_COMMAND_TIMEOUT = 30.0

TransportInfo = Callable[[], Mapping[str, object]]


class CommandError(Exception):
    """A command that cannot be answered; the message becomes ``NodeCommandResponse.error``."""


def _command_name(command: int) -> str:
    try:
        return pb.NodeCommandType.Name(command)
    except ValueError:
        return str(command)


class NodeCommandHandler:
    """
    Answers the node commands of one session.

    :param registry: the session's adapter instances.
    :param runs: the session's run manager (usage counters).
    :param send: sends one envelope to the Edge.
    :param clock: bounds adapter queries (``timeout`` seconds).
    :param transport_status: the ``TRANSPORT_STATUS`` document
        (see :func:`session_transport_status`).
    """

    log = Logger()

    def __init__(
        self,
        registry: AdapterRegistry,
        runs: RunManager,
        send: Callable[[pb.Envelope], None],
        clock: IReactorTime,
        transport_status: TransportInfo,
        timeout: float = DEFAULT_COMMAND_TIMEOUT,
        node_id: str = "",
    ) -> None:
        self._registry = registry
        self._runs = runs
        self._send = send
        self._clock = clock
        self._transport_status = transport_status
        self._timeout = timeout
        self._node_id = node_id
        self._handlers: dict[int, Callable[[pb.NodeCommandRequest], Any]] = {
            pb.NODE_COMMAND_CAPABILITIES: self._capabilities,
            pb.NODE_COMMAND_TRANSPORT_STATUS: self._transport,
            pb.NODE_COMMAND_USAGE_STATUS: self._usage,
            pb.NODE_COMMAND_SESSION_LIST: self._sessions,
            pb.NODE_COMMAND_OLLAMA_TAGS: self._ollama_tags,
            pb.NODE_COMMAND_OLLAMA_PS: self._ollama_ps,
            pb.NODE_COMMAND_OLLAMA_SHOW: self._ollama_show,
        }

    def command_received(self, envelope: pb.Envelope) -> None:
        """The ``node_command_request`` handler."""
        self.handle(envelope.node_command_request).addCallback(
            lambda response: self._send(pb.Envelope(node_command_response=response))
        )

    def handle(self, request: pb.NodeCommandRequest) -> Deferred[pb.NodeCommandResponse]:
        """Answer ``request``; the Deferred never fails."""
        handler = self._handlers.get(request.type)
        if handler is None:
            return succeed(
                self._response(
                    request, error=f"unknown node command type {_command_name(request.type)}"
                )
            )
        d: Deferred[Mapping[str, object]] = maybeDeferred(handler, request)
        if not d.called:
            d.addTimeout(self._timeout, self._clock)

        def answered(result: Mapping[str, object]) -> pb.NodeCommandResponse:
            try:
                document = json.dumps(result, separators=(",", ":"), default=str)
            except (TypeError, ValueError) as e:
                return self._response(request, error=f"result is not JSON: {e}")
            return self._response(request, result=document)

        def failed(failure: Failure) -> pb.NodeCommandResponse:
            if failure.check(DeferredTimeoutError):
                message = f"timed out after {self._timeout:g} s"
            else:
                message = failure_message(failure)
            if not failure.check(CommandError):
                self.log.warn(
                    "node command {request_id} ({command}) failed: {error}",
                    request_id=request.request_id,
                    command=_command_name(request.type),
                    adapter=request.adapter,
                    error=message,
                    node_id=self._node_id,
                )
            return self._response(request, error=message)

        return d.addCallbacks(answered, failed)

    def _response(
        self, request: pb.NodeCommandRequest, result: str = "", error: str = ""
    ) -> pb.NodeCommandResponse:
        return pb.NodeCommandResponse(
            request_id=request.request_id,
            type=request.type,
            ok=not error,
            error=error,
            result_json=result,
        )

    # -- commands ----------------------------------------------------------------------------

    def _capabilities(self, request: pb.NodeCommandRequest) -> Mapping[str, object]:
        adapters: list[dict[str, object]] = []
        for instance in self._registry:
            provider = instance.provider
            adapters.append(
                {
                    "name": instance.name,
                    "type": instance.type,
                    "enabled": instance.enabled,
                    "sessions": ISessionTerminator(provider, None) is not None,
                    "ollama": IOllamaAPI(provider, None) is not None,
                    "capabilities": (
                        provider.capabilities().as_dict() if provider is not None else None
                    ),
                }
            )
        return {"adapters": adapters}

    def _transport(self, request: pb.NodeCommandRequest) -> Mapping[str, object]:
        return dict(self._transport_status())

    def _usage(self, request: pb.NodeCommandRequest) -> Mapping[str, object]:
        return {
            "adapters": [
                {
                    "name": instance.name,
                    "type": instance.type,
                    "enabled": instance.enabled,
                    "in_use": instance.gate.in_use,
                    "limit": instance.gate.limit,
                    "active_runs": self._runs.active_count(instance.name),
                }
                for instance in self._registry
            ],
            "runs": self._runs.usage(),
            "active_runs": self._runs.describe()["active"],
        }

    def _sessions(self, request: pb.NodeCommandRequest) -> Mapping[str, object]:
        if request.adapter:
            instance = self._resolve(request.adapter)
            terminator = ISessionTerminator(instance.provider, None)
            if terminator is None:
                raise CommandError(f"adapter {instance.name!r} does not support sessions")
            sources = [(instance, terminator)]
        else:
            sources = [
                (instance, terminator)
                for instance in self._registry
                if instance.enabled
                and (terminator := ISessionTerminator(instance.provider, None)) is not None
            ]
        sessions: list[dict[str, object]] = []
        for instance, terminator in sources:
            for session in terminator.list_sessions():
                entry: dict[str, object] = {"adapter": instance.name}
                entry.update((k, v) for k, v in session.items() if k != "adapter")
                if request.target and entry.get("target") != request.target:
                    continue
                sessions.append(entry)
        return {"sessions": sessions}

    def _ollama_tags(self, request: pb.NodeCommandRequest) -> Deferred[Mapping[str, object]]:
        instance, api = self._ollama(request)
        return api.tags().addCallback(self._ollama_result, instance)

    def _ollama_ps(self, request: pb.NodeCommandRequest) -> Deferred[Mapping[str, object]]:
        instance, api = self._ollama(request)
        return api.ps().addCallback(self._ollama_result, instance)

    def _ollama_show(self, request: pb.NodeCommandRequest) -> Deferred[Mapping[str, object]]:
        model = request.arguments.get("model") or request.target
        if not model:
            raise CommandError("ollama show needs arguments.model")
        instance, api = self._ollama(request)
        return api.show(model).addCallback(self._ollama_result, instance)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _ollama_result(result: object, instance: AdapterInstance) -> Mapping[str, object]:
        return {"adapter": instance.name, "result": result}

    def _resolve(self, reference: str) -> AdapterInstance:
        try:
            instance = self._registry.resolve(reference)
        except UnknownAdapter as e:
            raise CommandError(str(e)) from None
        if not instance.enabled or instance.provider is None:
            raise CommandError(f"adapter {instance.name!r} is disabled")
        return instance

    def _ollama(self, request: pb.NodeCommandRequest) -> tuple[AdapterInstance, IOllamaAPI]:
        """The named ollama adapter, or the only enabled one when none is named."""
        if request.adapter:
            instance = self._resolve(request.adapter)
            api = IOllamaAPI(instance.provider, None)
            if api is None:
                raise CommandError(
                    f"adapter {instance.name!r} ({instance.type}) does not answer Ollama queries"
                )
            return instance, api
        candidates = [
            (instance, api)
            for instance in self._registry
            if instance.enabled and (api := IOllamaAPI(instance.provider, None)) is not None
        ]
        if not candidates:
            raise CommandError("no ollama adapter on this node")
        if len(candidates) > 1:
            names = ", ".join(repr(instance.name) for instance, _ in candidates)
            raise CommandError(f"several ollama adapters ({names}); name one in 'adapter'")
        return candidates[0]


def session_transport_status(
    session: NodeSession, clock: IReactorTime, extra: TransportInfo | None = None
) -> TransportInfo:
    """
    The ``TRANSPORT_STATUS`` document of a :class:`~iop.node.session.NodeSession`: identity,
    state, connected-since, heartbeat cadence, and ``extra()`` (the daemon's own facts). Never the
    token.
    """

    def status() -> Mapping[str, object]:
        ready_at = session.ready_at
        document: dict[str, object] = {
            "node_id": session.node_id,
            "alias": session.config.alias,
            "config_revision": session.config.config_revision,
            "state": "closed" if session.closed else "ready",
            "connected_since_unix_ms": None if ready_at is None else int(ready_at * 1000),
            "connected_for_sec": None if ready_at is None else clock.seconds() - ready_at,
            "heartbeat_interval_sec": session.heartbeat_interval,
            "heartbeat_timeout_sec": session.heartbeat_timeout,
        }
        if extra is not None:
            document.update(extra())
        return document

    return status
