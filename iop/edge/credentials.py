# -*- test-case-name: iop.test.edge.test_credentials -*-
"""
Managed mode's credential leases, on the Edge: provider keys stay here; a node gets, per tunnel
request, only a lease sealed to it.

:class:`CredentialIssuer` holds the ``credentials[]`` catalog, the lease-signing key and each
managed node's recipient public key (all loaded at startup: :meth:`CredentialIssuer.from_config`
fails, naming the file, when one is missing or of the wrong kind). For one tunnel:

1. :meth:`~CredentialIssuer.bind` builds the exact :class:`CredentialBinding` of the placement
   — principal (the client key's name), slot, route, profile, target, node recipient,
   credential revision, route revision, projection generation, and the adapter instance and
   upstream origin that will receive the key (from the adapter config this Edge pushes to the
   node: its name and :func:`~iop.security.lease.upstream_origin` of its ``base_url``) — and
   validates it: the slot exists and is enabled, the node has a recipient key, the adapter is
   configured on the node with an http(s) ``base_url``. Refused: :class:`CredentialRefused`.
2. :meth:`~CredentialIssuer.seal`, called by the tunnel dispatcher immediately before the request
   is sent, validates the binding again against the current catalog (a slot disabled or a
   revision changed since step 1 fails closed) and issues the lease
   (:func:`iop.security.lease.issue_lease`: signed, sealed to that node with the binding as HPKE
   ``info``, valid ``security.lease_ttl_sec``).

A provider without a ``credential`` slot still gets a lease in managed mode, with an empty
secret: a managed node accepts no tunnel the Edge did not sign for that exact request, and adds
no header. There is no fallback: a refused binding ends the request; the Edge never tries
another provider, route or credential for it.

The binding's ``route`` is ``<model>:<node>/<provider>`` (``/<adapter>`` for a direct route);
``route_revision`` and ``projection_generation`` are the issuer's :attr:`generation` (the
config generation: 1 until a refresh applies a new config).

At registration (:meth:`~CredentialIssuer.lease_support_problem`) the issuer says whether a
node's announced lease keys are the ones it seals to and signs with: a node that could not
open or verify its leases is refused before it is ready, rather than failing every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.internet.interfaces import IReactorTime

from iop.config.model import AdapterConfig, CredentialSlot, EdgeConfig, ProviderConfig
from iop.edge.errors import CredentialRefused
from iop.edge.placement import Placement
from iop.security.keys import (
    IssuerSigningKey,
    KeyFileError,
    RecipientPublicKey,
    load_issuer_private,
    load_recipient_public,
)
from iop.security.lease import issue_lease, upstream_origin
from iop.wire import runtime_pb2 as pb

__all__ = ["CredentialIssuer", "Sealed"]

# What the tunnel dispatcher puts on a request: the binding and the serialized lease.
Sealed = tuple[pb.CredentialBinding, bytes]


class CredentialIssuer:
    """Binds and seals credential leases for tunnel requests (see the module docstring)."""

    def __init__(
        self,
        config: EdgeConfig,
        signing_key: IssuerSigningKey,
        recipients: Mapping[str, RecipientPublicKey],
        clock: IReactorTime,
        generation: int = 1,
    ) -> None:
        self._signing_key = signing_key
        self._recipients = dict(recipients)
        self._clock = clock
        self.update(config, generation)

    def update(self, config: EdgeConfig, generation: int) -> None:
        """
        Take a new config's catalog (slots, revisions, provider slots, lease TTL) as config
        ``generation``: a binding made before no longer seals (it is stale).
        """
        # Everything is computed before anything is assigned: the switch is all or nothing.
        slots: dict[str, CredentialSlot] = {s.name: s for s in config.credentials}
        providers: dict[str, ProviderConfig] = {p.id: p for n in config.nodes for p in n.providers}
        adapters: dict[tuple[str, str], AdapterConfig] = {
            (n.id, a.name): a for n in config.nodes for a in n.adapters
        }
        ttl = config.security.lease_ttl_sec
        self._slots, self._providers, self._adapters, self._ttl = slots, providers, adapters, ttl
        self.generation = generation

    @classmethod
    def from_config(cls, config: EdgeConfig, clock: IReactorTime) -> CredentialIssuer | None:
        """
        The issuer for a managed Edge (None in legacy mode). Loads every key file; raises
        :class:`~iop.security.keys.KeyFileError` naming the one missing or of the wrong kind.
        """
        security = config.security
        if not security.managed:
            return None
        # The config's validation already refuses these; kept as the loader's own guard.
        if security.signing_key_file is None:
            raise KeyFileError("security.lease.signing_key_file: managed mode needs it")
        recipients: dict[str, RecipientPublicKey] = {}
        for node in config.nodes:
            if node.recipient_key_file is None:
                raise KeyFileError(
                    f"nodes[{node.id}].recipient_key_file: managed mode needs every node's key"
                )
            recipients[node.id] = load_recipient_public(node.recipient_key_file)
        return cls(config, load_issuer_private(security.signing_key_file), recipients, clock)

    @property
    def issuer_key_id(self) -> str:
        return self._signing_key.key_id

    def lease_support_for(self, node_id: str) -> pb.LeaseSupport | None:
        """What ``node_id`` must announce at registration (None: no recipient key for it)."""
        recipient = self._recipients.get(node_id)
        if recipient is None:
            return None
        return pb.LeaseSupport(
            recipient_key_id=recipient.key_id, kem=recipient.kem, issuer_key_id=self.issuer_key_id
        )

    def lease_support_problem(self, node_id: str, support: pb.LeaseSupport) -> str:
        """
        Why ``node_id``, announcing ``support`` at registration, could not open or verify the
        leases this Edge issues it ("" when it can): another recipient key or KEM than the one
        this Edge seals to, or trust in another issuer key. Names public key ids only.
        """
        expected = self.lease_support_for(node_id)
        if expected is None:
            return f"this edge has no lease recipient key for node {node_id!r}"
        if (support.recipient_key_id, support.kem) != (expected.recipient_key_id, expected.kem):
            return (
                f"the node opens leases with {support.kem[:32]!r} recipient key"
                f" {support.recipient_key_id[:64]!r}, but this edge seals them to"
                f" {expected.kem!r} key {expected.recipient_key_id!r}"
                f" (nodes[{node_id}].recipient_key_file)"
            )
        if support.issuer_key_id != expected.issuer_key_id:
            return (
                f"the node trusts issuer key {support.issuer_key_id[:64]!r}, but this edge signs"
                f" leases with {expected.issuer_key_id!r} (security.lease.signing_key_file)"
            )
        return ""

    def sealer(self, placement: Placement) -> Callable[[], Sealed]:
        """Bind ``placement`` now (validated); the result seals it when called, just before
        the request is sent."""
        binding = self.bind(placement)
        return lambda: self.seal(placement, binding)

    def bind(self, placement: Placement) -> pb.CredentialBinding:
        """The exact binding for ``placement``, validated (first time, before the lease)."""
        slot = self._slot_for(placement)
        if placement.node_id not in self._recipients:
            raise CredentialRefused(f"node {placement.node_id!r} has no lease recipient key")
        adapter = self._adapters.get((placement.node_id, placement.adapter))
        if adapter is None:
            raise CredentialRefused(
                f"adapter {placement.adapter!r} is not configured on node {placement.node_id!r}"
            )
        try:
            origin = upstream_origin(adapter.base_url)
        except ValueError:
            raise CredentialRefused(
                f"adapter {adapter.name!r} on node {placement.node_id!r} has no http(s)"
                " base_url to bind a credential lease to"
            ) from None
        where = placement.provider_id or placement.adapter
        return pb.CredentialBinding(
            principal=placement.principal,
            slot=slot.name if slot is not None else "",
            route=f"{placement.model}:{placement.node_id}/{where}",
            profile=placement.profile.name if placement.profile is not None else "",
            target=placement.target,
            node_recipient=placement.node_id,
            credential_revision=slot.revision if slot is not None else 0,
            route_revision=self.generation,
            projection_generation=self.generation,
            adapter=adapter.name,
            upstream_origin=origin,
        )

    def seal(self, placement: Placement, binding: pb.CredentialBinding) -> Sealed:
        """
        Validate ``binding`` again, against the catalog as it is now, and issue its lease:
        ``(binding, lease bytes)``. Called immediately before the request is sent.
        """
        current = self.bind(placement)
        if current != binding:
            raise CredentialRefused(
                "the credential binding went stale before the request was sent "
                "(revision or configuration changed)"
            )
        slot = self._slot_for(placement)
        secret = slot.secret.reveal().encode() if slot is not None else b""
        lease = issue_lease(
            binding=binding,
            secret=secret,
            recipient=self._recipients[placement.node_id],
            issuer=self._signing_key,
            now=self._clock.seconds(),
            ttl_sec=self._ttl,
        )
        return binding, lease

    def _slot_for(self, placement: Placement) -> CredentialSlot | None:
        provider = self._providers.get(placement.provider_id or "")
        name = provider.credential if provider is not None else ""
        if not name:
            return None
        slot = self._slots.get(name)
        if slot is None:
            raise CredentialRefused(f"credential slot {name!r} is not configured")
        if not slot.enabled:
            raise CredentialRefused(f"credential slot {name!r} is disabled")
        return slot
