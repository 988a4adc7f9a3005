# -*- test-case-name: iop.test.cli.test_usage_cli -*-
"""
``iop usage``: who used what and what it cost, from the Edges' usage ledgers (``GET /usage`` on
each admin listener), merged.

    iop usage [--admin URL]... [--key K] [--team T] [--model M] [--since WHEN] [--until WHEN]
              [--by key|team|model|day] [--json | --csv]

``--since``/``--until`` take an ISO 8601 date or time (UTC unless it has an offset) or a duration
back from now (``30m``, ``24h``, ``7d``, ``2w``); a duration is turned into a time here, once, so
every Edge answers for the same window. Several Edges (a cluster; each keeps its own ledger of
the requests it served): ``--admin`` once per Edge, else ``$IOP_ADMIN`` as a comma-separated
list, else the default admin listener. Their answers are summed per group and currency.

An Edge that cannot be asked (unreachable, an error answer, no ledger) is named on stderr and
the totals are marked incomplete: the command prints what the others answered and exits 1, so
a script never takes a partial sum for the whole. Nothing answered at all: only the errors, exit
1. ``--json`` prints ``{"complete", "edges", "unreachable", "query", "rows"}``; ``--csv`` one
header line and a row per group (cost as an exact decimal).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from iop.cli import status
from iop.cli.command import CommandError, Report
from iop.cli.config import ADMIN_ENV, DEFAULT_ADMIN, admin_url
from iop.usage.price import format_micros
from iop.usage.query import GROUPINGS, Totals, UsageQuery, merge, parse_when, totals_from_json

__all__ = ["register"]

#: The columns of the table and the CSV, after the group's.
_COLUMNS = (
    ("requests", "REQUESTS"),
    ("input_tokens", "INPUT"),
    ("cached_input_tokens", "CACHED"),
    ("cache_write_tokens", "CACHE_WRITE"),
    ("output_tokens", "OUTPUT"),
    ("reasoning_tokens", "REASONING"),
)

#: What ``--json`` prints (a row's keys are :class:`~iop.usage.query.Totals`' fields and cost).
JSON_DOCUMENT = (
    '{"complete": bool, "edges": [{"admin", "edge"}], "unreachable": [{"admin", "error"}], '
    '"query": {"key", "team", "model", "since", "until", "by"}, "rows": [{"group", "currency", '
    '"requests", "input_tokens", ..., "cost_micros", "cost", "unpriced", "unreported"}]}'
)

#: Now, in Unix seconds: what a relative ``--since 7d`` counts back from.
now: Callable[[], float] = time.time


def register(subparsers: Any) -> None:
    """Add C{iop usage}."""
    parser = subparsers.add_parser(
        "usage",
        help="usage and cost from the Edges' usage ledgers",
        description=(
            "Totals of the Edges' usage ledgers (GET /usage), filtered and grouped, merged "
            "over every Edge asked."
        ),
    )
    parser.add_argument(
        "--admin",
        metavar="URL",
        action="append",
        default=None,
        help=(
            f"an Edge's admin listener; once per Edge (default: ${ADMIN_ENV}, comma-separated, "
            f"else {DEFAULT_ADMIN})"
        ),
    )
    parser.add_argument("--key", help="only this client key")
    parser.add_argument("--team", help="only this team")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--since", metavar="WHEN", help="from (ISO 8601, or 30m/24h/7d/2w ago)")
    parser.add_argument("--until", metavar="WHEN", help="until, excluded (same forms)")
    parser.add_argument("--by", choices=GROUPINGS, help="one row per key, team, model or day")
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object instead: {JSON_DOCUMENT}".replace("%", "%%"),
    )
    form.add_argument("--csv", action="store_true", help="print the rows as CSV")
    parser.set_defaults(run=run_usage)


def run_usage(args: argparse.Namespace, report: Report) -> int:
    query = _query(args, now())
    urls = _edges(args.admin)
    route = "/usage"
    params = query.params()
    if params:
        route += "?" + urllib.parse.urlencode(params)
    answers: list[list[Totals]] = []
    edges: list[dict[str, str]] = []
    unreachable: list[dict[str, str]] = []
    for url in urls:
        try:
            document = status.get_document(url, route)
            rows = [totals_from_json(item) for item in document.get("rows") or []]
        except CommandError as e:
            unreachable.append({"admin": url, "error": str(e)})
            continue
        except (ValueError, TypeError, AttributeError) as e:
            unreachable.append({"admin": url, "error": f"{url}/usage answered a bad document: {e}"})
            continue
        answers.append(rows)
        edges.append({"admin": url, "edge": str(document.get("edge", ""))})
    for failure in unreachable:
        print(f"iop: could not ask {failure['admin']}: {failure['error']}", file=sys.stderr)
    if not edges:
        raise CommandError("no Edge answered; nothing to total")
    rows = merge(answers)
    complete = not unreachable
    if args.json:
        document = {
            "complete": complete,
            "edges": edges,
            "unreachable": unreachable,
            "query": query.as_json(),
            "rows": [row.as_json() for row in rows],
        }
        print(json.dumps(document, indent=2), file=report.out)
    elif args.csv:
        _csv(rows, query, report)
    else:
        for line in _table(rows, query):
            print(line, file=report.out)
        names = ", ".join(e["edge"] or e["admin"] for e in edges)
        print(f"\nfrom {len(edges)} Edge{'s' if len(edges) != 1 else ''}: {names}", file=report.out)
        if not complete:
            print(
                f"INCOMPLETE: {len(unreachable)} Edge(s) could not be asked (see above)",
                file=report.out,
            )
    return 0 if complete else 1


def _query(args: argparse.Namespace, now: float) -> UsageQuery:
    try:
        since = None if args.since is None else parse_when(args.since, now)
        until = None if args.until is None else parse_when(args.until, now)
    except ValueError as e:
        raise CommandError(f"--since/--until: {e}") from None
    if since is not None and until is not None and until < since:
        raise CommandError("--until must not be before --since")
    return UsageQuery(
        key=args.key, team=args.team, model=args.model, since=since, until=until, by=args.by
    )


def _edges(given: list[str] | None) -> list[str]:
    """Every admin URL to ask, each once, in order."""
    if given:
        raw = given
    else:
        raw = [u for u in os.environ.get(ADMIN_ENV, "").split(",") if u.strip()] or [DEFAULT_ADMIN]
    urls: list[str] = []
    for value in raw:
        url = admin_url(value.strip())
        if url not in urls:
            urls.append(url)
    return urls


def _group_name(query: UsageQuery) -> str:
    return (query.by or "total").upper()


def _group(row: Totals, query: UsageQuery) -> str:
    if query.by is None:
        return "total"
    return row.group or "-"


def _table(rows: list[Totals], query: UsageQuery) -> list[str]:
    if not rows:
        return ["no usage recorded for this question"]
    headers = (_group_name(query), *(title for _, title in _COLUMNS), "COST", "UNPRICED")
    lines = status.table(
        headers,
        [
            (
                _group(row, query),
                *(str(getattr(row, name)) for name, _ in _COLUMNS),
                f"{format_micros(row.cost_micros)} {row.currency}".strip(),
                str(row.unpriced),
            )
            for row in rows
        ],
    )
    if any(row.unpriced for row in rows):
        lines.append("(UNPRICED: requests of a model with no price; their cost is not in COST)")
    if any(row.unreported for row in rows):
        unreported = sum(row.unreported for row in rows)
        lines.append(f"({unreported} requests had no usage reported; their tokens are unknown)")
    return lines


def _csv(rows: list[Totals], query: UsageQuery, report: Report) -> None:
    writer = csv.writer(report.out, lineterminator="\n")
    writer.writerow(
        [
            query.by or "total",
            *(name for name, _ in _COLUMNS),
            "cost",
            "currency",
            "unpriced",
            "unreported",
        ]
    )
    for row in rows:
        writer.writerow(
            [
                _group(row, query) if query.by is None else row.group,
                *(getattr(row, name) for name, _ in _COLUMNS),
                format_micros(row.cost_micros),
                row.currency,
                row.unpriced,
                row.unreported,
            ]
        )
