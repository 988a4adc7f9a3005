# -*- test-case-name: iop.test.cli.test_pki_cli -*-
"""
``iop pki``: the certificates of the Edge-Node socket (L{iop.security.pki}).

- ``iop pki init [--dir DIR] [--name NAME]``: a CA, ``DIR/ca.crt`` and ``DIR/ca.key``;
- ``iop pki issue-edge NAME``: the Edge's server certificate for workload name NAME,
  ``DIR/NAME.crt`` (followed by the CA's certificate: the Edge presents it, and a node joining
  with a join string checks it by its pin) and ``DIR/NAME.key``;
- ``iop pki issue-node NODE_ID [--trust-domain D]``: a node's client certificate for
  ``NODE_ID.node.D``, ``DIR/NODE_ID.crt`` and ``DIR/NODE_ID.key``.

Private keys are written with mode 0600; nothing is replaced without ``--force``. Each command
prints which edge.yaml / node.yaml key takes which file; with ``--json``, one object
(:data:`~iop.cli.command.REPORT_JSON`) plus ``names`` (the certificate's DNS names; the CA's
common name for ``init``) and ``not_after`` (its expiry, ISO 8601 UTC).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from iop.cli.command import REPORT_JSON, CommandError, Report, add_json_argument
from iop.config.model import DEFAULT_TRUST_DOMAIN
from iop.security import pki
from iop.security.pki import PKIError

DEFAULT_DIR = "pki"
#: What ``--json`` prints.
JSON_DOCUMENT = REPORT_JSON[:-1] + ', "names": [dns name], "not_after": ISO 8601}'


def positive_days(text: str) -> int:
    """An argparse type: a whole number of days, at least 1."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if days < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return days


def register(subparsers: Any) -> None:
    """Add C{iop pki} and its subcommands."""
    group = subparsers.add_parser(
        "pki",
        help="CA and certificates for the Edge-Node socket (mTLS workload identity)",
        description="Make a CA and issue the Edge's and the nodes' certificates.",
    )
    commands = group.add_subparsers(dest="pki_command", metavar="COMMAND", required=True)

    def common(parser: argparse.ArgumentParser, days: int, what: str) -> None:
        parser.add_argument(
            "--dir",
            default=DEFAULT_DIR,
            help=f"the PKI directory, holding ca.crt and ca.key (default: ./{DEFAULT_DIR})",
        )
        parser.add_argument(
            "--days",
            type=positive_days,
            default=days,
            metavar="N",
            help=f"how long the {what} is valid (default: {days})",
        )
        parser.add_argument("--force", action="store_true", help="replace files that already exist")
        add_json_argument(parser, JSON_DOCUMENT)

    init = commands.add_parser(
        "init",
        help="make a new CA: DIR/ca.crt and DIR/ca.key",
        description="Make a new CA (EC P-256): DIR/ca.crt and DIR/ca.key (mode 0600).",
    )
    init.add_argument(
        "--name",
        default=pki.DEFAULT_CA_NAME,
        help=f"the CA's common name (default: {pki.DEFAULT_CA_NAME!r})",
    )
    common(init, pki.CA_DAYS, "CA")
    init.set_defaults(run=run_init)

    edge = commands.add_parser(
        "issue-edge",
        help="issue the Edge's server certificate: DIR/NAME.crt and DIR/NAME.key",
        description=(
            "Issue the Edge's server certificate for workload name NAME (its only DNS name; "
            "serverAuth), signed by the CA in DIR."
        ),
    )
    edge.add_argument("name", metavar="NAME", help="the Edge workload name, e.g. edge.iop.internal")
    common(edge, pki.LEAF_DAYS, "certificate")
    edge.set_defaults(run=run_issue_edge)

    node = commands.add_parser(
        "issue-node",
        help="issue a node's client certificate: DIR/NODE_ID.crt and DIR/NODE_ID.key",
        description=(
            "Issue a node's client certificate for workload NODE_ID.node.TRUST_DOMAIN (its "
            "only DNS name; clientAuth), signed by the CA in DIR."
        ),
    )
    node.add_argument("node_id", metavar="NODE_ID", help="the node's id in edge.yaml nodes[]")
    node.add_argument(
        "--trust-domain",
        default=DEFAULT_TRUST_DOMAIN,
        help=f"the Edge's security.trust_domain (default: {DEFAULT_TRUST_DOMAIN})",
    )
    common(node, pki.LEAF_DAYS, "certificate")
    node.set_defaults(run=run_issue_node)


def _until(files: pki.IssuedFiles) -> str:
    return f"{files.not_after:%Y-%m-%d}"


def _facts(report: Report, files: pki.IssuedFiles) -> None:
    report.fact("names", list(files.names))
    report.fact("not_after", files.not_after.isoformat())


def run_init(args: argparse.Namespace, report: Report) -> None:
    try:
        files = pki.init_ca_files(args.dir, name=args.name, days=args.days, force=args.force)
    except PKIError as e:
        raise CommandError(str(e)) from None
    _facts(report, files)
    report.wrote(
        files.cert_file,
        f"CA certificate {args.name!r}, valid until {_until(files)} (public: the Edge and "
        "every node get a copy)",
    )
    report.wrote(
        files.key_file,
        "CA private key, mode 0600 (keep it where you issue certificates, not on the Edge or "
        "a node)",
    )
    report.goes(
        "edge.yaml",
        "node_transport.tls.client_ca_file",
        files.cert_file,
        "mTLS: node certificates must come from this CA",
    )
    report.goes("node.yaml", "edge.ca_file", files.cert_file, "on every node")
    ca_dir = os.fspath(args.dir)
    report.note(
        f"Next: iop pki issue-edge edge.iop.internal --dir {ca_dir}, then "
        f"iop pki issue-node NODE_ID --dir {ca_dir} for each node."
    )


def run_issue_edge(args: argparse.Namespace, report: Report) -> None:
    try:
        files = pki.issue_edge_files(args.dir, args.name, days=args.days, force=args.force)
    except PKIError as e:
        raise CommandError(str(e)) from None
    ca_cert = os.path.join(os.fspath(args.dir), pki.CA_CERT_FILE)
    _facts(report, files)
    report.wrote(
        files.cert_file,
        f"server certificate for {args.name} (serverAuth), signed by {ca_cert}, valid until "
        f"{_until(files)}; followed by the CA certificate (the Edge presents it: nodes that join "
        "with a join string check its pin)",
    )
    report.wrote(files.key_file, "its private key, mode 0600 (stays on the Edge)")
    report.goes("edge.yaml", "node_transport.tls.cert_file", files.cert_file)
    report.goes("edge.yaml", "node_transport.tls.key_file", files.key_file)
    report.goes(
        "node.yaml", "edge.server_name", args.name, "every node checks the Edge carries this name"
    )
    report.note(
        "Next, for each node: iop node add NODE_ID --edge HOST:PORT prints its edge.yaml entry "
        "and the one line that joins it (no CA file on the node: it checks this CA by its pin)."
    )


def run_issue_node(args: argparse.Namespace, report: Report) -> None:
    try:
        files = pki.issue_node_files(
            args.dir,
            args.node_id,
            trust_domain=args.trust_domain,
            days=args.days,
            force=args.force,
        )
    except PKIError as e:
        raise CommandError(str(e)) from None
    node_id = args.node_id
    ca_cert = os.path.join(os.fspath(args.dir), pki.CA_CERT_FILE)
    workload = files.names[0]
    _facts(report, files)
    report.wrote(
        files.cert_file,
        f"client certificate for workload {workload} (clientAuth), signed by {ca_cert}, "
        f"valid until {_until(files)}",
    )
    report.wrote(files.key_file, f"its private key, mode 0600 (copy it to node {node_id} only)")
    report.goes("node.yaml", "edge.cert_file", files.cert_file, f"on node {node_id}")
    report.goes("node.yaml", "edge.key_file", files.key_file, f"on node {node_id}")
    report.goes("node.yaml", "edge.ca_file", ca_cert, f"on node {node_id}")
    domain_note = "the default" if args.trust_domain == DEFAULT_TRUST_DOMAIN else "must match"
    report.goes("edge.yaml", "security.trust_domain", args.trust_domain, domain_note)
    report.goes(
        "edge.yaml",
        "nodes[].id",
        node_id,
        "in managed mode this node's token is accepted only with this certificate",
    )
