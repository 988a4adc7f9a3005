# -*- test-case-name: iop.test.node.test_refresh -*-
"""
The node's answer to a live config refresh: the Edge pushes a new ``NodeConfigPayload``
(``NodeConfigRefreshRequest``) to a ready node, and :class:`ConfigRefreshHandler` applies what
it can without a restart and answers honestly (``NodeConfigRefreshResponse``).

- ``REFRESH_APPLIED``: everything the payload changed took effect — the legacy runtime
  ``concurrency`` metadata and the config revision (the session's config is replaced, so status
  and node commands report the new values at once). Runs and tunnels in flight are untouched:
  no adapter changes on this path.
- ``REFRESH_RESTART_REQUIRED``: the adapter set or an adapter's settings changed (they are
  built once per session), or the node's alias or agent kind changed; nothing is applied. The
  reason names the adapters or fields, never a value (headers and env carry credentials).
- ``REFRESH_FAILED``: the payload is not for this node, or applying it raised; nothing is
  applied.

Atomic, like the Edge's apply: either every change in the payload takes effect or none does.

One exception keeps a disabled provider from forcing a restart: an adapter's protocol profile
is the profile of the first *enabled* provider that uses it, so disabling the last such provider
empties it in the payload. No enabled provider can reach the adapter then, so the node keeps
the profile it has (an empty profile is no change); a different non-empty profile is an adapter
setting and needs a restart.
"""

from __future__ import annotations

from twisted.logger import Logger

from iop.node.session import NodeSession
from iop.wire import runtime_pb2 as pb

__all__ = ["ConfigRefreshHandler", "decide"]


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
    if not _has_profile(new):
        # An emptied profile is no change; compare everything else.
        old = _without_profile(old)
        new = _without_profile(new)
    return old == new


def _without_profile(adapter: pb.AdapterConfig) -> pb.AdapterConfig:
    copy = pb.AdapterConfig()
    copy.CopyFrom(adapter)
    copy.ClearField("profile")
    return copy


def _live_changes(current: pb.NodeConfigPayload, applied: pb.NodeConfigPayload) -> list[str]:
    changes = []
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
