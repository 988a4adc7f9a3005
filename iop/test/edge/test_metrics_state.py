# -*- test-case-name: iop.test.edge.test_metrics_state -*-
"""
The exact ``iop_*`` counters the Edge's parts keep (pool, registry, dispatchers), read at
scrape time through :meth:`EdgeMetrics.render` of a real Edge service: every bounded label set
present at zero, values equal to known traffic, grants minus releases equal to the in-flight
gauge.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import CancelledError
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.errors import QueueTimeout
from iop.edge.pool import LEASE_RELEASE_OUTCOMES, Lease
from iop.edge.queue import QUEUE_OUTCOMES
from iop.edge.registry import REJECT_REASONS
from iop.edge.runs import RUN_TERMINALS
from iop.edge.tap import EdgeService
from iop.edge.tunnel import TUNNEL_TERMINALS
from iop.runtime.codes import ERROR_CODE_KEY
from iop.runtime.events import RuntimeEvent
from iop.security.echo import ECHOES_METADATA_KEY
from iop.test.edge.fixtures import TOKENS, FakeConnection, edge_config
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_to_proto

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
NODES = ("node-a", "node-b")
PROVIDERS = (("a-chat", "node-a"), ("a-off", "node-a"), ("b-chat", "node-b"))
COUNTERS = (
    "iop_lease_grants",
    "iop_lease_releases",
    "iop_queue_outcomes",
    "iop_queue_entered",
    "iop_tunnel_terminals",
    "iop_run_terminals",
    "iop_node_registrations",
    "iop_node_reconnects",
    "iop_node_fences",
    "iop_node_rejections",
    "iop_upstream_secret_echoes_redacted",
)


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


class StateCountersTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.edge = EdgeService(edge_config(), self.clock)
        self.connections: dict[str, FakeConnection] = {}

    def scrape(self) -> tuple[dict[str, str], Samples]:
        types: dict[str, str] = {}
        samples: Samples = {}
        for family in text_string_to_metric_families(self.edge.metrics.render().decode()):
            types[family.name] = family.type
            for sample in family.samples:
                samples[(sample.name, labels(**sample.labels))] = sample.value
        return types, samples

    def connect(self, node_id: str) -> FakeConnection:
        conn = FakeConnection()
        self.edge.registry.register(TOKENS[node_id], conn)
        self.edge.registry.ready(node_id, conn)
        self.connections[node_id] = conn
        return conn

    def test_every_label_set_is_there_at_zero(self) -> None:
        types, samples = self.scrape()
        for name in COUNTERS:
            self.assertEqual(types[name], "counter", name)
        expected: dict[str, list[tuple[tuple[str, str], ...]]] = {
            "iop_lease_grants_total": [labels(provider=p, node=n) for p, n in PROVIDERS],
            "iop_lease_releases_total": [
                labels(provider=p, node=n, outcome=o)
                for p, n in PROVIDERS
                for o in LEASE_RELEASE_OUTCOMES
            ],
            "iop_queue_outcomes_total": [labels(model="pool", outcome=o) for o in QUEUE_OUTCOMES],
            "iop_queue_entered_total": [labels(model="pool")],
            "iop_tunnel_terminals_total": [
                labels(node=n, kind=k) for n in NODES for k in TUNNEL_TERMINALS
            ],
            "iop_run_terminals_total": [
                labels(node=n, kind=k) for n in NODES for k in RUN_TERMINALS
            ],
            "iop_node_registrations_total": [labels(node=n) for n in NODES],
            "iop_node_reconnects_total": [labels(node=n) for n in NODES],
            "iop_node_fences_total": [labels(node=n) for n in NODES],
            "iop_node_rejections_total": [labels(reason=r) for r in REJECT_REASONS],
            "iop_upstream_secret_echoes_redacted_total": [labels(node=n) for n in NODES],
        }
        for name, label_sets in expected.items():
            present = {key for (sample, key) in samples if sample == name}
            self.assertEqual(present, set(label_sets), name)
            for key in label_sets:
                self.assertEqual(samples[(name, key)], 0, (name, key))

    def test_leases_and_queue_outcomes_equal_known_traffic(self) -> None:
        self.connect("node-a")
        n = 5
        held: list[Lease] = []
        for _ in range(n):
            held.append(self.successResultOf(self.edge.pool.acquire("pool")))
            held.pop().release()
        held = [self.successResultOf(self.edge.pool.acquire("pool")) for _ in range(2)]
        waiting = self.edge.pool.acquire("pool")  # a-chat's capacity is 2
        withdrawn = self.edge.pool.acquire("pool")
        withdrawn.cancel()
        self.failureResultOf(withdrawn, CancelledError)
        _, samples = self.scrape()
        a = {"provider": "a-chat", "node": "node-a"}
        self.assertEqual(samples[("iop_lease_grants_total", labels(**a))], n + 2)
        self.assertEqual(samples[("iop_lease_releases_total", labels(**a, outcome="released"))], n)
        self.assertEqual(
            samples[("iop_queue_outcomes_total", labels(model="pool", outcome="served"))], n + 2
        )
        self.assertEqual(
            samples[("iop_queue_outcomes_total", labels(model="pool", outcome="withdrawn"))], 1
        )
        self.assertEqual(samples[("iop_queue_entered_total", labels(model="pool"))], 2)
        self.assertGrantsMinusReleasesIsInFlight(samples)
        self.clock.advance(60)
        self.failureResultOf(waiting, QueueTimeout)
        self.edge.registry.disconnected(self.connections["node-a"], "heartbeat timeout")
        for lease in held:
            lease.release()
        _, samples = self.scrape()
        self.assertEqual(samples[("iop_lease_releases_total", labels(**a, outcome="fenced"))], 2)
        self.assertEqual(samples[("iop_lease_releases_total", labels(**a, outcome="released"))], n)
        self.assertEqual(
            samples[("iop_queue_outcomes_total", labels(model="pool", outcome="timeout"))], 1
        )
        outcomes = sum(
            value for (name, _), value in samples.items() if name == "iop_queue_outcomes_total"
        )
        self.assertEqual(outcomes, n + 4)
        self.assertGrantsMinusReleasesIsInFlight(samples)

    def assertGrantsMinusReleasesIsInFlight(self, samples: Samples) -> None:
        for provider, node in PROVIDERS:
            pair = {"provider": provider, "node": node}
            held = samples[("iop_lease_grants_total", labels(**pair))] - sum(
                samples[("iop_lease_releases_total", labels(**pair, outcome=o))]
                for o in LEASE_RELEASE_OUTCOMES
            )
            self.assertEqual(held, samples[("iop_provider_in_flight", labels(**pair))], pair)

    def test_terminals_and_node_lifecycle(self) -> None:
        a = self.connect("node-a")
        n = 3
        for _ in range(n):
            tunnel = self.edge.tunnels.open(
                "node-a", adapter="fake", target="demo-model", operation="chat_completions"
            )
            for seq, kind in enumerate((pb.RESPONSE_START, pb.END), 1):
                frame = pb.ProviderTunnelFrame(
                    run_id=tunnel.run_id, sequence=seq, kind=kind, status_code=200
                )
                self.edge.tunnels.frame(a, frame)
        run = self.edge.runs.submit_run(adapter="fake", target="demo-model", input="x")
        self.edge.runs.run_event(a, event_to_proto(RuntimeEvent.complete(), run.run_id, 1))
        lost = self.edge.runs.submit_run(adapter="fake", target="demo-model", input="x")
        self.edge.registry.register("not-a-token", FakeConnection())
        self.edge.registry.disconnected(a)
        self.connect("node-a")
        self.assertEqual(lost.terminal.type if lost.terminal else None, "error")
        _, samples = self.scrape()
        node_a = {"node": "node-a"}
        self.assertEqual(
            samples[("iop_tunnel_terminals_total", labels(**node_a, kind="complete"))], n
        )
        self.assertEqual(samples[("iop_run_terminals_total", labels(**node_a, kind="complete"))], 1)
        self.assertEqual(
            samples[("iop_run_terminals_total", labels(**node_a, kind="node_lost"))], 1
        )
        self.assertEqual(samples[("iop_node_registrations_total", labels(**node_a))], 2)
        self.assertEqual(samples[("iop_node_reconnects_total", labels(**node_a))], 1)
        self.assertEqual(samples[("iop_node_fences_total", labels(**node_a))], 1)
        self.assertEqual(samples[("iop_node_rejections_total", labels(reason="unknown_token"))], 1)
        text: Any = self.edge.metrics.render().decode()
        for secret in (*TOKENS.values(), "not-a-token"):
            self.assertNotIn(secret, text)

    def test_echoes_a_managed_node_redacted(self) -> None:
        # The count a node puts in a tunnel's END or ERROR metadata; a malformed one is ignored.
        a = self.connect("node-a")
        ends = [
            (pb.END, {ECHOES_METADATA_KEY: "3"}),
            (pb.ERROR, {ECHOES_METADATA_KEY: "2", ERROR_CODE_KEY: "upstream_timeout"}),
            (pb.END, {}),
            (pb.END, {ECHOES_METADATA_KEY: "-7"}),
            (pb.END, {ECHOES_METADATA_KEY: "1" * 40}),
        ]
        for kind, metadata in ends:
            tunnel = self.edge.tunnels.open(
                "node-a", adapter="fake", target="demo-model", operation="chat_completions"
            )
            self.edge.tunnels.frame(
                a,
                pb.ProviderTunnelFrame(
                    run_id=tunnel.run_id, sequence=1, kind=pb.RESPONSE_START, status_code=401
                ),
            )
            self.edge.tunnels.frame(
                a,
                pb.ProviderTunnelFrame(
                    run_id=tunnel.run_id, sequence=2, kind=kind, end=True, metadata=metadata
                ),
            )
        self.flushLoggedErrors()
        _, samples = self.scrape()
        echoes = "iop_upstream_secret_echoes_redacted_total"
        self.assertEqual(samples[(echoes, labels(node="node-a"))], 5)
        self.assertEqual(samples[(echoes, labels(node="node-b"))], 0)
