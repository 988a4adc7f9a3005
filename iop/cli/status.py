# -*- test-case-name: iop.test.cli.test_status_cli -*-
"""
``iop status``: the running Edge's nodes and providers (``GET /status`` on its admin listener)
as two tables, or with ``--json`` the snapshot as the Edge sent it.

Also the read side every admin-listener command shares: :func:`get_document` (GET a JSON
object, or a :class:`~iop.cli.command.CommandError` naming the URL and the Edge's message) and
:func:`add_admin_argument` (``--admin URL``, else ``$IOP_ADMIN``, else the default of
:func:`iop.cli.config.admin_url`).
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from iop.cli.command import CommandError, Report
from iop.cli.config import ADMIN_ENV, DEFAULT_ADMIN, admin_headers, admin_url

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
        help="the running Edge's nodes and providers",
        description="Show the running Edge's nodes and providers (GET /status).",
    )
    add_admin_argument(status)
    status.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    status.set_defaults(run=run_status)


def run_status(args: argparse.Namespace, report: Report) -> int:
    document = get_document(args.admin, "/status")
    if args.json:
        print(json.dumps(document, indent=2), file=report.out)
    else:
        for line in summary(document):
            print(line, file=report.out)
    return 0


def summary(document: dict[str, Any]) -> list[str]:
    """The human form of a status snapshot: the Edge, then a node table and a provider table
    (and, in a cluster, the cluster's view)."""
    edge = document.get("edge") or {}
    lines = [f"edge {edge.get('id', '?')} (mode: {edge.get('mode', '?')})", ""]
    nodes = document.get("nodes") or []
    if nodes:
        lines += table(
            ("NODE", "STATE", "CONNECTED", "IDENTITY", "PROVIDERS"),
            [
                (
                    str(n.get("id", "")),
                    str(n.get("state", "")),
                    "yes" if n.get("connected") else "no",
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
    else:
        lines.append("no nodes configured")
    lines.append("")
    providers = document.get("providers") or []
    if providers:
        lines += table(
            (
                "PROVIDER",
                "NODE",
                "ADAPTER",
                "STATUS",
                "HEALTH",
                "CAPACITY",
                "IN_FLIGHT",
                "QUEUED",
                "MODELS",
            ),
            [
                (
                    str(p.get("id", "")),
                    str(p.get("node_id", "")),
                    str(p.get("adapter", "")),
                    str(p.get("status", "")),
                    str(p.get("health", "")),
                    f"{p.get('capacity', 0)}/{p.get('long_capacity', 0)}",
                    f"{p.get('in_flight', 0)}/{p.get('long_in_flight', 0)}",
                    f"{p.get('queued', 0)}/{p.get('long_queued', 0)}",
                    ",".join(p.get("models") or []) or "-",
                )
                for p in providers
            ],
        )
        lines.append("(capacity, in_flight, queued: all/long)")
    else:
        lines.append("no providers configured")
    cluster = document.get("cluster")
    if isinstance(cluster, dict):
        lines += ["", *_cluster(cluster)]
    return lines


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
