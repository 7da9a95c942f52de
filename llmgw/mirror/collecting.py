"""``llmgw mirror gc``: delete the versions no kept reference names, or say what would go (``--dry-run``).

Owns applying ``llmgw.core.mirror.plan_gc``. Each deletion takes the version's
lock first, so a version whose download started after the plan was made is
skipped, never deleted under a running ``mirror add``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.core.mirror import GcDecision, GcPlan, MirrorRef, plan_gc
from llmgw.mirror.errors import VersionBusy
from llmgw.mirror.store import DirectoryStore


@dataclass(frozen=True)
class GcResult:
    plan: GcPlan
    deleted: tuple[GcDecision, ...]
    skipped: tuple[tuple[GcDecision, str], ...]  # planned deletions that did not happen, and why
    dry_run: bool


def collect_garbage(store: DirectoryStore, keep: Iterable[MirrorRef], *, dry_run: bool) -> GcResult:
    plan = plan_gc(store.index(), keep)
    if dry_run:
        return GcResult(plan, (), (), True)
    deleted = []
    skipped = []
    for decision in plan.deletions:
        try:
            store.delete(decision.status.ref)
        except VersionBusy:
            skipped.append((decision, "a download started meanwhile"))
            continue
        deleted.append(decision)
    return GcResult(plan, tuple(deleted), tuple(skipped), False)
