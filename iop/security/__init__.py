"""
Security plumbing: TLS contexts for the Edge listener and the Node dialler, and workload
identity checks (DNS-ID names verified with ``service_identity``): :mod:`iop.security.tls`.
Managed mode's certificates (:mod:`iop.security.pki`), its lease keys
(:mod:`iop.security.keys`) and the credential leases themselves (:mod:`iop.security.lease`);
credentials kept out of text IOP writes (:mod:`iop.security.redact`).
"""

from iop.security.tls import (
    TLSConfigError,
    WorkloadIdentityError,
    certificate_dns_names,
    client_connection_creator,
    server_context_factory,
    verify_peer_workload,
)

__all__ = [
    "TLSConfigError",
    "WorkloadIdentityError",
    "certificate_dns_names",
    "client_connection_creator",
    "server_context_factory",
    "verify_peer_workload",
]
