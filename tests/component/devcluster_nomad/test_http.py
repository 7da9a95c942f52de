"""The HTTP surface: event stream, blocking queries, strict decoding, ACL tokens, logs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import nomad
import pytest

from llmgw.devcluster.nomad import NomadServer, NomadStandIn, StandInConfig
from tests.support.waiting import eventually

from .conftest import assert_shape, call, fast_config, group, wait_for


async def read_lines(resp: aiohttp.ClientResponse, until: Any, limit_s: float = 10.0) -> list[dict[str, Any]]:
    """Lines of an event stream until ``until(lines)`` holds."""
    lines: list[dict[str, Any]] = []

    async def pump() -> None:
        async for raw in resp.content:
            lines.append(json.loads(raw))
            if until(lines):
                return

    await asyncio.wait_for(pump(), limit_s)
    return lines


async def test_event_stream_filters_by_job_and_sends_heartbeats(
    client: nomad.Nomad, server: NomadServer
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.address}/v1/event/stream", params={"topic": "Allocation:ev"}) as resp,
    ):
        assert resp.status == 200
        await call(client.jobs.register_job, {"Job": {"ID": "noise", "TaskGroups": [group("g")]}})
        await call(client.jobs.register_job, {"Job": {"ID": "ev", "TaskGroups": [group("g")]}})

        def running(lines: list[dict[str, Any]]) -> bool:
            return (
                any(
                    e["Payload"]["Allocation"]["ClientStatus"] == "running"
                    for line in lines
                    for e in line.get("Events", [])
                )
                and {} in lines
            )

        lines = await read_lines(resp, running)
    events = [e for line in lines for e in line.get("Events", [])]
    assert {e["Topic"] for e in events} == {"Allocation"}
    assert {e["FilterKeys"][0] for e in events} == {"ev"}, "Allocation:<job> only streams that job's allocs"
    assert {"PlanResult", "AllocationUpdated"} <= {e["Type"] for e in events}
    assert {} in lines, "idle streams get {} heartbeats"
    for line in lines:
        if line:
            assert all(e["Index"] == line["Index"] for e in line["Events"])
    for event in events:
        assert event["Namespace"] == "default"
        assert event["Payload"]["Allocation"]["Job"] is None, "Nomad strips the job from alloc events"
        assert_shape({k: v for k, v in event.items() if k != "Namespace"}, "Event")
        assert_shape(event["Payload"]["Allocation"], "Allocation")


async def test_event_stream_opens_with_a_heartbeat_and_beats_every_30s_by_default(tmp_path: Path) -> None:
    # Nomad's JsonStream writes "{}" at once, then every 30 s (nomad/event_endpoint.go).
    assert StandInConfig().event_heartbeat_s == 30.0
    async with (
        NomadServer(NomadStandIn(fast_config(tmp_path, event_heartbeat_s=30.0))) as srv,
        aiohttp.ClientSession() as http,
        http.get(f"{srv.address}/v1/event/stream", params={"topic": "Job:nothing", "index": "1"}) as resp,
    ):
        first = await asyncio.wait_for(resp.content.readline(), 5)
    assert json.loads(first) == {}, "the first line is the heartbeat that says the stream is open"


async def test_event_stream_index_older_than_buffer_starts_at_oldest(tmp_path: Path) -> None:
    async with NomadServer(NomadStandIn(fast_config(tmp_path, event_buffer_size=3))) as srv:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        for i in range(3):
            await call(
                client.jobs.register_job, {"Job": {"ID": f"j{i}", "TaskGroups": [group("g", count=0)]}}
            )
        await wait_for(
            lambda: all(e["Status"] == "complete" for e in client.evaluations.get_evaluations()), "evals done"
        )
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{srv.address}/v1/event/stream", params={"index": "1", "topic": "*"}) as resp,
        ):
            lines = await read_lines(resp, lambda ls: len([x for x in ls if x]) >= 3)
        batches = [x for x in lines if x]
        assert batches[0]["Index"] > 1, "the gap is silent: the stream starts at the oldest batch kept"
        assert len(batches) == 3 and batches == sorted(batches, key=lambda b: b["Index"])


async def test_blocking_query_on_job_allocations_wakes_on_change(
    client: nomad.Nomad, server: NomadServer
) -> None:
    await call(client.jobs.register_job, {"Job": {"ID": "b", "TaskGroups": [group("g")]}})
    allocs = await wait_for(
        lambda: [a for a in client.job.get_allocations("b") if a["ClientStatus"] == "running"], "running"
    )
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.address}/v1/job/b/allocations") as resp:
            index = int(resp.headers["X-Nomad-Index"])
            assert resp.headers["X-Nomad-KnownLeader"] == "true"
        waiting = asyncio.create_task(
            http.get(f"{server.address}/v1/job/b/allocations", params={"index": str(index), "wait": "20s"})
        )
        await eventually(lambda: server.standin.store.waiting >= 1, what="the blocking query parked")
        assert not waiting.done(), "nothing changed: the query blocks"
        stop = await call(client.allocation.stop_allocation, allocs[0]["ID"])
        assert_shape(stop, "AllocStopResponse")
        resp = await asyncio.wait_for(waiting, 10)
        assert int(resp.headers["X-Nomad-Index"]) > index
        body = await resp.json()
        assert any(a["DesiredStatus"] == "stop" for a in body) or any(
            a["DesiredTransition"] for a in [await call(client.allocation.get_allocation, allocs[0]["ID"])]
        )
        resp.release()
        async with http.get(
            f"{server.address}/v1/job/b/allocations", params={"index": "999999", "wait": "200ms"}
        ) as resp:
            assert resp.status == 200, "a wait that runs out answers with the current state"


async def test_strict_mode_refuses_keys_nomad_would_drop(client: nomad.Nomad, server: NomadServer) -> None:
    job = {"ID": "s", "TaskGroups": [group("g")]}
    job["TaskGroups"][0]["count"] = 2  # miscased
    with pytest.raises(nomad.api.exceptions.BadRequestNomadException) as err:
        await call(client.jobs.register_job, {"Job": job})
    text = err.value.nomad_resp.text
    assert "count" in text and "'Count'" in text
    job = {"ID": "s", "TaskGroups": [group("g")]}
    job["TaskGroups"][0]["Tasks"][0]["Resources"]["GPUs"] = 1  # unknown
    with pytest.raises(nomad.api.exceptions.BadRequestNomadException) as err:
        await call(client.jobs.register_job, {"Job": job})
    assert "GPUs" in err.value.nomad_resp.text


async def test_lenient_mode_reads_keys_case_insensitively(tmp_path: Path) -> None:
    async with NomadServer(NomadStandIn(fast_config(tmp_path, strict=False))) as srv:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        job = {"ID": "l", "TaskGroups": [group("g")], "Bogus": 1}
        job["TaskGroups"][0]["count"] = 2
        await call(client.jobs.register_job, {"Job": job})
        stored = await call(client.job.get_job, "l")
        assert stored["TaskGroups"][0]["Count"] == 2 and "Bogus" not in stored


async def test_acl_token_is_required_when_configured(tmp_path: Path) -> None:
    async with NomadServer(NomadStandIn(fast_config(tmp_path, acl_token="s3cret"))) as srv:
        anonymous = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        with pytest.raises(nomad.api.exceptions.URLNotAuthorizedNomadException):
            await call(anonymous.jobs.get_jobs)
        authed = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10, token="s3cret")
        assert await call(authed.jobs.get_jobs) == []
        assert await call(anonymous.status.leader.get_leader)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/node/{node}/drain"),
        ("POST", "/v1/node/{node}/eligibility"),
        ("GET", "/v1/node/{node}/allocations"),
        ("GET", "/v1/deployment/0b9e1e0c-0000-0000-0000-000000000000"),
        ("GET", "/v1/operator/raft/configuration"),
    ],
)
async def test_an_endpoint_the_stand_in_lacks_is_a_404_before_any_acl_check(
    tmp_path: Path, method: str, path: str
) -> None:
    # Nothing in llmgw drains nodes, sets eligibility or reads these; real Nomad serves
    # them, and answers a path it has no handler for with 404 whatever the token
    # (handleRootFallthrough): the stand-in answers its missing ones the same way.
    async with NomadServer(NomadStandIn(fast_config(tmp_path, acl_token="s3cret"))) as srv:
        node = next(iter(srv.standin.store.nodes))
        url = f"{srv.address}{path.format(node=node)}"
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"X-Nomad-Token": "s3cret"}):
                async with http.request(method, url, headers=headers, json={}) as resp:
                    text = await resp.text()
                    assert (resp.status, resp.content_type) == (404, "text/plain"), text
                    assert f"does not serve {method} " in text and "DESIGN.md" in text
            # A path it serves still asks for the token.
            async with http.get(f"{srv.address}/v1/nodes") as resp:
                assert resp.status == 403


async def test_logs_agent_and_parse_endpoints(client: nomad.Nomad, server: NomadServer) -> None:
    await call(client.jobs.register_job, {"Job": {"ID": "log", "TaskGroups": [group("g")]}})
    alloc = (
        await wait_for(
            lambda: [a for a in client.job.get_allocations("log") if a["ClientStatus"] == "running"],
            "running",
        )
    )[0]
    text = await wait_for(
        lambda: client.client.stream_logs.stream(alloc["ID"], "server", "stdout", plain=True), "stdout"
    )
    assert "task server listening on" in text
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{server.address}/v1/client/fs/logs/{alloc['ID']}", params={"task": "server", "type": "stdout"}
        ) as resp:
            frame = json.loads(await resp.text())
            assert_shape(frame, "StreamFrame")
        async with http.get(f"{server.address}/v1/agent/self") as resp:
            assert_shape(await resp.json(), "AgentSelf")
        async with http.post(f"{server.address}/v1/jobs/parse", json={"JobHCL": 'job "x" {'}) as resp:
            assert resp.status == 400
            assert "input.hcl:1" in await resp.text()
    hcl = 'job "x" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
    hcl += '      config { command = "/bin/true" }\n    }\n  }\n}\n'
    parsed = await call(client.jobs.parse, hcl, canonicalize=True)
    assert_shape(parsed, "Job")
    assert parsed["ID"] == "x" and parsed["TaskGroups"][0]["Tasks"][0]["Config"] == {"command": "/bin/true"}
    assert parsed["Priority"] == 50
