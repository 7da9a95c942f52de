"""Allocation lifecycles through the HTTP API: node failure, restarts, stop and purge, real pids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import nomad
import pytest

from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn
from llmgw.devcluster.nomad.client import client_status
from llmgw.devcluster.nomad.state import TaskStateRecord

from .conftest import assert_shape, call, fast_config, group, read_alloc_file, wait_for

S = 1_000_000_000


def by_group(client: nomad.Nomad, job_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for alloc in client.job.get_allocations(job_id):
        out.setdefault(alloc["TaskGroup"], []).append(alloc)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes: read its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize(
    ("states", "status"),
    [
        ([("running", False), ("pending", False)], "running"),  # one task restarting, one running
        ([("pending", False), ("pending", False)], "pending"),
        ([("running", False), ("dead", False)], "running"),  # a prestart task done
        ([("dead", False), ("dead", False)], "complete"),
        ([("running", False), ("dead", True)], "failed"),
        ([("pending", False), ("dead", True)], "failed"),
    ],
)
def test_an_allocations_client_status_is_nomads_from_its_tasks(
    states: list[tuple[str, bool]], status: str
) -> None:
    # client/allocrunner/alloc_runner.go, getClientStatus (v2.0.6-dev): failed, then running,
    # then pending, then complete.
    tasks = {f"t{i}": TaskStateRecord(state=state, failed=failed) for i, (state, failed) in enumerate(states)}
    assert client_status(tasks)[0] == status


async def test_node_failure_loses_only_that_groups_allocs(client: nomad.Nomad, server: NomadServer) -> None:
    job = {
        "ID": "two",
        "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
        "TaskGroups": [
            # llmgw's shape: no reschedule, and no replacement of lost allocs either.
            group("keep", Disconnect={"Replace": False}),
            group("other"),
        ],
    }
    await call(client.jobs.register_job, {"Job": job})
    groups = await wait_for(
        lambda: (
            (g := by_group(client, "two"))
            and all(a[0]["ClientStatus"] == "running" for a in g.values())
            and g
        ),
        "both groups running",
    )
    victim = groups["keep"][0]
    other = groups["other"][0]
    pid = int(await read_alloc_file(client, victim["ID"], "server/local/pid"))
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.address}/_dev/node/{victim['NodeID']}/fail")
        assert resp.status == 200
    assert not alive(pid), "a failed node's processes die with it"

    node = await wait_for(
        lambda: (n := client.node.get_node(victim["NodeID"]))["Status"] == "down" and n, "node marked down"
    )
    assert_shape(node, "Node")
    lost = await wait_for(
        lambda: (a := client.allocation.get_allocation(victim["ID"]))["ClientStatus"] == "lost" and a,
        "alloc lost",
    )
    assert lost["DesiredStatus"] == "stop"
    assert lost["DesiredDescription"] == "alloc is lost since its node is down"
    after = await call(by_group, client, "two")
    assert len(after["keep"]) == 1, "disconnect { replace = false }: the lost alloc is not replaced"
    assert [a["ID"] for a in after["other"]] == [other["ID"]], "the other group is untouched"
    assert after["other"][0]["ClientStatus"] == "running"

    # Real Nomad replaces lost allocations by default (the reschedule block does not apply).
    async with aiohttp.ClientSession() as http:
        await http.post(f"{server.address}/_dev/node/{other['NodeID']}/fail")
    replaced = await wait_for(
        lambda: [
            a
            for a in by_group(client, "two")["other"]
            if a["ClientStatus"] == "running" and a["ID"] != other["ID"]
        ],
        "the default group's replacement",
    )
    assert replaced[0]["NodeID"] not in (victim["NodeID"], other["NodeID"])

    async with aiohttp.ClientSession() as http:
        await http.post(f"{server.address}/_dev/node/{victim['NodeID']}/restore")
    restored = await wait_for(
        lambda: (n := client.node.get_node(victim["NodeID"]))["Status"] == "ready" and n, "node ready again"
    )
    assert restored["SchedulingEligibility"] == "eligible"


async def test_an_expired_disconnect_is_replaced_whatever_replace_says(
    client: nomad.Nomad, server: NomadServer
) -> None:
    # llmgw's group shape: Nomad's classifyAllocs files an allocation whose lost_after ran out
    # as "expiring" before any disconnect rule, and the reconciler replaces it as lost.
    job = {
        "ID": "shard",
        "TaskGroups": [group("rank-0", Disconnect={"LostAfter": S, "Replace": False})],
    }
    await call(client.jobs.register_job, {"Job": job})
    running = await wait_for(
        lambda: [a for a in client.job.get_allocations("shard") if a["ClientStatus"] == "running"],
        "the shard running",
    )
    victim = running[0]
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.address}/_dev/node/{victim['NodeID']}/fail")
        assert resp.status == 200
    unknown = await wait_for(
        lambda: (a := client.allocation.get_allocation(victim["ID"]))["ClientStatus"] == "unknown" and a,
        "the shard unknown on its disconnected node",
    )
    assert unknown["DesiredStatus"] == "run"
    assert len(await call(client.job.get_allocations, "shard")) == 1, "replace = false while disconnected"

    lost = await wait_for(
        lambda: (a := client.allocation.get_allocation(victim["ID"]))["ClientStatus"] == "lost" and a,
        "the shard lost once lost_after ran out",
    )
    assert lost["DesiredStatus"] == "stop"
    replacement = await wait_for(
        lambda: [
            a
            for a in client.job.get_allocations("shard")
            if a["ID"] != victim["ID"] and a["ClientStatus"] == "running"
        ],
        "a lone replacement of the lost shard",
    )
    assert replacement[0]["NodeID"] != victim["NodeID"]
    whole = await call(client.allocation.get_allocation, replacement[0]["ID"])
    assert whole["PreviousAllocation"] == victim["ID"]


async def test_a_disconnected_node_is_filed_again_each_heartbeat_and_its_alloc_keeps_its_unknown_time(
    client: nomad.Nomad, server: NomadServer
) -> None:
    # nomad/heartbeat.go (v2.0.5): while disconnected, the leader resets the node's heartbeat
    # timer and, when it fires, files "Node heartbeat missed" again with a new
    # StatusUpdatedAt; the allocation's AllocStates keep when it became unknown
    # (the scheduler's appendUnknownDisconnectingUpdates), the clock its lost_after runs on.
    job = {"ID": "kept", "TaskGroups": [group("rank-0", Disconnect={"LostAfter": 60 * S, "Replace": False})]}
    await call(client.jobs.register_job, {"Job": job})
    running = await wait_for(
        lambda: [a for a in client.job.get_allocations("kept") if a["ClientStatus"] == "running"],
        "the allocation running",
    )
    victim = running[0]
    async with aiohttp.ClientSession() as http:
        await http.post(f"{server.address}/_dev/node/{victim['NodeID']}/fail")
    first = await wait_for(
        lambda: (n := client.node.get_node(victim["NodeID"]))["Status"] == "disconnected" and n,
        "the node disconnected",
    )
    unknown = await call(client.allocation.get_allocation, victim["ID"])
    assert_shape(unknown, "Allocation")
    (state,) = unknown["AllocStates"]
    assert (state["Field"], state["Value"]) == (0, "unknown")
    assert "AllocStates" not in (await call(client.job.get_allocations, "kept"))[0]  # stubs lack them
    missed = sum(e["Message"] == "Node heartbeat missed" for e in first["Events"])
    again = await wait_for(
        lambda: (
            (n := client.node.get_node(victim["NodeID"]))["Status"] == "disconnected"
            and sum(e["Message"] == "Node heartbeat missed" for e in n["Events"]) >= missed + 2
            and n
        ),
        "the node filed disconnected again, twice",
    )
    assert again["StatusUpdatedAt"] >= first["StatusUpdatedAt"]
    later = await call(client.allocation.get_allocation, victim["ID"])
    assert later["AllocStates"] == unknown["AllocStates"]  # written once per disconnection


async def test_restart_policy_then_failed_without_reschedule(
    client: nomad.Nomad, server: NomadServer
) -> None:
    crashing = group("g", RestartPolicy={"Attempts": 2, "Interval": 60 * S, "Delay": S // 20, "Mode": "fail"})
    crashing["Tasks"][0]["Config"]["args"] += ["0.1", "3"]  # exit 3 after 0.1 s
    await call(client.jobs.register_job, {"Job": {"ID": "crash", "TaskGroups": [crashing]}})
    failed = await wait_for(
        lambda: [a for a in client.job.get_allocations("crash") if a["ClientStatus"] == "failed"],
        "failed alloc",
    )
    alloc = await call(client.allocation.get_allocation, failed[0]["ID"])
    state = alloc["TaskStates"]["server"]
    assert state["State"] == "dead" and state["Failed"] is True
    assert state["Restarts"] == 2
    kinds = [e["Type"] for e in state["Events"]]
    assert kinds.count("Terminated") == 3 and kinds.count("Restarting") == 2
    assert kinds[-1] == "Not Restarting"
    assert (
        'Exceeded allowed attempts 2 in interval 1m0s and mode is "fail"'
        in state["Events"][-1]["DisplayMessage"]
    )
    assert {e["ExitCode"] for e in state["Events"] if e["Type"] == "Terminated"} == {3}
    # reschedule { attempts = 0, unlimited = false }: no replacement.
    allocs = await call(client.job.get_allocations, "crash")
    assert len(allocs) == 1
    evals = await call(client.job.get_evaluations, "crash")
    assert "alloc-failure" in {e["TriggeredBy"] for e in evals}
    logs = await call(client.client.stream_logs.stream, failed[0]["ID"], "server", "stdout", plain=True)
    assert logs.count("exiting with 3") == 3


async def test_crashed_task_is_restarted_in_place(client: nomad.Nomad, server: NomadServer) -> None:
    await call(
        client.jobs.register_job,
        {
            "Job": {
                "ID": "once",
                "TaskGroups": [
                    group("g", RestartPolicy={"Attempts": 3, "Interval": 60 * S, "Delay": 0, "Mode": "fail"})
                ],
            }
        },
    )
    alloc = (
        await wait_for(
            lambda: [a for a in client.job.get_allocations("once") if a["ClientStatus"] == "running"],
            "running",
        )
    )[0]
    pid = int(await read_alloc_file(client, alloc["ID"], "server/local/pid"))
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.address}/_dev/alloc/{alloc['ID']}/crash", params={"task": "server"})
        assert (await resp.json())["Killed"] == pid
    restarted = await wait_for(
        lambda: (
            (a := client.allocation.get_allocation(alloc["ID"]))["TaskStates"]["server"]["Restarts"] == 1
            and a["ClientStatus"] == "running"
            and a
        ),
        "restart after crash",
    )
    assert (
        next(e for e in restarted["TaskStates"]["server"]["Events"] if e["Type"] == "Terminated")["Signal"]
        == 9
    )


async def test_deregister_kills_every_process_and_purge_removes_the_job(
    client: nomad.Nomad, server: NomadServer
) -> None:
    job = {"ID": "gone", "TaskGroups": [group("g", count=2, ShutdownDelay=S // 10)]}
    await call(client.jobs.register_job, {"Job": job})
    allocs = await wait_for(
        lambda: [a for a in client.job.get_allocations("gone") if a["ClientStatus"] == "running"] or None,
        "running",
    )
    allocs = await wait_for(
        lambda: (
            (a := client.job.get_allocations("gone"))
            and sum(x["ClientStatus"] == "running" for x in a) == 2
            and a
        ),
        "two running",
    )
    pids = [int(await read_alloc_file(client, a["ID"], "server/local/pid")) for a in allocs]
    assert all(alive(p) for p in pids)
    reply = await call(client.job.deregister_job, "gone")
    assert_shape(reply, "JobDeregisterResponse")
    done = await wait_for(
        lambda: (
            all(a["ClientStatus"] == "complete" for a in client.job.get_allocations("gone"))
            and client.job.get_allocations("gone")
        ),
        "allocs complete",
    )
    for alloc in done:
        assert alloc["DesiredStatus"] == "stop"
        events = [e["Type"] for e in alloc["TaskStates"]["server"]["Events"]]
        assert events[-3:] == ["Killing", "Terminated", "Killed"]
    assert not [p for p in pids if alive(p)], "no task process survives a deregister"
    job_after = await call(client.job.get_job, "gone")
    assert job_after["Stop"] is True and job_after["Status"] == "dead"
    await call(client.job.deregister_job, "gone", purge=True)
    with pytest.raises(nomad.api.exceptions.URLNotFoundNomadException):
        await call(client.job.get_job, "gone")


async def test_stop_kills_processes_even_when_the_standin_is_stopped_abruptly(tmp_path: Path) -> None:
    srv = NomadServer(NomadStandIn(fast_config(tmp_path)))
    await srv.start()
    try:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        await call(client.jobs.register_job, {"Job": {"ID": "j", "TaskGroups": [group("g", count=3)]}})
        allocs = await wait_for(
            lambda: (
                (a := client.job.get_allocations("j"))
                and all(x["ClientStatus"] == "running" for x in a)
                and len(a) == 3
                and a
            ),
            "running",
        )
        pids = [int(await read_alloc_file(client, a["ID"], "server/local/pid")) for a in allocs]
    finally:
        await srv.stop()
    assert not [p for p in pids if alive(p)]


async def _stop_job_on_failing_node(client: nomad.Nomad, server: NomadServer, job_id: str) -> dict[str, Any]:
    """Run one alloc, fail its node, and stop the job before the heartbeat grace runs out."""
    await call(client.jobs.register_job, {"Job": {"ID": job_id, "TaskGroups": [group("g")]}})
    running = await wait_for(
        lambda: [a for a in client.job.get_allocations(job_id) if a["ClientStatus"] == "running"],
        "alloc running",
    )
    alloc: dict[str, Any] = running[0]
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.address}/_dev/node/{alloc['NodeID']}/fail")
        assert resp.status == 200
    await call(client.job.deregister_job, job_id)
    stopped = await wait_for(
        lambda: (a := client.allocation.get_allocation(alloc["ID"]))["DesiredStatus"] == "stop" and a,
        "alloc desired stop",
    )
    assert stopped["ClientStatus"] == "running", "the dead client cannot report the stop"
    node = await call(client.node.get_node, alloc["NodeID"])
    assert node["Status"] == "ready", "still within the heartbeat grace"
    return alloc


async def test_stopped_alloc_on_a_node_that_goes_down_ends_lost(tmp_path: Path) -> None:
    # Nomad's createNodeEvals makes an eval for every job with an alloc on the down node, and the
    # scheduler's updateNonTerminalAllocsToLost marks desired-stop running/pending allocs lost.
    async with NomadServer(NomadStandIn(fast_config(tmp_path, heartbeat_grace_s=1.5))) as server:
        client = nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)
        alloc = await _stop_job_on_failing_node(client, server, "late")
        await wait_for(lambda: client.node.get_node(alloc["NodeID"])["Status"] == "down", "node down")
        lost = await wait_for(
            lambda: (a := client.allocation.get_allocation(alloc["ID"]))["ClientStatus"] == "lost" and a,
            "stopped alloc lost once its node is down",
        )
        assert_shape(lost, "Allocation")
        assert lost["DesiredStatus"] == "stop"
        assert lost["ClientDescription"] == "alloc is lost since its node is down"
        assert lost["TaskStates"]["server"]["State"] == "dead"
        assert lost["TaskStates"]["server"]["FinishedAt"] not in ("", None, "0001-01-01T00:00:00Z")
        evals = await call(client.job.get_evaluations, "late")
        assert any(e["TriggeredBy"] == "node-update" and e["NodeID"] == alloc["NodeID"] for e in evals)
        summary = await call(client.job.get_summary, "late")
        assert summary["Summary"]["g"]["Lost"] == 1 and summary["Summary"]["g"]["Running"] == 0

        async with aiohttp.ClientSession() as http:
            await http.post(f"{server.address}/_dev/node/{alloc['NodeID']}/restore")
        await wait_for(lambda: client.node.get_node(alloc["NodeID"])["Status"] == "ready", "node ready")
        after = await call(client.allocation.get_allocation, alloc["ID"])
        assert (after["ClientStatus"], after["DesiredStatus"]) == ("lost", "stop")


async def test_stopped_alloc_on_a_node_restored_before_it_went_down_ends_lost(tmp_path: Path) -> None:
    # The node comes back empty before the server noticed it was gone: its client no longer runs
    # the alloc, so it does not stay "running".
    async with NomadServer(NomadStandIn(fast_config(tmp_path, heartbeat_grace_s=30))) as server:
        client = nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)
        alloc = await _stop_job_on_failing_node(client, server, "quick")
        async with aiohttp.ClientSession() as http:
            await http.post(f"{server.address}/_dev/node/{alloc['NodeID']}/restore")
        lost = await wait_for(
            lambda: (a := client.allocation.get_allocation(alloc["ID"]))["ClientStatus"] == "lost" and a,
            "leftover alloc lost after restore",
        )
        assert lost["DesiredStatus"] == "stop"
        assert lost["TaskStates"]["server"]["State"] == "dead"
        assert (await call(client.node.get_node, alloc["NodeID"]))["Status"] == "ready"


async def test_group_fields_nomad_2_ignores_are_dropped_and_a_lost_alloc_is_replaced_anyway(
    client: nomad.Nomad, server: NomadServer
) -> None:
    # Nomad 1.10+ copies none of these into the server's job (ApiTgToStructsTG), and says
    # nothing: the register answers without a warning for them.
    ignored = {
        "PreventRescheduleOnLost": True,
        "MaxClientDisconnect": 300 * S,
        "StopAfterClientDisconnect": S,
    }
    answer = await call(
        client.jobs.register_job, {"Job": {"ID": "old", "TaskGroups": [group("g", **ignored)]}}
    )
    assert answer["Warnings"] == ""
    stored = (await call(client.job.get_job, "old"))["TaskGroups"][0]
    assert (stored["PreventRescheduleOnLost"], stored["MaxClientDisconnect"]) == (False, None)
    assert stored["StopAfterClientDisconnect"] is None
    first = (
        await wait_for(
            lambda: [a for a in client.job.get_allocations("old") if a["ClientStatus"] == "running"],
            "running",
        )
    )[0]
    async with aiohttp.ClientSession() as http:
        await http.post(f"{server.address}/_dev/node/{first['NodeID']}/fail")
    replaced = await wait_for(
        lambda: [
            a
            for a in client.job.get_allocations("old")
            if a["ClientStatus"] == "running" and a["ID"] != first["ID"]
        ],
        "a replacement, prevent_reschedule_on_lost notwithstanding",
    )
    assert replaced[0]["NodeID"] != first["NodeID"]


async def test_register_and_plan_answer_with_the_warnings_nomad_2_gives(client: nomad.Nomad) -> None:
    quiet = group("g", Services=[{"Name": "web", "PortLabel": "http"}])
    quiet["Tasks"][0]["Resources"]["MemoryMaxMB"] = 512
    job = {"ID": "warned", "TaskGroups": [quiet]}
    expected = (
        "2 warnings:\n"
        '\n* group "g" defines services, but neither the group nor any of its tasks have shutdown_delay set'
        '\n* Memory oversubscription is not enabled; Task "g.server" memory_max value will be ignored. '
        "Update the Scheduler Configuration to allow oversubscription."
    )
    plan = await call(client.job.plan_job, "warned", {"Job": job})
    assert plan["Warnings"] == expected
    answer = await call(client.jobs.register_job, {"Job": job})
    assert answer["Warnings"] == expected
    quiet["ShutdownDelay"] = 5 * S
    del quiet["Tasks"][0]["Resources"]["MemoryMaxMB"]
    assert (await call(client.jobs.register_job, {"Job": job}))["Warnings"] == ""


async def test_a_client_keeps_at_most_gc_max_allocs_and_destroys_the_oldest_terminal_ones(
    tmp_path: Path,
) -> None:
    # client/gc.go, keepUsageBelowThreshold (v2.0.5): past gc_max_allocs allocations on a
    # node, its terminal allocations are destroyed oldest first, their directories with them.
    config = fast_config(tmp_path, gc_max_allocs=2).with_overrides(
        nodes=(NodeSpec(name="node-0", gpus=2, gpu_model="H100"),)
    )
    async with NomadServer(NomadStandIn(config)) as srv:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        finished: list[str] = []
        for name in ("first", "second", "third", "fourth"):
            await call(client.jobs.register_job, {"Job": {"ID": name, "TaskGroups": [group("g")]}})
            (alloc,) = await wait_for(
                lambda name=name: (
                    [a for a in client.job.get_allocations(name) if a["ClientStatus"] == "running"] or None
                ),
                f"{name} running",
            )
            await call(client.job.deregister_job, name)
            await wait_for(
                lambda name=name: all(
                    a["ClientStatus"] == "complete" for a in client.job.get_allocations(name)
                ),
                f"{name} complete",
            )
            finished.append(alloc["ID"])

        def kept() -> set[str] | None:
            dirs = {p.name for p in (tmp_path / "nomad" / "alloc").iterdir()}
            return dirs if len(dirs) <= 2 else None

        assert await wait_for(kept, "the oldest terminal allocations' directories destroyed") == set(
            finished[2:]
        )


async def test_deregistering_a_job_that_does_not_exist_is_a_200_without_an_evaluation(tmp_path: Path) -> None:
    """Job.Deregister returns nil when it finds no job (nomad/job_endpoint.go, v2.0.5): the
    HTTP answer is 200, an empty EvalID and indexes of 0, X-Nomad-Index 0, nothing written."""
    async with NomadServer(NomadStandIn(fast_config(tmp_path))) as srv, aiohttp.ClientSession() as http:
        before = srv.standin.store.index
        for purge in ("false", "true"):
            async with http.delete(f"{srv.address}/v1/job/never-was", params={"purge": purge}) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-Nomad-Index"] == "0"
                reply = await resp.json()
            assert_shape(reply, "JobDeregisterResponse")
            assert (reply["EvalID"], reply["EvalCreateIndex"], reply["JobModifyIndex"]) == ("", 0, 0)
        assert srv.standin.store.index == before
        async with http.get(f"{srv.address}/v1/evaluations") as resp:
            assert await resp.json() == []
