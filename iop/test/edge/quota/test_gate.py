"""
:class:`~iop.edge.quota.gate.QuotaGate`: a key's subjects from the running config (its own
limits, its team's), unlimited subjects not counted, a refresh switching what new reservations
see while held ones end as admitted.
"""

from __future__ import annotations

import dataclasses

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import (
    Budget,
    ClientAPIConfig,
    ClientKey,
    EdgeConfig,
    HeartbeatConfig,
    Limits,
    NodeToken,
    Team,
)
from iop.edge.quota import Charge, Demand, InProcessQuotaTable, QuotaGate, Refused, SubjectLimits


def key(name: str, **fields: object) -> ClientKey:
    return ClientKey(name, NodeToken.from_plaintext(f"sk-{name}"), **fields)  # type: ignore[arg-type]


API = ClientAPIConfig(
    keys=(
        key("alice", team="backend", limits=Limits(concurrent_requests=2)),
        key("bob", team="backend"),
        key("carol"),
    ),
    teams=(Team("backend", Limits(concurrent_requests=3), (Budget("day", tokens=100),)),),
)


def edge_config(api: ClientAPIConfig) -> EdgeConfig:
    return EdgeConfig(
        id="e",
        node_listen="tcp:0",
        admin_listen="tcp:0",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(),
        max_frame_bytes=1 << 20,
        register_timeout_sec=5.0,
        nodes=(),
        client_api=api,
    )


class GateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.table = InProcessQuotaTable(Clock())
        self.gate = QuotaGate(API, self.table)

    def test_subjects(self) -> None:
        alice, bob, carol = API.keys
        team = SubjectLimits("team:backend", Limits(concurrent_requests=3), (Budget("day", 100),))
        self.assertEqual(
            self.gate.subjects(alice),
            (SubjectLimits("key:alice", Limits(concurrent_requests=2)), team),
        )
        # bob has no limits of his own: only the team counts; carol nothing at all.
        self.assertEqual(self.gate.subjects(bob), (team,))
        self.assertEqual(self.gate.subjects(carol), ())
        self.assertEqual(self.gate.subjects(None), ())

    def test_uncounted_reservation(self) -> None:
        reservation = self.successResultOf(self.gate.reserve(API.keys[2], Demand(10**9)))
        self.assertEqual(reservation.subjects, ())
        reservation.settle(Charge(5))
        self.assertEqual(self.table.subjects(), frozenset())

    def test_team_adds_up(self) -> None:
        alice, bob, _ = API.keys
        held = [self.successResultOf(self.gate.reserve(k, Demand(30))) for k in (alice, bob, bob)]
        failure = self.failureResultOf(self.gate.reserve(alice, Demand(20)), Refused)
        self.assertEqual((failure.value.subject, failure.value.kind), ("team:backend", "budget"))
        for r in held:
            r.release()
        snapshots = self.successResultOf(self.gate.snapshot(alice))
        self.assertEqual([s.subject for s in snapshots], ["key:alice", "team:backend"])
        self.assertEqual(snapshots[1].budgets[0].tokens, 0)

    def test_refresh(self) -> None:
        alice = API.keys[0]
        held = self.successResultOf(self.gate.reserve(alice, Demand(1)))
        lowered = dataclasses.replace(
            API,
            keys=(dataclasses.replace(alice, limits=Limits(concurrent_requests=1)), *API.keys[1:]),
        )
        self.gate.use_config(edge_config(lowered))
        failure = self.failureResultOf(self.gate.reserve(alice, Demand(1)), Refused)
        self.assertEqual((failure.value.subject, failure.value.limit), ("key:alice", 1))
        held.settle(Charge(1))
        self.successResultOf(self.gate.reserve(alice, Demand(1)))
        # A key the running config no longer has keeps its own limits (and its team's).
        self.gate.use_config(edge_config(dataclasses.replace(API, keys=(), teams=())))
        self.assertEqual(
            self.gate.subjects(alice),
            (SubjectLimits("key:alice", Limits(concurrent_requests=2)),),
        )
