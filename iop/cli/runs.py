# -*- test-case-name: iop.test.cli.test_runs_cli -*-
"""
``iop runs``: the running Edge's active work (``GET /runs`` on its admin listener) — normalized
runs and provider tunnels, each with the client request id it serves — as one table (KIND says
which), or with ``--json`` as the Edge answered (:data:`JSON_DOCUMENT`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from iop.cli import status
from iop.cli.command import Report, add_json_argument

#: What ``--json`` prints.
JSON_DOCUMENT = (
    '{"runs": [{"run_id", "node_id", "adapter", "target", "request_id"}], '
    '"tunnels": [{"run_id", "node_id", "adapter", "target", "operation", "request_id"}]}'
)


def register(subparsers: Any) -> None:
    """Add C{iop runs}."""
    runs = subparsers.add_parser(
        "runs",
        help="the running Edge's active runs and tunnels",
        description="List the running Edge's active runs and provider tunnels (GET /runs).",
    )
    status.add_admin_argument(runs)
    add_json_argument(runs, JSON_DOCUMENT)
    runs.set_defaults(run=run_runs)


def run_runs(args: argparse.Namespace, report: Report) -> int:
    document = status.get_document(args.admin, "/runs")
    if args.json:
        print(json.dumps(document, indent=2), file=report.out)
        return 0
    for line in summary(document):
        print(line, file=report.out)
    return 0


def summary(document: dict[str, Any]) -> list[str]:
    rows = [("run", r) for r in document.get("runs") or []]
    rows += [("tunnel", t) for t in document.get("tunnels") or []]
    if not rows:
        return ["no active runs"]
    return status.table(
        ("KIND", "RUN", "NODE", "ADAPTER", "TARGET", "REQUEST"),
        [
            (
                kind,
                str(r.get("run_id", "")),
                str(r.get("node_id", "")),
                str(r.get("adapter", "")),
                str(r.get("target", "")) or "-",
                str(r.get("request_id", "")) or "-",
            )
            for kind, r in rows
        ],
    )
