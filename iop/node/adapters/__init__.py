"""
Adapter instances on a Node, built from the ``NodeConfigPayload`` the Edge delivers.

The adapters themselves (openai_compat, vllm, ollama, cli) arrive later; for now an instance is
its configuration plus the capacity gate that normalized runs and provider tunnels will share.
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
