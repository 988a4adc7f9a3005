# -*- test-case-name: iop.test.security.test_echo_properties -*-
"""
Properties of :class:`iop.security.echo.EchoRedactor`: for any secret, any stream holding it
(whole, in its other forms, or in near-miss pieces) at any positions, and any split of that
stream into chunks — including a split at every byte — the streamed output is the one-shot
redaction of the whole stream (:func:`~iop.security.echo.redact_all`), with the same count, and
no form of the secret survives; a stream without the secret comes out unchanged, and what is
held back at any moment is only a tail of the stream that could still become the secret.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.security.echo import REDACTED_BYTES, EchoRedactor, echo_forms, redact_all
from iop.test import examples

# A valid header value's bytes (what a leased secret can be): visible latin-1 and spaces.
_HEADER_BYTES = [b for b in range(0x20, 0x100) if b != 0x7F]


@st.composite
def secrets(draw: st.DrawFn, brackets: bool = True) -> bytes:
    """A secret: usually key-like, sometimes any valid header value bytes."""
    alphabet = _HEADER_BYTES if brackets else [b for b in _HEADER_BYTES if b not in b"[]"]
    keylike = b"abcxyzABC0129-_sk"
    if draw(st.booleans()):
        body = draw(st.lists(st.sampled_from(list(keylike)), min_size=8, max_size=40))
    else:
        body = draw(st.lists(st.sampled_from(alphabet), min_size=8, max_size=24))
    return bytes(body)


@st.composite
def streams(draw: st.DrawFn, secret: bytes, with_secret: bool = True) -> bytes:
    """Pieces of filler, the secret's forms, its prefixes and suffixes, in any order."""
    forms = [bytes(form) for form in echo_forms(secret)]
    parts: list[st.SearchStrategy[bytes]] = [
        st.binary(max_size=12),
        st.lists(st.sampled_from(list(secret)), max_size=12).map(bytes),
        st.integers(1, len(secret) - 1).map(lambda n: secret[:n]),
        st.integers(1, len(secret) - 1).map(lambda n: secret[n:]),
        st.just(b"\n\n"),
    ]
    if with_secret:
        parts += [st.sampled_from(forms), st.just(b"Bearer " + secret)]
    return b"".join(draw(st.lists(st.one_of(*parts), max_size=12)))


@st.composite
def split(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at any set of points (empty chunks too)."""
    points = sorted(draw(st.lists(st.integers(0, len(data)), max_size=10)))
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def streamed(secret: bytes, chunks: list[bytes]) -> tuple[bytes, int, int]:
    """The redactor's output over ``chunks``, its count, and the most it ever held."""
    redactor = EchoRedactor(secret)
    out = []
    most = 0
    for chunk in chunks:
        out.append(redactor.feed(chunk))
        most = max(most, redactor.held)
    out.append(redactor.finish())
    return b"".join(out), redactor.count, most


class EchoRedactorProperties(SynchronousTestCase):
    @settings(max_examples=examples(400), deadline=None)
    @given(st.data())
    def test_streamed_equals_one_shot(self, data: st.DataObject) -> None:
        secret = data.draw(secrets())
        whole = data.draw(streams(secret))
        chunks = data.draw(split(whole))
        expected, count = redact_all(whole, secret)
        out, streamed_count, most = streamed(secret, chunks)
        self.assertEqual(out, expected)
        self.assertEqual(streamed_count, count)
        self.assertLess(most, sum(len(form) for form in echo_forms(secret)))
        # Every split point at once: one byte at a time.
        single, single_count, _ = streamed(secret, [whole[i : i + 1] for i in range(len(whole))])
        self.assertEqual((single, single_count), (expected, count))

    @settings(max_examples=examples(400), deadline=None)
    @given(st.data())
    def test_no_form_survives(self, data: st.DataObject) -> None:
        # A secret with "[" or "]" could be rebuilt around the marker "[redacted]" by an
        # upstream that tried; no provider key has either.
        secret = data.draw(secrets(brackets=False))
        whole = data.draw(streams(secret))
        chunks = data.draw(split(whole))
        out, count, _ = streamed(secret, chunks)
        for form in echo_forms(secret):
            self.assertNotIn(bytes(form), out)
        if secret in whole:
            self.assertGreater(count, 0)
            self.assertIn(REDACTED_BYTES, out)

    @settings(max_examples=examples(400), deadline=None)
    @given(st.data())
    def test_a_stream_without_the_secret_passes_unchanged(self, data: st.DataObject) -> None:
        secret = data.draw(secrets())
        forms = [bytes(form) for form in echo_forms(secret)]
        whole = data.draw(streams(secret, with_secret=False))
        for form in forms:
            # Filler and prefix + suffix pieces may meet to make a form: not this test's case.
            whole = whole.replace(form, b"")
        if any(form in whole for form in forms):
            return
        chunks = data.draw(split(whole))
        redactor = EchoRedactor(secret)
        out = b""
        fed = b""
        for chunk in chunks:
            out += redactor.feed(chunk)
            fed += chunk
            # Held back: only bytes not yet out, never more than each form's length - 1 in
            # all, and nothing at all when the stream so far ends in no proper prefix of a form.
            held = fed[len(out) :]
            self.assertEqual(out + held, fed)
            self.assertEqual(len(held), redactor.held)
            self.assertLessEqual(len(held), sum(len(f) - 1 for f in forms))
            if not any(fed.endswith(f[:k]) for f in forms for k in range(1, len(f))):
                self.assertEqual(len(held), 0)
        out += redactor.finish()
        self.assertEqual(out, whole)
        self.assertEqual(redactor.count, 0)
