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
- :func:`handshake_refusal` says why a peer's TLS handshake failed, in plain words and as one
  label of :data:`REFUSAL_REASONS`: no certificate, another CA, expired, the wrong usage, not
  TLS at all. OpenSSL's handshake error only says "certificate verify failed"; which check
  failed is recorded, per connection, by a verify callback :func:`server_context_factory`
  installs that only looks (it answers what OpenSSL decided, so nothing about verification
  changes).

Keys and certificates are handed to Twisted/pyOpenSSL as ``cryptography`` objects: pyOpenSSL 26
deprecates its own ``X509``/``PKey`` objects and warns on every connection when given them.
Errors in the material raise :class:`TLSConfigError`, whose message names the file (never the
key material).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
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
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    ISSLTransport,
    ISystemHandle,
)
from twisted.internet.ssl import (
    Certificate,
    CertificateOptions,
    TLSVersion,
    optionsForClientTLS,
    trustRootFromCertificates,
)
from twisted.python.failure import Failure

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
    if trust_root is not None:
        # Same mode (verify, require a certificate), OpenSSL's own verdict: the callback only
        # notes which check failed, for handshake_refusal.
        context = options.getContext()
        context.set_verify(context.get_verify_mode(), _note_verify_failure)
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


# ---------------------------------------------------------------------------------------------
# Why a peer's handshake failed

#: The closed set of reasons a handshake on a TLS listener fails, as metric labels:
#: ``no_certificate`` (none sent where one is required), ``unknown_ca`` (not issued by a
#: trusted CA: another CA, a self-signed certificate, a missing intermediate), ``expired``,
#: ``not_yet_valid``, ``wrong_usage`` (its extended key usage does not allow this use),
#: ``bad_certificate`` (any other verification failure), ``peer_alert`` (the peer ended the
#: handshake: it did not accept this side's certificate or parameters) and ``protocol``
#: (anything else: not TLS at all, an old TLS version, no common cipher).
REFUSAL_REASONS = (
    "no_certificate",
    "unknown_ca",
    "expired",
    "not_yet_valid",
    "wrong_usage",
    "bad_certificate",
    "peer_alert",
    "protocol",
)

# X509_V_ERR_* codes → (reason, OpenSSL's own words for them).
_VERIFY_ERRORS: dict[int, tuple[str, str]] = {
    2: ("unknown_ca", "unable to get issuer certificate"),
    18: ("unknown_ca", "self-signed certificate"),
    19: ("unknown_ca", "self-signed certificate in certificate chain"),
    20: ("unknown_ca", "unable to get local issuer certificate"),
    21: ("unknown_ca", "unable to verify the first certificate"),
    9: ("not_yet_valid", "certificate is not yet valid"),
    10: ("expired", "certificate has expired"),
    26: ("wrong_usage", "unsuitable certificate purpose"),
    7: ("bad_certificate", "certificate signature failure"),
    23: ("bad_certificate", "certificate revoked"),
    28: ("bad_certificate", "certificate rejected"),
}
# The longest subject name kept for a message (it is the peer's text).
_SUBJECT_LIMIT = 200


@dataclass(frozen=True)
class VerifyFailure:
    """
    The first check that failed while verifying a peer's certificate chain.

    @ivar code: OpenSSL's X509_V_ERR_* number.
    @ivar depth: where in the chain: 0 is the peer's own certificate, 1 its issuer, ...
    @ivar subject: the subject of the certificate at that depth (RFC 4514), if readable.
    """

    code: int
    depth: int
    subject: str | None = None


@dataclass(frozen=True)
class HandshakeRefusal:
    """
    Why a TLS handshake failed.

    @ivar reason: one of L{REFUSAL_REASONS}.
    @ivar detail: in plain words, e.g. "certificate has expired".
    @ivar subject: the subject of the certificate that failed verification, if any.
    """

    reason: str
    detail: str
    subject: str | None = None


# Per live connection (the pyOpenSSL Connection, gone with it): its first verify failure.
_verify_failures: weakref.WeakKeyDictionary[SSL.Connection, VerifyFailure] = (
    weakref.WeakKeyDictionary()
)


def _note_verify_failure(
    connection: SSL.Connection, certificate: X509, code: int, depth: int, ok: int
) -> bool:
    """
    The verify callback: returns OpenSSL's own verdict C{ok}, unchanged, and notes the first
    failure. Never raises (an exception here would fail the handshake differently).
    """
    if not ok and connection not in _verify_failures:
        try:
            subject: str | None = certificate.to_cryptography().subject.rfc4514_string()
        except Exception:
            subject = None
        if subject is not None:
            # The peer's own text, bound for a log line: printable and short.
            subject = "".join(c if c.isprintable() else "?" for c in subject[:_SUBJECT_LIMIT])
        _verify_failures[connection] = VerifyFailure(code, depth, subject)
    return bool(ok)


def verify_failure(connection: SSL.Connection) -> VerifyFailure | None:
    """The first certificate check that failed on C{connection}, if one did."""
    return _verify_failures.get(connection)


def classify_refusal(error: SSL.Error, verify: VerifyFailure | None = None) -> HandshakeRefusal:
    """
    Why a handshake failed with C{error}, given what verification noted (L{verify_failure}).
    """
    if verify is not None:
        reason, words = _VERIFY_ERRORS.get(
            verify.code,
            ("bad_certificate", f"certificate verify failed (X509 error {verify.code})"),
        )
        if verify.depth > 0:
            words = f"{words} (its issuer at depth {verify.depth})"
        return HandshakeRefusal(reason, words, verify.subject)
    words = _openssl_reason(error)
    lowered = words.lower()
    if "peer did not return a certificate" in lowered:
        return HandshakeRefusal("no_certificate", "peer did not return a certificate")
    if "certificate verify failed" in lowered:
        return HandshakeRefusal("bad_certificate", words)
    if "alert" in lowered:
        return HandshakeRefusal("peer_alert", f"the peer ended the handshake: {words}")
    if "wrong version number" in lowered or "http request" in lowered:
        return HandshakeRefusal("protocol", f"not TLS: {words}")
    return HandshakeRefusal("protocol", words)


def handshake_refusal(transport: object, reason: Failure) -> HandshakeRefusal | None:
    """
    Why the TLS handshake on C{transport} failed, when C{reason} (what the application's
    C{connectionLost} got, before any C{handshakeCompleted}) is a TLS error; None when it is
    not (the peer left or was dropped, or the transport is not TLS).
    """
    error = reason.value
    if not isinstance(error, SSL.Error):
        return None
    handle = ISystemHandle(transport, None)
    connection = handle.getHandle() if handle is not None else None
    verify = verify_failure(connection) if isinstance(connection, SSL.Connection) else None
    return classify_refusal(error, verify)
