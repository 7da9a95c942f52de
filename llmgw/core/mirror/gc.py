"""Which mirrored versions garbage collection deletes, and why.

Owns the decision only: a version is kept when a kept reference names it or
when it is downloading (a running ``mirror add`` owns it); every other version,
complete or not, is deleted. Must not delete anything: ``llmgw.mirror.gc``
applies the plan, or prints it for ``--dry-run``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.core.mirror.index import MirrorIndex, VersionState, VersionStatus
from llmgw.core.mirror.refs import MirrorRef


@dataclass(frozen=True)
class GcDecision:
    status: VersionStatus
    delete: bool
    reason: str


@dataclass(frozen=True)
class GcPlan:
    decisions: tuple[GcDecision, ...]
    unknown_keeps: tuple[MirrorRef, ...]  # kept refs the mirror does not have: worth a warning

    @property
    def deletions(self) -> tuple[GcDecision, ...]:
        return tuple(d for d in self.decisions if d.delete)

    @property
    def bytes_freed(self) -> int:
        return sum(d.status.bytes_verified for d in self.deletions)


def plan_gc(index: MirrorIndex, keep: Iterable[MirrorRef]) -> GcPlan:
    kept = frozenset(keep)
    decisions = []
    for status in index.versions:
        if status.ref in kept:
            decisions.append(GcDecision(status, False, "referenced"))
        elif status.state is VersionState.DOWNLOADING:
            decisions.append(GcDecision(status, False, "downloading"))
        else:
            decisions.append(GcDecision(status, True, f"not referenced ({status.state.value})"))
    known = {s.ref for s in index.versions}
    return GcPlan(tuple(decisions), tuple(sorted(kept - known)))
