# -*- test-case-name: iop.test.cli.test_join_cli -*-
"""
``iop node add`` and ``iop token new --edge`` (L{iop.cli.node}, L{iop.cli.secrets},
L{iop.cli.join}): the join line and where its parts come from (flags, edge.yaml, the chain
``iop pki issue-edge`` writes), ``--json`` and ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import tempfile

import yaml
from twisted.trial.unittest import SynchronousTestCase

from iop.config.join import DEFAULT_SERVER_NAME, decode
from iop.security import pki
from iop.security.tls import ca_file_pin
from iop.test.cli.support import Result, run


class JoinLineTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.pki = os.path.join(self.dir, "pki")
        pki.init_ca_files(self.pki)
        pki.issue_edge_files(self.pki, "edge.iop.internal")
        self.ca = os.path.join(self.pki, "ca.crt")
        self.pin = ca_file_pin(self.ca)
        cwd = os.getcwd()
        os.chdir(self.dir)  # no etc/iop/edge.yaml here unless a test writes one
        self.addCleanup(os.chdir, cwd)

    def edge_yaml(self, listen: str, cert: str = "pki/edge.iop.internal.crt") -> str:
        path = os.path.join(self.dir, "edge.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(
                {"listen": {"nodes": listen}, "node_transport": {"tls": {"cert_file": cert}}}, f
            )
        return path

    def join_of(self, result: Result) -> str:
        self.assertEqual((result.code, result.err), (0, ""))
        [line] = [line.strip() for line in result.out.splitlines() if "--join " in line]
        words = shlex.split(line)
        self.assertEqual(words[:4], ["twistd", "-n", "iop-node", "--join"])
        return words[4]

    def test_node_add(self) -> None:
        result = run(
            ["node", "add", "gpu-a", "--edge", "gw.example.net:7443", "--ca-file", self.ca]
        )
        join = decode(self.join_of(result))
        self.assertEqual(
            (join.edges, join.ca_pin, join.server_name), (("gw.example.net:7443",), self.pin, None)
        )
        digest = hashlib.sha256(join.token.encode()).hexdigest()
        self.assertIn(f"  - id: gpu-a\n    token_sha256: {digest}\n", result.out)

    def test_from_edge_yaml(self) -> None:
        """listen.nodes' interface and port; the CA at the end of the Edge's cert_file."""
        path = self.edge_yaml("tcp:7443:interface=10.1.2.3")
        join = decode(self.join_of(run(["node", "add", "gpu-a", "--edge-config", path])))
        self.assertEqual((join.edges, join.ca_pin), (("10.1.2.3:7443",), self.pin))
        v6 = self.edge_yaml("tcp:port=7443:interface=\\:\\:1")
        join = decode(self.join_of(run(["node", "add", "gpu-a", "--edge-config", v6])))
        self.assertEqual(join.edges, ("[::1]:7443",))

    def test_default_edge_yaml_and_name_from_certificate(self) -> None:
        os.makedirs(os.path.join(self.dir, "etc", "iop"))
        pki.issue_edge_files(self.pki, "gw.iop.internal")
        with open(os.path.join(self.dir, "etc", "iop", "edge.yaml"), "w") as f:
            yaml.safe_dump(
                {
                    "listen": {"nodes": "tcp:7443:interface=127.0.0.1"},
                    "node_transport": {"tls": {"cert_file": "../../pki/gw.iop.internal.crt"}},
                },
                f,
            )
        join = decode(self.join_of(run(["node", "add", "gpu-a"])))
        self.assertEqual((join.edges, join.server_name), (("127.0.0.1:7443",), "gw.iop.internal"))

    def test_wildcard_listener_needs_edge(self) -> None:
        path = self.edge_yaml("tcp:7443:interface=0.0.0.0")
        result = run(["node", "add", "gpu-a", "--edge-config", path])
        self.assertEqual(result.code, 1)
        self.assertIn("binds every interface: give --edge HOST:7443", result.err)
        self.assertEqual(result.out, "")

    def test_certificate_without_its_ca(self) -> None:
        leaf = os.path.join(self.pki, "leaf.crt")
        with open(os.path.join(self.pki, "edge.iop.internal.crt"), "rb") as f:
            first = f.read().split(b"-----END CERTIFICATE-----")[0]
        with open(leaf, "wb") as f:
            f.write(first + b"-----END CERTIFICATE-----\n")
        path = self.edge_yaml("tcp:7443:interface=10.1.2.3", cert="pki/leaf.crt")
        result = run(["node", "add", "gpu-a", "--edge-config", path])
        self.assertEqual(result.code, 1)
        self.assertIn(
            "node_transport.tls.cert_file must hold the Edge's certificate then its CA", result.err
        )

    def test_no_address(self) -> None:
        result = run(["node", "add", "gpu-a", "--ca-file", self.ca])
        self.assertEqual(result.code, 1)
        self.assertIn("give --edge HOST:PORT", result.err)
        bad = run(["node", "add", "gpu-a", "--edge", "gw", "--ca-file", self.ca])
        self.assertIn("--edge 'gw': must be HOST:PORT", bad.err)

    def test_pin_and_name_flags(self) -> None:
        result = run(
            [
                "node",
                "add",
                "gpu-a",
                "--edge",
                "a:1",
                "--ca-pin",
                "AB" * 32,
                "--server-name",
                "n.example",
            ]
        )
        join = decode(self.join_of(result))
        self.assertEqual((join.ca_pin, join.server_name), ("sha256:" + "ab" * 32, "n.example"))
        self.assertIn("whose certificate names n.example", result.out)

    def test_json(self) -> None:
        result = run(["node", "add", "gpu-a", "--edge", "a:1", "--ca-file", self.ca, "--json"])
        document = json.loads(result.out)
        join = decode(document["join"])
        self.assertEqual(document["token"], join.token)
        self.assertEqual(
            document["nodes_entry"], {"id": "gpu-a", "token_sha256": document["token_sha256"]}
        )
        self.assertEqual(
            (document["edges"], document["ca_pin"], document["server_name"]),
            (["a:1"], self.pin, DEFAULT_SERVER_NAME),
        )

    def test_out(self) -> None:
        out = os.path.join(self.dir, "gpu-a.join")
        result = run(["node", "add", "gpu-a", "--edge", "a:1", "--ca-file", self.ca, "--out", out])
        self.assertEqual((result.code, result.err), (0, ""))
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)
        with open(out) as f:
            join = decode(f.read())
        self.assertNotIn(join.token, result.out)
        self.assertNotIn("iop1.", result.out)
        self.assertIn(f"twistd -n iop-node --join-file {out}", result.out)
        again = run(["node", "add", "gpu-a", "--edge", "a:1", "--ca-file", self.ca, "--out", out])
        self.assertEqual(again.code, 1)
        self.assertIn("exists; refusing to overwrite it", again.err)


class TokenAndKeyOutputTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def test_token_new_without_edge_has_no_join_line(self) -> None:
        result = run(["token", "new", "gpu-a"])
        self.assertNotIn("iop1.", result.out)

    def test_token_new_json(self) -> None:
        document = json.loads(run(["token", "new", "gpu-a", "--json"]).out)
        self.assertEqual(set(document), {"node_id", "token", "token_sha256"})
        self.assertEqual(
            hashlib.sha256(document["token"].encode()).hexdigest(), document["token_sha256"]
        )

    def test_token_new_out(self) -> None:
        out = os.path.join(self.dir, "t")
        result = run(["token", "new", "gpu-a", "--out", out, "--json"])
        document = json.loads(result.out)
        self.assertEqual(set(document), {"node_id", "token_file", "token_sha256"})
        with open(out) as f:
            token = f.read().strip()
        self.assertEqual(hashlib.sha256(token.encode()).hexdigest(), document["token_sha256"])
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)

    def test_key_new_json_and_out(self) -> None:
        document = json.loads(run(["key", "new", "team", "--json"]).out)
        self.assertEqual(set(document), {"name", "key", "key_sha256"})
        out = os.path.join(self.dir, "k")
        result = run(["key", "new", "team", "--rotate", "--out", out])
        self.assertEqual((result.code, result.err), (0, ""))
        with open(out) as f:
            key = f.read().strip()
        self.assertTrue(key.startswith("sk-iop-"))
        self.assertNotIn(key, result.out)
        self.assertIn(hashlib.sha256(key.encode()).hexdigest(), result.out)
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)
