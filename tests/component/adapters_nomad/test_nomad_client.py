"""llmgw's Nomad client against the Nomad stand-in: the calls the control plane makes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmgw.adapters.nomad import NomadClient, NomadError, NomadTimeouts
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.devcluster.partition import TcpProxy
from llmgw.settings import NomadConnection
from tests.support.http_app import serving

TOKEN = "s3cr3t-management-token"

JOB = """
job "web" {
  datacenters = ["*"]
  meta = { "llmgw_managed_by" = "llmgw" }
  group "g" {
    network {
      port "http" {}
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "${attr.driver.raw_exec.python}"
        args    = ["-c", "import time; time.sleep(60)"]
      }
      resources {
        cpu    = 100
        memory = 64
        device "nvidia/gpu" {
          count = 2
        }
      }
    }
  }
}
"""


@pytest.fixture
async def nomad_server(tmp_path) -> AsyncIterator[NomadServer]:  # type: ignore[no-untyped-def]
    config = StandInConfig(
        nodes=(NodeSpec(name="n1", gpus=2, fabric="fabric-a"),),
        strict=True,
        acl_token=TOKEN,
        state_dir=tmp_path,
        event_heartbeat_s=0.5,
    )
    async with NomadServer(NomadStandIn(config)) as server:
        yield server


def client_for(
    server: NomadServer, token: str | None = TOKEN, *, address: str | None = None, event_read_s: float = 75.0
) -> NomadClient:
    return NomadClient(
        NomadConnection(address=address or server.address, token=token),
        NomadTimeouts(event_read_s=event_read_s),
    )


async def test_parse_plan_register_read_deregister(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server) as nomad:
        job = await nomad.parse_hcl(JOB)
        assert job["ID"] == "web" and job["Meta"] == {"llmgw_managed_by": "llmgw"}
        plan = await nomad.plan(job)
        assert plan.feasible, plan.explanation
        assert (await nomad.register(job)).eval_id
        page = await nomad.jobs(prefix="we")
        assert [j["ID"] for j in page.items] == ["web"] and page.index > 0
        assert (await nomad.job("web"))["Meta"]["llmgw_managed_by"] == "llmgw"  # type: ignore[index]
        allocs = await nomad.job_allocations("web")
        assert len(allocs.items) == 1
        # Only a list asked with resources=true says what an allocation holds (its GPUs).
        assert allocs.items[0]["AllocatedResources"] is None
        assert (await nomad.allocations()).items[0]["AllocatedResources"] is None
        listed = (await nomad.allocations(resources=True)).items[0]
        assert listed["AllocatedResources"] == (await nomad.allocation(listed["ID"]))["AllocatedResources"]  # type: ignore[index]
        assert listed["AllocatedResources"]
        nodes = await nomad.nodes()
        assert [n["Name"] for n in nodes.items] == ["n1"]
        await nomad.deregister("web")
        await nomad.deregister("web")  # already gone is done: the executor is idempotent
        assert await nomad.job("web") is None


async def test_the_token_is_sent_and_never_shown(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server, token=None) as anonymous:
        with pytest.raises(NomadError) as refused:
            await anonymous.jobs()
        assert refused.value.status == 403
    async with client_for(nomad_server, token="wrong-" + TOKEN) as wrong:
        with pytest.raises(NomadError) as refused:
            await wrong.jobs()
        assert TOKEN not in str(refused.value)
    assert TOKEN not in repr(NomadConnection(address="http://x", token=TOKEN))


async def test_parse_errors_carry_nomads_message(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server) as nomad:
        with pytest.raises(NomadError) as refused:
            await nomad.parse_hcl('job "x" {\n  group "g" {\n    frobnicate = 1\n  }\n}\n')
        assert refused.value.status == 400
        assert "frobnicate" in str(refused.value)


async def test_plan_that_cannot_place_says_why_in_words(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server) as nomad:
        job = await nomad.parse_hcl(JOB.replace("count = 2", "count = 8"))
        plan = await nomad.plan(job)
        assert not plan.feasible
        assert plan.explanation.startswith(
            "does not place: group g needs a node with 8 nvidia/gpu free; none has"
        )
        assert "of 1 node(s) evaluated" in plan.explanation


async def test_unreachable_nomad_is_a_nomad_error() -> None:
    async with NomadClient(NomadConnection(address="http://127.0.0.1:9")) as nomad:
        with pytest.raises(NomadError, match="cannot reach Nomad"):
            await nomad.jobs()


async def test_event_stream_yields_batches_and_resumes_from_an_index(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server) as nomad:
        job = await nomad.parse_hcl(JOB)
        await nomad.register(job)

        async def first_batches(index: int, count: int) -> list[int]:
            seen: list[int] = []
            async for batch in nomad.events(["Job:web"], index=index):
                seen.append(batch.index)
                assert all(e["Topic"] == "Job" for e in batch.events)
                if len(seen) == count:
                    break
            return seen

        seen = await asyncio.wait_for(first_batches(0, 1), 10)
        resumed_at = seen[-1] + 1
        await nomad.deregister("web")
        later = await asyncio.wait_for(first_batches(resumed_at, 1), 10)
        assert later[0] >= resumed_at


async def _first_batch(stream: AsyncIterator[Any]) -> Any:
    return await anext(stream)


async def _every_batch(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


async def test_heartbeats_keep_a_quiet_stream_open_past_the_read_timeout(nomad_server: NomadServer) -> None:
    # The stand-in beats every 0.5 s; a stream quiet for three read timeouts stays the same stream.
    async with client_for(nomad_server, event_read_s=1.0) as nomad:
        stream = nomad.events(["Job:web"], index=nomad_server.standin.store.index + 1)
        first = asyncio.ensure_future(_first_batch(stream))
        await asyncio.sleep(3.0)  # the quiet spell under test: three read timeouts without an event
        assert not first.done(), f"the quiet stream ended: {first.exception() if first.done() else ''}"
        await nomad.register(await nomad.parse_hcl(JOB))
        batch = await asyncio.wait_for(first, 10)
        assert batch.events[0]["Key"] == "web"
        await stream.aclose()


async def test_a_silent_stream_fails_within_the_read_timeout(nomad_server: NomadServer) -> None:
    proxy = TcpProxy(nomad_server.host, nomad_server.port)
    await proxy.start()
    try:
        async with client_for(nomad_server, address=proxy.url, event_read_s=1.0) as nomad:
            await nomad.register(await nomad.parse_hcl(JOB))
            stream = nomad.events(["Job:web"], index=0)
            await asyncio.wait_for(_first_batch(stream), 10)  # the connection is up
            proxy.freeze()  # half-open: no FIN, no RST, no heartbeat, nothing
            started = asyncio.get_running_loop().time()
            with pytest.raises(NomadError, match=r"nothing from .* for 1s, not even Nomad's heartbeat"):
                await asyncio.wait_for(_every_batch(stream), 10)
            assert asyncio.get_running_loop().time() - started < 5
    finally:
        await proxy.stop()


async def test_a_nomad_that_never_answers_is_reported_with_its_address_and_the_wait(
    nomad_server: NomadServer,
) -> None:
    proxy = TcpProxy(nomad_server.host, nomad_server.port)
    await proxy.start()
    try:
        proxy.freeze()  # accepts the connection, then passes nothing either way
        nomad = NomadClient(NomadConnection(address=proxy.url, token=TOKEN), NomadTimeouts(request_s=0.5))
        async with nomad:
            with pytest.raises(NomadError) as silent:
                await nomad.job("web")
        assert str(silent.value) == f"GET /v1/job/web: no answer from Nomad at {proxy.url} within 0.5s"
    finally:
        await proxy.stop()


async def test_an_event_line_of_more_than_a_mebibyte_is_read_whole(nomad_server: NomadServer) -> None:
    # One Job event carries the whole job: a job with 1.5 MiB of meta makes a line three
    # times aiohttp's 512 KiB line limit, as a batch of a busy cluster's allocations does.
    big = "x" * (3 * 512 * 1024)
    async with client_for(nomad_server) as nomad:
        job = await nomad.parse_hcl(JOB)
        job["Meta"] = {**job["Meta"], "ballast": big}
        await nomad.register(job)
        stream = nomad.events(["Job:web"], index=0)
        batch = await asyncio.wait_for(_first_batch(stream), 10)
        await stream.aclose()
    assert batch.events[0]["Payload"]["Job"]["Meta"]["ballast"] == big


async def test_plan_and_register_carry_nomads_warnings_one_per_entry(nomad_server: NomadServer) -> None:
    async with client_for(nomad_server) as nomad:
        plain = await nomad.parse_hcl(JOB)
        assert (await nomad.plan(plain)).warnings == ()
        warned = await nomad.parse_hcl(JOB.replace("memory = 64", "memory = 64\n        memory_max = 128"))
        expected = (
            'Memory oversubscription is not enabled; Task "g.t" memory_max value will be ignored. '
            "Update the Scheduler Configuration to allow oversubscription.",
        )
        plan = await nomad.plan(warned)
        assert plan.feasible and plan.warnings == expected
        registered = await nomad.register(warned)
        assert registered.eval_id and registered.warnings == expected


async def test_a_stream_refused_by_the_acl_check_is_a_403_naming_the_rule(nomad_server: NomadServer) -> None:
    """Nomad 2.0.5 answers 200 before the server checks the subscription's ACL and then
    closes the stream without a line (command/agent/event_endpoint.go, EventStream): the
    client reports that as the ACL failure it is, with the rule each topic needs."""
    import aiohttp

    headers = {"X-Nomad-Token": TOKEN}
    policy = {"Name": "jobs-only", "Rules": 'namespace "default" { capabilities = ["read-job"] }'}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.put(f"{nomad_server.address}/v1/acl/policy/jobs-only", json=policy) as resp:
            assert resp.status == 200, await resp.text()
        async with http.put(
            f"{nomad_server.address}/v1/acl/token",
            json={"Name": "jobs", "Type": "client", "Policies": ["jobs-only"]},
        ) as resp:
            assert resp.status == 200, await resp.text()
            secret = (await resp.json())["SecretID"]
        # What the wire carries: 200, then the end of an empty body.
        async with http.get(
            f"{nomad_server.address}/v1/event/stream",
            params=[("topic", "Allocation"), ("topic", "Node")],
            headers={"X-Nomad-Token": secret},
        ) as resp:
            assert (resp.status, await resp.read()) == (200, b"")
    async with client_for(nomad_server, secret) as nomad:
        with pytest.raises(NomadError) as refused:
            async for _ in nomad.events(["Allocation", "Node"]):
                pass
    assert refused.value.status == 403
    assert "Permission denied" in str(refused.value)
    assert 'node { policy = "read" } (topic Node)' in str(refused.value)
    async with client_for(nomad_server, secret) as nomad:
        stream = nomad.events(["Allocation"])
        assert await asyncio.wait_for(_first_or_none(stream), 0.3) is None  # open: only heartbeats
        await stream.aclose()


async def _first_or_none(stream: AsyncIterator[Any]) -> object:
    try:
        return await asyncio.wait_for(anext(stream), 0.2)
    except TimeoutError:
        return None


async def test_deregister_counts_a_missing_job_as_done_whether_nomad_answers_200_or_404(
    nomad_server: NomadServer,
) -> None:
    """Nomad 2.0.5 answers 200 with no evaluation for a job it does not have
    (Job.Deregister in nomad/job_endpoint.go); a 404 "job not found" from a proxy or
    another version means the same to the executor: the job is gone."""
    from aiohttp import web

    async with client_for(nomad_server) as nomad:
        await nomad.deregister("never-was")  # the stand-in answers as 2.0.5 does: 200

    async def not_found(request: web.Request) -> web.Response:
        return web.Response(status=404, text="job not found")

    app = web.Application()
    app.router.add_delete("/v1/job/{job_id}", not_found)
    async with serving(app) as url, client_for(nomad_server, address=url) as nomad:
        await nomad.deregister("never-was")


async def test_a_blocking_wait_is_clamped_to_nomads_five_minute_cap(nomad_server: NomadServer) -> None:
    """Nomad blocks at most MaxBlockingRPCQueryTime, 5 min (nomad/structs/structs.go,
    QueryOptions.TimeToBlock, v2.0.5): a longer wait is asked as 5 min, so the request's
    own timeout is not stretched past anything Nomad will hold it."""
    from aiohttp import web

    waits: list[str] = []

    async def jobs(request: web.Request) -> web.Response:
        waits.append(request.query.get("wait", ""))
        return web.json_response([], headers={"X-Nomad-Index": "7"})

    app = web.Application()
    app.router.add_get("/v1/jobs", jobs)
    async with serving(app) as url, client_for(nomad_server, address=url) as nomad:
        await nomad.jobs(index=5, wait_s=900.0)
        await nomad.jobs(index=5, wait_s=60.0)
    assert waits == ["300000ms", "60000ms"]
