"""The reconciler's syscall table: the few things a decision may ask the world to do, and
what the executor reports back.

Owns: the action values (each with a reason in words) and the outcome values. Must not:
perform anything; ``llmgw.control.executing`` applies actions, one at a time, idempotently
("already exists" and "already gone" are success).

The one rule the executor follows beyond "do it": placements whose GPU claims conflict
(``claims_conflict``) are planned one at a time, so after one of them registers, the
others in the same pass are reported ``Deferred`` instead of being planned from a
snapshot that does not yet hold the first one's allocations.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmgw.core.planning.desired import Claim
from llmgw.core.planning.observed import JobId, NodeId, ReplicaId


class ActionKind(StrEnum):
    PLACE = "place"
    MARK_DRAINING = "mark_draining"
    STOP = "stop"
    CLEAR_DRAIN_MARK = "clear_drain_mark"
    END_DRAIN = "end_drain"


class PlaceWhy(StrEnum):
    """Why a replica is placed; also its priority when placements compete (lowest first)."""

    REPLACE = "replace"  # below min, or rebuilding what failed
    WAKE = "wake"  # an on-demand model was requested
    SCALE_UP = "scale_up"
    ROLL = "roll"  # a surge replica of a new spec, before an old one drains

    @property
    def priority(self) -> int:
        return _PRIORITY[self]


_PRIORITY = {PlaceWhy.REPLACE: 0, PlaceWhy.WAKE: 1, PlaceWhy.SCALE_UP: 2, PlaceWhy.ROLL: 3}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run the replica: a profile, for a multi-node profile the fabric, and the
    nodes to keep away from (where the model's other replicas run: the spread)."""

    profile_index: int
    fabric: str | None
    # The executor adds one ``${node.unique.id} != <id>`` job constraint per node, so no
    # group of the replica lands where another replica of the model runs.
    away_from: tuple[NodeId, ...] = ()


@dataclass(frozen=True, slots=True)
class PlaceReplica:
    """Render, plan each candidate in order, register the first Nomad says fits."""

    model: str
    replica_id: ReplicaId
    job_id: JobId
    candidates: tuple[Candidate, ...]
    claim: Claim
    why: PlaceWhy
    reason: str
    # Written into the job's meta (``llmgw_restart_generation``) when above 0.
    restart_generation: int = 0
    # Why no candidate keeps away from the model's other replicas, when the planner saw
    # that no plan could (too few ready nodes without them); "" otherwise.
    unspread: str = ""

    @property
    def kind(self) -> ActionKind:
        return ActionKind.PLACE


@dataclass(frozen=True, slots=True)
class MarkDraining:
    """Write the drain mark every router reads; they stop sending new requests."""

    job_id: JobId
    model: str
    reason: str

    @property
    def kind(self) -> ActionKind:
        return ActionKind.MARK_DRAINING


@dataclass(frozen=True, slots=True)
class StopReplica:
    """Deregister (and purge) the replica's job: every group, every GPU it holds."""

    job_id: JobId
    model: str
    reason: str

    @property
    def kind(self) -> ActionKind:
        return ActionKind.STOP


@dataclass(frozen=True, slots=True)
class ClearDrainMark:
    job_id: JobId
    reason: str

    @property
    def kind(self) -> ActionKind:
        return ActionKind.CLEAR_DRAIN_MARK


@dataclass(frozen=True, slots=True)
class EndDrain:
    """Clear the operator's drain of ``model`` in its command record, if it is still the one
    drained under ``drained_key`` (the catalog changed the model since, which ends it)."""

    model: str
    drained_key: str
    reason: str

    @property
    def kind(self) -> ActionKind:
        return ActionKind.END_DRAIN


Action = PlaceReplica | MarkDraining | StopReplica | ClearDrainMark | EndDrain


# --- outcomes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    action: PlaceReplica
    profile_index: int
    fabric: str | None
    spec_hash: str
    # What Nomad warned about in the job when it was planned and registered, in its words.
    warnings: tuple[str, ...] = ()
    # Placed on a candidate without the spread, after those with it did not fit: why not.
    spread_refused: str = ""


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """Nomad's plan fits no candidate; ``explanation`` says why in words."""

    action: PlaceReplica
    explanation: str


@dataclass(frozen=True, slots=True)
class Deferred:
    """Not planned: a placement competing for the same GPUs registered earlier in this pass."""

    action: PlaceReplica


@dataclass(frozen=True, slots=True)
class Done:
    action: MarkDraining | StopReplica | ClearDrainMark | EndDrain


@dataclass(frozen=True, slots=True)
class Failed:
    """The action could not be done now (an HTTP error, a refused job); it is retried later."""

    action: Action
    error: str


Outcome = Placed | Unplaceable | Deferred | Done | Failed
