"""What the reconciler sees of the cluster, as plain values: llmgw's jobs, their allocations,
the nodes, health, drain marks and demand.

Owns: the shape of one observation (``Observed``) and the job id rule every part agrees on.
Must not: parse Nomad's or Consul's JSON (``llmgw.control.observing`` does, at the edge) or
hold jobs llmgw did not create (they are filtered out before they get here).
Times are unix seconds as floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

from llmgw.core.names import slug
from llmgw.core.records import HealthStatus
from llmgw.core.scaling import ModelDemand

JobId = NewType("JobId", str)
ReplicaId = NewType("ReplicaId", str)
NodeId = NewType("NodeId", str)

JOB_PREFIX = "llmgw-"


def replica_job_id(model: str, replica_id: ReplicaId) -> JobId:
    """``llmgw-<model slug>-<replica id>``: the Nomad job id of one replica.

    The renderer uses the same rule; the executor checks the two agree before it registers.
    """
    return JobId(f"{JOB_PREFIX}{slug(model)}-{replica_id}")


class AllocStatus(StrEnum):
    """Nomad's ``ClientStatus`` of an allocation."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    LOST = "lost"
    UNKNOWN = "unknown"  # the node is disconnected; the allocation may still run

    @property
    def terminal(self) -> bool:
        return self in (AllocStatus.COMPLETE, AllocStatus.FAILED, AllocStatus.LOST)


class NodeStatus(StrEnum):
    """Nomad's node ``Status``."""

    INITIALIZING = "initializing"
    READY = "ready"
    DOWN = "down"  # missed heartbeats
    DISCONNECTED = "disconnected"  # missed heartbeats, allocations with a disconnect block kept


@dataclass(frozen=True, slots=True)
class ObservedAlloc:
    alloc_id: str
    group: str  # the task group: one per node (rank) of a replica
    node_id: NodeId
    client_status: AllocStatus
    desired_run: bool  # DesiredStatus "run" (not stop or evict)
    created_at: float
    running_since: float | None  # when its tasks last started, if they run
    restarts: int  # task restarts inside this allocation
    gpus: tuple[str, ...] = ()  # device instance ids, for the status only
    # The task whose failure failed the allocation (the first to fail), and Nomad's words
    # for what happened to it ("Exit Code: 1", a driver error), for the status only.
    failed_task: str | None = None
    failure: str = ""
    # A pending allocation whose prestart tasks (llmgw's model fetch, a rank's
    # rendezvous) ran to completion: when the last of them finished. Its engine task is
    # starting (the driver pulls its image), and the allocation went from running back
    # to pending: Nomad's status is running only while a task runs.
    prestart_done_at: float | None = None
    running_tasks: tuple[str, ...] = ()  # the tasks Nomad shows running, by name, sorted
    # An ``unknown`` allocation: since when (Nomad's ``LastUnknown``, from its AllocStates).
    # Nomad's ``disconnect { lost_after }`` counts from this moment, and it is written once
    # per disconnection, so it is the lost-node clock that survives a new leader: the
    # node's StatusUpdatedAt is rewritten every heartbeat TTL plus grace while it is
    # disconnected (nomad/heartbeat.go, ``invalidateHeartbeat``, v2.0.5).
    unknown_since: float | None = None
    # When a task of it was last restarted by Nomad's restart policy (TaskState.LastRestart):
    # a restarting task puts its allocation back to pending, and that wait is the restart
    # policy's, not a placement's.
    restarted_at: float | None = None

    @property
    def gpus_giving_back(self) -> int:
        """The GPUs this allocation, told to stop, holds until its tasks have exited: Nomad
        counts its devices as used until its client reports it terminal (``ProposedAllocs``
        in scheduler/feasible/context.go). Not an ``unknown`` one: its node is unreachable
        and gives nothing back until it returns or its ``lost_after`` runs out."""
        running = self.client_status in (AllocStatus.PENDING, AllocStatus.RUNNING)
        return len(self.gpus) if not self.desired_run and running else 0


@dataclass(frozen=True, slots=True)
class ObservedJob:
    """One Nomad job carrying ``llmgw_managed_by = llmgw``."""

    job_id: JobId
    model: str
    replica_id: ReplicaId
    profile_index: int
    spec_hash: str
    catalog_hash: str
    version: str
    fabric: str | None
    groups: tuple[str, ...]  # the task groups the job declares
    submitted_at: float
    stopped: bool  # Stop set, or the job is dead: it runs nothing and only needs purging
    allocs: tuple[ObservedAlloc, ...] = ()
    # The model's restart generation when it was placed (job meta; 0 when absent).
    restart_generation: int = 0


@dataclass(frozen=True, slots=True)
class ObservedNode:
    node_id: NodeId
    name: str
    status: NodeStatus
    status_since: float | None  # Nomad's StatusUpdatedAt
    eligible: bool
    fabric: str | None  # node meta llmgw_fabric


@dataclass(frozen=True, slots=True)
class Observed:
    """One consistent view, taken just before a pass."""

    jobs: Mapping[JobId, ObservedJob] = field(default_factory=dict)
    nodes: Mapping[NodeId, ObservedNode] = field(default_factory=dict)
    # Consul's health of each replica's rank-0 endpoint (best instance per job).
    health: Mapping[JobId, HealthStatus] = field(default_factory=dict)
    # Drain marks found in Consul KV: job id -> when the mark was set.
    drain_marks: Mapping[JobId, float] = field(default_factory=dict)
    # Every router's use, aggregated per model (``llmgw.core.scaling.aggregate_demand``).
    demand: Mapping[str, ModelDemand] = field(default_factory=dict)
    # Requests still running on a replica, where an engine probe could tell.
    in_flight: Mapping[JobId, int] = field(default_factory=dict)
    # Changes whenever capacity may have been freed or added (a node became ready, an
    # allocation ended); unplaceable models are planned again when it moves.
    capacity_version: int = 0
    # The GPUs of llmgw's allocations told to stop whose client, still reachable, has not
    # reported their tasks exited (shutdown_delay, then the kill), purged jobs' included. Nomad counts
    # their devices as used until then (``ProposedAllocs`` in scheduler/feasible/context.go
    # drops only client-terminal allocations), so a plan that needs them says "does not fit"
    # for now, and capacity_version moves when they end.
    gpus_freeing: int = 0
