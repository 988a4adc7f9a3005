# -*- test-case-name: iop.test.edge.refresh.test_report -*-
"""
The result document of a config refresh, the same whichever way it was asked for (admin API,
``iop config refresh``, SIGHUP): the outcome, the mode, the changed node/provider/model ids,
one :class:`ChangeReport` per changed config path, load/validation errors and per-node push
outcomes. :meth:`RefreshResult.as_dict` is its JSON form: every list is always present (empty,
never null).

A report's ``old``/``new`` are display strings made by the classifier: a secret is shown only
as :data:`SECRET_CHANGED`, a missing value as :data:`ABSENT`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ChangeClass = Literal["live", "restart_required", "rejected"]
ResultKind = Literal["applied", "restart_required", "rejected"]
PushOutcome = Literal["applied", "restart_required", "failed", "timeout"]

# The refresh modes a caller may ask for; anything else is rejected.
MODES = ("dry_run", "apply")

SECRET_CHANGED = "<secret changed>"
ABSENT = "<absent>"


@dataclass(frozen=True)
class ChangeReport:
    """
    One changed config path (``nodes[1].providers[0].capacity``, in the candidate's positions)
    with its old and new display values and its class. ``node``, ``provider`` and ``model`` name
    the ``nodes[]`` / ``providers[]`` / ``models[]`` entry the path is under ("" if none): the
    result's changed lists are made from them.
    """

    path: str
    old: str
    new: str
    change_class: ChangeClass
    detail: str = ""
    node: str = ""
    provider: str = ""
    model: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "change_class": self.change_class,
            "detail": self.detail,
        }

    def describe(self) -> str:
        """One log/console line: ``path: old → new (class)`` and the detail, if any."""
        line = f"{self.path}: {self.old} → {self.new} ({self.change_class})"
        return f"{line}: {self.detail}" if self.detail else line


@dataclass(frozen=True)
class NodePush:
    """How one ready node answered the refresh push (or that it did not in time)."""

    node_id: str
    outcome: PushOutcome
    reason: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"node_id": self.node_id, "outcome": self.outcome, "reason": self.reason}


@dataclass
class RefreshResult:
    """
    ``result``: ``applied`` (in ``dry_run`` mode: would apply), ``restart_required`` (nothing
    applied; the restart-required reports say what blocks) or ``rejected`` (nothing applied;
    ``errors`` and the rejected reports say why).
    """

    result: ResultKind
    mode: str
    changed_nodes: list[str] = field(default_factory=list)
    changed_providers: list[str] = field(default_factory=list)
    changed_models: list[str] = field(default_factory=list)
    reports: list[ChangeReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    node_pushes: list[NodePush] = field(default_factory=list)

    @property
    def blocking(self) -> list[ChangeReport]:
        """The reports that keep the candidate from applying (every non-live one)."""
        return [r for r in self.reports if r.change_class != "live"]

    def as_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "mode": self.mode,
            "changed_nodes": list(self.changed_nodes),
            "changed_providers": list(self.changed_providers),
            "changed_models": list(self.changed_models),
            "reports": [r.as_dict() for r in self.reports],
            "errors": list(self.errors),
            "node_pushes": [p.as_dict() for p in self.node_pushes],
        }

    def describe(self) -> list[str]:
        """Log lines: the outcome, then each error, report and node push."""
        lines = [f"config refresh ({self.mode}): {self.result}"]
        lines += [f"error: {e}" for e in self.errors]
        lines += [r.describe() for r in self.reports]
        lines += [
            f"node {p.node_id}: {p.outcome}" + (f": {p.reason}" if p.reason else "")
            for p in self.node_pushes
        ]
        return lines


def rejected_result(mode: str, errors: list[str]) -> RefreshResult:
    """A refresh refused before any diff: unknown mode, unreadable or invalid candidate."""
    return RefreshResult(result="rejected", mode=mode, errors=list(errors))
