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
3. **admit** — per-key policy on the decoded call (:meth:`Pipeline.admit`): the key's model
   scope (403, whether or not the model exists); then, once the model's policy has shaped the
   call (below), the key's and its team's limits and budgets (:meth:`Pipeline.reserve`,
   :mod:`.limits` over :mod:`iop.edge.quota`): the call's worst case is reserved before it is
   placed (429 when a limit or budget says no, 503 when a cluster's counters cannot be asked)
   and settled with the reported usage — or released when the work never reached a provider —
   exactly once, in the one ``finally`` around placement and answer.
4. **place** — the catalog (404 for a model that does not exist), the codec's preparation with
   the model's policy (``max_tokens``; an answer given locally, such as a counted
   ``count_tokens``), every candidate provider able to serve the call (400 ``unsupported``
   before any provider is chosen: the pool picks by load, never by capability), the
   reservation (3), then the gateway's :class:`~iop.edge.placement.Placement`, made for the
   principal (:func:`~.relay.with_placement`: queued if need be, released exactly once).
5. **answer** — the codec, given the placement (:class:`~.relay.Work`), decides native or
   bridged from the provider's profile, opens a source (a tunnel or a run, :mod:`.sources`)
   and relays it through its encoder (:func:`~.relay.relay`).

The catalog routes (:meth:`Pipeline.models`) run authenticate, then admit for one model.
Which codec serves which path is the route table in :mod:`.app`, declared once.

Traces (``telemetry:``, :mod:`.trace`): a generation route's server span and its children. The
one check of whether the Edge traces is :meth:`Pipeline.generate`'s: off, the stages run as
they would without any tracing code (no span, no context, not even a coroutine frame more);
on, the server span starts before authenticate and is ended by the one ``finally`` around the
stages, however they end (an answer, an error, a refusal before the model is known, the client
gone).

The client keys, and their limits and budgets, are the running config's
(:meth:`Pipeline.use_config`, a refresh listener): a key added, disabled or rotated by a
refresh is honoured from the next request on.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from iop.config.model import ClientAPIConfig, ClientKey, EdgeConfig, ModelConfig, ProfileConfig
from iop.edge.ingress.auth import authenticate, authorize
from iop.edge.ingress.errors import ApiError, unsupported
from iop.edge.ingress.http import read_json, render_json
from iop.edge.ingress.limits import charge_of, demand_of, refusal, unavailable
from iop.edge.ingress.profiles import Unsupported
from iop.edge.ingress.relay import Exchange, Work, with_placement
from iop.edge.ingress.sources import Gateway
from iop.edge.ingress.trace import ADMIT, RequestTrace
from iop.edge.placement import Placement
from iop.edge.quota import QuotaGate, QuotaUnavailable, Refused, Reservation
from iop.telemetry.tracing import TRACING_OFF, Tracing

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
    # The output limit the request asked for (None: none; the model's policy applies).
    max_output_tokens: int | None = None
    # The surface's own decoded facts (say, Chat's requested limits, include_usage).
    facts: Mapping[str, Any] = field(default_factory=dict)


class Codec(Protocol):
    """One client protocol operation (Chat Completions, Responses, Messages, count_tokens)."""

    # Every candidate provider must exist (else 400): the Anthropic surface's rule.
    needs_candidates: bool
    # A key's limits and budgets apply (generation routes; not count_tokens).
    metered: bool

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

    def __init__(
        self,
        gateway: Gateway,
        config: ClientAPIConfig,
        clock: IReactorTime,
        gate: QuotaGate | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self._gateway = gateway
        self._tracing = tracing
        self._config = config
        # The client keys (auth), switched by a refresh; the listener's settings stay.
        self._keys = config
        self._gate = gate
        self._clock = clock

    def use_config(self, config: EdgeConfig) -> None:
        """A refresh applied: the next request authenticates against its client keys (and the
        gate, a listener of its own, counts against its limits and budgets)."""
        if config.client_api is not None:
            self._keys = config.client_api

    # -- the stages ----------------------------------------------------------------------------

    def authenticate(self, request: IRequest) -> ClientKey | None:
        return authenticate(request, self._keys)

    def decode(self, request: IRequest, codec: Codec) -> Call:
        return codec.decode(read_json(request, self._config.max_body_bytes))

    def admit(self, principal: ClientKey | None, model: str) -> None:
        """Per-key policy: the key's model scope (403)."""
        authorize(principal, model)

    async def reserve(
        self,
        exchange: Exchange,
        principal: ClientKey | None,
        call: Call,
        policy: ModelConfig | None,
    ) -> Reservation | None:
        """The key's limits and budgets: ``call``'s worst case reserved (:mod:`.limits`), or
        None when nothing is counted. A reservation the table grants after the client left is
        released at once (the pipeline that asked is gone)."""
        if self._gate is None or principal is None:
            return None
        demand = demand_of(call.prompt_tokens, call.max_output_tokens, policy)
        try:
            reservation = await _unless_abandoned(self._gate.reserve(principal, demand))
        except Refused as e:
            raise refusal(e, self._clock.seconds()) from None
        except QuotaUnavailable as e:
            raise unavailable(e) from None
        # A cluster slot that can no longer be vouched for: this request ends now.
        reservation.when_lost(exchange.abort)
        return reservation

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

    def generate(
        self, exchange: Exchange, codec: Codec, operation: str = "chat"
    ) -> Coroutine[Any, Any, bytes]:
        """A generation route (``operation``: the route's): authenticate → decode → admit →
        place → answer; traced when the Edge traces (the one check: module docstring)."""
        if self._tracing.tracer is None:
            return self._generate(exchange, codec, None)
        return self._traced(exchange, codec, operation)

    async def _traced(self, exchange: Exchange, codec: Codec, operation: str) -> bytes:
        """:meth:`_generate` inside its server span, which is ended here, once."""
        request = exchange.request
        trace = RequestTrace(self._tracing, request, operation, self._clock)
        exchange.trace = trace
        record = exchange.record
        if record is not None:
            record.traced(trace.trace_id, trace.log_ids().get("span_id", ""))
        status: int | None = None
        error_type: str | None = None
        description = ""
        try:
            body = await self._generate(exchange, codec, trace)
        except ApiError as e:
            status, error_type, description = e.status, e.code or str(e.status), e.message
            raise
        except (CancelledError, GeneratorExit):
            error_type = "cancelled"
            raise
        except BaseException as e:
            status, error_type = 500, type(e).__qualname__
            raise
        else:
            status = int(getattr(request, "code", 200) or 200)
            if status >= 400:
                # An answer in the provider's error status (a passthrough): an error all the same.
                error_type = str(status)
            return body
        finally:
            if exchange.gone and error_type is None:
                error_type = "cancelled"
            trace.end(status, error_type, description)

    async def _generate(
        self, exchange: Exchange, codec: Codec, trace: RequestTrace | None
    ) -> bytes:
        request = exchange.request
        principal = self.authenticate(request)
        record = exchange.record
        if record is not None and principal is not None:
            record.authenticated(principal.name, principal.team)
        if trace is not None and principal is not None:
            trace.authenticated(principal.name, principal.team)
        call = self.decode(request, codec)
        if trace is not None:
            trace.decoded(call.model, call.stream, call.body)
        if record is not None and call.model in self._gateway.model_ids():
            # Whatever refuses it from here on, the request counts under the model it named.
            record.model = call.model
        self.admit(principal, call.model)
        self.require(call.model)
        policy = self._gateway.model(call.model)
        call = codec.prepare(call, policy)
        local = codec.local(call, policy)
        if local is not None:
            return render_json(request, local)
        self.check_candidates(codec, call)
        gateway = self._gateway
        reservation: Reservation | None = None
        if codec.metered:
            if trace is None or self._gate is None or principal is None:
                reservation = await self.reserve(exchange, principal, call, policy)
            else:
                admitting = trace.child(ADMIT)
                try:
                    reservation = await self.reserve(exchange, principal, call, policy)
                except ApiError as e:
                    trace.end_child(admitting, e.code or str(e.status), e.message)
                    raise
                finally:
                    trace.end_child(admitting)
        works: list[Work] = []

        async def answer(placement: Placement) -> bytes:
            work = Work(gateway, exchange, placement)
            works.append(work)
            return await codec.answer(work, call)

        closing = False
        try:
            return await with_placement(
                gateway, exchange, call.model, call.prompt_tokens, answer, principal
            )
        except GeneratorExit:
            # Collected with everything it waited on (as with_placement's lease).
            closing = True
            raise
        finally:
            if not closing:
                # The work has ended (relay returns only then): what it used, priced once.
                usage = record.usage if record is not None else None
                charge = charge_of(usage, policy)
                if record is not None and charge is not None:
                    record.priced(charge.cost_micros)
                if reservation is not None:
                    dispatched = any(work.opened for work in works)
                    reservation.end(charge, dispatched=dispatched)

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


def _unless_abandoned(asked: Deferred[Reservation]) -> Deferred[Reservation]:
    """
    ``asked``'s result for the pipeline to await. Cancelling the returned Deferred (the client
    went away while the table was asked) does not cancel the table's call, whose reservation
    may already exist: when it comes it is released at once, so nothing is held for a request
    that is gone.
    """
    answer: Deferred[Reservation] = Deferred(lambda d: None)

    def arrived(result: Reservation | Failure) -> None:
        if answer.called:
            if isinstance(result, Reservation):
                result.release()
            return None
        if isinstance(result, Failure):
            answer.errback(result)
        else:
            answer.callback(result)
        return None

    asked.addBoth(arrived)
    return answer
