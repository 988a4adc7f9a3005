# -*- test-case-name: iop.test.edge.test_status -*-
"""
The status snapshot: the configured catalog joined with live state.

Configured nodes and providers never vanish from it. A node is ``connected`` only when
dispatch-ready; a pending or disconnected node's enabled providers show ``status=unavailable``,
``health=offline`` and zero capacity and counters; a disabled provider shows ``status=disabled``,
``health=disabled``, ``capacity=0`` wherever its node is.

``edge.mode`` is the security mode (``legacy`` / ``managed``); each node's ``identity`` is what
the registry recorded of its client certificate (:meth:`~iop.edge.registry.NodeRegistry.identity`):
workload names and the check's outcome, never key material; ``last_refusal`` is its last refused
registration since the Edge started (``{"code", "reason", "at_unix_ms"}``, the code one of the
registry's reject reasons, e.g. ``lease_support`` for a node that cannot verify managed leases),
or null; ``down_since_unix_ms`` is when a node that is not ready now lost its last ready
connection (null while it is ready, and for a node not ready once since the Edge started: the
Edge cannot know since when a node it never saw is down). A ready node that stops drains first
(:mod:`iop.node.drain`): its ``state`` is ``draining`` and ``draining_since_unix_ms`` says since
when (null otherwise); it stays ``connected`` and its providers show their work in flight
finishing. ``edge.draining`` is whether this Edge itself drains (it stops: its readiness route,
``GET /readyz``, answers 503), since ``edge.draining_since_unix_ms``.

``models`` are the client models of ``models[]``, each with its providers in the config's order,
each provider's ``status`` as in ``providers`` and the model's ``available``: whether one of
them can take a request now; ``routes`` are the direct routes (``openai.model_routes[]``), each
with the node it is pinned to (null: the single ready node) and ``available``: whether that node
is ready (unpinned: whether exactly one node is, as the route resolver requires). Together
they are every model a client may name.

A provider a config refresh removed while it held leases stays listed, after its node's
configured providers, until its last lease on this Edge has ended: ``status=removed``,
``health=draining``, ``capacity=0``, and ``in_flight``/``long_in_flight`` the leases still held
(the work an operator sees finishing), from the pool's :class:`RemovedProviders`. Dropped at
once instead, its running streams would vanish from ``/status``, the console and the
``iop_provider_*`` gauges while they still run on the node; the node's ``providers`` list
names only the configured ones.

In a cluster (``cluster:`` in edge.yaml) each provider's counters are this Edge's own leases
and waiters, and ``cluster`` is the view across Edges
(:meth:`~iop.edge.cluster.table.ClusterLeaseTable.view`): Redis reachable or not, every Edge's
waiters, the leases held per provider over every Edge.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from iop.config.model import EdgeConfig, ProviderConfig


class ILiveNodes(Protocol):
    def is_ready(self, node_id: str) -> bool: ...

    def state(self, node_id: str) -> str: ...

    def identity(self, node_id: str) -> dict[str, Any]: ...

    def last_refusal(self, node_id: str) -> dict[str, Any] | None: ...

    def down_since(self, node_id: str) -> float | None: ...

    # ``draining_since(node_id) -> float | None`` too, when it knows of drains (the registry).


class ProviderCounters(Protocol):
    """Live lease and queue occupancy; the provider pool provides it."""

    def counters(self, node_id: str, provider_id: str) -> dict[str, int]: ...


@runtime_checkable
class RemovedProviders(Protocol):
    """Providers removed by a refresh whose leases have not all ended; the pool provides it."""

    def removed(self, node_id: str) -> list[tuple[ProviderConfig, dict[str, int]]]: ...


_ZERO = {"in_flight": 0, "long_in_flight": 0, "queued": 0, "long_queued": 0}


class NoDispatchCounters:
    """Counters before dispatch exists: all zero."""

    def counters(self, node_id: str, provider_id: str) -> dict[str, int]:
        return dict(_ZERO)


def snapshot(
    config: EdgeConfig,
    nodes: ILiveNodes,
    counters: ProviderCounters | None = None,
    *,
    cluster: dict[str, Any] | None = None,
    draining: float | None = None,
) -> dict[str, Any]:
    """The snapshot (module docstring); ``draining``: since when this Edge drains, if it does."""
    live = counters or NoDispatchCounters()
    draining_of = getattr(nodes, "draining_since", None)
    node_entries: list[dict[str, Any]] = []
    provider_entries: list[dict[str, Any]] = []
    for node in config.nodes:
        ready = nodes.is_ready(node.id)
        down_since = nodes.down_since(node.id)
        draining_since = draining_of(node.id) if draining_of is not None else None
        node_entries.append(
            {
                "id": node.id,
                "alias": node.alias,
                "connected": ready,
                "state": nodes.state(node.id),
                "identity": nodes.identity(node.id),
                "last_refusal": nodes.last_refusal(node.id),
                "down_since_unix_ms": None if down_since is None else int(down_since * 1000),
                "draining_since_unix_ms": _ms(draining_since),
                "providers": [p.id for p in node.providers],
            }
        )
        for provider in node.providers:
            provider_entries.append(_provider_entry(node.id, provider, ready, live))
        if isinstance(live, RemovedProviders):
            for provider, held in live.removed(node.id):
                provider_entries.append(_removed_entry(node.id, provider, held))
    status: dict[str, Any] = {
        "edge": {
            "id": config.id,
            "mode": config.security.mode,
            "draining": draining is not None,
            "draining_since_unix_ms": _ms(draining),
        },
        "nodes": node_entries,
        "providers": provider_entries,
        "models": _models(config, provider_entries),
        "routes": _routes(config, nodes),
    }
    if cluster is not None:
        status["cluster"] = cluster
    return status


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _models(config: EdgeConfig, providers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    status = {p["id"]: p["status"] for p in providers}
    models: list[dict[str, Any]] = []
    for m in config.models:
        refs = [
            {
                "provider_id": ref.provider_id,
                "target": ref.target,
                "status": status.get(ref.provider_id, "unavailable"),
            }
            for ref in m.providers
        ]
        available = any(ref["status"] == "available" for ref in refs)
        models.append({"id": m.id, "available": available, "providers": refs})
    return models


def _routes(config: EdgeConfig, nodes: ILiveNodes) -> list[dict[str, Any]]:
    # An unpinned route runs on the single ready node (iop.edge.routes.RouteResolver).
    one_ready = sum(nodes.is_ready(n.id) for n in config.nodes) == 1
    return [
        {
            "model": r.model,
            "node_id": r.node_id,
            "adapter": r.adapter,
            "target": r.target,
            "available": nodes.is_ready(r.node_id) if r.node_id is not None else one_ready,
        }
        for r in config.model_routes
    ]


def _provider_entry(
    node_id: str, p: ProviderConfig, ready: bool, live: ProviderCounters
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": p.id,
        "node_id": node_id,
        "adapter": p.adapter_instance or p.adapter,
        "type": p.type,
        "category": p.category,
        "models": list(p.models),
        "enabled": p.enabled,
        "priority": p.priority,
    }
    if not p.enabled:
        entry.update(status="disabled", health="disabled", capacity=0, long_capacity=0, **_ZERO)
    elif not ready:
        entry.update(status="unavailable", health="offline", capacity=0, long_capacity=0, **_ZERO)
    else:
        entry.update(
            status="available",
            health="healthy",
            capacity=p.capacity,
            long_capacity=p.long_capacity,
            **live.counters(node_id, p.id),
        )
    return entry


def _removed_entry(node_id: str, p: ProviderConfig, held: dict[str, int]) -> dict[str, Any]:
    entry = _provider_entry(node_id, p, False, NoDispatchCounters())
    entry.update(status="removed", health="draining", capacity=0, long_capacity=0, **held)
    return entry
