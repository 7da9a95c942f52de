"""What the reconciler remembers between passes that the cluster itself does not record.

Owns: per-model memory (rebuild backoff, a placement hold after Nomad said "does not fit",
scaling windows) and per-replica memory (registered but not yet seen, healthy once,
draining, stop sent), and folding the executor's outcomes into it (``record_outcomes``).

Must not: be needed for safety. A new leader starts from an empty state and rebuilds
the rest from what Nomad and Consul show (jobs with llmgw's meta, submit and start times,
drain marks); what is lost on a restart is only backoff counts and scaling windows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from llmgw.core.backoff import BackoffPolicy
from llmgw.core.planning.actions import (
    Deferred,
    Done,
    Failed,
    MarkDraining,
    Outcome,
    Placed,
    PlaceReplica,
    PlaceWhy,
    StopReplica,
    Unplaceable,
)
from llmgw.core.planning.desired import Claim
from llmgw.core.planning.observed import JobId, NodeId, ReplicaId
from llmgw.core.planning.settings import PlanningSettings
from llmgw.core.scaling import ScaleState


@dataclass(frozen=True, slots=True)
class Backoff:
    """The model failed ``failures`` times in a row; no placement before ``retry_at``."""

    failures: int
    retry_at: float
    last_failure: str


@dataclass(frozen=True, slots=True)
class SuspectFailure:
    """The model's last failure, which may yet turn out to be a node's: if Nomad reports one
    of ``nodes`` (where the failed replicas ran) down or disconnected before ``until``, the
    backoff goes back to ``backoff_before`` and the replicas are rebuilt at once."""

    nodes: frozenset[NodeId]
    until: float
    backoff_before: Backoff | None
    replicas: tuple[JobId, ...]


@dataclass(frozen=True, slots=True)
class PlacementHold:
    """Placing the model did not work; try again at ``retry_at``, or sooner when the cluster's
    capacity moved away from ``capacity_version`` (None: only time helps)."""

    reason: str
    since: float
    retry_at: float
    attempts: int
    capacity_version: int | None
    # Nomad said "does not fit" while GPUs were still being given back by stopping
    # allocations: the model waits for them (its retry comes when they end); it is not
    # "unplaceable" to the routers.
    freeing: bool = False


@dataclass(frozen=True, slots=True)
class ModelMemo:
    backoff: Backoff | None = None
    suspect: SuspectFailure | None = None  # the last failure, while it may still be a node's
    hold: PlacementHold | None = None
    healthy_since: float | None = None  # had a healthy replica and no failure since
    scale: ScaleState | None = None
    spec_key: tuple[str, ...] = ()  # the profiles' spec hashes the memo was built for
    surge_blocked: bool = False  # a roll's extra replica did not fit, twice: roll in place instead
    restart_generation: int = 0  # the operator's restart the memo was built for


@dataclass(frozen=True, slots=True)
class ReplicaMemo:
    model: str
    replica_id: ReplicaId
    first_seen: float
    # Set when this leader registered it: it counts as a replica before any observation
    # shows it, so a lagging view never registers a second one.
    registered_at: float | None = None
    profile_index: int = 0
    spec_hash: str = ""
    fabric: str | None = None
    claim: Claim = frozenset()
    restart_generation: int = 0  # the model's restart generation it was placed under
    was_healthy: bool = False  # passed its check at least once
    unhealthy_since: float | None = None  # was healthy, and has not passed since then
    draining_since: float | None = None
    drain_reason: str = ""
    marked: bool = False  # the drain mark is written (or seen in Consul)
    stop_sent_at: float | None = None
    stop_reason: str = ""
    # Nomad's warnings when this leader registered it (a replica adopted from Nomad has none:
    # they are in no answer a read gives).
    warnings: tuple[str, ...] = ()
    # Placed without the spread because no candidate away from the model's other replicas
    # fitted: Nomad's words for why (the status shows them while it shares a node).
    spread_refused: str = ""
    placed_here: bool = False  # this leader placed it (not adopted from what Nomad shows)


@dataclass(frozen=True, slots=True)
class PlannerState:
    models: Mapping[str, ModelMemo] = field(default_factory=dict)
    replicas: Mapping[JobId, ReplicaMemo] = field(default_factory=dict)
    # When each node was first seen down or disconnected (if Nomad gives no time).
    node_down_since: Mapping[NodeId, float] = field(default_factory=dict)


EMPTY_STATE = PlannerState()


def record_outcomes(
    state: PlannerState,
    outcomes: Iterable[Outcome],
    now: float,
    settings: PlanningSettings,
    *,
    capacity_version: int,
    gpus_freeing: int = 0,
) -> PlannerState:
    """Fold what the executor did into the memory the next pass starts from.

    ``gpus_freeing`` is the pass's ``Observed.gpus_freeing``; a replica stopped in this very
    pass frees GPUs too. A "does not fit" then is a wait for them, not a verdict."""
    models = dict(state.models)
    replicas = dict(state.replicas)
    outcomes = tuple(outcomes)
    stopped_now = any(isinstance(o, Done) and isinstance(o.action, StopReplica) for o in outcomes)
    freeing = gpus_freeing > 0 or stopped_now
    for outcome in outcomes:
        if isinstance(outcome, Placed):
            act = outcome.action
            replicas[act.job_id] = ReplicaMemo(
                model=act.model,
                replica_id=act.replica_id,
                first_seen=now,
                registered_at=now,
                profile_index=outcome.profile_index,
                spec_hash=outcome.spec_hash,
                fabric=outcome.fabric,
                claim=act.claim,
                restart_generation=act.restart_generation,
                warnings=outcome.warnings,
                spread_refused=outcome.spread_refused or act.unspread,
                placed_here=True,
            )
            memo = models.get(act.model, ModelMemo())
            models[act.model] = replace(
                memo, hold=None, surge_blocked=memo.surge_blocked and act.why is not PlaceWhy.ROLL
            )
        elif isinstance(outcome, Unplaceable):
            waiting = (
                f"waiting for GPUs that stopping allocations give back "
                f"({gpus_freeing or 'some'} still held until their tasks exit); "
                if freeing
                else ""
            )
            models[outcome.action.model] = _held(
                models.get(outcome.action.model, ModelMemo()),
                outcome.action,
                f"{waiting}no profile fits: {outcome.explanation}",
                now,
                BackoffPolicy(settings.unplaceable_retry, settings.unplaceable_retry_max),
                capacity_version,
                freeing=freeing,
            )
        elif isinstance(outcome, Failed) and isinstance(outcome.action, PlaceReplica):
            models[outcome.action.model] = _held(
                models.get(outcome.action.model, ModelMemo()),
                outcome.action,
                f"register failed: {outcome.error}",
                now,
                BackoffPolicy(settings.register_retry, settings.unplaceable_retry_max),
                None,
            )
        elif isinstance(outcome, Failed) and isinstance(outcome.action, StopReplica):
            memo_r = replicas.get(outcome.action.job_id)
            if memo_r is not None:  # send it again next pass
                replicas[outcome.action.job_id] = replace(memo_r, stop_sent_at=None)
        elif isinstance(outcome, Failed) and isinstance(outcome.action, MarkDraining):
            memo_r = replicas.get(outcome.action.job_id)
            if memo_r is not None:
                replicas[outcome.action.job_id] = replace(memo_r, marked=False)
        elif isinstance(outcome, Done) and isinstance(outcome.action, MarkDraining):
            memo_r = replicas.get(outcome.action.job_id)
            if memo_r is not None:
                replicas[outcome.action.job_id] = replace(memo_r, marked=True)
        elif isinstance(outcome, Deferred | Done | Failed):
            pass  # nothing to remember: the next pass sees the result, or tries again
    return PlannerState(models=models, replicas=replicas, node_down_since=state.node_down_since)


def _held(
    memo: ModelMemo,
    action: PlaceReplica,
    reason: str,
    now: float,
    backoff: BackoffPolicy,
    capacity_version: int | None,
    *,
    freeing: bool = False,
) -> ModelMemo:
    attempts = (memo.hold.attempts if memo.hold else 0) + 1
    hold = PlacementHold(
        reason=reason,
        since=memo.hold.since if memo.hold else now,
        retry_at=now + backoff.step(attempts),
        attempts=attempts,
        capacity_version=capacity_version,
        freeing=freeing,
    )
    # A roll goes in place (an old replica drains before its replacement is placed, so the
    # model serves with one replica fewer for a while) only when the extra replica failed
    # twice with nothing being given back: a "does not fit" while stopping allocations still
    # hold GPUs (often the old replica this roll just stopped) is a wait for them, however
    # often it is asked, and the retry comes as soon as they end.
    blocked = action.why is PlaceWhy.ROLL and attempts >= 2 and not freeing
    return replace(memo, hold=hold, surge_blocked=memo.surge_blocked or blocked)
