# -*- test-case-name: iop.test.config.test_node_config -*-
"""
Tests for :mod:`iop.config.node`: node.yaml loading, defaults and validation.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import yaml
from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, load_node_config, parse_node_config
from iop.config.errors import ConfigIssue
from iop.config.model import DEFAULT_STORE_PATH, NodeDaemonConfig, Secret
from iop.config.node import DEFAULT_JOIN_SERVER_NAME, node_config_from_flags

NODE_TOKEN = "node-token-value"
ENVIRON = {"IOP_NODE_TOKEN": NODE_TOKEN, "EMPTY": "  "}

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "etc", "iop")


def base_config() -> dict[str, Any]:
    return {
        "edge": {
            "host": "edge.example.net",
            "port": 7443,
            "server_name": "edge.iop.internal",
            "ca_file": "pki/ca.crt",
        },
        "token_file": "node.token",
    }


Mutation = Callable[[dict[str, Any]], None]


def put(dotted: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        *parents, key = dotted.split(".")
        target = data
        for parent in parents:
            target = target[parent]
        target[key] = copy.deepcopy(value)

    return mutate


def drop(dotted: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        *parents, key = dotted.split(".")
        target = data
        for parent in parents:
            target = target[parent]
        del target[key]

    return mutate


def chain(*mutations: Mutation) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        for m in mutations:
            m(data)

    return mutate


def assertIssue(
    case: SynchronousTestCase, error: ConfigError, path: str, fragment: str
) -> ConfigIssue:
    for issue in error.issues:
        if issue.path == path and fragment in issue.message:
            return issue
    case.fail(f"no issue at {path!r} containing {fragment!r}; got:\n{error}")


class NodeConfigTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(self.base, "pki"))
        for name in ("ca.crt", "node.crt", "node.key"):
            self.write(os.path.join("pki", name), "PEM\n")
        self.write("node.token", f"\n  {NODE_TOKEN}  \n")
        self.write("empty.token", "\n\t \n")

    def write(self, relative: str, text: str) -> str:
        path = os.path.join(self.base, relative)
        with open(path, "w") as f:
            f.write(text)
        return path

    def parse(self, data: object, environ: Mapping[str, str] = ENVIRON) -> NodeDaemonConfig:
        return parse_node_config(data, base_dir=self.base, environ=environ)

    def fails(self, data: object, environ: Mapping[str, str] = ENVIRON) -> ConfigError:
        error = self.assertRaises(ConfigError, self.parse, data, environ)
        assert isinstance(error, ConfigError)
        return error


class HappyPathTests(NodeConfigTestCase):
    def test_full(self) -> None:
        data = base_config()
        data["edge"].update(cert_file="pki/node.crt", key_file="pki/node.key", plaintext=False)
        data.update(
            {
                "reconnect": {"max_attempts": 3, "interval_sec": 0.5},
                "store": {"path": "file:/var/lib/iop/node.db?mode=rwc"},
                "max_frame_bytes": 1024,
                "handshake_timeout_sec": 2.5,
            }
        )
        config = self.parse(data)
        self.assertEqual((config.edge_host, config.edge_port), ("edge.example.net", 7443))
        self.assertTrue(config.token.matches(NODE_TOKEN))
        self.assertFalse(config.plaintext)
        assert config.tls is not None
        self.assertEqual(config.tls.ca_file, os.path.join(self.base, "pki", "ca.crt"))
        self.assertEqual(config.tls.cert_file, os.path.join(self.base, "pki", "node.crt"))
        self.assertEqual(config.tls.key_file, os.path.join(self.base, "pki", "node.key"))
        self.assertEqual(config.tls.server_name, "edge.iop.internal")
        self.assertEqual((config.reconnect.max_attempts, config.reconnect.interval_sec), (3, 0.5))
        self.assertFalse(config.reconnect.unlimited)
        self.assertEqual(config.store_path, "file:/var/lib/iop/node.db?mode=rwc")
        self.assertEqual(config.max_frame_bytes, 1024)
        self.assertEqual(config.handshake_timeout_sec, 2.5)
        self.assertEqual(config.source_path, "")

    def test_defaults(self) -> None:
        data = base_config()
        del data["edge"]["server_name"]
        config = self.parse(data)
        assert config.tls is not None
        # The same default as the flags' and a join string's; the host (node.yaml's old
        # default) is accepted too, so configs written for it keep working.
        self.assertEqual(config.tls.server_name, "edge.iop.internal")
        self.assertEqual(config.tls.host_name, "edge.example.net")
        self.assertIsNone(config.tls.cert_file)
        self.assertIsNone(config.tls.key_file)
        self.assertEqual((config.reconnect.max_attempts, config.reconnect.interval_sec), (10, 10.0))
        self.assertEqual(config.store_path, DEFAULT_STORE_PATH)
        self.assertEqual(config.store_path, "file:iop.db?cache=shared&mode=rwc")
        self.assertEqual(config.max_frame_bytes, 16 * 1024 * 1024)
        self.assertEqual(config.handshake_timeout_sec, 10.0)

    def test_tokenFromEnvironment(self) -> None:
        data = base_config()
        del data["token_file"]
        data["token"] = "${IOP_NODE_TOKEN}"
        self.assertEqual(self.parse(data).token, Secret(NODE_TOKEN))

    def test_plaintextLoopback(self) -> None:
        for host in ("127.0.0.1", "127.9.9.9", "::1", "localhost"):
            config = self.parse(
                {
                    "edge": {"host": host, "port": 7443, "plaintext": True},
                    "token_file": "node.token",
                }
            )
            self.assertTrue(config.plaintext, host)
            self.assertIsNone(config.tls)

    def test_bracketedIpv6Host(self) -> None:
        config = self.parse(
            {"edge": {"host": "[::1]", "port": 7443, "plaintext": True}, "token_file": "node.token"}
        )
        self.assertEqual(config.edge_host, "::1")

    def test_loadResolvesRelativeToFile(self) -> None:
        path = self.write("node.yaml", yaml.safe_dump(base_config()))
        config = load_node_config(path, ENVIRON)
        self.assertEqual(config.source_path, path)
        assert config.tls is not None
        self.assertEqual(config.tls.ca_file, os.path.join(self.base, "pki", "ca.crt"))
        self.assertTrue(config.token.matches(NODE_TOKEN))


class ReconnectTests(NodeConfigTestCase):
    def reconnect(self, section: object) -> tuple[int, float, bool]:
        data = base_config()
        data["reconnect"] = section
        policy = self.parse(data).reconnect
        return policy.max_attempts, policy.interval_sec, policy.unlimited

    def test_sectionOmitted(self) -> None:
        self.assertEqual(self.parse(base_config()).reconnect.max_attempts, 10)
        self.assertEqual(self.reconnect(None), (10, 10.0, False))

    def test_maxAttemptsOmitted(self) -> None:
        self.assertEqual(self.reconnect({"interval_sec": 3}), (10, 3.0, False))

    def test_zeroIsUnlimited(self) -> None:
        self.assertEqual(self.reconnect({"max_attempts": 0}), (0, 10.0, True))

    def test_positiveIsExactLimit(self) -> None:
        self.assertEqual(self.reconnect({"max_attempts": 1, "interval_sec": 2}), (1, 2.0, False))

    def invalid(self, section: object, path: str, fragment: str) -> None:
        data = base_config()
        data["reconnect"] = section
        assertIssue(self, self.fails(data), path, fragment)

    def test_negative(self) -> None:
        self.invalid({"max_attempts": -1}, "reconnect.max_attempts", "must be >= 0")

    def test_bool(self) -> None:
        self.invalid({"max_attempts": True}, "reconnect.max_attempts", "got boolean")
        self.invalid({"max_attempts": False}, "reconnect.max_attempts", "got boolean")

    def test_notInteger(self) -> None:
        self.invalid({"max_attempts": 2.5}, "reconnect.max_attempts", "must be an integer")
        self.invalid({"max_attempts": "10"}, "reconnect.max_attempts", "must be an integer")

    def test_intervalMustBePositive(self) -> None:
        """Always > 0: unlimited needs a pause, and zero with a limit would busy-loop."""
        self.invalid(
            {"max_attempts": 0, "interval_sec": 0}, "reconnect.interval_sec", "must be > 0"
        )
        self.invalid(
            {"max_attempts": 5, "interval_sec": 0}, "reconnect.interval_sec", "must be > 0"
        )
        self.invalid({"interval_sec": -1}, "reconnect.interval_sec", "must be > 0")
        self.invalid({"interval_sec": True}, "reconnect.interval_sec", "must be a number")

    def test_unknownKey(self) -> None:
        self.invalid({"max_attempt": 1}, "reconnect.max_attempt", "did you mean 'max_attempts'?")

    def test_notMapping(self) -> None:
        self.invalid(5, "reconnect", "must be a mapping, got integer")


class SecretHygieneTests(NodeConfigTestCase):
    SECRET = "S3CRET-node-marker-91ab"

    def test_notInRepr(self) -> None:
        self.write("node.token", self.SECRET)
        config = self.parse(base_config())
        self.assertTrue(config.token.matches(self.SECRET))
        self.assertEqual(config.token.reveal(), self.SECRET)
        for text in (repr(config), str(config), repr(config.token), str(config.token)):
            self.assertNotIn(self.SECRET, text)

    def test_notInErrors(self) -> None:
        data = base_config()
        data["token"] = self.SECRET
        data["token_sha256"] = self.SECRET
        error = self.fails(data)
        for text in (str(error), repr(error)):
            self.assertNotIn(self.SECRET, text)

        del data["token_file"], data["token_sha256"]
        error = self.fails(data)
        assertIssue(
            self,
            error,
            "token",
            "literal tokens are not allowed in config; use token: ${ENV_VAR} or token_file",
        )
        self.assertNotIn(self.SECRET, str(error))


class YamlFileTests(NodeConfigTestCase):
    def test_missingFile(self) -> None:
        path = os.path.join(self.base, "nope.yaml")
        error = self.assertRaises(ConfigError, load_node_config, path, ENVIRON)
        self.assertEqual([i.path for i in error.issues], [path])
        self.assertIn("cannot read config file", str(error))

    def test_syntaxError(self) -> None:
        path = self.write("node.yaml", "edge:\n\thost: x\n")
        error = self.assertRaises(ConfigError, load_node_config, path, ENVIRON)
        assertIssue(self, error, path, "invalid YAML at line 2")

    def test_nonMapping(self) -> None:
        path = self.write("node.yaml", "just text\n")
        error = self.assertRaises(ConfigError, load_node_config, path, ENVIRON)
        self.assertEqual(str(error), "<root>: must be a mapping, got string")

    def test_exampleLoads(self) -> None:
        example = os.path.join(EXAMPLE_DIR, "node.yaml")
        if not os.path.exists(example):
            raise self.skipTest("etc/iop/node.yaml is not in this tree")
        shutil.copy(example, os.path.join(self.base, "node.yaml"))
        config = load_node_config(os.path.join(self.base, "node.yaml"), {})
        self.assertTrue(config.token.matches(NODE_TOKEN))
        self.assertEqual((config.edge_host, config.edge_port), ("edge.example.net", 7443))
        assert config.tls is not None
        self.assertEqual(config.tls.server_name, "edge.iop.internal")
        self.assertEqual(config.reconnect.max_attempts, 10)
        self.assertEqual(config.store_path, DEFAULT_STORE_PATH)


class Row(NamedTuple):
    name: str
    mutate: Mutation
    path: str
    fragment: str


ROWS = [
    Row("edgeMissing", drop("edge"), "edge", "is required"),
    Row("edgeNotMapping", put("edge", "edge.example.net:7443"), "edge", "must be a mapping"),
    Row("hostMissing", drop("edge.host"), "edge.host", "is required"),
    Row("hostEmpty", put("edge.host", ""), "edge.host", "must not be empty"),
    Row("hostNotString", put("edge.host", 10), "edge.host", "must be a string"),
    Row("hostIsUrl", put("edge.host", "https://edge.example.net"), "edge.host", "not a URL"),
    Row("portMissing", drop("edge.port"), "edge.port", "is required"),
    Row("portZero", put("edge.port", 0), "edge.port", "must be >= 1"),
    Row("portTooBig", put("edge.port", 65536), "edge.port", "must be <= 65535"),
    Row("portString", put("edge.port", "7443"), "edge.port", "must be an integer, got string"),
    Row("portBool", put("edge.port", True), "edge.port", "got boolean"),
    Row("serverNameEmpty", put("edge.server_name", " "), "edge.server_name", "must not be empty"),
    Row("caFileMissing", drop("edge.ca_file"), "edge.ca_file", "is required unless plaintext"),
    Row("caFileNotFound", put("edge.ca_file", "pki/nope.crt"), "edge.ca_file", "does not exist"),
    Row("caFileEmptyString", put("edge.ca_file", ""), "edge.ca_file", "must not be empty"),
    Row(
        "certWithoutKey",
        put("edge.cert_file", "pki/node.crt"),
        "edge.key_file",
        "must be given together",
    ),
    Row(
        "keyWithoutCert",
        put("edge.key_file", "pki/node.key"),
        "edge.cert_file",
        "must be given together",
    ),
    Row(
        "certNotFound",
        chain(put("edge.cert_file", "x.crt"), put("edge.key_file", "pki/node.key")),
        "edge.cert_file",
        "does not exist",
    ),
    Row("plaintextNotBool", put("edge.plaintext", "true"), "edge.plaintext", "must be a boolean"),
    Row(
        "plaintextRemoteHost",
        chain(drop("edge.ca_file"), put("edge.plaintext", True)),
        "edge.plaintext",
        "only allowed when edge.host is a loopback address",
    ),
    Row(
        "plaintextWithCaFile",
        chain(put("edge.host", "127.0.0.1"), put("edge.plaintext", True)),
        "edge.ca_file",
        "must not be set when plaintext is true",
    ),
    Row("edgeUnknownKey", put("edge.hostname", "x"), "edge.hostname", "did you mean 'host'?"),
    Row("tokenNone", drop("token_file"), "<root>", "one of token or token_file is required"),
    Row(
        "tokenBoth",
        put("token", "${IOP_NODE_TOKEN}"),
        "<root>",
        "set only one of token or token_file (found: token, token_file)",
    ),
    Row(
        "tokenLiteral",
        chain(drop("token_file"), put("token", "abc")),
        "token",
        "literal tokens are not allowed in config",
    ),
    Row(
        "tokenVariableMissing",
        chain(drop("token_file"), put("token", "${NOPE}")),
        "token",
        "environment variable NOPE is not set",
    ),
    Row(
        "tokenVariableBlank",
        chain(drop("token_file"), put("token", "${EMPTY}")),
        "token",
        "environment variable EMPTY is empty",
    ),
    Row("tokenFileMissing", put("token_file", "missing.token"), "token_file", "does not exist"),
    Row("tokenFileEmpty", put("token_file", "empty.token"), "token_file", "is empty"),
    Row("tokenFileIsDirectory", put("token_file", "pki"), "token_file", "cannot read token file"),
    Row(
        "tokenFileNotString",
        put("token_file", ["a"]),
        "token_file",
        "must be a file path, got list",
    ),
    Row("tokenSha256", put("token_sha256", "ab" * 32), "token_sha256", "is for edge.yaml"),
    Row(
        "adapters",
        put("adapters", [{"type": "ollama"}]),
        "adapters",
        "adapters are configured on the Edge",
    ),
    Row("providers", put("providers", []), "providers", "providers are configured on the Edge"),
    Row("models", put("models", []), "models", "models are configured on the Edge"),
    Row("unknownTopKey", put("reconect", {}), "reconect", "did you mean 'reconnect'?"),
    Row("storeNotMapping", put("store", "iop.db"), "store", "must be a mapping"),
    Row("storePathEmpty", put("store", {"path": ""}), "store.path", "must not be empty"),
    Row("storeUnknownKey", put("store", {"file": "x"}), "store.file", "unknown key"),
    Row("maxFrameZero", put("max_frame_bytes", 0), "max_frame_bytes", "must be >= 1"),
    Row(
        "maxFrameTooBig",
        put("max_frame_bytes", 2**28 + 1),
        "max_frame_bytes",
        "must be <= 268435456",
    ),
    Row(
        "handshakeTimeoutZero",
        put("handshake_timeout_sec", 0),
        "handshake_timeout_sec",
        "must be > 0",
    ),
    Row(
        "handshakeTimeoutBool",
        put("handshake_timeout_sec", True),
        "handshake_timeout_sec",
        "must be a number",
    ),
]


def _add_row_tests(cls: type[SynchronousTestCase]) -> type[SynchronousTestCase]:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names)), "duplicate row names"
    for row in ROWS:

        def test(self: ValidationTableTests, row: Row = row) -> None:
            self.check_row(row)

        test.__name__ = f"test_{row.name}"
        test.__doc__ = f"{row.path}: ...{row.fragment}..."
        setattr(cls, test.__name__, test)
    return cls


@_add_row_tests
class ValidationTableTests(NodeConfigTestCase):
    """One test per row of ``ROWS``, each generated as ``test_<row name>``."""

    def check_row(self, row: Row) -> None:
        data = base_config()
        row.mutate(data)
        assertIssue(self, self.fails(data), row.path, row.fragment)

    def test_baseIsValid(self) -> None:
        self.parse(base_config())

    def test_collectsEveryIssue(self) -> None:
        data = base_config()
        data["edge"]["port"] = 0
        data["token_file"] = "missing.token"
        data["reconnect"] = {"max_attempts": -1, "interval_sec": 0}
        data["adapters"] = {}
        error = self.fails(data)
        self.assertEqual(
            [i.path for i in error.issues],
            [
                "edge.port",
                "token_file",
                "reconnect.max_attempts",
                "reconnect.interval_sec",
                "adapters",
            ],
        )
        self.assertEqual(len(str(error).splitlines()), 5)


class NodeConfigFromFlagsTests(SynchronousTestCase):
    """:func:`node_config_from_flags`: the one-line join, node.yaml's defaults and checks."""

    def setUp(self) -> None:
        self.dir = self.mktemp()
        os.makedirs(self.dir)
        for name, text in (("node.token", NODE_TOKEN + "\n"), ("ca.crt", "ca\n")):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    def build(self, **flags: Any) -> NodeDaemonConfig:
        arguments: dict[str, Any] = {
            "edge": "edge.example.net:7443",
            "token_file": "node.token",
            "ca_file": "ca.crt",
        }
        arguments.update(flags)
        return node_config_from_flags(base_dir=self.dir, environ={}, **arguments)

    def issues(self, **flags: Any) -> list[ConfigIssue]:
        return list(self.assertRaises(ConfigError, self.build, **flags).issues)

    def test_defaults_match_node_yaml(self) -> None:
        from_flags = self.build()
        data = base_config()
        data["edge"]["ca_file"] = "ca.crt"
        del data["edge"]["server_name"]  # both default it the same way
        from_yaml = parse_node_config(data, base_dir=self.dir, environ={})
        self.assertEqual(from_flags, from_yaml)
        self.assertEqual(from_flags.store_path, DEFAULT_STORE_PATH)
        self.assertEqual(from_flags.token, Secret(NODE_TOKEN))
        assert from_flags.tls is not None
        self.assertEqual(from_flags.tls.server_name, DEFAULT_JOIN_SERVER_NAME)
        self.assertEqual(from_flags.tls.ca_file, os.path.join(os.path.abspath(self.dir), "ca.crt"))

    def test_ipv6_literal(self) -> None:
        config = self.build(edge="[::1]:7443")
        self.assertEqual((config.edge_host, config.edge_port), ("::1", 7443))

    def test_server_name_and_store(self) -> None:
        config = self.build(server_name="gw.example.net", store="file:n.db")
        assert config.tls is not None
        self.assertEqual(config.tls.server_name, "gw.example.net")
        self.assertEqual(config.store_path, "file:n.db")

    def test_client_certificate(self) -> None:
        config = self.build(cert_file="ca.crt", key_file="node.token")
        assert config.tls is not None
        self.assertIsNotNone(config.tls.cert_file)
        self.assertIsNotNone(config.tls.key_file)

    def test_bad_edge(self) -> None:
        for edge in ("edge.example.net", "http://edge:7443", ":7443", "edge:", "::1:7443"):
            issues = self.issues(edge=edge)
            self.assertEqual([i.path for i in issues], ["--edge"], edge)

    def test_bad_port(self) -> None:
        for port in ("0", "65536", "x"):
            issues = self.issues(edge=f"edge.example.net:{port}")
            self.assertEqual([i.path for i in issues], ["--edge"], port)

    def test_errors_name_the_flag(self) -> None:
        issues = self.issues(token_file=None, ca_file=None, cert_file="ca.crt", store="")
        self.assertEqual(
            sorted(i.path for i in issues),
            ["--ca-file", "--key-file", "--store", "--token-file"],
        )
        self.assertIn(
            ConfigIssue("--ca-file", "is required with --edge"),
            issues,
        )

    def test_missing_token_file(self) -> None:
        issues = self.issues(token_file="absent.token")
        self.assertEqual(len(issues), 1)
        self.assertEqual(issues[0].path, "--token-file")
        self.assertIn("absent.token does not exist", issues[0].message)

    def test_empty_token_file(self) -> None:
        with open(os.path.join(self.dir, "empty.token"), "w"):
            pass
        issues = self.issues(token_file="empty.token")
        self.assertEqual([i.path for i in issues], ["--token-file"])
        self.assertIn("is empty", issues[0].message)

    def test_token_never_in_errors(self) -> None:
        error = self.assertRaises(ConfigError, self.build, ca_file="absent.crt")
        self.assertNotIn(NODE_TOKEN, str(error))
        self.assertNotIn(NODE_TOKEN, repr(error))
