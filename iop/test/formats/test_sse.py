"""The incremental SSE parser: line endings, split chunks, multi-line data, comments, [DONE]."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.formats.sse import SSEError, SSEEvent, SSEParser, format_event

STREAM = (
    b": keep-alive\r\n"
    b'data: {"a": 1}\r\n'
    b"\r\n"
    b"event: update\n"
    b"id: 7\n"
    b"retry: 1500\n"
    b"data: first line\n"
    b"data:second line\n"
    b"data:  indented\n"
    b"\n"
    b"data: caf\xc3\xa9 \xe2\x9c\x93\r"
    b"\r"
    b"data: [DONE]\n"
    b"\n"
)

EXPECTED = [
    SSEEvent(data='{"a": 1}'),
    SSEEvent(data="first line\nsecond line\n indented", event="update", id="7", retry=1500),
    SSEEvent(data="café ✓", id="7", retry=1500),
    SSEEvent(data="[DONE]", id="7", retry=1500),
]


def feed_all(parser: SSEParser, chunks: list[bytes]) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    return events


class SSEParserTests(SynchronousTestCase):
    def test_wholeStream(self) -> None:
        self.assertEqual(feed_all(SSEParser(), [STREAM]), EXPECTED)

    def test_byteByByte(self) -> None:
        chunks = [STREAM[i : i + 1] for i in range(len(STREAM))]
        self.assertEqual(feed_all(SSEParser(), chunks), EXPECTED)

    def test_everySplitPoint(self) -> None:
        for i in range(len(STREAM) + 1):
            self.assertEqual(feed_all(SSEParser(), [STREAM[:i], STREAM[i:]]), EXPECTED, i)

    def test_eventsArriveAsSoonAsTheirBlankLineDoes(self) -> None:
        parser = SSEParser()
        self.assertEqual(parser.feed(b"data: one\n"), [])
        self.assertEqual(parser.feed(b"\n"), [SSEEvent(data="one")])
        self.assertEqual(parser.feed(b"data: two\r"), [])
        # The "\r" might be half of "\r\n": only the next byte tells.
        self.assertEqual(parser.feed(b"\r"), [])
        self.assertEqual(parser.feed(b"\n"), [SSEEvent(data="two")])

    def test_doneSentinel(self) -> None:
        self.assertTrue(SSEEvent(data="[DONE]").is_done)
        self.assertTrue(SSEEvent(data=" [DONE] ").is_done)
        self.assertFalse(SSEEvent(data='{"done": "[DONE]"}').is_done)

    def test_commentsAndEmptyEventsDispatchNothing(self) -> None:
        parser = SSEParser()
        self.assertEqual(parser.feed(b": ping\n\n:\n\nevent: x\n\nid: 3\n\n"), [])
        # The last event id carries over to the next event, as the standard says.
        self.assertEqual(parser.feed(b"data: y\n\n"), [SSEEvent(data="y", id="3")])

    def test_emptyDataLineIsAnEvent(self) -> None:
        self.assertEqual(SSEParser().feed(b"data:\n\n"), [SSEEvent(data="")])
        self.assertEqual(SSEParser().feed(b"data\n\n"), [SSEEvent(data="")])

    def test_unknownFieldsAndBadRetryAreIgnored(self) -> None:
        events = SSEParser().feed(b"foo: bar\nretry: soon\nid: a\x00b\ndata: z\n\n")
        self.assertEqual(events, [SSEEvent(data="z")])

    def test_byteOrderMarkAtStart(self) -> None:
        stream = b"\xef\xbb\xbfdata: x\n\n"
        chunks = [stream[i : i + 1] for i in range(len(stream))]
        self.assertEqual(feed_all(SSEParser(), chunks), [SSEEvent(data="x")])

    def test_finishDispatchesCompleteLinesWithoutBlankLine(self) -> None:
        parser = SSEParser()
        self.assertEqual(parser.feed(b"data: [DONE]\n"), [])
        self.assertEqual(parser.finish(), [SSEEvent(data="[DONE]")])

    def test_finishDropsAnUnterminatedLine(self) -> None:
        parser = SSEParser()
        self.assertEqual(parser.feed(b'data: {"partial'), [])
        self.assertEqual(parser.finish(), [])

    def test_finishEndsATrailingCarriageReturnLine(self) -> None:
        parser = SSEParser()
        self.assertEqual(parser.feed(b"data: last\r"), [])
        self.assertEqual(parser.finish(), [SSEEvent(data="last")])

    def test_oversizedLine(self) -> None:
        parser = SSEParser(max_event_bytes=16)
        self.assertEqual(parser.feed(b"data: 0123456789"), [])
        self.assertRaises(SSEError, parser.feed, b"abcdef")

    def test_oversizedEvent(self) -> None:
        parser = SSEParser(max_event_bytes=16)
        parser.feed(b"data: 012345\n")
        self.assertRaises(SSEError, parser.feed, b"data: 6789abcdef\n")


class FormatTests(SynchronousTestCase):
    def test_namedEventRoundTrip(self) -> None:
        encoded = format_event({"text": "a\nb ü"}, "delta")
        self.assertEqual(encoded, 'event: delta\ndata: {"text":"a\\nb ü"}\n\n'.encode())
        (event,) = SSEParser().feed(encoded)
        self.assertEqual((event.event, event.data), ("delta", '{"text":"a\\nb ü"}'))

    def test_unnamedEvent(self) -> None:
        self.assertEqual(format_event([1, 2]), b"data: [1,2]\n\n")
