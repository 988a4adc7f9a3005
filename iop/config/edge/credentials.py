# -*- test-case-name: iop.test.config.test_security -*-
"""
``credentials:`` in edge.yaml (managed mode only): the catalog of provider credential slots,
each a name, a secret (``${ENV_VAR}`` or a file), a revision and whether it is enabled.
Providers name a slot (``nodes[].providers[].credential``); the Edge seals its secret into the
lease of each request that needs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from iop.config.edge import links
from iop.config.edge.known import Security, Slots
from iop.config.errors import Section, as_section
from iop.config.model import CredentialSlot
from iop.config.secrets import credential_secret

__all__ = ["SLOT_NAME_PATTERN", "credentials_section"]

SLOT_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")


def credentials_section(
    top: Section, *, security: Security, base_dir: str, environ: Mapping[str, str]
) -> Slots:
    """Every ``credentials[]`` slot whose secret resolved, and the slots by name."""
    issues = top.issues
    known = Slots()
    items = top.items("credentials")
    if items is None and top.has("credentials"):
        known.complete = False
    links.credentials_managed(issues, security, bool(items))
    result: list[CredentialSlot] = []
    seen: dict[str, str] = {}
    for path, item in items or ():
        section = as_section(issues, path, item)
        if section is None:
            known.complete = False
            continue
        name = section.string("name", required=True)
        if not name.strip():
            known.complete = False
        elif not SLOT_NAME_PATTERN.match(name):
            issues.add(
                section.path_of("name"),
                "must start with a lowercase letter or digit and hold only lowercase "
                "letters, digits, '.', '_' and '-'",
            )
        elif name in seen:
            issues.add(
                section.path_of("name"),
                f"duplicate credential slot {name!r} (also {seen[name]})",
            )
        else:
            seen[name] = path
        if name:
            known.names.add(name)
        secret = credential_secret(section, base_dir=base_dir, environ=environ)
        revision = section.integer("revision", 1, minimum=1, maximum=2**64 - 1)
        enabled = section.boolean("enabled", True)
        section.finish()
        if secret is not None:
            slot = CredentialSlot(name=name, secret=secret, revision=revision, enabled=enabled)
            known.by_name.setdefault(name, slot)
            result.append(slot)
    known.configs = tuple(result)
    return known
