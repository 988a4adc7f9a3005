# -*- test-case-name: iop.test.security.test_tls -*-
"""
A small development/test PKI built with ``cryptography`` (EC P-256, so it is fast).

- :func:`make_ca` makes a self-signed root CA (or, with ``issuer=``, an intermediate CA);
- :func:`issue` issues a leaf certificate with DNS/IP subjectAltNames for server and/or
  client authentication;
- :func:`write_pem` writes certificates and keys (keys with mode 0600);
- :func:`create_dev_pki` lays out the files a local Edge and its Nodes need.

Not for production: the CA key sits next to the certificates it signs.

Command line::

    python -m iop.testing.pki --out DIR [--edge-name NAME] [--node NAME ...] [--force]
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey
KeyPair = tuple[PrivateKey, x509.Certificate]

DEFAULT_EDGE_NAME = "edge.iop.internal"
DEFAULT_NODE_NAMES: tuple[str, ...] = ("node1",)
NODE_DOMAIN = "node.iop.internal"
CA_DAYS = 3650
LEAF_DAYS = 825
# Certificates are back-dated a little so that small clock skew does not make them "not yet valid".
_BACKDATE = datetime.timedelta(minutes=5)

_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)


def node_workload_name(node_name: str) -> str:
    """The DNS-ID a node's client certificate carries: C{<name>.node.iop.internal}."""
    return f"{node_name}.{NODE_DOMAIN}"


def _new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(common_name: str, *, issuer: KeyPair | None = None, days: int = CA_DAYS) -> KeyPair:
    """
    A CA key and certificate: self-signed, or signed by C{issuer} (an intermediate CA, which may
    then only sign leaves).
    """
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.BasicConstraints(ca=True, path_length=None if issuer is None else 0),
            critical=True,
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is None:
        signer_key, issuer_name = key, name
    else:
        signer_key, issuer_cert = issuer
        issuer_name = issuer_cert.subject
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()),
            critical=False,
        )
    cert = builder.issuer_name(issuer_name).sign(signer_key, hashes.SHA256())
    return key, cert


def issue(
    ca: KeyPair,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    client: bool = False,
    server: bool = True,
    days: int = LEAF_DAYS,
    common_name: str | None = None,
) -> KeyPair:
    """
    Issue a leaf certificate signed by C{ca} (a C{(key, certificate)} pair).

    @param dns_names: DNS subjectAltNames (workload names); the first is also the subject CN
        unless C{common_name} is given.
    @param ip_addresses: IP subjectAltNames, as text.
    @param client: allow TLS client authentication (extendedKeyUsage clientAuth).
    @param server: allow TLS server authentication (extendedKeyUsage serverAuth).
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a certificate needs at least one DNS name or IP address")
    if not (client or server):
        raise ValueError("a certificate must allow client or server authentication")
    ca_key, ca_cert = ca
    key = _new_key()
    cn = common_name or (dns_names[0] if dns_names else ip_addresses[0])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_pem(path: str | os.PathLike[str], *items: x509.Certificate | PrivateKey) -> None:
    """
    Write certificates and/or private keys to C{path} as PEM, in the order given (a chain file:
    leaf first, then intermediates). A file holding a key gets mode 0600, others 0644.

    The file is replaced atomically: a reader never sees half a file.
    """
    if not items:
        raise ValueError("nothing to write")
    chunks: list[bytes] = []
    secret = False
    for item in items:
        if isinstance(item, x509.Certificate):
            chunks.append(item.public_bytes(Encoding.PEM))
        else:
            secret = True
            chunks.append(item.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    # mkstemp creates the file with mode 0600, so a key is never readable by others.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            if not secret:
                os.fchmod(f.fileno(), 0o644)
            f.write(b"".join(chunks))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if not (cert.not_valid_before_utc <= _now() < cert.not_valid_after_utc):
        return False
    return sorted(_dns_names(cert)) == sorted(dns_names) and sorted(_ip_addresses(cert)) == sorted(
        ip_addresses
    )


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
                ca, dns_names=dns, ip_addresses=ips, client=client, server=server
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
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(f"wrote {p}")
    if not written:
        print(f"{args.out}: up to date, nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
