"""Small values of the planner: GPU claims, status JSON, Nomad JSON parsing."""

from __future__ import annotations

import pytest

from llmgw.control.observing import parse_alloc, parse_job, parse_node, parse_time
from llmgw.core.catalog import Catalog
from llmgw.core.planning import (
    AllocStatus,
    BackoffStatus,
    ModelStatus,
    NodeStatus,
    Phase,
    ReplicaStatus,
    StatusDecodeError,
    StatusReport,
    claims_conflict,
    profile_claim,
    replica_job_id,
)
from llmgw.core.planning.status import from_json, to_json


def test_gpu_claims() -> None:
    profiles = (
        Catalog.model_validate(
            {
                "models": {
                    "m": {
                        "profiles": [
                            {"engine": "sim", "tp": 1, "gpu": {"model": "H100"}},
                            {"engine": "sim", "tp": 1, "gpu": {"model": "A100"}},
                            {"engine": "sim", "tp": 1},
                            {"engine": "sim", "simulate_gpus": False},
                        ]
                    }
                }
            }
        )
        .models["m"]
        .profiles
    )
    h100, a100, any_gpu, none = (profile_claim(p) for p in profiles)
    assert not claims_conflict(h100, a100)
    assert claims_conflict(h100, h100) and claims_conflict(any_gpu, a100)
    assert not claims_conflict(none, any_gpu)


def test_job_ids_follow_the_renderers_rule() -> None:
    from llmgw.render import job_id_for

    assert replica_job_id("meta-llama/Llama-3.1-8B", "r1a2b3c") == job_id_for(
        "meta-llama/Llama-3.1-8B", "r1a2b3c"
    )


def test_status_round_trips_through_json() -> None:
    report = StatusReport(
        generated_at=1.5,
        catalog_hash="abc",
        leader="control-1",
        note="",
        models=(
            ModelStatus(
                model="m",
                mode="keep-running",
                desired=2,
                healthy=1,
                scaling="min 2",
                waiting="backing off",
                backoff=BackoffStatus(2, 100.0, "group rank1 failed"),
                replicas=(
                    ReplicaStatus(
                        "llmgw-m-r1",
                        "r1",
                        0,
                        "fab-a",
                        Phase.HEALTHY,
                        "passing",
                        ("n1", "n2"),
                        ("g0",),
                        False,
                        False,
                        True,
                        "passing",
                    ),
                ),
            ),
        ),
    )
    assert from_json(to_json(report)) == report
    with pytest.raises(StatusDecodeError):
        from_json('{"generated_at": "soon"}')


def test_parsing_nomad_json_keeps_only_llmgw_jobs() -> None:
    assert parse_job({"ID": "x", "Meta": {"owner": "else"}}) is None
    job = parse_job(
        {
            "ID": "llmgw-m-r1",
            "Meta": {
                "llmgw_managed_by": "llmgw",
                "llmgw_model": "m",
                "llmgw_profile": "1",
                "llmgw_replica": "r1",
                "llmgw_spec_hash": "h",
            },
            "JobSummary": {"Summary": {"rank1": {}, "rank0": {}}},
            "SubmitTime": 1_700_000_000_500_000_000,
            "Status": "running",
        }
    )
    assert job is not None
    assert (job.profile_index, job.groups, job.submitted_at, job.stopped) == (
        1,
        ("rank0", "rank1"),
        1_700_000_000.5,
        False,
    )
    job_id, alloc = parse_alloc(
        {
            "ID": "a1",
            "JobID": "llmgw-m-r1",
            "TaskGroup": "rank0",
            "NodeID": "n1",
            "ClientStatus": "running",
            "DesiredStatus": "run",
            "CreateTime": 1_700_000_000_000_000_000,
            "TaskStates": {
                "engine": {"State": "running", "StartedAt": "2023-11-14T22:13:25.123456789Z", "Restarts": 1}
            },
        }
    )
    assert job_id == "llmgw-m-r1" and alloc.client_status is AllocStatus.RUNNING and alloc.restarts == 1
    assert alloc.running_since == pytest.approx(1_700_000_005.123456)
    node = parse_node({"ID": "n1", "Name": "gpu-1", "Status": "disconnected", "Meta": {"llmgw_fabric": "f"}})
    assert (node.status, node.fabric, node.eligible) == (NodeStatus.DISCONNECTED, "f", True)
    assert parse_time("0001-01-01T00:00:00Z") is None


def _state(value: str, at: str) -> dict[str, object]:
    return {"Field": 0, "Value": value, "Time": at}


@pytest.mark.parametrize(
    ("states", "since"),
    [
        (None, None),  # a list stub: no AllocStates
        ([_state("unknown", "2026-12-04T10:00:00Z")], "2026-12-04T10:00:00Z"),
        # Nomad's LastUnknown: the earliest unknown of the latest run (a rewrite adds another).
        (
            [
                _state("unknown", "2026-12-04T09:00:00Z"),
                _state("running", "2026-12-04T09:30:00Z"),
                _state("unknown", "2026-12-04T10:00:00Z"),
                _state("unknown", "2026-12-04T10:05:00Z"),
            ],
            "2026-12-04T10:00:00Z",
        ),
        ([{"Field": 1, "Value": "unknown", "Time": "2026-12-04T10:00:00Z"}], None),  # not ClientStatus
        ([_state("unknown", "not a time"), "junk"], None),
    ],
)
def test_an_unknown_allocation_carries_nomads_last_unknown(states: object, since: str | None) -> None:
    raw = {"ID": "a1", "JobID": "llmgw-m-r1", "TaskGroup": "rank0", "ClientStatus": "unknown"}
    if states is not None:
        raw["AllocStates"] = states
    _, alloc = parse_alloc(raw)
    assert alloc.unknown_since == (parse_time(since) if since else None)
    # A running allocation's old unknown entries say nothing about now.
    _, back = parse_alloc({**raw, "ClientStatus": "running"})
    assert back.unknown_since is None


def test_a_restarted_task_gives_its_allocation_the_restart_time() -> None:
    task = {"State": "pending", "Restarts": 1, "LastRestart": "2026-12-04T10:00:00.5Z"}
    _, alloc = parse_alloc(
        {
            "ID": "a1",
            "JobID": "j",
            "TaskGroup": "g",
            "ClientStatus": "pending",
            "TaskStates": {"engine": task},
        }
    )
    assert alloc.restarted_at == parse_time("2026-12-04T10:00:00.5Z")
    never = {**task, "Restarts": 0, "LastRestart": "0001-01-01T00:00:00Z"}
    _, fresh = parse_alloc(
        {
            "ID": "a1",
            "JobID": "j",
            "TaskGroup": "g",
            "ClientStatus": "pending",
            "TaskStates": {"engine": never},
        }
    )
    assert fresh.restarted_at is None
