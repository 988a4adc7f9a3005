"""
The client pipeline's admit stage over a key's limits and budgets (:mod:`iop.edge.ingress.limits`
over :mod:`iop.edge.quota`): refusals as each surface's clients read them, the reservation
settled with the reported usage or released, exactly once, and the running config's keys.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from twisted.internet.defer import Deferred, fail

from iop.config.model import Budget, ClientKey, EdgeConfig, Limits, NodeToken, Price
from iop.edge.ingress.limits import FALLBACK_OUTPUT_TOKENS, charge_of, demand_of
from iop.edge.quota import (
    Demand,
    InProcessQuotaTable,
    QuotaGate,
    QuotaUnavailable,
    Reservation,
    SubjectLimits,
)
from iop.runtime.events import RuntimeEvent, Usage
from iop.test.edge.ingress.harness import (
    CHAT,
    END,
    MESSAGES,
    IngressCase,
    body,
    model,
    start,
    usage,
)

COMPLETION = b'{"id":"x","object":"chat.completion","model":"chat-target","choices":[]}'


def with_key(config: EdgeConfig, **changes: Any) -> EdgeConfig:
    """``config`` with the ``all`` key changed."""
    api = config.client_api
    keys = tuple(dataclasses.replace(k, **changes) if k.name == "all" else k for k in api.keys)
    return dataclasses.replace(config, client_api=dataclasses.replace(api, keys=keys))


class WorstCaseTests(IngressCase):
    def test_demand_is_prompt_plus_the_limit_under_policy(self) -> None:
        policy = model("m", "p", "t", default_max_tokens=256, min_max_tokens=16)
        self.assertEqual(demand_of(10, None, policy), Demand(266, None))
        self.assertEqual(demand_of(10, 8, policy), Demand(26, None))
        self.assertEqual(demand_of(10, 1000, policy), Demand(1010, None))

    def test_no_limit_anywhere_reserves_the_fallback(self) -> None:
        self.assertEqual(demand_of(5, None, None), Demand(5 + FALLBACK_OUTPUT_TOKENS, None))

    def test_charge_is_reported_input_plus_output(self) -> None:
        self.assertIsNone(charge_of(None, None))
        charge = charge_of(Usage(3, 4), None)
        assert charge is not None
        self.assertEqual((charge.tokens, charge.cost_micros), (7, None))

    def test_charge_and_worst_case_at_the_model_price(self) -> None:
        # 3 / 15 per million, cached reads 0.3, cache writes 3.75 (micro-units per million).
        price = Price(3_000_000, 15_000_000, 300_000, 3_750_000, 15_000_000)
        policy = dataclasses.replace(model("m", "p", "t", default_max_tokens=100), price=price)
        usage = Usage(1000, 100, cached_input_tokens=800)
        charge = charge_of(usage, policy)
        assert charge is not None
        # Per million: 200 uncached * 3 + 800 cached * 0.3 + 100 out * 15 = 2340 micro-units.
        self.assertEqual((charge.tokens, charge.cost_micros), (1100, 2340))
        worst = demand_of(1000, None, policy)
        # Every prompt token at the dearest input price (3.75), every output token at 15.
        self.assertEqual(worst, Demand(1100, 3750 + 1500))


class AdmitTests(IngressCase):
    def use(self, config: EdgeConfig) -> None:
        self.edge.gate.use_config(config)
        self.edge.app.pipeline.use_config(config)

    def limit(self, **changes: Any) -> None:
        self.use(with_key(self.edge.config, **changes))

    def chat_ok(self) -> None:
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(COMPLETION), usage(3, 4), END)
        code, _, _ = self.answer(d)
        self.assertEqual(code, 200)

    def snapshot(self) -> Any:
        key = next(k for k in self.edge.gate._config.keys if k.name == "all")
        [own] = self.successResultOf(self.edge.gate.snapshot(key))
        return own

    def test_requests_per_minute_on_the_openai_surface(self) -> None:
        self.limit(limits=Limits(requests_per_minute=2))
        self.chat_ok()
        self.chat_ok()
        d = self.edge.post("/v1/chat/completions", CHAT)
        code, headers, data = self.answer(d)
        self.assertEqual(code, 429)
        error = json.loads(data)["error"]
        self.assertEqual(
            (error["type"], error["code"]), ("rate_limit_error", "rate_limit_exceeded")
        )
        self.assertIn("2 requests per minute", error["message"])
        self.assertEqual(headers.getRawHeaders("x-ratelimit-limit-requests"), ["2"])
        self.assertEqual(headers.getRawHeaders("x-ratelimit-remaining-requests"), ["0"])
        self.assertEqual(headers.getRawHeaders("x-ratelimit-reset-requests"), ["60s"])
        self.assertEqual(headers.getRawHeaders("retry-after"), ["60"])
        self.assertIsNone(headers.getRawHeaders("x-should-retry"))
        self.assertIsNone(headers.getRawHeaders("anthropic-ratelimit-requests-limit"))
        # Nothing reached the node for the refused one; a minute later it is admitted.
        self.assertEqual(len(self.edge.requests("provider_tunnel_request")), 2)
        self.edge.clock.advance(60)
        self.chat_ok()

    def test_requests_per_minute_on_the_anthropic_surface(self) -> None:
        self.limit(limits=Limits(requests_per_minute=1))
        ask = {**MESSAGES, "model": "llama"}
        d = self.edge.post("/v1/messages", ask)
        self.edge.flush()
        run = self.edge.run_request()
        self.edge.events(run.run_id, *self.run_events())
        self.assertEqual(self.answer(d)[0], 200)
        code, headers, data = self.answer(self.edge.post("/v1/messages", ask))
        self.assertEqual(code, 429)
        self.assertEqual(json.loads(data)["error"]["type"], "rate_limit_error")
        self.assertEqual(headers.getRawHeaders("anthropic-ratelimit-requests-limit"), ["1"])
        self.assertEqual(headers.getRawHeaders("anthropic-ratelimit-requests-remaining"), ["0"])
        [reset] = headers.getRawHeaders("anthropic-ratelimit-requests-reset")
        self.assertRegex(reset, r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")
        self.assertIsNone(headers.getRawHeaders("x-ratelimit-limit-requests"))

    def run_events(self) -> list[Any]:
        return [RuntimeEvent.start(), RuntimeEvent.text("hi"), RuntimeEvent.complete(Usage(2, 1))]

    def test_a_spent_budget_is_insufficient_quota_and_not_worth_a_retry(self) -> None:
        self.limit(budgets=(Budget("total", tokens=1000),))
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        # The provider used more than the worst case: all of it is charged.
        self.edge.frames(sent.run_id, start(), body(COMPLETION), usage(600, 500), END)
        self.assertEqual(self.answer(d)[0], 200)
        self.assertEqual(self.snapshot().budgets[0].tokens, 1100)
        code, headers, data = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 429)
        error = json.loads(data)["error"]
        self.assertEqual(
            (error["type"], error["code"]), ("insufficient_quota", "insufficient_quota")
        )
        self.assertIn("budget", error["message"])
        self.assertEqual(headers.getRawHeaders("x-should-retry"), ["false"])
        self.assertIsNone(headers.getRawHeaders("retry-after"))

    def test_concurrency_slot_comes_back_when_the_work_ends(self) -> None:
        self.limit(limits=Limits(concurrent_requests=1))
        first = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.assertEqual(self.snapshot().concurrent, 1)
        code, headers, data = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 429)
        self.assertEqual(json.loads(data)["error"]["code"], "concurrency_limit_exceeded")
        self.assertEqual(headers.getRawHeaders("retry-after"), ["1"])
        self.edge.frames(sent.run_id, start(), body(COMPLETION), usage(3, 4), END)
        self.assertEqual(self.answer(first)[0], 200)
        self.assertEqual(self.snapshot().concurrent, 0)
        self.chat_ok()

    def test_settled_with_the_reported_usage(self) -> None:
        self.limit(limits=Limits(tokens_per_minute=10_000))
        self.chat_ok()
        self.assertEqual((self.snapshot().requests, self.snapshot().tokens), (1, 7))
        # The request's record names its key (and its cost: unknown, the model has no price).
        [finished] = self.edge.records
        self.assertEqual((finished.key, finished.team, finished.cost_micros), ("all", "", None))

    def test_work_that_never_reached_a_provider_charges_nothing(self) -> None:
        self.limit(limits=Limits(tokens_per_minute=10_000))
        # A request the codec refuses after placement (n > 1 on a run model)...
        bad = {**CHAT, "model": "llama", "n": 2}
        code, _, _ = self.answer(self.edge.post("/v1/chat/completions", bad))
        self.assertEqual(code, 400)
        own = self.snapshot()
        self.assertEqual((own.concurrent, own.requests, own.tokens), (0, 1, 0))

    def test_a_client_gone_mid_stream_ends_the_reservation(self) -> None:
        self.limit(limits=Limits(concurrent_requests=1))
        self.edge.post("/v1/chat/completions", {**CHAT, "stream": True})
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(b"data: {}\n\n"))
        self.edge.disconnect()
        self.edge.clock.advance(120)
        self.edge.flush()
        self.assertEqual(self.edge.quota.running, 0)

    def test_count_tokens_is_not_metered(self) -> None:
        self.limit(limits=Limits(requests_per_minute=1))
        counted = {**MESSAGES, "model": "counted"}
        for _ in range(3):
            code, _, _ = self.answer(self.edge.post("/v1/messages/count_tokens", counted))
            self.assertEqual(code, 200)
        self.assertEqual(self.edge.quota.running, 0)

    def test_keys_follow_the_running_config(self) -> None:
        self.limit(disabled=True)
        code, _, _ = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 401)
        fresh = ClientKey("fresh", NodeToken.from_plaintext("sk-fresh"))
        api = self.edge.config.client_api
        self.use(
            dataclasses.replace(
                self.edge.config, client_api=dataclasses.replace(api, keys=(*api.keys, fresh))
            )
        )
        d = self.edge.post("/v1/chat/completions", CHAT, key="sk-fresh")
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(COMPLETION), END)
        self.assertEqual(self.answer(d)[0], 200)


class Unreachable:
    """A table whose counters cannot be asked (a cluster's Redis away)."""

    def reserve(self, subjects: Any, demand: Demand) -> Deferred[Reservation]:
        return fail(QuotaUnavailable())

    def snapshot(self, subject: SubjectLimits) -> Any:
        return fail(QuotaUnavailable())


class Later:
    """A table that answers when the test says."""

    def __init__(self, inner: InProcessQuotaTable) -> None:
        self.inner = inner
        self.asked: list[tuple[Deferred[Reservation], Any, Demand]] = []

    def reserve(self, subjects: Any, demand: Demand) -> Deferred[Reservation]:
        d: Deferred[Reservation] = Deferred()
        self.asked.append((d, subjects, demand))
        return d

    def grant(self) -> Reservation:
        d, subjects, demand = self.asked.pop(0)
        reservation = self.inner.reserve_now(subjects, demand)
        d.callback(reservation)
        return reservation


class TableTests(IngressCase):
    def gate(self, table: Any) -> None:
        self.edge.app.pipeline._gate = QuotaGate(self.edge.config.client_api, table)

    def test_unreachable_counters_fail_closed(self) -> None:
        self.gate(Unreachable())
        code, _, data = self.answer(self.edge.post("/v1/chat/completions", CHAT))
        self.assertEqual(code, 503)
        self.assertEqual(json.loads(data)["error"]["code"], "cluster_unavailable")
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])

    def test_a_grant_after_the_client_left_is_released(self) -> None:
        later = Later(self.edge.quota)
        self.gate(later)
        self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        self.assertEqual(len(later.asked), 1)
        self.edge.disconnect()
        reservation = later.grant()
        self.assertTrue(reservation.ended)
        self.assertEqual(self.edge.quota.running, 0)
        self.assertEqual(self.edge.requests("provider_tunnel_request"), [])

    def test_keys_without_limits_ask_nothing(self) -> None:
        unlimited = with_key(self.edge.config, limits=Limits(), budgets=())
        self.edge.app.pipeline._gate = QuotaGate(unlimited.client_api, Unreachable())  # type: ignore[arg-type]
        self.edge.app.pipeline.use_config(unlimited)
        d = self.edge.post("/v1/chat/completions", CHAT)
        self.edge.flush()
        sent = self.edge.tunnel_request()
        self.edge.frames(sent.run_id, start(), body(COMPLETION), END)
        self.assertEqual(self.answer(d)[0], 200)
