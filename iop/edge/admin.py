# -*- test-case-name: iop.test.edge.test_admin_runs,iop.test.edge.test_tunnel -*-
"""
The small admin HTTP surface (Klein), loopback by default.

- ``GET /healthz``, ``GET /status``; ``GET /readyz``: readiness for a load balancer's health
  check — 200 ``{"status": "ready"}``, or 503 ``{"status": "draining"}`` while this Edge drains
  (it stops; ``/status`` then says ``edge.draining: true``). ``/healthz`` is liveness: 200 as
  long as the process answers, draining or not (a supervisor must not restart a draining Edge).
- ``GET /``, ``GET /console/<asset>``: the live web console; ``GET /events``: its Server-Sent
  Events stream off the event bus (:mod:`iop.edge.console`); 503 when this Edge has none.
- ``GET /metrics``: Prometheus text exposition of the Edge's own registry
  (:class:`~iop.edge.metrics.EdgeMetrics`); 503 when this Edge has none.
- ``GET /usage?key=&team=&model=&since=&until=&by=key|team|model|day``: this Edge's usage
  ledger totalled (:class:`~iop.usage.query.UsageQuery`: times ISO 8601, UTC unless they carry
  an offset; ``since`` inclusive, ``until`` exclusive), one row per group and currency, with the
  ledger's own counts (records waiting, dropped, failed); 400 naming a bad parameter, 503 when
  this Edge keeps no ledger.
- ``GET /limits``: every limited client key with its own and its team's limits and budgets
  beside their counters now (concurrent requests, the last minute's requests and tokens, each
  budget's period and use; costs in micro-units of ``usage.currency``) — how close each key is
  to each limit. 503 when a cluster's counters (Redis) cannot be read.
- ``POST /runs``: submit a normalized run (``{"model": ..., "input": ...}`` through
  ``openai.model_routes``, or ``{"adapter", "target", "node"?}`` directly) and stream its events
  back as NDJSON, one event per line, until the terminal event. A client that goes away cancels
  the run on its node.
  In managed mode a run on an adapter only a leased tunnel may reach (``openai_compat``,
  ``vllm``) is refused with 409 before anything is sent (normalized runs carry no credential
  lease); runs on ``ollama`` and ``cli`` adapters are served.
- ``GET /runs``: the active work: ``runs`` and provider ``tunnels``, each with the client
  request's id it serves (``request_id``, "" when none); ``DELETE /runs/<run_id>``: cancel a
  run.
- ``POST /nodes/<node_id>/commands``: ``{"type": "capabilities" | "transport" | "usage" |
  "sessions" | "ollama-tags" | "ollama-ps" | "ollama-show", "adapter"?, "target"?,
  "arguments"?}`` → the node's JSON answer.
- ``DELETE /nodes/<node_id>/sessions/<session_id>?adapter=A&target=T``: end a CLI session.
- ``POST /config/refresh``: ``{"mode": "dry_run" | "apply"}`` (no body, or no ``mode``:
  ``dry_run``, which changes nothing) reads the Edge's config file again and answers the refresh
  result document (:class:`~iop.edge.refresh.report.RefreshResult`) as JSON with 200 for
  every result (``applied``, ``restart_required`` and ``rejected`` alike: the request was
  served, the document says what became of the candidate; an unknown mode is a ``rejected``
  document). 400: the body is not a JSON object, ``mode`` is not a string or an unknown field
  is given; 503: this Edge has no refresher.
- ``POST /tunnels`` (debug, until the client HTTP ingress exists): ``{"node"?, "adapter",
  "target", "operation", "body"?: {...}, "stream"?: bool, "method"?, "headers"?: {...},
  "timeout_sec"?}`` opens a provider raw tunnel (no node: the single-node fallback) and streams
  the provider's raw body back with its status and content type. The body sent is ``body`` with
  ``model`` set to ``target`` (and, for chat_completions/responses/messages, ``stream`` set to
  the flag). A client that goes away cancels the tunnel; an error after the response started
  aborts the connection, so the client sees a truncated body rather than a clean end.
  Refused with 409 in managed mode: these tunnels carry no credential lease.

Runs and tunnels reach the client through the client surfaces' relay
(:func:`iop.edge.ingress.relay.relay`), with the NDJSON stream (:class:`NdjsonStream`) or a
passthrough as its transform; a pooled run holds its placement through
:func:`~iop.edge.ingress.relay.with_placement`, which releases it once the run has ended.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource

from iop.edge.commands import NodeCommander, SessionTermination
from iop.edge.console.assets import PAGE, render_asset
from iop.edge.console.stream import ConsoleEvents
from iop.edge.errors import CommandFailed, DispatchError, LeaseRequired, NodeUnavailable, NoRoute
from iop.edge.gateway import EdgeGateway, Placement
from iop.edge.ingress.errors import ApiError
from iop.edge.ingress.relay import (
    Exchange,
    Head,
    PassThrough,
    RunSource,
    TunnelSource,
    relay,
    with_placement,
)
from iop.edge.metrics import EdgeMetrics
from iop.edge.quota import QuotaGate, QuotaUnavailable
from iop.edge.refresh.report import RefreshResult
from iop.edge.refresh.service import ConfigRefresher
from iop.edge.runs import RunDispatcher, RunHandle
from iop.edge.tunnel import TunnelDispatcher
from iop.runtime.events import RuntimeEvent
from iop.runtime.kinds import GENERATE_OPERATIONS
from iop.usage.ledger import UsageLedger
from iop.usage.query import UsageQuery


def _json(request: IRequest, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body, indent=2).encode() + b"\n"


def _error(request: IRequest, code: int, message: str) -> bytes:
    return _json(request, {"error": {"message": message, "code": code}}, code)


def event_json(handle: RunHandle, event: RuntimeEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": handle.run_id, "type": event.type.value}
    if event.delta:
        out["delta"] = event.delta
    if event.error:
        out["error"] = event.error
    if event.usage is not None:
        out["usage"] = event.usage.as_dict()
    if event.metadata:
        out["metadata"] = dict(event.metadata)
    if event.session_id:
        out["session_id"] = event.session_id
    return out


def _api_error(request: IRequest, error: ApiError) -> bytes:
    for name, value in error.headers:
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
    return _error(request, error.status, error.message)


class NdjsonStream:
    """The relay transform of a run streamed as NDJSON: one event per line, from the first."""

    def __init__(self, handle: RunHandle) -> None:
        self._handle = handle

    def head(self, start: RuntimeEvent) -> Head:
        return Head(200, "application/x-ndjson", [("x-iop-run-id", self._handle.run_id)])

    def feed(self, item: RuntimeEvent) -> bytes:
        return json.dumps(event_json(self._handle, item)).encode() + b"\n"

    def end(self, ending: RuntimeEvent) -> bytes:
        return b""


_RUN_FIELDS = {
    "model": str,
    "adapter": str,
    "target": str,
    "node": str,
    "input": str,
    "workspace": str,
    "session_id": str,
    "timeout_sec": int,
    "max_tokens": int,
    "metadata": dict,
}


_TUNNEL_FIELDS = {
    "node": str,
    "adapter": str,
    "target": str,
    "operation": str,
    "method": str,
    "body": dict,
    "stream": bool,
    "headers": dict,
    "timeout_sec": int,
}
# The wire carries these integers as uint32.
_UINT32_MAX = 2**32 - 1
# Operations whose request body carries ``stream``: the protocol drivers' generating operations.
_STREAMING_OPERATIONS = GENERATE_OPERATIONS


class AdminApp:
    app = Klein()
    log = Logger()

    def __init__(
        self,
        status_snapshot: Callable[[], dict[str, Any]],
        runs: RunDispatcher | None = None,
        commands: NodeCommander | None = None,
        tunnels: TunnelDispatcher | None = None,
        gateway: EdgeGateway | None = None,
        refresher: ConfigRefresher | None = None,
        metrics: EdgeMetrics | None = None,
        console: ConsoleEvents | None = None,
        usage: UsageLedger | None = None,
        limits: QuotaGate | None = None,
    ) -> None:
        self._snapshot = status_snapshot
        self._usage = usage
        self._limits = limits
        self._console = console
        self._metrics = metrics
        self._refresher = refresher
        self._runs = runs
        self._commands = commands
        self._tunnels = tunnels
        self._gateway = gateway

    @app.route("/nodes/<string:node_id>/commands", methods=["POST"])
    def node_command(self, request: IRequest, node_id: str) -> bytes | Deferred[bytes]:
        if self._commands is None:
            return _error(request, 503, "node commands are not available on this edge")
        try:
            body = json.loads(request.content.read() or b"{}")  # type: ignore[attr-defined]
        except ValueError:
            return _error(request, 400, "request body must be JSON")
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return _error(request, 400, "'type' is required")
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            return _error(request, 400, "'arguments' must be an object")
        try:
            d = self._commands.command(
                node_id,
                body["type"],
                adapter=str(body.get("adapter", "")),
                target=str(body.get("target", "")),
                arguments={str(k): str(v) for k, v in arguments.items()},
            )
        except NoRoute as e:
            return _error(request, 400, str(e))
        except NodeUnavailable as e:
            return _error(request, 503, str(e))

        def failed(failure: Failure) -> bytes:
            if failure.check(CommandFailed):
                return _error(request, 502, str(failure.value))
            if failure.check(TimeoutError, defer.TimeoutError):
                return _error(request, 504, "the node did not answer in time")
            return failure  # type: ignore[return-value]

        return d.addCallbacks(lambda result: _json(request, result), failed)

    @app.route("/nodes/<string:node_id>/sessions/<string:session_id>", methods=["DELETE"])
    def terminate_session(
        self, request: IRequest, node_id: str, session_id: str
    ) -> bytes | Deferred[bytes]:
        if self._commands is None:
            return _error(request, 503, "node commands are not available on this edge")
        args = request.args  # type: ignore[attr-defined]
        adapter = (args.get(b"adapter") or [b""])[0].decode()
        target = (args.get(b"target") or [b""])[0].decode()
        if not adapter:
            return _error(request, 400, "query parameter 'adapter' is required")
        try:
            d = self._commands.terminate_session(node_id, adapter, target, session_id)
        except NoRoute as e:
            return _error(request, 409, str(e))
        except NodeUnavailable as e:
            return _error(request, 503, str(e))

        def answered(response: SessionTermination) -> bytes:
            if not response.ok:
                return _error(request, 404, response.reason or "no such session")
            return _json(request, {"session_id": session_id, "terminated": True})

        def failed(failure: Failure) -> bytes:
            if failure.check(CommandFailed):
                return _error(request, 502, str(failure.value))
            if failure.check(defer.TimeoutError):
                return _error(request, 504, "the node did not answer in time")
            return failure  # type: ignore[return-value]

        return d.addCallbacks(answered, failed)

    @app.route("/config/refresh", methods=["POST"])
    def config_refresh(self, request: IRequest) -> bytes | Deferred[bytes]:
        if self._refresher is None:
            return _error(request, 503, "config refresh is not available on this edge")
        raw = request.content.read()  # type: ignore[attr-defined]
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _error(request, 400, "request body must be JSON")
        if not isinstance(body, dict):
            return _error(request, 400, "request body must be a JSON object")
        unknown = sorted(set(body) - {"mode"})
        if unknown:
            return _error(request, 400, f"unknown field {unknown[0]!r}")
        mode = body.get("mode", "dry_run")
        if not isinstance(mode, str):
            return _error(request, 400, "'mode' must be a string")

        def answered(result: RefreshResult) -> bytes:
            return _json(request, result.as_dict())

        return self._refresher.refresh(mode, trigger="admin API").addCallback(answered)

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: IRequest) -> bytes:
        if self._metrics is None:
            return _error(request, 503, "metrics are not available on this edge")
        accept = request.getHeader(b"accept") or b""
        body, content_type = self._metrics.render_for(accept.decode("latin-1"))
        request.setHeader(b"content-type", content_type.encode())
        request.setHeader(b"cache-control", b"no-store")
        return body

    @app.route("/", methods=["GET"])
    def console_page(self, request: IRequest) -> bytes:
        return render_asset(request, PAGE)

    @app.route("/console/<string:name>", methods=["GET"])
    def console_asset(self, request: IRequest, name: str) -> bytes:
        return render_asset(request, name)

    @app.route("/events", methods=["GET"])
    def console_events(self, request: IRequest) -> bytes | IResource:
        if self._console is None:
            return _error(request, 503, "the console event stream is not available on this edge")
        return self._console.resource()

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: IRequest) -> bytes:
        return _json(request, {"status": "ok"})

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        edge = self._snapshot().get("edge") or {}
        if edge.get("draining"):
            return _json(request, {"status": "draining"}, 503)
        return _json(request, {"status": "ready"})

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        return _json(request, self._snapshot())

    @app.route("/usage", methods=["GET"])
    def usage(self, request: IRequest) -> bytes | Deferred[bytes]:
        ledger = self._usage
        if ledger is None:
            return _error(request, 503, "this edge keeps no usage ledger (usage.ledger)")
        params: dict[str, str] = {}
        for name, values in request.args.items():  # type: ignore[attr-defined]
            key = name.decode("utf-8", "replace")
            if len(values) != 1:
                return _error(request, 400, f"query parameter {key!r} given more than once")
            params[key] = values[0].decode("utf-8", "replace")
        try:
            query = UsageQuery.from_params(params)
        except ValueError as e:
            return _error(request, 400, str(e))
        edge = (self._snapshot().get("edge") or {}).get("id", "")

        def answer(rows: list[Any]) -> bytes:
            return _json(
                request,
                {
                    "edge": edge,
                    "currency": ledger.currency,
                    "query": query.as_json(),
                    "rows": [row.as_json() for row in rows],
                    "ledger": ledger.stats(),
                },
            )

        def failed(failure: Failure) -> bytes:
            self.log.failure("GET /usage failed", failure)
            return _error(request, 503, "the usage ledger could not be read")

        return ledger.totals(query).addCallbacks(answer, failed)

    @app.route("/limits", methods=["GET"])
    def limits(self, request: IRequest) -> bytes | Deferred[bytes]:
        gate = self._limits
        if gate is None:
            return _error(request, 503, "this edge counts no key limits")
        edge = (self._snapshot().get("edge") or {}).get("id", "")

        def answer(keys: list[dict[str, Any]]) -> bytes:
            return _json(request, {"edge": edge, "keys": keys})

        def failed(failure: Failure) -> bytes:
            if failure.check(QuotaUnavailable):
                return _error(request, 503, "the cluster's counters cannot be read (Redis)")
            self.log.failure("GET /limits failed", failure)
            return _error(request, 503, "the key limits could not be read")

        return gate.standing().addCallbacks(answer, failed)

    @app.route("/runs", methods=["GET"])
    def list_runs(self, request: IRequest) -> bytes:
        runs = self._runs.active() if self._runs else []
        tunnels = self._tunnels.active() if self._tunnels else []
        return _json(
            request,
            {
                "runs": [
                    {
                        "run_id": h.run_id,
                        "node_id": h.node_id,
                        "adapter": h.adapter,
                        "target": h.target,
                        "request_id": h.request_id,
                    }
                    for h in runs
                ],
                "tunnels": [
                    {
                        "run_id": t.run_id,
                        "node_id": t.node_id,
                        "adapter": t.adapter,
                        "target": t.target,
                        "operation": t.operation,
                        "request_id": t.request_id,
                    }
                    for t in tunnels
                ],
            },
        )

    @app.route("/runs/<string:run_id>", methods=["DELETE"])
    def cancel_run(self, request: IRequest, run_id: str) -> bytes:
        if self._runs is None or not self._runs.cancel_run(run_id, "cancelled by operator"):
            return _error(request, 404, f"no active run {run_id!r}")
        return _json(request, {"run_id": run_id, "cancel_requested": True}, 202)

    @app.route("/runs", methods=["POST"])
    def submit_run(self, request: IRequest) -> bytes | Deferred[bytes]:
        if self._runs is None:
            return _error(request, 503, "runs are not available on this edge")
        try:
            body = json.loads(request.content.read() or b"{}")  # type: ignore[attr-defined]
        except ValueError:
            return _error(request, 400, "request body must be JSON")
        problem = _check_run_body(body)
        if problem:
            return _error(request, 400, problem)
        options: dict[str, Any] = {
            "input": body["input"],
            "node_id": body.get("node"),
            "workspace": body.get("workspace", ""),
            "session_id": body.get("session_id", ""),
            "timeout_sec": body.get("timeout_sec", 0),
            "max_tokens": body.get("max_tokens", 0),
            "metadata": {str(k): str(v) for k, v in body.get("metadata", {}).items()},
        }
        gateway = self._gateway
        if "model" in body and gateway is not None and gateway.model(body["model"]) is not None:
            return Deferred.fromCoroutine(
                self._submit_pooled(request, gateway, body["model"], options)
            )
        try:
            if "model" in body:
                handle = self._runs.submit_model_run(body["model"], **options)
            else:
                handle = self._runs.submit_run(
                    adapter=body["adapter"], target=body["target"], **options
                )
        except NoRoute as e:
            return _error(request, 404, str(e))
        except NodeUnavailable as e:
            return _error(request, 503, str(e))
        except LeaseRequired as e:
            return _error(request, 409, str(e))
        except DispatchError as e:
            return _error(request, 400, str(e))
        return Deferred.fromCoroutine(
            relay(Exchange(request), NdjsonStream(handle), RunSource(handle))
        )

    async def _submit_pooled(
        self, request: IRequest, gateway: EdgeGateway, model: str, options: dict[str, Any]
    ) -> bytes:
        """
        A ``models[]`` key: take a provider lease from the pool (waiting in its queue when every
        candidate is busy), then run it as a normalized run on the chosen provider. This debug
        surface always uses the normalized run path, whatever the provider type.
        """
        options.pop("node_id", None)
        prompt_tokens = (len(options["input"]) + 3) // 4
        exchange = Exchange(request)

        async def answer(placement: Placement) -> bytes:
            try:
                handle = gateway.run(placement, **options)
            except LeaseRequired as e:
                return _error(request, 409, str(e))
            except DispatchError as e:
                return _error(request, 503, str(e))
            return await relay(exchange, NdjsonStream(handle), RunSource(handle))

        try:
            return await with_placement(gateway, exchange, model, prompt_tokens, answer)
        except ApiError as e:
            return _api_error(request, e)

    @app.route("/tunnels", methods=["POST"])
    def open_tunnel(self, request: IRequest) -> bytes | Deferred[bytes]:
        if self._tunnels is None or self._runs is None:
            return _error(request, 503, "provider tunnels are not available on this edge")
        if self._runs.routes.config.security.managed:
            return _error(
                request,
                409,
                "managed mode: debug tunnels carry no credential lease and a managed node"
                " refuses them; use the client API",
            )
        try:
            body = json.loads(request.content.read() or b"{}")  # type: ignore[attr-defined]
        except ValueError:
            return _error(request, 400, "request body must be JSON")
        problem = _check_tunnel_body(body)
        if problem:
            return _error(request, 400, problem)
        operation: str = body["operation"]
        stream = bool(body.get("stream", False))
        payload = dict(body.get("body", {}))
        payload["model"] = body["target"]
        if operation in _STREAMING_OPERATIONS:
            payload["stream"] = stream
        method = body.get("method") or ("GET" if operation == "models" else "POST")
        headers = [("accept", "text/event-stream" if stream else "application/json")]
        if method != "GET":
            headers.insert(0, ("content-type", "application/json"))
        headers += [(str(k), str(v)) for k, v in body.get("headers", {}).items()]
        exchange = Exchange(request)
        try:
            node = self._runs.routes.choose_node(body.get("node"))
            tunnel = self._tunnels.open(
                node,
                adapter=body["adapter"],
                target=body["target"],
                operation=operation,
                method=method,
                headers=headers,
                body=json.dumps(payload).encode() if method != "GET" else b"",
                stream=stream,
                timeout_sec=body.get("timeout_sec", 0),
            )
        except NoRoute as e:
            return _error(request, 404, str(e))
        except NodeUnavailable as e:
            return _error(request, 503, str(e))
        except DispatchError as e:
            return _error(request, 400, str(e))
        passthrough = PassThrough(
            keep=frozenset({"content-type"}),
            default_type=None,
            headers=[("x-iop-run-id", tunnel.run_id)],
        )
        return Deferred.fromCoroutine(self._relay(exchange, passthrough, TunnelSource(tunnel)))

    async def _relay(
        self, exchange: Exchange, passthrough: PassThrough, source: TunnelSource
    ) -> bytes:
        try:
            return await relay(exchange, passthrough, source)
        except ApiError as e:
            return _api_error(exchange.request, e)

    @app.handle_errors(Exception)
    def error(self, request: IRequest, failure: Any) -> bytes:
        from werkzeug.exceptions import HTTPException

        exc = failure.value
        if isinstance(exc, HTTPException):
            return _error(request, exc.code or 500, exc.description or exc.name)
        self.log.failure("admin request failed", failure)
        return _error(request, 500, "internal error")

    def resource(self) -> IResource:
        return self.app.resource()  # type: ignore[no-any-return]


def _check_tunnel_body(body: Any) -> str:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for key, value in body.items():
        kind = _TUNNEL_FIELDS.get(key)
        if kind is None:
            return f"unknown field {key!r}"
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{key!r} must be a {kind.__name__}"
        if isinstance(value, int) and not 0 <= value <= _UINT32_MAX:
            return f"{key!r} must be >= 0" if value < 0 else f"{key!r} must be <= {_UINT32_MAX}"
    for key in ("adapter", "target", "operation"):
        if not body.get(key):
            return f"{key!r} is required"
    if body.get("timeout_sec", 0) < 0:
        return "'timeout_sec' must be >= 0"
    return ""


def _check_run_body(body: Any) -> str:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for key, value in body.items():
        kind = _RUN_FIELDS.get(key)
        if kind is None:
            return f"unknown field {key!r}"
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{key!r} must be a {kind.__name__}"
        if isinstance(value, int) and not 0 <= value <= _UINT32_MAX:
            return f"{key!r} must be >= 0" if value < 0 else f"{key!r} must be <= {_UINT32_MAX}"
    if "input" not in body:
        return "'input' is required"
    if "model" in body:
        if "adapter" in body or "target" in body:
            return "give either 'model' or 'adapter' + 'target', not both"
    elif not ("adapter" in body and "target" in body):
        return "give 'model', or 'adapter' and 'target'"
    return ""
