# -*- test-case-name: iop.test.test_docs -*-
"""
The operator documentation (``docs/*.md``, the README's node section) and the systemd units in
``etc/systemd/`` agree with the code: every edge.yaml fragment of the recipes validates, every
``iop`` command line parses, every ``twistd iop-edge`` / ``iop-node`` flag exists, the README's
node section starts with the one-line join, the units start the daemons with real options, and
the troubleshooting page names every node reject code, TLS refusal reason, lease error class
and pool error code.

The pages are read from the source tree; a tree without them (an installed package) skips.
"""

from __future__ import annotations

import configparser
import copy
import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from twisted.python import usage
from twisted.trial.unittest import SkipTest, SynchronousTestCase

import iop
from iop.cli.check import AnyVariable
from iop.cli.main import build_parser
from iop.config import ConfigError
from iop.config.edge import parse_edge_config
from iop.config.model import DEFAULT_MAX_CONNECTIONS
from iop.edge import tap as edge_tap
from iop.edge.errors import Overloaded, QueueTimeout, Unavailable, UnknownModel
from iop.edge.registry import REJECT_REASONS
from iop.node import tap as node_tap
from iop.security.lease import LEASE_ERRORS
from iop.security.tls import REFUSAL_REASONS
from iop.wire import runtime_pb2 as pb

ROOT = Path(iop.__file__).resolve().parent.parent
DOCS = ROOT / "docs"
UNITS = ROOT / "etc" / "systemd"
JOIN = "twistd -n iop-node --join STRING"
# How many node connections the units' descriptor limit must leave room for, besides the
# client connections (the scale the Edge is benchmarked at).
NODES = 1000

# A complete edge.yaml around a recipe's fragment: loopback listeners, no file references.
BASE_EDGE: dict[str, Any] = {
    "listen": {"nodes": "tcp:7443:interface=127.0.0.1", "admin": "tcp:8081:interface=127.0.0.1"},
    "node_transport": {"plaintext": True},
    "openai": {
        "listen": "tcp:8080:interface=127.0.0.1",
        "auth": {"keys": [{"name": "k", "key_sha256": "0" * 64}]},
    },
    "models": [],
}


def read(path: Path) -> str:
    if not path.exists():
        raise SkipTest(f"{path} is not in this tree")
    return path.read_text(encoding="utf-8")


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def shell_lines(text: str) -> list[str]:
    """The commands of the ``sh`` blocks: continuations joined, comments dropped."""
    lines: list[str] = []
    for block in blocks(text, "sh"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def doc_pages() -> list[Path]:
    pages = sorted(DOCS.glob("*.md"))
    if not pages:
        raise SkipTest(f"no docs in {DOCS}")
    return pages


def plugin_flags(options: type[usage.Options]) -> set[str]:
    """The long options a twistd plugin's Options take, with their one-letter forms."""
    flags = {"--help", "--version"}
    for entry in [*getattr(options, "optParameters", []), *getattr(options, "optFlags", [])]:
        flags.add(f"--{entry[0]}")
        if entry[1]:
            flags.add(f"-{entry[1]}")
    return flags


PLUGINS = {"iop-edge": plugin_flags(edge_tap.Options), "iop-node": plugin_flags(node_tap.Options)}


def plugin_invocations(line: str) -> list[tuple[str, list[str]]]:
    """Each ``iop-edge`` / ``iop-node`` plugin named in a twistd command line, with its flags."""
    # Inline code in prose: `twistd iop-edge --version`, … (the quotes and commas are not flags).
    words = [w.strip("`,.;:()") for w in line.replace("[", " ").replace("]", " ").split()]
    found = []
    for i, word in enumerate(words):
        if word in PLUGINS and any(w.endswith("twistd") for w in words[:i]):
            flags = [w.split("=", 1)[0] for w in words[i + 1 :] if w.startswith("-")]
            found.append((word, flags))
    return found


class RecipeTests(SynchronousTestCase):
    """docs/recipes.md: every fragment with nodes or models validates in a complete edge.yaml."""

    def test_fragments_validate(self) -> None:
        text = read(DOCS / "recipes.md")
        checked = 0
        for block in blocks(text, "yaml"):
            block = re.sub(r'"<iop token new [^>]*>"', '"' + "a" * 64 + '"', block)
            fragment = yaml.safe_load(block)
            if not isinstance(fragment, dict) or "nodes" not in fragment:
                continue
            data = copy.deepcopy(BASE_EDGE)
            data.update(fragment)
            try:
                parse_edge_config(data, base_dir=self.mktemp(), environ=AnyVariable())
            except ConfigError as e:
                self.fail(f"a recipe does not validate:\n{block}\n{e}")
            checked += 1
        self.assertGreaterEqual(checked, 6)


class CommandLineTests(SynchronousTestCase):
    """Every command the pages show is one the code takes."""

    def test_iop_commands_parse(self) -> None:
        parser = build_parser()
        checked = 0
        for page in doc_pages():
            for line in shell_lines(read(page)):
                if not line.startswith(("iop ", "sudo -u iop iop ")):
                    continue
                words = shlex.split(line)
                if words[:3] == ["sudo", "-u", "iop"]:
                    words = words[3:]
                if not words or words[0] != "iop":
                    continue
                try:
                    parser.parse_args(words[1:])
                except SystemExit:
                    self.fail(f"{page.name}: `{line}` is not an iop command line")
                checked += 1
        self.assertGreater(checked, 20)

    def test_twistd_flags_exist(self) -> None:
        """Flags given to iop-edge / iop-node in the pages, the README and the units exist."""
        sources = [*doc_pages(), ROOT / "README.md", *sorted(UNITS.glob("*.service"))]
        checked = 0
        for source in sources:
            text = read(source).replace("\\\n", " ")
            for line in text.splitlines():
                for plugin, flags in plugin_invocations(line):
                    unknown = [f for f in flags if f not in PLUGINS[plugin]]
                    self.assertEqual(unknown, [], f"{source.name}: {line.strip()}")
                    checked += 1
        self.assertGreater(checked, 10)

    def test_readme_node_section_starts_with_the_join(self) -> None:
        text = read(ROOT / "README.md")
        section = text.split("\n### A node\n", 1)[1]
        first = blocks(section, "sh")[0].strip()
        self.assertEqual(first, JOIN)
        self.assertTrue(section.lstrip().startswith("```sh\n" + JOIN))
        # The join is the plugin's own synopsis, as far as it goes.
        self.assertIn(JOIN.split(" iop-node ", 1)[1], node_tap.Options.synopsis)


class UnitTests(SynchronousTestCase):
    """etc/systemd: the units run the plugins with a config, enough descriptors, as iop."""

    def unit(self, name: str) -> configparser.SectionProxy:
        parser = configparser.ConfigParser(interpolation=None, strict=True)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(read(UNITS / name))
        return parser["Service"]

    def test_units(self) -> None:
        units = (
            ("iop-edge.service", "iop-edge"),
            ("iop-edge@.service", "iop-edge"),
            ("iop-node.service", "iop-node"),
        )
        for name, plugin in units:
            service = self.unit(name)
            self.assertEqual((service["User"], service["Group"]), ("iop", "iop"))
            [(found, flags)] = plugin_invocations(service["ExecStart"])
            self.assertEqual(found, plugin)
            self.assertIn("--config", flags)
            # Room for every client connection the Edge admits by default plus the nodes.
            self.assertGreater(int(service["LimitNOFILE"]), DEFAULT_MAX_CONNECTIONS + NODES)
            self.assertEqual(service["Restart"], "on-failure")
            self.assertEqual(service["NoNewPrivileges"], "yes")
            self.assertEqual(service["ProtectSystem"], "strict")
            self.assertEqual(service["WorkingDirectory"], "/var/lib/iop")
        self.assertEqual(self.unit("iop-edge.service")["ExecReload"], "/bin/kill -HUP $MAINPID")
        # The template: one config file per instance.
        template = self.unit("iop-edge@.service")
        self.assertIn("--config /etc/iop/edge-%i.yaml", template["ExecStart"])
        self.assertEqual(template["ExecReload"], "/bin/kill -HUP $MAINPID")


class MultiEdgeTests(SynchronousTestCase):
    """docs/multi-edge.md: the first Edge's file validates, and so does the second (its changes
    applied to the first)."""

    def test_edge_files_validate(self) -> None:
        text = read(DOCS / "multi-edge.md")
        first, second = [
            yaml.safe_load(b) for b in blocks(text, "yaml") if "edge" in yaml.safe_load(b)
        ]
        # The parts the page leaves out: TLS (listen.nodes is not on loopback) and a node.
        base = self.mktemp()
        os.makedirs(base)
        for name in ("edge.crt", "edge.key"):
            Path(base, name).write_text("")
        rest = {
            "node_transport": {"tls": {"cert_file": "edge.crt", "key_file": "edge.key"}},
            "nodes": [{"id": "gpu-1", "token_sha256": "0" * 64}],
        }
        configs = [copy.deepcopy(BASE_EDGE) | rest | first]
        configs.append(copy.deepcopy(configs[0]))
        for key, section in second.items():
            configs[1][key] = {**configs[1].get(key, {}), **section}
        loaded = [parse_edge_config(c, base_dir=base, environ=AnyVariable()) for c in configs]
        self.assertEqual([c.client_api.reuse_port for c in loaded], [True, True])
        self.assertEqual(len({c.client_api.listen for c in loaded}), 1)
        self.assertEqual(len({c.node_listen for c in loaded} | {c.admin_listen for c in loaded}), 4)
        ids = [c.cluster.edge_id for c in loaded if c.cluster is not None]
        self.assertEqual(ids, ["edge-1", "edge-2"])


class TroubleshootingTests(SynchronousTestCase):
    """docs/troubleshooting.md names every reason a node or a request can be refused for."""

    def test_every_reason(self) -> None:
        text = read(DOCS / "troubleshooting.md")
        reject_codes = [
            name for name in pb.RegisterRejectCode.keys() if name != "REGISTER_REJECT_UNSPECIFIED"
        ]
        pool_codes = [cls.code for cls in (UnknownModel, Unavailable, Overloaded, QueueTimeout)]
        client_codes = [
            "missing_api_key",
            "invalid_api_key",
            "model_not_allowed",
            "invalid_json",
            "unsupported",
            "upstream_error",
            "provider_busy",
            "node_unavailable",
            "no_route",
            "credential_unavailable",
            "dispatch_failed",
            "request_timeout",
            "request_too_large",
            "too_many_connections",
        ]
        names = [
            *reject_codes,
            *REJECT_REASONS,
            *REFUSAL_REASONS,
            *LEASE_ERRORS,
            *pool_codes,
            *client_codes,
        ]
        for name in names:
            self.assertIn(f"`{name}`", text, f"troubleshooting.md does not explain {name}")


class LinkTests(SynchronousTestCase):
    """Relative links between the pages and the README resolve to files in the tree."""

    def test_links(self) -> None:
        for page in [*doc_pages(), ROOT / "README.md"]:
            for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", read(page)):
                path = (page.parent / target).resolve()
                self.assertTrue(os.path.exists(path), f"{page.name}: link to {target}")
