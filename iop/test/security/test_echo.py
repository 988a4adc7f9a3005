# -*- test-case-name: iop.test.security.test_echo -*-
"""
:class:`iop.security.echo.EchoRedactor` by example: the forms looked for, an echo split across
chunks, header values, the held tail at a clean end and at a cut, forgetting the secret.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.security.echo import EchoRedactor, echo_forms, redact_all

SECRET = b"sk-upstream-Abc123def456GHI789jkl0"


class EchoFormsTests(SynchronousTestCase):
    def test_a_key_like_secret_has_one_form(self) -> None:
        self.assertEqual(echo_forms(SECRET), [bytearray(SECRET)])

    def test_json_and_percent_forms_where_they_differ(self) -> None:
        forms = echo_forms(b'ab/c"d\\e+f=')
        self.assertEqual(
            [bytes(form) for form in forms],
            [b'ab/c"d\\e+f=', b'ab/c\\"d\\\\e+f=', b'ab\\/c\\"d\\\\e+f=', b"ab%2Fc%22d%5Ce%2Bf%3D"],
        )

    def test_a_short_secret_is_not_looked_for(self) -> None:
        self.assertEqual(echo_forms(b"1234567"), [])
        redactor = EchoRedactor(b"1234567")
        self.assertFalse(redactor.active)
        self.assertEqual(redactor.feed(b"x1234567"), b"x1234567")


class EchoRedactorTests(SynchronousTestCase):
    def test_the_header_value_and_the_bare_key(self) -> None:
        body = b'{"error": {"message": "Incorrect API key: Bearer ' + SECRET + b'", "key": "'
        body += SECRET + b'"}}'
        out, count = redact_all(body, SECRET)
        self.assertEqual(
            out,
            b'{"error": {"message": "Incorrect API key: Bearer [redacted]", "key": "[redacted]"}}',
        )
        self.assertEqual(count, 2)

    def test_split_mid_secret(self) -> None:
        redactor = EchoRedactor(SECRET)
        first = redactor.feed(b"data: your key is " + SECRET[:10])
        self.assertEqual(first, b"data: your key is ")
        self.assertEqual(redactor.held, 10)
        second = redactor.feed(SECRET[10:] + b"\n\n")
        self.assertEqual(second, b"[redacted]\n\n")
        self.assertEqual((redactor.held, redactor.count), (0, 1))

    def test_an_sse_stream_is_never_held(self) -> None:
        redactor = EchoRedactor(SECRET)
        for event in (b'data: {"delta": "sk"}\n\n', b"data: [DONE]\n\n"):
            self.assertEqual(redactor.feed(event), event)
            self.assertEqual(redactor.held, 0)

    def test_a_clean_end_flushes_the_held_prefix(self) -> None:
        redactor = EchoRedactor(SECRET)
        self.assertEqual(redactor.feed(b"ends with sk-up"), b"ends with ")
        self.assertEqual(redactor.finish(), b"sk-up")
        self.assertEqual(redactor.count, 0)

    def test_a_cut_drops_the_held_prefix(self) -> None:
        redactor = EchoRedactor(SECRET)
        redactor.feed(b"cut at " + SECRET[:-1])
        self.assertEqual(redactor.discard(), len(SECRET) - 1)
        self.assertEqual(redactor.held, 0)
        self.assertEqual(redactor.finish(), b"")

    def test_whole_values_and_names(self) -> None:
        redactor = EchoRedactor(SECRET)
        self.assertEqual(redactor.redact(b"Bearer " + SECRET), b"Bearer [redacted]")
        self.assertTrue(redactor.contains(b"x-" + SECRET))
        self.assertTrue(redactor.contains(b"X-" + SECRET.title()))
        self.assertFalse(redactor.contains(b"x-request-id"))
        redactor.note()
        self.assertEqual(redactor.count, 2)

    def test_forget_zeroes_the_copies_and_keeps_the_count(self) -> None:
        redactor = EchoRedactor(SECRET)
        redactor.feed(SECRET + b" " + SECRET[:5])
        forms = [form.needle for form in redactor._forms]
        redactor.forget()
        self.assertEqual(redactor.count, 1)
        self.assertFalse(redactor.active)
        self.assertEqual(redactor.held, 0)
        for form in forms:
            self.assertEqual(set(form), {0})
        # Nothing is looked for any more.
        self.assertEqual(redactor.feed(SECRET), SECRET)
