# -*- test-case-name: iop.test.edge.ingress.test_app -*-
"""
The client API's one pipeline: every route runs the same named stages, in one place.

Generation routes (:meth:`Pipeline.generate`)::

    authenticate → decode → admit → place → answer

1. **authenticate** — the client key the request presents (:func:`~.auth.authenticate`: 401),
   once per request, here and nowhere else.
2. **decode** — the body read (:func:`~.http.read_json`: 400/413) and decoded by the route's
   codec into one :class:`Call`: the model, whether it streams, whether it has tools, the body
   as checked (:mod:`.validate`), the surface's own facts. 400 naming the param.
3. **admit** — per-key policy on the decoded call (:meth:`Pipeline.admit`). Today: the key's
   model scope (403, whether or not the model exists). Per-key limits and budgets go here.
4. **place** — the catalog (404 for a model that does not exist), the codec's preparation with
   the model's policy (``max_tokens``; an answer given locally, such as a counted
   ``count_tokens``), every candidate provider able to serve the call (400 ``unsupported``
   before any provider is chosen: the pool picks by load, never by capability), then the
   gateway's :class:`~iop.edge.placement.Placement`, made for the principal
   (:func:`~.relay.with_placement`: queued if need be, released exactly once).
5. **answer** — the codec, given the placement (:class:`~.relay.Work`), decides native or
   bridged from the provider's profile, opens a source (a tunnel or a run, :mod:`.sources`)
   and relays it through its encoder (:func:`~.relay.relay`).

The catalog routes (:meth:`Pipeline.models`) run authenticate, then admit for one model.
Which codec serves which path is the route table in :mod:`.app`, declared once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.web.iweb import IRequest

from iop.config.model import ClientAPIConfig, ClientKey, ModelConfig, ProfileConfig
from iop.edge.ingress.auth import authenticate, authorize
from iop.edge.ingress.errors import ApiError, unsupported
from iop.edge.ingress.http import read_json, render_json
from iop.edge.ingress.profiles import Unsupported
from iop.edge.ingress.relay import Exchange, Work, with_placement
from iop.edge.ingress.sources import Gateway
from iop.edge.placement import Placement

__all__ = ["Call", "Catalog", "Codec", "Pipeline"]


@dataclass(frozen=True)
class Call:
    """One generation request, decoded: what every stage after decode reads."""

    model: str
    # The body as the client sent it, checked (prepare may replace it: the output-limit policy).
    body: dict[str, Any]
    stream: bool = False
    tools: bool = False
    # The prompt's estimated size, for the pool's routing by prompt length.
    prompt_tokens: int = 0
    # The surface's own decoded facts (say, Chat's requested limits, include_usage).
    facts: Mapping[str, Any] = field(default_factory=dict)


class Codec(Protocol):
    """One client protocol operation (Chat Completions, Responses, Messages, count_tokens)."""

    # Every candidate provider must exist (else 400): the Anthropic surface's rule.
    needs_candidates: bool

    def decode(self, body: dict[str, Any]) -> Call:
        """The body as a :class:`Call`; 400 (:class:`ApiError`) naming what is wrong."""

    def prepare(self, call: Call, policy: ModelConfig | None) -> Call:
        """The call under its model's policy (the model exists)."""

    def local(self, call: Call, policy: ModelConfig | None) -> Any | None:
        """A JSON answer given without a provider, or None."""

    def serves(self, profile: ProfileConfig | None, call: Call) -> object:
        """Whether a provider with ``profile`` can serve ``call``; raises :class:`Unsupported`."""

    async def answer(self, work: Work, call: Call) -> bytes:
        """Serve ``call`` on its placement: native or bridged, a source, its encoder."""


class Catalog(Protocol):
    """The models routes' shape for one surface."""

    def listing(self, ids: list[str]) -> Any: ...

    def entry(self, model_id: str) -> Any: ...


class Pipeline:
    """Runs the stages (module docstring) for every client API route."""

    def __init__(self, gateway: Gateway, config: ClientAPIConfig) -> None:
        self._gateway = gateway
        self._config = config

    # -- the stages ----------------------------------------------------------------------------

    def authenticate(self, request: IRequest) -> ClientKey | None:
        return authenticate(request, self._config)

    def decode(self, request: IRequest, codec: Codec) -> Call:
        return codec.decode(read_json(request, self._config.max_body_bytes))

    def admit(self, principal: ClientKey | None, model: str) -> None:
        """Per-key policy: the key's model scope (403)."""
        authorize(principal, model)

    def require(self, model: str) -> None:
        if model not in self._gateway.model_ids():
            raise ApiError(404, f"model {model!r} does not exist", code="model_not_found")

    def check_candidates(self, codec: Codec, call: Call) -> None:
        profiles = self._gateway.candidate_profiles(call.model)
        if not profiles and codec.needs_candidates:
            raise unsupported(f"model {call.model!r} has no provider that can serve this request")
        for profile in profiles:
            try:
                codec.serves(profile, call)
            except Unsupported as e:
                raise unsupported(e.message) from None

    # -- the routes ------------------------------------------------------------------------------

    async def generate(self, exchange: Exchange, codec: Codec) -> bytes:
        """A generation route: authenticate → decode → admit → place → answer."""
        request = exchange.request
        principal = self.authenticate(request)
        call = self.decode(request, codec)
        self.admit(principal, call.model)
        self.require(call.model)
        policy = self._gateway.model(call.model)
        call = codec.prepare(call, policy)
        local = codec.local(call, policy)
        if local is not None:
            return render_json(request, local)
        self.check_candidates(codec, call)
        gateway = self._gateway

        async def answer(placement: Placement) -> bytes:
            return await codec.answer(Work(gateway, exchange, placement), call)

        return await with_placement(
            gateway, exchange, call.model, call.prompt_tokens, answer, principal
        )

    async def models(self, exchange: Exchange, catalog: Catalog, model_id: str | None) -> bytes:
        """The catalog (``model_id`` None) or one model, as the caller's key sees it."""
        request = exchange.request
        principal = self.authenticate(request)
        if model_id is None:
            ids = [m for m in self._gateway.model_ids() if principal is None or principal.allows(m)]
            return render_json(request, catalog.listing(ids))
        self.admit(principal, model_id)
        self.require(model_id)
        return render_json(request, catalog.entry(model_id))
