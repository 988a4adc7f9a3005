# -*- test-case-name: iop.test.edge.test_payload -*-
"""
Build the ``NodeConfigPayload`` the Edge sends a node on registration: its whole runtime config.

Each adapter instance carries the resolved protocol profile of the (first enabled) provider that
references it, so the node never needs the Edge's ``protocol_profiles`` catalog.

Each carries the ``max_concurrency`` that sizes the node's capacity gate for it
(:func:`adapter_limit`): the one edge.yaml gives, or, left out, the sum of the ``capacity`` of
the enabled providers bound to the instance — the most the pool can grant on it, so the node
never refuses what the pool granted. An instance no enabled provider is bound to (reached only
by ``openai.model_routes``, or all its providers disabled) gets 1, as before the sum existed:
direct routes are not pool-admitted, and 1 is the most conservative gate for them. The sum
changes with a live capacity change, so the payload does, and a refresh pushes it; the node
resizes its gate without a restart.
"""

from __future__ import annotations

from iop.config.model import AdapterConfig, EdgeConfig, NodeConfig, ProfileConfig
from iop.wire import runtime_pb2 as pb


def build_node_payload(config: EdgeConfig, node: NodeConfig) -> pb.NodeConfigPayload:
    profiles = {p.name: p for p in config.protocol_profiles}
    payload = pb.NodeConfigPayload(
        node_id=node.id,
        alias=node.alias,
        runtime=pb.NodeRuntimeConfig(concurrency=node.concurrency, agent_kind=node.agent_kind),
    )
    for adapter in node.adapters:
        message = _adapter_message(adapter, adapter_limit(node, adapter))
        profile_name = next(
            (
                p.profile
                for p in node.providers
                if p.enabled and p.profile and p.adapter_instance == adapter.name
            ),
            "",
        )
        if profile_name:
            message.profile.CopyFrom(_profile_message(profiles[profile_name]))
        payload.adapters.append(message)
    return payload


def adapter_limit(node: NodeConfig, adapter: AdapterConfig) -> int:
    """The node's gate for ``adapter`` (see the module docstring)."""
    if adapter.max_concurrency is not None:
        return adapter.max_concurrency
    served = sum(
        p.capacity for p in node.providers if p.enabled and p.adapter_instance == adapter.name
    )
    return max(1, served)


def _adapter_message(a: AdapterConfig, max_concurrency: int) -> pb.AdapterConfig:
    m = pb.AdapterConfig(
        name=a.name,
        type=a.type,
        enabled=a.enabled,
        base_url=a.base_url,
        request_timeout_ms=a.request_timeout_ms,
        idle_timeout_ms=a.idle_timeout_ms,
        max_concurrency=max_concurrency,
        command=a.command,
        args=list(a.args),
        workspace=a.workspace,
        mode=a.mode,
        resume_args=list(a.resume_args),
        output_format=a.output_format,
        prompt_placement=a.prompt_placement,
        context_size=a.context_size,
    )
    m.headers.update(dict(a.headers))
    m.env.update(dict(a.env))
    m.settings.update(dict(a.settings))
    return m


def _profile_message(p: ProfileConfig) -> pb.RuntimeProfile:
    m = pb.RuntimeProfile(
        name=p.name,
        driver=p.driver,
        capabilities=list(p.capabilities),
        auth_header=p.auth_header,
        auth_scheme=p.auth_scheme,
    )
    m.operations.update(dict(p.operations))
    m.extensions.update(dict(p.extensions))
    return m
