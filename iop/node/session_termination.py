# -*- test-case-name: iop.test.node.test_session_termination -*-
"""
``TERMINATE_SESSION``: the Edge asks a node to end an adapter's session (a CLI agent's
conversation under a target), whatever runs it has. It arrives as a ``CancelRequest`` like a
run's cancel, but concerns no run: :class:`SessionTermination` resolves the adapter, asks its
provider's :class:`~iop.runtime.interfaces.ISessionTerminator` (bounded by
:data:`TERMINATE_SESSION_TIMEOUT`) and answers one ``CancelResponse``. A run of that session
ends through its adapter (which emits its own terminal), never here.

:func:`cancel_response` is the answer's shape, shared with a run's cancel.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.node.adapters.registry import AdapterRegistry, UnknownAdapter
from iop.node.errors import failure_message
from iop.runtime.interfaces import ISessionTerminator
from iop.wire import runtime_pb2 as pb

__all__ = [
    "TERMINATE_SESSION_TIMEOUT",
    "SessionTermination",
    "cancel_response",
]

# Bound on an adapter's terminate_session, in seconds.
TERMINATE_SESSION_TIMEOUT = 30.0


def cancel_response(request: pb.CancelRequest, ok: bool, reason: str) -> pb.CancelResponse:
    """The answer to ``request``: ``ok``, or not and why."""
    return pb.CancelResponse(
        kind=request.kind,
        run_id=request.run_id,
        session_id=request.session_id,
        ok=ok,
        reason=reason,
    )


class SessionTermination:
    """Ends adapter sessions on the adapters of ``registry`` (one Edge session's)."""

    log = Logger()

    def __init__(self, registry: AdapterRegistry, clock: IReactorTime, node_id: str = "") -> None:
        self._registry = registry
        self._clock = clock
        self._node_id = node_id

    def terminate(self, request: pb.CancelRequest) -> Deferred[pb.CancelResponse]:
        """A ``TERMINATE_SESSION`` request; fires with the response (never fails)."""
        try:
            instance = self._registry.resolve(request.adapter)
        except UnknownAdapter as e:
            return succeed(cancel_response(request, False, str(e)))
        name = instance.name
        if not instance.enabled or instance.provider is None:
            return succeed(cancel_response(request, False, f"adapter {name!r} is disabled"))
        terminator = ISessionTerminator(instance.provider, None)
        if terminator is None:
            return succeed(
                cancel_response(request, False, f"adapter {name!r} does not support sessions")
            )
        if not request.session_id:
            return succeed(cancel_response(request, False, "terminate without a session_id"))
        d: Deferred[bool] = maybeDeferred(
            terminator.terminate_session, request.target, request.session_id
        )
        d.addTimeout(TERMINATE_SESSION_TIMEOUT, self._clock)

        def done(existed: bool) -> pb.CancelResponse:
            self.log.info(
                "session {session_id} on adapter {adapter}: terminate -> {existed}",
                session_id=request.session_id,
                adapter=name,
                existed=bool(existed),
                node_id=self._node_id,
            )
            if existed:
                return cancel_response(request, True, "")
            return cancel_response(
                request, False, f"adapter {name!r} has no session {request.session_id!r}"
            )

        def failed(failure: Failure) -> pb.CancelResponse:
            self.log.warn(
                "terminating session {session_id} on adapter {adapter} failed: {error}",
                session_id=request.session_id,
                adapter=name,
                error=failure_message(failure),
                node_id=self._node_id,
            )
            return cancel_response(
                request, False, f"terminating the session failed: {failure_message(failure)}"
            )

        return d.addCallbacks(done, failed)
