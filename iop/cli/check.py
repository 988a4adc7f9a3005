# -*- test-case-name: iop.test.cli.test_check_cli -*-
"""
``iop config check FILE [--kind edge|node] [--offline] [--json]``: validate an edge.yaml or
node.yaml with the loaders the daemons use (:mod:`iop.config`), without starting anything.

Every problem is printed as one ``path: message`` line (the loaders collect them all) and the
exit code is 1; a valid file prints one ``FILE: ok`` line with what it configures and exits 0.
The kind is ``--kind``, else told from the content: a top-level ``edge`` mapping with ``host``
is a node.yaml; ``nodes``, ``listen``, ``models``, ``openai`` or ``admin`` mark an edge.yaml.

By default the check is the daemon's own at start: ``${VAR}`` references resolve from this
process's environment and every file the config names must exist. ``--offline`` checks the
file alone, for a config repository without the deploy host's secrets and certificates: every
``${VAR}`` counts as set and a named file that does not exist is not a problem.

``--json`` prints one object, :data:`JSON_DOCUMENT`, whatever the outcome (the exit code is the
same): ``kind`` is null when the file could not be read as YAML (a YAML whose kind cannot be
told is the one error line on stderr, as without ``--json``); ``summary`` is what a valid
edge.yaml configures (null for a node.yaml, for a file with problems, and offline when the
loader stopped at a missing file it passed over).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from iop.cli.command import CommandError, Report, add_json_argument
from iop.config import ConfigError, ConfigIssue, load_edge_config, load_node_config
from iop.config.errors import read_yaml_file
from iop.config.model import EdgeConfig

EDGE_KEYS = frozenset({"nodes", "listen", "models", "openai", "admin", "node_transport"})
#: The loaders' message for a named file that does not exist (iop.config.edge, .secrets).
#: What ``--json`` prints.
JSON_DOCUMENT = (
    '{"file", "kind": "edge"|"node", "offline": bool, "ok": bool, "summary": '
    '{"nodes", "providers", "models"} or null, "problems": [{"path", "message"}]}'
)
_MISSING_FILE = re.compile(r"(?:[a-z ]+ )?file .+ does not exist\Z")


class AnyVariable(Mapping[str, str]):
    """
    An environment in which every variable is set, to a placeholder naming it (two references
    to one variable still look like the same secret): ``--offline``.
    """

    def __getitem__(self, name: str) -> str:
        return f"offline-placeholder-{name}"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)


def register(commands: Any) -> None:
    """Add C{check} to the C{iop config} subcommands C{commands}."""
    check = commands.add_parser(
        "check",
        help="validate an edge.yaml or node.yaml: every problem as path: message",
        description=(
            "Validate an edge.yaml or node.yaml as the daemon would at start and print every "
            "problem as 'path: message'. Exit codes: 0 valid, 1 problems found."
        ),
    )
    check.add_argument("file", metavar="FILE", help="the edge.yaml or node.yaml to check")
    check.add_argument(
        "--kind",
        choices=("edge", "node"),
        default=None,
        help="the file's kind (default: told from its content)",
    )
    check.add_argument(
        "--offline",
        action="store_true",
        help="every ${VAR} counts as set and missing named files are not problems",
    )
    add_json_argument(check, JSON_DOCUMENT)
    check.set_defaults(run=run_check)


def kind_of(data: object) -> str | None:
    """``edge`` or ``node`` from a loaded YAML document, or None when it cannot be told."""
    if not isinstance(data, dict):
        return None
    edge = data.get("edge")
    if isinstance(edge, dict) and "host" in edge:
        return "node"
    if EDGE_KEYS & set(data):
        return "edge"
    if "token" in data or "token_file" in data:
        return "node"
    return None


def run_check(args: argparse.Namespace, report: Report) -> int:
    path: str = args.file
    kind = args.kind
    result = _Result(path, kind, args.offline, args.json, report)
    if kind is None:
        try:
            data = read_yaml_file(path)
        except ConfigError as e:
            return result.problems("config", list(e.issues))
        kind = result.kind = kind_of(data)
        if kind is None:
            raise CommandError(f"{path}: cannot tell an edge.yaml from a node.yaml; give --kind")
    environ: Mapping[str, str] = AnyVariable() if args.offline else os.environ
    summary: dict[str, int] | None = None
    try:
        if kind == "edge":
            summary = _edge_summary(load_edge_config(path, environ=environ))
        else:
            load_node_config(path, environ=environ)
    except ConfigError as e:
        issues = [i for i in e.issues if not (args.offline and _MISSING_FILE.match(i.message))]
        if issues:
            return result.problems(f"{kind} config", issues)
    return result.ok(summary)


class _Result:
    """Prints the outcome of one check, as lines or as :data:`JSON_DOCUMENT`."""

    def __init__(
        self, path: str, kind: str | None, offline: bool, as_json: bool, report: Report
    ) -> None:
        self.path, self.kind, self.offline = path, kind, offline
        self._json, self._out = as_json, report.out

    def _document(self, summary: dict[str, int] | None, issues: list[ConfigIssue]) -> None:
        document = {
            "file": self.path,
            "kind": self.kind,
            "offline": self.offline,
            "ok": not issues,
            "summary": summary,
            "problems": [{"path": i.path, "message": i.message} for i in issues],
        }
        print(json.dumps(document, indent=2), file=self._out)

    def ok(self, summary: dict[str, int] | None) -> int:
        if self._json:
            self._document(summary, [])
            return 0
        if summary is None:
            what = f"{self.kind} config"
        else:
            what = (
                f"edge config: {_count(summary['nodes'], 'node')}, "
                f"{_count(summary['providers'], 'provider')}, "
                f"{_count(summary['models'], 'model')}"
            )
        offline = ", offline" if self.offline else ""
        print(f"{self.path}: ok ({what}{offline})", file=self._out)
        return 0

    def problems(self, what: str, issues: list[ConfigIssue]) -> int:
        if self._json:
            self._document(None, issues)
            return 1
        for issue in issues:
            print(str(issue), file=self._out)
        print(f"{self.path}: {_count(len(issues), 'problem')} ({what})", file=self._out)
        return 1


def _edge_summary(config: EdgeConfig) -> dict[str, int]:
    return {
        "nodes": len(config.nodes),
        "providers": sum(len(n.providers) for n in config.nodes),
        "models": len(config.models),
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
