"""A replica whose group fetches its model first (the `fetch-model` prestart task of a
`mirror:` source), judged through the allocation states real Nomad reports on the way.

Nomad's client status is running while any task runs (``getClientStatus``,
client/allocrunner/alloc_runner.go, v2.0.6-dev), and a group's main tasks start only
once its prestart tasks are done. So a group that fetches is pending (placed), then
running (the fetch), then pending again (the fetch done, the engine's image pulled),
then running (the engine). A fetch longer than the placement timeout must not fail the
replica at the moment the fetch ends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from llmgw.control.observing import parse_alloc
from llmgw.core.planning import (
    AllocStatus,
    JobId,
    NodeId,
    NodeStatus,
    ObservedJob,
    ObservedNode,
    Phase,
    PlanningSettings,
    ReplicaId,
)
from llmgw.core.planning.replicas import assess

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the job's registration
S = PlanningSettings(placement_timeout=900)
LOAD_TIMEOUT = 3600.0
NODES = {NodeId("n1"): ObservedNode(NodeId("n1"), "gpu-1", NodeStatus.READY, T0, True, None)}
NEVER = "0001-01-01T00:00:00Z"  # Go's zero time, as Nomad writes a time not yet reached


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def task(state: str, started: float | None = None, finished: float | None = None) -> dict[str, Any]:
    return {
        "State": state,
        "Failed": False,
        "Restarts": 0,
        "StartedAt": at(started) if started is not None else NEVER,
        "FinishedAt": at(finished) if finished is not None else NEVER,
        "Events": [],
    }


def nomad_alloc(status: str, fetch: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    return {
        "ID": "1f0448e3-f147-4424-a522-de2be0b798d0",
        "JobID": "llmgw-m-r1",
        "TaskGroup": "rank-0",
        "NodeID": "n1",
        "ClientStatus": status,
        "DesiredStatus": "run",
        "CreateTime": int(T0 * 1e9),
        "TaskStates": {"fetch-model": fetch, "engine": engine},
    }


def judge(raw: dict[str, Any], now: float) -> tuple[Phase, str, float | None]:
    _, alloc = parse_alloc(raw)
    job = ObservedJob(
        JobId("llmgw-m-r1"), "m", ReplicaId("r1"), 0, "h", "c", "v", None, ("rank-0",), T0, False, (alloc,)
    )
    judged = assess(
        job,
        None,
        NODES,
        {},
        unhealthy_since=None,
        first_seen=T0,
        load_timeout=LOAD_TIMEOUT,
        now=now,
        settings=S,
    )
    return judged.phase, judged.reason, judged.deadline


FETCH_MINUTES = 40.0 * 60  # longer than the placement timeout (15 min)
FETCHING = nomad_alloc("running", task("running", started=30), task("pending"))
FETCHED = nomad_alloc("pending", task("dead", started=30, finished=30 + FETCH_MINUTES), task("pending"))
ENGINE_UP = nomad_alloc(
    "running", task("dead", started=30, finished=30 + FETCH_MINUTES), task("running", started=2600)
)


def test_parsing_tells_when_the_prestart_tasks_finished_only_while_the_engine_starts() -> None:
    assert parse_alloc(FETCHING)[1].prestart_done_at is None
    fetched = parse_alloc(FETCHED)[1]
    assert fetched.client_status is AllocStatus.PENDING
    assert (
        fetched.prestart_done_at is not None
        and abs(fetched.prestart_done_at - (T0 + 30 + FETCH_MINUTES)) < 1e-3
    )
    assert parse_alloc(ENGINE_UP)[1].prestart_done_at is None  # running: the engine's own start counts


def test_the_fetch_counts_as_loading_says_so_and_its_end_gives_the_image_pull_a_placement_window() -> None:
    phase, reason, deadline = judge(FETCHING, T0 + 600)
    assert phase is Phase.LOADING and deadline == T0 + 30 + LOAD_TIMEOUT  # getting the weights is loading
    assert (
        reason == "group rank-0 fetching the model's files from the mirror (health check not registered yet)"
    )

    # The fetch took 40 minutes: the engine's image pull starts now and has its own window.
    done = T0 + 30 + FETCH_MINUTES
    phase, reason, deadline = judge(FETCHED, done + 5)
    assert phase is Phase.PLACING, reason
    assert deadline is not None and abs(deadline - (done + S.placement_timeout)) < 1e-3
    assert "its engine starting after its prestart tasks" in reason

    phase, reason, _ = judge(FETCHED, done + S.placement_timeout + 1)
    assert phase is Phase.FAILED and "or its prestart tasks finished" in reason

    phase, reason, deadline = judge(ENGINE_UP, T0 + 2700)
    assert phase is Phase.LOADING and deadline == T0 + 2600 + LOAD_TIMEOUT
    assert reason == "engine loading (health check not registered yet)"


def test_a_group_never_started_keeps_the_window_from_its_registration() -> None:
    placed = nomad_alloc("pending", task("pending"), task("pending"))
    assert judge(placed, T0 + 899)[0] is Phase.PLACING
    phase, reason, _ = judge(placed, T0 + 901)
    assert phase is Phase.FAILED and "rank-0 pending" in reason
