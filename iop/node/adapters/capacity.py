# -*- test-case-name: iop.test.node.test_registry -*-
"""
The per-adapter-instance capacity gate.

One gate per adapter instance, shared by normalized runs and provider tunnels: defence in depth
against execution that bypassed the Edge's admission, not a copy of the Edge's provider leases.
A :class:`Slot` is the one acquire; its :meth:`Slot.release` is the one release and is
idempotent, so every path that ends a request may call it.
"""

from __future__ import annotations


class Slot:
    """One unit of a :class:`CapacityGate`, held until :meth:`release`."""

    __slots__ = ("_gate", "_released")

    def __init__(self, gate: CapacityGate) -> None:
        self._gate = gate
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the slot back. Idempotent: only the first call frees capacity."""
        if self._released:
            return
        self._released = True
        self._gate._release()

    def __repr__(self) -> str:
        return f"<Slot released={self._released}>"


class CapacityGate:
    """At most ``limit`` slots held at once; :meth:`try_acquire` never waits."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"capacity limit must be at least 1, not {limit}")
        self._limit = limit
        self._in_use = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def available(self) -> int:
        return self._limit - self._in_use

    def try_acquire(self) -> Slot | None:
        """A held :class:`Slot`, or ``None`` when the gate is full."""
        if self._in_use >= self._limit:
            return None
        self._in_use += 1
        return Slot(self)

    def _release(self) -> None:
        # Only Slot.release calls this, at most once per slot.
        self._in_use -= 1

    def __repr__(self) -> str:
        return f"<CapacityGate {self._in_use}/{self._limit}>"
