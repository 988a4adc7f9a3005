# -*- test-case-name: iop.test.node.test_registry -*-
"""
The per-adapter-instance capacity gate.

One gate per adapter instance, shared by normalized runs and provider tunnels: defence in depth
against execution that bypassed the Edge's admission, not a copy of the Edge's provider leases.
A :class:`Slot` is the one acquire; its :meth:`Slot.release` is the one release and is
idempotent, so every path that ends a request may call it.

The limit follows the config live (:meth:`CapacityGate.resize`, from a config refresh): raising
it admits at once; lowering it never cuts a held slot — new acquires are refused until
``in_use`` is below the new limit, so the gate drains to it by releases, as the Edge's pool
drains a lowered ``capacity``. ``in_use`` may therefore be above ``limit`` for a while, and
:attr:`CapacityGate.available` is never negative.
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
        _check_limit(limit)
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
        return max(0, self._limit - self._in_use)

    def resize(self, limit: int) -> None:
        """
        Make ``limit`` the most slots held at once from now on. Held slots stay held (each is
        still released exactly once); over a lowered limit, acquires wait for releases.
        """
        _check_limit(limit)
        self._limit = limit

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


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"capacity limit must be at least 1, not {limit}")
