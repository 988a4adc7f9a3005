# -*- test-case-name: iop.test.cli.test_node_cli -*-
"""
``iop node command NODE TYPE [--adapter A] [--target T] [--arg KEY=VALUE ...]``: ask a
connected node something through the running Edge (``POST /nodes/NODE/commands`` on its admin
listener) and print the node's JSON answer.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from iop.cli import config, status
from iop.cli.command import CommandError, Report

#: The command types the Edge relays (iop.edge.commands.COMMAND_TYPES; a test checks they agree).
COMMAND_TYPES = (
    "capabilities",
    "transport",
    "usage",
    "sessions",
    "ollama-tags",
    "ollama-ps",
    "ollama-show",
)
#: The Edge waits up to 30 s for the node.
TIMEOUT_SEC = 40.0


def register(subparsers: Any) -> None:
    """Add C{iop node} and its subcommands."""
    group = subparsers.add_parser(
        "node",
        help="ask a connected node something through the Edge",
        description="Work with the nodes connected to the running Edge.",
    )
    commands = group.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    command = commands.add_parser(
        "command",
        help="send a node command and print its answer",
        description=(
            "Send a command to a connected node through the Edge's admin listener "
            "(POST /nodes/NODE/commands) and print the node's JSON answer."
        ),
    )
    command.add_argument("node_id", metavar="NODE", help="the node's id (edge.yaml nodes[].id)")
    command.add_argument(
        "type", metavar="TYPE", choices=COMMAND_TYPES, help=", ".join(COMMAND_TYPES)
    )
    command.add_argument("--adapter", default="", help="the adapter instance the command is for")
    command.add_argument("--target", default="", help="the provider target (a model name)")
    command.add_argument(
        "--arg",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a command argument (repeatable)",
    )
    status.add_admin_argument(command)
    command.set_defaults(run=run_command)


def run_command(args: argparse.Namespace, report: Report) -> int:
    arguments: dict[str, str] = {}
    for item in args.arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--arg {item!r}: expected KEY=VALUE")
        arguments[key] = value
    body: dict[str, Any] = {"type": args.type}
    if args.adapter:
        body["adapter"] = args.adapter
    if args.target:
        body["target"] = args.target
    if arguments:
        body["arguments"] = arguments
    url = (
        f"{config.admin_url(args.admin)}/nodes/{urllib.parse.quote(args.node_id, safe='')}/commands"
    )
    try:
        code, raw = config.http_post(
            url, json.dumps(body).encode(), TIMEOUT_SEC, config.admin_headers(None)
        )
    except OSError as e:
        raise status.unreachable(url, e) from None
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if code != 200 or answer is None:
        status.answer_document(url, code, raw)  # raises, with the Edge's message
        raise CommandError(f"{url} answered HTTP {code} without JSON")
    print(json.dumps(answer, indent=2), file=report.out)
    return 0
