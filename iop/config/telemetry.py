# -*- test-case-name: iop.test.config.test_telemetry_section -*-
"""
The ``telemetry:`` section, the same in edge.yaml and node.yaml: where the daemon exports its
traces (OTLP over HTTP), with what credentials, how many it samples.

::

    telemetry:
      endpoint: http://otel-collector:4318          # /v1/traces is appended to a bare base
      headers:                                      # each value: text, ${ENV} references in it
        authorization: "Bearer ${OTLP_TOKEN}"
      headers_file: /etc/iop/otlp-headers           # or: one "Name: value" per line
      sampling_ratio: 0.1                           # new traces; a client's sampled one is kept
      service_name: iop-edge                        # default: iop-edge / iop-node
      capture_content: false                        # GenAI message contents: never by default

Without the section nothing is built: no provider, no exporter, no thread
(:mod:`iop.telemetry`). Header values are credentials more often than not: they become
:class:`~iop.config.model.Secret` s, and an issue names the header's path, the variable or the
file, never a value. A header may be set once, in ``headers`` or in the file.

Classification for a config refresh: restart required. The provider, its exporter thread and
its queue are built once, when the daemon starts (as ``logging:``); swapping them live would
mean two exporters and a queue handed over mid-flight for a setting operators change rarely.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_TELEMETRY_EXPORT_TIMEOUT_SEC,
    DEFAULT_TELEMETRY_QUEUE_SIZE,
    DEFAULT_TELEMETRY_SAMPLING_RATIO,
    DEFAULT_TELEMETRY_SHUTDOWN_TIMEOUT_SEC,
    Secret,
    TelemetryConfig,
)
from iop.config.secrets import absolute_path, read_token_file, resolve_references

__all__ = ["TRACES_PATH", "telemetry_section"]

TRACES_PATH = "/v1/traces"
# An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# What may not appear in a header value: control characters but HTAB.
_HEADER_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_QUEUE_SIZE = 1_000_000


def telemetry_section(
    top: Section, *, base_dir: str, environ: Mapping[str, str]
) -> TelemetryConfig | None:
    """``top.telemetry`` as a :class:`TelemetryConfig`; None when absent (no telemetry)."""
    section = top.section("telemetry")
    if section is None:
        return None
    endpoint = _endpoint(section)
    headers: dict[str, tuple[str, Secret]] = {}
    for path, name, text in section.string_map("headers"):
        value = resolve_references(section.issues, path, text, environ)
        _add_header(section, headers, path, name, value)
    headers_file = section.string("headers_file", nonempty=True)
    if headers_file.strip():
        _read_headers_file(section, headers, absolute_path(base_dir, headers_file))
    ratio = section.number("sampling_ratio", DEFAULT_TELEMETRY_SAMPLING_RATIO, minimum=0)
    if ratio > 1:
        section.issues.add(section.path_of("sampling_ratio"), "must be between 0 and 1")
        ratio = DEFAULT_TELEMETRY_SAMPLING_RATIO
    service_name = section.string("service_name", nonempty=True).strip()
    capture = section.boolean("capture_content", False)
    queue_size = section.integer(
        "queue_size", DEFAULT_TELEMETRY_QUEUE_SIZE, minimum=1, maximum=_MAX_QUEUE_SIZE
    )
    export_timeout = section.number(
        "export_timeout_sec", DEFAULT_TELEMETRY_EXPORT_TIMEOUT_SEC, positive=True
    )
    shutdown_timeout = section.number(
        "shutdown_timeout_sec", DEFAULT_TELEMETRY_SHUTDOWN_TIMEOUT_SEC, minimum=0
    )
    section.finish()
    return TelemetryConfig(
        endpoint=endpoint,
        headers=tuple(headers.values()),
        sampling_ratio=ratio,
        service_name=service_name,
        capture_content=capture,
        queue_size=queue_size,
        export_timeout_sec=export_timeout,
        shutdown_timeout_sec=shutdown_timeout,
    )


def _endpoint(section: Section) -> str:
    """``endpoint``: an http(s) URL; a URL without a path gets :data:`TRACES_PATH`."""
    text = section.string("endpoint", required=True).strip()
    if not text:
        return ""
    path = section.path_of("endpoint")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        section.issues.add(path, "must be an http:// or https:// URL (the OTLP/HTTP receiver)")
        return ""
    if parts.username is not None or parts.password is not None or parts.query:
        # Credentials belong in headers (which are never logged); a URL is logged.
        section.issues.add(
            path, "must not carry credentials or a query; put credentials in telemetry.headers"
        )
        return ""
    del port
    if parts.path in ("", "/"):
        parts = parts._replace(path=TRACES_PATH)
    return urlunsplit(parts)


def _add_header(
    section: Section, headers: dict[str, tuple[str, Secret]], path: str, name: str, value: str
) -> None:
    if not _HEADER_NAME.match(name):
        section.issues.add(path, "is not a valid HTTP header name")
        return
    if _HEADER_UNSAFE.search(value):
        section.issues.add(path, "the value contains a line break or another control character")
        return
    key = name.lower()
    if key in headers:
        section.issues.add(path, f"header {name!r} is set twice (headers and headers_file)")
        return
    headers[key] = (name, Secret(value.strip()))


def _read_headers_file(
    section: Section, headers: dict[str, tuple[str, Secret]], filename: str
) -> None:
    """``Name: value`` lines (blank lines and ``#`` comments skipped); issues name the line."""
    path = section.path_of("headers_file")
    text = read_token_file(section.issues, path, filename, "headers")
    if text is None:
        return
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, colon, value = stripped.partition(":")
        where = f"{path} ({filename}, line {number})"
        if not colon or not name.strip():
            # The line is not shown: it may be a bare credential.
            section.issues.add(where, "must be a 'Name: value' line")
            continue
        _add_header(section, headers, where, name.strip(), value)
