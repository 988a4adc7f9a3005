# -*- test-case-name: iop.test.security.test_tls -*-
"""
The development/test PKI: the certificates a local Edge and its Nodes need, made with the
production code in L{iop.security.pki} (EC P-256) plus a few test conveniences.

- :func:`make_ca`, :func:`issue` and :func:`write_pem` are L{iop.security.pki}'s, except that
  this :func:`write_pem` replaces an existing file (tests and the demo re-issue in place);
- :func:`create_dev_pki` lays out the files a local Edge and its Nodes need, idempotently: the
  Edge certificate also names C{localhost} and C{127.0.0.1}, node certificates are
  C{node-<name>.crt}.

Not for production: the CA key sits next to the certificates it signs. Operators use
``iop pki`` (L{iop.cli.pki}).

Command line::

    python -m iop.testing.pki --out DIR [--edge-name NAME] [--node NAME ...] [--force]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from iop.config.model import DEFAULT_TRUST_DOMAIN
from iop.security import pki as _pki
from iop.security.pki import CA_DAYS, KeyPair, PrivateKey, issue, make_ca

__all__ = [
    "CA_DAYS",
    "DEFAULT_EDGE_NAME",
    "DEFAULT_NODE_NAMES",
    "LEAF_DAYS",
    "NODE_DOMAIN",
    "KeyPair",
    "PrivateKey",
    "create_dev_pki",
    "issue",
    "main",
    "make_ca",
    "node_workload_name",
    "write_pem",
]

DEFAULT_EDGE_NAME = "edge.iop.internal"
DEFAULT_NODE_NAMES: tuple[str, ...] = ("node1",)
NODE_DOMAIN = f"node.{DEFAULT_TRUST_DOMAIN}"
# Dev leaves live longer than production ones (L{iop.security.pki.LEAF_DAYS}): a demo checkout
# should not need re-issuing every year. Stale ones are re-issued on the next run anyway.
LEAF_DAYS = 825

# Dev node names are single DNS labels (stricter than node ids): their files are node-<name>.*.
_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)


def node_workload_name(node_name: str) -> str:
    """The DNS-ID a node's client certificate carries: C{<name>.node.iop.internal}."""
    return _pki.node_workload_name(node_name)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_pem(path: str | os.PathLike[str], *items: x509.Certificate | PrivateKey) -> None:
    """
    Write certificates and/or private keys to C{path} as PEM, in the order given (a chain file:
    leaf first, then intermediates). A file holding a key gets mode 0600, others 0644.

    The file is replaced atomically: a reader never sees half a file.
    """
    _pki.write_pem(path, *items, overwrite=True)


# ---------------------------------------------------------------------------------------------
# The dev PKI layout


def _load_pair(cert_path: str, key_path: str) -> KeyPair | None:
    """A (key, leaf certificate) pair read back from disk, or None if absent or unusable."""
    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(key_path, "rb") as f:
            key = load_pem_private_key(f.read(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if key.public_key() != cert.public_key():
        return None
    return key, cert


def _dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return san.value.get_values_for_type(x509.DNSName)


def _ip_addresses(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(a) for a in san.value.get_values_for_type(x509.IPAddress)]


def _leaf_fits(
    pair: KeyPair | None,
    ca_cert: x509.Certificate,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
) -> bool:
    """Whether an existing leaf was issued by C{ca_cert} for these names and is still valid."""
    if pair is None:
        return False
    cert = pair[1]
    if not _pki.verify_issued_by(cert, ca_cert):
        return False
    if not (cert.not_valid_before_utc <= _now() < cert.not_valid_after_utc):
        return False
    return sorted(_dns_names(cert)) == sorted(dns_names) and sorted(_ip_addresses(cert)) == sorted(
        ip_addresses
    )


def _leaf_days(ca_cert: x509.Certificate) -> int:
    """L{LEAF_DAYS}, or fewer under a CA that expires sooner (a leaf never outlives its CA)."""
    left = (ca_cert.not_valid_after_utc - _now()).days
    return max(1, min(LEAF_DAYS, left))


def _create_dev_pki(
    out_dir: str | os.PathLike[str],
    edge_name: str,
    node_names: Iterable[str],
    overwrite: bool,
) -> tuple[dict[str, str], list[str]]:
    nodes = list(dict.fromkeys(node_names))
    for name in nodes:
        if not _NODE_NAME.match(name):
            raise ValueError(
                f"node name {name!r}: must be a DNS label (letters, digits and '-', "
                "at most 63 characters)"
            )
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    def path(filename: str) -> str:
        return os.path.join(out_dir, filename)

    paths: dict[str, str] = {}
    written: list[str] = []

    ca = None if overwrite else _load_pair(path("ca.crt"), path("ca.key"))
    if ca is None:
        ca = make_ca("IOP dev CA")
        write_pem(path("ca.key"), ca[0])
        write_pem(path("ca.crt"), ca[1])
        written += [path("ca.crt"), path("ca.key")]
        # Everything signed by an earlier CA is now useless.
        overwrite = True
    paths["ca.crt"], paths["ca.key"] = path("ca.crt"), path("ca.key")

    leaves: list[tuple[str, list[str], list[str], bool, bool]] = [
        ("edge", [edge_name, "localhost"], ["127.0.0.1"], False, True)
    ]
    leaves += [(f"node-{n}", [node_workload_name(n)], [], True, False) for n in nodes]
    for stem, dns, ips, client, server in leaves:
        crt, key = path(f"{stem}.crt"), path(f"{stem}.key")
        existing = None if overwrite else _load_pair(crt, key)
        if not _leaf_fits(existing, ca[1], dns, ips):
            leaf_key, leaf_cert = issue(
                ca,
                dns_names=dns,
                ip_addresses=ips,
                client=client,
                server=server,
                days=_leaf_days(ca[1]),
            )
            write_pem(key, leaf_key)
            write_pem(crt, leaf_cert)
            written += [crt, key]
        paths[f"{stem}.crt"], paths[f"{stem}.key"] = crt, key
    return paths, written


def create_dev_pki(
    out_dir: str | os.PathLike[str],
    *,
    edge_name: str = DEFAULT_EDGE_NAME,
    node_names: Iterable[str] = DEFAULT_NODE_NAMES,
    overwrite: bool = False,
) -> dict[str, str]:
    """
    Write a dev PKI into C{out_dir} (created if needed):

    - C{ca.crt}, C{ca.key}: the CA (the key is kept so that nodes can be added later);
    - C{edge.crt}, C{edge.key}: server certificate for DNS C{edge_name}, DNS C{localhost} and
      IP C{127.0.0.1};
    - C{node-<name>.crt}, C{node-<name>.key} per node: client certificate for DNS
      C{<name>.node.iop.internal}.

    Idempotent: without C{overwrite}, files already there are left alone as long as they still
    fit (the CA pair loads; a leaf was issued by that CA for the same names and has not
    expired); only what is missing or stale is (re)issued. A new CA re-issues every leaf. Keys
    are written with mode 0600.

    @return: file name (C{"ca.crt"}, C{"edge.key"}, C{"node-<name>.crt"}, …) → path.
    """
    paths, _ = _create_dev_pki(out_dir, edge_name, node_names, overwrite)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m iop.testing.pki",
        description="Create a development PKI for an IOP Edge and its Nodes (not for production).",
    )
    parser.add_argument("--out", required=True, help="directory to write into")
    parser.add_argument(
        "--edge-name", default=DEFAULT_EDGE_NAME, help="the Edge's workload name (DNS-ID)"
    )
    parser.add_argument(
        "--node",
        dest="nodes",
        action="append",
        metavar="NAME",
        help=f"a node name; its certificate carries NAME.{NODE_DOMAIN} (repeatable; "
        f"default: {' '.join(DEFAULT_NODE_NAMES)})",
    )
    parser.add_argument("--force", action="store_true", help="re-create everything")
    args = parser.parse_args(argv)
    nodes = args.nodes if args.nodes else list(DEFAULT_NODE_NAMES)
    try:
        _, written = _create_dev_pki(args.out, args.edge_name, nodes, args.force)
    except (OSError, ValueError) as e:
        # PKIError is a ValueError; its message names the file, never key material.
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(f"wrote {p}")
    if not written:
        print(f"{args.out}: up to date, nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
