"""
Security plumbing: TLS contexts for the Edge listener and the Node dialler, and workload
identity checks (DNS-ID names verified with ``service_identity``).

See :mod:`iop.security.tls`.
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
