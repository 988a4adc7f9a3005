# -*- test-case-name: iop.test.security.test_lease -*-
"""
Tests for L{iop.security.lease}: issuing and opening credential leases, every failure class in
its place, the clock-skew edges, the replay window, the canonical binding encoding, and the
secret absent from every error and log event.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import MAX_LEASE_TTL_SEC
from iop.security import lease as L
from iop.security.keys import (
    KEM_MLKEM768_X25519,
    KEM_X25519,
    KEMS,
    IssuerSigningKey,
    RecipientPrivateKey,
    generate_issuer,
    generate_recipient,
    load_issuer_private,
    load_issuer_public,
    load_recipient_private,
    load_recipient_public,
    write_issuer,
    write_recipient,
)
from iop.security.lease import (
    BINDING_FIELDS,
    LEASE_ERRORS,
    LeaseError,
    LeaseVerifier,
    NodeLeaseKeys,
    ReplayCache,
    binding_info,
    issue_lease,
    upstream_origin,
    zero,
)
from iop.wire import runtime_pb2 as pb

SECRET = b"sk-test-3f9a0c1e7b2d4a6c8e0f1a2b3c4d5e6f"
NODE = "node-a"
NOW = 1_800_000_000.0
TTL = 30.0
SKEW = 5.0

# Module-level keys: generating ML-KEM keys per test would only slow the suite down.
ISSUER = generate_issuer()
RECIPIENTS = {kem: generate_recipient(kem) for kem in KEMS}


def binding(**changes: Any) -> pb.CredentialBinding:
    fields: dict[str, Any] = {
        "principal": "client-key-1",
        "slot": "openai-main",
        "route": "gpt-4o",
        "profile": "openai",
        "target": "gpt-4o-2024-08-06",
        "node_recipient": NODE,
        "credential_revision": 3,
        "route_revision": 7,
        "projection_generation": 11,
        "adapter": "openai",
        "upstream_origin": "https://api.example.net:443",
    }
    fields.update(changes)
    return pb.CredentialBinding(**fields)


class Harness:
    """A verifier for NODE and a lease maker, per KEM."""

    def __init__(self, kem: str = KEM_X25519, skew: float = SKEW) -> None:
        self.recipient: RecipientPrivateKey = RECIPIENTS[kem]
        self.issuer: IssuerSigningKey = ISSUER
        self.replay = ReplayCache()
        self.verifier = LeaseVerifier(
            node_id=NODE,
            recipient=self.recipient,
            issuer=ISSUER.public_key(),
            clock_skew_sec=skew,
            replay=self.replay,
        )

    def lease(self, now: float = NOW, ttl: float = TTL, **changes: Any) -> bytes:
        return issue_lease(
            binding=binding(**changes),
            secret=SECRET,
            recipient=self.recipient.public_key(),
            issuer=self.issuer,
            now=now,
            ttl_sec=ttl,
        )

    def open(self, lease: bytes, now: float = NOW, **changes: Any) -> bytearray:
        return self.verifier.open(lease, binding(**changes), now)


def resign(lease: bytes, edit: Callable[[pb.CredentialLeasePayload], None]) -> bytes:
    """``lease`` with its payload edited and validly signed again by the issuer."""
    envelope = pb.CredentialLeaseEnvelope.FromString(lease)
    payload = pb.CredentialLeasePayload.FromString(envelope.payload)
    edit(payload)
    raw = payload.SerializeToString()
    return pb.CredentialLeaseEnvelope(
        payload=raw,
        signature=ISSUER.sign(L.SIGNATURE_CONTEXT + raw),
        issuer_key_id=ISSUER.key_id,
    ).SerializeToString()


class LeaseTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.events = EventLoggingObserver()
        globalLogPublisher.addObserver(self.events)
        self.addCleanup(globalLogPublisher.removeObserver, self.events)
        self.addCleanup(self.assertNoSecretLogged)

    def assertNoSecretLogged(self) -> None:
        for event in self.events:
            text = formatEvent(event) + repr(event)
            self.assertNotIn(SECRET.decode(), text)
            self.assertNotIn(repr(SECRET)[2:-1], text)

    def assertRefused(
        self, code: str, call: Callable[..., object], *args: Any, **kwargs: Any
    ) -> LeaseError:
        with self.assertRaises(LeaseError) as caught:
            call(*args, **kwargs)
        error: LeaseError = caught.exception
        self.assertEqual(error.code, code, str(error))
        text = str(error)
        self.assertTrue(text.startswith(f"{code}: "), text)
        for shown in (text, repr(error), repr(error.args)):
            self.assertNotIn(SECRET.decode(), shown)
            self.assertNotIn(SECRET.hex(), shown)
        return error


class RoundTripTests(LeaseTestCase):
    def test_both_kems(self) -> None:
        for kem in KEMS:
            h = Harness(kem)
            secret = h.open(h.lease())
            self.assertIsInstance(secret, bytearray)
            self.assertEqual(bytes(secret), SECRET)

    def test_both_kems_through_files(self) -> None:
        """Keys written and loaded again issue and open leases as the originals do."""
        directory = self.mktemp()
        os.makedirs(directory)

        def path(name: str) -> str:
            return os.path.join(directory, name)

        issuer = generate_issuer()
        write_issuer(issuer, path("issuer.key"), path("issuer.pub"))
        for kem in KEMS:
            write_recipient(generate_recipient(kem), path(f"{kem}.key"), path(f"{kem}.pub"))
            lease = issue_lease(
                binding=binding(),
                secret=SECRET,
                recipient=load_recipient_public(path(f"{kem}.pub")),
                issuer=load_issuer_private(path("issuer.key")),
                now=NOW,
                ttl_sec=TTL,
            )
            verifier = LeaseVerifier(
                node_id=NODE,
                recipient=load_recipient_private(path(f"{kem}.key")),
                issuer=load_issuer_public(path("issuer.pub")),
                clock_skew_sec=SKEW,
                replay=ReplayCache(),
            )
            self.assertEqual(bytes(verifier.open(lease, binding(), NOW)), SECRET)

    def test_zero(self) -> None:
        secret = Harness().open(Harness().lease())
        zero(secret)
        self.assertEqual(len(secret), len(SECRET))
        self.assertEqual(bytes(secret), bytes(len(SECRET)))

    def test_zero_in_place(self) -> None:
        buf = bytearray(b"abc")
        view = memoryview(buf)
        zero(buf)
        self.assertEqual(view.tobytes(), b"\0\0\0")

    def test_lease_shape(self) -> None:
        h = Harness()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        self.assertEqual(envelope.issuer_key_id, ISSUER.key_id)
        self.assertEqual(len(envelope.signature), 64)
        payload = pb.CredentialLeasePayload.FromString(envelope.payload)
        self.assertEqual(len(payload.lease_id), 16)
        self.assertEqual(payload.issued_at_ms, int(NOW * 1000))
        self.assertEqual(payload.expires_at_ms, int(NOW * 1000) + 30_000)
        self.assertEqual(payload.binding, binding())
        self.assertEqual(payload.recipient_key_id, h.recipient.key_id)
        self.assertEqual(payload.kem, KEM_X25519)
        self.assertNotIn(SECRET, envelope.payload)

    def test_lease_ids_are_random(self) -> None:
        h = Harness()
        ids = {
            pb.CredentialLeasePayload.FromString(
                pb.CredentialLeaseEnvelope.FromString(h.lease()).payload
            ).lease_id
            for _ in range(20)
        }
        self.assertEqual(len(ids), 20)

    def test_issue_checks(self) -> None:
        h = Harness()
        for ttl in (0, -1, MAX_LEASE_TTL_SEC + 0.001):
            with self.assertRaises(ValueError):
                h.lease(ttl=ttl)
        h.lease(ttl=MAX_LEASE_TTL_SEC)
        with self.assertRaises(ValueError):
            h.lease(node_recipient="")
        # A provider without a credential: the lease authorizes the request, carries nothing.
        empty = issue_lease(
            binding=binding(),
            secret=b"",
            recipient=h.recipient.public_key(),
            issuer=ISSUER,
            now=NOW,
            ttl_sec=TTL,
        )
        self.assertEqual(h.open(empty), bytearray())

    def test_lease_error_codes(self) -> None:
        self.assertEqual(
            set(LEASE_ERRORS),
            {
                "lease_missing",
                "lease_malformed",
                "lease_bad_signature",
                "lease_expired",
                "lease_replayed",
                "lease_wrong_recipient",
                "lease_binding_mismatch",
                "lease_unopenable",
                "lease_replay_cache_full",
            },
        )
        with self.assertRaises(ValueError):
            LeaseError("nonsense", "x")
        self.assertEqual(str(LeaseError("lease_expired", "late")), "lease_expired: late")

    def test_verifier_repr(self) -> None:
        text = repr(Harness().verifier)
        self.assertIn(NODE, text)
        self.assertIn(RECIPIENTS[KEM_X25519].key_id, text)


class FailureTests(LeaseTestCase):
    def test_missing(self) -> None:
        h = Harness()
        self.assertRefused("lease_missing", h.open, b"")

    def test_malformed(self) -> None:
        h = Harness()
        for junk in (
            b"\xff\xff\xff",
            b"not a lease",
            b"\x0a\x05ab",
            b"x" * (L.MAX_LEASE_BYTES + 1),
        ):
            self.assertRefused("lease_malformed", h.open, junk)
        no_signature = pb.CredentialLeaseEnvelope(payload=b"p", issuer_key_id=ISSUER.key_id)
        self.assertRefused("lease_malformed", h.open, no_signature.SerializeToString())

    def test_signed_but_not_a_payload(self) -> None:
        h = Harness()
        raw = b"\xff\xff\xff\xff"
        lease = pb.CredentialLeaseEnvelope(
            payload=raw,
            signature=ISSUER.sign(L.SIGNATURE_CONTEXT + raw),
            issuer_key_id=ISSUER.key_id,
        ).SerializeToString()
        self.assertRefused("lease_malformed", h.open, lease)

    def test_signed_payload_missing_parts(self) -> None:
        h = Harness()
        lease = h.lease()
        for edit in (
            lambda p: setattr(p, "lease_id", b"short"),
            lambda p: p.ClearField("binding"),
            lambda p: setattr(p, "sealed", b""),
            lambda p: setattr(p, "expires_at_ms", p.issued_at_ms),
            lambda p: setattr(p, "expires_at_ms", p.issued_at_ms + 300_001),
        ):
            self.assertRefused("lease_malformed", h.open, resign(lease, edit))

    def test_other_issuer(self) -> None:
        h = Harness()
        h.issuer = generate_issuer()
        error = self.assertRefused("lease_bad_signature", h.open, h.lease())
        self.assertIn(h.issuer.key_id, str(error))

    def test_forged_key_id(self) -> None:
        """Another key signs but claims the trusted key's id: the signature fails."""
        h = Harness()
        other = generate_issuer()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        envelope.signature = other.sign(L.SIGNATURE_CONTEXT + envelope.payload)
        forged = envelope.SerializeToString()
        error = self.assertRefused("lease_bad_signature", h.open, forged)
        self.assertIn("does not verify", str(error))

    def test_tampered_payload(self) -> None:
        """Any flipped payload byte breaks the signature, never reaches parsing."""
        h = Harness()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        for i in range(len(envelope.payload)):
            payload = bytearray(envelope.payload)
            payload[i] ^= 0x01
            tampered = pb.CredentialLeaseEnvelope(
                payload=bytes(payload),
                signature=envelope.signature,
                issuer_key_id=envelope.issuer_key_id,
            ).SerializeToString()
            self.assertRefused("lease_bad_signature", h.open, tampered)

    def test_tampered_signature(self) -> None:
        h = Harness()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        signature = bytearray(envelope.signature)
        signature[10] ^= 0x80
        envelope.signature = bytes(signature)
        self.assertRefused("lease_bad_signature", h.open, envelope.SerializeToString())

    def test_signature_is_over_the_exact_bytes(self) -> None:
        """
        The same payload serialized differently (fields reordered, an unknown field added) is
        not what was signed: refused, although it parses to the same message.
        """
        h = Harness()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        reordered = pb.CredentialLeaseEnvelope(
            payload=envelope.payload + b"\x80\x01\x00",  # unknown field 16, varint 0
            signature=envelope.signature,
            issuer_key_id=envelope.issuer_key_id,
        )
        parsed = pb.CredentialLeasePayload.FromString(reordered.payload)
        self.assertEqual(
            parsed.lease_id, pb.CredentialLeasePayload.FromString(envelope.payload).lease_id
        )
        self.assertRefused("lease_bad_signature", h.open, reordered.SerializeToString())

    def test_signature_context(self) -> None:
        """A signature over the bare payload (no context) does not verify."""
        h = Harness()
        envelope = pb.CredentialLeaseEnvelope.FromString(h.lease())
        envelope.signature = ISSUER.sign(envelope.payload)
        self.assertRefused("lease_bad_signature", h.open, envelope.SerializeToString())

    def test_wrong_node(self) -> None:
        h = Harness()
        lease = h.lease(node_recipient="node-b")
        error = self.assertRefused("lease_wrong_recipient", h.open, lease, node_recipient="node-b")
        self.assertIn("node-b", str(error))

    def test_other_recipient_key(self) -> None:
        """Sealed to another key of the same kind, for this node id."""
        h = Harness()
        h.recipient = generate_recipient()
        lease = h.lease()
        self.assertRefused("lease_wrong_recipient", Harness().open, lease)

    def test_wrong_kem(self) -> None:
        """An x25519 lease to an mlkem node key and the reverse: wrong recipient."""
        for sealed_to, opened_by in (
            (KEM_X25519, KEM_MLKEM768_X25519),
            (KEM_MLKEM768_X25519, KEM_X25519),
        ):
            lease = Harness(sealed_to).lease()
            self.assertRefused("lease_wrong_recipient", Harness(opened_by).open, lease)

    def test_wrong_kem_claimed(self) -> None:
        """A lease that names this node's key id but another KEM: wrong recipient."""
        h = Harness()
        lease = resign(h.lease(), lambda p: setattr(p, "kem", KEM_MLKEM768_X25519))
        self.assertRefused("lease_wrong_recipient", h.open, lease)

    def test_wrong_kem_ciphertext(self) -> None:
        """An mlkem seal relabelled as this x25519 key's: signed, addressed right, unopenable."""
        x = Harness(KEM_X25519)
        sealed = pb.CredentialLeasePayload.FromString(
            pb.CredentialLeaseEnvelope.FromString(Harness(KEM_MLKEM768_X25519).lease()).payload
        ).sealed
        lease = resign(x.lease(), lambda p: setattr(p, "sealed", sealed))
        self.assertRefused("lease_unopenable", x.open, lease)

    def test_tampered_seal(self) -> None:
        """A re-signed payload with a flipped sealed byte: unopenable, and not remembered."""
        for kem in KEMS:
            h = Harness(kem)
            good = h.lease()

            def flip(p: pb.CredentialLeasePayload, at: int) -> None:
                sealed = bytearray(p.sealed)
                sealed[at] ^= 0x01
                p.sealed = bytes(sealed)

            size = len(
                pb.CredentialLeasePayload.FromString(
                    pb.CredentialLeaseEnvelope.FromString(good).payload
                ).sealed
            )
            for at in (0, size // 2, size - 1):
                bad = resign(good, lambda p, at=at: flip(p, at))  # type: ignore[misc]
                self.assertRefused("lease_unopenable", h.open, bad)
            self.assertEqual(len(h.replay), 0)
            # The untampered lease (same id) still opens: a failed open is not remembered.
            self.assertEqual(bytes(h.open(good)), SECRET)

    def test_seal_bound_to_binding(self) -> None:
        """
        A signed payload whose binding was changed after sealing (both in the lease and the
        request, so they agree): the HPKE info differs, the seal does not open.
        """
        h = Harness()
        lease = resign(h.lease(), lambda p: setattr(p.binding, "route", "other-route"))
        self.assertRefused("lease_unopenable", h.open, lease, route="other-route")

    def test_binding_mismatch_on_every_field(self) -> None:
        h = Harness()
        lease = h.lease()
        descriptor = pb.CredentialBinding.DESCRIPTOR
        self.assertEqual(len(descriptor.fields), 11)
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_STRING:
                other: Any = getattr(binding(), field.name) + "-x"
            else:
                other = getattr(binding(), field.name) + 1
            # (For node_recipient: the lease is for this node, the request names another.)
            changes = {field.name: other}
            error = self.assertRefused(
                "lease_binding_mismatch",
                h.open,
                lease,
                **changes,
            )
            self.assertIn(field.name, str(error))
        self.assertEqual(bytes(h.open(lease)), SECRET)

    def test_binding_mismatch_names_fields_not_values(self) -> None:
        h = Harness()
        error = self.assertRefused(
            "lease_binding_mismatch", h.open, h.lease(), principal="someone-else"
        )
        self.assertNotIn("someone-else", str(error))
        self.assertNotIn("client-key-1", str(error))

    def test_order(self) -> None:
        """Everything wrong at once: the first check in the documented order wins."""
        h = Harness()
        lease = h.lease(node_recipient="node-b")
        self.assertRefused("lease_wrong_recipient", h.open, lease, now=NOW + 3600, route="x")
        lease = h.lease()
        self.assertRefused("lease_expired", h.open, lease, now=NOW + 3600, route="x")
        h.open(lease)
        self.assertRefused("lease_binding_mismatch", h.open, lease, route="x")
        self.assertRefused("lease_replayed", h.open, lease)


class ExpiryTests(LeaseTestCase):
    def test_edges(self) -> None:
        """``issued_at - skew <= now <= expires_at + skew``, to the millisecond."""
        early = NOW - SKEW
        late = NOW + TTL + SKEW
        for now in (early, late, NOW, NOW + TTL):
            h = Harness()
            self.assertEqual(bytes(h.open(h.lease(), now=now)), SECRET)
        for now in (early - 0.001, late + 0.001, NOW - 3600, NOW + 3600):
            h = Harness()
            error = self.assertRefused("lease_expired", h.open, h.lease(), now=now)
            self.assertIn("skew 5000 ms", str(error))

    def test_no_skew(self) -> None:
        h = Harness(skew=0)
        self.assertEqual(bytes(h.open(h.lease(), now=NOW)), SECRET)
        self.assertEqual(bytes(h.open(h.lease(), now=NOW + TTL)), SECRET)
        self.assertRefused("lease_expired", h.open, h.lease(), now=NOW - 0.001)
        self.assertRefused("lease_expired", h.open, h.lease(), now=NOW + TTL + 0.001)

    def test_negative_skew(self) -> None:
        with self.assertRaises(ValueError):
            Harness(skew=-1)


class ReplayTests(LeaseTestCase):
    def test_replay_refused_until_expiry_and_skew(self) -> None:
        h = Harness()
        lease = h.lease()
        h.open(lease)
        for now in (NOW, NOW + 1, NOW + TTL + SKEW):
            self.assertRefused("lease_replayed", h.open, lease, now=now)
        # Past expiry + skew the id is no longer needed: the lease is refused as expired.
        self.assertRefused("lease_expired", h.open, lease, now=NOW + TTL + SKEW + 0.001)

    def test_cache_forgets_after_expiry(self) -> None:
        h = Harness()
        h.open(h.lease())
        self.assertEqual(len(h.replay), 1)
        later = NOW + TTL + SKEW + 1
        h.open(h.lease(now=later), now=later)
        self.assertEqual(len(h.replay), 1)

    def test_seen_window(self) -> None:
        cache = ReplayCache()
        cache.remember(b"a" * 16, until=10.0, now=0.0)
        self.assertTrue(cache.seen(b"a" * 16, 0.0))
        self.assertTrue(cache.seen(b"a" * 16, 10.0))
        self.assertFalse(cache.seen(b"a" * 16, 10.001))
        self.assertFalse(cache.seen(b"b" * 16, 0.0))

    def test_remember_extends_never_shortens(self) -> None:
        cache = ReplayCache()
        cache.remember(b"a", until=10.0, now=0.0)
        cache.remember(b"a", until=5.0, now=0.0)
        self.assertTrue(cache.seen(b"a", 9.0))
        cache.remember(b"a", until=20.0, now=0.0)
        cache.remember(b"b", until=1.0, now=11.0)  # prunes the stale heap entry of a, not a
        self.assertTrue(cache.seen(b"a", 15.0))
        self.assertEqual(len(cache), 1)

    def test_bounded(self) -> None:
        """At capacity, new leases are refused (fail closed) until old ones expire."""
        h = Harness()
        h.replay = h.verifier.replay = ReplayCache(capacity=3)
        for _ in range(3):
            h.open(h.lease())
        self.assertEqual(len(h.replay), 3)
        self.assertRefused("lease_replay_cache_full", h.open, h.lease())
        with self.assertRaises(LeaseError):
            h.replay.remember(b"x" * 16, until=NOW + 1, now=NOW)
        later = NOW + TTL + SKEW + 0.001
        h.open(h.lease(now=later), now=later)
        self.assertEqual(len(h.replay), 1)

    def test_memory_stays_bounded_under_load(self) -> None:
        """A long stream of leases keeps only the live ones."""
        cache = ReplayCache(capacity=100)
        for i in range(10_000):
            now = float(i)
            cache.remember(i.to_bytes(16, "big"), until=now + 35.0, now=now)
            self.assertLessEqual(len(cache), 36)
        self.assertLessEqual(len(cache._heap), 36)

    def test_capacity_positive(self) -> None:
        with self.assertRaises(ValueError):
            ReplayCache(capacity=0)


class UpstreamOriginTests(SynchronousTestCase):
    def test_normalized(self) -> None:
        for url, origin in [
            ("https://api.openai.com/v1", "https://api.openai.com:443"),
            ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
            ("HTTP://Example.NET/", "http://example.net:80"),
            ("https://user:pw@host.example:8443/x?q#f", "https://host.example:8443"),
            ("http://[::1]:9000/v1", "http://[::1]:9000"),
            ("  https://h.example  ", "https://h.example:443"),
        ]:
            self.assertEqual(upstream_origin(url), origin, url)

    def test_same_host_other_port_or_scheme_differs(self) -> None:
        self.assertNotEqual(upstream_origin("http://h:80/a"), upstream_origin("http://h:81/a"))
        self.assertNotEqual(upstream_origin("http://h/a"), upstream_origin("https://h/a"))
        self.assertEqual(upstream_origin("http://h/a"), upstream_origin("http://h:80/b"))

    def test_refused(self) -> None:
        for url in ["", "/v1", "ftp://h/", "http://", "http://h:99999/", "unix:upstream.sock"]:
            with self.assertRaises(ValueError, msg=url):
                upstream_origin(url)


class AnnouncementTests(SynchronousTestCase):
    def test_public_key_ids_only(self) -> None:
        recipient = RECIPIENTS[KEM_X25519]
        keys = NodeLeaseKeys(recipient=recipient, issuer=ISSUER.public_key(), clock_skew_sec=5)
        support = keys.announcement()
        self.assertEqual(
            (support.recipient_key_id, support.kem, support.issuer_key_id),
            (recipient.key_id, KEM_X25519, ISSUER.key_id),
        )


class BindingInfoTests(SynchronousTestCase):
    def test_covers_every_field(self) -> None:
        """BINDING_FIELDS names every field of the message, with its kind."""
        kinds = {FieldDescriptor.TYPE_STRING: str, FieldDescriptor.TYPE_UINT64: int}
        self.assertEqual(
            sorted(BINDING_FIELDS),
            sorted((f.name, kinds[f.type]) for f in pb.CredentialBinding.DESCRIPTOR.fields),
        )

    def test_every_field_changes_it(self) -> None:
        base = binding_info(binding())
        for name, kind in BINDING_FIELDS:
            value = getattr(binding(), name)
            changed = binding(**{name: value + ("x" if kind is str else 1)})
            self.assertNotEqual(binding_info(changed), base, name)

    def test_unambiguous(self) -> None:
        """Moving characters between adjacent strings changes the encoding."""
        a = binding_info(binding(principal="ab", slot="c"))
        b = binding_info(binding(principal="a", slot="bc"))
        self.assertNotEqual(a, b)

    def test_layout(self) -> None:
        info = binding_info(pb.CredentialBinding(principal="é", credential_revision=2**64 - 1))
        self.assertTrue(info.startswith(b"iop-credential-binding-v2\0"))
        rest = info[len(b"iop-credential-binding-v2\0") :]
        self.assertEqual(rest[:7], b"\x01\x00\x00\x00\x02\xc3\xa9")
        self.assertIn(b"\x07" + b"\xff" * 8, rest)
        self.assertEqual(len(rest), 7 + 7 * 5 + 3 * 9)

    def test_adapter_and_origin_are_bound(self) -> None:
        """The adapter instance and the upstream origin are in the seal's info, tagged 10, 11."""
        info = binding_info(binding(adapter="a", upstream_origin="http://h:1"))
        self.assertIn(b"\x0a\x00\x00\x00\x01a\x0b\x00\x00\x00\x0ahttp://h:1", info)

    def test_independent_of_unknown_fields(self) -> None:
        raw = binding().SerializeToString() + b"\x80\x01\x01"
        self.assertEqual(
            binding_info(pb.CredentialBinding.FromString(raw)), binding_info(binding())
        )


class ArbitraryInputTests(SynchronousTestCase):
    """Whatever bytes arrive as a lease, the verifier answers with a LeaseError only."""

    verifier = Harness().verifier
    good = Harness().lease()

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=2048))
    def test_arbitrary_bytes(self, data: bytes) -> None:
        try:
            self.verifier.open(data, binding(), NOW)
        except LeaseError as e:
            self.assertIn(e.code, LEASE_ERRORS)
        else:
            self.fail("arbitrary bytes opened as a lease")

    @settings(max_examples=300, deadline=None)
    @given(st.integers(min_value=0), st.integers(min_value=0, max_value=255))
    def test_mutated_lease(self, position: int, value: int) -> None:
        data = bytearray(self.good)
        position %= len(data)
        if data[position] == value:
            return
        data[position] = value
        try:
            self.verifier.open(bytes(data), binding(), NOW)
        except LeaseError as e:
            self.assertIn(e.code, LEASE_ERRORS)

    @settings(max_examples=100, deadline=None)
    @given(
        st.binary(max_size=64),
        st.integers(min_value=0, max_value=2**64 - 1),
        st.integers(min_value=0, max_value=2**64 - 1),
        st.text(max_size=40),
        st.binary(max_size=256),
    )
    def test_arbitrary_signed_payloads(
        self, lease_id: bytes, issued: int, expires: int, kem: str, sealed: bytes
    ) -> None:
        """Even validly signed, any payload content ends in a LeaseError, never anything else."""
        raw = pb.CredentialLeasePayload(
            lease_id=lease_id,
            issued_at_ms=issued,
            expires_at_ms=expires,
            binding=binding(),
            recipient_key_id=RECIPIENTS[KEM_X25519].key_id,
            kem=kem,
            sealed=sealed,
        ).SerializeToString()
        lease = pb.CredentialLeaseEnvelope(
            payload=raw,
            signature=ISSUER.sign(L.SIGNATURE_CONTEXT + raw),
            issuer_key_id=ISSUER.key_id,
        ).SerializeToString()
        try:
            self.verifier.open(lease, binding(), NOW)
        except LeaseError as e:
            self.assertIn(e.code, LEASE_ERRORS)
        else:
            self.fail("a random seal opened")
