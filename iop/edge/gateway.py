# -*- test-case-name: iop.test.edge.test_gateway -*-
"""
The Edge service the client surfaces call: model id → a placement → a run or a tunnel.

``place(model)`` resolves the model: a ``models[]`` key goes through the provider pool (a
capacity lease, queueing when every candidate is busy); an ``openai.model_routes[]`` id goes
straight to its adapter on its node (or the single ready node). The result,
:class:`~iop.edge.placement.Placement` (frozen, built once with the principal it was placed
for), keeps Edge-locally what was really chosen — provider id, served target, node id, usage
attribution — and which wire the provider needs: OpenAI-compatible providers
(``openai_compat``, ``vllm``) take the raw provider tunnel, everything else a normalized
``RunRequest``. The choice comes from the selected provider, never from the client.

The gateway never releases a lease: whoever placed the request releases it once, when it is
done with it (:func:`iop.edge.ingress.relay.with_placement`; :meth:`Placement.release` is
idempotent). Nor does it note how the work ended: :meth:`EdgeGateway.run` and
:meth:`EdgeGateway.tunnel` return the handle, and whoever consumes it (the client surfaces'
sources, :mod:`iop.edge.ingress.sources`) reports the outcome and usage to the request's record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, succeed

from iop.config.model import EdgeConfig, ModelConfig, ProfileConfig, ProviderConfig
from iop.edge.credentials import CredentialIssuer
from iop.edge.errors import UnknownModel
from iop.edge.placement import Placement
from iop.edge.pool import Lease, ProviderPool
from iop.edge.routes import RouteResolver
from iop.edge.runs import RunDispatcher, RunHandle
from iop.edge.tunnel import TunnelDispatcher, TunnelStream


class EdgeGateway:
    def __init__(
        self,
        config: EdgeConfig,
        pool: ProviderPool,
        runs: RunDispatcher,
        tunnels: TunnelDispatcher,
        credentials: CredentialIssuer | None = None,
    ) -> None:
        self._credentials = credentials
        self._pool = pool
        self._runs = runs
        self._tunnels = tunnels
        self._resolver = runs.routes
        self.use_config(config)

    def use_config(self, config: EdgeConfig) -> None:
        """
        Take ``config``'s model map, providers and protocol profiles (config refresh): the next
        placement sees them. A request already admitted keeps the generation policy it was
        admitted with (the surfaces shaped its body by it), also while it waits in the pool.
        Only assignments: it cannot fail half-way.
        """
        models = {m.id: m for m in config.models}
        providers: dict[str, tuple[str, ProviderConfig]] = {
            p.id: (n.id, p) for n in config.nodes for p in n.providers
        }
        profiles = {p.name: p for p in config.protocol_profiles}
        self._config = config
        self._models, self._providers, self._profiles = models, providers, profiles

    @property
    def config(self) -> EdgeConfig:
        """The config the gateway places by."""
        return self._config

    @property
    def routes(self) -> RouteResolver:
        """The direct-route resolver placements go through (the run dispatcher's)."""
        return self._resolver

    # -- catalog -----------------------------------------------------------------------------

    def model_ids(self) -> list[str]:
        """Every model a client may name: ``models[]`` keys, then direct routes."""
        return [m.id for m in self._config.models] + [r.model for r in self._config.model_routes]

    def model(self, model_id: str) -> ModelConfig | None:
        return self._models.get(model_id)

    def candidate_profiles(self, model_id: str) -> list[ProfileConfig | None]:
        """The protocol profiles of a model's configured providers (for capability checks)."""
        model = self._models.get(model_id)
        if model is not None:
            return [
                self._profiles.get(self._providers[ref.provider_id][1].profile)
                for ref in model.providers
                if ref.provider_id in self._providers
            ]
        route = self._resolver.route(model_id)
        if route is not None:
            provider = self._resolver.route_provider(route.node_id, route.adapter, route.target)
            return [self._profiles.get(provider[1].profile) if provider else None]
        return []

    # -- placement ---------------------------------------------------------------------------

    def place(
        self, model_id: str, *, prompt_tokens: int = 0, principal: str = ""
    ) -> Deferred[Placement]:
        """
        Choose where ``model_id`` runs, for ``principal`` (the client key's name; "" with auth
        off or for the admin API). Fails with the pool's errors (``UnknownModel``,
        ``Unavailable``, ``Overloaded``, ``QueueTimeout``) or the dispatcher's (``NoRoute``,
        ``NodeUnavailable``). Cancelling the Deferred while queued withdraws the request.
        """
        if model_id in self._models:
            policy = self._models[model_id]
            return self._pool.acquire(model_id, prompt_tokens=prompt_tokens).addCallback(
                self._from_lease, policy, principal
            )
        route = self._resolver.route(model_id)
        if route is None:
            raise UnknownModel(model_id)
        node_id = self._resolver.choose_node(route.node_id)
        adapter = self._resolver.adapter(node_id, route.adapter)
        provider = self._resolver.route_provider(node_id, route.adapter, route.target)
        return succeed(
            Placement(
                model=model_id,
                node_id=node_id,
                adapter=adapter.name if adapter else route.adapter,
                target=route.target,
                provider_type=adapter.type if adapter else "",
                provider_id=provider[1].id if provider else None,
                profile=self._profiles.get(provider[1].profile) if provider else None,
                usage_attribution=provider[1].usage_attribution if provider else "",
                principal=principal,
            )
        )

    def _from_lease(self, lease: Lease, policy: ModelConfig, principal: str) -> Placement:
        _, provider = self._providers[lease.provider_id]
        return Placement(
            model=policy.id,
            node_id=lease.node_id,
            adapter=lease.adapter,
            target=lease.target,
            provider_type=lease.provider_type,
            provider_id=lease.provider_id,
            profile=self._profiles.get(provider.profile),
            usage_attribution=lease.usage_attribution,
            policy=policy,
            lease=lease,
            principal=principal,
        )

    # -- execution ---------------------------------------------------------------------------

    def run(self, placement: Placement, *, input: str, **options: Any) -> RunHandle:
        """Send a normalized run for ``placement``."""
        return self._runs.submit_run(
            adapter=placement.adapter,
            target=placement.target,
            input=input,
            node_id=placement.node_id,
            **options,
        )

    def tunnel(
        self,
        placement: Placement,
        *,
        operation: str,
        body: bytes,
        stream: bool,
        headers: Iterable[tuple[str, str]] = (),
        method: str = "POST",
        timeout_sec: int = 0,
        metadata: Mapping[str, str] | None = None,
    ) -> TunnelStream:
        """
        Open the raw provider tunnel for ``placement``. In managed mode
        the request carries a credential lease: bound (and validated) here, sealed (validated
        again) by the dispatcher immediately before it sends; :class:`CredentialRefused` when
        the binding does not hold — never a fallback to another provider.
        """
        issuer = self._credentials
        seal = issuer.sealer(placement) if issuer is not None else None
        return self._tunnels.open(
            placement.node_id,
            adapter=placement.adapter,
            target=placement.target,
            operation=operation,
            method=method,
            headers=headers,
            body=body,
            stream=stream,
            timeout_sec=timeout_sec,
            profile=placement.profile.name if placement.profile else "",
            seal=seal,
            metadata=metadata,
        )


__all__ = ["EdgeGateway", "Placement"]
