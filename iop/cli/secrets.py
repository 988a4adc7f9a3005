# -*- test-case-name: iop.test.cli.test_secrets_cli -*-
"""
``iop token new NODE_ID`` and ``iop key new NAME``: a fresh random secret, printed once, and
the digest entry edge.yaml takes instead of it.

- ``iop token new NODE_ID``: a node token (``secrets.token_urlsafe(32)``: 256 random bits);
  the node reads it (``token_file:`` or ``token: ${VAR}`` in node.yaml), edge.yaml keeps only
  ``nodes[].token_sha256``.
- ``iop key new NAME``: a client API key ``sk-iop-…`` (256 random bits); the client sends it,
  edge.yaml keeps only the ``openai.auth.keys[]`` entry ``{name, key_sha256}``. With
  ``--rotate`` it replaces key NAME's current one: the entry printed keeps the old digest as
  ``previous_key_sha256`` (a placeholder to fill in: the command never reads edge.yaml), valid
  until ``--grace-days`` (default 7) from now, so clients can move over before it stops working.

``iop token new NODE_ID --edge HOST:PORT`` (or any flag of :mod:`iop.cli.join`) also prints the
node's join line, ``twistd -n iop-node --join iop1....`` (:mod:`iop.config.join`: the Edge's
address, the token, the pin of the Edge's CA). ``iop node add NODE_ID`` (:mod:`iop.cli.node`)
does the same with the whole edge.yaml ``nodes[]`` entry.

The secret is written to stdout (never to a log) and cannot be shown again: the Edge keeps only
its sha256, as the lines printed after it say. The digest is the hex sha256 of the secret's
UTF-8 bytes, as :mod:`iop.config.secrets` checks it. For scripts:

- ``--json``: one JSON object with the fields (``token``/``key``, its digest, the join string and
  what it carries) instead of the prose;
- ``--out FILE``: the secret goes to FILE instead (a new file, mode 0600 from its creation; an
  existing FILE is never replaced), and stdout says where it went, without the secret. For
  ``iop token new`` that is the token (what node.yaml's ``token_file`` reads), for ``iop node
  add`` the join string (what ``--join-file`` reads).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import secrets
from typing import Any, TextIO

from iop.cli import join as edge_join
from iop.cli.command import CommandError, Report
from iop.config.join import JoinString
from iop.config.join import encode as encode_join

TOKEN_BYTES = 32
KEY_PREFIX = "sk-iop-"
# How long a rotated key's previous key stays valid, unless --grace-days says otherwise.
DEFAULT_GRACE_DAYS = 7.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def register(subparsers: Any) -> None:
    """Add C{iop token} and C{iop key}."""
    token = subparsers.add_parser(
        "token",
        help="node tokens (a new random token and its edge.yaml digest)",
        description="Make node tokens.",
    )
    token_commands = token.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    token_new = token_commands.add_parser(
        "new",
        help="a new random node token, printed once, and its token_sha256 for edge.yaml",
        description=(
            "Print a new random node token (once: it cannot be shown again) and the "
            "token_sha256 line for the node's edge.yaml entry."
        ),
    )
    token_new.add_argument(
        "node_id", metavar="NODE_ID", help="the node's id (edge.yaml nodes[].id)"
    )
    edge_join.add_arguments(token_new, required=False)
    add_output_arguments(
        token_new,
        "the token (what node.yaml token_file reads)",
        "node_id, token_sha256, token | token_file | join_file; with a join line: join, edges, "
        "ca_pin, server_name",
    )
    token_new.set_defaults(run=run_token_new)

    key = subparsers.add_parser(
        "key",
        help="client API keys (a new random key and its edge.yaml entry)",
        description="Make client API keys.",
    )
    key_commands = key.add_subparsers(dest="key_command", metavar="COMMAND", required=True)
    key_new = key_commands.add_parser(
        "new",
        help="a new random client key, printed once, and its key_sha256 entry for edge.yaml",
        description=(
            "Print a new random client API key (once: it cannot be shown again) and its "
            "openai.auth.keys entry (name, key_sha256) for edge.yaml."
        ),
    )
    key_new.add_argument(
        "name", metavar="NAME", help="the key's name (what logs and usage show, never the key)"
    )
    key_new.add_argument(
        "--rotate",
        action="store_true",
        help="replace key NAME's current key: its digest stays valid as previous_key_sha256 "
        "for the grace period",
    )
    key_new.add_argument(
        "--grace-days",
        type=float,
        default=DEFAULT_GRACE_DAYS,
        metavar="DAYS",
        help=f"with --rotate: how long the old key stays valid (default {DEFAULT_GRACE_DAYS:g})",
    )
    add_output_arguments(
        key_new, "the key", "name, key_sha256, key | key_file; with --rotate: previous_valid_until"
    )
    key_new.set_defaults(run=run_key_new)


def add_output_arguments(parser: argparse.ArgumentParser, secret: str, fields: str) -> None:
    """``--json`` (its help lists ``fields``, the object's keys) and ``--out FILE`` (see the
    module docstring)."""
    parser.add_argument(
        "--json", action="store_true", help=f"print one JSON object instead: {{{fields}}}"
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help=f"write {secret} to FILE (new, mode 0600; never replaced) instead of stdout",
    )


def write_secret_file(path: str, secret: str) -> None:
    """
    ``secret`` and a newline into the new file ``path``, mode 0600 from its creation.

    @raise CommandError: ``path`` exists (it is never replaced) or cannot be written.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CommandError(f"--out {path}: exists; refusing to overwrite it") from None
    except OSError as e:
        raise CommandError(f"--out {path}: cannot create: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secret + "\n")
    except OSError as e:
        raise CommandError(f"--out {path}: cannot write: {e.strerror or e}") from None


def print_json(out: TextIO, document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2), file=out)


def check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        raise CommandError(
            f"{what} {value!r}: use letters, digits, '.', '_' and '-', starting with a letter "
            "or digit"
        )


def join_line(flag_value: str) -> str:
    """The command a node runs: ``--join STRING`` or, when it went to a file, ``--join-file``."""
    return f"twistd -n iop-node {flag_value}"


def new_join(args: argparse.Namespace, token: str) -> tuple[str, edge_join.EdgeSide]:
    """The join string for ``token`` with the Edge's side from the flags and edge.yaml."""
    side = edge_join.edge_side(args)
    text = encode_join(JoinString(side.edges, token, side.ca_pin, side.server_name))
    return text, side


def join_fields(text: str | None, side: edge_join.EdgeSide) -> dict[str, Any]:
    """What --json shows of a join string (``join`` omitted when it went to a file)."""
    fields: dict[str, Any] = {}
    if text is not None:
        fields["join"] = text
    fields.update(edges=list(side.edges), ca_pin=side.ca_pin, server_name=side.server_name)
    return fields


def describe_join(side: edge_join.EdgeSide) -> str:
    return (
        f"It dials {', '.join(side.edges)}, accepts only an Edge whose CA has the pin "
        f"{side.ca_pin} and whose certificate names {side.server_name}."
    )


def run_token_new(args: argparse.Namespace, report: Report) -> int:
    check_name("node id", args.node_id)
    token = new_token()
    digest = sha256_hex(token)
    joined = new_join(args, token) if edge_join.wanted(args) else None
    if args.out is not None:
        # With a join line asked for, the file holds what the node is given: the join string.
        write_secret_file(args.out, joined[0] if joined is not None else token)
    out = report.out
    if args.json:
        document: dict[str, Any] = {"node_id": args.node_id, "token_sha256": digest}
        if args.out is None:
            document["token"] = token
        else:
            document["join_file" if joined is not None else "token_file"] = args.out
        if joined is not None:
            document.update(join_fields(None if args.out else joined[0], joined[1]))
        print_json(out, document)
        return 0
    if args.out is None:
        print(
            f"Node token for {args.node_id} (shown once; the node reads it from its token_file",
            file=out,
        )
        print("or token: ${VAR}; keep it mode 0600):", file=out)
        print(f"  {token}", file=out)
    elif joined is None:
        print(
            f"Node token for {args.node_id} written to {args.out} (mode 0600): node.yaml "
            "token_file takes it.",
            file=out,
        )
    else:
        print(
            f"Join string for {args.node_id} (it holds the token) written to {args.out} "
            "(mode 0600).",
            file=out,
        )
    print("", file=out)
    print(
        f"edge.yaml, in nodes[] under id: {args.node_id} (instead of token/token_file):", file=out
    )
    print(f"    token_sha256: {digest}", file=out)
    if joined is not None:
        text, side = joined
        print("", file=out)
        if args.out is None:
            print("Join line for the node (it holds the token: shown once):", file=out)
            print(f"  {join_line('--join ' + text)}", file=out)
        else:
            print(f"On the node, with {args.out} copied there (mode 0600):", file=out)
            print(f"  {join_line('--join-file ' + args.out)}", file=out)
        print(describe_join(side), file=out)
    return 0


def run_key_new(args: argparse.Namespace, report: Report) -> int:
    check_name("key name", args.name)
    if args.rotate and not 0 < args.grace_days <= 3650:
        raise CommandError("--grace-days must be more than 0 and at most 3650")
    key = new_key()
    digest = sha256_hex(key)
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=args.grace_days)
    valid_until = f"{until:%Y-%m-%dT%H:%M:%SZ}"
    if args.out is not None:
        write_secret_file(args.out, key)
    out = report.out
    if args.json:
        document: dict[str, Any] = {"name": args.name, "key_sha256": digest}
        if args.out is None:
            document["key"] = key
        else:
            document["key_file"] = args.out
        if args.rotate:
            document["previous_valid_until"] = valid_until
        print_json(out, document)
        return 0
    if args.out is not None:
        print(f"Client key {args.name} written to {args.out} (mode 0600).", file=out)
    else:
        print(
            f"Client key {args.name} (shown once; the client sends it as a bearer token or",
            file=out,
        )
        print("x-api-key):", file=out)
        print(f"  {key}", file=out)
    print("", file=out)
    if not args.rotate:
        print("edge.yaml, under openai.auth.keys:", file=out)
        print(f"      - name: {args.name}", file=out)
        print(f"        key_sha256: {digest}", file=out)
        return 0
    print(
        f"edge.yaml, the openai.auth.keys entry named {args.name}: the new digest, and its "
        "current key_sha256 moved to previous_key_sha256 (both keys work until "
        "previous_valid_until; then apply the config again):",
        file=out,
    )
    print(f"      - name: {args.name}", file=out)
    print(f"        key_sha256: {digest}", file=out)
    print("        previous_key_sha256: <the entry's current key_sha256>", file=out)
    print(f'        previous_valid_until: "{valid_until}"', file=out)
    return 0
