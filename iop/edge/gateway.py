# -*- test-case-name: iop.test.edge.test_gateway -*-
"""
The Edge service the client surfaces call: model id → a dispatch decision → a run or a tunnel.

``dispatch(model)`` resolves the model: a ``models[]`` key goes through the provider pool (a
capacity lease, queueing when every candidate is busy); an ``openai.model_routes[]`` id goes
straight to its adapter on its node (or the single ready node). The result, :class:`Dispatch`,
keeps Edge-locally what was really chosen — provider id, served target, node id, usage
attribution — and which wire the provider needs: OpenAI-compatible providers (``openai_compat``,
``vllm``) take the raw provider tunnel, everything else a normalized ``RunRequest``. The choice
comes from the selected provider, never from the client.

Whatever path a request ends by (terminal event, tunnel end, send failure, node gone, client
gone), the lease is released exactly once: the run/tunnel helpers here attach the release to the
request's end, and :meth:`Dispatch.release` is idempotent for callers that stop earlier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.config.model import EdgeConfig, ModelConfig, ProfileConfig, ProviderConfig
from iop.edge.errors import NoRoute as NoRoute  # transitional re-export
from iop.edge.pool import Lease, ProviderPool, UnknownModel
from iop.edge.runs import RunDispatcher, RunHandle
from iop.edge.tunnel import TunnelDispatcher, TunnelOutcome, TunnelStream
from iop.runtime.events import RuntimeEvent, Usage

TUNNEL_TYPES = frozenset({"openai_compat", "vllm"})


@dataclass
class Dispatch:
    """What the Edge chose for one request. Edge-local: none of it goes on the wire as such."""

    model: str
    node_id: str
    adapter: str
    target: str
    provider_type: str
    provider_id: str | None = None
    profile: ProfileConfig | None = None
    usage_attribution: str = ""
    policy: ModelConfig | None = None
    lease: Lease | None = field(default=None, repr=False)

    @property
    def wire(self) -> str:
        """``tunnel`` for OpenAI-compatible providers, ``run`` for the rest."""
        return "tunnel" if self.provider_type in TUNNEL_TYPES else "run"

    def release(self) -> None:
        """Give back the capacity lease (idempotent; nothing for direct routes)."""
        if self.lease is not None:
            self.lease.release()

    def attribution(self) -> dict[str, str]:
        return {
            "model": self.model,
            "provider_id": self.provider_id or "",
            "node_id": self.node_id,
            "target": self.target,
            "usage_attribution": self.usage_attribution,
        }


class EdgeGateway:
    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        pool: ProviderPool,
        runs: RunDispatcher,
        tunnels: TunnelDispatcher,
        onFinished: Callable[[Dispatch, Usage | None, str], None] | None = None,
    ) -> None:
        self._config = config
        self._pool = pool
        self._runs = runs
        self._tunnels = tunnels
        self._onFinished = onFinished
        self._models = {m.id: m for m in config.models}
        self._resolver = runs.routes
        self._providers: dict[str, tuple[str, ProviderConfig]] = {
            p.id: (n.id, p) for n in config.nodes for p in n.providers
        }
        self._profiles = {p.name: p for p in config.protocol_profiles}

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

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, model_id: str, *, prompt_tokens: int = 0) -> Deferred[Dispatch]:
        """
        Choose where ``model_id`` runs. Fails with the pool's errors (``UnknownModel``,
        ``Unavailable``, ``Overloaded``, ``QueueTimeout``) or the dispatcher's (``NoRoute``,
        ``NodeUnavailable``). Cancelling the Deferred while queued withdraws the request.
        """
        if model_id in self._models:
            policy = self._models[model_id]
            return self._pool.acquire(model_id, prompt_tokens=prompt_tokens).addCallback(
                self._fromLease, policy
            )
        route = self._resolver.route(model_id)
        if route is None:
            raise UnknownModel(f"model {model_id!r} does not exist")
        node_id = self._resolver.choose_node(route.node_id)
        adapter = self._resolver.adapter(node_id, route.adapter)
        provider = self._resolver.route_provider(node_id, route.adapter, route.target)
        return succeed(
            Dispatch(
                model=model_id,
                node_id=node_id,
                adapter=adapter.name if adapter else route.adapter,
                target=route.target,
                provider_type=adapter.type if adapter else "",
                provider_id=provider[1].id if provider else None,
                profile=self._profiles.get(provider[1].profile) if provider else None,
                usage_attribution=provider[1].usage_attribution if provider else "",
            )
        )

    def _fromLease(self, lease: Lease, policy: ModelConfig) -> Dispatch:
        _, provider = self._providers[lease.provider_id]
        return Dispatch(
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
        )

    # -- execution ---------------------------------------------------------------------------

    def run(self, dispatch: Dispatch, *, input: str, **options: Any) -> RunHandle:
        """Send a normalized run for ``dispatch``; its end releases the lease."""
        try:
            handle = self._runs.submit_run(
                adapter=dispatch.adapter,
                target=dispatch.target,
                input=input,
                node_id=dispatch.node_id,
                **options,
            )
        except Exception:
            dispatch.release()
            raise

        def finished(terminal: RuntimeEvent) -> RuntimeEvent:
            self._finished(dispatch, terminal.usage, terminal.type.value)
            return terminal

        handle.whenDone().addCallback(finished)
        return handle

    def tunnel(
        self,
        dispatch: Dispatch,
        *,
        operation: str,
        body: bytes,
        stream: bool,
        headers: Iterable[tuple[str, str]] = (),
        method: str = "POST",
        timeout_sec: int = 0,
    ) -> TunnelStream:
        """Open the raw provider tunnel for ``dispatch``; its end releases the lease."""
        try:
            tunnel = self._tunnels.open(
                dispatch.node_id,
                adapter=dispatch.adapter,
                target=dispatch.target,
                operation=operation,
                method=method,
                headers=headers,
                body=body,
                stream=stream,
                timeout_sec=timeout_sec,
                profile=dispatch.profile.name if dispatch.profile else "",
            )
        except Exception:
            dispatch.release()
            raise

        def finished(outcome: TunnelOutcome) -> TunnelOutcome:
            self._finished(dispatch, outcome.usage, "complete" if outcome.ok else "error")
            return outcome

        def failed(failure: Failure) -> Failure:
            self._finished(dispatch, None, "error")
            return failure

        tunnel.whenDone().addCallbacks(finished, failed)
        return tunnel

    def _finished(self, dispatch: Dispatch, usage: Usage | None, outcome: str) -> None:
        """Release the lease and report usage with its attribution (log + observer)."""
        dispatch.release()
        self.log.info(
            "request finished: {model} on {provider_id}@{node_id} ({outcome})",
            outcome=outcome,
            usage=usage.as_dict() if usage else None,
            **dispatch.attribution(),
        )
        if self._onFinished is not None:
            self._onFinished(dispatch, usage, outcome)


__all__ = ["TUNNEL_TYPES", "Dispatch", "EdgeGateway", "NoRoute"]
