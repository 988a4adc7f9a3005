# -*- test-case-name: iop.test.telemetry.test_provider -*-
"""
``build(config, default_service, reactor)``: a daemon's tracing from its ``telemetry:`` section.

Without the section: :data:`~iop.telemetry.tracing.TRACING_OFF` and nothing else — no
TracerProvider, no exporter, no thread, no service.

With it: the SDK's ``TracerProvider`` (resource ``service.name``: ``telemetry.service_name``, by
default ``iop-edge`` / ``iop-node``; ``service.version``), sampling parent-based on a trace-id
ratio (a client's or the Edge's sampled ``traceparent`` is followed, new traces are sampled at
``sampling_ratio``), one ``BatchSpanProcessor`` and the official OTLP/HTTP exporter
(``opentelemetry-exporter-otlp-proto-http``) to ``telemetry.endpoint`` with its headers.

Never blocking the reactor: ending a span only appends it to the processor's bounded queue (a
``deque``, no lock held across I/O); the processor's own worker thread encodes each batch
(protobuf) and POSTs it with the exporter's blocking HTTP client, retries included. Chosen over
an exporter on Twisted's HTTP client (treq): the SDK's exporter is the maintained one, and on
the worker thread the batch's encoding costs the reactor nothing either, where a treq exporter
would encode on the reactor thread. When the queue is full (the receiver down or slower than
the spans come) a new span is dropped and counted (:attr:`Telemetry.dropped`: the Edge's
``iop_telemetry_spans_dropped_total``; one warning a minute in either daemon's log while it
grows); the SDK's own per-span "queue full" warning is silenced for that reason.

Stopping: :class:`TelemetryService` flushes what is queued within
``telemetry.shutdown_timeout_sec`` (the processor's shutdown, on a reactor thread-pool thread),
then the daemon goes on stopping whatever the receiver does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from iop import __version__
from iop.telemetry.tracing import TRACING_OFF, Tracing

if TYPE_CHECKING:
    # Imported by build() only when there is a telemetry: section: a daemon without one never
    # loads the SDK, its exporter or their HTTP client.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

__all__ = ["DROP_WARNING_INTERVAL_SEC", "Telemetry", "TelemetryService", "build"]

# How often a growing drop count is logged (one line per interval, not one per span).
DROP_WARNING_INTERVAL_SEC = 60.0
# Spans per export request (the SDK's default).
_BATCH_SIZE = 512
# How long spans wait in the queue before a batch goes anyway.
_SCHEDULE_DELAY_MS = 1000.0
# The SDK logs this (a warning per dropped span): IOP counts and logs drops itself.
_SDK_QUEUE_LOGGER = "opentelemetry.sdk._shared_internal"

log = Logger()


class _Secret(Protocol):
    def reveal(self) -> str: ...


class TelemetryConfig(Protocol):
    """
    What :func:`build` reads of ``telemetry:`` (``iop.config.model.TelemetryConfig``; not
    imported: the shared configuration reads the runtime vocabulary, which hands adapters their
    :class:`Tracing`).
    """

    @property
    def endpoint(self) -> str: ...
    @property
    def headers(self) -> tuple[tuple[str, _Secret], ...]: ...
    @property
    def sampling_ratio(self) -> float: ...
    @property
    def service_name(self) -> str: ...
    @property
    def capture_content(self) -> bool: ...
    @property
    def queue_size(self) -> int: ...
    @property
    def export_timeout_sec(self) -> float: ...
    @property
    def shutdown_timeout_sec(self) -> float: ...


class _DropCounter:
    """
    The batch processor's metrics hook: counts the spans it drops (queue full, or after
    shutdown), then hands every call on to the SDK's own (its optional internal metrics).
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.dropped = 0

    def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
        self._inner.register_queue_size(get_queue_size)

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        self.dropped += count
        self._inner.drop_items(count, error_type)

    def finish_items(self, count: int) -> None:
        self._inner.finish_items(count)


def _counted(processor: BatchSpanProcessor) -> _DropCounter | None:
    """Install a :class:`_DropCounter` in ``processor`` (None if the SDK's shape changed)."""
    inner = getattr(processor, "_batch_processor", None)
    metrics = getattr(inner, "_metrics", None)
    if inner is None or metrics is None:
        return None
    counter = _DropCounter(metrics)
    inner._metrics = counter
    return counter


@dataclass
class Telemetry:
    """
    What :func:`build` made: the daemon's :class:`Tracing` and, with ``telemetry:``, the
    provider and the service that flushes it on stop.
    """

    tracing: Tracing = TRACING_OFF
    provider: TracerProvider | None = None
    processor: BatchSpanProcessor | None = None
    service: TelemetryService | None = None
    _counter: _DropCounter | None = field(default=None, repr=False)

    @property
    def dropped(self) -> int:
        """Spans dropped so far (the export queue was full): 0 without telemetry."""
        return self._counter.dropped if self._counter is not None else 0


def build(
    config: TelemetryConfig | None,
    default_service: str,
    reactor: IReactorTime,
    exporter: SpanExporter | None = None,
) -> Telemetry:
    """
    The daemon's telemetry from ``config`` (None: off, nothing built). ``exporter`` replaces
    the OTLP/HTTP one (tests: the SDK's in-memory exporter).
    """
    if config is None:
        return Telemetry()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create(
        {
            "service.name": config.service_name or default_service,
            "service.version": __version__,
        }
    )
    provider = TracerProvider(
        resource=resource,
        sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio)),
        # The daemon's service flushes on stop, within its bound; an atexit hook would wait
        # the SDK's 30 s on a receiver that is down.
        shutdown_on_exit=False,
    )
    if exporter is None:
        exporter = OTLPSpanExporter(
            endpoint=config.endpoint,
            headers={name: value.reveal() for name, value in config.headers},
            timeout=config.export_timeout_sec,
        )
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=config.queue_size,
        schedule_delay_millis=_SCHEDULE_DELAY_MS,
        max_export_batch_size=min(_BATCH_SIZE, config.queue_size),
    )
    counter = _counted(processor)
    logging.getLogger(_SDK_QUEUE_LOGGER).setLevel(logging.ERROR)
    provider.add_span_processor(processor)
    tracing = Tracing(provider.get_tracer("iop", __version__), config.capture_content)
    telemetry = Telemetry(tracing, provider, processor, None, counter)
    telemetry.service = TelemetryService(telemetry, config, reactor)
    log.info(
        "traces: exporting to {endpoint} as {service_name}, sampling {ratio:g}",
        endpoint=config.endpoint,
        service_name=config.service_name or default_service,
        ratio=config.sampling_ratio,
    )
    return telemetry


class TelemetryService(Service):
    """
    Logs a growing drop count (once per :data:`DROP_WARNING_INTERVAL_SEC`) while running, and
    on stop flushes the queue within ``shutdown_timeout_sec``.
    """

    name = "telemetry"

    def __init__(
        self, telemetry: Telemetry, config: TelemetryConfig, reactor: IReactorTime
    ) -> None:
        self._telemetry = telemetry
        self._config = config
        self._reactor = reactor
        self._reported = 0
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        loop = LoopingCall(self.report_drops)
        loop.clock = self._reactor
        loop.start(DROP_WARNING_INTERVAL_SEC, now=False)
        self._loop = loop

    def report_drops(self) -> None:
        """One warning when spans were dropped since the last report."""
        dropped = self._telemetry.dropped
        if dropped > self._reported:
            log.warn(
                "traces: {count} span(s) dropped since the last report ({total} in all): the"
                " export queue ({queue_size}) was full; is {endpoint} up and keeping up?",
                count=dropped - self._reported,
                total=dropped,
                queue_size=self._config.queue_size,
                endpoint=self._config.endpoint,
            )
            self._reported = dropped

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        processor = self._telemetry.processor
        if processor is None:
            return succeed(None)
        bound_ms = int(self._config.shutdown_timeout_sec * 1000)

        def shutdown() -> None:
            inner = getattr(processor, "_batch_processor", None)
            if inner is not None:
                # BatchSpanProcessor.shutdown() would wait the SDK's default 30 s.
                inner.shutdown(timeout_millis=bound_ms)
            else:
                processor.shutdown()

        reactor = self._reactor
        if not IReactorThreads.providedBy(reactor):
            shutdown()
            self.report_drops()
            return succeed(None)
        d: Deferred[None] = deferToThreadPool(reactor, reactor.getThreadPool(), shutdown)  # type: ignore[attr-defined]
        # The processor bounds its own wait; this bounds the reactor's on the thread.
        d.addTimeout(self._config.shutdown_timeout_sec + 1.0, reactor)  # type: ignore[arg-type]
        d.addErrback(
            lambda failure: log.warn(
                "traces: flushing on stop did not finish: {error}", error=failure.getErrorMessage()
            )
        )
        d.addBoth(lambda _: self.report_drops())
        return d
