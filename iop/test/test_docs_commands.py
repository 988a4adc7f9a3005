# -*- test-case-name: iop.test.test_docs_commands -*-
"""
Every command the README and ``docs/*.md`` show in a fenced shell block is one the code takes,
and every block that can run offline runs.

- **Parsed**, never executed: each ``iop …`` line (also ``sudo -u iop iop …`` and ``python -m
  iop.cli …``) with the CLI's own argparse parser (the subcommand exists, every flag given
  exists and takes what it is given); each ``twistd … iop-edge|iop-node …`` line's flags
  against the plugin's ``usage.Options``; each ``iop-fake-*`` line with that command's parser.
- **Run**, in a temporary directory shared by a page's blocks in page order (a guide's steps
  build on each other), with the repository's ``etc/`` beside it: a block whose every command is
  an ``iop`` command that needs neither a running Edge nor this host's files (:data:`OFFLINE`:
  ``pki``, ``keys``, ``token new``, ``key new``, ``config check``, ``--version``, ``--help``).
  Each must exit 0.

What a block is, the page says, not this test: the line before its fence may carry a marker,
``<!-- docs-test: no-run (why) -->`` (a block that looks runnable but must not run here: it
names ``/etc/iop`` paths, or mixes in commands of the host such as ``install`` or
``systemctl``) or ``<!-- docs-test: synopsis -->`` (a usage summary with ``[--flag]`` and
``a | b``: only its command words and its bracketed flags are checked). A block holding an
offline ``iop`` command among commands that cannot run here, without a marker, fails the test:
mark it rather than have it guessed.

The pages are read from the source tree; a tree without them (an installed package) skips.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from iop.cli.main import build_parser
from iop.cli.main import main as iop_main
from iop.test.test_docs import DOCS, PLUGINS, ROOT, plugin_invocations, read
from iop.testing import fake_cli_agent, fake_ollama, fake_openai

MARKER = re.compile(r"<!--\s*docs-test:\s*([a-z-]+)\b[^>]*-->\s*\Z")
MARKS = ("no-run", "synopsis")
FENCE = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.S | re.M)
#: The ``iop`` commands that run offline, by their leading words.
OFFLINE = (("pki",), ("keys",), ("token", "new"), ("key", "new"), ("config", "check"))
#: How ``iop`` is spelled at the start of a command line.
IOP_PREFIXES = (("sudo", "-u", "iop", "iop"), ("python", "-m", "iop.cli"), ("iop",))


def _parse_fake_cli_agent(argv: list[str]) -> object:
    return fake_cli_agent._parser().parse_args(argv)


#: The fake upstreams' console scripts and their parsers.
FAKES: dict[str, Callable[[list[str]], object]] = {
    "iop-fake-openai": fake_openai.parse_args,
    "iop-fake-ollama": fake_ollama.parse_args,
    "iop-fake-cli-agent": _parse_fake_cli_agent,
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    mark: str
    commands: tuple[str, ...]

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for page in found:
        read(page)  # skips when the tree has no docs
    return found


def commands(block: str) -> tuple[str, ...]:
    """The command lines of a block: continuations joined, comments and prompts dropped."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            lines.append(line)
    return tuple(lines)


def blocks(page: Path) -> Iterator[Block]:
    text = read(page)
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        mark = marker.group(1) if marker else ""
        line = text.count("\n", 0, match.start()) + 1
        yield Block(page, line, mark, commands(match.group(1)))


def iop_words(line: str) -> list[str] | None:
    """The arguments after ``iop`` of an ``iop`` command line, else None."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    for prefix in IOP_PREFIXES:
        if tuple(words[: len(prefix)]) == prefix:
            return words[len(prefix) :]
    return None


def offline(words: list[str]) -> bool:
    if words[:1] in (["--version"], ["--help"], ["-h"]):
        return True
    return any(tuple(words[: len(lead)]) == lead for lead in OFFLINE)


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield out


def parses(parse: Callable[[list[str]], object], words: list[str]) -> str:
    """ "" when ``words`` parse, else what the parser said."""
    with quiet() as out:
        try:
            parse(words)
        except SystemExit as e:
            if e.code not in (0, None):
                return out.getvalue().strip().splitlines()[-1]
    return ""


def subcommand(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The parser of the command ``words`` names (as far as they name one)."""
    for word in words:
        choices = [a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not choices or word not in choices[0]:
            raise KeyError(word)
        parser = choices[0][word]
    return parser


class DocsCommandsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.blocks = [b for page in pages() for b in blocks(page)]

    def test_markers_are_known(self) -> None:
        for block in self.blocks:
            if block.mark:
                self.assertIn(block.mark, MARKS, block.where())

    def test_commands_parse(self) -> None:
        """Every iop, twistd plugin and fake-upstream command line parses."""
        parser = build_parser()
        checked = {"iop": 0, "twistd": 0, "fake": 0}
        for block in self.blocks:
            if block.mark == "synopsis":
                continue
            for line in block.commands:
                where = f"{block.where()}: `{line}`"
                words = iop_words(line)
                if words is not None:
                    problem = parses(parser.parse_args, words)
                    self.assertEqual(problem, "", f"{where} is not an iop command line")
                    checked["iop"] += 1
                    continue
                for plugin, flags in plugin_invocations(line):
                    unknown = [f for f in flags if f not in PLUGINS[plugin]]
                    self.assertEqual(unknown, [], where)
                    checked["twistd"] += 1
                first, _, rest = line.partition(" ")
                if first in FAKES:
                    problem = parses(FAKES[first], shlex.split(rest))
                    self.assertEqual(problem, "", where)
                    checked["fake"] += 1
        self.assertGreater(checked["iop"], 25, checked)
        self.assertGreater(checked["twistd"], 5, checked)
        self.assertEqual(checked["fake"], len(FAKES) + 1, checked)

    def test_synopses_name_real_commands_and_flags(self) -> None:
        parser = build_parser()
        synopses = [b for b in self.blocks if b.mark == "synopsis"]
        self.assertTrue(synopses)
        for block in synopses:
            for line in block.commands:
                words = line.split()
                self.assertEqual(words[0], "iop", block.where())
                path = []
                for word in words[1:]:
                    if not re.fullmatch(r"[a-z][a-z-]*", word):
                        break
                    path.append(word)
                try:
                    command = subcommand(parser, path)
                except KeyError as e:
                    self.fail(f"{block.where()}: `{line}`: no command {e}")
                options = {o for a in command._actions for o in a.option_strings}
                for flag in re.findall(r"\[(--[a-z-]+)", line):
                    self.assertIn(flag, options, f"{block.where()}: `{line}`")

    def test_offline_blocks_run(self) -> None:
        """Each block of offline iop commands runs, exit 0, in page order per page."""
        ran = 0
        by_page: dict[Path, list[Block]] = {}
        for block in self.blocks:
            by_page.setdefault(block.page, []).append(block)
        for page_blocks in by_page.values():
            where = os.path.abspath(self.mktemp())
            os.makedirs(where)
            os.symlink(ROOT / "etc", os.path.join(where, "etc"))
            for block in page_blocks:
                if block.mark:
                    continue
                argvs = [iop_words(line) for line in block.commands]
                runnable = [w is not None and offline(w) for w in argvs]
                if not any(runnable):
                    continue
                self.assertTrue(
                    all(runnable),
                    f"{block.where()}: an offline iop command among commands that cannot run "
                    "here; mark the block <!-- docs-test: no-run (why) -->",
                )
                for line, argv in zip(block.commands, argvs, strict=True):
                    assert argv is not None
                    code, output = self.run_iop(where, argv)
                    self.assertEqual(code, 0, f"{block.where()}: `{line}`:\n{output}")
                    ran += 1
        self.assertGreaterEqual(ran, 18, ran)

    def run_iop(self, cwd: str, argv: list[str]) -> tuple[int, str]:
        here = os.getcwd()
        os.chdir(cwd)
        try:
            with quiet() as out:
                try:
                    code = iop_main(argv)
                except SystemExit as e:  # --version
                    code = e.code if isinstance(e.code, int) else 0
        finally:
            os.chdir(here)
        return code, out.getvalue()
