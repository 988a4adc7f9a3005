# -*- test-case-name: iop.test.node.test_tunnel_lease,iop.test.node.test_tunnel_echo -*-
"""
A provider tunnel's credential lease (managed mode): the checks on the lease a tunnel request
carries, and the credential header it puts on that one upstream request.

- At admission (:func:`check_lease_presence`): a managed node (one with a
  :class:`~iop.security.lease.LeaseVerifier`) needs ``credential_lease`` and
  ``credential_binding`` on every tunnel (else ``lease_missing`` / ``lease_malformed``), and an
  adapter whose profile names the ``auth_header`` a leased credential goes in. A legacy node
  (no verifier) refuses any request carrying a lease: it cannot verify one, and fails closed.
- Immediately before the provider call (:func:`open_lease`): the binding is checked against
  the request itself (its ``target`` and ``profile``) and against the adapter instance that
  would receive it (its configured profile, its name, and the origin of its ``base_url``: a
  lease minted for another adapter or upstream on this node is refused,
  ``lease_binding_mismatch``), then the lease is verified and opened.
- :func:`with_credential` puts ``<auth_header>: <auth_scheme> <secret>`` on the request's
  headers; the caller zeroes the plaintext ``bytearray`` once the request is handed to the HTTP
  client, and removes the secret's echoes from the response
  (:class:`~iop.security.echo.EchoRedactor`, in :mod:`iop.node.tunnel.exchange`).
"""

from __future__ import annotations

from twisted.web.http_headers import Headers

from iop.node.adapters.registry import AdapterInstance
from iop.node.admission import Refusal
from iop.runtime.codes import ErrorCode
from iop.runtime.interfaces import ITunnelProvider
from iop.runtime.spec import RuntimeProfile
from iop.security.lease import (
    LEASE_BINDING_MISMATCH,
    LEASE_MALFORMED,
    LEASE_MISSING,
    LeaseError,
    LeaseVerifier,
    upstream_origin,
)
from iop.wire import runtime_pb2 as pb

__all__ = ["check_lease_presence", "open_lease", "with_credential"]


def check_lease_presence(
    leases: LeaseVerifier | None,
    request: pb.ProviderTunnelRequest,
    instance: AdapterInstance,
    provider: ITunnelProvider,
) -> None:
    """
    At admission: the lease ``request`` carries (or not) is one this node can take, or
    :class:`Refusal`. ``leases`` None: a legacy node, which refuses any lease.
    """
    has_lease = bool(request.credential_lease)
    has_binding = request.HasField("credential_binding")
    if leases is None:
        if has_lease or has_binding:
            # Fail closed: this node cannot verify a managed credential lease.
            raise Refusal("managed credential leases are not supported by this node")
        return
    if not has_lease:
        raise Refusal(
            f"{LEASE_MISSING}: this node runs in managed mode and every provider tunnel"
            " needs a credential lease",
            code=ErrorCode.LEASE_MISSING,
            adapter=instance.name,
        )
    if not has_binding:
        raise Refusal(
            f"{LEASE_MALFORMED}: a credential lease without its credential_binding",
            code=ErrorCode.LEASE_MALFORMED,
            adapter=instance.name,
        )
    profile = provider.profile
    needs_header = bool(request.credential_binding.slot)
    if needs_header and (profile is None or not profile.auth_header.strip()):
        raise Refusal(
            f"adapter {instance.name!r} has no protocol profile naming an auth_header:"
            " a leased credential has no header to go in",
            adapter=instance.name,
        )


def open_lease(
    leases: LeaseVerifier,
    request: pb.ProviderTunnelRequest,
    instance: AdapterInstance,
    provider: ITunnelProvider,
    now: float,
) -> bytearray:
    """
    The binding against the request itself and against the adapter that would receive it
    (its instance name, and the origin of the URL the credential would go to), then the
    lease opened: the secret (zero it), or :class:`LeaseError`.
    """
    binding = request.credential_binding
    profile = provider.profile
    try:
        origin = upstream_origin(provider.base_url)
    except ValueError:
        origin = ""  # matches no lease: the Edge binds only an http(s) origin
    mismatched = [
        name
        for name, same in (
            ("target", binding.target == request.target),
            ("profile", binding.profile == request.profile),
            ("adapter profile", binding.profile == (profile.name if profile else "")),
            ("adapter", binding.adapter == instance.name),
            ("upstream origin", bool(origin) and binding.upstream_origin == origin),
        )
        if not same
    ]
    if mismatched:
        raise LeaseError(
            LEASE_BINDING_MISMATCH,
            f"the credential binding does not match the request's {', '.join(mismatched)}",
        )
    return leases.open(request.credential_lease, binding, now)


def _valid_header_value(value: bytearray) -> bool:
    """Visible characters and spaces only (no CR, LF, NUL or other controls)."""
    return bool(value) and all(b >= 0x20 and b != 0x7F for b in value) and value.strip() == value


def with_credential(
    headers: Headers, profile: RuntimeProfile | None, slot: str, secret: bytearray
) -> Headers:
    """
    A copy of ``headers`` with ``<auth_header>: <auth_scheme> <secret>`` (the bare secret
    without a scheme), replacing any value of that header. The header's value is necessarily an
    immutable copy, held by the request until it is written; ``secret`` itself is zeroed by the
    caller. A lease bound to no credential ``slot`` (a provider that takes none) authorizes the
    request and carries an empty secret: ``headers`` go as they are.
    """
    if not slot:
        if secret:
            raise LeaseError(LEASE_MALFORMED, "a lease bound to no credential carries a secret")
        return headers
    assert profile is not None and profile.auth_header  # checked at admission
    if not _valid_header_value(secret):
        raise LeaseError(LEASE_MALFORMED, "the leased credential is not a valid header value")
    scheme = profile.auth_scheme.strip()
    value = (scheme.encode("latin-1") + b" " if scheme else b"") + bytes(secret)
    out = headers.copy()
    out.setRawHeaders(profile.auth_header.strip().encode("latin-1"), [value])
    return out
