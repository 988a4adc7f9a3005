# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_security -*-
"""
Every check that ties one section of edge.yaml to another, in one place.

A section module reads its own keys; where a key names something another section defines, or
must agree with it, the module calls the check here at that key, so each issue keeps its YAML
path and its place among the others. What each check ties together:

=============================  =================================  ================================
check                          the key                            what it must agree with
=============================  =================================  ================================
:func:`admin_auth`             ``admin.auth``                     ``listen.admin`` (not loopback:
                                                                  auth required)
:func:`plaintext_nodes`        ``node_transport.plaintext``       ``listen.nodes`` (loopback only)
:func:`managed_transport`      ``node_transport.plaintext``,      ``security.mode`` (managed: mTLS)
                               ``.tls.client_ca_file``
:func:`credentials_managed`    ``credentials``                    ``security.mode`` (managed only)
:func:`managed_node`           ``nodes[].recipient_key_file``,    ``security.mode``,
                               ``nodes[].id``                     ``security.trust_domain``
:func:`provider_adapter`       ``nodes[].providers[].adapter``,   the node's ``adapters``
                               ``.type``, ``.category``
:func:`provider_profile`       ``nodes[].providers[].profile``    ``protocol_profiles``
:func:`provider_credential`    ``nodes[].providers[].credential`` ``security.mode``,
                                                                  ``credentials``,
                                                                  ``protocol_profiles``
                                                                  (``auth_header``, scheme), the
                                                                  adapter's type
:func:`credential_binding`     (which header a lease fills)       ``protocol_profiles``
:func:`adapter_headers`        ``nodes[].adapters[].headers``     ``security.mode``, the profiles'
                                                                  ``auth_header``, the providers'
                                                                  credential bindings
:func:`adapter_capacity`       ``nodes[].providers[].capacity``   its adapter's ``max_concurrency``
                                                                  (when set: the enabled
                                                                  providers' sum fits under it)
:func:`provider_target`        ``models[].providers``             ``nodes[].providers`` (ids and
                                                                  models served)
:func:`route_targets`          ``openai.model_routes``            ``models``, ``nodes`` and their
                                                                  enabled adapters
:func:`key_models`             ``openai.auth.keys[].models``      ``models``, ``model_routes``
:func:`cost_budgets_priced`    ``openai.auth.keys[]``/``teams[]`` ``models[].price`` of every model
                               ``.budgets[].cost``,               the key (or a team's keys) may
                               ``default_budgets[].cost``         use
:func:`lease_outlives_nodes`   ``cluster.lease_ttl_sec``          ``node_transport.heartbeat
                                                                  .timeout_sec``
=============================  =================================  ================================

What the earlier sections made known comes in as the objects of :mod:`iop.config.edge.known`;
a reference into a section that could not be read completely is not reported (no cascades).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from iop.config.checks import ID_PATTERN, dns_name_problem, is_loopback_host
from iop.config.cluster import min_lease_ttl
from iop.config.edge.known import (
    AdapterEntry,
    CredentialBinding,
    Profiles,
    ProviderCapacity,
    ProviderIndex,
    ProviderInfo,
    Security,
    Slots,
)
from iop.config.errors import Issues, Section
from iop.config.model import (
    AdapterConfig,
    ModelConfig,
    ModelRoute,
    NodeConfig,
    ProviderConfig,
    ServerTLS,
)
from iop.runtime.kinds import ADAPTER_KINDS, LEASED_KINDS

__all__ = [
    "CREDENTIAL_HEADERS",
    "adapter_capacity",
    "adapter_headers",
    "admin_auth",
    "cost_budgets_priced",
    "credential_binding",
    "credentials_managed",
    "key_models",
    "lease_outlives_nodes",
    "managed_node",
    "managed_transport",
    "plaintext_nodes",
    "provider_adapter",
    "provider_credential",
    "provider_profile",
    "provider_target",
    "route_targets",
]

# Header names that carry a credential whatever the profiles say; in managed mode no adapter
# may set them (nor any profile's auth_header): a node never holds a provider key.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"}
)
_MANAGED = "security.mode: managed"


# ---------------------------------------------------------------------------------------------
# listen and admin, listen and node_transport, security and node_transport


def admin_auth(issues: Issues, admin_interface: str | None, *, given: bool, clean: bool) -> None:
    """
    ``admin.auth`` is required when ``listen.admin`` binds anything but loopback
    (``admin_interface``: ``""`` all interfaces, ``None`` unknown: already an issue). ``given``:
    ``admin.auth`` is present; ``clean``: the ``admin`` section had no issues of its own.
    """
    exposed = admin_interface is not None and not is_loopback_host(admin_interface)
    if exposed and not given and clean:
        shown = f"interface {admin_interface}" if admin_interface else "all interfaces"
        issues.add(
            "listen.admin",
            f"binds {shown}, not loopback: set admin.auth (token: ${{ENV_VAR}}, token_file "
            "or token_sha256) so that every admin request needs a bearer token, or bind "
            "the admin listener to 127.0.0.1",
        )


def plaintext_nodes(transport: Section, nodes_interface: str | None) -> None:
    """``node_transport.plaintext: true`` only when ``listen.nodes`` binds loopback."""
    # interface None: listen.nodes is missing or invalid, already reported.
    if nodes_interface is not None and not is_loopback_host(nodes_interface):
        binds = f"it binds {nodes_interface!r}" if nodes_interface else "it binds all interfaces"
        transport.issues.add(
            transport.path_of("plaintext"),
            "plaintext is only allowed when listen.nodes binds a loopback interface "
            f"(interface=127.0.0.1, ::1 or localhost); {binds}",
        )


def managed_transport(
    transport: Section, security: Security, plaintext: bool, tls: ServerTLS | None
) -> None:
    """Managed mode: nodes connect over TLS and prove their workload with a certificate."""
    if not security.managed:
        return
    if plaintext:
        transport.issues.add(
            transport.path_of("plaintext"),
            f"plaintext node connections are refused with {_MANAGED}: nodes prove their "
            "identity with a TLS client certificate (set node_transport.tls with "
            "client_ca_file)",
        )
    elif tls is not None and tls.client_ca_file is None:
        transport.issues.add(
            "node_transport.tls.client_ca_file",
            f"is required with {_MANAGED}: the CA that issues node client certificates "
            "(mTLS; `iop pki init`, `iop pki issue-node NODE_ID`)",
        )


# ---------------------------------------------------------------------------------------------
# security and credentials, security and nodes


def credentials_managed(issues: Issues, security: Security, given: bool) -> None:
    """A ``credentials`` catalog (``given``: a non-empty list) needs managed mode."""
    if given and security.legacy:
        # Refused rather than ignored: secrets loaded for nothing, and a config that looks
        # protected while every adapter still sends its own headers.
        issues.add(
            "credentials",
            f"credentials need {_MANAGED}: in legacy mode no lease carries them (remove "
            "the catalog, or switch the Edge and its nodes to managed mode)",
        )


def managed_node(section: Section, node_id: str, security: Security) -> None:
    """A managed node: its recipient key, and an id that fits in its workload DNS-ID."""
    if not security.managed:
        return
    if not section.has("recipient_key_file"):
        section.issues.add(
            section.path_of("recipient_key_file"),
            f"is required with {_MANAGED}: the node's lease recipient public key (create "
            f"the pair with `iop keys recipient {node_id or 'NODE_ID'}` and keep the private "
            "key on the node)",
        )
    if node_id and ID_PATTERN.match(node_id) and security.trust_domain_ok:
        workload = security.config.node_workload(node_id)
        if dns_name_problem(workload) is not None:
            section.issues.add(
                section.path_of("id"),
                f"with {_MANAGED} a node id is part of its certificate's DNS name "
                f"(<id>.node.{security.config.trust_domain}): use lowercase letters, digits, "
                "'-' and '.', each part starting and ending with a letter or digit",
            )


# ---------------------------------------------------------------------------------------------
# nodes[].providers and nodes[].adapters, protocol_profiles, credentials


def provider_adapter(
    section: Section,
    node_id: str,
    adapters: list[AdapterEntry],
    *,
    ref: str,
    enabled: bool,
    explicit_type: str,
    category: str,
) -> tuple[str, str]:
    """
    A provider's ``adapter`` resolved on its node: ``(instance name, adapter type)``. An enabled
    provider's reference must resolve, and its ``type`` and ``category`` agree with the
    instance; a disabled one is not checked, but its type is inferred when possible.
    """
    instance = ""
    type_ = explicit_type
    if ref and enabled:
        resolved = _resolve_adapter(section, node_id, ref, adapters)
        if resolved is not None:
            instance = resolved.name
            if explicit_type in ADAPTER_KINDS and explicit_type != resolved.type:
                section.issues.add(
                    section.path_of("type"),
                    f"is {explicit_type!r} but adapter {resolved.name!r} is of type "
                    f"{resolved.type!r}",
                )
            type_ = resolved.type
            if category == "cli" and resolved.type != "cli":
                section.issues.add(
                    section.path_of("category"),
                    f"category cli needs an enabled cli adapter, but {resolved.name!r} "
                    f"is of type {resolved.type!r}",
                )
    elif ref and not explicit_type:
        # Disabled: the reference is not checked, but a type is inferred when possible.
        type_ = _infer_type(ref, adapters)
    return instance, type_


def _resolve_adapter(
    section: Section, node_id: str, ref: str, adapters: list[AdapterEntry]
) -> AdapterConfig | None:
    """
    The adapter instance ``ref`` names: an exact instance name first, else a legacy type
    name with exactly one enabled instance of that type. ``None`` after an issue, or if
    the named instance had issues of its own.
    """
    issues = section.issues
    path = section.path_of("adapter")
    exact = [a for a in adapters if a.config.name == ref]
    if exact:
        adapter = exact[0]
        if not adapter.ok:
            return None
        if not adapter.config.enabled:
            issues.add(
                path,
                f"no enabled adapter instance {ref!r} on node {node_id!r}: it is disabled",
            )
            return None
        return adapter.config
    of_type = [a for a in adapters if a.config.type == ref and a.config.enabled]
    if len(of_type) == 1:
        return None if not of_type[0].ok else of_type[0].config
    if len(of_type) > 1:
        names = ", ".join(a.config.name for a in of_type)
        issues.add(
            path,
            f"ambiguous: {len(of_type)} enabled instances of type {ref!r}; name one of: {names}",
        )
        return None
    if any(not a.ok for a in adapters):
        # An entry with issues of its own may be the one meant; don't pile on.
        return None
    if ref in ADAPTER_KINDS:
        issues.add(path, f"no enabled adapter instance of type {ref!r} on node {node_id!r}")
    else:
        names = ", ".join(a.config.name for a in adapters) or "none"
        issues.add(
            path,
            f"no enabled adapter instance {ref!r} on node {node_id!r} "
            f"(configured instances: {names})",
        )
    return None


def _infer_type(ref: str, adapters: list[AdapterEntry]) -> str:
    """Best-effort type of a disabled provider's adapter reference; ``""`` if unknown."""
    for adapter in adapters:
        if adapter.config.name == ref:
            return adapter.config.type if adapter.config.type in ADAPTER_KINDS else ""
    return ref if ref in ADAPTER_KINDS else ""


def provider_profile(section: Section, profile: str, profiles: Profiles) -> None:
    """A provider's ``profile`` names one of ``protocol_profiles``."""
    if profile and profile not in profiles.by_name and profiles.complete:
        defined = ", ".join(sorted(profiles.by_name)) or "none"
        section.issues.add(
            section.path_of("profile"),
            f"unknown protocol profile {profile!r} (protocol_profiles defines: {defined})",
        )


def provider_credential(
    section: Section,
    slot: str,
    profile: str,
    type_: str,
    *,
    security: Security,
    slots: Slots,
    profiles: Profiles,
) -> None:
    """``providers[].credential``: a known slot, in managed mode, carried by a profile."""
    issues = section.issues
    path = section.path_of("credential")
    if security.legacy:
        issues.add(
            path,
            f"credentials need {_MANAGED}: only a managed Edge sends a provider its "
            "credential (sealed in a lease)",
        )
    if slot not in slots.names and slots.complete:
        defined = ", ".join(sorted(slots.names)) or "none"
        issues.add(path, f"unknown credential slot {slot!r} (credentials defines: {defined})")
    if type_ and type_ not in LEASED_KINDS:
        issues.add(
            path,
            f"{type_} providers serve normalized runs, which carry no credential; only "
            f"{' and '.join(sorted(LEASED_KINDS))} providers (raw tunnels) do",
        )
    if not profile:
        issues.add(
            path,
            "needs the provider's `profile`: the protocol profile's auth_header names the "
            "header that carries the credential",
        )
        return
    found = profiles.by_name.get(profile)
    if found is None:
        return
    profile_path, profile_config = found
    if not profile_config.auth_header:
        issues.add(
            path,
            f"profile {profile!r} ({profile_path}) has no auth_header to carry the credential",
        )
        return
    scheme = profile_config.auth_scheme
    bound = slots.by_name.get(slot)
    if scheme and bound is not None:
        # A key pasted with its scheme would be sent as "Bearer Bearer <key>". Says only
        # that the secret starts with the scheme, never any of the key itself.
        if bound.secret.reveal()[: len(scheme) + 1].lower() == f"{scheme.lower()} ":
            issues.add(
                path,
                f"the secret of credential slot {slot!r} starts with {scheme!r}: give the "
                f"bare key, profile {profile!r} adds the scheme itself",
            )


def credential_binding(provider: ProviderConfig, profiles: Profiles) -> CredentialBinding | None:
    """
    The header an enabled, slot-bound provider's lease fills on its adapter instance (its
    profile's ``auth_header``), or None.
    """
    if not (provider.credential and provider.enabled and provider.adapter_instance):
        return None
    found = profiles.by_name.get(provider.profile)
    if found is None or not found[1].auth_header:
        return None
    return CredentialBinding(provider.id, provider.credential, found[1].auth_header.strip().lower())


def adapter_headers(
    issues: Issues,
    adapters: list[AdapterEntry],
    bindings: Mapping[str, list[CredentialBinding]],
    *,
    security: Security,
    profiles: Profiles,
) -> None:
    """
    Managed mode: no adapter's ``headers`` carry a credential. The header a slot-bound
    provider's lease fills is named with its provider; any other credential header
    (``Authorization``, ``x-api-key``, any profile's ``auth_header``...) is refused too.
    """
    if not security.managed:
        return
    credential_headers = set(CREDENTIAL_HEADERS)
    credential_headers.update(
        p.auth_header.strip().lower() for _, p in profiles.by_name.values() if p.auth_header
    )
    for adapter in adapters:
        bound = {b.header: b for b in bindings.get(adapter.config.name, ())}
        for header, path in adapter.header_paths:
            lowered = header.lower()
            binding = bound.get(lowered)
            if binding is not None:
                issues.add(
                    path,
                    f"provider {binding.provider_id!r} gets this header from credential slot "
                    f"{binding.slot!r}; an adapter's headers must not carry a credential "
                    f"with {_MANAGED}",
                )
            elif lowered in credential_headers:
                issues.add(
                    path,
                    f"an adapter's headers must not carry a credential with {_MANAGED}: "
                    "put the key in credentials[] and name its slot in the provider's "
                    "`credential` (the node then gets it per request, sealed in a lease)",
                )


def adapter_capacity(
    issues: Issues, adapters: list[AdapterEntry], capacities: list[ProviderCapacity]
) -> None:
    """
    An adapter instance with an explicit ``max_concurrency``: the ``capacity`` of its enabled
    providers (``capacities``, in document order) adds up to at most that. The pool grants up
    to each provider's capacity and the node's gate admits up to ``max_concurrency``, so a sum
    above it is work the pool hands out and the node refuses (503 ``provider_busy``). One issue
    per adapter, at the capacity of the provider that first takes the sum over it, naming both
    paths. An adapter with issues of its own is not checked (no cascades); one without
    ``max_concurrency`` follows its providers and needs no check.
    """
    for adapter in adapters:
        limit = adapter.config.max_concurrency
        if limit is None or not adapter.ok:
            continue
        own = [c for c in capacities if c.adapter == adapter.config.name]
        total = sum(c.capacity for c in own)
        if total <= limit:
            continue
        running = 0
        for entry in own:
            running += entry.capacity
            if running > limit:
                break
        name = adapter.config.name
        together = (
            f" ({total} together with the other providers of adapter {name!r})"
            if len(own) > 1
            else ""
        )
        issues.add(
            entry.path,
            f"{entry.capacity}{together} exceeds {adapter.max_concurrency_path} ({limit}): "
            "the pool would grant more than the node's gate admits; raise max_concurrency "
            f"to at least {total} or leave it out so the adapter follows its providers",
        )


# ---------------------------------------------------------------------------------------------
# models and nodes[].providers


def provider_target(
    issues: Issues,
    providers: ProviderIndex,
    provider_id: str,
    *,
    id_path: str,
    path: str,
    model_id: str,
    explicit: str | None,
) -> str | None:
    """
    The upstream model a ``models[].providers`` entry asks its provider for: ``explicit``
    (its ``target``) if it is one the provider serves, else the model's own id, else the
    provider's only model. ``None`` after an issue (or if the provider's models are unknown).
    """
    info = providers.by_id.get(provider_id)
    if info is None:
        if providers.complete:
            issues.add(id_path, f"unknown provider {provider_id!r} (not in any nodes[].providers)")
        return None
    return _served_target(
        issues,
        path if explicit is None else f"{path}.target",
        model_id,
        provider_id,
        explicit,
        info,
    )


def _served_target(
    issues: Issues,
    path: str,
    model_id: str,
    provider_id: str,
    explicit: str | None,
    info: ProviderInfo,
) -> str | None:
    if info.models is None or (explicit is None and not model_id):
        return None
    served = ", ".join(info.models)
    if explicit is not None:
        if explicit and explicit not in info.models:
            issues.add(
                path,
                f"{explicit!r} is not one of provider {provider_id!r} models ({served})",
            )
            return None
        return explicit or None
    if model_id in info.models:
        return model_id
    if len(info.models) == 1:
        return info.models[0]
    issues.add(
        path,
        f"provider {provider_id!r} serves several models ({served}) and none is "
        f"{model_id!r}; give an explicit target: {{id: {provider_id}, target: ...}}",
    )
    return None


# ---------------------------------------------------------------------------------------------
# openai and models, nodes


def route_targets(
    section: Section,
    route: ModelRoute,
    nodes: tuple[NodeConfig, ...],
    models: tuple[ModelConfig, ...],
) -> None:
    """
    A ``model_routes`` entry: its model is not also a ``models[]`` id, its ``node`` exists and
    its ``adapter`` names an enabled instance there (on any node when none is named).
    """
    issues = section.issues
    model, adapter, node_id = route.model, route.adapter, route.node_id
    if model and model in {m.id for m in models}:
        issues.add(
            section.path_of("model"),
            f"{model!r} is also a models[] id; a model id routes one way only",
        )
    by_id = {n.id: n for n in nodes}
    candidates = [by_id[node_id]] if node_id in by_id else []
    if node_id is not None and node_id not in by_id:
        issues.add(section.path_of("node"), f"unknown node {node_id!r}")
    elif node_id is None:
        candidates = list(nodes)
    if adapter and candidates and not any(_route_adapter_exists(n, adapter) for n in candidates):
        where = f"node {node_id!r}" if node_id else "any node"
        issues.add(section.path_of("adapter"), f"no enabled adapter {adapter!r} on {where}")


def _route_adapter_exists(node: NodeConfig, ref: str) -> bool:
    """A route's adapter: an enabled instance name, or a type with one enabled instance."""
    enabled = [a for a in node.adapters if a.enabled]
    if any(a.name == ref for a in enabled):
        return True
    return len([a for a in enabled if a.type == ref]) == 1


def key_models(
    section: Section,
    allowed: tuple[str, ...],
    models: tuple[ModelConfig, ...],
    routes: Collection[ModelRoute],
) -> None:
    """A client key's ``models`` scope names ``models[]`` ids or ``model_routes`` models."""
    known = {m.id for m in models} | {r.model for r in routes}
    for i, model in enumerate(allowed):
        if model not in known:
            section.issues.add(f"{section.path_of('models')}[{i}]", f"unknown model {model!r}")


def cost_budgets_priced(
    issues: Issues, openai: object, models: tuple[ModelConfig, ...], routes: Collection[ModelRoute]
) -> None:
    """
    A budget in ``cost`` needs a price for every model its keys may use: a key's own
    ``models`` (none: every ``models[]`` entry and every ``model_routes`` model), a team's the
    union of its keys', ``default_budgets`` those of every key that sets no ``budgets``. A
    model with no price has an unknown cost, so such a budget could never be enforced; the
    issue names the budget and the models. (``model_routes`` carry no price: a key that may use
    one cannot have a cost budget.) Read from the YAML as written: a malformed entry is the
    ``openai`` section's own issue and is skipped here.
    """
    auth = _mapping(_mapping(openai).get("auth"))
    priced = {m.id for m in models if m.price is not None}
    catalog = [m.id for m in models] + [r.model for r in routes]
    keys = [(i, _mapping(k)) for i, k in enumerate(_list(auth.get("keys")))]

    def scope(key: Mapping[str, object]) -> list[str]:
        allowed = [m for m in _list(key.get("models")) if isinstance(m, str)]
        return allowed or catalog

    def check(path: str, budgets: object, may_use: list[str], whose: str) -> None:
        unpriced = sorted({m for m in may_use if m not in priced})
        if not unpriced:
            return
        for j, budget in enumerate(_list(budgets)):
            if _mapping(budget).get("cost") is not None:
                issues.add(
                    f"{path}.budgets[{j}].cost",
                    f"a cost budget needs a price for every model {whose} may use; no "
                    f"models[].price for: {', '.join(unpriced)}",
                )

    for i, key in keys:
        check(f"openai.auth.keys[{i}]", key.get("budgets"), scope(key), "this key")
    for t, team in enumerate(_list(auth.get("teams"))):
        name = _mapping(team).get("name")
        members = [k for _, k in keys if name is not None and k.get("team") == name]
        may_use = [m for k in members for m in scope(k)]
        check(f"openai.auth.teams[{t}]", _mapping(team).get("budgets"), may_use, "its keys")
    unbudgeted = [m for _, k in keys if k.get("budgets") is None for m in scope(k)]
    defaults = auth.get("default_budgets")
    for j, budget in enumerate(_list(defaults)):
        unpriced = sorted({m for m in unbudgeted if m not in priced})
        if _mapping(budget).get("cost") is not None and unpriced:
            issues.add(
                f"openai.auth.default_budgets[{j}].cost",
                "a cost budget needs a price for every model the keys it applies to may use; "
                f"no models[].price for: {', '.join(unpriced)}",
            )


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


# ---------------------------------------------------------------------------------------------
# cluster and node_transport


def lease_outlives_nodes(section: Section, ttl: float, heartbeat_timeout_sec: float) -> None:
    """
    ``cluster.lease_ttl_sec`` is at least :func:`~iop.config.cluster.min_lease_ttl` of the
    nodes' heartbeat timeout (``node_transport.heartbeat.timeout_sec``).
    """
    floor = min_lease_ttl(heartbeat_timeout_sec)
    if ttl < floor:
        section.issues.add(
            section.path_of("lease_ttl_sec"),
            f"must be at least {floor:g} seconds with node_transport.heartbeat.timeout_sec "
            f"{heartbeat_timeout_sec:g}: a node cancels the work of an Edge it no longer hears "
            "from only at its heartbeat timeout, and a lease must outlive that by its renewal "
            "period (1.5 x (timeout + 0.5 s)), or a stopped Edge's slot is granted again while "
            "its work still runs",
        )
