"""
Traces: the OpenTelemetry side of IOP, shared by the Edge and the Node (it imports neither).

- :mod:`.semconv`: the names of the attributes IOP sets (OpenTelemetry's GenAI and HTTP
  semantic conventions), and the provider names per adapter kind, in one place;
- :mod:`.tracing`: :class:`~.tracing.Tracing`, what the daemons' parts are handed: on (a
  tracer, and whether message contents may be recorded) or :data:`~.tracing.TRACING_OFF`, on
  which every call returns at once and nothing is allocated;
- :mod:`.propagation`: W3C trace context into and out of a string map (the Edge-Node wire's
  request metadata, an upstream request's headers, a client's headers);
- :mod:`.provider`: ``build(config, ...)``: the SDK's TracerProvider, its bounded batch
  processor (drops counted) and the OTLP/HTTP exporter, and the service that flushes it on
  stop.

Without a ``telemetry:`` section the daemons build nothing here but :data:`TRACING_OFF`.
"""
