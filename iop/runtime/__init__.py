"""
The shared execution vocabulary of Node adapters and the Edge: what a run is asked to do
(:class:`ExecutionSpec`), what it reports (:class:`RuntimeEvent`, :class:`Usage`), what an adapter
can do (:class:`Capabilities`), how an adapter instance is configured (:class:`AdapterSpec`,
:class:`RuntimeProfile`), and the interfaces adapters provide.
"""

from iop.runtime.events import TERMINAL_TYPES, EventType, RuntimeEvent, Usage
from iop.runtime.interfaces import (
    AdapterContext,
    Capabilities,
    ExecutionSpec,
    IOllamaAPI,
    IProvider,
    IResizable,
    ISessionTerminator,
    ITunnelProvider,
    TreqClient,
)
from iop.runtime.spec import AdapterSpec, RuntimeProfile

__all__ = [
    "TERMINAL_TYPES",
    "AdapterContext",
    "AdapterSpec",
    "Capabilities",
    "EventType",
    "ExecutionSpec",
    "IOllamaAPI",
    "IProvider",
    "IResizable",
    "ISessionTerminator",
    "ITunnelProvider",
    "RuntimeEvent",
    "RuntimeProfile",
    "TreqClient",
    "Usage",
]
