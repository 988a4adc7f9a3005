# -*- test-case-name: iop.test.config.test_join -*-
"""
The join string (L{iop.config.join}): encode/decode round trip, what it refuses (never quoting
it), and the node configuration ``--join`` makes of it (L{node_config_from_flags}), with
``--reconnect``'s values.
"""

from __future__ import annotations

import base64
import json

from twisted.trial.unittest import SynchronousTestCase

from iop.config.errors import ConfigError
from iop.config.join import (
    DEFAULT_SERVER_NAME,
    JOIN_PREFIX,
    JoinString,
    JoinStringError,
    check_pin,
    decode,
    encode,
)
from iop.config.model import NodeDaemonConfig
from iop.config.node import node_config_from_flags, reconnect_attempts

PIN = "sha256:" + "0f" * 32
TOKEN = "s3cr3t-T0ken_value"


def raw(document: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()
    return JOIN_PREFIX + body


class RoundTripTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        join = JoinString(("edge.example.net:7443", "[::1]:8443"), TOKEN, PIN, "gw.example.net")
        text = encode(join)
        self.assertTrue(text.startswith("iop1."))
        self.assertRegex(text, r"\A[A-Za-z0-9._-]+\Z")  # nothing a shell splits or globs
        self.assertEqual(decode(text), join)

    def test_default_name_is_left_out(self) -> None:
        text = encode(JoinString(("e:1",), TOKEN, PIN, DEFAULT_SERVER_NAME))
        self.assertIsNone(decode(text).server_name)
        self.assertNotIn("name", json.loads(base64.urlsafe_b64decode(text[5:] + "==")))

    def test_paste_noise_forgiven(self) -> None:
        text = encode(JoinString(("e:1",), TOKEN, PIN))
        self.assertEqual(decode(f"  '{text}'\n"), decode(text))

    def test_repr_hides_the_token(self) -> None:
        join = JoinString(("e:1",), TOKEN, PIN)
        self.assertNotIn(TOKEN, repr(join))
        self.assertNotIn(TOKEN, str(join))

    def test_pin_forms(self) -> None:
        self.assertEqual(check_pin("SHA256:" + "0F" * 32), PIN)
        self.assertEqual(check_pin("0f" * 32), PIN)
        self.assertRaises(ValueError, check_pin, "sha256:abc")


class RejectionTests(SynchronousTestCase):
    def refused(self, text: str, message: str) -> None:
        error = self.assertRaises(JoinStringError, decode, text)
        self.assertIn(message, str(error))
        self.assertNotIn(TOKEN, str(error))

    def test_not_a_join_string(self) -> None:
        self.refused("hello", "not a join string: it starts with iop1.")
        self.refused("", "not a join string")

    def test_other_version(self) -> None:
        self.refused("iop2.abc", "a version 2 join string; this node reads version 1")

    def test_damaged(self) -> None:
        self.refused("iop1.!!!not-base64", "its text after iop1. is damaged")
        self.refused(JOIN_PREFIX + "bm90IGpzb24", "its text after iop1. is damaged")
        text = encode(JoinString(("e:1",), TOKEN, PIN))
        self.refused(text[:-7], "damaged")

    def test_fields(self) -> None:
        good = {"edges": ["e:1"], "token": TOKEN, "ca": PIN}
        self.refused(raw([1, 2]), "does not hold an object")
        self.refused(raw({**good, "extra": 1}), "fields this node does not know (extra)")
        self.refused(raw({**good, "edges": []}), "names no Edge address")
        self.refused(raw({**good, "edges": [f"e:{i}" for i in range(17)]}), "at most 16")
        self.refused(raw({**good, "token": "two words"}), "no usable token")
        self.refused(raw({**good, "ca": "sha256:12"}), "CA pin (ca) is not sha256:")
        self.refused(raw({**good, "name": " "}), "server name (name) is empty")

    def test_too_long(self) -> None:
        self.refused("iop1." + "a" * 9000, "characters long")


class JoinFlagTests(SynchronousTestCase):
    def build(self, join: JoinString, server_name: str | None = None) -> NodeDaemonConfig:
        return node_config_from_flags(
            edge=None, token_file=None, ca_file=None, join=join, server_name=server_name, environ={}
        )

    def test_join_makes_the_config(self) -> None:
        config = self.build(JoinString(("edge.example.net:7443",), TOKEN, PIN))
        [edge] = config.edges
        self.assertEqual((edge.host, edge.port), ("edge.example.net", 7443))
        assert edge.tls is not None
        self.assertEqual(
            (edge.tls.ca_file, edge.tls.ca_pin, edge.tls.server_name, edge.tls.host_name),
            ("", PIN, DEFAULT_SERVER_NAME, "edge.example.net"),
        )
        self.assertTrue(config.token.matches(TOKEN))

    def test_name_from_the_string_then_the_flag(self) -> None:
        join = JoinString(("a:1", "b:2"), TOKEN, PIN, "gw.example.net")
        config = self.build(join)
        names = {(e.tls.server_name, e.tls.host_name) for e in config.edges if e.tls}
        self.assertEqual(names, {("gw.example.net", None)})
        config = self.build(join, server_name="other.example.net")
        assert config.tls is not None
        self.assertEqual(config.tls.server_name, "other.example.net")

    def test_join_excludes_edge_token_and_ca(self) -> None:
        error = self.assertRaises(
            ConfigError,
            node_config_from_flags,
            edge="e:1",
            token_file="t",
            ca_file="c",
            join=JoinString(("a:1",), TOKEN, PIN),
            environ={},
        )
        paths = {issue.path for issue in error.issues}
        self.assertEqual(paths, {"--edge", "--token-file", "--ca-file"})
        self.assertNotIn(TOKEN, str(error))

    def test_bad_address_named_as_join(self) -> None:
        error = self.assertRaises(ConfigError, self.build, JoinString(("nope",), TOKEN, PIN))
        self.assertEqual([issue.path for issue in error.issues], ["--join"])

    def test_reconnect_values(self) -> None:
        self.assertEqual(
            [reconnect_attempts(v) for v in ("forever", "off", "3", " Forever ")], [0, 1, 3, 0]
        )
        for bad in ("0", "-1", "never", "2.5", ""):
            self.assertRaises(ValueError, reconnect_attempts, bad)


class NodeYamlPinTests(SynchronousTestCase):
    """node.yaml's ``edge.ca_sha256``: the pin instead of ``ca_file``."""

    def parse(self, edge: dict[str, object]) -> NodeDaemonConfig:
        from iop.config.node import parse_node_config

        document = {"edge": {"host": "gw.example.net", "port": 7443, **edge}, "token": "${T}"}
        return parse_node_config(document, base_dir="/", environ={"T": TOKEN})

    def test_pin(self) -> None:
        config = self.parse({"ca_sha256": "0F" * 32})
        tls = config.tls
        assert tls is not None
        self.assertEqual((tls.ca_pin, tls.ca_file), (PIN, ""))

    def test_refusals(self) -> None:
        cases = [
            ({"ca_sha256": "abc"}, "edge.ca_sha256", "64 hex digits"),
            ({"ca_sha256": PIN, "ca_file": "/etc/hosts"}, "edge.ca_file", "not both"),
            ({}, "edge.ca_file", "or ca_sha256, the pin of the Edge's CA"),
        ]
        for edge, path, message in cases:
            error = self.assertRaises(ConfigError, self.parse, edge)
            [issue] = error.issues
            self.assertEqual(issue.path, path)
            self.assertIn(message, issue.message)
