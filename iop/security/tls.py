# -*- test-case-name: iop.test.security.test_tls -*-
"""
TLS for the Edge-Node socket.

- :func:`server_context_factory` builds the Edge listener's TLS options from PEM files; with a
  client CA configured it requires and verifies Node client certificates (mTLS).
- :func:`client_connection_creator` builds what a Node dials with (an :class:`EdgeTLSCreator`):
  it verifies that the Edge certificate chains to the configured CA *and* carries the configured
  workload name (a DNS-ID, checked by ``service_identity``, independent of the address dialled).
  Instead of a CA file the node may know only the CA's pin (:func:`ca_pin`: the SHA-256 of its
  SubjectPublicKeyInfo, what a join string carries): then the Edge must present its CA after its
  certificate, and :func:`verify_pinned_chain` accepts the chain only if a certificate in it has
  the pinned key and the leaf is issued under it, valid now, for serverAuth, with the name. Both
  checks run in OpenSSL's verify callback, so a refused Edge never receives a byte from the node
  (its token), and the handshake ends with an alert the Edge counts. Why the node refused
  (:class:`EdgeRefused`: :class:`CAPinMismatch`, :class:`EdgeNameMismatch` with the names the
  certificate carries and the flag to change, :class:`EdgeCertificateRefused`) is one plain line
  the node's ``connectionLost`` gets from :func:`edge_refusal`; :func:`not_tls_answer` tells a
  peer that answered with something not TLS (an HTTP listener).
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

import datetime
import hashlib
import ipaddress
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
from cryptography.x509.verification import PolicyBuilder, Store
from cryptography.x509.verification import VerificationError as X509VerificationError
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
    trustRootFromCertificates,
)
from twisted.python.failure import Failure
from zope.interface import implementer

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


def client_connection_creator(tls: ClientTLS, edge: str = "") -> IOpenSSLClientConnectionCreator:
    """
    What a Node dials its Edge with (an :class:`EdgeTLSCreator`): the Edge certificate must
    chain to a CA in C{tls.ca_file} — or, with C{tls.ca_pin}, to the CA certificate in the chain
    the Edge presents whose key has that pin — and carry the workload name C{tls.server_name}
    (DNS-ID; checked whatever address is dialled, and sent as SNI). When
    C{tls.cert_file}/C{tls.key_file} are set, they are presented as the Node's client
    certificate (mTLS). TLS 1.2 or later. ``edge`` (``host:port``) is how refusals name the Edge.

    @raise TLSConfigError: as for L{server_context_factory}, or only one of cert_file/key_file
        is set, or server_name is not a usable name.
    """
    if not tls.server_name:
        raise TLSConfigError("TLS server_name: must name the Edge workload, e.g. edge.iop.internal")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise TLSConfigError(
            "TLS client certificate: cert_file and key_file must be given together"
        )
    extra: dict[str, Any] = {"raiseMinimumTo": MINIMUM_TLS_VERSION}
    if tls.ca_pin is None:
        # OpenSSL verifies the chain against the CA file; the callback adds the name check.
        extra["trustRoot"] = _trust_root(tls.ca_file, "TLS CA file")
    if tls.cert_file is not None and tls.key_file is not None:
        key, leaf, intermediates = _load_key_and_chain(tls.cert_file, tls.key_file)
        # cryptography objects, not a PrivateCertificate: pyOpenSSL 26 warns about its own
        # X509/PKey on every connection.
        extra.update(privateKey=key, certificate=leaf, extraCertChain=intermediates)
        _check_context(CertificateOptions(**extra), tls.cert_file, tls.key_file)
    try:
        sni = _sni_bytes(tls.server_name)
    except (UnicodeError, ValueError) as e:
        raise TLSConfigError(
            f"TLS server_name {tls.server_name!r}: not a usable name: {e}"
        ) from None
    return EdgeTLSCreator(CertificateOptions(**extra), tls, sni, edge or "the Edge")


def _sni_bytes(name: str) -> bytes | None:
    """What goes in SNI for ``name``: its IDNA form, or None for an IP address (never sent)."""
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    encoded = name.encode("idna")
    if not encoded or any(c.isspace() for c in name):
        raise ValueError("not a DNS name")
    return encoded


def ca_pin(cert: x509.Certificate) -> str:
    """
    A CA certificate's pin: ``sha256:`` and the hex SHA-256 of its DER SubjectPublicKeyInfo (the
    key, not the certificate: a CA re-issued with the same key keeps its pin).
    """
    return "sha256:" + hashlib.sha256(_public_der(cert.public_key())).hexdigest()


def ca_file_pin(path: str) -> str:
    """
    The pin of the CA certificate in the PEM file ``path``: its last certificate (a chain file,
    leaf first, ends with its CA).

    @raise TLSConfigError: the file holds no certificate, or its last one is not a CA.
    """
    cert = _load_certificates(path, "CA certificate file")[-1]
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise TLSConfigError(
            f"CA certificate file {path!r}: its last certificate ({_subject(cert)}) is not a CA"
        )
    return ca_pin(cert)


class EdgeRefused(Exception):
    """
    The Edge's TLS answer was refused (its certificate, or no TLS at all). The message is one
    plain line: what was expected, what came, the setting to change.

    @ivar retryable: whether waiting may fix it (an expired or not yet valid certificate may be
        re-issued, a clock corrected); a wrong pin, name or CA never heals by itself.
    """

    retryable = False


class CAPinMismatch(EdgeRefused):
    """No certificate the Edge presented has the pinned CA key, or it sent no CA to check."""


class EdgeNameMismatch(EdgeRefused):
    """
    The Edge's certificate does not carry the workload name the node requires.

    @ivar expected: that name. @ivar presented: the names the certificate carries.
    """

    def __init__(self, message: str, expected: str, presented: Sequence[str]) -> None:
        super().__init__(message)
        self.expected = expected
        self.presented = tuple(presented)


class EdgeCertificateRefused(EdgeRefused):
    """The Edge's certificate chain does not verify (another CA, expired, wrong usage...)."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def _subject(cert: x509.Certificate) -> str:
    try:
        text = cert.subject.rfc4514_string()
    except ValueError:
        text = "?"
    return "".join(c if c.isprintable() else "?" for c in text[:_SUBJECT_LIMIT]) or "(no subject)"


def _short_pin(pin: str) -> str:
    return f"{pin[:15]}…{pin[-4:]}"


def certificate_ip_addresses(cert: x509.Certificate) -> list[str]:
    """The IP addresses in C{cert}'s subjectAltName extension, as text."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(a) for a in san.value.get_values_for_type(x509.IPAddress)]


def _names(cert: x509.Certificate) -> list[str]:
    return certificate_dns_names(cert) + certificate_ip_addresses(cert)


def _carries_name(cert: x509.Certificate, name: str) -> bool:
    """Whether C{cert} names C{name}: a DNS-ID (wildcards as service_identity allows), or an IP."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        try:
            verify_certificate_hostname(cert, name)
        except (VerificationError, CertificateError):
            return False
        return True
    return any(ipaddress.ip_address(a) == address for a in certificate_ip_addresses(cert))


def check_edge_name(leaf: x509.Certificate, tls: ClientTLS, edge: str) -> None:
    """
    Check that the Edge's certificate C{leaf} carries C{tls.server_name} (or, when that name was
    defaulted, the dialled host C{tls.host_name}).

    @raise EdgeNameMismatch: it carries neither, with the names it does carry.
    """
    wanted = [tls.server_name] + ([tls.host_name] if tls.host_name else [])
    if any(_carries_name(leaf, name) for name in wanted):
        return
    presented = _names(leaf) or [f"no DNS name, CN {n}" for n in certificate_common_names(leaf)]
    shown = ", ".join(presented) if presented else "no name at all"
    fix = (
        f"pass --server-name {presented[0]} (node.yaml edge.server_name) if that is the Edge's "
        "workload name"
        if _names(leaf)
        else "issue the Edge a certificate for its workload name (iop pki issue-edge NAME)"
    )
    raise EdgeNameMismatch(
        f"the certificate of {edge} names {shown}, not {tls.server_name}, the Edge name this "
        f"node requires: {fix}",
        tls.server_name,
        _names(leaf),
    )


def verify_pinned_chain(
    chain: Sequence[x509.Certificate],
    tls: ClientTLS,
    edge: str,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """
    Verify the chain an Edge presented (leaf first) against the pinned CA C{tls.ca_pin}: a
    certificate of the chain must have the pinned key; the leaf must be issued under it (through
    the chain's intermediates), valid now, for server authentication, and carry the Edge's
    workload name (:func:`check_edge_name`). Returns the pinned CA certificate.

    @raise CAPinMismatch: no certificate has the pinned key (another Edge, or its CA changed),
        or the Edge sent only its own certificate.
    @raise EdgeNameMismatch: as for :func:`check_edge_name`.
    @raise EdgeCertificateRefused: the leaf does not verify under the pinned CA.
    """
    if not chain:
        raise CAPinMismatch(f"{edge} presented no certificate")
    assert tls.ca_pin is not None
    leaf = chain[0]
    pinned = [cert for cert in chain if ca_pin(cert) == tls.ca_pin]
    if not pinned:
        if len(chain) == 1:
            raise CAPinMismatch(
                f"{edge} sent only its own certificate (issued by {leaf.issuer.rfc4514_string()}),"
                " not its CA, so the join string's CA pin cannot be checked: its "
                "node_transport.tls.cert_file must hold the certificate then its CA "
                "(iop pki issue-edge writes both)"
            )
        presented = ", ".join(f"{_subject(c)} ({_short_pin(ca_pin(c))})" for c in chain[1:])
        raise CAPinMismatch(
            f"CA pin mismatch: no certificate {edge} presented has the CA key the join string "
            f"pins ({_short_pin(tls.ca_pin)}); it presented {presented}. It is another Edge, "
            "or its CA changed: print a new join line (iop node add)"
        )
    ca = pinned[0]
    check_edge_name(leaf, tls, edge)
    moment = now if now is not None else datetime.datetime.now(datetime.UTC)
    if moment > leaf.not_valid_after_utc:
        raise EdgeCertificateRefused(
            f"the certificate of {edge} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M}"
            " UTC: issue it again (iop pki issue-edge)",
            retryable=True,
        )
    if moment < leaf.not_valid_before_utc:
        raise EdgeCertificateRefused(
            f"the certificate of {edge} is not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: check this host's clock",
            retryable=True,
        )
    intermediates = [c for c in chain[1:] if c is not ca]
    subject = (
        x509.IPAddress(ipaddress.ip_address(tls.server_name))
        if _sni_bytes(tls.server_name) is None
        else x509.DNSName(tls.server_name)
    )
    named = [n for n in _names(leaf) if _carries_name(leaf, n)]
    if not _carries_name(leaf, tls.server_name) and named:
        # Matched through the defaulted host: verify for the name it carries.
        subject = (
            x509.DNSName(named[0])
            if named[0] in certificate_dns_names(leaf)
            else x509.IPAddress(ipaddress.ip_address(named[0]))
        )
    verifier = PolicyBuilder().store(Store([ca])).time(moment).build_server_verifier(subject)
    try:
        verifier.verify(leaf, intermediates)
    except X509VerificationError as e:
        raise EdgeCertificateRefused(
            f"the certificate of {edge} does not verify under the pinned CA {_subject(ca)}: {e}"
        ) from None
    return ca


@implementer(IOpenSSLClientConnectionCreator)
class EdgeTLSCreator:
    """
    The Node's client TLS for one Edge: SNI is the Edge's workload name; the Edge's certificate
    is checked in OpenSSL's verify callback, at depth 0, once the whole chain is known — so a
    refusal ends the handshake before any application byte (the node's token) is written.

    With a CA file, OpenSSL verifies the chain against it (its verdict stands) and the callback
    adds the name check. With a pin (``ClientTLS.ca_pin``) there is nothing for OpenSSL to trust:
    its verdict is ignored and :func:`verify_pinned_chain` decides, in Python, over the chain the
    Edge presented. Either way a refusal reaches the node's ``connectionLost`` as an
    :class:`EdgeRefused` (Twisted's ``failVerification``) with a message a person reads.
    """

    def __init__(
        self, options: CertificateOptions, tls: ClientTLS, sni: bytes | None, edge: str
    ) -> None:
        self._options = options
        self._tls = tls
        self._sni = sni
        self._edge = edge
        options.getContext()  # now: problems surface at start-up

    def clientConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        connection = SSL.Connection(self._options.getContext(), None)
        if self._sni is not None:
            connection.set_tlsext_host_name(self._sni)
        connection.set_verify(
            SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, self._verifier(tlsProtocol)
        )
        return connection

    def _verifier(self, tlsProtocol: Any) -> Any:
        tls, edge = self._tls, self._edge

        def refuse(connection: SSL.Connection, error: EdgeRefused) -> bool:
            # OpenSSL ends the handshake with an alert (the Edge counts a peer that refused
            # it); edge_refusal() tells the node's connectionLost why.
            _edge_refusals.setdefault(connection, error)
            return False

        def callback(
            connection: SSL.Connection, certificate: X509, code: int, depth: int, ok: int
        ) -> bool:
            if connection in _edge_refusals:
                return False
            try:
                if tls.ca_pin is None:
                    if not ok:
                        return refuse(
                            connection, _ca_file_refusal(tls, edge, code, depth, certificate)
                        )
                    if depth == 0:
                        check_edge_name(certificate.to_cryptography(), tls, edge)
                elif depth == 0:
                    # No trust anchor for OpenSSL here (its verdict is ignored): the chain the
                    # Edge presented is checked against the pin.
                    chain = connection.get_peer_cert_chain(as_cryptography=True) or []
                    verify_pinned_chain(chain, tls, edge)
            except EdgeRefused as e:
                return refuse(connection, e)
            except Exception as e:  # never raise into OpenSSL: refuse, saying what broke
                return refuse(
                    connection,
                    EdgeCertificateRefused(f"cannot check the certificate of {edge}: {e}"),
                )
            return True

        return callback


# Per live client connection (gone with it): why this node refused the Edge's certificate.
_edge_refusals: weakref.WeakKeyDictionary[SSL.Connection, EdgeRefused] = weakref.WeakKeyDictionary()


def edge_refusal(transport: object, reason: Failure) -> EdgeRefused | None:
    """
    Why this node refused the Edge's certificate on C{transport}, when C{reason} (what the
    node's ``connectionLost`` got) is the TLS error of that refusal; None otherwise.
    """
    if isinstance(reason.value, EdgeRefused):
        return reason.value
    if not isinstance(reason.value, SSL.Error):
        return None
    handle = ISystemHandle(transport, None)
    connection = handle.getHandle() if handle is not None else None
    if not isinstance(connection, SSL.Connection):
        return None
    return _edge_refusals.get(connection)


def _ca_file_refusal(
    tls: ClientTLS, edge: str, code: int, depth: int, certificate: X509
) -> EdgeCertificateRefused:
    """Why OpenSSL refused the Edge's chain against the CA file, as one line."""
    reason, words = _VERIFY_ERRORS.get(code, ("bad_certificate", f"X509 error {code}"))
    try:
        subject = _subject(certificate.to_cryptography())
    except Exception:
        subject = "?"
    where = f"its certificate ({subject})" if depth == 0 else f"its issuer {subject}"
    fix = {
        "unknown_ca": f"is {tls.ca_file} (edge.ca_file, --ca-file) the CA that issued it?",
        "expired": "issue it again (iop pki issue-edge)",
        "not_yet_valid": "check this host's clock",
        "wrong_usage": "issue it as a server certificate (iop pki issue-edge)",
    }.get(reason, f"checked against {tls.ca_file}")
    return EdgeCertificateRefused(
        f"{edge} presented a certificate this node refuses: {where}: {words}; {fix}",
        retryable=reason in ("expired", "not_yet_valid"),
    )


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


# What OpenSSL says when the bytes that came back are not TLS records (an HTTP listener's
# "HTTP/1.1 400 Bad Request", a plaintext protocol's greeting).
_NOT_TLS = (
    "wrong version number",
    "packet length too long",
    "http request",
    "record layer failure",
)


def not_tls_answer(error: SSL.Error) -> bool:
    """Whether a client handshake's C{error} says the peer answered with something not TLS."""
    words = _openssl_reason(error).lower()
    return any(phrase in words for phrase in _NOT_TLS)
