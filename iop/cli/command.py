# -*- test-case-name: iop.test.cli.test_main -*-
"""
What every ``iop`` command shares: :class:`CommandError` (a user error: one line on stderr, exit
code 1) and :class:`Report`, which tells the operator what was written and which edge.yaml or
node.yaml key takes each file. A report names files and public identifiers only, never key
material.

A command group is a module with ``register(subparsers)``; each of its subcommands sets
``run`` (a :data:`Run`) as its parser default.

Every command that prints data takes ``--json`` (:func:`add_json_argument`): one JSON object on
stdout, the same keys every time, documented in the command's ``--help``. A command that fills a
:class:`Report` gets its JSON form for free (:data:`REPORT_JSON`): ``iop`` makes the report with
``as_json`` when ``--json`` was given, and :meth:`Report.finish` prints the object instead of the
prose. Errors stay one line on stderr either way, so a script reads stdout only on exit 0.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

#: A subcommand: parsed arguments and the report to fill; raises CommandError on a user error.
Run = Callable[[argparse.Namespace, "Report"], None]


#: The JSON object of a :class:`Report`, as ``--help`` documents it.
REPORT_JSON = (
    '{"wrote": [{"path", "what"}], "settings": [{"config", "key", "value", "note"}], '
    '"notes": [text]}'
)


def add_json_argument(parser: argparse.ArgumentParser, document: str) -> None:
    """``--json``: print ``document`` (the shape of the object, for ``--help``) instead of
    the table or prose."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object instead: {document}".replace("%", "%%"),
    )


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
    #: Print the report as one JSON object (``--json``).
    as_json: bool = False
    _wrote: list[tuple[str, str]] = field(default_factory=list)
    _settings: list[Setting] = field(default_factory=list)
    _notes: list[str] = field(default_factory=list)
    _facts: dict[str, Any] = field(default_factory=dict)

    def wrote(self, path: str, what: str) -> None:
        """C{path} was written; C{what} says what it holds (never its content)."""
        self._wrote.append((path, what))

    def goes(self, config: str, key: str, value: str, note: str = "") -> None:
        """C{config} (C{"edge.yaml"}, C{"node.yaml"}) key C{key} takes C{value}."""
        self._settings.append(Setting(config, key, value, note))

    def note(self, text: str) -> None:
        self._notes.append(text)

    def fact(self, name: str, value: Any) -> None:
        """A fact the prose already tells (a key id, an expiry date), as a top-level key of the
        JSON form; public identifiers only, never key material."""
        self._facts[name] = value

    def document(self) -> dict[str, Any]:
        """The report as :data:`REPORT_JSON` says, plus the command's fields."""
        return {
            "wrote": [{"path": path, "what": what} for path, what in self._wrote],
            "settings": [
                {"config": s.config, "key": s.key, "value": s.value, "note": s.note}
                for s in self._settings
            ],
            "notes": list(self._notes),
            **self._facts,
        }

    @property
    def settings(self) -> tuple[Setting, ...]:
        return tuple(self._settings)

    def finish(self) -> None:
        """Print the report (nothing when nothing was reported: the command printed its own
        output)."""
        if self.as_json:
            if self._wrote or self._settings or self._notes or self._facts:
                print(json.dumps(self.document(), indent=2), file=self.out)
            return
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
