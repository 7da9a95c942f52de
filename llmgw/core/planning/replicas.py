"""Judging one replica from what Nomad and Consul show: placing, loading, healthy, unreachable
or failed, with the reason in words and the time the judgement would change.

Owns: the failure rules. A replica is one Nomad job with one task group per node; Nomad
replaces a lost group alone and has no gang scheduling, so any failed or lost group,
a restarted rank of a multi-node replica, a placement or load timeout, or a health
check failing too long makes the whole replica FAILED (the caller stops it whole).
A node that is down or disconnected is first only unreachable: its replicas are kept
until the node has been down for ``node_lost_grace``.

Must not: decide what to do about it (``deciding``) or read a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llmgw.core import acl_refusals
from llmgw.core.planning.observed import (
    AllocStatus,
    NodeId,
    NodeStatus,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
)
from llmgw.core.planning.settings import PlanningSettings
from llmgw.core.planning.status import Phase
from llmgw.core.records import HealthStatus


@dataclass(frozen=True, slots=True)
class Assessment:
    phase: Phase
    reason: str
    deadline: float | None  # when this judgement changes by itself (a timeout)
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]
    lost_node: bool = False  # FAILED because a node is lost (not the replica's own fault)


def assess(
    job: ObservedJob,
    health: HealthStatus | None,
    nodes: Mapping[NodeId, ObservedNode],
    node_down_since: Mapping[NodeId, float],
    *,
    # Set once a replica that was healthy stops passing: since when it has not passed.
    unhealthy_since: float | None,
    first_seen: float,
    load_timeout: float,
    now: float,
    settings: PlanningSettings,
) -> Assessment:
    current = _current_allocs(job)
    node_names = tuple(
        sorted({nodes[a.node_id].name if a.node_id in nodes else str(a.node_id) for a in current.values()})
    )
    gpus = tuple(g for a in current.values() for g in a.gpus)

    def judged(phase: Phase, reason: str, deadline: float | None = None, lost: bool = False) -> Assessment:
        return Assessment(phase, reason, deadline, node_names, gpus, lost)

    # Nomad calls a job whose only allocation failed "dead": that is a failure (it counts
    # towards the model's backoff), not a stop.
    if job.stopped and not any(a.client_status is AllocStatus.FAILED for a in job.allocs):
        return judged(Phase.STOPPED, "the job is stopped in Nomad")

    multi = len(job.groups) > 1
    # A rank of a multi-node replica that fails, exits or restarts while another rank's node
    # is down or disconnected lost its peer: the replica is lost with the node (rebuilt at
    # once, and not held against the model's backoff).
    peer_lost = _peer_trouble(job, nodes, node_down_since, now, settings) if multi else None
    unreachable_until: float | None = None
    unreachable_why = ""
    for alloc in job.allocs:
        node = nodes.get(alloc.node_id)
        where = node.name if node else str(alloc.node_id)
        stopped_serving = (
            alloc.client_status in (AllocStatus.FAILED, AllocStatus.COMPLETE) or alloc.restarts > 0
        )
        if peer_lost is not None and peer_lost[0] != alloc.alloc_id and alloc.desired_run and stopped_serving:
            return judged(
                Phase.FAILED,
                f"{peer_lost[1]}: group {alloc.group} on {where} stopped serving without it",
                lost=True,
            )
        if alloc.client_status is AllocStatus.FAILED:
            return judged(Phase.FAILED, f"group {alloc.group} failed on {where}{_failure_words(alloc)}")
        if alloc.client_status is AllocStatus.COMPLETE and alloc.desired_run:
            # A service's engine that exits, even with status 0, no longer serves.
            return judged(Phase.FAILED, f"group {alloc.group} exited on {where}")
        if not alloc.client_status.terminal or alloc.client_status is AllocStatus.LOST:
            trouble = _node_trouble(node, alloc, node_down_since, now, settings)
            if trouble is not None:
                lost_at, what = trouble
                if now >= lost_at:
                    return judged(
                        Phase.FAILED,
                        f"node {where} {what} for more than {settings.node_lost_grace:g}s: "
                        f"group {alloc.group} is lost",
                        lost=True,
                    )
                if unreachable_until is None or lost_at < unreachable_until:
                    unreachable_until, unreachable_why = lost_at, f"node {where} {what}"
                continue
            if alloc.client_status is AllocStatus.LOST:
                # Nomad marks allocations lost only with their node.
                return judged(Phase.FAILED, f"group {alloc.group} was lost on {where}", lost=True)
        if multi and alloc.restarts > 0 and alloc.desired_run:
            return judged(
                Phase.FAILED,
                f"group {alloc.group} restarted on {where}: the ranks of a multi-node replica "
                "cannot rejoin a running one",
            )
    if unreachable_until is not None:
        return judged(Phase.UNREACHABLE, f"{unreachable_why}; kept until it is lost", unreachable_until)

    missing = [
        g for g in job.groups if g not in current or current[g].client_status is not AllocStatus.RUNNING
    ]
    if missing:
        # A group whose prestart tasks are done (the model fetched, the head found) is
        # pending again while its engine's image is pulled: that pull gets the placement
        # window from then, so a long fetch does not use it up.
        since = [
            max(job.submitted_at, current[g].prestart_done_at or 0.0) if g in current else job.submitted_at
            for g in missing
        ]
        deadline = min(since) + settings.placement_timeout
        detail = ", ".join(_placing_words(g, current.get(g)) for g in missing)
        if now >= deadline:
            return judged(
                Phase.FAILED,
                f"not every group running {settings.placement_timeout:g}s after it was registered "
                f"or its prestart tasks finished ({detail})",
            )
        return judged(Phase.PLACING, f"waiting for {detail}", deadline)

    if health is HealthStatus.PASSING:
        return judged(Phase.HEALTHY, "passing")
    if unhealthy_since is not None:
        deadline = unhealthy_since + settings.health_lost_timeout
        if now >= deadline:
            return judged(Phase.FAILED, f"health check not passing for {settings.health_lost_timeout:g}s")
        return judged(Phase.UNHEALTHY, f"health check {health or 'missing'}", deadline)
    started = [a.running_since for a in current.values() if a.running_since is not None]
    running_since = max(started) if len(started) == len(current) else max([first_seen, *started])
    deadline = running_since + load_timeout
    if now >= deadline:
        return judged(Phase.FAILED, f"not healthy {load_timeout:g}s after its engine started (load timeout)")
    reason = f"engine loading (health check {health or 'not registered yet'})"
    preparing = [
        f"group {g} {TASK_PREPARING_WORDS[a.running_tasks[0]]}"
        for g, a in sorted(current.items())
        if len(a.running_tasks) == 1 and a.running_tasks[0] in TASK_PREPARING_WORDS
    ]
    if preparing:  # the engine has not started yet: say what runs before it
        reason = "; ".join(preparing) + f" (health check {health or 'not registered yet'})"
        if _head_runs_while_a_worker_waits(current):
            reason += f"; rank 0's engine runs: if this lasts, {acl_refusals.RANKS_UNREAD}"
    return judged(Phase.LOADING, reason, deadline)


def _head_runs_while_a_worker_waits(current: Mapping[str, ObservedAlloc]) -> bool:
    """A worker rank still waits for the head's address while some other group's engine
    runs: what a worker whose Consul reads are filtered (or refused) looks like."""
    waiting = any(a.running_tasks == ("await-head",) for a in current.values())
    preparing = set(TASK_PREPARING_WORDS)
    engine = any(a.running_tasks and not set(a.running_tasks) & preparing for a in current.values())
    return waiting and engine


def _placing_words(group: str, alloc: ObservedAlloc | None) -> str:
    if alloc is None:
        return f"{group} not placed"
    if alloc.prestart_done_at is not None:
        return f"{group} {alloc.client_status} (its engine starting after its prestart tasks)"
    return f"{group} {alloc.client_status}"


# What one of llmgw's own prestart tasks is doing while it runs, and its engine waits
# (their names are set in templates/_macros.hcl.j2 and llmgw.render.context).
TASK_PREPARING_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "fetch-model": "fetching the model's files from the mirror",
        "await-head": "waiting for its replica's head to register",
        "await-ranks": "waiting for its replica's other ranks to register",
    }
)


# What the failure of one of llmgw's own prestart tasks means (their names are set in
# templates/_macros.hcl.j2 and llmgw.render.context).
TASK_FAILURE_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "fetch-model": "the model's files failed to fetch or verify against the mirror",
        "await-head": (
            "the rank gave up waiting for its replica's head (rendezvous timeout); if rank 0 ran, "
            + acl_refusals.RANKS_UNREAD
        ),
        "await-ranks": "the head gave up waiting for its replica's other ranks (rendezvous timeout)",
    }
)


def _failure_words(alloc: ObservedAlloc) -> str:
    """``: what it means (task T: Nomad's words; where its log is)``, when Nomad said which task failed."""
    if alloc.failed_task is None:
        return ""
    task = alloc.failed_task
    told = f"task {task}: {alloc.failure}" if alloc.failure else f"task {task} failed"
    logs = f"see nomad alloc logs -stderr {alloc.alloc_id[:8]} {task}"
    meaning = TASK_FAILURE_WORDS.get(task)
    return f": {meaning} ({told}; {logs})" if meaning else f": {told} ({logs})"


def _current_allocs(job: ObservedJob) -> dict[str, ObservedAlloc]:
    """Per group, the allocation that stands for it now: the newest one Nomad wants running."""
    out: dict[str, ObservedAlloc] = {}
    for alloc in job.allocs:
        if not alloc.desired_run:
            continue
        best = out.get(alloc.group)
        if best is None or alloc.created_at > best.created_at:
            out[alloc.group] = alloc
    return out


def _peer_trouble(
    job: ObservedJob,
    nodes: Mapping[NodeId, ObservedNode],
    node_down_since: Mapping[NodeId, float],
    now: float,
    settings: PlanningSettings,
) -> tuple[str, str] | None:
    """(allocation id, what) of the first live allocation of ``job`` whose node is in trouble."""
    for alloc in job.allocs:
        if not alloc.desired_run or (
            alloc.client_status.terminal and alloc.client_status is not AllocStatus.LOST
        ):
            continue
        node = nodes.get(alloc.node_id)
        trouble = _node_trouble(node, alloc, node_down_since, now, settings)
        if trouble is not None:
            return alloc.alloc_id, f"node {node.name if node else alloc.node_id} {trouble[1]}"
    return None


def _node_trouble(
    node: ObservedNode | None,
    alloc: ObservedAlloc,
    node_down_since: Mapping[NodeId, float],
    now: float,
    settings: PlanningSettings,
) -> tuple[float, str] | None:
    """(when the node counts as lost, what is wrong) if the allocation's node is unreachable."""
    if node is None:
        # A node Nomad forgot (garbage-collected after being down long): lost already.
        if alloc.client_status in (AllocStatus.UNKNOWN, AllocStatus.LOST):
            return now, "is gone"
        return None
    if node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
        since = node_down_since.get(node.node_id, node.status_since if node.status_since is not None else now)
        return since + settings.node_lost_grace, f"is {node.status}"
    if alloc.client_status is AllocStatus.UNKNOWN:
        # Nomad has not caught up with a node that is back; wait for the next update.
        since = node_down_since.get(node.node_id, now)
        return since + settings.node_lost_grace, "reports the allocation unknown"
    return None
