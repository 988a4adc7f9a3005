# -*- test-case-name: iop.test.config.test_logging_section -*-
"""
The ``logging:`` section, the same in edge.yaml and node.yaml, and the two daemons'
``--log-format`` / ``--log-level`` flags that override it.

``logging.format`` is ``text`` (default: twistd's classic lines) or ``json`` (one object per
line); ``logging.level`` the lowest level written, ``info`` by default (``warning`` is accepted
for ``warn``). Both are read once, when the daemon starts.
"""

from __future__ import annotations

from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_LOG_FORMAT,
    DEFAULT_LOG_LEVEL,
    LOG_FORMATS,
    LOG_LEVELS,
    LoggingConfig,
)

__all__ = ["log_format_flag", "log_level_flag", "logging_section"]

# Spellings of a level that mean one of LOG_LEVELS.
_LEVEL_ALIASES = {"warning": "warn"}


def logging_section(top: Section) -> LoggingConfig:
    """``top.logging`` as a :class:`LoggingConfig` (the defaults when absent)."""
    section = top.section("logging")
    if section is None:
        return LoggingConfig()
    log_format = section.choice("format", LOG_FORMATS, DEFAULT_LOG_FORMAT)
    given = section.data.get("level")
    level = section.string("level", DEFAULT_LOG_LEVEL).lower()
    level = _LEVEL_ALIASES.get(level, level)
    if isinstance(given, str) and level not in LOG_LEVELS:
        shown = ", ".join(repr(name) for name in LOG_LEVELS)
        section.issues.add(section.path_of("level"), f"must be one of {shown}, got {given!r}")
        level = DEFAULT_LOG_LEVEL
    section.finish()
    if log_format not in LOG_FORMATS:
        log_format = DEFAULT_LOG_FORMAT
    return LoggingConfig(format=log_format, level=level)


def log_format_flag(value: str) -> str:
    """``--log-format``'s value checked (a usage.Options coercer: ValueError when bad)."""
    if value not in LOG_FORMATS:
        raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value


def log_level_flag(value: str) -> str:
    """``--log-level``'s value checked and normalized (``warning`` → ``warn``)."""
    level = _LEVEL_ALIASES.get(value.lower(), value.lower())
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level
