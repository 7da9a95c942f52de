"""``decide()`` as a table: one row per rule its docstring lists (and the unreadable
catalog), each row plain values in (what is wanted, what Nomad and Consul show, what the
planner remembers) and the decision's actions out, as an operator would read them."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from llmgw.core.catalog.model import ScalingMode
from llmgw.core.planning import (
    EMPTY_STATE,
    Action,
    AllocStatus,
    Desired,
    JobId,
    ModelCommand,
    NodeId,
    NodeStatus,
    Observed,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
    PlaceReplica,
    PlannerState,
    PlanningSettings,
    ReplicaId,
    decide,
    replica_job_id,
)
from llmgw.core.planning.desired import ModelTarget, ProfileTarget
from llmgw.core.planning.state import Backoff, ModelMemo, ReplicaMemo
from llmgw.core.records import HealthStatus
from llmgw.core.scaling import ScalingPolicy

NOW = 1_000_000.0
SETTINGS = PlanningSettings()
NODES = {
    NodeId(n): ObservedNode(NodeId(n), n, NodeStatus.READY, NOW - 3600, True, None) for n in ("n0", "n1")
}


def target(name: str, *, replicas: int = 1, gpu: str = "h100") -> ModelTarget:
    policy = ScalingPolicy(ScalingMode.KEEP_RUNNING, replicas, replicas, 600.0, 4.0, 60.0)
    profile = ProfileTarget(0, "key-0", frozenset({gpu}), 1, 600.0)
    return ModelTarget(name, (profile,), policy, key=f"model-key-{name}")


def wanted(*models: ModelTarget, commands: Mapping[str, ModelCommand] | None = None) -> Desired:
    return Desired("catalog-1", {m.name: m for m in models}, commands=commands or {})


def job_id(model: str, replica: str) -> JobId:
    return replica_job_id(model, ReplicaId(replica))


def replica(
    model: str,
    replica: str,
    *,
    node: str = "n0",
    status: AllocStatus = AllocStatus.RUNNING,
    stopped: bool = False,
    spec_hash: str = "spec-1",
) -> ObservedJob:
    alloc = ObservedAlloc(
        alloc_id=f"alloc-{replica}",
        group="rank0",
        node_id=NodeId(node),
        client_status=status,
        desired_run=not stopped,
        created_at=NOW - 1800,
        running_since=NOW - 1790 if status is AllocStatus.RUNNING else None,
        restarts=0,
    )
    return ObservedJob(
        job_id(model, replica),
        model,
        ReplicaId(replica),
        0,
        spec_hash,
        "catalog-1",
        "1.0",
        None,
        ("rank0",),
        NOW - 1800,
        stopped,
        (alloc,),
    )


def seen(*jobs: ObservedJob, healthy: tuple[JobId, ...] | None = None, **rest: object) -> Observed:
    """Nomad shows ``jobs`` on two ready nodes; Consul passes the ``healthy`` ones (default: all running)."""
    passing = [j.job_id for j in jobs if not j.stopped] if healthy is None else list(healthy)
    health = {j: HealthStatus.PASSING for j in passing}
    return Observed(jobs={j.job_id: j for j in jobs}, nodes=NODES, health=health, **rest)  # type: ignore[arg-type]


def said(action: Action) -> str:
    """An action as the operator reads it in the log."""
    if isinstance(action, PlaceReplica):
        where = " then ".join(
            f"away from {','.join(c.away_from)}" if c.away_from else "anywhere" for c in action.candidates
        )
        return f"place {action.job_id} ({action.why}: {where})"
    subject = getattr(action, "job_id", action.model)
    return f"{type(action).__name__} {subject}"


A1, A2, A9 = job_id("a", "r1"), job_id("a", "r2"), job_id("a", "r9")
NEW_A, NEW_B = job_id("a", "rgjdgxs"), job_id("b", "rgjdgxs")  # the first free replica id
A = target("a")
BACKING_OFF = PlannerState(models={"a": ModelMemo(backoff=Backoff(1, NOW + 60, "group rank0 failed on n0"))})
# This leader registered a replica of ``a`` a second ago; Nomad's view does not show it yet.
SETTLING = PlannerState(
    replicas={A9: ReplicaMemo("a", ReplicaId("r9"), NOW - 1, registered_at=NOW - 1, claim=A.claim)}
)
TWO_OF_A = (replica("a", "r1"), replica("a", "r2", node="n1"))
# The renderer would now give ``a`` another spec than the one it runs (``spec-1``).
SPEC_CHANGED = Desired("catalog-1", {"a": A}, expected_spec=lambda *_: "spec-2")
DRAINED_BY_OPERATOR = {"a": ModelCommand("a").drained(model_key=A.key, by="operator", at=NOW - 5)}

ROWS = {
    # (desired, observed, state) -> the actions, in the order the executor applies them
    "no catalog: nothing is stopped or placed": (
        None, seen(replica("a", "r1")), EMPTY_STATE, [],
    ),
    "1. a stopped job is purged": (
        wanted(A), seen(replica("a", "r1"), replica("a", "r2", stopped=True)), EMPTY_STATE,
        [f"StopReplica {A2}"],
    ),
    "1. a failed replica is stopped whole (and the backoff grows)": (
        wanted(A), seen(replica("a", "r1", status=AllocStatus.FAILED), healthy=()), EMPTY_STATE,
        [f"StopReplica {A1}"],
    ),
    "2. a draining replica whose requests finished is stopped": (
        wanted(A), seen(*TWO_OF_A, drain_marks={A2: NOW - 10}),
        EMPTY_STATE, [f"StopReplica {A2}"],
    ),
    "2. a draining replica still serving, before the drain timeout, stays": (
        wanted(A),
        seen(*TWO_OF_A, drain_marks={A2: NOW - 10}, in_flight={A2: 2}),
        EMPTY_STATE, [],
    ),
    "3. a model the catalog no longer has is drained away": (
        wanted(), seen(replica("a", "r1")), EMPTY_STATE, [f"MarkDraining {A1}"],
    ),
    "4. a replica beyond the wanted count is retired": (
        wanted(A), seen(*TWO_OF_A), EMPTY_STATE,
        [f"MarkDraining {A1}"],
    ),
    "5. a changed spec places one replica of the new spec before an old one drains": (
        SPEC_CHANGED, seen(replica("a", "r1")), EMPTY_STATE,
        [f"place {NEW_A} (roll: away from n0 then anywhere)"],
    ),
    "6. a missing replica is placed": (
        wanted(A), seen(), EMPTY_STATE, [f"place {NEW_A} (replace: anywhere)"],
    ),
    "6. nothing is placed while the model backs off": (
        wanted(A), seen(), BACKING_OFF, [],
    ),
    "6. an operator's drain makes the wanted count 0": (
        wanted(A, commands=DRAINED_BY_OPERATOR), seen(replica("a", "r1")), EMPTY_STATE,
        [f"MarkDraining {A1}"],
    ),
    "7. no placement competes with one still settling for the same GPUs": (
        wanted(A, target("b")), seen(), SETTLING, [],
    ),
    "7. another GPU model places from the same snapshot": (
        wanted(A, target("b", gpu="a100")), seen(), SETTLING, [f"place {NEW_B} (replace: anywhere)"],
    ),
    "8. a placement keeps away from the nodes of the model's other replicas first": (
        wanted(target("a", replicas=2)), seen(replica("a", "r1")), EMPTY_STATE,
        [f"place {NEW_A} (replace: away from n0 then anywhere)"],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("desired", "observed", "state", "actions"), ROWS.values(), ids=ROWS.keys())
def test_decide(desired: Desired | None, observed: Observed, state: PlannerState, actions: list[str]) -> None:
    decision = decide(desired, observed, state, NOW, SETTINGS)
    assert [said(a) for a in decision.actions] == actions


def test_a_failed_replica_grows_the_models_backoff_once() -> None:
    failed = seen(replica("a", "r1", status=AllocStatus.FAILED), healthy=())
    decision = decide(wanted(A), failed, EMPTY_STATE, NOW, SETTINGS)
    backoff = decision.state.models["a"].backoff
    assert backoff is not None and backoff.failures == 1 and backoff.retry_at > NOW
    assert backoff.last_failure == "group rank0 failed on n0"
    again = decide(wanted(A), failed, decision.state, NOW, SETTINGS)
    assert again.state.models["a"].backoff == backoff  # the same failure seen again is not a new one
