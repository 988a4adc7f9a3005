"""
An adapter's gate follows its providers: the payload's ``max_concurrency`` (explicit, or the sum
of the enabled providers' capacity), its change classified live, and an apply that tells the
nodes before the pool grants anything under the new config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import AdapterConfig, EdgeConfig, NodeConfig, ProviderConfig
from iop.edge.payload import adapter_limit, build_node_payload
from iop.edge.refresh.classify import candidate_result, classify
from iop.edge.refresh.report import NodePush
from iop.edge.refresh.service import ConfigRefresher
from iop.test.edge.refresh.test_apply import ApplyTestCase, with_provider
from iop.test.edge.test_pool import make_config, prov


def with_adapters(config: EdgeConfig, **limits: int | None) -> EdgeConfig:
    """Each provider's adapter instance configured on its node, ``max_concurrency`` by name."""

    def node(n: NodeConfig) -> NodeConfig:
        names = dict.fromkeys(p.adapter_instance for p in n.providers)
        adapters = tuple(
            AdapterConfig(
                name,
                "openai_compat",
                base_url="http://127.0.0.1:9/v1",
                max_concurrency=limits.get(name.replace("-", "_")),
            )
            for name in names
        )
        return dataclasses.replace(n, adapters=adapters)

    return dataclasses.replace(config, nodes=tuple(node(n) for n in config.nodes))


def with_limit(config: EdgeConfig, adapter: str, limit: int | None) -> EdgeConfig:
    def node(n: NodeConfig) -> NodeConfig:
        adapters = tuple(
            dataclasses.replace(a, max_concurrency=limit) if a.name == adapter else a
            for a in n.adapters
        )
        return dataclasses.replace(n, adapters=adapters)

    return dataclasses.replace(config, nodes=tuple(node(n) for n in config.nodes))


def shared(*providers_: tuple[str, int, bool]) -> list[ProviderConfig]:
    """Providers ``(id, capacity, enabled)`` all on adapter instance ``shared``."""
    return [
        dataclasses.replace(
            prov(pid, capacity=capacity, enabled=enabled),
            adapter="shared",
            adapter_instance="shared",
        )
        for pid, capacity, enabled in providers_
    ]


class PayloadLimitTests(SynchronousTestCase):
    def test_followsEnabledProviders(self) -> None:
        config = with_adapters(
            make_config({"n1": shared(("p1", 2, True), ("p2", 3, True), ("p3", 7, False))}, {})
        )
        node = config.nodes[0]
        [adapter] = node.adapters
        self.assertIsNone(adapter.max_concurrency)
        self.assertEqual(adapter_limit(node, adapter), 5)
        self.assertEqual(build_node_payload(config, node).adapters[0].max_concurrency, 5)

    def test_explicitIsSent(self) -> None:
        config = with_adapters(make_config({"n1": shared(("p1", 2, True))}, {}), shared=8)
        node = config.nodes[0]
        self.assertEqual(build_node_payload(config, node).adapters[0].max_concurrency, 8)

    def test_noProviderIsOne(self) -> None:
        """Reached only by direct routes (or every provider disabled): 1, as before."""
        config = with_adapters(make_config({"n1": shared(("p1", 4, False))}, {}))
        node = config.nodes[0]
        node = dataclasses.replace(
            node, adapters=(*node.adapters, AdapterConfig("routes-only", "openai_compat"))
        )
        self.assertEqual([adapter_limit(node, a) for a in node.adapters], [1, 1])


class ClassifyTests(SynchronousTestCase):
    def test_maxConcurrencyIsLive(self) -> None:
        running = with_adapters(make_config({"n1": shared(("p1", 2, True))}, {}), shared=2)
        for limit in (6, None):
            reports = classify(running, with_limit(running, "shared", limit))
            self.assertEqual(
                [(r.path, r.change_class) for r in reports],
                [("nodes[0].adapters[0].max_concurrency", "live")],
            )
            self.assertEqual(candidate_result("apply", reports).result, "applied")


class ApplyTests(ApplyTestCase):
    def setUp(self) -> None:
        self.build({"n1": shared(("p1", 1, True))}, {"m": ["p1"]})
        # The same parts over a config whose node has the shared adapter (follows p1).
        self.edge.applier.config = with_adapters(self.running)

    def test_capacityMovesTheFollowingAdapter(self) -> None:
        """A capacity change on a provider of a following adapter changes the node's payload."""
        candidate = with_provider(self.running, "p1", capacity=4)
        self.assertEqual(self.edge.applier.apply(candidate), ["n1"])
        self.assertEqual(self.edge.applier.payload("n1").adapters[0].max_concurrency, 4)

    def test_explicitLimitChangeIsLive(self) -> None:
        candidate = with_limit(self.running, "shared", 3)
        self.assertEqual(self.edge.applier.apply(candidate), ["n1"])
        self.assertEqual(self.edge.applier.payload("n1").adapters[0].max_concurrency, 3)

    def test_nodesToldBeforeTheRaiseIsGranted(self) -> None:
        """
        The push goes out between the switch and the pool's first grant under the new config:
        on the node's connection the resized gate comes before the work it admits.
        """
        held = self.lease("m")
        self.wait("w1", "m")
        self.wait("w2", "m")
        told: list[tuple[list[str], list[str]]] = []
        candidate = with_provider(self.running, "p1", capacity=3)
        changed = self.edge.applier.apply(
            candidate, lambda nodes: told.append((nodes, self.outcomes.names()))
        )
        self.assertEqual(told, [(["n1"], [])])
        self.assertEqual(changed, ["n1"])
        self.assertEqual(self.outcomes.names(), ["w1", "w2"])
        held.release()
        for _, lease in self.outcomes.arrivals:
            lease.release()

    def test_hookThatRaisesStillGrants(self) -> None:
        self.lease("m")
        self.wait("w1", "m")

        def boom(nodes: list[str]) -> None:
            raise RuntimeError("boom")

        self.edge.applier.apply(with_provider(self.running, "p1", capacity=2), boom)
        self.assertEqual(self.outcomes.names(), ["w1"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class RefresherOrderTests(SynchronousTestCase):
    def test_pushSentInsideTheApply(self) -> None:
        """The refresher pushes from the applier's hook, once, before the grants."""
        log: list[object] = []
        running = make_config({"n1": shared(("p1", 1, True))}, {})

        class Applier:
            config = running
            generation = 1

            def apply(
                self,
                candidate: EdgeConfig,
                before_grants: Callable[[list[str]], object] | None = None,
            ) -> list[str] | None:
                log.append("switch")
                assert before_grants is not None
                before_grants(["n1"])
                log.append("grants")
                return ["n1"]

        class Pusher:
            def push(self, node_ids: Iterable[str]) -> Deferred[list[NodePush]]:
                ids = list(node_ids)
                log.append(("push", ids))
                return succeed([NodePush(n, "applied") for n in ids])

        candidate = with_provider(running, "p1", capacity=2)
        refresher = ConfigRefresher(
            lambda: candidate, lambda a, b: [], Applier(), Pusher(), Clock()
        )
        result = self.successResultOf(refresher.refresh("apply"))
        self.assertEqual(log, ["switch", ("push", ["n1"]), "grants"])
        self.assertEqual([p.node_id for p in result.node_pushes], ["n1"])
