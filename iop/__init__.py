"""IOP: an edge gateway and dial-out worker nodes for LLM and agent providers."""

__version__ = "0.1.0"
