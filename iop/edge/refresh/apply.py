# -*- test-case-name: iop.test.edge.refresh.test_apply -*-
"""
Apply a refreshed config's live changes to the running Edge: all of them together, or none.

:class:`LiveApplier` holds the running config (:attr:`LiveApplier.config`) and its generation
(:attr:`LiveApplier.generation`, 1 at start, +1 per apply) and switches the Edge parts that
read config at dispatch time: the provider pool (capacities, priorities, queue limits, enabled
toggles, ``models[]`` candidate lists, providers added and removed), the gateway (model map
and generation policy, providers, protocol profiles), the direct-route resolver, the credential
issuer (``credentials[]``: slots, secrets, revisions, enabled, the providers' slots; a binding
made before the switch no longer seals) and the node registry (a node registering afterwards
gets the new config in its ``RegisterResponse``).

:meth:`LiveApplier.apply` takes a candidate the classifier found all live
(:mod:`iop.edge.refresh.classify`) and, in this order:

1. re-checks the invariants a live switch relies on — the same nodes, the same adapters on each
   node (all settings but ``max_concurrency``, which the node resizes live), providers added
   or removed only on adapters the node runs (:mod:`iop.edge.refresh.catalog`), each kept
   provider with the same adapter instance, type and category — and raises ``ValueError``
   naming the difference, changing nothing;
2. prepares everything that can fail: the pool's new catalog, every node's new payload;
3. switches every part, each step only assignments; if one step raises anyway, the steps
   already taken are switched back and the exception propagates: the running config is as it
   was;
4. calls ``before_grants`` with the nodes whose payload changed: the refresh sends them the new
   payload here, so that on each node's connection the push comes before any work the new
   config lets through — a raised capacity's first extra grant reaches the node after the
   gate it needs was raised (messages on one connection are handled in order);
5. only then lets the pool re-evaluate its waiters, so every grant from here on — a waiter a
   raised capacity lets through, one moved to another candidate — sees the whole new config.
   Waiters whose model has no live candidate left end ``Unavailable`` at once.

Requests already placed finish on the lease and placement they hold; a lowered capacity drains
by releases (no grant until ``in_flight`` is below it), a removed provider's leases end as its
work does (the pool keeps it retiring until then, :mod:`iop.edge.pool`). It returns the ids of
the *ready* nodes whose ``NodeConfigPayload`` content changed (``config_revision`` aside), in
config order: the nodes a refresh must push the new payload to, and no other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from twisted.logger import Logger

from iop.config.model import AdapterConfig, EdgeConfig, NodeConfig
from iop.edge.credentials import CredentialIssuer
from iop.edge.gateway import EdgeGateway
from iop.edge.payload import build_node_payload
from iop.edge.pool import PoolPlan, ProviderPool
from iop.edge.refresh.catalog import restart_reasons
from iop.edge.registry import NodeRegistry, PayloadBuilder
from iop.edge.routes import RouteResolver
from iop.wire import runtime_pb2 as pb

__all__ = ["ConfigListener", "LiveApplier", "PayloadFactory", "check_live_invariants"]

# Builds a node's payload from a whole config (``iop.edge.payload.build_node_payload``).
PayloadFactory = Callable[[EdgeConfig, NodeConfig], pb.NodeConfigPayload]
# Told the new running config as part of the switch (and the old one if the switch is undone),
# e.g. the service whose ``config`` attribute the status snapshot reads.
ConfigListener = Callable[[EdgeConfig], None]


def check_live_invariants(running: EdgeConfig, candidate: EdgeConfig) -> None:
    """
    What a live switch needs to hold between ``running`` and ``candidate``: the same node ids;
    per node the same adapters (by name, all settings); providers added or removed only as
    :func:`~iop.edge.refresh.catalog.restart_reasons` allows (on an adapter the node runs, not
    moved between nodes, no adapter's profile changed); per provider kept the same adapter
    instance, type and category (what a lease carries to the node). Raises ``ValueError``
    naming the first difference.
    """
    old_nodes = {n.id: n for n in running.nodes}
    new_nodes = {n.id: n for n in candidate.nodes}
    if set(old_nodes) != set(new_nodes):
        added = sorted(set(new_nodes) - set(old_nodes))
        removed = sorted(set(old_nodes) - set(new_nodes))
        raise ValueError(f"nodes added {added} / removed {removed}: a restart is required")
    # A provider's own reason first: it names the provider an adapter change came with.
    for (node_id, pid), reason in restart_reasons(running, candidate).items():
        raise ValueError(
            f"node {node_id}: provider {pid} added or removed ({reason}): a restart is required"
        )
    for node_id, old in old_nodes.items():
        new = new_nodes[node_id]
        if _adapters(old.adapters) != _adapters(new.adapters):
            raise ValueError(
                f"node {node_id}: adapters changed: a restart is required (the node answers "
                "restart_required to an adapter change)"
            )
        old_providers = {p.id: p for p in old.providers}
        new_providers = {p.id: p for p in new.providers}
        for pid, p in old_providers.items():
            q = new_providers.get(pid)
            if q is None:
                continue
            for name in ("adapter_instance", "type", "category"):
                before, after = getattr(p, name), getattr(q, name)
                # A disabled provider's adapter is not resolved (its instance is empty): enabling
                # or disabling it is not a change of adapter.
                if before and after and before != after:
                    raise ValueError(
                        f"node {node_id}: provider {pid}: {name} changed: a restart is required"
                    )


def _adapters(adapters: Iterable[AdapterConfig]) -> dict[str, AdapterConfig]:
    # max_concurrency aside: the node resizes its gate live.
    return {a.name: replace(a, max_concurrency=None) for a in adapters}


def _listener_step(listener: ConfigListener, candidate: EdgeConfig, running: EdgeConfig) -> _Step:
    return _Step("listener", lambda: listener(candidate), lambda: listener(running))


@dataclass(frozen=True)
class _Step:
    """One part's switch and the switch back (both only assignments)."""

    name: str
    do: Callable[[], None]
    undo: Callable[[], None]


class LiveApplier:
    """
    The running config and the one way to replace it live (see the module docstring).

    :param config: the config the Edge parts were built with (the running config).
    :param pool: the provider pool.
    :param gateway: the gateway (its direct-route resolver is switched too unless ``routes``
        names another one).
    :param credentials: the managed-mode credential issuer, None in legacy mode.
    :param registry: the node registry; its payload builder is replaced by one over the new
        config.
    :param build_payload: how a node's payload is built from a config.
    :param generation: the running config's generation (default: the issuer's, else 1).
    :param listeners: told the new running config inside the switch (e.g. the service's
        ``config`` attribute, which ``/status`` reads); one that raises undoes the apply.
    """

    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        pool: ProviderPool,
        gateway: EdgeGateway,
        credentials: CredentialIssuer | None,
        registry: NodeRegistry,
        *,
        routes: RouteResolver | None = None,
        build_payload: PayloadFactory = build_node_payload,
        generation: int | None = None,
        listeners: Iterable[ConfigListener] = (),
    ) -> None:
        self._pool = pool
        self._gateway = gateway
        self._credentials = credentials
        self._registry = registry
        self._routes = routes if routes is not None else gateway.routes
        self._build_payload = build_payload
        self._listeners = list(listeners)
        if generation is None:
            generation = credentials.generation if credentials is not None else 1
        self.config = config
        self.generation = generation

    def add_listener(self, listener: ConfigListener) -> None:
        self._listeners.append(listener)

    def payload(self, node_id: str) -> pb.NodeConfigPayload:
        """
        Node ``node_id``'s payload under the running config, ``config_revision`` = the running
        generation (what a refresh pushes, and what a registering node gets after an apply).
        Raises ``KeyError`` for an unconfigured node.
        """
        node = self.config.node(node_id)
        if node is None:
            raise KeyError(f"unknown node {node_id!r}")
        return self._payload(self.config, node, self.generation)

    def apply(
        self, candidate: EdgeConfig, before_grants: Callable[[list[str]], object] | None = None
    ) -> list[str]:
        """
        Switch the Edge to ``candidate`` (every change live; see the module docstring). Returns
        the ready nodes whose payload content changed, and tells them ``before_grants`` first
        (after the switch, before the pool grants anything; what it raises is logged, the
        switch stands). A candidate equal to the running config changes nothing, not even the
        generation. Raises ``ValueError`` when the invariants do not hold, or whatever a part
        raised; either way nothing changed.
        """
        running, generation = self.config, self.generation + 1
        check_live_invariants(running, candidate)
        if candidate == running:
            # Nothing to switch: the generation stays, no binding goes stale, no node is told.
            return []
        plan = self._pool.plan(candidate)
        changed = self._changed_nodes(running, candidate)

        old_builder = self._registry.payload_builder
        old_issued = self._credentials.generation if self._credentials is not None else 0
        undo_pool: list[PoolPlan] = []

        def switch_pool() -> None:
            undo_pool.append(self._pool.switch(plan))

        def unswitch_pool() -> None:
            self._pool.switch(undo_pool.pop())

        steps = [
            _Step(
                "credentials",
                lambda: self._update_credentials(candidate, generation),
                lambda: self._update_credentials(running, old_issued),
            ),
            _Step(
                "gateway",
                lambda: self._gateway.use_config(candidate),
                lambda: self._gateway.use_config(running),
            ),
            _Step(
                "routes",
                lambda: self._routes.use_config(candidate),
                lambda: self._routes.use_config(running),
            ),
            _Step(
                "registry",
                lambda: self._registry.use_config(candidate, self._builder(candidate, generation)),
                lambda: self._registry.use_config(running, old_builder),
            ),
            *(_listener_step(listener, candidate, running) for listener in self._listeners),
            _Step("pool", switch_pool, unswitch_pool),
        ]
        done: list[_Step] = []
        try:
            for step in steps:
                step.do()
                done.append(step)
        except BaseException:
            self.log.failure("config apply failed: switching back to the running config")
            for step in reversed(done):
                try:
                    step.undo()
                except Exception:
                    self.log.failure("could not switch {part} back", part=step.name)
            raise
        self.config, self.generation = candidate, generation
        self.log.info(
            "config generation {generation} applied; payload changed for nodes {nodes}",
            generation=generation,
            nodes=changed,
        )
        if before_grants is not None:
            try:
                before_grants(changed)
            except Exception:
                self.log.failure("config apply: telling the nodes before the grants failed")
        # Only now may anybody be granted anything: every grant sees the whole new config.
        self._pool.pump()
        return changed

    # -- helpers -----------------------------------------------------------------------------

    def _payload(
        self, config: EdgeConfig, node: NodeConfig, generation: int
    ) -> pb.NodeConfigPayload:
        payload = self._build_payload(config, node)
        payload.config_revision = generation
        return payload

    def _changed_nodes(self, running: EdgeConfig, candidate: EdgeConfig) -> list[str]:
        """Ready nodes whose payload content differs between the two configs."""
        changed: list[str] = []
        for node in candidate.nodes:
            if not self._registry.is_ready(node.id):
                continue
            old_node = running.node(node.id)
            assert old_node is not None  # the invariants hold
            old = self._build_payload(running, old_node)
            new = self._build_payload(candidate, node)
            old.config_revision = new.config_revision = 0
            if old != new:
                changed.append(node.id)
        return changed

    def _builder(self, config: EdgeConfig, generation: int) -> PayloadBuilder:
        return lambda node: self._payload(config, node, generation)

    def _update_credentials(self, config: EdgeConfig, generation: int) -> None:
        if self._credentials is not None:
            self._credentials.update(config, generation)
