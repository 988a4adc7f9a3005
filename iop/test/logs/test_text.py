"""
Tests for :mod:`iop.logs.text`: every line is exactly the one Twisted's text observer writes,
for events of every shape (hypothesis draws formats, keys and values).
"""

from __future__ import annotations

import io
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel, formatEvent, formatEventAsClassicLogText, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from iop.logs.text import format_message, text_file_observer, text_line

NOW = 1_764_600_000.25


def event(log_format: Any, **keys: Any) -> dict[str, Any]:
    return {
        "log_format": log_format,
        "log_time": NOW,
        "log_level": LogLevel.info,
        "log_namespace": "iop.test",
        **keys,
    }


class SameAsTwistedTests(SynchronousTestCase):
    def assertSame(self, e: dict[str, Any]) -> None:
        self.assertEqual(text_line(e), formatEventAsClassicLogText(e))
        self.assertEqual(format_message(e), formatEvent(e))

    def test_plain_fields(self) -> None:
        self.assertSame(
            event("tunnel {run_id} ended: {outcome} in {s} s", run_id="t1", outcome="ok", s=0.25)
        )

    def test_specs_and_conversions(self) -> None:
        self.assertSame(
            event("{a:.1f} ms {b!r} {c!s:>6} {d!a} {{literal}}", a=812.44, b="x", c=3, d="é")
        )

    def test_what_only_twisted_formats(self) -> None:
        class Thing:
            name = "n"

            def __call__(self) -> str:
                return "called"

        for e in (
            event("{thing.name}", thing=Thing()),
            event("{items[0]}", items=["first"]),
            event("{thing()}", thing=Thing()),
            event("{missing} here"),
            event("{0}"),
            event("unbalanced {"),
            event(b"bytes {x}", x=1),
            event(None),
            event("{a:{b}}", a=1, b="d"),
            {**event("x"), "log_system": "HTTPChannel,3,127.0.0.1"},
            {**event("x"), "log_system": 7},
            {**event("x"), "log_level": None},
            {**event("x"), "log_time": None},
            {k: v for k, v in event("no namespace").items() if k != "log_namespace"},
            event("multi\nline {x}", x="a\nb"),
            event(""),
        ):
            with self.subTest(e=e):
                self.assertSame(e)

    def test_a_failure_keeps_its_traceback(self) -> None:
        try:
            raise ZeroDivisionError("math")
        except ZeroDivisionError:
            failure = Failure()
        self.assertSame(event("it failed: {why}", why="math", log_failure=failure))

    def test_the_timestamp_follows_the_second(self) -> None:
        for when in (NOW, NOW + 0.5, NOW + 1, NOW + 3600.9, NOW - 86400):
            self.assertSame({**event("x"), "log_time": when})

    @settings(max_examples=300, deadline=None)
    @given(
        literals=st.lists(st.text(max_size=8), min_size=1, max_size=4),
        keys=st.lists(
            st.sampled_from(["a", "b", "run_id", "x1", "missing", "a.b", "a[0]", "a()", ""]),
            max_size=3,
        ),
        specs=st.lists(
            st.sampled_from(["", ":>5", ":.2f", "!r", "!s", ":d", "!x", ":{b}"]), max_size=3
        ),
        values=st.lists(
            st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=10), st.none()),
            min_size=3,
            max_size=3,
        ),
    )
    def test_any_format(
        self, literals: list[str], keys: list[str], specs: list[str], values: list[Any]
    ) -> None:
        fields = [
            "{" + key + (specs[i] if i < len(specs) else "") + "}" for i, key in enumerate(keys)
        ]
        log_format = "".join(
            literal + (fields[i] if i < len(fields) else "") for i, literal in enumerate(literals)
        )
        e = event(log_format, a=values[0], b=values[1], run_id=values[2], x1="v")
        self.assertSame(e)


class ObserverTests(SynchronousTestCase):
    def test_writes_lines_as_twistd_does(self) -> None:
        out = io.StringIO()
        observer = text_file_observer(out)
        observer(event("hello {who}", who="node-a"))
        observer(event(""))
        self.assertEqual(
            out.getvalue(), formatEventAsClassicLogText(event("hello {who}", who="node-a"))
        )

    def test_installed_observer_sees_real_events(self) -> None:
        out = io.StringIO()
        observer = text_file_observer(out)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        from twisted.logger import Logger

        Logger(namespace="iop.test.real").info("at {when:.0f}", when=time.time())
        self.assertIn("[iop.test.real#info] at ", out.getvalue())
