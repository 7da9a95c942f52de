"""Judging one replica from Nomad's and Consul's view, as a table of situations."""

from __future__ import annotations

from llmgw.core.planning import (
    AllocStatus,
    JobId,
    NodeId,
    NodeStatus,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
    Phase,
    PlanningSettings,
    ReplicaId,
)
from llmgw.core.planning.replicas import assess
from llmgw.core.records import HealthStatus

T0 = 1_000_000.0
S = PlanningSettings(placement_timeout=600, node_lost_grace=300, health_lost_timeout=120)
NODES = {
    NodeId("a"): ObservedNode(NodeId("a"), "gpu-a", NodeStatus.READY, T0, True, "f"),
    NodeId("b"): ObservedNode(NodeId("b"), "gpu-b", NodeStatus.READY, T0, True, "f"),
}


def alloc(
    group: str, node: str = "a", status: AllocStatus = AllocStatus.RUNNING, **kw: object
) -> ObservedAlloc:
    fields: dict[str, object] = {
        "alloc_id": f"{group}-{node}",
        "group": group,
        "node_id": NodeId(node),
        "client_status": status,
        "desired_run": True,
        "created_at": T0,
        "running_since": T0 + 5 if status is AllocStatus.RUNNING else None,
        "restarts": 0,
    }
    fields.update(kw)
    return ObservedAlloc(**fields)  # type: ignore[arg-type]


def job(
    *allocs: ObservedAlloc, groups: tuple[str, ...] = ("rank0", "rank1"), stopped: bool = False
) -> ObservedJob:
    return ObservedJob(
        JobId("llmgw-m-r1"), "m", ReplicaId("r1"), 0, "h", "c", "v", "f", groups, T0, stopped, allocs
    )


def judge(j: ObservedJob, now: float, health: HealthStatus | None = None, nodes=NODES, unhealthy_since=None):  # type: ignore[no-untyped-def]
    return assess(
        j,
        health,
        nodes,
        {},
        unhealthy_since=unhealthy_since,
        first_seen=T0,
        load_timeout=900,
        now=now,
        settings=S,
    )


def test_phases() -> None:
    both = (alloc("rank0", "a"), alloc("rank1", "b"))
    assert judge(job(alloc("rank0")), T0 + 10).phase is Phase.PLACING
    assert judge(job(alloc("rank0")), T0 + 601).phase is Phase.FAILED
    assert judge(job(*both), T0 + 60).phase is Phase.LOADING
    assert judge(job(*both), T0 + 60).deadline == T0 + 5 + 900
    assert judge(job(*both), T0 + 906).phase is Phase.FAILED
    assert judge(job(*both), T0 + 60, HealthStatus.PASSING).phase is Phase.HEALTHY
    assert judge(job(*both), T0 + 60, HealthStatus.CRITICAL, unhealthy_since=T0 + 50).phase is Phase.UNHEALTHY
    assert judge(job(*both), T0 + 171, HealthStatus.CRITICAL, unhealthy_since=T0 + 50).phase is Phase.FAILED
    assert judge(job(*both, stopped=True), T0 + 60).phase is Phase.STOPPED


def test_any_failed_or_restarted_shard_fails_the_replica() -> None:
    failed = judge(job(alloc("rank0"), alloc("rank1", "b", AllocStatus.FAILED)), T0 + 60)
    assert failed.phase is Phase.FAILED and failed.reason == "group rank1 failed on gpu-b"
    restarted = judge(job(alloc("rank0"), alloc("rank1", "b", restarts=1)), T0 + 60)
    assert restarted.phase is Phase.FAILED and "restarted" in restarted.reason
    # One node, one group: a restart in place is Nomad's restart policy at work, not a failure.
    single = judge(job(alloc("rank0", restarts=2), groups=("rank0",)), T0 + 60)
    assert single.phase is Phase.LOADING


def test_a_down_node_is_unreachable_first_and_lost_after_the_grace() -> None:
    nodes = dict(NODES)
    nodes[NodeId("b")] = ObservedNode(NodeId("b"), "gpu-b", NodeStatus.DOWN, T0 + 100, True, "f")
    j = job(alloc("rank0"), alloc("rank1", "b", AllocStatus.LOST))
    unreachable = judge(j, T0 + 200, nodes=nodes)
    assert unreachable.phase is Phase.UNREACHABLE and unreachable.deadline == T0 + 400
    lost = judge(j, T0 + 400, nodes=nodes)
    assert lost.phase is Phase.FAILED and lost.lost_node and "node gpu-b is down" in lost.reason


def test_a_lost_allocation_on_a_healthy_node_is_a_failure_at_once() -> None:
    j = job(alloc("rank0"), alloc("rank1", "b", AllocStatus.LOST))
    assert judge(j, T0 + 60).phase is Phase.FAILED
