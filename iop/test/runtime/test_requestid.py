"""The request id rule: kept iff one sane value, else a new ``req_`` ULID."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.requestid import (
    MAX_LENGTH,
    REQUEST_ID_KEY,
    accepted,
    carried,
    is_sane,
    log_context,
    new_request_id,
)

SANE = re.compile(r"[A-Za-z0-9._:\-]{1,128}\Z")
NEW = re.compile(r"req_[0-9A-HJKMNP-TV-Z]{26}\Z")
NOW = 1_700_000_000.0

sane_ids = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-",
    min_size=1,
    max_size=MAX_LENGTH,
)
header_values = st.one_of(
    sane_ids,
    st.text(max_size=200),
    st.binary(max_size=200),
    st.text(alphabet=" ,;\"'\\/=\r\n\t\x00é", min_size=1, max_size=10).map(lambda t: "ab" + t),
)


class RuleTests(SynchronousTestCase):
    @given(st.lists(header_values, max_size=3))
    def test_kept_iff_one_sane_value_never_echoed_unsanitized(
        self, values: list[str | bytes]
    ) -> None:
        request_id = accepted(values, NOW)
        self.assertTrue(is_sane(request_id))
        self.assertLessEqual(len(request_id), MAX_LENGTH)
        if len(values) == 1 and is_sane(values[0]):
            value = values[0]
            self.assertEqual(request_id, value.decode() if isinstance(value, bytes) else value)
        else:
            self.assertRegex(request_id, NEW)

    @given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
    def test_sane_is_the_documented_rule(self, value: str | bytes) -> None:
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        self.assertEqual(is_sane(value), SANE.match(text) is not None and text.isascii())

    def test_edges_of_the_rule(self) -> None:
        self.assertEqual(accepted(["a" * 128], NOW), "a" * 128)
        self.assertRegex(accepted(["a" * 129], NOW), NEW)
        self.assertRegex(accepted([""], NOW), NEW)
        self.assertRegex(accepted(None, NOW), NEW)
        self.assertRegex(accepted([], NOW), NEW)
        # Two headers: which one would be meant? Neither.
        self.assertRegex(accepted(["one", "two"], NOW), NEW)
        self.assertRegex(accepted(["a, b"], NOW), NEW)
        self.assertRegex(accepted(["a\r\nx-injected: 1"], NOW), NEW)
        for kept in ("550e8400-e29b-41d4-a716-446655440000", "req_011CS", "host:42:7", "a.b_c"):
            self.assertEqual(accepted([kept], NOW), kept)
            self.assertEqual(accepted([kept.encode()], NOW), kept)

    def test_new_ids_are_time_ordered_ulids(self) -> None:
        first = new_request_id(NOW, lambda n: b"\xff" * n)
        later = new_request_id(NOW + 0.001, lambda n: b"\x00" * n)
        self.assertRegex(first, NEW)
        self.assertLess(first, later)
        self.assertEqual(new_request_id(0, lambda n: b"\x00" * n), "req_" + "0" * 26)
        self.assertNotEqual(new_request_id(NOW), new_request_id(NOW))

    def test_carried_and_log_context(self) -> None:
        self.assertEqual(carried({REQUEST_ID_KEY: "req_1"}), "req_1")
        self.assertEqual(carried({REQUEST_ID_KEY: "bad id"}), "")
        self.assertEqual(carried({}), "")
        self.assertEqual(log_context("req_1"), {"request_id": "req_1"})
        self.assertEqual(log_context(""), {})
