# -*- test-case-name: iop.test.node.test_runs -*-
"""
What a ready session serves: the handshake hook that installs a new session's request handlers.

Each session gets a :class:`~iop.node.runs.RunManager` (``run_request``), a
:class:`~iop.node.tunnel.TunnelManager` (``provider_tunnel_request``), one ``cancel_request``
handler routing to whichever owns the run id, and a :class:`~iop.node.commands.NodeCommandHandler`
(``node_command_request``) and a :class:`~iop.node.refresh.ConfigRefreshHandler`
(``node_config_refresh_request``: a live config refresh); when the session is lost its runs are
cancelled and its tunnels aborted. A managed node's tunnel manager gets the session's lease
verifier (the node's keys, the id the Edge registered it under, and the process-wide replay
cache), and its run manager refuses runs on the HTTP provider adapters (they are reached only
through leased tunnels). With the node's :class:`~iop.node.drain.NodeDrain`, each session's runs
and tunnels are admitted through its :class:`~iop.node.drain.SessionGate` (refused once the node
drains and the Edge knows), and the Edge's ``node_draining`` answer goes to that gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.internet.interfaces import IReactorTime

from iop.node.commands import NodeCommandHandler, session_transport_status
from iop.node.drain import NodeDrain
from iop.node.refresh import ConfigRefreshHandler
from iop.node.runs import RunManager
from iop.node.session import NodeSession, SessionSetup
from iop.node.store import RunStore
from iop.node.tunnel import TunnelManager
from iop.security.lease import NodeLeaseKeys
from iop.telemetry.tracing import TRACING_OFF, Tracing
from iop.wire import runtime_pb2 as pb

__all__ = ["make_session_setup"]


def make_session_setup(
    store: RunStore,
    clock: IReactorTime,
    transport_info: Callable[[], Mapping[str, object]] | None = None,
    leases: NodeLeaseKeys | None = None,
    drain: NodeDrain | None = None,
    tracing: Tracing = TRACING_OFF,
) -> SessionSetup:
    """
    The handshake hook that equips each new session: a :class:`RunManager` for runs, a
    :class:`TunnelManager` for provider tunnels and a :class:`NodeCommandHandler` for node
    commands, all on the session's adapter registry (so runs and tunnels share each adapter's
    capacity gate). The session has one cancel handler: a ``CANCEL_RUN`` naming an open tunnel
    goes to the tunnel manager, every other cancel to the run manager. When the session closes,
    its active runs are cancelled (and recorded as such) and its tunnels aborted.

    ``leases`` (managed mode): the node's lease keys; each session's tunnels verify and open
    credential leases addressed to the session's node id, and its runs refuse the adapters
    only a leased tunnel may reach. None (legacy): leases are refused.

    ``drain``: the node's drain; each session's work is admitted through its gate.

    ``tracing``: the node's tracing: each run and tunnel gets its span (off: none).
    """

    def setup(session: NodeSession) -> None:
        gate = drain.gate(session) if drain is not None else None
        runs = RunManager(
            session.registry,
            session.send,
            store,
            clock,
            node_id=session.node_id,
            managed=leases is not None,
            work_gate=gate,
            tracing=tracing,
        )
        tunnels = TunnelManager(
            session.registry,
            session.send,
            clock,
            node_id=session.node_id,
            leases=leases.verifier(session.node_id) if leases is not None else None,
            work_gate=gate,
            tracing=tracing,
        )

        def cancel_received(envelope: pb.Envelope) -> None:
            request = envelope.cancel_request
            if request.kind == pb.CANCEL_RUN and tunnels.is_active(request.run_id):
                tunnels.cancel_request_received(envelope)
            else:
                runs.cancel_request_received(envelope)

        commands = NodeCommandHandler(
            session.registry,
            runs,
            session.send,
            clock,
            session_transport_status(session, clock, transport_info),
            node_id=session.node_id,
        )
        session.install("run_request", runs.run_request_received)
        session.install("cancel_request", cancel_received)
        session.install("provider_tunnel_request", tunnels.tunnel_request_received)
        session.install("node_command_request", commands.command_received)
        session.install(
            "node_config_refresh_request", ConfigRefreshHandler(session).request_received
        )
        if gate is not None:
            session.install("node_draining", gate.edge_acknowledged)
        session.when_closed().addCallback(lambda _: runs.connection_lost())
        session.when_closed().addCallback(lambda _: tunnels.connection_lost())

    return setup
