# -*- test-case-name: iop.test.security.test_lease -*-
"""
Managed credential leases: the Edge seals a provider secret to one node for one request's
scope; the node checks everything about it and opens it, once.

A lease (``ProviderTunnelRequest.credential_lease``) is a serialized
``CredentialLeaseEnvelope``::

    envelope = { payload: bytes, signature: Ed25519(issuer, CONTEXT || payload), issuer_key_id }
    payload  = CredentialLeasePayload {
        lease_id (16 random bytes), issued_at_ms, expires_at_ms,
        binding (CredentialBinding: principal, slot, route, profile, target, node_recipient,
                 credential_revision, route_revision, projection_generation, adapter,
                 upstream_origin),
        recipient_key_id, kem,
        sealed = HPKE.seal(recipient public key, secret, info = binding_info(binding)),
    }

The signature covers the exact payload bytes (with the constant :data:`SIGNATURE_CONTEXT` in
front, so a signature made for a lease can never be taken for one made for anything else);
the node verifies those bytes as they arrived and parses them only afterwards. Nothing is ever
re-serialized to be verified.

HPKE (RFC 9180, base mode) suite: the recipient key's KEM (DHKEM(X25519, HKDF-SHA256) or
ML-KEM-768+X25519), HKDF-SHA256, ChaCha20-Poly1305. ChaCha20-Poly1305 rather than AES-128-GCM
because a node may be a small box without AES instructions, where ChaCha20 is both faster and
free of table-lookup timing channels; for a secret of a few hundred bytes the cost is noise
either way. The binding is the HPKE ``info``: a seal opens only under the scope it was made
for, independently of the signature.

:class:`LeaseVerifier.open` checks, in this order, and stops at the first failure with a
:class:`LeaseError` whose :attr:`~LeaseError.code` is one of :data:`LEASE_ERRORS`:

===========================  ================================================================
``lease_missing``            no lease bytes
``lease_malformed``          not an envelope; a signed payload that is not a lease
``lease_bad_signature``      signed by another issuer key, or the signature does not verify
``lease_wrong_recipient``    sealed to another node, another recipient key, or another KEM
``lease_expired``            outside ``[issued_at - skew, expires_at + skew]``
``lease_binding_mismatch``   a field of the lease's binding differs from the request's
``lease_replay_cache_full``  too many live leases remembered to take one more (fail closed)
``lease_replayed``           this lease id was opened before and has not expired
``lease_unopenable``         validly signed, but the seal does not open with this node's key
===========================  ================================================================

The binding names the adapter instance that receives the request (its name on the node) and
the upstream origin the credential goes to (:func:`upstream_origin` of the adapter's base URL:
one rule on both sides). The verifier compares the lease's binding with the binding the node
computed from the request and the adapter that would serve it, so a lease minted for one
adapter or upstream is refused (``lease_binding_mismatch``) when replayed into a request for
another one on the same node.

The secret comes back as a ``bytearray`` the caller overwrites (:func:`zero`) as soon as it has
been used. (The HPKE library hands the plaintext over as an immutable ``bytes`` first; that
copy is dropped at once and cannot be overwritten from Python.) No error text, log event or
``repr`` here ever contains the secret: error details are composed from the lease's public
fields only.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Iterable
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from google.protobuf.message import DecodeError

from iop.config.model import MAX_LEASE_TTL_SEC
from iop.security.keys import (
    KEM_MLKEM768_X25519,
    KEM_X25519,
    IssuerPublicKey,
    IssuerSigningKey,
    RecipientPrivateKey,
    RecipientPublicKey,
)
from iop.wire import runtime_pb2 as pb

__all__ = [
    "BINDING_FIELDS",
    "LEASE_BAD_SIGNATURE",
    "LEASE_BINDING_MISMATCH",
    "LEASE_ERRORS",
    "LEASE_EXPIRED",
    "LEASE_ID_BYTES",
    "LEASE_MALFORMED",
    "LEASE_MISSING",
    "LEASE_REPLAYED",
    "LEASE_REPLAY_CACHE_FULL",
    "LEASE_UNOPENABLE",
    "LEASE_WRONG_RECIPIENT",
    "SIGNATURE_CONTEXT",
    "LeaseError",
    "LeaseVerifier",
    "NodeLeaseKeys",
    "ReplayCache",
    "binding_info",
    "issue_lease",
    "upstream_origin",
    "zero",
]

LEASE_MISSING = "lease_missing"
LEASE_MALFORMED = "lease_malformed"
LEASE_BAD_SIGNATURE = "lease_bad_signature"
LEASE_WRONG_RECIPIENT = "lease_wrong_recipient"
LEASE_EXPIRED = "lease_expired"
LEASE_BINDING_MISMATCH = "lease_binding_mismatch"
LEASE_REPLAY_CACHE_FULL = "lease_replay_cache_full"
LEASE_REPLAYED = "lease_replayed"
LEASE_UNOPENABLE = "lease_unopenable"
#: Every lease failure class, in the order :meth:`LeaseVerifier.open` checks.
LEASE_ERRORS = (
    LEASE_MISSING,
    LEASE_MALFORMED,
    LEASE_BAD_SIGNATURE,
    LEASE_WRONG_RECIPIENT,
    LEASE_EXPIRED,
    LEASE_BINDING_MISMATCH,
    LEASE_REPLAY_CACHE_FULL,
    LEASE_REPLAYED,
    LEASE_UNOPENABLE,
)

#: Signed in front of the payload bytes (domain separation of the issuer's signatures).
SIGNATURE_CONTEXT = b"iop-credential-lease-v1\0"
#: Starts :func:`binding_info` (and names its version: v2 added adapter and upstream_origin).
BINDING_INFO_CONTEXT = b"iop-credential-binding-v2\0"
LEASE_ID_BYTES = 16
_SIGNATURE_BYTES = 64
# A lease is a few hundred bytes (1.2 KB with the hybrid KEM); anything this large is not one.
MAX_LEASE_BYTES = 64 * 1024
DEFAULT_REPLAY_CAPACITY = 65536

#: The fields of ``CredentialBinding`` in :func:`binding_info` order, with their kinds; a test
#: pins this against the message's descriptor, so a new field cannot be left out.
BINDING_FIELDS: tuple[tuple[str, type], ...] = (
    ("principal", str),
    ("slot", str),
    ("route", str),
    ("profile", str),
    ("target", str),
    ("node_recipient", str),
    ("credential_revision", int),
    ("route_revision", int),
    ("projection_generation", int),
    ("adapter", str),
    ("upstream_origin", str),
)

_DEFAULT_PORTS = {"http": 80, "https": 443}

_HPKE_KEMS = {KEM_X25519: hpke.KEM.X25519, KEM_MLKEM768_X25519: hpke.KEM.MLKEM768_X25519}


class LeaseError(Exception):
    """
    A lease was refused. ``str()`` is ``"<code>: <detail>"``; the detail is composed from
    non-secret facts only (key ids, times, field names).
    """

    def __init__(self, code: str, detail: str) -> None:
        if code not in LEASE_ERRORS:
            raise ValueError(f"unknown lease error class {code!r}")
        super().__init__(code, detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


def zero(buf: bytearray) -> None:
    """Overwrite ``buf`` with zero bytes, in place."""
    buf[:] = bytes(len(buf))


def _suite(kem: str) -> hpke.Suite:
    return hpke.Suite(_HPKE_KEMS[kem], hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


def binding_info(binding: pb.CredentialBinding) -> bytes:
    """
    The canonical encoding of ``binding`` (the HPKE ``info`` of its seal):
    :data:`BINDING_INFO_CONTEXT`, then for each of :data:`BINDING_FIELDS` in order its field
    number (1 byte) and its value: a string as a 4-byte big-endian length and its UTF-8 bytes,
    an integer as 8 bytes big-endian. Unambiguous (every value is length-delimited or fixed
    size, every field tagged), and independent of protobuf's serializer.
    """
    out = [BINDING_INFO_CONTEXT]
    fields = pb.CredentialBinding.DESCRIPTOR.fields_by_name
    for name, kind in BINDING_FIELDS:
        value = getattr(binding, name)
        out.append(struct.pack(">B", fields[name].number))
        if kind is str:
            data = value.encode("utf-8")
            out.append(struct.pack(">I", len(data)))
            out.append(data)
        else:
            out.append(struct.pack(">Q", value))
    return b"".join(out)


def upstream_origin(url: str) -> str:
    """
    The origin a request to ``url`` goes to, as bound into a lease: ``scheme://host:port``,
    scheme and host in lower case, the port always explicit (80 for http, 443 for https), an
    IPv6 host in brackets; user info, path, query and fragment left out. :class:`ValueError`
    for a URL that is not absolute http(s) with a host.
    """
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        raise ValueError("not a valid URL") from None
    if scheme not in _DEFAULT_PORTS or not host:
        raise ValueError("not an absolute http(s) URL with a host")
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def issue_lease(
    *,
    binding: pb.CredentialBinding,
    secret: bytes,
    recipient: RecipientPublicKey,
    issuer: IssuerSigningKey,
    now: float,
    ttl_sec: float,
) -> bytes:
    """
    A serialized ``CredentialLeaseEnvelope`` carrying ``secret`` sealed to ``recipient`` for
    exactly ``binding``, valid from ``now`` for ``ttl_sec`` seconds, signed by ``issuer``. An
    empty ``secret`` is the lease of a provider that takes no credential: the request is still
    authorized for exactly ``binding``, and the node adds no header.
    """
    if not 0 < ttl_sec <= MAX_LEASE_TTL_SEC:
        raise ValueError(f"a lease lives more than 0 and at most {MAX_LEASE_TTL_SEC:g} seconds")
    if not binding.node_recipient:
        raise ValueError("a lease binding needs its node recipient")
    issued_at_ms = _ms(now)
    payload = pb.CredentialLeasePayload(
        lease_id=os.urandom(LEASE_ID_BYTES),
        issued_at_ms=issued_at_ms,
        expires_at_ms=issued_at_ms + _ms(ttl_sec),
        binding=binding,
        recipient_key_id=recipient.key_id,
        kem=recipient.kem,
        sealed=_suite(recipient.kem).encrypt(
            bytes(secret), recipient.hpke_key, info=binding_info(binding)
        ),
    ).SerializeToString()
    return pb.CredentialLeaseEnvelope(
        payload=payload,
        signature=issuer.sign(SIGNATURE_CONTEXT + payload),
        issuer_key_id=issuer.key_id,
    ).SerializeToString()


class ReplayCache:
    """
    The lease ids a node has opened, each kept until its lease can no longer be accepted
    (expiry + clock skew), then forgotten.

    Memory is bounded: expired ids are pruned on every :meth:`remember` (cheaply: a heap by
    expiry), and at most ``capacity`` live ids are held. When that many live leases are
    remembered, :meth:`full` says so and the verifier refuses new leases rather than forget an
    id that could still be replayed. Share one cache between all sessions of a node, so a
    reconnect does not open a replay window.
    """

    def __init__(self, capacity: int = DEFAULT_REPLAY_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a replay cache holds at least one lease id")
        self.capacity = capacity
        self._until: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self._until)

    def seen(self, lease_id: bytes, now: float) -> bool:
        """True while ``lease_id`` is remembered (until the time it was remembered until)."""
        until = self._until.get(lease_id)
        return until is not None and now <= until

    def full(self, now: float) -> bool:
        """True when no further id can be remembered at ``now`` without forgetting a live one."""
        self._prune(now)
        return len(self._until) >= self.capacity

    def remember(self, lease_id: bytes, until: float, now: float) -> None:
        """Remember ``lease_id`` until ``until`` (pruning what has expired at ``now`` first)."""
        self._prune(now)
        if until < now:
            return  # already past: nothing could be replayed
        if lease_id not in self._until and len(self._until) >= self.capacity:
            raise LeaseError(LEASE_REPLAY_CACHE_FULL, self.full_reason())
        previous = self._until.get(lease_id)
        if previous is None or until > previous:
            self._until[lease_id] = until
            heapq.heappush(self._heap, (until, lease_id))

    def full_reason(self) -> str:
        return f"{self.capacity} unexpired lease ids are remembered; refusing to forget one"

    def _prune(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] < now:
            until, lease_id = heapq.heappop(heap)
            if self._until.get(lease_id) == until:
                del self._until[lease_id]


def _mismatched(lease: pb.CredentialBinding, request: pb.CredentialBinding) -> Iterable[str]:
    for name, _ in BINDING_FIELDS:
        if getattr(lease, name) != getattr(request, name):
            yield name


class LeaseVerifier:
    """
    Opens the leases sent to one node (``node_id``), sealed to ``recipient`` and signed by
    ``issuer``, allowing ``clock_skew_sec`` either side of a lease's validity, refusing ids in
    ``replay``.
    """

    def __init__(
        self,
        *,
        node_id: str,
        recipient: RecipientPrivateKey,
        issuer: IssuerPublicKey,
        clock_skew_sec: float,
        replay: ReplayCache,
    ) -> None:
        if clock_skew_sec < 0:
            raise ValueError("clock skew cannot be negative")
        self.node_id = node_id
        self.recipient = recipient
        self.issuer = issuer
        self.clock_skew_sec = clock_skew_sec
        self.replay = replay

    def __repr__(self) -> str:
        return (
            f"<LeaseVerifier node={self.node_id} recipient={self.recipient.key_id}"
            f" issuer={self.issuer.key_id}>"
        )

    def open(self, lease: bytes, binding: pb.CredentialBinding, now: float) -> bytearray:
        """
        The secret of ``lease`` for a request bound by ``binding`` at ``now``, as a
        ``bytearray`` the caller zeroes after use; or :class:`LeaseError`. The lease id is
        remembered only once the seal has opened.
        """
        if not lease:
            raise LeaseError(LEASE_MISSING, "the request carries no credential lease")
        if len(lease) > MAX_LEASE_BYTES:
            raise LeaseError(LEASE_MALFORMED, f"{len(lease)} bytes is too large for a lease")
        try:
            envelope = pb.CredentialLeaseEnvelope.FromString(bytes(lease))
        except (DecodeError, ValueError):
            raise LeaseError(LEASE_MALFORMED, "not a credential lease envelope") from None
        if not envelope.payload or len(envelope.signature) != _SIGNATURE_BYTES:
            raise LeaseError(LEASE_MALFORMED, "the envelope lacks a payload or a signature")

        # The signature, over the payload bytes exactly as they arrived.
        if envelope.issuer_key_id != self.issuer.key_id:
            raise LeaseError(
                LEASE_BAD_SIGNATURE,
                f"signed by issuer key {envelope.issuer_key_id[:32]!r},"
                f" this node trusts {self.issuer.key_id!r}",
            )
        if not self.issuer.verify(envelope.signature, SIGNATURE_CONTEXT + envelope.payload):
            raise LeaseError(LEASE_BAD_SIGNATURE, "the signature does not verify")

        try:
            payload = pb.CredentialLeasePayload.FromString(envelope.payload)
        except (DecodeError, ValueError):
            raise LeaseError(LEASE_MALFORMED, "the signed payload is not a lease") from None
        if (
            len(payload.lease_id) != LEASE_ID_BYTES
            or not payload.HasField("binding")
            or not payload.sealed
        ):
            raise LeaseError(
                LEASE_MALFORMED, "the signed payload lacks a lease id, binding or seal"
            )
        lifetime_ms = payload.expires_at_ms - payload.issued_at_ms
        if not 0 < lifetime_ms <= _ms(MAX_LEASE_TTL_SEC):
            raise LeaseError(
                LEASE_MALFORMED,
                f"a lifetime of {lifetime_ms} ms is outside (0, {_ms(MAX_LEASE_TTL_SEC)}] ms",
            )
        lease_id = payload.lease_id.hex()

        leased = payload.binding
        if leased.node_recipient != self.node_id:
            raise LeaseError(
                LEASE_WRONG_RECIPIENT,
                f"lease {lease_id} is for node {leased.node_recipient[:128]!r}, not"
                f" {self.node_id!r}",
            )
        if payload.recipient_key_id != self.recipient.key_id or payload.kem != self.recipient.kem:
            raise LeaseError(
                LEASE_WRONG_RECIPIENT,
                f"lease {lease_id} is sealed to {payload.kem[:32]!r} key"
                f" {payload.recipient_key_id[:32]!r}; this node's key is {self.recipient.kem!r}"
                f" {self.recipient.key_id!r}",
            )

        now_ms = _ms(now)
        skew_ms = _ms(self.clock_skew_sec)
        if now_ms < payload.issued_at_ms - skew_ms:
            raise LeaseError(
                LEASE_EXPIRED,
                f"lease {lease_id} is not valid before {payload.issued_at_ms} ms"
                f" (now {now_ms} ms, skew {skew_ms} ms)",
            )
        if now_ms > payload.expires_at_ms + skew_ms:
            raise LeaseError(
                LEASE_EXPIRED,
                f"lease {lease_id} expired at {payload.expires_at_ms} ms"
                f" (now {now_ms} ms, skew {skew_ms} ms)",
            )

        mismatched = list(_mismatched(leased, binding))
        if mismatched:
            raise LeaseError(
                LEASE_BINDING_MISMATCH,
                f"lease {lease_id} binding differs from the request's in: {', '.join(mismatched)}",
            )

        if self.replay.seen(payload.lease_id, now):
            raise LeaseError(LEASE_REPLAYED, f"lease {lease_id} was already used")
        if self.replay.full(now):
            raise LeaseError(LEASE_REPLAY_CACHE_FULL, self.replay.full_reason())

        try:
            plain = _suite(self.recipient.kem).decrypt(
                payload.sealed, self.recipient.hpke_key, info=binding_info(leased)
            )
        except (InvalidTag, ValueError, TypeError):
            raise LeaseError(
                LEASE_UNOPENABLE, f"lease {lease_id} does not open with this node's key"
            ) from None
        secret = bytearray(plain)
        del plain
        self.replay.remember(payload.lease_id, (payload.expires_at_ms + skew_ms) / 1000.0, now)
        return secret


class NodeLeaseKeys:
    """
    What a managed node loads at startup to open leases: its ``recipient`` key, the
    ``issuer``'s public key, the clock skew it allows, and one :class:`ReplayCache` for the
    whole process (a reconnect must not forget the ids already opened). Each session gets its
    :meth:`verifier` once the Edge has told the node its id.
    """

    def __init__(
        self,
        *,
        recipient: RecipientPrivateKey,
        issuer: IssuerPublicKey,
        clock_skew_sec: float,
        replay: ReplayCache | None = None,
    ) -> None:
        if clock_skew_sec < 0:
            raise ValueError("clock skew cannot be negative")
        self.recipient = recipient
        self.issuer = issuer
        self.clock_skew_sec = clock_skew_sec
        self.replay = replay if replay is not None else ReplayCache()

    def announcement(self) -> pb.LeaseSupport:
        """What the node says about its lease keys when it registers (public key ids only)."""
        return pb.LeaseSupport(
            recipient_key_id=self.recipient.key_id,
            kem=self.recipient.kem,
            issuer_key_id=self.issuer.key_id,
        )

    def verifier(self, node_id: str) -> LeaseVerifier:
        """The verifier of the leases sent to ``node_id``."""
        return LeaseVerifier(
            node_id=node_id,
            recipient=self.recipient,
            issuer=self.issuer,
            clock_skew_sec=self.clock_skew_sec,
            replay=self.replay,
        )

    def __repr__(self) -> str:
        return (
            f"<NodeLeaseKeys recipient={self.recipient.kem}:{self.recipient.key_id}"
            f" issuer={self.issuer.key_id}>"
        )
