"""
The NDJSON framer: values come out whatever the split of the bytes (one byte at a time included),
blank lines are skipped, a line over the limit or that is not UTF-8 JSON is a clear error.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.formats.ndjson import LineFramer, LineTooLong, NDJSONDecoder, NDJSONError

LINES = (
    b'{"message":{"content":"caf\xc3\xa9 \xe2\x98\x95"},"done":false}\n'
    b"\n"
    b"   \r\n"
    b'{"done":true,"eval_count":3}\r\n'
    b"[1,2]\n"
)
VALUES: list[Any] = [
    {"message": {"content": "café ☕"}, "done": False},
    {"done": True, "eval_count": 3},
    [1, 2],
]


def feed_all(decoder: NDJSONDecoder, pieces: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for piece in pieces:
        out.extend(decoder.feed(piece))
    out.extend(decoder.finish())
    return out


class FramingTests(SynchronousTestCase):
    def test_wholeChunk(self) -> None:
        self.assertEqual(feed_all(NDJSONDecoder(), [LINES]), VALUES)

    def test_byteByByte(self) -> None:
        """Every byte alone, including the halves of multi-byte UTF-8 sequences."""
        decoder = NDJSONDecoder()
        out: list[Any] = []
        for i in range(len(LINES)):
            out.extend(decoder.feed(LINES[i : i + 1]))
        self.assertEqual(out, VALUES)
        self.assertEqual(decoder.buffered, 0)
        self.assertEqual(decoder.finish(), [])

    @given(st.lists(st.integers(min_value=0, max_value=len(LINES)), max_size=12))
    def test_anySplit(self, cuts: list[int]) -> None:
        points = [0, *sorted(cuts), len(LINES)]
        pieces = [LINES[a:b] for a, b in itertools.pairwise(points)]
        self.assertEqual(feed_all(NDJSONDecoder(), pieces), VALUES)

    def test_valuesOnlyWhenTheLineEnds(self) -> None:
        decoder = NDJSONDecoder()
        self.assertEqual(decoder.feed(b'{"a":'), [])
        self.assertEqual(decoder.buffered, 5)
        self.assertEqual(decoder.feed(b"1}\n{"), [{"a": 1}])
        self.assertEqual(decoder.feed(b'"b":2}\n'), [{"b": 2}])

    def test_blankLinesSkipped(self) -> None:
        self.assertEqual(feed_all(NDJSONDecoder(), [b"\n\n \t \n\r\n"]), [])

    def test_trailingLineWithoutNewline(self) -> None:
        decoder = NDJSONDecoder()
        self.assertEqual(decoder.feed(b'{"a":1}\n{"done":true}'), [{"a": 1}])
        self.assertEqual(decoder.finish(), [{"done": True}])
        self.assertEqual(decoder.finish(), [])

    def test_trailingPartialLineIsAnError(self) -> None:
        decoder = NDJSONDecoder()
        decoder.feed(b'{"a":')
        self.assertRaises(NDJSONError, decoder.finish)


class ErrorTests(SynchronousTestCase):
    def test_lineTooLongWhileBuffering(self) -> None:
        """An unterminated line is refused as soon as it passes the limit."""
        decoder = NDJSONDecoder(max_line_length=16)
        decoder.feed(b'{"a":"0123456')
        e = self.assertRaises(LineTooLong, decoder.feed, b"789abcdef")
        self.assertIn("line 1 exceeds 16 bytes", str(e))
        self.assertEqual(decoder.buffered, 0)

    def test_lineTooLongInOneChunk(self) -> None:
        decoder = NDJSONDecoder(max_line_length=8)
        self.assertEqual(decoder.feed(b"[1]\n"), [[1]])
        e = self.assertRaises(LineTooLong, decoder.feed, b'"0123456789"\n')
        self.assertIn("line 2 exceeds 8 bytes", str(e))

    def test_lineAtTheLimitIsFine(self) -> None:
        line = json.dumps("x" * 14).encode()
        self.assertEqual(len(line), 16)
        decoder = NDJSONDecoder(max_line_length=16)
        self.assertEqual(decoder.feed(line + b"\n"), ["x" * 14])

    def test_notJSON(self) -> None:
        decoder = NDJSONDecoder()
        e = self.assertRaises(NDJSONError, decoder.feed, b'{"ok":1}\n{nope}\n')
        self.assertIn("line 2 is not JSON", str(e))

    def test_notUTF8(self) -> None:
        decoder = NDJSONDecoder()
        e = self.assertRaises(NDJSONError, decoder.feed, b'"\xff\xfe"\n')
        self.assertIn("line 1 is not UTF-8", str(e))

    def test_failedStaysFailed(self) -> None:
        """After an error the stream is not resynchronised: later input is refused too."""
        decoder = NDJSONDecoder()
        self.assertRaises(NDJSONError, decoder.feed, b"garbage\n")
        e = self.assertRaises(NDJSONError, decoder.feed, b'{"a":1}\n')
        self.assertIn("already failed", str(e))
        self.assertRaises(NDJSONError, decoder.finish)

    def test_errorDoesNotQuoteTheLine(self) -> None:
        secret = b"Bearer-abcdef-secret"
        decoder = NDJSONDecoder()
        e = self.assertRaises(NDJSONError, decoder.feed, b"{" + secret + b"}\n")
        self.assertNotIn(secret.decode(), str(e))

    def test_limitMustBePositive(self) -> None:
        self.assertRaises(ValueError, NDJSONDecoder, 0)


class LineFramerTests(SynchronousTestCase):
    """The framer under both readers: lines whatever the split, the overflow after good lines."""

    def test_anySplit(self) -> None:
        data = b'{"a":1}\r\nlog line\n\n{"b":2}'
        for cut in range(len(data) + 1):
            framer = LineFramer(64)
            lines = framer.feed(data[:cut]) + framer.feed(data[cut:])
            self.assertEqual(
                [*lines, framer.finish()], [b'{"a":1}\r', b"log line", b"", b'{"b":2}']
            )

    def test_linesBeforeTheOverflowAreKept(self) -> None:
        framer = LineFramer(8)
        self.assertEqual(framer.feed(b"ok\n0123456789\nlater\n"), [b"ok"])
        self.assertIsInstance(framer.overflow, LineTooLong)
        self.assertIn("line 2 exceeds 8 bytes", str(framer.overflow))
        self.assertEqual((framer.buffered, framer.feed(b"more\n"), framer.finish()), (0, [], b""))

    def test_unterminatedOverflow(self) -> None:
        framer = LineFramer(4)
        self.assertEqual(framer.feed(b"abcd"), [])
        self.assertIsNone(framer.overflow)
        self.assertEqual(framer.feed(b"e"), [])
        self.assertIn("line 1 exceeds 4 bytes", str(framer.overflow))

    def test_limitMustBePositive(self) -> None:
        self.assertRaises(ValueError, LineFramer, 0)
