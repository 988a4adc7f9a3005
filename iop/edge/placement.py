# -*- test-case-name: iop.test.edge.test_gateway -*-
"""
What the Edge chose for one client request: :class:`Placement`, frozen.

The gateway builds it once, at placement, with everything it will ever hold: the model, where
it runs (node, adapter, served target, provider), the wire the provider needs, the protocol
profile, the usage attribution, the capacity lease and the principal (the client key's name)
the request was placed for. Nothing mutates it afterwards: how the work ended and what it used
reach the request's record through the source that carried the work
(:mod:`iop.edge.ingress.sources`), never through the placement.

Its own module so that the gateway, the credential issuer (which binds a lease to it) and the
client surfaces all import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iop.config.model import ModelConfig, ProfileConfig
from iop.edge.pool import Lease
from iop.runtime.kinds import wire_of

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """What the Edge chose for one request. Edge-local: none of it goes on the wire as such."""

    model: str
    node_id: str
    adapter: str
    target: str
    provider_type: str
    provider_id: str | None = None
    profile: ProfileConfig | None = None
    usage_attribution: str = ""
    policy: ModelConfig | None = None
    lease: Lease | None = field(default=None, repr=False, compare=False)
    # Who asked: the client key's name ("" with auth off); bound into managed credential leases.
    principal: str = ""

    @property
    def wire(self) -> str:
        """``tunnel`` or ``run``: the provider kind's wire (:mod:`iop.runtime.kinds`)."""
        return str(wire_of(self.provider_type))

    def release(self) -> None:
        """Give back the capacity lease (idempotent; nothing for direct routes)."""
        if self.lease is not None:
            self.lease.release()
