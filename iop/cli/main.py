# -*- test-case-name: iop.test.cli.test_main -*-
"""
The ``iop`` console script: an argparse parser whose command groups (:data:`GROUPS`) each add
their subcommands with ``register(subparsers)``.

Exit codes: 0 done; 1 a user error (one line on stderr, ``iop: error: ...``); 2 a usage error
(argparse's message and usage on stderr). A subcommand may return its own exit code (``iop
config refresh``: 3 restart required, 1 rejected).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from iop.cli import config, keys, node, pki, runs, secrets, status, usage
from iop.cli.command import CommandError, Report
from iop.version import version_line

PROG = "iop"
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

#: The command groups, in the order ``iop --help`` lists them. A new group (status, config,
#: token, ...) is a module with ``register(subparsers)`` added here.
GROUPS: tuple[ModuleType, ...] = (status, usage, runs, node, config, secrets, pki, keys)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "IOP operator tooling: the running Edge's status, usage and runs, nodes, config "
            "check and refresh, secrets, the PKI and managed mode's keys, client keys."
        ),
    )
    parser.add_argument("--version", action="version", version=version_line(PROG))
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run C{iop} with C{argv} (default: the process's arguments) and return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # --help (0) or a usage error (2, message already on stderr).
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    report = Report(sys.stdout, as_json=bool(getattr(args, "json", False)))
    try:
        code = args.run(args, report)
    except CommandError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        where = f"{e.filename!r}: " if e.filename else ""
        print(f"{PROG}: error: {where}{e.strerror or type(e).__name__}", file=sys.stderr)
        return EXIT_ERROR
    report.finish()
    return code if isinstance(code, int) else EXIT_OK
