# -*- test-case-name: iop.test.cli.test_check_cli -*-
"""
Tests for C{iop config check} (L{iop.cli.check}): every example config in C{etc/} passes
offline; a broken file prints every problem as C{path: message} and exits 1; the kind is told
from the content or C{--kind}.
"""

from __future__ import annotations

import glob
import os

from twisted.trial.unittest import SynchronousTestCase

from iop.cli import check
from iop.test.cli.support import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLES = sorted(
    glob.glob(os.path.join(ROOT, "etc", "iop", "*.yaml"))
    + glob.glob(os.path.join(ROOT, "etc", "iop", "demo", "*.yaml"))
)

NODE_YAML = "edge: {host: 127.0.0.1, port: 7000, plaintext: true}\ntoken: ${IOP_T}\n"
EDGE_YAML = """\
listen: {nodes: "tcp:7000:interface=127.0.0.1", admin: "tcp:7001:interface=127.0.0.1"}
node_transport: {plaintext: true}
nodes:
  - id: node-a
    token_sha256: %s
    adapters: {openai_compat: {base_url: "http://127.0.0.1:9"}}
    providers:
      - {id: a-chat, adapter: openai_compat, category: api, models: [m1], capacity: %s}
models:
  - {id: m1, providers: [{id: a-chat, target: m1}]}
"""


class ExampleConfigTests(SynchronousTestCase):
    def test_examplesFound(self) -> None:
        names = {os.path.relpath(p, ROOT) for p in EXAMPLES}
        self.assertTrue({"etc/iop/edge.yaml", "etc/iop/node.yaml"} <= names, names)

    def test_everyExamplePassesOffline(self) -> None:
        for path in EXAMPLES:
            result = run(["config", "check", "--offline", path])
            self.assertEqual((result.code, result.err), (0, ""), f"{path}:\n{result.out}")
            kind = "node" if "node" in os.path.basename(path) else "edge"
            self.assertTrue(result.out.startswith(f"{path}: ok ({kind} config"), result.out)

    def test_exampleOnlineNamesWhatTheHostLacks(self) -> None:
        node = os.path.join(ROOT, "etc", "iop", "node.yaml")
        result = run(["config", "check", node])
        self.assertEqual(result.code, 1)
        self.assertIn("token_file: token file ", result.out)
        self.assertTrue(result.out.endswith(f"{node}: 2 problems (node config)\n"), result.out)


class CheckTests(SynchronousTestCase):
    def write(self, text: str) -> str:
        path: str = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_validEdge(self) -> None:
        path = self.write(EDGE_YAML % ("a" * 64, 2))
        result = run(["config", "check", path])
        self.assertEqual(
            (result.code, result.out),
            (0, f"{path}: ok (edge config: 1 node, 1 provider, 1 model)\n"),
        )

    def test_everyProblem(self) -> None:
        path = self.write(EDGE_YAML % ("xyz", 0))
        result = run(["config", "check", path])
        self.assertEqual(result.code, 1)
        lines = result.out.splitlines()
        self.assertIn(
            "nodes[0].token_sha256: must be a sha256 digest: exactly 64 hexadecimal characters",
            lines,
        )
        self.assertTrue(any(line.startswith("nodes[0].providers[0].capacity: ") for line in lines))
        self.assertEqual(lines[-1], f"{path}: {len(lines) - 1} problems (edge config)")

    def test_nodeEnvironment(self) -> None:
        path = self.write(NODE_YAML)
        self.patch(os, "environ", {})
        result = run(["config", "check", path])
        self.assertEqual(result.code, 1)
        self.assertIn("token: environment variable IOP_T is not set", result.out)
        self.assertEqual(run(["config", "check", "--offline", path]).code, 0)
        self.patch(os, "environ", {"IOP_T": "secret-token-value"})
        result = run(["config", "check", path])
        self.assertEqual((result.code, result.out), (0, f"{path}: ok (node config)\n"))

    def test_kind(self) -> None:
        path = self.write(NODE_YAML)
        result = run(["config", "check", "--offline", "--kind", "edge", path])
        self.assertEqual(result.code, 1)
        unknown = self.write("something: 1\n")
        result = run(["config", "check", unknown])
        self.assertEqual(result.code, 1)
        self.assertIn("cannot tell an edge.yaml from a node.yaml; give --kind", result.err)

    def test_invalidYaml(self) -> None:
        path = self.write("nodes: [\n")
        result = run(["config", "check", path])
        self.assertEqual(result.code, 1)
        self.assertIn("invalid YAML", result.out)

    def test_missingFile(self) -> None:
        result = run(["config", "check", os.path.join(self.mktemp(), "edge.yaml")])
        self.assertEqual(result.code, 1)
        self.assertIn("cannot read config file", result.out)

    def test_kindOf(self) -> None:
        self.assertEqual(check.kind_of({"edge": {"host": "h"}}), "node")
        self.assertEqual(check.kind_of({"edge": {"id": "e"}, "nodes": []}), "edge")
        self.assertIsNone(check.kind_of([1]))
