# -*- test-case-name: iop.test.node.test_registry -*-
"""
Adapter instances on a Node, built from the adapter specs (:class:`~iop.runtime.spec.AdapterSpec`)
of the ``NodeConfigPayload`` the Edge delivers: the registry and its per-instance capacity gate,
and one module (or package, :mod:`.cli`) per adapter type: ``openai_compat``, ``vllm``, ``ollama``,
``cli``, each exposing ``build(spec, ctx)``. Adapters see the runtime vocabulary only, never the
wire: nothing here imports :mod:`iop.wire`.
"""

from iop.node.adapters.capacity import CapacityGate, Slot
from iop.node.adapters.registry import (
    KNOWN_ADAPTER_TYPES,
    AdapterApplyError,
    AdapterInstance,
    AdapterRegistry,
    UnknownAdapter,
)

__all__ = [
    "KNOWN_ADAPTER_TYPES",
    "AdapterApplyError",
    "AdapterInstance",
    "AdapterRegistry",
    "CapacityGate",
    "Slot",
    "UnknownAdapter",
]
