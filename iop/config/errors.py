# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_node_config -*-
"""
Configuration problems, and the issue-collecting reader the loaders use to walk YAML data.

A loader never stops at the first problem: every check records a :class:`ConfigIssue` (a
dotted path such as ``nodes[1].providers[0].priority`` and a message) in an :class:`Issues`
collector and carries on with a placeholder value. At the end the loader raises one
:class:`ConfigError` holding all of them.

Messages name paths, keys, types and environment-variable names; they never quote the value
of a token, header or environment entry.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

ROOT: Final = "<root>"

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


@dataclass(frozen=True)
class ConfigIssue:
    """One problem found in a configuration: where (``path``) and what (``message``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(Exception):
    """
    A configuration failed to load or validate. ``issues`` holds every problem found;
    ``str()`` gives one ``path: message`` line per issue.
    """

    def __init__(self, issues: Iterable[ConfigIssue], source: str = "") -> None:
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        # The file the configuration came from, when known (not part of ``str()``).
        self.source = source
        super().__init__(*self.issues)

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)

    def __repr__(self) -> str:
        return f"ConfigError({list(self.issues)!r})"


class Issues:
    """An ordered collector of :class:`ConfigIssue`."""

    def __init__(self) -> None:
        self._issues: list[ConfigIssue] = []

    def add(self, path: str, message: str) -> None:
        self._issues.append(ConfigIssue(path or ROOT, message))

    def __len__(self) -> int:
        return len(self._issues)

    def __iter__(self) -> Iterator[ConfigIssue]:
        return iter(self._issues)

    def raise_if_any(self, source: str = "") -> None:
        if self._issues:
            raise ConfigError(self._issues, source)


# ---------------------------------------------------------------------------------------------
# Paths


def key_path(path: str, key: str) -> str:
    """``path`` extended by a mapping key: ``a.b``, or ``a["odd key"]`` for unusual keys."""
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path and path != ROOT else key
    quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{path}[{quoted}]" if path and path != ROOT else f"[{quoted}]"


def index_path(path: str, index: int) -> str:
    """``path`` extended by a list index: ``a[3]``."""
    return f"{path}[{index}]"


def type_name(value: object) -> str:
    """A YAML-flavoured name for the type of ``value``, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def scalar_text(value: object) -> str | None:
    """
    The text of a YAML scalar for free-form string maps and argument lists (``8192`` →
    ``"8192"``, ``true`` → ``"true"``); ``None`` for non-scalars.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


# ---------------------------------------------------------------------------------------------
# Typed reading of one mapping


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


def as_section(issues: Issues, path: str, value: object) -> Section | None:
    """
    Wrap ``value`` as a :class:`Section` if it is a mapping with string keys; otherwise record
    an issue and return ``None``.
    """
    if not isinstance(value, Mapping):
        issues.add(path, f"must be a mapping, got {type_name(value)}")
        return None
    clean: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            issues.add(path, f"keys must be strings, got {type_name(key)} key {key!r}")
            continue
        clean[key] = item
    return Section(issues, path, clean)


def as_list(issues: Issues, path: str, value: object) -> list[tuple[str, object]] | None:
    """``[(item path, item)]`` if ``value`` is a list; otherwise record an issue."""
    if not isinstance(value, list | tuple):
        issues.add(path, f"must be a list, got {type_name(value)}")
        return None
    return [(index_path(path, i), item) for i, item in enumerate(value)]


class Section:
    """
    One YAML mapping being read. Every accessor marks its key as known; :meth:`finish`
    reports the keys nobody asked for as unknown (with a did-you-mean hint), so typos are
    caught. An explicit ``null`` reads as an absent key.

    Accessors record an issue and return a placeholder (the default) on bad input, so one
    pass collects every problem.
    """

    def __init__(self, issues: Issues, path: str, data: Mapping[str, object]) -> None:
        self.issues = issues
        self.path = path
        self.data = data
        self._known: set[str] = set()

    # -- raw access --------------------------------------------------------------------------

    def path_of(self, key: str) -> str:
        return key_path(self.path, key)

    def has(self, key: str) -> bool:
        """Whether ``key`` is present with a non-null value (does not mark it known)."""
        return self.data.get(key) is not None

    def raw(self, key: str) -> object:
        """The value at ``key`` or :data:`MISSING` (absent or null); marks ``key`` known."""
        self._known.add(key)
        value = self.data.get(key)
        return MISSING if value is None else value

    def require(self, key: str) -> object:
        value = self.raw(key)
        if value is MISSING:
            self.issues.add(self.path_of(key), "is required")
        return value

    def finish(self, rejected: Mapping[str, str] | None = None) -> None:
        """
        Report every key not read as unknown. ``rejected`` maps keys to a specific message
        (e.g. keys that belong in the other daemon's config).
        """
        rejected = rejected or {}
        for key in self.data:
            if key in self._known:
                continue
            if key in rejected:
                self.issues.add(self.path_of(key), rejected[key])
                continue
            message = "unknown key"
            close = difflib.get_close_matches(key, sorted(self._known), n=1, cutoff=0.6)
            if close:
                message += f"; did you mean {close[0]!r}?"
            self.issues.add(self.path_of(key), message)

    # -- typed accessors ---------------------------------------------------------------------

    def string(
        self, key: str, default: str = "", *, required: bool = False, nonempty: bool = False
    ) -> str:
        """
        A string (``default`` when absent). ``nonempty`` rejects a blank value when given;
        ``required`` also rejects an absent one.
        """
        value = self.require(key) if required else self.raw(key)
        if value is MISSING:
            return default
        if not isinstance(value, str):
            self.issues.add(self.path_of(key), f"must be a string, got {type_name(value)}")
            return default
        if (required or nonempty) and not value.strip():
            self.issues.add(self.path_of(key), "must not be empty")
        return value

    def choice(
        self, key: str, choices: Iterable[str], default: str = "", *, required: bool = False
    ) -> str:
        """A string from ``choices`` (``default`` when absent)."""
        allowed = sorted(choices)
        value = self.string(key, default, required=required)
        given = self.data.get(key)
        if isinstance(given, str) and value not in allowed and (value or not required):
            shown = ", ".join(repr(c) for c in allowed)
            self.issues.add(self.path_of(key), f"must be one of {shown}, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is MISSING:
            return default
        if not isinstance(value, bool):
            self.issues.add(
                self.path_of(key), f"must be a boolean (true/false), got {type_name(value)}"
            )
            return default
        return value

    def integer(
        self,
        key: str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        required: bool = False,
    ) -> int:
        value = self.require(key) if required else self.raw(key)
        if value is MISSING:
            return default
        result = check_integer(self.issues, self.path_of(key), value, minimum, maximum)
        return default if result is None else result

    def optional_integer(self, key: str, *, minimum: int | None = None) -> int | None:
        value = self.raw(key)
        if value is MISSING:
            return None
        return check_integer(self.issues, self.path_of(key), value, minimum, None)

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        positive: bool = False,
    ) -> float:
        """An int or float (not a boolean, not NaN/infinite) as a float."""
        value = self.raw(key)
        if value is MISSING:
            return default
        path = self.path_of(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.issues.add(path, f"must be a number, got {type_name(value)}")
            return default
        number = float(value)
        if not math.isfinite(number):
            self.issues.add(path, "must be a finite number")
            return default
        if positive and number <= 0:
            self.issues.add(path, "must be > 0")
            return default
        if minimum is not None and number < minimum:
            self.issues.add(path, f"must be >= {minimum:g}")
            return default
        return number

    def section(self, key: str, *, required: bool = False) -> Section | None:
        value = self.require(key) if required else self.raw(key)
        if value is MISSING:
            return None
        return as_section(self.issues, self.path_of(key), value)

    def items(self, key: str, *, required: bool = False) -> list[tuple[str, object]] | None:
        """The elements of a list at ``key`` with their paths; ``None`` when absent or bad."""
        value = self.require(key) if required else self.raw(key)
        if value is MISSING:
            return None
        return as_list(self.issues, self.path_of(key), value)

    def string_list(
        self, key: str, *, scalars: bool = False, unique: bool = False
    ) -> tuple[str, ...]:
        """
        A list of strings. With ``scalars``, numbers and booleans are accepted as their text
        (for argument lists). With ``unique``, repeated entries are issues.
        """
        items = self.items(key)
        if items is None:
            return ()
        result: list[str] = []
        for path, item in items:
            text = scalar_text(item) if scalars else (item if isinstance(item, str) else None)
            if text is None:
                self.issues.add(path, f"must be a string, got {type_name(item)}")
                continue
            if unique and text in result:
                self.issues.add(path, f"duplicate entry {text!r}")
                continue
            result.append(text)
        return tuple(result)

    def string_map(self, key: str) -> list[tuple[str, str, str]]:
        """
        A mapping of non-empty string keys to scalar values (kept as text), as
        ``[(entry path, key, text)]`` in document order.
        """
        section = self.section(key)
        if section is None:
            return []
        result: list[tuple[str, str, str]] = []
        for name, item in section.data.items():
            path = section.path_of(name)
            if not name.strip():
                self.issues.add(path, "keys must not be empty")
                continue
            text = scalar_text(item)
            if text is None:
                # Never echo the value: it may be a secret.
                self.issues.add(path, f"must be a string, got {type_name(item)}")
                continue
            result.append((path, name, text))
        return result


def check_integer(
    issues: Issues, path: str, value: object, minimum: int | None, maximum: int | None
) -> int | None:
    """``value`` as an int within bounds, or ``None`` after recording an issue."""
    if isinstance(value, bool) or not isinstance(value, int):
        issues.add(path, f"must be an integer, got {type_name(value)}")
        return None
    if minimum is not None and value < minimum:
        issues.add(path, f"must be >= {minimum}")
        return None
    if maximum is not None and value > maximum:
        issues.add(path, f"must be <= {maximum}")
        return None
    return value


# ---------------------------------------------------------------------------------------------
# YAML files


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects duplicate keys (which plain YAML loading silently drops)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _at(mark: yaml.Mark | None) -> str:
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def read_yaml_file(path: str) -> object:
    """
    The YAML document in ``path``, loaded safely. Raises :class:`ConfigError` (with ``path``
    as the issue path) if the file cannot be read or is not valid YAML. Messages give the
    position and the parser's problem, never the offending text.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(
            [ConfigIssue(path, f"cannot read config file: {e.strerror or e}")], path
        ) from None
    try:
        return yaml.load(raw, Loader=_StrictLoader)
    except yaml.reader.ReaderError as e:
        message = f"is not valid UTF-8 text (byte offset {e.position})"
    except yaml.MarkedYAMLError as e:
        message = f"invalid YAML{_at(e.problem_mark)}: {e.problem}"
        if e.context:
            message += f" ({e.context}{_at(e.context_mark)})"
    except yaml.YAMLError as e:
        message = f"invalid YAML: {type(e).__name__}"
    raise ConfigError([ConfigIssue(path, message)], path)
