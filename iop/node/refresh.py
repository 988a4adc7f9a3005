# -*- test-case-name: iop.test.node.test_refresh -*-
"""
The node's answer to a live config refresh: the Edge pushes a new ``NodeConfigPayload``
(``NodeConfigRefreshRequest``) to a ready node, and :class:`ConfigRefreshHandler` applies what
it can without a restart and answers honestly (``NodeConfigRefreshResponse``).

- ``REFRESH_APPLIED``: everything the payload changed took effect — the legacy runtime
  ``concurrency`` metadata, the config revision and adapters' ``max_concurrency`` (the
  session's config is replaced, so status and node commands report the new values at once).
  Runs and tunnels in flight are untouched: a changed ``max_concurrency`` resizes the adapter's
  capacity gate in place (raised: admits at once; lowered: held slots stay, new work waits for
  releases), nothing is rebuilt.
- ``REFRESH_RESTART_REQUIRED``: the adapter set or an adapter's other settings changed (they
  build the provider, once per session), or the node's alias or agent kind changed; nothing is
  applied. The reason names the adapters or fields, never a value (headers and env carry
  credentials).
- ``REFRESH_FAILED``: the payload is not for this node, or applying it raised; nothing is
  applied.

Atomic, like the Edge's apply: either every change in the payload takes effect or none does.

One exception keeps a disabled provider from forcing a restart: an adapter's protocol profile
is the profile of the first *enabled* provider that uses it, so disabling the last such provider
empties it in the payload. No enabled provider can reach the adapter then, so the node keeps
the profile it has (an empty profile is no change); a different non-empty profile is an adapter
setting and needs a restart.

Why ``max_concurrency`` is live when every other adapter setting needs a restart: the Edge
derives it from the capacities of the providers the adapter serves (or checks them against it),
and capacity is a live setting. Were the gate fixed per session, a capacity raised live would be
refused by the node (503 ``provider_busy``) until a restart that cuts every stream; the gate is
a counter, so resizing it is an assignment, with nothing to rebuild.
"""

from __future__ import annotations

from twisted.logger import Logger

from iop.node.adapters.registry import AdapterRegistry
from iop.node.session import NodeSession
from iop.wire import runtime_pb2 as pb

__all__ = ["ConfigRefreshHandler", "decide", "resize_gates"]


def decide(
    current: pb.NodeConfigPayload, candidate: pb.NodeConfigPayload, node_id: str
) -> tuple[int, str, pb.NodeConfigPayload | None]:
    """
    What a refresh from ``current`` to ``candidate`` does on node ``node_id``: the outcome (a
    ``RefreshOutcome`` value), its reason, and the payload the session holds afterwards (None
    unless the outcome is ``REFRESH_APPLIED``).
    """
    if candidate.node_id and candidate.node_id != node_id:
        return (
            pb.REFRESH_FAILED,
            f"config payload is for node {candidate.node_id!r}, this is node {node_id!r}",
            None,
        )
    blocking = _restart_fields(current, candidate)
    if blocking:
        return (
            pb.REFRESH_RESTART_REQUIRED,
            "restart the node to apply: " + "; ".join(blocking),
            None,
        )
    applied = pb.NodeConfigPayload()
    applied.CopyFrom(candidate)
    applied.node_id = node_id
    # Keep a profile the candidate emptied (see the module docstring).
    for kept, new in zip(current.adapters, applied.adapters, strict=True):
        if not _has_profile(new) and _has_profile(kept):
            new.profile.CopyFrom(kept.profile)
    changes = _live_changes(current, applied)
    return pb.REFRESH_APPLIED, ", ".join(changes) if changes else "no change", applied


def _has_profile(adapter: pb.AdapterConfig) -> bool:
    return adapter.HasField("profile") and adapter.profile != pb.RuntimeProfile()


def _restart_fields(current: pb.NodeConfigPayload, candidate: pb.NodeConfigPayload) -> list[str]:
    blocking: list[str] = []
    if candidate.alias != current.alias:
        blocking.append("alias changed")
    if candidate.runtime.agent_kind != current.runtime.agent_kind:
        blocking.append("agent kind changed")
    old_names = [a.name for a in current.adapters]
    new_names = [a.name for a in candidate.adapters]
    if old_names != new_names:
        added = [n for n in new_names if n not in old_names]
        removed = [n for n in old_names if n not in new_names]
        parts = []
        if added:
            parts.append("added " + ", ".join(repr(n) for n in added))
        if removed:
            parts.append("removed " + ", ".join(repr(n) for n in removed))
        if not parts:
            parts.append("reordered")
        blocking.append("adapter set changed (" + "; ".join(parts) + ")")
        return blocking
    changed = [
        new.name
        for old, new in zip(current.adapters, candidate.adapters, strict=True)
        if not _same_adapter(old, new)
    ]
    if changed:
        names = ", ".join(repr(n) for n in changed)
        blocking.append(f"adapter settings changed ({names})")
    return blocking


def _same_adapter(old: pb.AdapterConfig, new: pb.AdapterConfig) -> bool:
    """The same adapter but for what applies live: ``max_concurrency``, an emptied profile."""
    # An emptied profile is no change; compare everything else.
    keep_profile = _has_profile(new)
    return _settings(old, keep_profile) == _settings(new, keep_profile)


def _settings(adapter: pb.AdapterConfig, keep_profile: bool) -> pb.AdapterConfig:
    copy = pb.AdapterConfig()
    copy.CopyFrom(adapter)
    copy.ClearField("max_concurrency")
    if not keep_profile:
        copy.ClearField("profile")
    return copy


def _limit(adapter: pb.AdapterConfig) -> int:
    # 0, unset on the wire, means 1 (as iop.wire.convert reads it).
    return adapter.max_concurrency or 1


def resize_gates(
    registry: AdapterRegistry, current: pb.NodeConfigPayload, applied: pb.NodeConfigPayload
) -> None:
    """Resize the gate of every adapter whose ``max_concurrency`` changed (names unchanged)."""
    for old, new in zip(current.adapters, applied.adapters, strict=True):
        # An unnamed (legacy) adapter's instance is named after its type.
        name = new.name or new.type
        if _limit(old) != _limit(new) and name in registry:
            registry.get(name).resize(_limit(new))


def _live_changes(current: pb.NodeConfigPayload, applied: pb.NodeConfigPayload) -> list[str]:
    changes = [
        f"adapter {new.name!r} max_concurrency {_limit(old)} → {_limit(new)}"
        for old, new in zip(current.adapters, applied.adapters, strict=True)
        if _limit(old) != _limit(new)
    ]
    if applied.runtime.concurrency != current.runtime.concurrency:
        changes.append(f"concurrency {current.runtime.concurrency} → {applied.runtime.concurrency}")
    if applied.config_revision != current.config_revision:
        changes.append(f"config revision {current.config_revision} → {applied.config_revision}")
    return changes


class ConfigRefreshHandler:
    """A session's ``node_config_refresh_request`` handler (see the module docstring)."""

    log = Logger()

    def __init__(self, session: NodeSession) -> None:
        self._session = session

    def request_received(self, envelope: pb.Envelope) -> None:
        request = envelope.node_config_refresh_request
        session = self._session
        try:
            outcome, reason, applied = decide(session.config, request.config, session.node_id)
            if applied is not None:
                # Resizing is only assignments (limits already checked at least 1).
                resize_gates(session.registry, session.config, applied)
                session.config = applied
        except Exception as e:
            self.log.failure("config refresh {request_id} failed", request_id=request.request_id)
            outcome, reason = pb.REFRESH_FAILED, f"applying the config failed: {type(e).__name__}"
        self.log.info(
            "config refresh {request_id}: {outcome} ({reason})",
            request_id=request.request_id,
            outcome=pb.RefreshOutcome.Name(outcome),  # type: ignore[arg-type]
            reason=reason,
            node_id=session.node_id,
        )
        session.send(
            pb.Envelope(
                node_config_refresh_response=pb.NodeConfigRefreshResponse(
                    request_id=request.request_id,
                    outcome=outcome,  # type: ignore[arg-type]
                    reason=reason,
                )
            )
        )
