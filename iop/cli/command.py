# -*- test-case-name: iop.test.cli.test_main -*-
"""
What every ``iop`` command shares: :class:`CommandError` (a user error: one line on stderr, exit
code 1) and :class:`Report`, which tells the operator what was written and which edge.yaml or
node.yaml key takes each file. A report names files and public identifiers only, never key
material.

A command group is a module with ``register(subparsers)``; each of its subcommands sets
``run`` (a :data:`Run`) as its parser default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

#: A subcommand: parsed arguments and the report to fill; raises CommandError on a user error.
Run = Callable[[argparse.Namespace, "Report"], None]


class CommandError(Exception):
    """A user error: the message is printed as one line on stderr and the exit code is 1."""


@dataclass(frozen=True)
class Setting:
    """One config key that takes a value this command produced."""

    config: str
    key: str
    value: str
    note: str = ""


@dataclass
class Report:
    """What a command wrote and where each piece goes, printed once it has succeeded."""

    out: TextIO
    _wrote: list[tuple[str, str]] = field(default_factory=list)
    _settings: list[Setting] = field(default_factory=list)
    _notes: list[str] = field(default_factory=list)

    def wrote(self, path: str, what: str) -> None:
        """C{path} was written; C{what} says what it holds (never its content)."""
        self._wrote.append((path, what))

    def goes(self, config: str, key: str, value: str, note: str = "") -> None:
        """C{config} (C{"edge.yaml"}, C{"node.yaml"}) key C{key} takes C{value}."""
        self._settings.append(Setting(config, key, value, note))

    def note(self, text: str) -> None:
        self._notes.append(text)

    @property
    def settings(self) -> tuple[Setting, ...]:
        return tuple(self._settings)

    def finish(self) -> None:
        """Print the report."""
        for path, what in self._wrote:
            print(f"wrote {path}: {what}", file=self.out)
        if self._settings:
            print("", file=self.out)
            print(
                "Where it goes (a relative path in a config file is relative to that file's "
                "directory):",
                file=self.out,
            )
            width = max(len(f"{s.config}  {s.key}:") for s in self._settings)
            for s in self._settings:
                line = f"  {f'{s.config}  {s.key}:':<{width}} {s.value}"
                if s.note:
                    line = f"{line}  ({s.note})"
                print(line, file=self.out)
        if self._notes:
            print("", file=self.out)
            for text in self._notes:
                print(text, file=self.out)
