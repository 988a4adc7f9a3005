# -*- test-case-name: iop.test.config.test_security -*-
"""
``security:`` in edge.yaml: the mode (``legacy`` or ``managed``), the trust domain node
certificates are named in, and the lease-signing key managed mode requires.

Read before the sections that depend on it: the mode decides what the rest of the file must
hold (see :mod:`iop.config.edge.links`). The key file is only checked to exist and be readable
here; the Edge parses it when it starts.
"""

from __future__ import annotations

from iop.config.checks import dns_name_problem, optional_file
from iop.config.edge.known import Security
from iop.config.errors import Section
from iop.config.model import (
    DEFAULT_LEASE_TTL_SEC,
    DEFAULT_TRUST_DOMAIN,
    MAX_LEASE_TTL_SEC,
    SECURITY_MODES,
    EdgeSecurity,
)

__all__ = ["security_section"]

_MANAGED = "security.mode: managed"


def security_section(top: Section, *, base_dir: str) -> Security:
    """``top.security`` (legacy mode when absent), and whether its mode and domain were read."""
    issues = top.issues
    before = len(issues)
    section = top.section("security")
    if section is None:
        return Security(mode_known=len(issues) == before)
    mode_known = True
    mode = section.choice("mode", SECURITY_MODES, "legacy")
    if mode not in SECURITY_MODES or len(issues) > before:
        mode_known = False
    before = len(issues)
    trust_domain = section.string("trust_domain", DEFAULT_TRUST_DOMAIN)
    problem = dns_name_problem(trust_domain) if len(issues) == before else None
    if problem is not None:
        issues.add(section.path_of("trust_domain"), problem)
    trust_domain_ok = len(issues) == before
    managed = mode == "managed"
    lease = section.section("lease")
    signing_key_file: str | None = None
    ttl = DEFAULT_LEASE_TTL_SEC
    if lease is not None:
        signing_key_file = optional_file(lease, "signing_key_file", base_dir)
        ttl = lease.number("ttl_sec", DEFAULT_LEASE_TTL_SEC, positive=True)
        if ttl > MAX_LEASE_TTL_SEC:
            issues.add(lease.path_of("ttl_sec"), f"must be <= {MAX_LEASE_TTL_SEC:g}")
            ttl = DEFAULT_LEASE_TTL_SEC
        lease.finish()
    given = lease is not None and lease.has("signing_key_file")
    if managed and signing_key_file is None and not given:
        issues.add(
            "security.lease.signing_key_file",
            f"is required with {_MANAGED}: the Edge signs every credential lease with "
            "this private key (create it with `iop keys issuer`)",
        )
    section.finish()
    config = EdgeSecurity(
        mode=mode,
        trust_domain=trust_domain,
        signing_key_file=signing_key_file,
        lease_ttl_sec=ttl,
    )
    return Security(config, mode_known=mode_known, trust_domain_ok=trust_domain_ok)
