# -*- test-case-name: iop.test.edge.test_runs,iop.test.edge.test_gateway -*-
"""
Direct routes: ``openai.model_routes[]`` resolved to a route, a node and an adapter, in one place.

A route names an adapter (by instance name or, when unique on the node, by type), a target and
optionally a node; without a node it goes to the single dispatch-ready node. The provider pool's
``models[]`` are not resolved here.
"""

from __future__ import annotations

from iop.config.model import AdapterConfig, EdgeConfig, ModelRoute, ProviderConfig
from iop.edge.errors import NodeUnavailable, NoRoute
from iop.edge.registry import NodeRegistry
from iop.runtime.kinds import LEASED_KINDS


class RouteResolver:
    """``model_routes[]`` and node choice over the registry's ready nodes."""

    def __init__(self, config: EdgeConfig, registry: NodeRegistry) -> None:
        self._registry = registry
        self.use_config(config)

    def use_config(self, config: EdgeConfig) -> None:
        """Resolve by ``config`` from now on (config refresh); only assignments."""
        routes = {r.model: r for r in config.model_routes}
        providers: dict[str, tuple[str, ProviderConfig]] = {
            p.id: (n.id, p) for n in config.nodes for p in n.providers
        }
        self._config = config
        self._routes, self._providers = routes, providers

    @property
    def config(self) -> EdgeConfig:
        """The config routes are resolved by."""
        return self._config

    def leased_only(self, node_id: str, ref: str) -> AdapterConfig | None:
        """
        Managed mode: the adapter ``ref`` may name on ``node_id`` (by instance name or type,
        enabled or not) that is reached only through a leased tunnel, or None (legacy mode, or
        no such adapter).
        """
        if not self._config.security.managed:
            return None
        node = self._config.node(node_id)
        adapters = node.adapters if node is not None else ()
        return next(
            (a for a in adapters if ref in (a.name, a.type) and a.type in LEASED_KINDS), None
        )

    def route(self, model: str) -> ModelRoute | None:
        """The direct route named ``model``, or None."""
        return self._routes.get(model)

    def resolve_model(self, model: str) -> ModelRoute:
        """The direct route named ``model``; raises :class:`NoRoute`."""
        route = self._routes.get(model)
        if route is None:
            raise NoRoute(f"unknown model {model!r}")
        return route

    def choose_node(self, node_id: str | None) -> str:
        """
        ``node_id`` when it is configured and ready; without one, the single ready node. Raises
        :class:`NoRoute` or :class:`NodeUnavailable`.
        """
        if node_id:
            if self._config.node(node_id) is None:
                raise NoRoute(f"unknown node {node_id!r}")
            if not self._registry.is_ready(node_id):
                raise NodeUnavailable(f"node {node_id!r} is not connected")
            return node_id
        ready = [n.id for n in self._config.nodes if self._registry.is_ready(n.id)]
        if len(ready) == 1:
            return ready[0]
        if not ready:
            raise NodeUnavailable("no node is connected")
        raise NoRoute(f"no node named and {len(ready)} nodes are connected; name one")

    def adapter(self, node_id: str, ref: str) -> AdapterConfig | None:
        """The enabled adapter ``ref`` names on ``node_id``: by name, else by a unique type."""
        node = self._config.node(node_id)
        if node is None:
            return None
        enabled = [a for a in node.adapters if a.enabled]
        exact = [a for a in enabled if a.name == ref]
        if exact:
            return exact[0]
        typed = [a for a in enabled if a.type == ref]
        return typed[0] if len(typed) == 1 else None

    def route_provider(
        self, node_id: str | None, adapter_ref: str, target: str
    ) -> tuple[str, ProviderConfig] | None:
        """The configured provider (with its node id) a direct route lands on, if one matches."""
        for nid, provider in self._providers.values():
            if node_id is not None and nid != node_id:
                continue
            adapter = self.adapter(nid, adapter_ref)
            if adapter is None or provider.adapter_instance != adapter.name:
                continue
            if target in provider.models:
                return nid, provider
        return None


__all__ = ["RouteResolver"]
