"""Why a replica failed, in words: the failed task Nomad reports, and a job Nomad calls dead.

Nomad's JSON is parsed at the edge (``llmgw.control.observing.parse_alloc``, a pure
function); the judgement (``assess``) puts the task's failure into the replica's reason,
which the status shows and the model's backoff keeps as its last failure.
"""

from __future__ import annotations

from typing import Any

from llmgw.control.observing import parse_alloc
from llmgw.core.planning import (
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

T0 = 1_000_000.0
NODES = {NodeId("n1"): ObservedNode(NodeId("n1"), "gpu-1", NodeStatus.READY, T0, True, None)}


def event(kind: str, message: str = "") -> dict[str, Any]:
    return {"Type": kind, "Time": 0, "DisplayMessage": message, "Details": {}}


def task_state(state: str, failed: bool, finished: str, *events: dict[str, Any]) -> dict[str, Any]:
    return {
        "State": state,
        "Failed": failed,
        "Restarts": 0,
        "StartedAt": "2026-01-01T00:00:00Z",
        "FinishedAt": finished,
        "Events": list(events),
    }


def nomad_alloc(states: dict[str, Any], status: str = "failed") -> dict[str, Any]:
    return {
        "ID": "1f0448e3-f147-4424-a522-de2be0b798d0",
        "JobID": "llmgw-m-r1",
        "TaskGroup": "rank-0",
        "NodeID": "n1",
        "ClientStatus": status,
        "DesiredStatus": "run",
        "CreateTime": int(T0 * 1e9),
        "TaskStates": states,
    }


FETCH_FAILED = task_state(
    "dead",
    True,
    "2026-01-01T00:00:03Z",
    event("Received", "Task received by client"),
    event("Started", "Task started by client"),
    event("Terminated", "Exit Code: 1"),
    event("Not Restarting", 'Exceeded allowed attempts 0 in interval 5m0s and mode is "fail"'),
)
ENGINE_NEVER_STARTED = task_state("dead", False, "2026-01-01T00:00:04Z", event("Received"))


def test_the_first_failed_task_and_what_happened_to_it() -> None:
    _, alloc = parse_alloc(nomad_alloc({"fetch-model": FETCH_FAILED, "engine": ENGINE_NEVER_STARTED}))
    assert (alloc.failed_task, alloc.failure) == ("fetch-model", "Exit Code: 1")

    # Two failed tasks: the one that failed first failed the allocation.
    later = task_state("dead", True, "2026-01-01T00:00:09Z", event("Terminated", "Exit Code: 137, Signal: 9"))
    _, both = parse_alloc(nomad_alloc({"engine": later, "fetch-model": FETCH_FAILED}))
    assert both.failed_task == "fetch-model"

    driver = task_state("dead", True, "", event("Driver Failure", "failed to launch command with executor"))
    _, no_start = parse_alloc(nomad_alloc({"engine": driver}))
    assert (no_start.failed_task, no_start.failure) == ("engine", "failed to launch command with executor")

    _, running = parse_alloc(nomad_alloc({"engine": task_state("running", False, "")}, status="running"))
    assert (running.failed_task, running.failure) == (None, "")


def judge(*allocs: ObservedAlloc, stopped: bool = False) -> tuple[Phase, str]:
    job = ObservedJob(
        JobId("llmgw-m-r1"), "m", ReplicaId("r1"), 0, "h", "c", "v", None, ("rank-0",), T0, stopped, allocs
    )
    judged = assess(
        job,
        None,
        NODES,
        {},
        unhealthy_since=None,
        first_seen=T0,
        load_timeout=60,
        now=T0 + 10,
        settings=PlanningSettings(),
    )
    return judged.phase, judged.reason


def test_a_failed_fetch_says_the_files_did_not_verify_and_where_the_log_is() -> None:
    _, alloc = parse_alloc(nomad_alloc({"fetch-model": FETCH_FAILED, "engine": ENGINE_NEVER_STARTED}))
    phase, reason = judge(alloc)
    assert phase is Phase.FAILED
    assert reason == (
        "group rank-0 failed on gpu-1: the model's files failed to fetch or verify against the mirror "
        "(task fetch-model: Exit Code: 1; see nomad alloc logs -stderr 1f0448e3 fetch-model)"
    )


def test_another_task_is_named_with_nomads_words() -> None:
    crashed = task_state("dead", True, "2026-01-01T00:00:09Z", event("Terminated", "Exit Code: 3"))
    _, alloc = parse_alloc(nomad_alloc({"engine": crashed}))
    assert judge(alloc)[1] == (
        "group rank-0 failed on gpu-1: task engine: Exit Code: 3 "
        "(see nomad alloc logs -stderr 1f0448e3 engine)"
    )


def test_a_job_nomad_calls_dead_because_its_allocation_failed_is_a_failure_not_a_stop() -> None:
    _, failed = parse_alloc(nomad_alloc({"fetch-model": FETCH_FAILED, "engine": ENGINE_NEVER_STARTED}))
    phase, reason = judge(failed, stopped=True)
    assert phase is Phase.FAILED and "fetch or verify" in reason
    # Stopped with nothing failed (llmgw or an operator stopped it): only purged.
    _, done = parse_alloc(nomad_alloc({"engine": task_state("dead", False, "")}, status="complete"))
    assert judge(done, stopped=True)[0] is Phase.STOPPED
    assert judge(stopped=True)[0] is Phase.STOPPED


def test_a_docker_driver_refusal_names_the_client_setting_that_fixes_it() -> None:
    # Nomad v2.0.5 drivers/docker/driver.go, StartTask wrapping createContainerConfig's error.
    refused = (
        'Failed to create container configuration for image "vllm/vllm-openai:v0.11.0" '
        '("sha256:9f2c"): cannot apply "ipc_mode" configuration'
    )
    driver = task_state("dead", True, "2026-01-01T00:00:02Z", event("Driver Failure", refused))
    _, alloc = parse_alloc(nomad_alloc({"engine": driver}))
    reason = judge(alloc)[1]
    assert reason.startswith(f"group rank-0 failed on gpu-1: task engine: {refused} (needs ")
    assert "allowed_modes { ipc = [...] }" in reason

    volumes = 'Failed to create container configuration for image "x" ("y"): volumes are not enabled; '
    volumes += 'cannot mount host path: "/var/lib/llmgw/models:/var/lib/llmgw/models:ro"'
    _, alloc = parse_alloc(
        nomad_alloc({"engine": task_state("dead", True, "", event("Driver Failure", volumes))})
    )
    assert 'plugin "docker" { config { volumes { enabled = true } } }' in judge(alloc)[1]

    runtime = 'Failed to create container configuration for image "x" ("y"): '
    runtime += 'requested docker runtime "nvidia" was not found'
    _, alloc = parse_alloc(
        nomad_alloc({"engine": task_state("dead", True, "", event("Driver Failure", runtime))})
    )
    assert "NVIDIA Container Toolkit" in judge(alloc)[1]

    # A failure no client setting fixes keeps Nomad's words alone.
    _, alloc = parse_alloc(
        nomad_alloc({"engine": task_state("dead", True, "", event("Driver Failure", "boom"))})
    )
    assert alloc.failure == "boom"
