"""The reconciler's decision core: pure, synchronous, tested with plain values and a synthetic clock.

Public face:

- ``decide(desired, observed, state, now, settings) -> Decision``: one pass; the actions in the
  order to apply them, the state to remember, the status in words, and when to look again.
- ``record_outcomes(state, outcomes, now, settings, capacity_version=, gpus_freeing=)``: fold what
  the executor did (placed, unplaceable, deferred, done, failed) into the state for the next
  pass; an unplaceable one while GPUs are still being given back is a wait, not a verdict.
- ``desired_from_catalog(catalog, catalog_hash, expected_spec, settings) -> Desired``; ``expected_spec``
  is a ``SpecOracle``: the spec hash the renderer would give a running replica now.
- ``ModelCommand``: the operator's drain and restart of a model (``Desired.commands``), and
  ``model_key(model)``, the hash a drain is recorded under.
- the observation values (``Observed``, ``ObservedJob``, ``ObservedAlloc``, ``ObservedNode``),
  the actions (``PlaceReplica``, ``MarkDraining``, ``StopReplica``, ``ClearDrainMark``) and
  outcomes, the status report (``StatusReport``), ``PlanningSettings`` and ``replica_job_id``.

Nothing here does I/O or reads a clock; ``llmgw.control`` observes, executes and loops.
"""

from llmgw.core.planning.actions import (
    Action,
    ActionKind,
    Candidate,
    ClearDrainMark,
    Deferred,
    Done,
    EndDrain,
    Failed,
    MarkDraining,
    Outcome,
    Placed,
    PlaceReplica,
    PlaceWhy,
    StopReplica,
    Unplaceable,
)
from llmgw.core.planning.commands import ModelCommand
from llmgw.core.planning.deciding import Decision, decide
from llmgw.core.planning.desired import (
    ANY_GPU,
    Claim,
    Desired,
    ModelTarget,
    ProfileTarget,
    SpecOracle,
    claims_conflict,
    desired_from_catalog,
    model_key,
    profile_claim,
)
from llmgw.core.planning.observed import (
    JOB_PREFIX,
    AllocStatus,
    JobId,
    NodeId,
    NodeStatus,
    Observed,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
    ReplicaId,
    replica_job_id,
)
from llmgw.core.planning.settings import DEFAULT_PLANNING, PlanningSettings
from llmgw.core.planning.state import (
    EMPTY_STATE,
    Backoff,
    ModelMemo,
    PlacementHold,
    PlannerState,
    ReplicaMemo,
    record_outcomes,
)
from llmgw.core.planning.status import (
    BackoffStatus,
    ModelStatus,
    Phase,
    ReplicaStatus,
    StatusDecodeError,
    StatusReport,
)

__all__ = [
    "ANY_GPU",
    "DEFAULT_PLANNING",
    "EMPTY_STATE",
    "JOB_PREFIX",
    "Action",
    "ActionKind",
    "AllocStatus",
    "Backoff",
    "BackoffStatus",
    "Candidate",
    "Claim",
    "ClearDrainMark",
    "Decision",
    "Deferred",
    "Desired",
    "Done",
    "EndDrain",
    "Failed",
    "JobId",
    "MarkDraining",
    "ModelCommand",
    "ModelMemo",
    "ModelStatus",
    "ModelTarget",
    "NodeId",
    "NodeStatus",
    "Observed",
    "ObservedAlloc",
    "ObservedJob",
    "ObservedNode",
    "Outcome",
    "Phase",
    "PlaceReplica",
    "PlaceWhy",
    "Placed",
    "PlacementHold",
    "PlannerState",
    "PlanningSettings",
    "ProfileTarget",
    "ReplicaId",
    "ReplicaMemo",
    "ReplicaStatus",
    "SpecOracle",
    "StatusDecodeError",
    "StatusReport",
    "StopReplica",
    "Unplaceable",
    "claims_conflict",
    "decide",
    "desired_from_catalog",
    "model_key",
    "profile_claim",
    "record_outcomes",
    "replica_job_id",
]
