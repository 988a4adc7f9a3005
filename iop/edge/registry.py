# -*- test-case-name: iop.test.edge.test_registry,iop.test.edge.test_registry_identity -*-
"""
Who owns which node id: the authoritative pending → ready → closed lifecycle and the connection
generation fence.

A connection that registers with a known token claims *pending* ownership of its node id and gets
the node's config payload. Only its ``NodeReadyRequest`` makes the node dispatch-ready; only the
current ready owner's disconnect fences the node. Callbacks from any other connection (stale,
superseded, rejected) change nothing. Generations are internal and never leave this module's
callers: they are never on the wire or in config.

Authoritative consumers (the provider pool, the dispatchers, the commander) implement
:class:`~iop.edge.interfaces.INodeLifecycleObserver` and are called synchronously inside the
transition; the event bus only hears about it afterwards.

Workload identity (managed mode, ``security.mode: managed``): after the token names a node and
before anything is claimed, the connection's client certificate must carry exactly that node's
workload DNS-ID (``<node-id>.node.<trust domain>``); otherwise the registration is refused with
``REGISTER_REJECT_WORKLOAD_IDENTITY`` (fatal for the node), ``node.identity_rejected`` is
published and nothing about the node changes. A legacy Edge checks nothing but records what a
client certificate named. Each node's last check is :meth:`NodeRegistry.identity`.

Lease support (managed mode), checked right after the identity: the node must announce the
keys it opens credential leases with (``RegisterRequest.lease_support``), and they must be the
ones this Edge seals to and signs with (the ``lease_check``, the credential issuer's). A legacy
node, or a managed node with other keys, would register, look healthy and then fail every
request; it is refused instead with ``REGISTER_REJECT_LEASE_SUPPORT`` (fatal for the node).

Every refusal that names a node is remembered as that node's last refusal
(:meth:`NodeRegistry.last_refusal`: code, reason, time), which ``/status`` shows; so is when a
ready node went away (:meth:`NodeRegistry.down_since`, forgotten once it is ready again), so
that an operator reads "down since 14:02" rather than only "disconnected".

Ready is ordered here, in :meth:`NodeRegistry.ready` alone: decide, *acknowledge* (the transport
writes ``NodeReadyResponse``), and only then mark the node ready and tell the observers, whose
reaction (the pool pumping its queue) may dispatch to the node at once. So the node always reads
its ready acknowledgement before any request of that generation.

A ready node that stops *drains* (:meth:`NodeRegistry.draining`, from its ``NodeDraining``):
it stays the ready owner — its work in flight runs on and its disconnect fences it as usual —
but the :class:`~iop.edge.interfaces.INodeDrainObserver` (the pool) takes it out of placement,
and :meth:`NodeRegistry.state` says ``draining`` (since :meth:`NodeRegistry.draining_since`)
until the connection goes. Only the current ready owner's drain counts.

Counting (:meth:`NodeRegistry.stats`), per configured node: accepted registrations, the
reconnects among them (a registration after an earlier session of the node ended), and fences
(a ready generation gone: the connection closed, failed its heartbeat or was dropped); and
refused registrations by reason (:data:`REJECT_REASONS`, the reject codes, plus
``ready_rejected`` for a refused ready). Plain ints, read by the metrics at scrape time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from iop.config.model import EdgeConfig, NodeConfig
from iop.edge.events import EventBus, NodeEvent, NodeEventKind
from iop.edge.interfaces import INodeConnection, INodeDrainObserver, INodeLifecycleObserver
from iop.security.tls import (
    WorkloadIdentityError,
    certificate_common_names,
    certificate_dns_names,
    verify_peer_workload,
)
from iop.wire.runtime_pb2 import LeaseSupport, NodeConfigPayload, RegisterRejectCode


class OwnershipState(enum.Enum):
    PENDING = "pending"
    READY = "ready"


@dataclass(frozen=True)
class IdentityCheck:
    """
    A registering connection's client certificate against the workload its node must be.

    ``checked``: the Edge enforced it (managed mode). ``ok``: the certificate named exactly
    ``expected`` (None when not checked). ``presented``: the certificate's DNS names (empty
    without a certificate, see ``certificate``). ``reason``: why it was refused (empty when not).
    Names only: never key material.
    """

    checked: bool
    ok: bool | None
    expected: str
    presented: tuple[str, ...] = ()
    certificate: bool = False
    reason: str = ""

    def as_status(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "ok": self.ok,
            "expected": self.expected,
            "presented": list(self.presented),
            "certificate": self.certificate,
            "reason": self.reason,
        }


def check_identity(
    expected: str, certificate: x509.Certificate | None, *, enforce: bool
) -> IdentityCheck:
    """
    What ``certificate`` (None: none presented) says about workload ``expected``
    (``<node-id>.node.<trust domain>``); with ``enforce`` (managed mode) a refusal carries a
    reason that names both sides.

    Exactly that workload: the name must be a DNS subjectAltName, matched without wildcards, and
    the certificate must not also name another node's workload (or a wildcard over them), or
    one certificate could stand for several nodes. Other names (a host name) do not matter.
    """
    if certificate is None:
        if not enforce:
            return IdentityCheck(False, None, expected)
        return IdentityCheck(
            True,
            False,
            expected,
            reason=(
                f"no client certificate: managed mode requires one naming workload {expected!r}"
            ),
        )
    presented = tuple(certificate_dns_names(certificate))
    if not enforce:
        return IdentityCheck(False, None, expected, presented, certificate=True)
    try:
        verify_peer_workload(certificate, expected)
    except WorkloadIdentityError as e:
        return IdentityCheck(
            True,
            False,
            expected,
            presented,
            certificate=True,
            reason=_refusal(expected, presented, certificate, e),
        )
    others = _other_workloads(expected, presented)
    if others:
        names = ", ".join(repr(n) for n in others)
        return IdentityCheck(
            True,
            False,
            expected,
            presented,
            certificate=True,
            reason=(
                f"client certificate names workload {expected!r} but also {names}: a node "
                "certificate must name exactly one node workload"
            ),
        )
    return IdentityCheck(True, True, expected, presented, certificate=True)


def _other_workloads(expected: str, presented: tuple[str, ...]) -> list[str]:
    """The names in ``presented`` other than ``expected`` under the same node domain."""
    wanted = expected.rstrip(".").lower()
    domain = "." + wanted.partition(".")[2]  # ".node.<trust domain>"
    return [
        name
        for name in presented
        if (n := name.rstrip(".").lower()) != wanted and n.endswith(domain)
    ]


def _refusal(
    expected: str,
    presented: tuple[str, ...],
    certificate: x509.Certificate,
    error: WorkloadIdentityError,
) -> str:
    head = f"client certificate does not name this node's workload {expected!r}"
    if presented:
        names = ", ".join(repr(n) for n in presented)
        carried = f"it carries DNS name(s) {names}"
        if "wildcard" in str(error):
            carried += " (a wildcard name does not stand for one workload)"
        return f"{head}: {carried}"
    common = certificate_common_names(certificate)
    if common:
        cns = ", ".join(repr(n) for n in common)
        return (
            f"{head}: it carries no DNS subjectAltName (subject CN {cns} does not count: "
            "the workload name must be a DNS subjectAltName)"
        )
    return f"{head}: it carries no DNS subjectAltName"


@dataclass
class Ownership:
    node_id: str
    connection: INodeConnection
    generation: int
    state: OwnershipState
    identity: IdentityCheck | None = None
    # When the node said it drains (clock seconds); None while it serves.
    draining_since: float | None = None


@dataclass(frozen=True)
class RegisterAccepted:
    node_id: str
    payload: NodeConfigPayload


@dataclass(frozen=True)
class RegisterRejected:
    code: int
    reason: str
    node_id: str = ""


RegisterOutcome = RegisterAccepted | RegisterRejected

# The bounded reason vocabulary of refusals: each reject code's name, plus a refused ready.
_REJECT_NAMES = {
    RegisterRejectCode.REGISTER_REJECT_UNKNOWN_TOKEN: "unknown_token",
    RegisterRejectCode.REGISTER_REJECT_DUPLICATE_CONNECTION: "duplicate_connection",
    RegisterRejectCode.REGISTER_REJECT_CONFIG_PAYLOAD: "config_payload",
    RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY: "workload_identity",
    RegisterRejectCode.REGISTER_REJECT_LEASE_SUPPORT: "lease_support",
    RegisterRejectCode.REGISTER_REJECT_OTHER: "other",
}
READY_REJECTED = "ready_rejected"
REJECT_REASONS = (*_REJECT_NAMES.values(), READY_REJECTED)


@dataclass(frozen=True)
class RegistryStats:
    """
    The registry's counters at one moment (:meth:`NodeRegistry.stats`): per node id
    ``registrations``, ``reconnects`` and ``fences`` (every configured node present), and
    ``rejections`` per reason of :data:`REJECT_REASONS` (every reason present).
    """

    registrations: dict[str, int]
    reconnects: dict[str, int]
    fences: dict[str, int]
    rejections: dict[str, int]


@dataclass(frozen=True)
class ReadyOutcome:
    ready: bool
    reason: str = ""


@dataclass(frozen=True)
class RegistrationRefusal:
    """A node's refused registration: the reason's name (:data:`REJECT_REASONS`), why, when."""

    code: str
    reason: str
    at: float

    def as_status(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason, "at_unix_ms": int(self.at * 1000)}


PayloadBuilder = Callable[[NodeConfig], NodeConfigPayload]
# Managed mode: why a node announcing these lease keys could not open or verify this Edge's
# leases ("" when it can).
LeaseCheck = Callable[[str, LeaseSupport], str]

NO_LEASE_SUPPORT = (
    "the node announced no credential lease support (it runs in legacy security.mode, or"
    " predates lease announcements): this edge runs in managed mode and a node that cannot"
    " verify its credential leases would fail every request; set security.mode: managed with"
    " recipient_key_file and issuer_key_file in the node's node.yaml"
)
# Writes the node's NodeReadyResponse for an outcome; called before any observer hears of ready.
Acknowledge = Callable[[ReadyOutcome], None]


def _no_acknowledgement(outcome: ReadyOutcome) -> None:
    """For callers with no wire to answer on (unit tests driving the registry directly)."""


class NodeRegistry:
    log = Logger()

    def __init__(
        self,
        config: EdgeConfig,
        build_payload: PayloadBuilder,
        bus: EventBus,
        clock: IReactorTime,
        observers: Iterable[INodeLifecycleObserver] = (),
        lease_check: LeaseCheck | None = None,
    ) -> None:
        self._config = config
        self._lease_check = lease_check
        self._build_payload = build_payload
        self._bus = bus
        self._clock = clock
        self._observers = list(observers)
        self._owners: dict[str, Ownership] = {}
        self._by_connection: dict[int, Ownership] = {}
        self._generation = 0
        # Per node id: the identity check of its last accepted or identity-refused registration,
        # and how many registrations its identity check refused.
        self._last_identity: dict[str, IdentityCheck] = {}
        self._identity_refusals: dict[str, int] = {}
        self._last_refusal: dict[str, RegistrationRefusal] = {}
        # Per node id: when its last ready connection went away (cleared when it is ready again).
        self._down_since: dict[str, float] = {}
        self._registrations: dict[str, int] = {}
        self._reconnects: dict[str, int] = {}
        self._fences: dict[str, int] = {}
        self._rejections = dict.fromkeys(REJECT_REASONS, 0)

    def add_observer(self, observer: INodeLifecycleObserver) -> None:
        self._observers.append(observer)

    def use_config(self, config: EdgeConfig, build_payload: PayloadBuilder) -> None:
        """
        Config refresh: registrations from now on are looked up in ``config`` and get the
        payload ``build_payload`` makes (the new config's). Ownership, generations and the
        connections already registered are untouched.
        """
        self._config = config
        self._build_payload = build_payload

    @property
    def config(self) -> EdgeConfig:
        """The config registrations are checked against."""
        return self._config

    @property
    def payload_builder(self) -> PayloadBuilder:
        """What builds a registering node's payload."""
        return self._build_payload

    # -- queries -----------------------------------------------------------------------------

    def is_ready(self, node_id: str) -> bool:
        owner = self._owners.get(node_id)
        return owner is not None and owner.state is OwnershipState.READY

    def state(self, node_id: str) -> str:
        """``ready``, ``draining`` (ready, stopping), ``pending`` or ``disconnected``."""
        owner = self._owners.get(node_id)
        if owner is None:
            return "disconnected"
        if owner.draining_since is not None:
            return "draining"
        return owner.state.value

    def draining_since(self, node_id: str) -> float | None:
        """When ``node_id``'s ready connection said it drains (None: not draining)."""
        owner = self._owners.get(node_id)
        return owner.draining_since if owner is not None else None

    def ready_connection(self, node_id: str) -> INodeConnection | None:
        """The dispatch-ready connection of ``node_id``, or None."""
        owner = self._owners.get(node_id)
        if owner is None or owner.state is not OwnershipState.READY:
            return None
        return owner.connection

    def ownership_of(self, connection: INodeConnection) -> Ownership | None:
        return self._by_connection.get(id(connection))

    @property
    def mode(self) -> str:
        """``legacy`` or ``managed`` (``security.mode``)."""
        return self._config.security.mode

    def identity(self, node_id: str) -> dict[str, Any]:
        """
        ``node_id``'s identity check for status: its current connection's, else its last
        refused (or last accepted) registration's, else not yet checked; plus ``refusals``, how
        many registrations the check has refused since the Edge started.
        """
        owner = self._owners.get(node_id)
        check = owner.identity if owner is not None else None
        if check is None:
            check = self._last_identity.get(node_id) or IdentityCheck(
                False, None, self._config.security.node_workload(node_id)
            )
        return {**check.as_status(), "refusals": self._identity_refusals.get(node_id, 0)}

    def last_refusal(self, node_id: str) -> dict[str, Any] | None:
        """``node_id``'s last refused registration for status (None: none since start)."""
        refusal = self._last_refusal.get(node_id)
        return refusal.as_status() if refusal is not None else None

    def down_since(self, node_id: str) -> float | None:
        """When ``node_id``'s last ready connection went away, while it is not ready again
        (None: ready now, or never ready since the Edge started)."""
        if self.is_ready(node_id):
            return None
        return self._down_since.get(node_id)

    def stats(self) -> RegistryStats:
        """The registration, reconnect, fence and refusal counters now."""
        nodes = [n.id for n in self._config.nodes]
        nodes += [n for n in self._registrations if n not in nodes]
        return RegistryStats(
            registrations={n: self._registrations.get(n, 0) for n in nodes},
            reconnects={n: self._reconnects.get(n, 0) for n in nodes},
            fences={n: self._fences.get(n, 0) for n in nodes},
            rejections=dict(self._rejections),
        )

    # -- transitions -------------------------------------------------------------------------

    def register(
        self,
        token: str,
        connection: INodeConnection,
        certificate: x509.Certificate | None = None,
        lease_support: LeaseSupport | None = None,
    ) -> RegisterOutcome:
        """
        A connection presents a token (and, over mTLS, its client ``certificate``, and in
        managed mode the ``lease_support`` it announced): claim pending ownership or say why
        not. In managed mode the certificate must name the token's node before anything else is
        looked at, then the node must be able to verify this Edge's leases.
        """
        if id(connection) in self._by_connection:
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_OTHER,
                "this connection has already registered",
                self._by_connection[id(connection)].node_id,
            )
        node = self._lookup(token)
        if node is None:
            return self._reject(RegisterRejectCode.REGISTER_REJECT_UNKNOWN_TOKEN, "unknown token")
        security = self._config.security
        identity = check_identity(
            security.node_workload(node.id), certificate, enforce=security.managed
        )
        if identity.ok is False:
            return self._refuse_identity(node.id, identity)
        if security.managed:
            problem = self._lease_problem(node.id, lease_support)
            if problem:
                self._last_identity[node.id] = identity  # the identity itself held
                return self._refuse_leases(node.id, problem)
        if node.id in self._owners:
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_DUPLICATE_CONNECTION,
                f"node {node.id} already has a live connection",
                node.id,
            )
        try:
            payload = self._build_payload(node)
        except Exception as e:
            self.log.failure("could not build config payload for node {node_id}", node_id=node.id)
            return self._reject(
                RegisterRejectCode.REGISTER_REJECT_CONFIG_PAYLOAD,
                f"edge could not build config payload: {type(e).__name__}",
                node.id,
            )
        self._generation += 1
        owner = Ownership(node.id, connection, self._generation, OwnershipState.PENDING, identity)
        self._owners[node.id] = owner
        self._by_connection[id(connection)] = owner
        self._last_identity[node.id] = identity
        before = self._registrations.get(node.id, 0)
        self._registrations[node.id] = before + 1
        if before:
            self._reconnects[node.id] = self._reconnects.get(node.id, 0) + 1
        self.log.info(
            "node {node_id} registered (pending)",
            node_id=node.id,
            workload=identity.expected if identity.ok else None,
            presented=list(identity.presented) or None,
        )
        self._publish(NodeEventKind.REGISTERED, node.id)
        return RegisterAccepted(node.id, payload)

    def ready(
        self,
        node_id: str,
        connection: INodeConnection,
        acknowledge: Acknowledge = _no_acknowledgement,
    ) -> ReadyOutcome:
        """
        A connection says it is ready to serve ``node_id``. The one place that orders ready:
        the outcome is decided, ``acknowledge(outcome)`` answers the node, and only then (if it
        is ready and still the owner) do the observers hear of it. An ``acknowledge`` that raises
        leaves the node pending.
        """
        owner = self._owners.get(node_id)
        if owner is None or owner.connection is not connection:
            if id(connection) not in self._by_connection:
                reason = "connection has not registered"
            else:
                reason = f"stale connection: not the current owner of node {node_id}"
            self.log.warn(
                "rejected ready for node {node_id}: {reason}", node_id=node_id, reason=reason
            )
            self._rejections[READY_REJECTED] += 1
            outcome = ReadyOutcome(False, reason)
            acknowledge(outcome)
            return outcome
        outcome = ReadyOutcome(True)
        acknowledge(outcome)
        if owner.state is OwnershipState.READY:
            return outcome
        if self._owners.get(node_id) is not owner:
            # The acknowledgement lost the connection on the spot: nothing became ready.
            return ReadyOutcome(False, "connection closed while acknowledging ready")
        owner.state = OwnershipState.READY
        self._down_since.pop(node_id, None)
        for observer in self._observers:
            observer.node_ready(node_id, owner.generation)
        self.log.info("node {node_id} ready", node_id=node_id)
        self._publish(NodeEventKind.CONNECTED, node_id)
        return outcome

    def draining(self, connection: INodeConnection) -> bool:
        """
        ``connection`` says its node drains. Only the current ready owner's word counts (once):
        the drain observers hear of it; whether it counted.
        """
        owner = self._by_connection.get(id(connection))
        if (
            owner is None
            or self._owners.get(owner.node_id) is not owner
            or owner.state is not OwnershipState.READY
        ):
            return False
        if owner.draining_since is None:
            owner.draining_since = self._clock.seconds()
            for observer in self._observers:
                if INodeDrainObserver.providedBy(observer):
                    observer.node_draining(owner.node_id, owner.generation)
            self.log.info(
                "node {node_id} draining: no new work for it, what runs finishes",
                node_id=owner.node_id,
            )
            self._publish(NodeEventKind.DRAINING, owner.node_id, "the node is stopping")
        return True

    def disconnected(self, connection: INodeConnection, reason: str = "connection closed") -> None:
        """A connection is gone. Only the current owner's loss changes anything."""
        owner = self._by_connection.pop(id(connection), None)
        if owner is None:
            return
        if self._owners.get(owner.node_id) is not owner:
            return
        del self._owners[owner.node_id]
        if owner.state is OwnershipState.READY:
            self._fences[owner.node_id] = self._fences.get(owner.node_id, 0) + 1
            self._down_since[owner.node_id] = self._clock.seconds()
            for observer in self._observers:
                observer.node_fenced(owner.node_id, owner.generation)
            self.log.info(
                "node {node_id} disconnected: {reason}", node_id=owner.node_id, reason=reason
            )
            self._publish(NodeEventKind.DISCONNECTED, owner.node_id, reason)
        else:
            self.log.info(
                "pending node {node_id} went away before ready: {reason}",
                node_id=owner.node_id,
                reason=reason,
            )

    # -- helpers -----------------------------------------------------------------------------

    def _lookup(self, token: str) -> NodeConfig | None:
        """Constant-time over all nodes: every digest is compared, whatever matches."""
        digest = hashlib.sha256(token.encode()).digest()
        found: NodeConfig | None = None
        for node in self._config.nodes:
            if hmac.compare_digest(node.token.sha256, digest) and found is None:
                found = node
        return found

    def _lease_problem(self, node_id: str, support: LeaseSupport | None) -> str:
        if support is None:
            return NO_LEASE_SUPPORT
        if self._lease_check is None:
            return ""
        return self._lease_check(node_id, support)

    def _refused(self, node_id: str, code: int, reason: str) -> None:
        """Remember a refusal of ``node_id`` (none for an unknown token) and count it."""
        name = _REJECT_NAMES.get(code, "other")  # type: ignore[call-overload]
        self._rejections[name] += 1
        if node_id:
            self._last_refusal[node_id] = RegistrationRefusal(name, reason, self._clock.seconds())

    def _refuse_leases(self, node_id: str, reason: str) -> RegisterRejected:
        """The node cannot verify this Edge's leases: refuse; nothing is claimed."""
        code = RegisterRejectCode.REGISTER_REJECT_LEASE_SUPPORT
        self._refused(node_id, code, reason)
        self.log.warn(
            "refused node {node_id} registration: {reason}",
            node_id=node_id,
            reason=reason,
            reject_code="REGISTER_REJECT_LEASE_SUPPORT",
        )
        self._publish(NodeEventKind.REJECTED, node_id, reason)
        return RegisterRejected(code, reason, node_id)

    def _reject(self, code: int, reason: str, node_id: str = "") -> RegisterRejected:
        self._refused(node_id, code, reason)
        self.log.warn(
            "rejected node registration: {reason}", reason=reason, node_id=node_id or None
        )
        self._publish(NodeEventKind.REJECTED, node_id, reason)
        return RegisterRejected(code, reason, node_id)

    def _refuse_identity(self, node_id: str, identity: IdentityCheck) -> RegisterRejected:
        """The certificate does not prove the token's node: refuse; nothing is claimed."""
        self._last_identity[node_id] = identity
        self._identity_refusals[node_id] = self._identity_refusals.get(node_id, 0) + 1
        self._refused(
            node_id, RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY, identity.reason
        )
        self.log.warn(
            "refused node {node_id} registration: {reason}",
            node_id=node_id,
            reason=identity.reason,
            expected=identity.expected,
            presented=list(identity.presented),
        )
        self._bus.publish(
            NodeEvent(
                NodeEventKind.IDENTITY_REJECTED,
                node_id,
                identity.reason,
                self._clock.seconds(),
                expected=identity.expected,
                presented=identity.presented,
            )
        )
        return RegisterRejected(
            RegisterRejectCode.REGISTER_REJECT_WORKLOAD_IDENTITY, identity.reason, node_id
        )

    def _publish(self, kind: NodeEventKind, node_id: str, reason: str = "") -> None:
        self._bus.publish(NodeEvent(kind, node_id, reason, self._clock.seconds()))


__all__ = [
    "NO_LEASE_SUPPORT",
    "READY_REJECTED",
    "REJECT_REASONS",
    "Acknowledge",
    "INodeLifecycleObserver",
    "IdentityCheck",
    "LeaseCheck",
    "NodeRegistry",
    "Ownership",
    "OwnershipState",
    "PayloadBuilder",
    "ReadyOutcome",
    "RegisterAccepted",
    "RegisterOutcome",
    "RegisterRejected",
    "RegistrationRefusal",
    "RegistryStats",
    "check_identity",
]
