# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
``protocol_profiles:`` in edge.yaml: what each upstream API speaks — its driver, the request
paths of its operations, its capabilities and extensions, and the header (and scheme) a
credential goes in. Providers name a profile (``nodes[].providers[].profile``).
"""

from __future__ import annotations

from iop.config.checks import HEADER_NAME
from iop.config.edge.known import Profiles
from iop.config.errors import MISSING, Section, as_section
from iop.config.model import ProfileConfig
from iop.runtime.kinds import DRIVER_NAMES

__all__ = ["PROFILE_CAPABILITIES", "PROFILE_EXTENSIONS", "profiles_section"]

PROFILE_CAPABILITIES = frozenset({"chat", "messages", "streaming", "tools", "count_tokens"})
PROFILE_EXTENSIONS = ("reasoning", "thinking")


def profiles_section(top: Section) -> Profiles:
    """Every ``protocol_profiles[]`` entry, and the profiles by name."""
    issues = top.issues
    known = Profiles()
    items = top.items("protocol_profiles")
    if items is None and top.has("protocol_profiles"):
        known.complete = False
    result: list[ProfileConfig] = []
    seen: dict[str, str] = {}
    for path, item in items or ():
        section = as_section(issues, path, item)
        if section is None:
            known.complete = False
            continue
        name = section.string("name", required=True)
        if not name:
            known.complete = False
        if name:
            if name in seen:
                issues.add(
                    section.path_of("name"),
                    f"duplicate profile name {name!r} (also {seen[name]})",
                )
            else:
                seen[name] = path
        driver = section.choice("driver", DRIVER_NAMES, required=True)
        operations: list[tuple[str, str]] = []
        for op_path, op_name, op_value in section.string_map("operations"):
            if not op_value.startswith("/"):
                issues.add(op_path, "must be a request path starting with '/'")
            operations.append((op_name, op_value))
        capabilities = section.string_list("capabilities", unique=True)
        for i, capability in enumerate(capabilities):
            if capability not in PROFILE_CAPABILITIES:
                shown = ", ".join(sorted(PROFILE_CAPABILITIES))
                issues.add(
                    f"{section.path_of('capabilities')}[{i}]",
                    f"unknown capability {capability!r} (one of: {shown})",
                )
        extensions: list[tuple[str, bool]] = []
        ext = section.section("extensions")
        if ext is not None:
            for ext_name in PROFILE_EXTENSIONS:
                extensions.append((ext_name, ext.boolean(ext_name, False)))
            ext.finish()
        auth_header = section.string("auth_header")
        if auth_header and not HEADER_NAME.match(auth_header):
            issues.add(section.path_of("auth_header"), "must be an HTTP header name")
        auth_scheme = _auth_scheme(section, auth_header)
        # The request id to the upstream (unset: by the driver, ProfileConfig.sends_request_id).
        send_request_id: bool | None = None
        if section.raw("send_request_id") is not MISSING:
            send_request_id = section.boolean("send_request_id", True)
        section.finish()
        profile = ProfileConfig(
            name=name,
            driver=driver,
            operations=tuple(operations),
            capabilities=capabilities,
            extensions=tuple(extensions),
            auth_header=auth_header,
            auth_scheme=auth_scheme,
            send_request_id=send_request_id,
        )
        if name and name not in known.by_name:
            known.by_name[name] = (path, profile)
        result.append(profile)
    known.configs = tuple(result)
    return known


def _auth_scheme(section: Section, auth_header: str) -> str:
    """
    ``auth_scheme``: the scheme before the credential in ``auth_header``. Default
    ``Bearer`` for ``Authorization`` (any case), else none (``x-api-key: <secret>``).
    """
    default = "Bearer" if auth_header.strip().lower() == "authorization" else ""
    if not section.has("auth_scheme"):
        section.raw("auth_scheme")
        return default
    scheme = section.string("auth_scheme")
    path = section.path_of("auth_scheme")
    if not auth_header:
        section.issues.add(path, "needs auth_header: the scheme goes in front of the credential")
    elif scheme and not HEADER_NAME.match(scheme):
        # An HTTP auth-scheme is a token (RFC 9110 §11.1), the same characters as a header name.
        section.issues.add(path, "must be an HTTP auth scheme token, e.g. Bearer")
    return scheme
