# -*- test-case-name: iop.test.cli.test_node_cli -*-
"""
``iop node``: the nodes of an Edge.

- ``iop node add NODE_ID [--edge HOST:PORT] [--ca-file F] ...``: a new node's token, the
  edge.yaml ``nodes[]`` entry that lets it in (``id`` and ``token_sha256``: the Edge keeps only
  the digest) and the node's join line, ``twistd -n iop-node --join iop1....``, which carries the
  Edge's address, the token and the pin of the Edge's CA (:mod:`iop.config.join`; where each part
  comes from: :mod:`iop.cli.join`). It writes nothing but ``--out``'s file: edge.yaml stays the
  operator's to edit, comments and all. ``--json`` and ``--out FILE`` (the join string, for
  ``--join-file``) as ``iop token new``'s (:mod:`iop.cli.secrets`).
- ``iop node command NODE TYPE [--adapter A] [--target T] [--arg KEY=VALUE ...]``: ask a
  connected node something through the running Edge (``POST /nodes/NODE/commands`` on its admin
  listener) and print the node's JSON answer.

Why both ``iop node add`` and ``iop token new --edge``: adding a node is the operator's task and
wants the whole entry; ``iop token new`` stays the tool for a new token alone (a rotation), and
prints the join line too when told where the Edge is.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from iop.cli import config, secrets, status
from iop.cli import join as edge_join
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
    add = commands.add_parser(
        "add",
        help="a new node: its token, its edge.yaml nodes[] entry and its one-line join",
        description=(
            "Make a new node's token and print the edge.yaml nodes[] entry to add (id and "
            "token_sha256) and the join line to run on the node: twistd -n iop-node --join "
            "STRING, the string carrying the Edge's address, the token and the pin of the "
            "Edge's CA. The Edge's address and CA come from the flags or its edge.yaml."
        ),
    )
    add.add_argument("node_id", metavar="NODE_ID", help="the new node's id (edge.yaml nodes[].id)")
    edge_join.add_arguments(add, required=True)
    secrets.add_output_arguments(
        add,
        "the join string (what --join-file reads)",
        "node_id, token_sha256, token | join_file, join, edges, ca_pin, server_name, nodes_entry",
    )
    add.set_defaults(run=run_add)
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


def run_add(args: argparse.Namespace, report: Report) -> int:
    secrets.check_name("node id", args.node_id)
    token = secrets.new_token()
    digest = secrets.sha256_hex(token)
    text, side = secrets.new_join(args, token)
    if args.out is not None:
        secrets.write_secret_file(args.out, text)
    out = report.out
    entry = {"id": args.node_id, "token_sha256": digest}
    if args.json:
        document: dict[str, Any] = {"node_id": args.node_id, "token_sha256": digest}
        if args.out is None:
            document["token"] = token
        else:
            document["join_file"] = args.out
        document.update(secrets.join_fields(None if args.out else text, side))
        document["nodes_entry"] = entry
        secrets.print_json(out, document)
        return 0
    print(
        "1. edge.yaml, under nodes: (then its adapters and providers, as any node's; "
        "`iop config refresh` applies it, or says when it needs a restart):",
        file=out,
    )
    print(f"  - id: {args.node_id}", file=out)
    print(f"    token_sha256: {digest}", file=out)
    print("", file=out)
    if args.out is None:
        print(
            "2. On the node (the join string holds its token: shown once, keep it secret):",
            file=out,
        )
        print(f"  {secrets.join_line('--join ' + text)}", file=out)
    else:
        print(
            f"2. The join string (it holds the node's token) is in {args.out}, mode 0600; copy "
            "it to the node and run there:",
            file=out,
        )
        print(f"  {secrets.join_line('--join-file ' + args.out)}", file=out)
    print(secrets.describe_join(side), file=out)
    if args.out is None:
        print("", file=out)
        print(f"The token alone (for node.yaml token_file instead of --join): {token}", file=out)
    return 0


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
