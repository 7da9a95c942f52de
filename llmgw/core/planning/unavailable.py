"""Which models the control plane cannot serve now, for the routers: ``unavailable_models``.

Owns the rule that turns the planner's memory and the operator's commands into the
``llmgw/unavailable`` document (``records.UnavailableModels``):

- drained: the operator's drain holds for the model as the catalog has it now
  (``ModelCommand.drains``); no wake brings it back, only a restart or a catalog change;
- unplaceable: Nomad's plan said no profile fits (a ``PlacementHold`` with a capacity
  version) and the cluster's capacity has not changed since. Any capacity change (a
  node, an allocation that ended) drops the claim, so routers wait for a load again
  until Nomad is asked again. A hold after a failed register (no capacity version) is
  a passing error, not "cannot place", and is left out; so is a hold while GPUs were
  still being given back by stopping allocations (``PlacementHold.freeing``: Nomad counts
  a stopping allocation's devices until its tasks exit, so the model waits for them and
  routers answer "loading");
- unplaceable too: the pass found no profile worth a plan at all (``Decision.unplaceable``:
  a multi-node profile and no fabric with enough ready nodes). Its ``since`` is kept
  from the last document while the reason holds, so an unchanged claim is not a new
  document every pass;
- failing: its replicas failed in a row and its rebuild backoff holds (``Backoff``):
  no replica before ``until``, the backoff's end. Routers say so, and when to retry,
  instead of "loading".

Must not: do I/O or read a clock (``now`` is the publication time the caller passes).
What a router does with the document is ``llmgw.core.routing``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.core.planning.desired import Desired
from llmgw.core.planning.state import PlannerState
from llmgw.core.records import MAX_TEXT_CHARS, Unavailability, UnavailableModel, UnavailableModels


def unavailable_models(
    desired: Desired | None,
    state: PlannerState,
    capacity_version: int,
    now: float,
    *,
    unplaceable: Mapping[str, str] | None = None,
    previous: UnavailableModels | None = None,
) -> UnavailableModels:
    """The document to publish after a pass (``now``: unix seconds). Without a catalog
    (``desired`` None) it lists nothing: routers then wait for loads as they always did.
    ``unplaceable`` is the pass's ``Decision.unplaceable``; ``previous`` the document
    published last."""
    if desired is None:
        return UnavailableModels(catalog_sha256="", published_at=now, models=())
    out: list[UnavailableModel] = []
    for name in sorted(desired.models):
        target = desired.models[name]
        command = desired.commands.get(name)
        if command is not None and command.drains(target.key):
            by = command.drained_by or "an operator"
            out.append(UnavailableModel(name, Unavailability.DRAINED, f"drained by {by}", command.drained_at))
            continue
        memo = state.models.get(name)
        hold = memo.hold if memo is not None else None
        if (
            hold is not None
            and hold.capacity_version is not None
            and hold.capacity_version == capacity_version
            and not hold.freeing
        ):
            out.append(UnavailableModel(name, Unavailability.UNPLACEABLE, _clip(hold.reason), hold.since))
        elif unplaceable and name in unplaceable:
            reason = _clip(unplaceable[name])
            since = _since(previous, name, Unavailability.UNPLACEABLE, reason, now)
            out.append(UnavailableModel(name, Unavailability.UNPLACEABLE, reason, since))
        elif memo is not None and memo.backoff is not None and now < memo.backoff.retry_at:
            backoff = memo.backoff
            reason = _clip(f"{backoff.failures} failure(s) in a row; the last: {backoff.last_failure}")
            since = _since(previous, name, Unavailability.FAILING, reason, now)
            out.append(UnavailableModel(name, Unavailability.FAILING, reason, since, until=backoff.retry_at))
    return UnavailableModels(catalog_sha256=desired.catalog_hash, published_at=now, models=tuple(out))


def _clip(reason: str) -> str:
    return reason if len(reason) <= MAX_TEXT_CHARS else reason[: MAX_TEXT_CHARS - 3] + "..."


def _since(
    previous: UnavailableModels | None, model: str, why: Unavailability, reason: str, now: float
) -> float:
    """When the last document first said the same thing about ``model``, else ``now``."""
    for before in previous.models if previous is not None else ():
        if before.model == model and before.why is why and before.reason == reason:
            return before.since
    return now
