# -*- test-case-name: iop.test.node.test_tunnel -*-
"""
What a provider tunnel request asks of its upstream, checked at admission: an HTTP provider
adapter (:func:`tunnel_provider`), an allowed method and a provider path (:func:`plan_request`)
— the operation's path from the adapter's profile (or its default path, from the protocol
drivers of :mod:`iop.runtime.kinds`), or a relative path the request names. Any "no" is a
:class:`~iop.node.admission.Refusal`.
"""

from __future__ import annotations

from typing import NamedTuple

from iop.node.adapters.registry import AdapterInstance
from iop.node.admission import Refusal
from iop.node.tunnel.headers import clean
from iop.runtime.interfaces import ITunnelProvider
from iop.runtime.kinds import TUNNEL_KINDS, default_operation_path
from iop.wire import runtime_pb2 as pb

__all__ = [
    "ALLOWED_METHODS",
    "TunnelPlan",
    "plan_request",
    "tunnel_provider",
]

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


class TunnelPlan(NamedTuple):
    """What admission found out about a tunnel request."""

    provider: ITunnelProvider
    method: str
    path: str


def tunnel_provider(instance: AdapterInstance) -> ITunnelProvider:
    """The enabled ``instance``'s provider as a tunnel provider, or :class:`Refusal`."""
    provider = ITunnelProvider(instance.provider, None)
    if provider is None:
        raise Refusal(
            f"adapter {instance.name!r} (type {instance.type}) cannot serve provider tunnels;"
            f" only HTTP providers ({', '.join(sorted(TUNNEL_KINDS))}) can"
        )
    return provider


def plan_request(
    request: pb.ProviderTunnelRequest, instance: AdapterInstance, provider: ITunnelProvider
) -> TunnelPlan:
    """The method and provider path of ``request`` on ``instance``, or :class:`Refusal`."""
    method = (request.method or "POST").upper()
    if method not in ALLOWED_METHODS:
        raise Refusal(f"method {request.method!r} is not allowed for provider tunnels")
    path, problem = _path(request, instance, provider)
    if problem:
        raise Refusal(problem)
    return TunnelPlan(provider, method, path)


def _path(
    request: pb.ProviderTunnelRequest,
    instance: AdapterInstance,
    provider: ITunnelProvider,
) -> tuple[str, str]:
    """The provider path of the request, or a reason it has none."""
    operation = request.operation
    if operation:
        profile = provider.profile
        path = profile.operations.get(operation, "") if profile is not None else ""
        path = path or default_operation_path(operation)
        if not path:
            return "", f"adapter {instance.name!r} has no path for operation {operation!r}"
        return (path if path.startswith("/") else "/" + path), ""
    path = request.path
    if not path:
        return "", "provider tunnel request without an operation or a path"
    if not path.startswith("/") or path.startswith("//") or not clean(path) or " " in path:
        return "", "provider tunnel path must be a relative path starting with '/'"
    return path, ""
