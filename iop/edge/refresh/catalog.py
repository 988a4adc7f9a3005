# -*- test-case-name: iop.test.edge.refresh.test_provider_catalog -*-
"""
Which providers a refresh adds to or removes from a node can be switched live, and why the
others cannot: one rule, read by the classifier (their reports are ``restart_required`` with
the reason) and by the applier's invariants (a candidate that reaches it anyway is refused).

A provider is a pool resource bound to an adapter instance the node runs. Adding one on an
adapter the node already runs, or removing one, changes only what the Edge grants: the pool,
the status, the lease table and the credential issuer take it at once, and the node's payload
changes at most by the adapter's computed ``max_concurrency`` (a live resize) — so it is live.
Restart-required, each named on the provider's own report:

- its adapter is new on the node (or leaves the node with it): the node builds its adapters
  when its session starts and answers ``restart_required`` to an adapter-set change;
- it moved between nodes (the same id removed from one and added to another): leases, their
  counters and the cluster's lease records are keyed by provider id, and its old leases still
  run on the old node while the new node would take its new ones;
- adding or removing it changes the protocol profile its adapter is delivered (the profile of
  the first enabled provider bound to it) to another non-empty one: a profile is an adapter
  setting, which the node applies only at start. (Emptying it is no change: the node keeps the
  profile it has.)

A provider renamed (one id removed, another added on the same adapter) is a removal and an
addition: live, the old id's work finishing under the old id. Nothing here looks at nodes
added or removed (their own restart-required change) or providers under them.
"""

from __future__ import annotations

from iop.config.model import AdapterConfig, EdgeConfig, NodeConfig, ProviderConfig

__all__ = ["restart_reasons"]

_ADAPTER_SET = (
    "the node builds its adapters when it starts, and answers restart_required to an "
    "adapter-set change"
)


def restart_reasons(running: EdgeConfig, candidate: EdgeConfig) -> dict[tuple[str, str], str]:
    """
    ``(node id, provider id)`` → why adding (present in ``candidate``) or removing (present in
    ``running``) that provider on that node needs a restart, for every such provider that
    does; providers added or removed live are absent.
    """
    old_owner = {p.id: n.id for n in running.nodes for p in n.providers}
    new_owner = {p.id: n.id for n in candidate.nodes for p in n.providers}
    reasons: dict[tuple[str, str], str] = {}
    new_nodes = {n.id: n for n in candidate.nodes}
    for old in running.nodes:
        new = new_nodes.get(old.id)
        if new is None:
            continue
        before = {p.id: p for p in old.providers}
        after = {p.id: p for p in new.providers}
        added = [p for pid, p in after.items() if pid not in before]
        removed = [p for pid, p in before.items() if pid not in after]
        if not added and not removed:
            continue
        for p in added:
            if old_owner.get(p.id, old.id) != old.id:
                reasons[(old.id, p.id)] = (
                    f"moved from node {old_owner[p.id]}: leases and their counters are kept "
                    "per provider id, and its old work still runs there"
                )
            elif not _runs(old.adapters, p):
                reasons[(old.id, p.id)] = (
                    f"its adapter {_adapter_ref(p)!r} is new on node {old.id}: {_ADAPTER_SET}"
                )
        for p in removed:
            if new_owner.get(p.id, old.id) != old.id:
                reasons[(old.id, p.id)] = (
                    f"moved to node {new_owner[p.id]}: leases and their counters are kept "
                    "per provider id, and its old work still runs here"
                )
            elif not _runs(new.adapters, p):
                reasons[(old.id, p.id)] = (
                    f"its adapter {_adapter_ref(p)!r} leaves node {old.id} with it: {_ADAPTER_SET}"
                )
        for adapter in new.adapters:
            was, becomes = _profile(old, adapter.name), _profile(new, adapter.name)
            if not becomes or becomes == was:
                continue
            for p in (*added, *removed):
                if p.adapter_instance == adapter.name:
                    reasons.setdefault(
                        (old.id, p.id),
                        f"adapter {adapter.name!r} would be delivered protocol profile "
                        f"{becomes!r} instead of {was or 'none'!r}: a profile is an adapter "
                        "setting, applied when the node starts",
                    )
    return reasons


def _adapter_ref(p: ProviderConfig) -> str:
    return p.adapter_instance or p.adapter


def _runs(adapters: tuple[AdapterConfig, ...], p: ProviderConfig) -> bool:
    """Whether the node with ``adapters`` runs the adapter ``p`` is bound to. A disabled
    provider's reference is not resolved: its ``adapter`` may then name a type."""
    if p.adapter_instance:
        return any(a.name == p.adapter_instance for a in adapters)
    return any(p.adapter in (a.name, a.type) for a in adapters)


def _profile(node: NodeConfig, adapter: str) -> str:
    """The protocol profile ``adapter`` is delivered on ``node`` (``iop.edge.payload``)."""
    return next(
        (
            p.profile
            for p in node.providers
            if p.enabled and p.profile and p.adapter_instance == adapter
        ),
        "",
    )
