# -*- test-case-name: iop.test.edge.test_metrics -*-
"""
The Edge's Prometheus metrics: one :class:`EdgeMetrics` per Edge, with its own
``CollectorRegistry`` (never the process-global one), served as ``GET /metrics`` on the admin
listener.

Two sources, each exact:

- **State, read at scrape time** (:class:`StateCollector`): provider capacity and lease/queue
  occupancy and node connections by state are read from the same status snapshot ``/status``
  answers, so a scrape and ``/status`` taken together agree; and the counters the parts that
  decide each outcome keep themselves (the pool's lease grants/returns and queue outcomes, the
  registry's registrations, reconnects, fences and refusals, the node listener's refused TLS
  handshakes, the dispatchers' tunnel and run terminals by kind, the credential echoes managed
  nodes removed from tunnel responses), read from their ``stats()``.
- **Events, counted as they happen** (:meth:`EdgeMetrics.observe`, an event bus subscriber):
  each finished client request (:class:`~iop.edge.events.RequestFinished`) once — by model,
  provider, node, operation, surface, status and outcome; its duration, time to first token and
  time per output token on the OpenTelemetry GenAI server metrics; its wait for a provider;
  its token usage by type (what the provider reported; a request without reported usage
  observes nothing); its error code when it failed, by surface and operation
  (``iop_client_errors``) and by model, provider and node (``iop_request_errors``, so a per-model
  or per-provider alert sees why) — and node lifecycle events by kind. The
  bus drops events for a subscriber that falls far behind;
  ``iop_event_bus_dropped_events_total`` counts those, so a counter that is short says so.

Per client key and team (``iop_key_requests_total``, ``iop_key_tokens_total``,
``iop_key_cost_total``): what each key and its team used and what it cost at the models'
prices, from the request's record; and each budget's limit, use and what remains now
(``iop_key_budget_*``, :class:`BudgetCollector`).

The GenAI histograms follow OpenTelemetry's GenAI semantic conventions (v1.41): their names
and their attributes as the OpenTelemetry→Prometheus rules write them (dots become underscores,
the unit a ``_seconds`` suffix): ``gen_ai_operation_name`` (``chat`` for the chat, responses and
messages surfaces), ``gen_ai_provider_name`` (the provider's kind: ``openai`` for an
OpenAI-compatible upstream, ``vllm``, ``ollama``, ``cli``; never the deprecated
``gen_ai.system``), ``gen_ai_request_model``, ``error_type`` (the HTTP status of a failed
request, else empty) and, on ``gen_ai_client_token_usage``, ``gen_ai_token_type``. IOP's own
labels stay beside them (``model``, ``provider``, ``node``, ``operation``, ``surface``,
``status``, ``type``): the dashboards and alerts written on them keep working, and neither set
adds a series (each is a function of the other). ``gen_ai_client_operation_duration_seconds``
is the Edge→provider leg (dispatch to the end of the work on the node), observed when the
request's record carries it (:attr:`RequestFinished.provider_duration`).

Exemplars: a request whose record carries its trace id (:attr:`RequestFinished.trace_id`, set
when the Edge traces it) attaches it to the duration histograms' observation; they are exposed
in the OpenMetrics format, which :meth:`EdgeMetrics.render_for` answers to a scraper that asks for
it (``Accept: application/openmetrics-text``: Prometheus does, with exemplar storage on), the
classic text format otherwise. ``iop_telemetry_spans_dropped_total`` counts the spans the trace
exporter dropped because its queue was full (:mod:`iop.telemetry.provider`).

Labels are bounded: model, provider, node, client key and team names from the config, outcome,
token type and event kind from fixed sets. Never a key's secret, a token or free text. A request
that named no configured model (none, an unreadable body, a model the Edge does not have) counts
under ``model="(none)"`` (:data:`~iop.edge.events.NO_MODEL`), never under an empty label: a
refused or failed request still has a model to alert on. A request refused after it named a
configured model or direct route (its key's scope, a limit, no node for the route) counts under
that model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as text_exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_exposition
from prometheus_client.registry import Collector
from twisted.internet.defer import Deferred

from iop.config.model import MICROS_PER_UNIT, EdgeConfig
from iop.edge.events import NO_MODEL, NodeEvent, NodeEventKind, RequestFinished
from iop.edge.registry import OwnershipState
from iop.telemetry.semconv import operation_name, provider_name

# The OpenTelemetry GenAI semantic conventions' bucket boundaries for each histogram.
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# Ours: from "placed at once" to the queue timeouts operators configure.
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The operations that generate (the gen_ai_server_* histograms observe only these).
GENERATE_OPERATIONS = frozenset({"chat", "responses", "messages", "run", "tunnel"})
REQUEST_LABELS = ("model", "provider", "node", "operation", "surface")
# The GenAI conventions' attributes, as Prometheus labels, on the gen_ai_* histograms.
GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")
NODE_STATES = (*(s.value for s in OwnershipState), "disconnected")
# Per provider, from its /status entry: metric name suffix → the entry's field.
PROVIDER_GAUGES = (
    ("capacity", "capacity", "Concurrent leases the provider grants (0 when not available)."),
    ("long_capacity", "long_capacity", "Of those, leases for long prompts."),
    ("in_flight", "in_flight", "Leases held now."),
    ("long_in_flight", "long_in_flight", "Leases for long prompts held now."),
    ("queued", "queued", "Requests waiting in the queue for this provider."),
    ("long_queued", "long_queued", "Long-prompt requests waiting for this provider."),
)


def _node_event_kind(kind: NodeEventKind) -> str:
    return kind.value.removeprefix("node.")


if TYPE_CHECKING:  # the sources StateCollector reads (kept beside it)
    from iop.edge.pool import PoolStats
    from iop.edge.registry import RegistryStats

# A dispatcher's ends per (node_id, kind).
TerminalStats = Callable[[], dict[tuple[str, str], int]]
# A count per node_id.
NodeCounts = Callable[[], dict[str, int]]
# The node listener's refused TLS handshakes per reason (TLSRefusals.stats).
RefusalStats = Callable[[], dict[str, int]]


class BudgetCollector(Collector):
    """
    The client keys' budgets, read at scrape time from the accounting's standing
    (:meth:`~iop.edge.quota.QuotaGate.standing`): per subject (``key:<name>``,
    ``team:<name>``), period and unit (``tokens``, or ``cost`` in units of ``usage.currency``),
    the budget, what is used and what remains. An Edge alone answers at once (the scrape shows
    now); a cluster's counters come from Redis, so a scrape shows them as the previous scrape
    (or the last one that could read them) found them.
    """

    def __init__(self, standing: Callable[[], Deferred[list[dict[str, Any]]]]) -> None:
        self._standing = standing
        self._last: list[dict[str, Any]] = []

    def _keep(self, keys: list[dict[str, Any]]) -> None:
        self._last = keys

    def collect(self) -> Iterator[Metric]:
        self._standing().addCallbacks(self._keep, lambda failure: None)
        labels = ["subject", "period", "unit"]
        families = {
            name: GaugeMetricFamily(f"iop_key_budget_{name}", what, labels=labels)
            for name, what in (
                ("limit", "A client key's or team's budget for its period."),
                ("used", "What the budget's current period has used (running requests at "
                 "their worst case)."),
                ("remaining", "What the budget's current period has left."),
            )
        }  # fmt: skip
        for key in self._last:
            for subject in key["subjects"]:
                for budget in subject["budgets"]:
                    for unit, field, scale in (
                        ("tokens", "tokens", 1),
                        ("cost", "cost_micros", MICROS_PER_UNIT),
                    ):
                        amount = budget[field]
                        if amount is None:
                            continue
                        values = [subject["subject"], budget["period"], unit]
                        for name, family in families.items():
                            family.add_metric(values, amount[name] / scale)
        yield from families.values()


class StateCollector(Collector):
    """
    Read at scrape time: gauges from the status snapshot, and the exact counters the Edge's
    parts keep as plain ints (the pool's leases and queue outcomes, the registry's
    registrations, reconnects, fences and refusals, the dispatchers' terminals). Each source
    lists its whole bounded label set, so a counter still at 0 is exposed.
    """

    def __init__(
        self,
        status_snapshot: Callable[[], dict[str, Any]],
        dropped: Callable[[], int],
        *,
        pool_stats: Callable[[], PoolStats] | None = None,
        registry_stats: Callable[[], RegistryStats] | None = None,
        tunnel_stats: TerminalStats | None = None,
        run_stats: TerminalStats | None = None,
        echo_stats: NodeCounts | None = None,
        tls_refusal_stats: RefusalStats | None = None,
        spans_dropped: Callable[[], int] | None = None,
    ) -> None:
        self._spans_dropped = spans_dropped
        self._snapshot = status_snapshot
        self._dropped = dropped
        self._pool_stats = pool_stats
        self._registry_stats = registry_stats
        self._tunnel_stats = tunnel_stats
        self._run_stats = run_stats
        self._echo_stats = echo_stats
        self._tls_refusal_stats = tls_refusal_stats

    def collect(self) -> Iterator[Metric]:
        yield from self._state()
        if self._pool_stats is not None:
            yield from self._pool(self._pool_stats())
        if self._registry_stats is not None:
            yield from self._registry(self._registry_stats())
        if self._tls_refusal_stats is not None:
            refused = CounterMetricFamily(
                "iop_node_tls_refused",
                "Node connections refused during the TLS handshake, by reason (no_certificate, "
                "unknown_ca, expired, not_yet_valid, wrong_usage, bad_certificate, peer_alert, "
                "protocol).",
                labels=["reason"],
            )
            for reason, value in self._tls_refusal_stats().items():
                refused.add_metric([reason], float(value))
            yield refused
        for name, source, what in (
            ("iop_tunnel_terminals", self._tunnel_stats, "Provider tunnels"),
            ("iop_run_terminals", self._run_stats, "Normalized runs"),
        ):
            if source is not None:
                family = CounterMetricFamily(
                    name, f"{what} ended on the Edge, by node and kind.", labels=["node", "kind"]
                )
                for (node, kind), value in source().items():
                    family.add_metric([node, kind], float(value))
                yield family
        if self._spans_dropped is not None:
            yield CounterMetricFamily(
                "iop_telemetry_spans_dropped",
                "Spans the trace exporter dropped: its queue was full (the OTLP receiver down "
                "or slower than the spans came).",
                value=float(self._spans_dropped()),
            )
        if self._echo_stats is not None:
            echoes = CounterMetricFamily(
                "iop_upstream_secret_echoes_redacted",
                "Managed mode: occurrences of a leased provider credential that an upstream "
                "echoed in a tunnel response and the node removed, by node.",
                labels=["node"],
            )
            for node, value in self._echo_stats().items():
                echoes.add_metric([node], float(value))
            yield echoes

    @staticmethod
    def _pool(stats: PoolStats) -> Iterator[Metric]:
        grants = CounterMetricFamily(
            "iop_lease_grants", "Provider leases granted.", labels=["provider", "node"]
        )
        for (provider, node), value in stats.lease_grants.items():
            grants.add_metric([provider, node], float(value))
        yield grants
        releases = CounterMetricFamily(
            "iop_lease_releases",
            "Provider leases returned: released by their holder, or fenced (their node's "
            "generation ended). Grants minus releases is the leases held.",
            labels=["provider", "node", "outcome"],
        )
        for (provider, node, outcome), value in stats.lease_releases.items():
            releases.add_metric([provider, node, outcome], float(value))
        yield releases
        outcomes = CounterMetricFamily(
            "iop_queue_outcomes",
            "Requests for a provider lease by how they ended: served (at once or after "
            "waiting), unavailable, timeout, overloaded, withdrawn.",
            labels=["model", "outcome"],
        )
        for (model, outcome), value in stats.queue_outcomes.items():
            outcomes.add_metric([model, outcome], float(value))
        yield outcomes
        entered = CounterMetricFamily(
            "iop_queue_entered",
            "Requests that waited in the queue (no candidate had room at once).",
            labels=["model"],
        )
        for model, value in stats.queue_entered.items():
            entered.add_metric([model], float(value))
        yield entered

    @staticmethod
    def _registry(stats: RegistryStats) -> Iterator[Metric]:
        for name, values, doc in (
            ("iop_node_registrations", stats.registrations, "Accepted node registrations."),
            (
                "iop_node_reconnects",
                stats.reconnects,
                "Registrations after an earlier session of the same node ended.",
            ),
            (
                "iop_node_fences",
                stats.fences,
                "Ready generations fenced (disconnect, heartbeat timeout, dropped connection).",
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["node"])
            for node, value in values.items():
                family.add_metric([node], float(value))
            yield family
        rejections = CounterMetricFamily(
            "iop_node_rejections",
            "Refused node registrations (and readies) by reject reason.",
            labels=["reason"],
        )
        for reason, value in stats.rejections.items():
            rejections.add_metric([reason], float(value))
        yield rejections

    def _state(self) -> Iterator[Metric]:
        snap = self._snapshot()
        gauges = {
            field: GaugeMetricFamily(f"iop_provider_{suffix}", doc, labels=["provider", "node"])
            for suffix, field, doc in PROVIDER_GAUGES
        }
        for entry in snap.get("providers", []):
            for field, family in gauges.items():
                family.add_metric([entry["id"], entry["node_id"]], float(entry[field]))
        yield from gauges.values()
        states = dict.fromkeys(NODE_STATES, 0)
        for node in snap.get("nodes", []):
            states[node["state"]] = states.get(node["state"], 0) + 1
        connections = GaugeMetricFamily(
            "iop_node_connections", "Configured nodes by connection state.", labels=["state"]
        )
        for state, count in states.items():
            connections.add_metric([state], float(count))
        yield connections
        yield CounterMetricFamily(
            "iop_event_bus_dropped_events",
            "Events the bus dropped for a subscriber that fell behind (the counters miss them).",
            value=float(self._dropped()),
        )
        cluster = snap.get("cluster")
        if cluster is not None:
            yield from self._cluster(cluster)

    @staticmethod
    def _cluster(view: dict[str, Any]) -> Iterator[Metric]:
        """In a cluster: the view across Edges
        (:meth:`~iop.edge.cluster.table.ClusterLeaseTable.view`)."""
        yield GaugeMetricFamily(
            "iop_cluster_redis_up",
            "1 when the cluster's Redis answered this Edge's last call, else 0 (grants refused).",
            value=1.0 if view["redis"] == "up" else 0.0,
        )
        held = GaugeMetricFamily(
            "iop_cluster_provider_in_flight",
            "Leases held on the provider by every Edge of the cluster (the shared table).",
            labels=["provider"],
        )
        for provider, counts in view["providers"].items():
            held.add_metric([provider], float(counts["in_flight"]))
        yield held
        queued = GaugeMetricFamily(
            "iop_cluster_edge_queued",
            "Requests waiting on each Edge of the cluster, as it last reported.",
            labels=["edge"],
        )
        for edge in view["edges"]:
            queued.add_metric([edge["id"]], float(edge["queued"]))
        yield queued
        yield CounterMetricFamily(
            "iop_cluster_leases_lost",
            "Leases this Edge lost (renewal not confirmed in time, or the table no longer had "
            "them): their requests were ended.",
            value=float(view["leases_lost"]),
        )


class EdgeMetrics:
    """The Edge's metrics: subscribe :meth:`observe` to the event bus, serve :meth:`render`."""

    def __init__(
        self,
        status_snapshot: Callable[[], dict[str, Any]],
        dropped: Callable[[], int] = lambda: 0,
        *,
        pool_stats: Callable[[], PoolStats] | None = None,
        registry_stats: Callable[[], RegistryStats] | None = None,
        tunnel_stats: TerminalStats | None = None,
        run_stats: TerminalStats | None = None,
        echo_stats: NodeCounts | None = None,
        tls_refusal_stats: RefusalStats | None = None,
        budgets: Callable[[], Deferred[list[dict[str, Any]]]] | None = None,
        spans_dropped: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        # provider id → gen_ai.provider.name (:meth:`use_config`).
        self._provider_names: dict[str, str] = {}
        registry = self.registry
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._requests = Counter(
            "iop_requests",
            "Finished client requests by where they ran, HTTP status and outcome (complete, "
            "error, cancelled, refused).",
            [*REQUEST_LABELS, "status", "outcome"],
            registry=registry,
        )
        self._client_errors = Counter(
            "iop_client_errors",
            "Client requests answered with an error status, by the error's code.",
            ["surface", "operation", "status", "code"],
            registry=registry,
        )
        self._request_errors = Counter(
            "iop_request_errors",
            "Client requests answered with an error status, by model, provider, node and the "
            "error's code (provider and node empty when it was never placed).",
            ["model", "provider", "node", "code"],
            registry=registry,
        )
        self._duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Generation requests: arrival to the end of the response.",
            [*REQUEST_LABELS, "status", *GENAI_LABELS, "error_type"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Successful streamed generations: arrival to the first streamed body byte.",
            [*REQUEST_LABELS, *GENAI_LABELS],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self._tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Successful streamed generations: time after the first token per further output "
            "token the provider reported.",
            [*REQUEST_LABELS, *GENAI_LABELS],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self._queue_wait = Histogram(
            "iop_queue_wait_seconds",
            "Requests placed by the provider pool: asking for a provider to getting one "
            "(0 when one was free).",
            ["model"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self._tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per request as the provider reported them, by type (input and output are "
            "the conventions'; reasoning is part of output and cached_input part of input).",
            ["model", "provider", "node", "type", *GENAI_LABELS, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self._operation = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "The Edge's call to its provider: dispatch to the end of the work on the node.",
            ["model", "provider", "node", *GENAI_LABELS, "error_type"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        # Per client key (and its team): what a team's keys used and cost, from the config's
        # key names (bounded), for dashboards and alerts on spend.
        self._key_requests = Counter(
            "iop_key_requests",
            "Finished generation requests per client key and team, by outcome.",
            ["key", "team", "outcome"],
            registry=registry,
        )
        self._key_tokens = Counter(
            "iop_key_tokens",
            "Tokens per client key and team as the provider reported them, by type (input is "
            "the whole prompt; cached_input and cache_write are parts of it; reasoning is part "
            "of output).",
            ["key", "team", "type"],
            registry=registry,
        )
        self._key_cost = Counter(
            "iop_key_cost",
            "What a client key's and team's requests cost at the models' prices, in units of "
            "usage.currency (requests whose cost is unknown add nothing).",
            ["key", "team"],
            registry=registry,
        )
        self._node_events = Counter(
            "iop_node_events",
            "Node lifecycle events by kind.",
            ["kind"],
            registry=registry,
        )
        for kind in NodeEventKind:
            self._node_events.labels(kind=_node_event_kind(kind))
        if budgets is not None:
            registry.register(BudgetCollector(budgets))
        registry.register(
            StateCollector(
                status_snapshot,
                dropped,
                pool_stats=pool_stats,
                registry_stats=registry_stats,
                tunnel_stats=tunnel_stats,
                run_stats=run_stats,
                echo_stats=echo_stats,
                tls_refusal_stats=tls_refusal_stats,
                spans_dropped=spans_dropped,
            )
        )

    def use_config(self, config: EdgeConfig) -> None:
        """The running config's providers: each one's ``gen_ai.provider.name`` (its kind)."""
        names: dict[str, str] = {}
        for node in config.nodes:
            kinds = {adapter.name: adapter.type for adapter in node.adapters}
            for provider in node.providers:
                kind = kinds.get(provider.adapter_instance or provider.adapter, provider.adapter)
                names[provider.id] = provider_name(kind)
        self._provider_names = names

    def observe(self, event: object) -> None:
        """The event bus subscriber."""
        if isinstance(event, RequestFinished):
            self._request_finished(event)
        elif isinstance(event, NodeEvent):
            self._node_events.labels(kind=_node_event_kind(event.kind)).inc()

    def _request_finished(self, event: RequestFinished) -> None:
        model = event.model or NO_MODEL
        where = (model, event.provider_id, event.node_id, event.operation, event.surface)
        status = str(event.status)
        self._child(self._requests, *where, status, event.outcome).inc()
        if event.status >= 400:
            code = event.error_code or "none"
            self._child(self._client_errors, event.surface, event.operation, status, code).inc()
            self._child(self._request_errors, model, event.provider_id, event.node_id, code).inc()
        if event.queue_wait is not None:
            self._child(self._queue_wait, model).observe(event.queue_wait)
        if event.operation not in GENERATE_OPERATIONS:
            return
        if event.key:
            self._per_key(event)
        genai = (
            operation_name(event.operation),
            self._provider_names.get(event.provider_id, ""),
            event.model,
        )
        error_type = status if event.status >= 400 or event.status == 0 else ""
        exemplar = {"trace_id": event.trace_id} if event.trace_id else None
        self._child(self._duration, *where, status, *genai, error_type).observe(
            event.duration, exemplar
        )
        if event.provider_duration is not None:
            self._child(
                self._operation, model, event.provider_id, event.node_id, *genai, error_type
            ).observe(event.provider_duration, exemplar)
        usage = event.usage
        ttft = event.time_to_first_token
        if event.outcome == "complete" and 200 <= event.status < 300 and ttft is not None:
            self._child(self._ttft, *where, *genai).observe(ttft, exemplar)
            if usage is not None and usage.output_tokens > 1:
                per_token = (event.duration - ttft) / (usage.output_tokens - 1)
                self._child(self._tpot, *where, *genai).observe(per_token)
        if usage is None:
            return
        counts = {
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "reasoning": usage.reasoning_tokens,
            "cached_input": usage.cached_input_tokens,
        }
        labels = (model, event.provider_id, event.node_id)
        for token_type, count in counts.items():
            if count is not None:
                self._child(self._tokens, *labels, token_type, *genai, token_type).observe(count)

    def _per_key(self, event: RequestFinished) -> None:
        key, team = event.key, event.team
        self._child(self._key_requests, key, team, event.outcome).inc()
        usage = event.usage
        if usage is not None:
            counts = {
                "input": usage.input_tokens,
                "output": usage.output_tokens,
                "cached_input": usage.cached_input_tokens,
                "cache_write": usage.cache_write_tokens,
                "reasoning": usage.reasoning_tokens,
            }
            for token_type, count in counts.items():
                if count:
                    self._child(self._key_tokens, key, team, token_type).inc(count)
        if event.cost_micros:
            self._child(self._key_cost, key, team).inc(event.cost_micros / MICROS_PER_UNIT)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per label set (labels are bounded)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def render(self) -> bytes:
        """The Prometheus text exposition of this Edge's registry."""
        return text_exposition(self.registry)

    def render_for(self, accept: str = "") -> tuple[bytes, str]:
        """
        This Edge's registry and its content type: OpenMetrics (exemplars included) when
        ``accept`` (the scrape's Accept header) asks for it, else the Prometheus text format.
        """
        if "application/openmetrics-text" in accept:
            return openmetrics_exposition(self.registry), OPENMETRICS_TYPE
        return text_exposition(self.registry), CONTENT_TYPE_LATEST
