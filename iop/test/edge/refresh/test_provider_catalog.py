"""
Providers added to and removed from a connected node by a refresh
(:mod:`iop.edge.refresh.catalog`): which are live and why the others are not, as the classifier
reports them and as the applier's invariants hold them; and a live one applied through every
Edge part — pool, status, node payload, credential issuer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import (
    AdapterConfig,
    CredentialSlot,
    EdgeConfig,
    EdgeSecurity,
    NodeConfig,
    ProviderConfig,
    Secret,
)
from iop.edge.errors import Unavailable
from iop.edge.refresh.apply import check_live_invariants
from iop.edge.refresh.catalog import restart_reasons
from iop.edge.refresh.classify import candidate_result, classify
from iop.edge.refresh.report import ABSENT
from iop.security.keys import generate_issuer, generate_recipient
from iop.security.pki import issue_node, make_ca
from iop.test.edge.refresh.test_apply import Edge, Outcomes
from iop.test.edge.test_pool import make_config, prov

SHARED = "shared"


def on(adapter: str, p: ProviderConfig, **changes: Any) -> ProviderConfig:
    return dataclasses.replace(p, adapter=adapter, adapter_instance=adapter, **changes)


def adapter(name: str) -> AdapterConfig:
    return AdapterConfig(name, "openai_compat", base_url=f"http://127.0.0.1:9/{name}")


def running_config() -> EdgeConfig:
    """n1 runs adapters ``shared`` (p1) and ``spare`` (no provider); n2 runs ``other`` (p3)."""
    config = make_config(
        {"n1": [on(SHARED, prov("p1", capacity=2))], "n2": [on("other", prov("p3"))]},
        {"m": ["p1"], "k": ["p3"]},
    )
    n1, n2 = config.nodes
    return dataclasses.replace(
        config,
        nodes=(
            dataclasses.replace(n1, adapters=(adapter(SHARED), adapter("spare"))),
            dataclasses.replace(n2, adapters=(adapter("other"),)),
        ),
    )


def with_providers(config: EdgeConfig, node_id: str, *providers: ProviderConfig) -> EdgeConfig:
    def node(n: NodeConfig) -> NodeConfig:
        return dataclasses.replace(n, providers=providers) if n.id == node_id else n

    return dataclasses.replace(config, nodes=tuple(node(n) for n in config.nodes))


def with_adapters(config: EdgeConfig, node_id: str, *adapters: AdapterConfig) -> EdgeConfig:
    def node(n: NodeConfig) -> NodeConfig:
        return dataclasses.replace(n, adapters=adapters) if n.id == node_id else n

    return dataclasses.replace(config, nodes=tuple(node(n) for n in config.nodes))


def with_models(config: EdgeConfig, **models: list[str]) -> EdgeConfig:
    return dataclasses.replace(
        config,
        models=tuple(
            dataclasses.replace(
                m,
                providers=tuple(
                    dataclasses.replace(m.providers[0], provider_id=p, target=f"{m.id}@{p}")
                    for p in models[m.id]
                ),
            )
            if m.id in models
            else m
            for m in config.models
        ),
    )


P1 = on(SHARED, prov("p1", capacity=2))
P2 = on(SHARED, prov("p2", capacity=3))


class RestartReasonsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.running = running_config()

    def test_on_an_adapter_the_node_runs_is_live(self) -> None:
        for candidate in (
            with_providers(self.running, "n1", P1, P2),
            with_providers(self.running, "n1", P1, on("spare", prov("p2"))),
            with_providers(self.running, "n1"),
            # A new id: one removed, one added.
            with_providers(self.running, "n1", on(SHARED, prov("renamed", capacity=2))),
        ):
            self.assertEqual(restart_reasons(self.running, candidate), {})
            check_live_invariants(self.running, candidate)

    def test_an_adapter_new_on_the_node(self) -> None:
        candidate = with_adapters(
            with_providers(self.running, "n1", P1, on("fresh", prov("p2"))),
            "n1",
            adapter(SHARED),
            adapter("spare"),
            adapter("fresh"),
        )
        [(where, reason)] = restart_reasons(self.running, candidate).items()
        self.assertEqual(where, ("n1", "p2"))
        self.assertIn("adapter 'fresh' is new on node n1", reason)
        self.assertIn("restart_required", reason)
        e = self.assertRaises(ValueError, check_live_invariants, self.running, candidate)
        self.assertIn("provider p2", str(e))
        self.assertIn("'fresh' is new on node n1", str(e))

    def test_an_adapter_leaving_with_it(self) -> None:
        candidate = with_adapters(with_providers(self.running, "n2"), "n2", adapter("another"))
        [(where, reason)] = restart_reasons(self.running, candidate).items()
        self.assertEqual(where, ("n2", "p3"))
        self.assertIn("leaves node n2", reason)

    def test_moved_between_nodes(self) -> None:
        candidate = with_providers(
            with_providers(self.running, "n1"), "n2", on("other", prov("p3")), on("other", P1)
        )
        reasons = restart_reasons(self.running, candidate)
        self.assertIn("moved to node n2", reasons[("n1", "p1")])
        self.assertIn("moved from node n1", reasons[("n2", "p1")])

    def test_a_profile_the_adapter_would_be_delivered(self) -> None:
        with_profile = with_providers(self.running, "n1", on(SHARED, prov("p1"), profile="a"))
        # Added before p1 on its adapter: the adapter's profile would become the new one's.
        candidate = with_providers(
            with_profile,
            "n1",
            on(SHARED, prov("p0"), profile="b"),
            on(SHARED, prov("p1"), profile="a"),
        )
        reasons = restart_reasons(with_profile, candidate)
        self.assertIn("protocol profile 'b' instead of 'a'", reasons[("n1", "p0")])
        # Added after it, or emptying it: no change the node refuses.
        later = with_providers(
            with_profile,
            "n1",
            on(SHARED, prov("p1"), profile="a"),
            on(SHARED, prov("p9"), profile="b"),
        )
        self.assertEqual(restart_reasons(with_profile, later), {})
        self.assertEqual(restart_reasons(with_profile, with_providers(with_profile, "n1")), {})


class ClassifyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.running = running_config()

    def test_added_on_an_adapter_the_node_runs(self) -> None:
        candidate = with_providers(self.running, "n1", P1, P2)
        [report] = classify(self.running, candidate)
        self.assertEqual(
            (report.path, report.old, report.new, report.change_class, report.provider),
            ("nodes[0].providers[1]", ABSENT, "p2", "live", "p2"),
        )
        result = candidate_result("apply", [report])
        self.assertEqual((result.result, result.changed_providers), ("applied", ["p2"]))

    def test_removed(self) -> None:
        [report] = classify(self.running, with_providers(self.running, "n1"))
        self.assertEqual((report.new, report.change_class), (ABSENT, "live"))
        self.assertIn("removed", report.detail)

    def test_added_with_a_new_adapter_is_restart_required_naming_it(self) -> None:
        candidate = with_adapters(
            with_providers(self.running, "n1", P1, on("fresh", prov("p2"))),
            "n1",
            adapter(SHARED),
            adapter("spare"),
            adapter("fresh"),
        )
        reports = {r.path: r for r in classify(self.running, candidate)}
        provider = reports["nodes[0].providers[1]"]
        self.assertEqual(provider.change_class, "restart_required")
        self.assertIn("added; its adapter 'fresh' is new on node n1", provider.detail)
        self.assertEqual(reports["nodes[0].adapters[2]"].change_class, "restart_required")
        result = candidate_result("apply", list(reports.values()))
        self.assertEqual(result.result, "restart_required")
        self.assertIn(provider, result.blocking)

    def test_moved_is_restart_required_on_both_nodes(self) -> None:
        candidate = with_providers(
            with_providers(self.running, "n1"), "n2", on("other", prov("p3")), on("other", P1)
        )
        classes = {(r.node, r.provider, r.change_class) for r in classify(self.running, candidate)}
        self.assertEqual(
            classes, {("n1", "p1", "restart_required"), ("n2", "p1", "restart_required")}
        )


class ApplyTests(SynchronousTestCase):
    """A live add or remove through every Edge part the applier switches."""

    def setUp(self) -> None:
        self.edge = Edge(running_config())
        self.outcomes = Outcomes()

    def test_added_serves_waiters_and_grows_the_adapter_gate(self) -> None:
        held = [self.successResultOf(self.edge.pool.acquire("m")) for _ in range(2)]
        waiting = self.outcomes.track("w", self.edge.pool.acquire("m"))
        self.assertNoResult(waiting)
        before = {a.name: a.max_concurrency for a in self.edge.applier.payload("n1").adapters}
        candidate = with_models(
            with_providers(self.edge.applier.config, "n1", P1, P2), m=["p1", "p2"]
        )
        self.assertEqual(self.edge.applier.apply(candidate), ["n1"])
        self.assertEqual(self.outcomes.arrivals[0][1].provider_id, "p2")
        after = {a.name: a.max_concurrency for a in self.edge.applier.payload("n1").adapters}
        self.assertEqual((before[SHARED], after[SHARED]), (2, 5))
        status = {p["id"]: p for p in self.edge.status()["providers"]}
        self.assertEqual(
            (status["p2"]["status"], status["p2"]["in_flight"], status["p2"]["capacity"]),
            ("available", 1, 3),
        )
        for lease in held:
            lease.release()

    def test_removed_finishes_its_work_and_drops_from_status_after(self) -> None:
        both = with_models(with_providers(self.edge.applier.config, "n1", P1, P2), m=["p1", "p2"])
        self.edge.applier.apply(both)
        leases = [self.successResultOf(self.edge.pool.acquire("m")) for _ in range(2)]
        on_p1 = next(lease for lease in leases if lease.provider_id == "p1")
        only_p2 = with_models(with_providers(both, "n1", P2), m=["p2"])
        self.assertEqual(self.edge.applier.apply(only_p2), ["n1"])
        status = {p["id"]: p for p in self.edge.status()["providers"]}
        self.assertEqual((status["p1"]["status"], status["p1"]["in_flight"]), ("removed", 1))
        for _ in range(3):
            lease = self.successResultOf(self.edge.pool.acquire("m"))
            self.assertEqual(lease.provider_id, "p2")
            lease.release()
        on_p1.release()
        self.assertNotIn("p1", {p["id"] for p in self.edge.status()["providers"]})
        stats = self.edge.pool.stats()
        self.assertEqual(set(stats.in_flight.values()), {0, 1})
        for lease in leases:
            lease.release()
        self.assertEqual(set(self.edge.pool.stats().in_flight.values()), {0})

    def test_removed_last_candidate_ends_waiters_unavailable(self) -> None:
        self.successResultOf(self.edge.pool.acquire("m"))
        self.successResultOf(self.edge.pool.acquire("m"))
        waiting = self.outcomes.track("w", self.edge.pool.acquire("m"))
        self.edge.applier.apply(with_models(with_providers(self.edge.applier.config, "n1"), m=[]))
        self.assertEqual(self.successResultOf(waiting), None)
        [(_, error)] = self.outcomes.arrivals
        self.assertIsInstance(error, Unavailable)

    def test_a_new_adapter_is_refused_and_changes_nothing(self) -> None:
        before = self.edge.state()
        candidate = with_adapters(
            with_providers(self.edge.applier.config, "n1", P1, on("fresh", prov("p2"))),
            "n1",
            adapter(SHARED),
            adapter("spare"),
            adapter("fresh"),
        )
        self.assertRaises(ValueError, self.edge.applier.apply, candidate)
        self.assertEqual(self.edge.state(), before)


class ManagedTests(SynchronousTestCase):
    """Managed mode: the credential issuer binds a provider added live to its slot."""

    def test_added_provider_binds_its_slot(self) -> None:
        from iop.edge.credentials import CredentialIssuer

        clock = Clock()
        clock.advance(1_800_000_000)
        config = dataclasses.replace(
            running_config(),
            security=EdgeSecurity(mode="managed", lease_ttl_sec=30.0),
            credentials=(CredentialSlot("main", Secret("sk-added-provider-secret")),),
        )
        issuer = CredentialIssuer(
            config,
            generate_issuer(),
            {n: generate_recipient().public_key() for n in ("n1", "n2")},
            clock,
        )
        ca = make_ca("test CA")
        certificates = {n: issue_node(ca, n)[1] for n in ("n1", "n2")}
        edge = Edge(config, credentials=issuer, certificates=certificates, clock=clock)
        added = with_models(
            with_providers(config, "n1", on(SHARED, prov("p2"), credential="main")), m=["p2"]
        )
        edge.applier.apply(added)
        placement = self.successResultOf(edge.gateway.place("m"))
        self.addCleanup(placement.release)
        self.assertEqual(placement.provider_id, "p2")
        binding, lease = issuer.sealer(placement)()
        self.assertEqual(
            (binding.slot, binding.adapter, binding.route), ("main", SHARED, "m:n1/p2")
        )
        self.assertTrue(lease)
