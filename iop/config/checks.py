# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_node_config -*-
"""
Checks of single values that several sections of edge.yaml and node.yaml share: Twisted
endpoint strings (and whether they bind loopback), files the config names, ids, DNS names and
HTTP header names.

Each check records its problem in :class:`~iop.config.errors.Issues` under the path it is given;
none of them knows which section it is reading.
"""

from __future__ import annotations

import ipaddress
import os
import re

from iop.config.errors import Issues, Section
from iop.config.secrets import absolute_path

__all__ = [
    "HEADER_NAME",
    "ID_PATTERN",
    "MAX_FRAME_BYTES_LIMIT",
    "check_id",
    "check_tcp_endpoint",
    "dns_name_problem",
    "endpoint_interface",
    "existing_file",
    "is_loopback_host",
    "optional_file",
    "required_file",
    "split_endpoint",
]

# The largest frame either daemon accepts (node_transport.max_frame_bytes, node.yaml's too).
MAX_FRAME_BYTES_LIMIT = 256 * 1024 * 1024

ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+\Z")
# An HTTP header name (RFC 9110 token). An auth-scheme (RFC 9110 §11.1) has the same characters.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# One DNS label (RFC 1123), lowercase: trust domains and managed node ids are DNS names.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_TCP_ARGUMENTS = ("port", "interface", "backlog")


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``::1`` or any 127.0.0.0/8 address."""
    candidate = host.strip().lower()
    if candidate.startswith("[") and candidate.endswith("]"):
        candidate = candidate[1:-1]
    if candidate == "localhost":
        return True
    try:
        return ipaddress.ip_address(candidate).is_loopback
    except ValueError:
        return False


def split_endpoint(description: str) -> tuple[list[str], dict[str, str]]:
    """
    Split a Twisted endpoint string into positional and keyword arguments, with Twisted's
    rules: ``:`` separates arguments, the first ``=`` in one makes it a keyword, and a
    backslash escapes the next character (``interface=\\:\\:1``).
    """
    args: list[str] = []
    kwargs: dict[str, str] = {}
    parts: list[str] = []
    current = ""
    ops = ":="
    chars = iter(description)
    for ch in chars:
        if ch in ops:
            parts.append(current)
            current = ""
            if ch == ":":
                _add_endpoint_part(parts, args, kwargs)
                parts = []
                ops = ":="
            else:
                ops = ":"
        elif ch == "\\":
            current += next(chars, "")
        else:
            current += ch
    parts.append(current)
    _add_endpoint_part(parts, args, kwargs)
    return args, kwargs


def _add_endpoint_part(parts: list[str], args: list[str], kwargs: dict[str, str]) -> None:
    if len(parts) == 1:
        args.append(parts[0])
    else:
        kwargs[parts[0]] = parts[1]


def check_tcp_endpoint(issues: Issues, path: str, description: str) -> str | None:
    """
    Validate a ``tcp:PORT[:interface=ADDR][:backlog=N]`` server endpoint string; return its
    interface (``""`` for all interfaces) or ``None`` if it is invalid.
    """
    if re.search(r"(?<!\\)::", description):
        issues.add(path, "escape the ':' of an IPv6 address with '\\', e.g. interface=\\:\\:1")
        return None
    args, kwargs = split_endpoint(description)
    if args[0] != "tcp":
        issues.add(path, "must be a Twisted server endpoint string starting with 'tcp:'")
        return None
    if len(args) > 1 + len(_TCP_ARGUMENTS):
        issues.add(path, "too many ':'-separated arguments for a tcp endpoint")
        return None
    values = dict(zip(_TCP_ARGUMENTS, args[1:], strict=False))
    ok = True
    for name, value in kwargs.items():
        if name not in _TCP_ARGUMENTS:
            allowed = ", ".join(_TCP_ARGUMENTS)
            issues.add(path, f"unknown tcp endpoint option {name!r} (allowed: {allowed})")
            ok = False
        elif name in values:
            issues.add(path, f"tcp endpoint option {name!r} is given twice")
            ok = False
        else:
            values[name] = value
    port = values.get("port")
    if port is None:
        issues.add(path, "tcp endpoint needs a port, e.g. 'tcp:7443:interface=127.0.0.1'")
        ok = False
    elif not (port.isascii() and port.isdigit() and int(port) <= 65535):
        issues.add(path, "tcp endpoint port must be an integer from 0 to 65535")
        ok = False
    backlog = values.get("backlog")
    if backlog is not None and not (backlog.isascii() and backlog.isdigit() and int(backlog)):
        issues.add(path, "tcp endpoint backlog must be a positive integer")
        ok = False
    return values.get("interface", "") if ok else None


def endpoint_interface(description: str) -> str | None:
    """
    The network interface a (non-``tcp:``) server endpoint string binds: ``unix:`` sockets are
    local (``127.0.0.1`` for the loopback rule), otherwise its ``interface=`` (``""``: all).
    """
    args, kwargs = split_endpoint(description)
    if args[0] == "unix":
        return "127.0.0.1"
    return kwargs.get("interface", "")


def existing_file(issues: Issues, path: str, value: str, base_dir: str) -> str:
    """``value`` resolved against ``base_dir``; an issue unless it is a readable file."""
    resolved = absolute_path(base_dir, value)
    if not os.path.exists(resolved):
        issues.add(path, f"file {resolved} does not exist")
    elif not os.path.isfile(resolved):
        issues.add(path, f"{resolved} is not a regular file")
    elif not os.access(resolved, os.R_OK):
        issues.add(path, f"file {resolved} is not readable")
    return resolved


def required_file(section: Section, key: str, base_dir: str) -> str:
    value = section.string(key, required=True)
    if not value.strip():
        return ""
    return existing_file(section.issues, section.path_of(key), value, base_dir)


def optional_file(section: Section, key: str, base_dir: str) -> str | None:
    if not section.has(key):
        section.raw(key)
        return None
    return required_file(section, key, base_dir) or None


def check_id(issues: Issues, path: str, value: str) -> None:
    if value and not ID_PATTERN.match(value):
        issues.add(path, "must contain only letters, digits, '.', '_' and '-'")


def dns_name_problem(name: str) -> str | None:
    """
    Why ``name`` is not a lowercase DNS name (dot-separated RFC 1123 labels, at most 253
    characters, no trailing dot), or None.
    """
    if not name:
        return "must not be empty"
    if name != name.lower():
        return f"DNS names are compared in lowercase: write {name.lower()!r}"
    if len(name) > 253:
        return "a DNS name is at most 253 characters"
    for label in name.split("."):
        if not _DNS_LABEL.match(label):
            return (
                "must be a DNS name: dot-separated labels of 1-63 lowercase letters, digits "
                "and '-', not starting or ending with '-'"
            )
    return None
