# -*- test-case-name: iop.test.cli.test_status_cli -*-
"""
``iop status``: the running Edge's nodes, providers and client models (``GET /status`` on its
admin listener) as three headed tables, or with ``--json`` the snapshot as the Edge sent it
(:mod:`iop.edge.status` documents it; the keys are :data:`JSON_DOCUMENT`).

What the tables show, decided for an operator reading them at a glance: a node that is not
connected says since when (``down since 2026-05-01 14:02:11Z (12m ago)``, or ``never
connected`` when it was not ready once since the Edge started) and why it was last refused; a
provider's load is ``IN FLIGHT/CAPACITY`` (``1/4``: one of four leases held), and ``-`` when it
takes no requests (its node is down or it is disabled: its capacity is 0 then, and ``0/0``
would read as full); long-prompt leases have their own column, ``-`` when the provider has no
long capacity. The models table is every model a client may name, whether a request for it can
be served now (how many of its providers are available), and where it goes.

Also the read side every admin-listener command shares: :func:`get_document` (GET a JSON
object, or a :class:`~iop.cli.command.CommandError` naming the URL and the Edge's message) and
:func:`add_admin_argument` (``--admin URL``, else ``$IOP_ADMIN``, else the default of
:func:`iop.cli.config.admin_url`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from iop.cli.command import CommandError, Report, add_json_argument
from iop.cli.config import ADMIN_ENV, DEFAULT_ADMIN, admin_headers, admin_url

#: What ``iop status --json`` prints (GET /status as the Edge answered it).
JSON_DOCUMENT = (
    '{"edge": {"id", "mode", "draining", "draining_since_unix_ms"}, "nodes": [{"id", "alias", '
    '"connected", "state", "identity", "last_refusal", "down_since_unix_ms", '
    '"draining_since_unix_ms", "providers"}], "providers": [{"id", "node_id", '
    '"adapter", "type", "category", "models", "enabled", "priority", "status", "health", '
    '"capacity", "long_capacity", "in_flight", "long_in_flight", "queued", "long_queued"}], '
    '"models": [{"id", "available", "providers": [{"provider_id", "target", "status"}]}], '
    '"routes": [{"model", "node_id", "adapter", "target", "available"}], "cluster"?}'
)
#: Now, in Unix seconds (how long ago a node went down).
now: Callable[[], float] = time.time

#: A GET of an admin route answers within this many seconds.
TIMEOUT_SEC = 30.0

#: GET ``url``; the HTTP status and the response body. Raises OSError when there is no answer.
Get = Callable[[str, float], tuple[int, bytes]]


def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """The default :data:`Get`, with the standard library's HTTP client; it sends the admin
    token of ``$IOP_ADMIN_TOKEN`` when one is set (``admin.auth``)."""
    headers = {"accept": "application/json", **admin_headers(None)}
    request = urllib.request.Request(url, method="GET", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), e.read()


def add_admin_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        metavar="URL",
        default=None,
        help=f"the Edge's admin listener (default: ${ADMIN_ENV}, else {DEFAULT_ADMIN})",
    )


def unreachable(url: str, error: OSError) -> CommandError:
    reason = getattr(error, "reason", None) or error.strerror or type(error).__name__
    return CommandError(f"cannot reach the Edge admin listener at {url}: {reason}")


def answer_document(url: str, status: int, raw: bytes) -> dict[str, Any]:
    """The JSON object of a 200 answer, else a CommandError with the Edge's error message."""
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    if status != 200 or not isinstance(document, dict):
        message = ""
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            message = str(document["error"].get("message", ""))
        raise CommandError(f"{url} answered HTTP {status}" + (f": {message}" if message else ""))
    return document


def get_document(admin: str | None, route: str) -> dict[str, Any]:
    """GET C{route} on the admin listener C{admin} (see L{admin_url}); its JSON object."""
    url = admin_url(admin) + route
    try:
        status, raw = http_get(url, TIMEOUT_SEC)
    except OSError as e:
        raise unreachable(url, e) from None
    return answer_document(url, status, raw)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; no trailing blanks."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(f"{c!s:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]


def register(subparsers: Any) -> None:
    """Add C{iop status}."""
    status = subparsers.add_parser(
        "status",
        help="the running Edge's nodes, providers and client models",
        description=(
            "Show the running Edge's nodes, providers and client models (GET /status): why a "
            "node is not connected and since when, each provider's leases against its "
            "capacity, which models a client can use now."
        ),
    )
    add_admin_argument(status)
    add_json_argument(status, JSON_DOCUMENT)
    status.set_defaults(run=run_status)


def run_status(args: argparse.Namespace, report: Report) -> int:
    document = get_document(args.admin, "/status")
    if args.json:
        print(json.dumps(document, indent=2), file=report.out)
    else:
        for line in summary(document, now()):
            print(line, file=report.out)
    return 0


def summary(document: dict[str, Any], at: float | None = None) -> list[str]:
    """The human form of a status snapshot: the Edge, then the nodes, the providers and the
    client models (and, in a cluster, the cluster's view). ``at`` (Unix seconds) is now, for
    how long ago a node went down."""
    edge = document.get("edge") or {}
    lines = [f"edge {edge.get('id', '?')} (mode: {edge.get('mode', '?')})", ""]
    lines += _nodes(document.get("nodes") or [], at)
    lines.append("")
    lines += _providers(document.get("providers") or [])
    lines.append("")
    lines += _models(document.get("models") or [], document.get("routes") or [])
    cluster = document.get("cluster")
    if isinstance(cluster, dict):
        lines += ["", *_cluster(cluster)]
    return lines


def _nodes(nodes: list[dict[str, Any]], at: float | None) -> list[str]:
    if not nodes:
        return ["no nodes configured"]
    lines = table(
        ("NODE", "STATE", "SINCE", "IDENTITY", "PROVIDERS"),
        [
            (
                str(n.get("id", "")),
                str(n.get("state", "")),
                _since(n, at),
                _identity(n.get("identity")),
                ",".join(n.get("providers") or []) or "-",
            )
            for n in nodes
        ],
    )
    # Why a node that is not connected was last refused (its registration, by the Edge).
    for n in nodes:
        refusal = n.get("last_refusal")
        if not n.get("connected") and isinstance(refusal, dict):
            lines.append(
                f"{n.get('id', '')}: last registration refused"
                f" ({refusal.get('code', '?')}): {refusal.get('reason', '')}"
            )
    return lines


def _since(node: dict[str, Any], at: float | None) -> str:
    """For a node that is not connected: ``down since`` when it went away, or that it has not
    been ready since the Edge started; ``draining since`` for a connected node that stops;
    ``-`` for a connected node."""
    if node.get("connected"):
        draining = node.get("draining_since_unix_ms")
        if not isinstance(draining, int):
            return "-"
        when = datetime.datetime.fromtimestamp(draining / 1000, datetime.UTC)
        text = f"draining since {when:%Y-%m-%d %H:%M:%S}Z"
        if at is not None:
            text += f" ({_ago(at - draining / 1000)})"
        return text
    down = node.get("down_since_unix_ms")
    if not isinstance(down, int):
        return "never connected"
    when = datetime.datetime.fromtimestamp(down / 1000, datetime.UTC)
    text = f"down since {when:%Y-%m-%d %H:%M:%S}Z"
    if at is not None:
        text += f" ({_ago(at - down / 1000)})"
    return text


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _providers(providers: list[dict[str, Any]]) -> list[str]:
    if not providers:
        return ["no providers configured"]
    lines = table(
        (
            "NODE",
            "PROVIDER",
            "ADAPTER",
            "MODEL(S)",
            "STATUS",
            "HEALTH",
            "IN FLIGHT/CAPACITY",
            "LONG",
            "QUEUED",
        ),
        [
            (
                str(p.get("node_id", "")),
                str(p.get("id", "")),
                str(p.get("adapter", "")),
                ",".join(p.get("models") or []) or "-",
                str(p.get("status", "")),
                str(p.get("health", "")),
                *_load(p),
            )
            for p in providers
        ],
    )
    lines.append("(LONG: long-prompt leases in flight/capacity; -: takes no requests now)")
    return lines


def _load(p: dict[str, Any]) -> tuple[str, str, str]:
    """IN FLIGHT/CAPACITY, LONG and QUEUED of a provider: ``-`` each when it is not available
    (its capacity is 0 then, and "0/0" would read as full)."""
    if p.get("status") != "available":
        return "-", "-", "-"
    long_capacity = int(p.get("long_capacity", 0))
    long = f"{p.get('long_in_flight', 0)}/{long_capacity}" if long_capacity else "-"
    queued = str(p.get("queued", 0))
    if p.get("long_queued"):
        queued += f" ({p['long_queued']} long)"
    return f"{p.get('in_flight', 0)}/{p.get('capacity', 0)}", long, queued


def _models(models: list[dict[str, Any]], routes: list[dict[str, Any]]) -> list[str]:
    """The models a client can name: ``models[]`` with their providers, then direct routes."""
    if not models and not routes:
        return ["no client models configured"]
    rows: list[tuple[str, str, str]] = []
    for m in models:
        refs = m.get("providers") or []
        up = [r for r in refs if r.get("status") == "available"]
        rows.append(
            (
                str(m.get("id", "")),
                f"yes ({len(up)}/{len(refs)} providers)" if up else "no",
                ", ".join(_ref(r) for r in refs) or "-",
            )
        )
    for r in routes:
        where = f"node {r['node_id']}" if r.get("node_id") else "the single ready node"
        rows.append(
            (
                str(r.get("model", "")),
                "yes" if r.get("available") else "no",
                f"direct route: {r.get('adapter', '')} {r.get('target', '')} on {where}",
            )
        )
    return table(("MODEL", "AVAILABLE", "PROVIDERS"), rows)


def _ref(ref: dict[str, Any]) -> str:
    text = str(ref.get("provider_id", ""))
    if ref.get("target"):
        text += f" ({ref['target']})"
    status = ref.get("status")
    if status and status != "available":
        text += f" [{status}]"
    return text


def _cluster(view: dict[str, Any]) -> list[str]:
    """The cluster part of a status snapshot: Redis, the Edges, the leases over every Edge."""
    lines = [
        f"cluster: this Edge is {view.get('edge_id', '?')}, Redis {view.get('redis', '?')}, "
        f"lease TTL {view.get('lease_ttl_sec', '?')}s, {view.get('leases_held_here', 0)} "
        f"leases held here, {view.get('leases_lost', 0)} lost"
        + (" (view stale)" if view.get("stale") else "")
    ]
    for edge in view.get("edges") or []:
        lines.append(f"  edge {edge.get('id', '')}: {edge.get('queued', 0)} queued")
    for pid, counts in sorted((view.get("providers") or {}).items()):
        lines.append(
            f"  provider {pid}: {counts.get('in_flight', 0)}/{counts.get('long_in_flight', 0)}"
            " in flight over every Edge (all/long)"
        )
    return lines


def _identity(identity: object) -> str:
    """The workload names the node's certificate presented (``ok`` with none, ``refused`` when
    the check refused it); ``-`` before any check."""
    if not isinstance(identity, dict) or not identity.get("checked"):
        return "-"
    if not identity.get("ok"):
        return "refused"
    presented = identity.get("presented") or []
    return ",".join(str(name) for name in presented) or "ok"
