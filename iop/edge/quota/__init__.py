"""
Per-key and per-team limits and budgets: the accounting the client pipeline reserves against
before it places a request (``openai.auth`` in edge.yaml; docs/limits.md).

Use (the pipeline's admit stage: reserve before placement, end exactly once in one finally)::

    reservation = await gate.reserve(key, Demand(tokens=prompt + max_output, cost_micros=worst))
    try:
        ...  # place, answer; `dispatched` once the work reached a provider, `charge` its usage
    finally:
        reservation.end(charge, dispatched=dispatched)

``reserve`` fails with :class:`Refused` (a limit or budget says no: 429; ``Refused.budget``
tells a spent budget — OpenAI's ``insufficient_quota``, not worth retrying soon — from a rate
limit) or :class:`QuotaUnavailable` (a cluster's Redis cannot be reached: 503
``cluster_unavailable``, never unlimited). ``end`` settles with the charge (``None``: usage
unknown, the worst case stays charged) or, when the work never reached a provider, releases
(only the request itself stays counted). A second end is a no-op, logged as a bug.

Modules: :mod:`~iop.edge.quota.model` (Demand, Charge, SubjectLimits, Refused,
QuotaUnavailable, Snapshot), :mod:`~iop.edge.quota.table` (IQuotaTable, Reservation),
:mod:`~iop.edge.quota.memory` (the in-process table: an Edge alone),
:mod:`~iop.edge.quota.periods` (budget periods, UTC), :mod:`~iop.edge.quota.gate` (QuotaGate:
the running config's keys and teams → subjects; what the pipeline calls). In a cluster the
table is :class:`~iop.edge.cluster.quota.ClusterQuotaTable` (Redis scripts in
:mod:`~iop.edge.cluster.quota_scripts`).

Subjects
    ``key:<name>`` with the key's limits and budgets (its own, else ``default_limits`` /
    ``default_budgets``) and, when it has a team, ``team:<name>`` with the team's. One request
    reserves against all its subjects at once, all or nothing.

Rules (exact: the same in process and on Redis)
    - ``concurrent_requests``: reservations not yet ended <= the limit.
    - ``requests_per_minute`` / ``tokens_per_minute``: a sliding log over the last 60 s; an
      admission adds (time, id, tokens) and is admitted iff the window's sum plus this one
      stays within the limit; at settle the entry's tokens become the charge (its time stays).
      So no 60-s window ever holds more admitted requests, or more reserved-or-charged tokens
      (when charges do not exceed their worst case), than the limit.
    - budgets: per subject, period and period start, a running total of reserved worst cases
      and settled charges (tokens, cost in micro-units); admitted iff total + demand <= budget;
      a settle replaces the demand by the charge in the period the reservation was admitted in.
      Periods are calendar periods in UTC (:mod:`~iop.edge.quota.periods`).
    - Checked in this order, the first that says no is the refusal: every subject's budgets
      (a spent budget must not read as "retry in a second"), then requests per minute, tokens
      per minute, concurrency — each over the subjects in order, key first.
    - ``retry_after_sec``: a window → when enough entries have left it for this request;
      concurrency → 1 s; a budget → its period's end (``None`` for ``total``); ``None`` too when
      the request alone exceeds the limit (it would never be admitted: lower ``max_tokens``).
    - A cost budget cannot admit a request whose cost is unknown (its model has no price); the
      config refuses such a combination at load, so this is a guard.
    - A limit lowered by a refresh applies to new reservations; those held end as admitted.
"""

from iop.edge.quota.gate import QuotaGate, subjects_of
from iop.edge.quota.memory import InProcessQuotaTable
from iop.edge.quota.model import (
    Charge,
    Demand,
    QuotaUnavailable,
    Refused,
    Snapshot,
    SubjectLimits,
)
from iop.edge.quota.table import IQuotaTable, Reservation

__all__ = [
    "Charge",
    "Demand",
    "IQuotaTable",
    "InProcessQuotaTable",
    "QuotaGate",
    "QuotaUnavailable",
    "Refused",
    "Reservation",
    "Snapshot",
    "SubjectLimits",
    "subjects_of",
]
