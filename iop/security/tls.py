# -*- test-case-name: iop.test.security.test_tls -*-
"""
TLS for the Edge-Node socket.

- :func:`server_context_factory` builds the Edge listener's TLS options from PEM files; with a
  client CA configured it requires and verifies Node client certificates (mTLS).
- :func:`client_connection_creator` builds what a Node dials with: it verifies that the Edge
  certificate chains to the configured CA *and* carries the configured workload name (a DNS-ID,
  checked by ``service_identity``, independent of the address dialled).
- :func:`verify_peer_workload` checks that an already CA-verified peer certificate (a Node's
  client certificate, read after the handshake with :func:`peer_certificate`) carries an exact
  workload name.

Keys and certificates are handed to Twisted/pyOpenSSL as ``cryptography`` objects: pyOpenSSL 26
deprecates its own ``X509``/``PKey`` objects and warns on every connection when given them.
Errors in the material raise :class:`TLSConfigError`, whose message names the file (never the
key material).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)
from OpenSSL import SSL
from OpenSSL.crypto import X509
from service_identity import CertificateError, VerificationError
from service_identity.cryptography import verify_certificate_hostname
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, ISSLTransport
from twisted.internet.ssl import (
    Certificate,
    CertificateOptions,
    TLSVersion,
    optionsForClientTLS,
    trustRootFromCertificates,
)

from iop.config.model import ClientTLS, ServerTLS

if TYPE_CHECKING:
    # Public interface, private module: twisted.internet.ssl does not re-export it.
    from twisted.internet._sslverify import IOpenSSLTrustRoot

# The lowest protocol version either end accepts. Passed as ``raiseMinimumTo`` so that a
# higher Twisted default still wins.
MINIMUM_TLS_VERSION = TLSVersion.TLSv1_2

#: Private keys usable for a TLS certificate.
TLSPrivateKey = (
    rsa.RSAPrivateKey
    | ec.EllipticCurvePrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)
_TLS_KEY_TYPES = (
    rsa.RSAPrivateKey,
    ec.EllipticCurvePrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
)


class TLSConfigError(Exception):
    """
    TLS material could not be loaded or does not fit together. The message names the file
    concerned; it never contains key material.
    """


class WorkloadIdentityError(Exception):
    """
    A peer certificate does not carry the expected workload name.

    @ivar expected: the workload name that was required.
    @ivar presented: the DNS names the certificate carries.
    """

    def __init__(self, expected: str, presented: Sequence[str], detail: str = "") -> None:
        self.expected = expected
        self.presented = tuple(presented)
        names = ", ".join(self.presented) if self.presented else "none"
        message = (
            f"peer certificate does not carry workload name {expected!r} (its DNS names: {names})"
        )
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)


# ---------------------------------------------------------------------------------------------
# Loading PEM material


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise TLSConfigError(f"{what} {path!r}: cannot read: {reason}") from None


def _load_certificates(path: str, what: str) -> list[x509.Certificate]:
    """All certificates in a PEM file, in file order."""
    data = _read(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSConfigError(f"{what} {path!r}: no valid PEM certificate found") from None
    if not certs:
        raise TLSConfigError(f"{what} {path!r}: no valid PEM certificate found")
    return certs


def _load_private_key(path: str, what: str) -> TLSPrivateKey:
    data = _read(path, what)
    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:
        # cryptography raises TypeError for an encrypted key without a password.
        raise TLSConfigError(
            f"{what} {path!r}: the private key is encrypted; an unencrypted PEM key is required"
        ) from None
    except ValueError:
        # Deliberately no detail from the parser: nothing about the file's content leaks.
        raise TLSConfigError(f"{what} {path!r}: not a valid unencrypted PEM private key") from None
    except UnsupportedAlgorithm:
        raise TLSConfigError(f"{what} {path!r}: unsupported private key") from None
    if not isinstance(key, _TLS_KEY_TYPES):
        raise TLSConfigError(
            f"{what} {path!r}: a {type(key).__name__} cannot be used for TLS "
            "(use an EC, RSA or Ed25519/Ed448 key)"
        )
    return key


def _public_der(key: Any) -> bytes:
    der: bytes = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return der


def _load_key_and_chain(
    cert_file: str, key_file: str
) -> tuple[TLSPrivateKey, x509.Certificate, list[x509.Certificate]]:
    """
    Load a certificate file (leaf first, then any intermediates) and its key, and check that
    the key belongs to the leaf.

    @return: (key, leaf, intermediates)
    """
    chain = _load_certificates(cert_file, "TLS certificate file")
    key = _load_private_key(key_file, "TLS private key file")
    public = _public_der(key.public_key())
    if _public_der(chain[0].public_key()) != public:
        if any(_public_der(c.public_key()) == public for c in chain[1:]):
            raise TLSConfigError(
                f"TLS certificate file {cert_file!r}: the certificate for key file "
                f"{key_file!r} is not the first one; put the leaf certificate first, "
                "then its intermediates"
            )
        raise TLSConfigError(
            f"TLS private key file {key_file!r} does not match the certificate in {cert_file!r}"
        )
    return key, chain[0], chain[1:]


def _trust_root(path: str, what: str) -> IOpenSSLTrustRoot:
    """Trust exactly the CA certificates in the PEM file at C{path}."""
    certs = _load_certificates(path, what)
    # X509.from_cryptography is not deprecated; the trust store API only takes X509 objects.
    roots = [Certificate(X509.from_cryptography(c)) for c in certs]  # type: ignore[no-untyped-call]
    trust_root: IOpenSSLTrustRoot = trustRootFromCertificates(roots)  # type: ignore[no-untyped-call]
    return trust_root


def _check_context(options: CertificateOptions, cert_file: str, key_file: str) -> None:
    """Build the OpenSSL context now, so that problems surface at start-up, not per connection."""
    try:
        options.getContext()
    except SSL.Error as e:
        raise TLSConfigError(
            f"TLS certificate file {cert_file!r} / key file {key_file!r}: rejected by OpenSSL: "
            f"{_openssl_reason(e)}"
        ) from None


def _openssl_reason(e: SSL.Error) -> str:
    # SSL.Error args: [[(library, function, reason), ...]]; only OpenSSL's reason strings.
    try:
        return "; ".join(str(entry[2]) for entry in e.args[0]) or "unknown error"
    except (IndexError, TypeError):
        return "unknown error"


# ---------------------------------------------------------------------------------------------
# Public API


def server_context_factory(tls: ServerTLS) -> CertificateOptions:
    """
    TLS options for the Edge's node listener (an C{IOpenSSLServerConnectionCreator} and
    C{IOpenSSLContextFactory}: usable with C{SSL4ServerEndpoint}, C{TLSMemoryBIOFactory} and
    C{listenSSL}).

    TLS 1.2 or later. C{tls.cert_file} may hold a chain: leaf first, then intermediates, which
    are sent to the peer. When C{tls.client_ca_file} is set, a client certificate is required
    and must chain to one of the CAs in that file; which workload it names is checked later with
    L{verify_peer_workload}.

    @raise TLSConfigError: a file is missing or unreadable, holds no PEM certificate/key, or the
        key does not match the certificate.
    """
    key, leaf, intermediates = _load_key_and_chain(tls.cert_file, tls.key_file)
    trust_root = (
        _trust_root(tls.client_ca_file, "TLS client CA file")
        if tls.client_ca_file is not None
        else None
    )
    # Twisted annotates privateKey/certificate/extraCertChain as pyOpenSSL types but passes them
    # straight to pyOpenSSL's Context, which prefers (and does not warn about) cryptography ones.
    options = CertificateOptions(
        privateKey=key,  # type: ignore[arg-type]
        certificate=leaf,  # type: ignore[arg-type]
        extraCertChain=intermediates,  # type: ignore[arg-type]
        # trustRoot implies verify=True and requireCertificate=True.
        trustRoot=trust_root,
        raiseMinimumTo=MINIMUM_TLS_VERSION,
    )
    _check_context(options, tls.cert_file, tls.key_file)
    return options


def client_connection_creator(tls: ClientTLS) -> IOpenSSLClientConnectionCreator:
    """
    What a Node dials its Edge with: the Edge certificate must chain to a CA in C{tls.ca_file}
    and carry the workload name C{tls.server_name} (DNS-ID; checked whatever address is dialled,
    and sent as SNI). When C{tls.cert_file}/C{tls.key_file} are set, they are presented as the
    Node's client certificate (mTLS). TLS 1.2 or later.

    @raise TLSConfigError: as for L{server_context_factory}, or only one of cert_file/key_file
        is set, or server_name is not a usable name.
    """
    if not tls.server_name:
        raise TLSConfigError("TLS server_name: must name the Edge workload, e.g. edge.iop.internal")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise TLSConfigError(
            "TLS client certificate: cert_file and key_file must be given together"
        )
    trust_root = _trust_root(tls.ca_file, "TLS CA file")
    extra: dict[str, Any] = {"raiseMinimumTo": MINIMUM_TLS_VERSION}
    if tls.cert_file is not None and tls.key_file is not None:
        key, leaf, intermediates = _load_key_and_chain(tls.cert_file, tls.key_file)
        # Not clientCertificate=PrivateCertificate(...): optionsForClientTLS would pass its
        # pyOpenSSL objects on, and pyOpenSSL 26 warns about those on every connection.
        extra.update(privateKey=key, certificate=leaf, extraCertChain=intermediates)
        _check_context(
            CertificateOptions(
                privateKey=key,  # type: ignore[arg-type]
                certificate=leaf,  # type: ignore[arg-type]
                extraCertChain=intermediates,  # type: ignore[arg-type]
            ),
            tls.cert_file,
            tls.key_file,
        )
    try:
        return optionsForClientTLS(
            tls.server_name, trustRoot=trust_root, extraCertificateOptions=extra
        )
    except (UnicodeError, ValueError) as e:
        raise TLSConfigError(
            f"TLS server_name {tls.server_name!r}: not a usable name: {e}"
        ) from None


def certificate_dns_names(cert: x509.Certificate) -> list[str]:
    """The DNS names in C{cert}'s subjectAltName extension (empty when it has none)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return san.value.get_values_for_type(x509.DNSName)


def certificate_common_names(cert: x509.Certificate) -> list[str]:
    """The subject commonName values of C{cert} (never a workload name: only for messages)."""
    return [
        str(attribute.value)
        for attribute in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    ]


def peer_certificate(transport: object) -> x509.Certificate | None:
    """
    The certificate the peer of C{transport} presented in its TLS handshake, or None: not a
    TLS transport, or no certificate (a server without a client CA does not ask for one).

    Only meaningful once the handshake is done: a connection's first application data arrives
    after it.
    """
    tls = ISSLTransport(transport, None)
    if tls is None:
        return None
    peer: Any = tls.getPeerCertificate()
    if peer is None:
        return None
    # pyOpenSSL's X509 → cryptography; not deprecated, and it does not warn.
    cert: x509.Certificate = peer.to_cryptography()
    return cert


def verify_peer_workload(cert: x509.Certificate, expected_name: str) -> None:
    """
    Check that C{cert} — a peer certificate that TLS has already verified against the CA —
    names the workload C{expected_name} as a DNS subjectAltName.

    The check is C{service_identity}'s DNS-ID check, made exact: a wildcard name
    (C{*.node.iop.internal}) would let one certificate stand for every workload, so a match
    only through a wildcard is refused.

    @raise WorkloadIdentityError: the certificate does not carry C{expected_name}.
    """
    presented = certificate_dns_names(cert)
    try:
        verify_certificate_hostname(cert, expected_name)
    except (VerificationError, CertificateError) as e:
        raise WorkloadIdentityError(expected_name, presented) from e
    wanted = expected_name.rstrip(".").lower()
    if not any(name.rstrip(".").lower() == wanted for name in presented):
        raise WorkloadIdentityError(
            expected_name, presented, "matched only through a wildcard name"
        )
