# -*- test-case-name: iop.test.logs.test_jsonlines -*-
"""
Tests for :mod:`iop.logs.jsonlines`: the fields of a line, the event's own keys, failures,
redaction, and values JSON cannot hold.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any, cast

from twisted.logger import ILogObserver, LogEvent, Logger, LogLevel
from twisted.logger._legacy import publishToNewObserver
from twisted.python import log as legacy_log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import Secret
from iop.logs import jsonlines
from iop.logs.jsonlines import json_file_observer, json_line

# 2026-12-01T14:41:31.250Z
WHEN = 1796136091.25
SECRET_KEY = "sk-abcdefghijklmnopqrstuvwx"


def logged(emit: Any) -> list[LogEvent]:
    """The events ``emit(logger)`` publishes on a logger of namespace ``iop.test``."""
    events: list[LogEvent] = []
    emit(Logger(namespace="iop.test", observer=cast(ILogObserver, events.append)))
    return events


def line_of(event: LogEvent) -> dict[str, Any]:
    line = json_line(event)
    self_check = line.rstrip("\n")
    assert line.endswith("\n") and "\n" not in self_check, line
    assert line.isascii(), line
    parsed: dict[str, Any] = json.loads(self_check)
    return parsed


def one(emit: Any) -> dict[str, Any]:
    [event] = logged(emit)
    event["log_time"] = WHEN
    return line_of(event)


class FieldTests(SynchronousTestCase):
    def test_the_fixed_fields(self) -> None:
        """time (RFC 3339 UTC, milliseconds), level, namespace and the formatted message."""
        fields = one(lambda log: log.info("run {run_id} ended: {status}", run_id="r1", status=200))
        self.assertEqual(
            list(fields)[:4], ["time", "level", "namespace", "message"], "fixed fields first"
        )
        self.assertEqual(fields["time"], "2026-12-01T14:41:31.250Z")
        self.assertEqual(
            datetime.fromisoformat(fields["time"]), datetime.fromtimestamp(WHEN, tz=UTC)
        )
        self.assertEqual(fields["level"], "info")
        self.assertEqual(fields["namespace"], "iop.test")
        self.assertEqual(fields["message"], "run r1 ended: 200")

    def test_every_level(self) -> None:
        for level in LogLevel.iterconstants():
            fields = one(lambda log, level=level: log.emit(level, "x"))
            self.assertEqual(fields["level"], level.name)

    def test_the_events_own_keys(self) -> None:
        """The caller's keys, with their JSON types; none of Twisted's log_* bookkeeping."""
        fields = one(
            lambda log: log.info(
                "request finished",
                model="m",
                provider_id="a-chat",
                node_id="node-a",
                status=200,
                duration=0.25,
                stream=True,
                error_code=None,
            )
        )
        self.assertEqual(
            fields,
            {
                "time": "2026-12-01T14:41:31.250Z",
                "level": "info",
                "namespace": "iop.test",
                "message": "request finished",
                "model": "m",
                "provider_id": "a-chat",
                "node_id": "node-a",
                "status": 200,
                "duration": 0.25,
                "stream": True,
                "error_code": None,
            },
        )

    def test_mappings_flattened(self) -> None:
        fields = one(
            lambda log: log.info(
                "usage", usage={"input_tokens": 3, "details": {"cached": 1}}, tags=["a", 2]
            )
        )
        self.assertEqual(fields["usage.input_tokens"], 3)
        self.assertEqual(fields["usage.details.cached"], 1)
        self.assertEqual(fields["tags"], ["a", 2])
        self.assertNotIn("usage", fields)

    def test_reserved_names(self) -> None:
        """An event key named like a fixed field is kept under that name and a trailing _."""
        fields = one(lambda log: log.info("the text", message="mine", namespace=3, time="t"))
        self.assertEqual(fields["message"], "the text")
        self.assertEqual(
            (fields["message_"], fields["namespace_"], fields["time_"]), ("mine", 3, "t")
        )
        self.assertEqual(fields["namespace"], "iop.test")

    def test_one_line(self) -> None:
        """Newlines, line separators and non-ASCII text stay inside the one line."""
        fields = one(lambda log: log.info("a\nb\u2028c {who}", who="Zoë\r\n"))
        self.assertEqual(fields["message"], "a\nb\u2028c Zoë\r\n")
        self.assertEqual(fields["who"], "Zoë\r\n")

    def test_unformattable_message(self) -> None:
        """A bad format string still gives a line (Twisted's own description of the event)."""
        fields = one(lambda log: log.info("{missing} here"))
        self.assertIn("Unable to format event", fields["message"])

    def test_no_time(self) -> None:
        """An event without log_time is stamped now."""
        fields = line_of({"log_format": "x", "log_level": LogLevel.warn})
        self.assertTrue(fields["time"].endswith("Z"))
        self.assertEqual((fields["level"], fields["namespace"]), ("warn", "-"))

    def test_timestamps_across_seconds(self) -> None:
        """The cached date-and-second part follows the clock, backwards too."""
        clock = jsonlines._Clock()
        self.assertEqual(clock.format(WHEN), "2026-12-01T14:41:31.250Z")
        self.assertEqual(clock.format(WHEN + 1.5), "2026-12-01T14:41:32.750Z")
        self.assertEqual(clock.format(WHEN - 31.25), "2026-12-01T14:41:00.000Z")
        self.assertEqual(clock.format(WHEN + 0.7495), "2026-12-01T14:41:31.999Z")

    def test_observer_writes_lines(self) -> None:
        out = io.StringIO()
        observer = json_file_observer(out)
        for event in logged(lambda log: (log.info("one"), log.warn("two {n}", n=2))):
            observer(event)
        lines = out.getvalue().splitlines()
        self.assertEqual([json.loads(line)["message"] for line in lines], ["one", "two 2"])


class FailureTests(SynchronousTestCase):
    def test_log_failure(self) -> None:
        """log.failure: the message alone, the error on one line, the traceback in one field."""

        def emit(log: Logger) -> None:
            try:
                raise ValueError("boom")
            except ValueError:
                log.failure("handling run {run_id}", run_id="r1")

        fields = one(emit)
        self.assertEqual(fields["level"], "critical")
        self.assertEqual(fields["message"], "handling run r1")
        self.assertEqual(fields["run_id"], "r1")
        self.assertEqual(fields["error"], "ValueError: boom")
        self.assertIn("Traceback", fields["traceback"])
        self.assertIn("ValueError: boom", fields["traceback"])
        self.assertIn("in emit", fields["traceback"])

    def test_legacy_err(self) -> None:
        """A twisted.python.log.err event: its why, the failure's fields, no legacy keys."""
        events: list[LogEvent] = []
        event = {
            "message": (),
            "time": WHEN,
            "isError": 1,
            "failure": Failure(KeyError("k")),
            "why": "Unhandled error in Deferred",
            "system": "HTTPChannel,3,127.0.0.1",
        }
        publishToNewObserver(cast(ILogObserver, events.append), event, legacy_log.textFromEventDict)
        fields = line_of(events[0])
        self.assertEqual(fields["message"], "Unhandled error in Deferred")
        self.assertEqual(fields["namespace"], "log_legacy")
        self.assertEqual(fields["level"], "critical")
        self.assertEqual(fields["system"], "HTTPChannel,3,127.0.0.1")
        self.assertEqual(fields["error"], "KeyError: 'k'")
        self.assertIn("KeyError", fields["traceback"])
        for key in ("isError", "why", "failure", "time_", "message_"):
            self.assertNotIn(key, fields)

    def test_legacy_msg(self) -> None:
        """A twisted.python.log.msg event (twisted.web's access log): its text, no extras."""
        events: list[LogEvent] = []
        event = {"message": ('"GET /status HTTP/1.1" 200',), "time": WHEN, "isError": 0}
        publishToNewObserver(cast(ILogObserver, events.append), event, legacy_log.textFromEventDict)
        fields = line_of(events[0])
        self.assertEqual(
            fields,
            {
                "time": "2026-12-01T14:41:31.250Z",
                "level": "info",
                "namespace": "log_legacy",
                "message": '"GET /status HTTP/1.1" 200',
            },
        )

    def test_failure_value(self) -> None:
        """A Failure or an exception passed as a key is its type and message."""
        fields = one(lambda log: log.warn("x", why=Failure(OSError("gone")), e=KeyError("k")))
        self.assertEqual((fields["why"], fields["e"]), ("OSError: gone", "KeyError: 'k'"))


class RedactionTests(SynchronousTestCase):
    def test_message_and_values(self) -> None:
        """Credential-looking text is redacted wherever it is: message, values, lists."""
        fields = one(
            lambda log: log.error(
                "upstream said {body}",
                body=f"invalid Authorization: Bearer {SECRET_KEY}",
                detail=f"key {SECRET_KEY}",
                listed=[f"api_key={SECRET_KEY}"],
                raw=f"x-api-key: {SECRET_KEY}".encode(),
            )
        )
        text = json.dumps(fields)
        self.assertNotIn(SECRET_KEY, text)
        self.assertIn("[redacted]", fields["message"])
        self.assertEqual(fields["detail"], "key [redacted]")

    def test_credential_named_keys(self) -> None:
        """A string under a credential's name is never written, even if it looks ordinary."""
        fields = one(
            lambda log: log.info(
                "x",
                token="plain",
                api_key="plain",
                node_token="plain",
                headers={"Authorization": "plain", "accept": "json"},
                input_tokens=12,
                max_tokens=5,
            )
        )
        for key in ("token", "api_key", "node_token", "headers.Authorization"):
            self.assertEqual(fields[key], "[redacted]", key)
        self.assertEqual(fields["headers.accept"], "json")
        self.assertEqual((fields["input_tokens"], fields["max_tokens"]), (12, 5))

    def test_secret_objects(self) -> None:
        fields = one(lambda log: log.info("{s}", s=Secret("hunter2-value")))
        self.assertNotIn("hunter2", json.dumps(fields))

    def test_ordinary_text_untouched(self) -> None:
        text = "token limit exceeded: max_tokens must be a positive integer"
        self.assertEqual(jsonlines.redact(text), text)
        self.assertEqual(
            jsonlines.redact("leased provider a on node b"), "leased provider a on node b"
        )

    def test_hints_cover_the_patterns(self) -> None:
        """Every kind of text redact_secrets changes passes the cheap check first."""
        for text in (
            "Bearer abcdefgh",
            "basic dXNlcjpwYXNz",
            "Digest abcdefgh",
            "Token abcdefgh",
            "x-api-key: v",
            "api_key=v",
            '"password": "v"',
            "passwd=v",
            "client_secret=v",
            "cookie: a=b",
            "Proxy-Authorization: v",
            "sk-ant-0123456789abcdefgh",
            "sk_live_0123456789abcdefgh",
            "rk-0123456789abcdefghij",
            "pk_0123456789abcdefghij",
        ):
            self.assertNotEqual(jsonlines.redact(text), text, text)


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    def __repr__(self) -> str:
        raise RuntimeError("no")


class Printable:
    def __str__(self) -> str:
        return "printable"


class JsonSafeTests(SynchronousTestCase):
    def test_values(self) -> None:
        fields = one(
            lambda log: log.info(
                "x",
                nan=float("nan"),
                inf=float("-inf"),
                big=10**30,
                raw=b"\xff\x00ok",
                obj=Printable(),
                bad=Unprintable(),
                items={3},
                pair=(1, "b"),
                severity=LogLevel.warn,
                odd_keys={1: "one", None: "none"},
            )
        )
        self.assertEqual((fields["nan"], fields["inf"]), ("nan", "-inf"))
        self.assertEqual(fields["big"], 10**30)
        self.assertEqual(fields["raw"], "\\xff\x00ok")
        self.assertEqual(fields["obj"], "printable")
        self.assertEqual(fields["bad"], "<unprintable Unprintable>")
        self.assertEqual(fields["items"], [3])
        self.assertEqual(fields["pair"], [1, "b"])
        self.assertEqual(fields["severity"], str(LogLevel.warn))
        self.assertEqual((fields["odd_keys.1"], fields["odd_keys.None"]), ("one", "none"))

    def test_depth_limited(self) -> None:
        """Deep or self-referencing structures end as text instead of recursing forever."""
        loop: list[Any] = []
        loop.append(loop)
        deep: dict[str, Any] = {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}
        fields = one(lambda log: log.info("x", loop=loop, deep=deep))
        self.assertIsInstance(json.dumps(fields), str)
        self.assertIsInstance(fields["deep.a.b.c"], str)

    def test_last_resort(self) -> None:
        """If an event cannot be written at all, the line says so, still as JSON."""

        def broken(event: LogEvent) -> dict[str, object]:
            raise TypeError("nope")

        self.patch(jsonlines, "json_fields", broken)
        fields = line_of({"log_format": "x"})
        self.assertEqual(fields["level"], "error")
        self.assertIn("could not write a log event as JSON", fields["message"])
