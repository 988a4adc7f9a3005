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

The secret is written to stdout only (never to a log or a file) and cannot be shown again: the
Edge keeps only its sha256, as the lines printed after it say. The digest is the hex sha256 of
the secret's UTF-8 bytes, as :mod:`iop.config.secrets` checks it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import re
import secrets
from typing import Any

from iop.cli.command import CommandError, Report

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
    key_new.add_argument("name", metavar="NAME", help="the key's name, logged instead of the key")
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
    key_new.set_defaults(run=run_key_new)


def _check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        raise CommandError(
            f"{what} {value!r}: use letters, digits, '.', '_' and '-', starting with a letter "
            "or digit"
        )


def run_token_new(args: argparse.Namespace, report: Report) -> int:
    _check_name("node id", args.node_id)
    token = new_token()
    out = report.out
    print(
        f"Node token for {args.node_id} (shown once; the node reads it from its token_file",
        file=out,
    )
    print("or token: ${VAR}; keep it mode 0600):", file=out)
    print(f"  {token}", file=out)
    print("", file=out)
    print(
        f"edge.yaml, in nodes[] under id: {args.node_id} (instead of token/token_file):", file=out
    )
    print(f"    token_sha256: {sha256_hex(token)}", file=out)
    return 0


def run_key_new(args: argparse.Namespace, report: Report) -> int:
    _check_name("key name", args.name)
    key = new_key()
    out = report.out
    print(f"Client key {args.name} (shown once; the client sends it as a bearer token or", file=out)
    print("x-api-key):", file=out)
    print(f"  {key}", file=out)
    print("", file=out)
    if not args.rotate:
        print("edge.yaml, under openai.auth.keys:", file=out)
        print(f"      - name: {args.name}", file=out)
        print(f"        key_sha256: {sha256_hex(key)}", file=out)
        return 0
    if not 0 < args.grace_days <= 3650:
        raise CommandError("--grace-days must be more than 0 and at most 3650")
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=args.grace_days)
    print(
        f"edge.yaml, the openai.auth.keys entry named {args.name}: the new digest, and its "
        "current key_sha256 moved to previous_key_sha256 (both keys work until "
        "previous_valid_until; then apply the config again):",
        file=out,
    )
    print(f"      - name: {args.name}", file=out)
    print(f"        key_sha256: {sha256_hex(key)}", file=out)
    print("        previous_key_sha256: <the entry's current key_sha256>", file=out)
    print(f'        previous_valid_until: "{until:%Y-%m-%dT%H:%M:%SZ}"', file=out)
    return 0
