# -*- test-case-name: iop.test.edge.test_ledger -*-
"""
The usage ledger's feed: one :class:`~iop.usage.store.UsageRecord` per finished generation
request (Chat Completions, Responses, Messages), read off the Edge's event bus
(:class:`~iop.edge.events.RequestFinished`) and handed to the ledger
(:class:`~iop.usage.ledger.UsageLedger`), which writes it off the reactor thread.

Refused requests are recorded too (a 429 of a key's limit, an unknown model), so "who was
refused what" is in the ledger — except an unauthenticated one (401): nobody to charge, and a
flood of bad keys must not fill the file. ``count_tokens`` and the model listings are not
usage. Tokens and cost are what the provider reported and what that cost at the model's price
(None when unknown, never estimated). Each record names the request's id (the one its answer's
``x-request-id`` carried), so a client's complaint finds its row.
"""

from __future__ import annotations

from iop.edge.events import RequestFinished
from iop.usage.ledger import UsageLedger
from iop.usage.store import UsageRecord

__all__ = ["GENERATION_OPERATIONS", "LedgerFeed"]

# The client API operations that generate (and so use what the ledger counts).
GENERATION_OPERATIONS = frozenset({"chat", "responses", "messages"})


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


class LedgerFeed:
    """Subscribes to the bus (:meth:`observe`); one record per finished generation request."""

    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger

    def observe(self, event: object) -> None:
        if not isinstance(event, RequestFinished):
            return
        if event.operation not in GENERATION_OPERATIONS or event.status == 401:
            return
        self._ledger.record(
            UsageRecord.of(
                round(event.at * 1000),
                event.usage,
                request_id=event.request_id,
                key=event.key,
                team=event.team,
                model=event.model,
                provider=event.provider_id,
                node=event.node_id,
                surface=event.surface,
                outcome=event.outcome,
                cost_micros=event.cost_micros,
                duration_ms=_ms(event.duration),
                ttft_ms=_ms(event.time_to_first_token),
            )
        )
