"""Deployments through the HTTP API, as Nomad makes them for a job's first run.

With no ``update`` block Nomad's default strategy applies (``api.DefaultUpdateStrategy``:
max_parallel 1, healthy deadline 5 min, progress deadline 10 min), so every service job
gets a deployment; ``max_parallel = 0`` is the empty strategy that gets none. After a
failed deployment Nomad places only replacements of lost allocations: a group still
waiting for room is never placed (reconcile_cluster.go, placeAllocs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nomad

from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn

from .conftest import assert_shape, call, fast_config, group, wait_for

S = 1_000_000_000
MS = S // 1000
BOTH_GPUS = [{"Name": "nvidia/gpu", "Count": 2}]


def crash_looping(name: str) -> dict[str, Any]:
    """A group whose task exits at once and waits 5 s for each restart: never healthy."""
    doc = group(name, RestartPolicy={"Attempts": 3, "Interval": 600 * S, "Delay": 5 * S, "Mode": "fail"})
    doc["Tasks"][0]["Config"] = {"command": "/bin/false"}
    return doc


def job_with_waiting_group(job_id: str, update: dict[str, Any] | None) -> dict[str, Any]:
    # "a" places at once and never becomes healthy; "b" needs the GPUs the filler holds.
    job: dict[str, Any] = {
        "ID": job_id,
        "TaskGroups": [crash_looping("a"), group("b", devices=BOTH_GPUS)],
    }
    fast = {"MinHealthyTime": 300 * MS, "HealthyDeadline": 1500 * MS, "ProgressDeadline": 3 * S}
    job["Update"] = {**fast, "HealthCheck": "task_states", **(update or {})}
    return job


async def run_scenario(tmp_path: Path, update: dict[str, Any] | None) -> tuple[nomad.Nomad, NomadServer]:
    solo = (NodeSpec(name="solo", gpus=2, gpu_model="H100", fabric="ib-0"),)
    server = NomadServer(NomadStandIn(fast_config(tmp_path, nodes=solo)))
    await server.start()
    client = nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)
    filler = {"ID": "filler", "Update": {"MaxParallel": 0}, "TaskGroups": [group("g", devices=BOTH_GPUS)]}
    await call(client.jobs.register_job, {"Job": filler})
    await wait_for(
        lambda: [a for a in client.job.get_allocations("filler") if a["ClientStatus"] == "running"], "filler"
    )
    await call(client.jobs.register_job, {"Job": job_with_waiting_group("llm", update)})
    await wait_for(
        lambda: [e for e in client.job.get_evaluations("llm") if e["Status"] == "blocked"],
        "b waiting for room",
    )
    return client, server


async def test_a_failed_deployment_leaves_a_waiting_group_unplaced(tmp_path: Path) -> None:
    client, server = await run_scenario(tmp_path, update=None)
    try:
        failed = await wait_for(
            lambda: [d for d in client.job.get_deployments("llm") if d["Status"] == "failed"],
            "the deployment failed by a never-healthy allocation",
        )
        assert_shape(failed, "Deployment")
        deployment = failed[0]
        assert deployment["StatusDescription"] == "Failed due to unhealthy allocations"
        assert deployment["TaskGroups"]["a"]["UnhealthyAllocs"] == 1
        assert deployment["TaskGroups"]["b"]["PlacedAllocs"] == 0
        (a,) = await call(client.job.get_allocations, "llm")
        whole = await call(client.allocation.get_allocation, a["ID"])
        assert whole["DeploymentID"] == deployment["ID"]
        assert whole["DeploymentStatus"]["Healthy"] is False

        # Room comes: the blocked evaluation runs again, and places nothing.
        await call(client.job.deregister_job, "filler")
        await wait_for(
            lambda: all(a["ClientStatus"] == "complete" for a in client.job.get_allocations("filler")),
            "the GPUs given back",
        )
        await wait_for(
            lambda: not [e for e in client.job.get_evaluations("llm") if e["Status"] == "blocked"],
            "the blocked evaluation run again",
        )
        groups = {a["TaskGroup"] for a in await call(client.job.get_allocations, "llm")}
        assert groups == {"a"}, "after a failed deployment Nomad never places the waiting group"
    finally:
        await server.stop()


async def test_max_parallel_zero_makes_no_deployment_and_the_waiting_group_places(tmp_path: Path) -> None:
    client, server = await run_scenario(tmp_path, update={"MaxParallel": 0})
    try:
        await call(client.job.deregister_job, "filler")
        placed = await wait_for(
            lambda: [
                a
                for a in client.job.get_allocations("llm")
                if a["TaskGroup"] == "b" and a["ClientStatus"] == "running"
            ],
            "the waiting group placed once the GPUs are back",
        )
        assert placed
        assert await call(client.job.get_deployments, "llm") == []
    finally:
        await server.stop()


async def test_a_job_without_an_update_block_gets_nomads_default_deployment(
    client: nomad.Nomad, server: NomadServer
) -> None:
    await call(client.jobs.register_job, {"Job": {"ID": "plain", "TaskGroups": [group("g")]}})
    (deployment,) = await wait_for(lambda: client.job.get_deployments("plain"), "a deployment")
    state = deployment["TaskGroups"]["g"]
    assert (state["DesiredTotal"], state["ProgressDeadline"]) == (1, 10 * 60 * S)
    assert deployment["Status"] == "running"
    job = await call(client.job.get_job, "plain")
    assert job["TaskGroups"][0]["Update"]["HealthyDeadline"] == 5 * 60 * S
