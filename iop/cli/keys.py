# -*- test-case-name: iop.test.cli.test_keys_cli -*-
"""
``iop keys``: the key pairs of managed-mode credential leases (L{iop.security.keys}).

- ``iop keys issuer [--dir DIR]``: the Edge's lease-signing pair (Ed25519), ``DIR/issuer.key``
  and ``DIR/issuer.pub``;
- ``iop keys recipient NODE_ID [--kem KEM] [--dir DIR]``: a node's recipient pair (HPKE),
  ``DIR/NODE_ID.recipient.key`` and ``DIR/NODE_ID.recipient.pub``.

Private keys are written with mode 0600 and an existing file is never replaced: replacing a
signing or recipient key is a rotation, done by removing the old files on purpose. Each command
prints which edge.yaml / node.yaml key takes which file, and the public key id; never key
material. With ``--json``: one object (:data:`~iop.cli.command.REPORT_JSON`) plus ``key_id``
and ``kem`` (``ed25519`` for the issuer).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from iop.cli.command import REPORT_JSON, CommandError, Report, add_json_argument
from iop.security import keys
from iop.security.pki import PKIError, check_node_id

DEFAULT_DIR = "keys"
ISSUER_PRIVATE_FILE = "issuer.key"
ISSUER_PUBLIC_FILE = "issuer.pub"
#: The --kem choices, default first.
KEM_CHOICES = keys.KEMS
#: What ``--json`` prints.
JSON_DOCUMENT = REPORT_JSON[:-1] + ', "key_id": id, "kem": type}'


def register(subparsers: Any) -> None:
    """Add C{iop keys} and its subcommands."""
    group = subparsers.add_parser(
        "keys",
        help="key pairs for managed-mode credential leases (issuer, node recipients)",
        description="Make the lease-signing key pair and each node's recipient key pair.",
    )
    commands = group.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)

    def dir_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"where to write (default: ./{DEFAULT_DIR})"
        )
        add_json_argument(parser, JSON_DOCUMENT)

    issuer = commands.add_parser(
        "issuer",
        help="the Edge's lease-signing key pair: DIR/issuer.key and DIR/issuer.pub",
        description=(
            "Make the Edge's lease-signing key pair (Ed25519): DIR/issuer.key (mode 0600, "
            "for the Edge) and DIR/issuer.pub (for every managed node)."
        ),
    )
    dir_option(issuer)
    issuer.set_defaults(run=run_issuer)

    recipient = commands.add_parser(
        "recipient",
        help="a node's recipient key pair: DIR/NODE_ID.recipient.key and .pub",
        description=(
            "Make a node's recipient key pair (HPKE): DIR/NODE_ID.recipient.key (mode 0600, "
            "for that node only) and DIR/NODE_ID.recipient.pub (for the Edge)."
        ),
    )
    recipient.add_argument("node_id", metavar="NODE_ID", help="the node's id in edge.yaml nodes[]")
    recipient.add_argument(
        "--kem",
        choices=KEM_CHOICES,
        default=KEM_CHOICES[0],
        help="the key type: x25519 (default) or mlkem768-x25519 (post-quantum hybrid)",
    )
    dir_option(recipient)
    recipient.set_defaults(run=run_recipient)


def _prepare(directory: str, *paths: str) -> None:
    for path in paths:
        if os.path.lexists(path):
            raise CommandError(
                f"{path!r} exists; refusing to overwrite it (to rotate the key, move the old "
                "files away first)"
            )
    try:
        # A new directory is the owner's only: it holds private keys.
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CommandError(f"{directory!r}: cannot create: {e.strerror or e}") from None


def run_issuer(args: argparse.Namespace, report: Report) -> None:
    directory = os.fspath(args.dir)
    private = os.path.join(directory, ISSUER_PRIVATE_FILE)
    public = os.path.join(directory, ISSUER_PUBLIC_FILE)
    _prepare(directory, private, public)
    key = keys.generate_issuer()
    try:
        keys.write_issuer(key, private, public)
    except keys.KeyFileError as e:
        raise CommandError(str(e)) from None
    report.fact("key_id", key.key_id)
    report.fact("kem", "ed25519")
    report.wrote(
        private,
        f"lease-signing private key (Ed25519, key id {key.key_id}), mode 0600 (stays on the Edge)",
    )
    report.wrote(public, "its public key (copy it to every managed node)")
    report.goes("edge.yaml", "security.lease.signing_key_file", private)
    report.goes("node.yaml", "security.issuer_key_file", public, "on every managed node")


def run_recipient(args: argparse.Namespace, report: Report) -> None:
    node_id: str = args.node_id
    try:
        check_node_id(node_id)
    except PKIError as e:
        raise CommandError(str(e)) from None
    directory = os.fspath(args.dir)
    private = os.path.join(directory, f"{node_id}.recipient.key")
    public = os.path.join(directory, f"{node_id}.recipient.pub")
    _prepare(directory, private, public)
    key = keys.generate_recipient(args.kem)
    try:
        keys.write_recipient(key, private, public)
    except keys.KeyFileError as e:
        raise CommandError(str(e)) from None
    report.fact("key_id", key.key_id)
    report.fact("kem", key.kem)
    report.wrote(
        private,
        f"recipient private key (KEM {key.kem}, key id {key.key_id}), mode 0600 (copy it to "
        f"node {node_id} only: it opens the credentials sealed to that node)",
    )
    report.wrote(public, "its public key (stays on the Edge)")
    report.goes(
        "edge.yaml", "nodes[].recipient_key_file", public, f"in the entry with id: {node_id}"
    )
    report.goes("node.yaml", "security.recipient_key_file", private, f"on node {node_id}")
