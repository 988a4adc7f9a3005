# -*- test-case-name: iop.test.security.test_pki -*-
"""
Certificates for the Edge-Node socket: a CA, the Edge's server certificate and each node's
client certificate, carrying the workload names managed mode checks.

- :func:`make_ca` makes a self-signed root CA (or, with ``issuer=``, an intermediate CA);
- :func:`issue_edge` issues the Edge's server certificate: DNS-ID = the Edge workload name (what
  nodes put in ``edge.server_name``), extendedKeyUsage serverAuth only;
- :func:`issue_node` issues a node's client certificate: DNS-ID
  ``<node-id>.node.<trust domain>`` (:func:`node_workload_name`, the name the Edge requires),
  extendedKeyUsage clientAuth only;
- :func:`issue` is the general leaf both use (the dev PKI in ``iop.testing.pki`` adds
  ``localhost`` and ``127.0.0.1`` with it);
- :func:`write_pem` writes PEM files atomically: private keys mode 0600, never replacing an
  existing file unless asked;
- :func:`init_ca_files`, :func:`issue_edge_files`, :func:`issue_node_files` lay the files out in
  one directory (``ca.crt``/``ca.key``, ``<name>.crt``/``<name>.key``): what ``iop pki`` does.
  The Edge's ``<name>.crt`` holds its certificate then the CA's: the Edge presents the CA in its
  chain, which is how a node joining with only the CA's pin (a join string) gets the CA.

Keys are EC P-256. Certificates are back-dated five minutes so that a little clock skew does not
make them "not yet valid". A leaf never outlives the CA that signs it.

Every refusal raises :class:`PKIError`, whose message names the file or the value concerned and
never contains key material.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from iop.config.checks import ID_PATTERN
from iop.config.model import DEFAULT_TRUST_DOMAIN, EdgeSecurity

PrivateKey = ec.EllipticCurvePrivateKey
#: A private key and the certificate for it.
KeyPair = tuple[PrivateKey, x509.Certificate]

DEFAULT_CA_NAME = "IOP CA"
CA_DAYS = 3650
LEAF_DAYS = 365
CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
# Certificates are back-dated a little so that small clock skew does not make them "not yet valid".
BACKDATE = datetime.timedelta(minutes=5)

_MAX_DNS_NAME = 253
# One label of a DNS name we put in a certificate (RFC 1123, lowercase): the names are compared
# in lowercase, and managed-mode config holds node ids and the trust domain to the same rule.
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_DNS_RULE = (
    "dot-separated labels of 1-63 lowercase letters, digits and '-', not starting or ending "
    "with '-' (no wildcard, no trailing dot)"
)


class PKIError(ValueError):
    """
    A certificate cannot be made as asked, or the PKI files cannot be used. The message names
    the file or value concerned; it never contains key material.
    """


# ---------------------------------------------------------------------------------------------
# Names


def _dns_problem(name: str) -> str | None:
    """Why C{name} is not a lowercase DNS name, or None."""
    if not name:
        return "must not be empty"
    if name != name.lower():
        return f"DNS names are compared in lowercase: write {name.lower()!r}"
    if len(name) > _MAX_DNS_NAME:
        return f"longer than {_MAX_DNS_NAME} characters"
    if not all(_LABEL.match(label) for label in name.split(".")):
        return f"must be a DNS name: {_DNS_RULE}"
    return None


def check_dns_name(name: str, what: str = "DNS name") -> None:
    """
    Refuse anything but a plain lowercase host name: no wildcard, no IP address, no trailing
    dot, no underscore.

    @raise PKIError: naming C{what} and the value.
    """
    problem = _dns_problem(name)
    if problem is not None:
        raise PKIError(f"{what} {name!r}: {problem}")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return
    raise PKIError(f"{what} {name!r}: must be a DNS name, not an IP address")


def check_node_id(node_id: str) -> None:
    """
    A node id must be a valid edge.yaml node id (letters, digits, '.', '_' and '-') that can be
    part of its workload DNS name, as managed mode requires: lowercase letters, digits, '-' and
    '.', each part starting and ending with a letter or digit.

    @raise PKIError: naming the id.
    """
    if not node_id:
        raise PKIError("node id: must not be empty")
    if not ID_PATTERN.match(node_id):
        raise PKIError(
            f"node id {node_id!r}: must contain only letters, digits, '.', '_' and '-' "
            "(as nodes[].id in edge.yaml)"
        )
    problem = _dns_problem(node_id)
    if problem is not None:
        raise PKIError(
            f"node id {node_id!r}: is part of the certificate's DNS name "
            f"(<id>.node.<trust domain>): {problem}"
        )


def node_workload_name(node_id: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    """
    The DNS-ID a node's client certificate carries, C{<node-id>.node.<trust domain>}: exactly
    the name the Edge requires (L{EdgeSecurity.node_workload}).

    @raise PKIError: the node id or trust domain is not usable.
    """
    check_node_id(node_id)
    check_dns_name(trust_domain, "trust domain")
    name = EdgeSecurity(trust_domain=trust_domain).node_workload(node_id)
    if len(name) > _MAX_DNS_NAME:
        raise PKIError(f"workload name {name!r}: longer than {_MAX_DNS_NAME} characters")
    return name


# ---------------------------------------------------------------------------------------------
# Making certificates


def new_key() -> PrivateKey:
    """A fresh EC P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def _now(now: datetime.datetime | None) -> datetime.datetime:
    return now if now is not None else datetime.datetime.now(datetime.UTC)


def _check_days(days: int, what: str) -> None:
    if days < 1:
        raise PKIError(f"{what}: validity must be at least 1 day (got {days})")


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    common_name: str,
    *,
    issuer: KeyPair | None = None,
    days: int = CA_DAYS,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """
    A CA key and certificate: self-signed, or signed by C{issuer} (an intermediate CA, which may
    then only sign leaves).
    """
    _check_days(days, "CA certificate")
    if not common_name.strip():
        raise PKIError("CA name: must not be empty")
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now(now)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - BACKDATE)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(
            x509.BasicConstraints(ca=True, path_length=None if issuer is None else 0),
            critical=True,
        )
        .add_extension(_key_usage(ca=True), critical=True)
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
    now: datetime.datetime | None = None,
) -> KeyPair:
    """
    Issue a leaf certificate signed by C{ca} (a C{(key, certificate)} pair).

    @param dns_names: DNS subjectAltNames (workload names); the first is also the subject CN
        unless C{common_name} is given.
    @param ip_addresses: IP subjectAltNames, as text.
    @param client: allow TLS client authentication (extendedKeyUsage clientAuth).
    @param server: allow TLS server authentication (extendedKeyUsage serverAuth).
    @raise PKIError: no name, no usage, or the certificate would outlive the CA.
    """
    if not dns_names and not ip_addresses:
        raise PKIError("a certificate needs at least one DNS name or IP address")
    if not (client or server):
        raise PKIError("a certificate must allow client or server authentication")
    _check_days(days, "certificate")
    ca_key, ca_cert = ca
    start = _now(now)
    end = start + datetime.timedelta(days=days)
    if end > ca_cert.not_valid_after_utc:
        raise PKIError(
            f"a {days}-day certificate would outlive its CA (valid until "
            f"{ca_cert.not_valid_after_utc:%Y-%m-%d}); issue it for fewer days or make a new CA"
        )
    key = new_key()
    cn = common_name or (dns_names[0] if dns_names else ip_addresses[0])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - BACKDATE)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
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


def issue_edge(
    ca: KeyPair, name: str, *, days: int = LEAF_DAYS, now: datetime.datetime | None = None
) -> KeyPair:
    """
    The Edge's server certificate: DNS-ID C{name} (the Edge workload name nodes check, their
    C{edge.server_name}) and nothing else; serverAuth only.

    @raise PKIError: C{name} is not a DNS name, or as for L{issue}.
    """
    check_dns_name(name, "Edge name")
    return issue(ca, dns_names=[name], server=True, client=False, days=days, now=now)


def issue_node(
    ca: KeyPair,
    node_id: str,
    *,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    days: int = LEAF_DAYS,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """
    A node's client certificate: DNS-ID L{node_workload_name}C{(node_id, trust_domain)} and
    nothing else; clientAuth only.

    @raise PKIError: the node id or trust domain is not usable, or as for L{issue}.
    """
    workload = node_workload_name(node_id, trust_domain)
    return issue(ca, dns_names=[workload], server=False, client=True, days=days, now=now)


# ---------------------------------------------------------------------------------------------
# Files


def _describe(e: OSError) -> str:
    return e.strerror or type(e).__name__


def write_pem(
    path: str | os.PathLike[str],
    *items: x509.Certificate | PrivateKey,
    overwrite: bool = False,
) -> None:
    """
    Write certificates and/or private keys to C{path} as PEM, in the order given (a chain file:
    leaf first, then intermediates). A file holding a key gets mode 0600 (from its creation on),
    others 0644.

    The file appears atomically: a reader never sees half a file. Without C{overwrite}, an
    existing C{path} is never replaced (checked atomically, by hard-linking the finished file
    into place).

    @raise PKIError: C{path} exists and C{overwrite} is false, or it cannot be written.
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
    try:
        # mkstemp creates the file with mode 0600, so a key is never readable by others.
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pem")
    except OSError as e:
        raise PKIError(f"{directory!r}: cannot write: {_describe(e)}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if not secret:
                os.fchmod(f.fileno(), 0o644)
            f.write(b"".join(chunks))
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except OSError as e:
        raise PKIError(f"{path!r}: cannot write: {_describe(e)}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _link_new(tmp: str, path: str) -> None:
    """Put C{tmp} at C{path} only if nothing is there yet."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise PKIError(f"{path!r} exists; refusing to overwrite it") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        # A file system without hard links: the check is no longer atomic, but still made.
        if os.path.lexists(path):
            raise PKIError(f"{path!r} exists; refusing to overwrite it") from None
        os.replace(tmp, path)


def write_pair(
    pair: KeyPair,
    cert_path: str,
    key_path: str,
    *,
    overwrite: bool = False,
    chain: Sequence[x509.Certificate] = (),
) -> None:
    """
    Write a key and its certificate (followed by C{chain}, its issuers, in the certificate
    file). Without C{overwrite}, nothing is written if either file already exists. The key is
    written first: a certificate is never left without its key.
    """
    if not overwrite:
        for path in (cert_path, key_path):
            if os.path.lexists(path):
                raise PKIError(f"{path!r} exists; refusing to overwrite it (--force replaces it)")
    key, cert = pair
    write_pem(key_path, key, overwrite=overwrite)
    write_pem(cert_path, cert, *chain, overwrite=overwrite)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise PKIError(f"{what} {path!r}: not found (run `iop pki init` first)") from None
    except OSError as e:
        raise PKIError(f"{what} {path!r}: cannot read: {_describe(e)}") from None


def load_ca(cert_path: str, key_path: str, *, now: datetime.datetime | None = None) -> KeyPair:
    """
    Load a CA written by L{init_ca_files} and check that it can sign: the certificate is a
    valid CA certificate now, and the key (an unencrypted EC key) belongs to it.

    @raise PKIError: naming the file at fault.
    """
    cert_data = _read(cert_path, "CA certificate")
    try:
        cert = x509.load_pem_x509_certificate(cert_data)
    except ValueError:
        raise PKIError(f"CA certificate {cert_path!r}: not a PEM certificate") from None
    data = _read(key_path, "CA key")
    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:
        raise PKIError(
            f"CA key {key_path!r}: encrypted; an unencrypted PEM key is needed"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        # No detail from the parser: nothing about the file's content leaks.
        raise PKIError(f"CA key {key_path!r}: not a valid PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError(f"CA key {key_path!r}: not an EC key (`iop pki init` makes one)")
    if key.public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo):
        raise PKIError(f"CA key {key_path!r} does not belong to CA certificate {cert_path!r}")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise PKIError(f"CA certificate {cert_path!r}: not a CA certificate")
    at = _now(now)
    if not (cert.not_valid_before_utc <= at < cert.not_valid_after_utc):
        raise PKIError(
            f"CA certificate {cert_path!r}: not valid now (valid "
            f"{cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d})"
        )
    return key, cert


@dataclass(frozen=True)
class IssuedFiles:
    """What one PKI operation wrote: the certificate and key files, the names it carries."""

    cert_file: str
    key_file: str
    # The DNS-IDs (a leaf) or the subject common name (a CA).
    names: tuple[str, ...]
    not_after: datetime.datetime


def _prepare(directory: str | os.PathLike[str]) -> str:
    directory = os.fspath(directory)
    try:
        # A new directory is the owner's only: it holds private keys.
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        raise PKIError(f"{directory!r}: cannot create: {_describe(e)}") from None
    return directory


def _leaf_paths(directory: str, stem: str) -> tuple[str, str]:
    if stem == os.path.splitext(CA_CERT_FILE)[0]:
        raise PKIError(f"{stem!r}: its files would be the CA's ({CA_CERT_FILE}, {CA_KEY_FILE})")
    return os.path.join(directory, f"{stem}.crt"), os.path.join(directory, f"{stem}.key")


def _ca_paths(directory: str) -> tuple[str, str]:
    return os.path.join(directory, CA_CERT_FILE), os.path.join(directory, CA_KEY_FILE)


def init_ca_files(
    directory: str | os.PathLike[str],
    *,
    name: str = DEFAULT_CA_NAME,
    days: int = CA_DAYS,
    force: bool = False,
) -> IssuedFiles:
    """
    Make a new root CA in C{directory} (created, mode 0700, if needed): C{ca.crt} and C{ca.key}
    (mode 0600). Without C{force} an existing CA is never replaced.
    """
    cert_path, key_path = _ca_paths(os.fspath(directory))
    if not force:
        for path in (cert_path, key_path):
            if os.path.lexists(path):
                raise PKIError(
                    f"{path!r} exists; refusing to replace the CA (--force does, and every "
                    "certificate it signed stops being accepted once the new ca.crt is deployed)"
                )
    pair = make_ca(name, days=days)
    directory = _prepare(directory)
    write_pair(pair, cert_path, key_path, overwrite=force)
    return IssuedFiles(cert_path, key_path, (name,), pair[1].not_valid_after_utc)


def _issue_files(
    directory: str | os.PathLike[str],
    stem: str,
    make: Callable[[KeyPair], KeyPair],
    force: bool,
    with_ca: bool = False,
) -> IssuedFiles:
    directory = os.fspath(directory)
    cert_path, key_path = _leaf_paths(directory, stem)
    ca = load_ca(*_ca_paths(directory))
    pair = make(ca)
    write_pair(pair, cert_path, key_path, overwrite=force, chain=(ca[1],) if with_ca else ())
    san = pair[1].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = tuple(san.get_values_for_type(x509.DNSName))
    return IssuedFiles(cert_path, key_path, names, pair[1].not_valid_after_utc)


def issue_edge_files(
    directory: str | os.PathLike[str],
    name: str,
    *,
    days: int = LEAF_DAYS,
    force: bool = False,
) -> IssuedFiles:
    """
    Issue the Edge's server certificate (L{issue_edge}) with the CA in C{directory}: writes
    C{<name>.crt} (the certificate, then the CA's: the Edge presents both, so a node that joins
    with a join string finds the CA it pins in the chain) and C{<name>.key} (mode 0600) there.
    Without C{force} nothing is replaced.
    """
    check_dns_name(name, "Edge name")
    return _issue_files(
        directory, name, lambda ca: issue_edge(ca, name, days=days), force, with_ca=True
    )


def issue_node_files(
    directory: str | os.PathLike[str],
    node_id: str,
    *,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    days: int = LEAF_DAYS,
    force: bool = False,
) -> IssuedFiles:
    """
    Issue a node's client certificate (L{issue_node}) with the CA in C{directory}: writes
    C{<node-id>.crt} and C{<node-id>.key} (mode 0600) there. Without C{force} nothing is
    replaced.
    """
    node_workload_name(node_id, trust_domain)
    return _issue_files(
        directory,
        node_id,
        lambda ca: issue_node(ca, node_id, trust_domain=trust_domain, days=days),
        force,
    )


def verify_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """Whether C{cert} carries a valid signature of C{ca_cert}'s key."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
