"""Placement through the HTTP API: groups on distinct hosts, GPUs assigned once, why a plan fails."""

from __future__ import annotations

import functools
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import nomad

from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn

from .conftest import assert_shape, call, fast_config, group, read_alloc_file, server_task, wait_for

S = 1_000_000_000

GPU = [
    {
        "Name": "nvidia/gpu",
        "Count": 1,
        "Constraints": [
            {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "80 GiB"},
            {"LTarget": "${device.model}", "Operand": "=", "RTarget": "H100"},
        ],
    }
]


def multi_group_job(job_id: str = "llm") -> dict[str, Any]:
    return {
        "ID": job_id,
        "Type": "service",
        "Datacenters": ["dc1"],
        "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
        "TaskGroups": [
            group("big", devices=[{**GPU[0], "Count": 2}]),
            group("small", count=2, devices=GPU),
        ],
    }


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


def running(client: nomad.Nomad, job_id: str, n: int) -> Any:
    allocs = client.job.get_allocations(job_id)
    live = [a for a in allocs if a["ClientStatus"] == "running"]
    return allocs if len(live) == n else None


async def test_multi_group_job_lands_on_distinct_hosts_with_its_own_gpus(
    client: nomad.Nomad, server: NomadServer
) -> None:
    reply = await call(client.jobs.register_job, {"Job": multi_group_job()})
    assert_shape(reply, "JobRegisterResponse")
    allocs = await wait_for(lambda: running(client, "llm", 3), "3 running allocations")
    assert_shape(allocs, "AllocationListStub")

    assert len({a["NodeID"] for a in allocs}) == 3, (
        "job-level distinct_hosts puts every alloc on its own node"
    )
    seen: set[str] = set()
    for stub in allocs:
        alloc = await call(client.allocation.get_allocation, stub["ID"])
        assert_shape(alloc, "Allocation")
        devices = alloc["AllocatedResources"]["Tasks"]["server"]["Devices"]
        ids = devices[0]["DeviceIDs"]
        assert devices[0]["Name"] == "H100" and devices[0]["Vendor"] == "nvidia"
        assert len(ids) == (2 if alloc["TaskGroup"] == "big" else 1)
        assert not seen & set(ids), "a GPU instance is never given to two allocations"
        seen |= set(ids)
        # The process really runs, with Nomad's runtime environment.
        env = json.loads(await read_alloc_file(client, stub["ID"], "server/local/env.json"))
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
        assert env["NOMAD_ALLOC_ID"] == stub["ID"]
        assert env["NOMAD_GROUP_NAME"] == alloc["TaskGroup"]
        assert env["GREETING"] == f"hello from {alloc['Name']} on {alloc['NodeName']}"
        port = int(env["NOMAD_PORT_http"])
        shared_ports = alloc["AllocatedResources"]["Shared"]["Ports"]
        assert shared_ports[0]["Label"] == "http" and shared_ports[0]["Value"] == port
        # "running" means the task's process started, as in Nomad, not that it listens yet.
        url = f"http://127.0.0.1:{port}/"
        answer = await wait_for(functools.partial(_get_json, url), f"the task at {url}")
        assert answer["alloc"] == stub["ID"]
        assert Path(env["NOMAD_ALLOC_DIR"]).name == "alloc" and env["NOMAD_TASK_DIR"].endswith("server/local")

    job = await call(client.job.get_job, "llm")
    assert_shape(job, "Job")
    assert job["Status"] == "running"
    nodes = await call(client.nodes.get_nodes)
    assert_shape(nodes, "NodeListStub")
    node = await call(client.node.get_node, nodes[0]["ID"])
    assert_shape(node, "Node")
    assert node["NodeResources"]["Devices"][0]["Attributes"]["memory"] == {
        "Int": 81920,
        "Unit": "MiB",
        "Bool": None,
        "Float": None,
        "String": None,
    }
    assert node["Meta"]["llmgw_fabric"] in ("ib-0", "ib-1")
    evals = await call(client.job.get_evaluations, "llm")
    assert_shape(evals, "Evaluation")
    assert evals[0]["Status"] == "complete" and evals[0]["TriggeredBy"] == "job-register"


async def test_plan_of_an_infeasible_job_says_why(client: nomad.Nomad, server: NomadServer) -> None:
    too_big = {"ID": "huge", "TaskGroups": [group("g", devices=[{"Name": "nvidia/gpu", "Count": 4}])]}
    plan = await call(client.job.plan_job, "huge", {"Job": too_big}, diff=True)
    assert_shape(plan, "JobPlanResponse")
    metric = plan["FailedTGAllocs"]["g"]
    assert_shape(metric, "AllocationMetric")
    assert metric["NodesEvaluated"] == 3
    assert metric["ConstraintFiltered"] == {"missing devices": 3}
    assert plan["Annotations"]["DesiredTGUpdates"]["g"]["Place"] == 1
    assert plan["Diff"]["Type"] == "Added"

    docker = {
        "ID": "dock",
        "TaskGroups": [
            {"Name": "g", "Tasks": [{"Name": "t", "Driver": "docker", "Config": {"image": "redis"}}]}
        ],
    }
    plan = await call(client.job.plan_job, "dock", {"Job": docker})
    assert plan["FailedTGAllocs"]["g"]["ConstraintFiltered"] == {"missing drivers": 3}

    # All six GPUs in use: the next request is exhausted, not filtered; it blocks and
    # places as soon as capacity frees, while the placed job keeps its GPUs.
    await call(
        client.jobs.register_job,
        {
            "Job": {
                "ID": "all",
                "TaskGroups": [group("g", count=3, devices=[{"Name": "nvidia/gpu", "Count": 2}])],
            }
        },
    )
    await wait_for(lambda: running(client, "all", 3), "the GPU-filling job")
    one_more = {"ID": "more", "TaskGroups": [group("g", devices=GPU)]}
    plan = await call(client.job.plan_job, "more", {"Job": one_more})
    assert plan["FailedTGAllocs"]["g"]["DimensionExhausted"] == {"devices: no devices match request": 3}
    assert plan["FailedTGAllocs"]["g"]["NodesExhausted"] == 3

    await call(client.jobs.register_job, {"Job": one_more})
    blocked = await wait_for(
        lambda: [e for e in client.job.get_evaluations("more") if e["Status"] == "blocked"], "a blocked eval"
    )
    assert blocked[0]["FailedTGAllocs"]["g"]["DimensionExhausted"]
    job = await call(client.job.get_job, "more")
    assert job["Status"] == "pending"
    await call(client.job.deregister_job, "all")
    await wait_for(lambda: running(client, "more", 1), "the blocked job placed once GPUs free")
    evals = await call(client.job.get_evaluations, "more")
    assert [e["Status"] for e in evals] == ["complete", "complete"]


async def test_job_update_is_destructive_and_same_spec_is_a_noop(
    client: nomad.Nomad, server: NomadServer
) -> None:
    job = {"ID": "upd", "TaskGroups": [group("g")]}
    first = await call(client.jobs.register_job, {"Job": job})
    before = await wait_for(lambda: running(client, "upd", 1), "first version running")
    again = await call(client.jobs.register_job, {"Job": job})
    assert again["JobModifyIndex"] == first["JobModifyIndex"], "an unchanged job is not a new version"
    assert again["EvalID"] != first["EvalID"]
    job["TaskGroups"][0]["Tasks"][0]["Env"] = {"GREETING": "changed"}
    await call(client.jobs.register_job, {"Job": job})

    def replaced() -> Any:
        allocs = client.job.get_allocations("upd")
        new = [a for a in allocs if a["JobVersion"] == 1 and a["ClientStatus"] == "running"]
        old = [a for a in allocs if a["ID"] == before[0]["ID"] and a["ClientStatus"] == "complete"]
        return (new, old) if new and old else None

    new, old = await wait_for(replaced, "destructive update")
    assert old[0]["DesiredDescription"] == "alloc is being updated due to job update"
    assert new[0]["Name"] == "upd.g[0]"
    detail = await call(client.allocation.get_allocation, new[0]["ID"])
    assert detail["PreviousAllocation"] == before[0]["ID"]
    summary_job = await call(client.job.get_job, "upd")
    assert summary_job["Version"] == 1


async def test_constraints_on_attributes_and_meta(client: nomad.Nomad, server: NomadServer) -> None:
    pinned = {
        "ID": "pin",
        "Constraints": [{"LTarget": "${meta.llmgw_fabric}", "Operand": "=", "RTarget": "ib-1"}],
        "TaskGroups": [
            group(
                "g",
                Constraints=[
                    {"LTarget": "${attr.kernel.name}", "Operand": "regexp", "RTarget": "^lin"},
                    {
                        "LTarget": "${node.unique.name}",
                        "Operand": "set_contains_any",
                        "RTarget": "node-1,node-2",
                    },
                ],
            )
        ],
    }
    await call(client.jobs.register_job, {"Job": pinned})
    allocs = await wait_for(lambda: running(client, "pin", 1), "pinned alloc")
    assert allocs[0]["NodeName"] == "node-1"
    nowhere = {
        "ID": "nowhere",
        "TaskGroups": [
            group("g", Constraints=[{"LTarget": "${attr.kernel.name}", "Operand": "=", "RTarget": "windows"}])
        ],
    }
    plan = await call(client.job.plan_job, "nowhere", {"Job": nowhere})
    assert plan["FailedTGAllocs"]["g"]["ConstraintFiltered"] == {"${attr.kernel.name} = windows": 3}
    task = server_task("t")
    assert task["Driver"] == "raw_exec"


async def test_allocation_lists_carry_resources_only_when_nomad_would(
    client: nomad.Nomad, server: NomadServer
) -> None:
    """Nomad's AllocListStub has AllocatedResources (omitempty) only in ``GET /v1/allocations
    ?resources=true``; job and evaluation allocation lists never have it; the whole allocation
    always does. A client that forgets ``resources=true`` must see no GPUs here, as on Nomad."""
    await call(client.jobs.register_job, {"Job": {"ID": "res", "TaskGroups": [group("g", devices=GPU)]}})
    (stub,) = await wait_for(lambda: running(client, "res", 1), "the GPU job")
    alloc = await call(client.allocation.get_allocation, stub["ID"])
    (device,) = alloc["AllocatedResources"]["Tasks"]["server"]["Devices"]
    assert len(device["DeviceIDs"]) == 1

    async def listed(path: str, **params: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(server.address + path, params=params) as resp:
            (entry,) = [a for a in await resp.json() if a["ID"] == stub["ID"]]
            assert_shape(entry, "AllocationListStub")
            return dict(entry)

    assert (await listed("/v1/allocations"))["AllocatedResources"] is None
    assert (await listed("/v1/allocations", resources="false"))["AllocatedResources"] is None
    with_resources = await listed("/v1/allocations", resources="true")
    assert with_resources["AllocatedResources"]["Tasks"]["server"]["Devices"] == [device]
    assert (await listed("/v1/job/res/allocations"))["AllocatedResources"] is None
    assert (await listed(f"/v1/evaluation/{stub['EvalID']}/allocations"))["AllocatedResources"] is None


async def test_a_stopping_allocation_keeps_its_gpus_until_its_tasks_have_exited(tmp_path: Path) -> None:
    # Nomad's ProposedAllocs drops only client-terminal allocations: one told to stop still
    # holds its devices (and its distinct_hosts slot) through shutdown_delay and the kill.
    solo = (NodeSpec(name="solo", gpus=2, gpu_model="H100", fabric="ib-0"),)
    both_gpus = [{"Name": "nvidia/gpu", "Count": 2}]
    async with NomadServer(NomadStandIn(fast_config(tmp_path, nodes=solo))) as server:
        client = nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)
        old = {"ID": "old", "TaskGroups": [group("g", devices=both_gpus, ShutdownDelay=3 * S)]}
        await call(client.jobs.register_job, {"Job": old})
        (old_alloc,) = await wait_for(lambda: running(client, "old", 1), "the old job on both GPUs")
        await call(client.job.deregister_job, "old")
        new = {"ID": "new", "TaskGroups": [group("g", devices=both_gpus)]}
        await call(client.jobs.register_job, {"Job": new})
        blocked = await wait_for(
            lambda: [e for e in client.job.get_evaluations("new") if e["Status"] == "blocked"],
            "the new job blocked while the old one shuts down",
        )
        assert blocked[0]["FailedTGAllocs"]["g"]["DimensionExhausted"]
        stopping = await call(client.allocation.get_allocation, old_alloc["ID"])
        assert (stopping["DesiredStatus"], stopping["ClientStatus"]) == ("stop", "running")
        assert await call(client.job.get_allocations, "new") == []

        await wait_for(lambda: running(client, "new", 1), "the new job once the GPUs are back")
        finished = await call(client.allocation.get_allocation, old_alloc["ID"])
        assert finished["ClientStatus"] == "complete"


async def test_a_stopping_allocation_keeps_its_distinct_hosts_slot_until_it_has_exited(
    tmp_path: Path,
) -> None:
    # The same job id registered again at once meets its own stopping allocations: until they
    # exit, distinct_hosts filters their nodes (DistinctHostsIterator reads ProposedAllocs).
    pair = tuple(NodeSpec(name=f"n{i}", gpus=0, fabric="ib-0") for i in range(2))
    async with NomadServer(NomadStandIn(fast_config(tmp_path, nodes=pair))) as server:
        client = nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)
        job = {
            "ID": "pair",
            "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
            "TaskGroups": [group(g, ShutdownDelay=3 * S) for g in ("rank-0", "rank-1")],
        }
        await call(client.jobs.register_job, {"Job": job})
        old = await wait_for(lambda: running(client, "pair", 2), "both ranks on their own node")
        await call(client.job.deregister_job, "pair", purge=True)
        await call(client.jobs.register_job, {"Job": job})
        blocked = await wait_for(
            lambda: [e for e in client.job.get_evaluations("pair") if e["Status"] == "blocked"],
            "the new ranks blocked by the old ones still shutting down",
        )
        assert blocked[0]["FailedTGAllocs"]["rank-0"]["ConstraintFiltered"] == {"distinct_hosts": 2}
        stopping = await call(client.allocation.get_allocation, old[0]["ID"])
        assert (stopping["DesiredStatus"], stopping["ClientStatus"]) == ("stop", "running")

        def new_ranks_running() -> Any:
            live = [a for a in running(client, "pair", 2) or [] if a["ID"] not in {o["ID"] for o in old}]
            return live if len(live) == 2 else None

        await wait_for(new_ranks_running, "the new ranks placed once the old ones exited")
