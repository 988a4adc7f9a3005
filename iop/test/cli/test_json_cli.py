# -*- test-case-name: iop.test.cli.test_json_cli -*-
"""
``--json`` on every ``iop`` command that prints data: each parses as one JSON object with the
keys its ``--help`` documents, and holds no key material.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from iop.cli import main as cli_main
from iop.test.cli.support import CommandAssertions, Result, assert_no_key_material, run
from iop.test.cli.test_check_cli import EDGE_YAML

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: Commands that print data without ``--json``, and why that is right.
WITHOUT_JSON = {
    # Its output is already the node's JSON answer, as the Edge relayed it.
    ("node", "command"),
}


def leaf_commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable subcommand of ``parser``, by its words."""
    found: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += leaf_commands(sub, (*prefix, name))
    if not found and prefix:
        found.append((prefix, parser))
    return found


class EveryCommandTests(CommandAssertions):
    def test_every_command_has_json(self) -> None:
        """Every command takes --json, whose help says what the object holds."""
        missing = []
        for words, parser in leaf_commands(cli_main.build_parser()):
            options = {o: a for a in parser._actions for o in a.option_strings}
            if "--json" not in options:
                if words not in WITHOUT_JSON:
                    missing.append(" ".join(words))
                continue
            self.assertIn("{", options["--json"].help or "", words)
        self.assertEqual(missing, [])


class ReportJSONTests(CommandAssertions):
    """pki and keys: the report as one object, with the facts the prose tells."""

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())

    def json_of(self, *argv: str) -> dict[str, Any]:
        result = run([*argv, "--json"])
        self.assertOK(result)
        document: dict[str, Any] = json.loads(result.out)
        self.assertIsInstance(document, dict)
        self.assertEqual(set(document) >= {"wrote", "settings", "notes"}, True, document)
        for entry in document["settings"]:
            self.assertEqual(set(entry), {"config", "key", "value", "note"})
        for entry in document["wrote"]:
            self.assertEqual(set(entry), {"path", "what"})
        return document

    def settings(self, document: dict[str, Any]) -> dict[tuple[str, str], str]:
        return {(s["config"], s["key"]): s["value"] for s in document["settings"]}

    def test_pki(self) -> None:
        pki = os.path.join(self.dir, "pki")
        init = self.json_of("pki", "init", "--dir", pki)
        self.assertEqual([w["path"] for w in init["wrote"]], [f"{pki}/ca.crt", f"{pki}/ca.key"])
        self.assertTrue(init["not_after"].startswith("20"))
        self.assertEqual(init["notes"][0][:5], "Next:")
        edge = self.json_of("pki", "issue-edge", "edge.example", "--dir", pki)
        self.assertEqual(edge["names"], ["edge.example"])
        self.assertEqual(
            self.settings(edge)[("edge.yaml", "node_transport.tls.cert_file")],
            f"{pki}/edge.example.crt",
        )
        node = self.json_of("pki", "issue-node", "gpu-1", "--dir", pki)
        self.assertEqual(node["names"], ["gpu-1.node.iop.internal"])
        self.assertEqual(self.settings(node)[("node.yaml", "edge.key_file")], f"{pki}/gpu-1.key")

    def test_keys(self) -> None:
        keys = os.path.join(self.dir, "keys")
        issuer = self.json_of("keys", "issuer", "--dir", keys)
        self.assertEqual(issuer["kem"], "ed25519")
        self.assertTrue(issuer["key_id"])
        recipient = self.json_of("keys", "recipient", "gpu-1", "--dir", keys)
        self.assertEqual(recipient["kem"], "x25519")
        self.assertEqual(
            self.settings(recipient)[("node.yaml", "security.recipient_key_file")],
            f"{keys}/gpu-1.recipient.key",
        )
        result = run(["keys", "recipient", "gpu-2", "--dir", keys, "--json"])
        assert_no_key_material(self, result, *(os.path.join(keys, n) for n in os.listdir(keys)))

    def test_error_stays_on_stderr(self) -> None:
        """A failed command prints no JSON: one line on stderr, exit 1."""
        pki = os.path.join(self.dir, "pki")
        self.assertOK(run(["pki", "init", "--dir", pki]))
        self.assertUserError(run(["pki", "init", "--dir", pki, "--json"]), "exists")


class CheckJSONTests(CommandAssertions):
    def check(self, *argv: str) -> tuple[Result, dict[str, Any]]:
        result = run(["config", "check", *argv, "--json"])
        self.assertEqual(result.err, "")
        return result, json.loads(result.out)

    def test_valid(self) -> None:
        path = os.path.join(ROOT, "etc", "iop", "edge.yaml")
        result, document = self.check("--offline", path)
        self.assertEqual(result.code, 0)
        self.assertEqual(
            {k: v for k, v in document.items() if k != "summary"},
            {"file": path, "kind": "edge", "offline": True, "ok": True, "problems": []},
        )
        # Offline over missing files: the loader stopped there, so it cannot say more.
        self.assertIsNone(document["summary"])
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(EDGE_YAML % ("a" * 64, 2))
        result, document = self.check(path)
        self.assertEqual(result.code, 0)
        self.assertEqual(document["summary"], {"nodes": 1, "providers": 1, "models": 1})
        node = os.path.join(ROOT, "etc", "iop", "node.yaml")
        result, document = self.check("--offline", node)
        self.assertEqual((result.code, document["kind"], document["summary"]), (0, "node", None))

    def test_problems(self) -> None:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("listen: {nodes: 3}\nnodez: []\n")
        result, document = self.check(path)
        self.assertEqual(result.code, 1)
        self.assertEqual(
            (document["ok"], document["kind"], document["summary"]), (False, "edge", None)
        )
        self.assertTrue(document["problems"])
        for problem in document["problems"]:
            self.assertEqual(set(problem), {"path", "message"})
        self.assertIn("nodez", [p["path"] for p in document["problems"]])

    def test_unreadable_yaml(self) -> None:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("a: [\n")
        result, document = self.check(path)
        self.assertEqual((result.code, document["ok"], document["kind"]), (1, False, None))
        self.assertEqual(len(document["problems"]), 1)
