"""The router follows Nomad: the real allocation watch (``AllocationWatch`` over the real
``NomadClient``) against the Nomad stand-in running real simulated engines, with the
Consul side played by the fake watched endpoints.

- a registration no allocation matches (a forgery copying a real allocation's id and
  meta, at its own port) is never sent a request, and is counted and logged once;
- an endpoint leaves the router's set within 100 ms of its allocation's failure event
  (Nomad's ModifyTime against the router's own clock), while Consul still says it passes;
- an allocation told to stop gets no new request from that moment;
- a registration not passing yet makes its model loading only while Nomad shows its
  allocation running (not a forged one, not one told to stop);
- an allocation running before Consul lists its registration makes its model loading
  (waited for, ``model_loading``, streams kept with comments) until it registers and
  passes, then it serves; one whose node is gone does not;
- with Nomad unreachable the router keeps its last view and says so (metric, log): the
  endpoints it trusted keep serving, a new one waits until Nomad answers again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.adapters.nomad import AllocationWatch, AllocationWatchSettings, NomadClient, NomadTimeouts
from llmgw.core.names import slug
from llmgw.core.records import Endpoint, HealthStatus
from llmgw.core.routing import Vouch
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.devcluster.partition import TcpProxy
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.settings import NomadConnection
from tests.support.conversations import PROBES, conversation

from .conftest import Cluster, eventually, metric_value, router_settings

MODEL = "sim-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


SIM_ARGS = [
    "-m", "llmgw", "sim", "--host", "${NOMAD_IP_http}", "--port", "${NOMAD_PORT_http}",
    "--model", MODEL, "--served-model-name", MODEL, "--load-time", "0", "--token-rate", "500",
]  # fmt: skip


def sim_job(replica: int) -> dict[str, Any]:
    """One replica of sim-chat as llmgw names it, its engine a real ``llmgw sim`` process."""
    job_id = f"llmgw-{slug(MODEL)}-{replica}"
    task = {
        "Name": "engine",
        "Driver": "raw_exec",
        "Config": {"command": sys.executable, "args": SIM_ARGS},
        "KillTimeout": 2_000_000_000,
        # One GPU each on nodes of one GPU: two replicas never share a node.
        "Resources": {"CPU": 100, "MemoryMB": 64, "Devices": [{"Name": "nvidia/gpu", "Count": 1}]},
    }
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": "service",
        "Datacenters": ["*"],
        "Meta": {"llmgw_managed_by": "llmgw", "llmgw_model": MODEL},
        "TaskGroups": [
            {
                "Name": "rank-0",
                "Count": 1,
                "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
                "Tasks": [task],
                "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
                "Disconnect": {"LostAfter": 900_000_000_000, "Replace": False},
            }
        ],
    }


@dataclass
class Placed:
    job_id: str
    alloc_id: str
    node_id: str
    endpoint: Endpoint  # the registration Nomad would make for it


async def place(nomad: NomadClient, http: aiohttp.ClientSession, replica: int) -> Placed:
    """Register the replica's job and wait for its engine to answer."""
    job = sim_job(replica)
    await nomad.register(job)

    async def running() -> dict[str, Any] | None:
        for stub in (await nomad.job_allocations(job["ID"])).items:
            if stub.get("ClientStatus") == "running":
                return await nomad.allocation(str(stub["ID"]))
        return None

    alloc = await eventually(running, 30, f"{job['ID']} running")
    port = next(p for p in alloc["AllocatedResources"]["Shared"]["Ports"] if p["Label"] == "http")
    endpoint = Endpoint(
        service_id=f"_nomad-task-{alloc['ID']}-engine-llmgw-engine-http",
        node=str(alloc["NodeName"]),
        model=MODEL,
        model_slug=slug(MODEL),
        replica=job["ID"],
        alloc_id=str(alloc["ID"]),
        address=str(port["HostIP"]),
        port=int(port["Value"]),
        engine="sim",
        profile=0,
        simulated=True,
        status=HealthStatus.PASSING,
    )

    async def answers() -> bool:
        try:
            async with http.get(endpoint.url + "/health") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    assert await eventually(answers, 30), f"{job['ID']}'s engine never answered"
    return Placed(job["ID"], str(alloc["ID"]), str(alloc["NodeID"]), endpoint)


@pytest.fixture
async def standin(tmp_path: Path) -> AsyncIterator[NomadServer]:
    nodes = tuple(NodeSpec(name=f"gpu-{i}", gpus=1, gpu_model="H100") for i in (1, 2))
    config = StandInConfig(nodes=nodes, state_dir=tmp_path, heartbeat_grace_s=0.3, event_heartbeat_s=0.5)
    async with NomadServer(NomadStandIn(config)) as server:
        yield server


@pytest.fixture
async def nomad(standin: NomadServer) -> AsyncIterator[NomadClient]:
    async with NomadClient(NomadConnection(address=standin.address)) as client:
        yield client


@dataclass
class Routers:
    """The routers a test started, each with its own Nomad client; all closed at teardown."""

    servers: list[RouterServer]
    clients: list[NomadClient]


@pytest.fixture
async def routers() -> AsyncIterator[Routers]:
    started = Routers([], [])
    yield started
    for router in reversed(started.servers):
        await router.stop()
    for client in started.clients:
        await client.close()


async def start_router(
    cluster: Cluster, routers: Routers, address: str, timeouts: NomadTimeouts | None = None, **settings: Any
) -> tuple[RouterServer, AllocationWatch]:
    client = NomadClient(NomadConnection(address=address), timeouts)
    routers.clients.append(client)
    watch = AllocationWatch(client, AllocationWatchSettings(retry_initial=0.05, retry_max=0.2))
    router = RouterServer(
        router_settings(**({"load_wait": 0.2} | settings)), replace(cluster.deps(), allocations=watch)
    )
    await router.start()
    routers.servers.append(router)
    await eventually(lambda: watch.healthy, 30, "the router following Nomad")
    return router, watch


async def replicas_answering(http: aiohttp.ClientSession, router: RouterServer, requests: int) -> list[str]:
    """The replicas that answered ``requests`` distinct conversations (each goes to the
    replica owning its prefix: ``PROBES`` of them reach every replica routed to)."""
    answered = []
    for index in range(requests):
        body = {**BODY, "messages": conversation(index)}
        async with http.post(router.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            answered.append(response.headers["x-llmgw-replica"])
    return answered


@dataclass
class Recorder:
    """A forged engine: it answers like one and keeps every request it was sent."""

    seen: list[str]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(await request.text())
        return web.json_response({"choices": [{"message": {"content": "stolen"}}]})


async def test_a_registration_no_allocation_matches_is_never_sent_a_request(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    real = await place(nomad, http, 0)
    recorder = Recorder([])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    forged = await cluster.add_app(MODEL, app, publish=False)
    # Everything copied from the real registration (its allocation id too) but the port,
    # which is the forger's own; and one claiming an allocation Nomad never had.
    forged.endpoint = replace(real.endpoint, service_id="evil", port=forged.endpoint.port)
    other = replace(forged.endpoint, service_id="evil-2", alloc_id="00000000-0000-4000-8000-000000000000")
    cluster.add_endpoint(real.endpoint, publish=False)
    cluster.add_endpoint(other, publish=False)
    caplog.set_level(logging.WARNING, "llmgw.gateway")
    cluster.publish()
    router, _ = await start_router(cluster, routers, standin.address)

    answered = await replicas_answering(http, router, 20)
    assert set(answered) == {real.job_id}
    assert recorder.seen == []
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_endpoints_ignored_total") == 2
    assert metric_value(text, "llmgw_router_endpoints", model=MODEL, state="unmatched") == 2
    named = [r.getMessage() for r in caplog.records if "ignoring Consul service" in r.getMessage()]
    assert len(named) == 2 and "'evil'" in named[0] + named[1] and "'evil-2'" in named[0] + named[1]
    # Once each: a new Consul snapshot with the same forgeries logs nothing more.
    cluster.publish()
    await replicas_answering(http, router, 3)
    assert len([r for r in caplog.records if "ignoring Consul service" in r.getMessage()]) == 2
    assert recorder.seen == []


async def test_an_endpoint_leaves_within_100_ms_of_its_allocations_failure_event(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
) -> None:
    first, second = await place(nomad, http, 0), await place(nomad, http, 1)
    assert first.node_id != second.node_id
    cluster.add_endpoint(first.endpoint, publish=False)
    cluster.add_endpoint(second.endpoint)
    router, _ = await start_router(cluster, routers, standin.address)
    assert set(await replicas_answering(http, router, PROBES)) == {first.job_id, second.job_id}
    book = router.app[CONTEXT].book

    # Nomad's side: the failure event of the first allocation, as the stream carries it.
    failure: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def watch_events() -> None:
        async for batch in nomad.events(["Allocation"], index=0):
            for event in batch.events:
                alloc = event["Payload"]["Allocation"]
                failed = alloc["ClientStatus"] in ("failed", "lost", "unknown")
                if alloc["ID"] == first.alloc_id and failed and not failure.done():
                    failure.set_result(alloc)

    # The router's side: the wall clock at the first book change that took it away.
    dropped: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def watch_book() -> None:
        while not dropped.done():
            await book.wait_changed()
            if book.vouch_of(first.endpoint) is not Vouch.ROUTE:
                still_listed = [e for e in book.endpoints() if e.service_id == first.endpoint.service_id]
                dropped.set_result(time.time())
                # Consul (the fake) has not noticed: the endpoint is still listed, passing.
                assert still_listed and still_listed[0].passing

    tasks = [asyncio.create_task(watch_events()), asyncio.create_task(watch_book())]
    try:
        assert standin.standin is not None
        await standin.standin.fail_node(first.node_id)
        alloc = await asyncio.wait_for(failure, 10)
        dropped_at = await asyncio.wait_for(dropped, 10)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    event_at = alloc["ModifyTime"] / 1e9  # Nomad stamps an allocation's change at its commit
    reaction = dropped_at - event_at
    print(f"Nomad's event at {event_at:.6f}, the router dropped the endpoint {reaction * 1000:.1f} ms later")
    assert 0 <= reaction < 0.1
    assert set(await replicas_answering(http, router, 4)) == {second.job_id}


async def test_an_allocation_told_to_stop_gets_no_new_request_from_that_moment(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
) -> None:
    first, second = await place(nomad, http, 0), await place(nomad, http, 1)
    cluster.add_endpoint(first.endpoint, publish=False)
    cluster.add_endpoint(second.endpoint)
    router, _ = await start_router(cluster, routers, standin.address)
    book = router.app[CONTEXT].book
    assert standin.standin is not None
    standin.standin.stop_alloc(first.alloc_id)
    assert await eventually(lambda: str(book.vouch_of(first.endpoint)) in ("stopping", "gone"), 5)
    # Consul still lists it passing (the fake never changed), yet nothing more goes there.
    assert [e.passing for e in book.endpoints() if e.service_id == first.endpoint.service_id] == [True]
    assert set(await replicas_answering(http, router, 6)) == {second.job_id}


async def test_with_nomad_unreachable_trusted_endpoints_serve_and_new_ones_wait(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = await place(nomad, http, 0)
    cluster.add_endpoint(first.endpoint)
    proxy = TcpProxy("127.0.0.1", standin.port)
    await proxy.start()
    try:
        # A short read timeout, so a silent stream is found dead within a second.
        timeouts = NomadTimeouts(connect_s=0.5, request_s=0.5, event_read_s=1.0)
        router, watch = await start_router(cluster, routers, proxy.url, timeouts)
        caplog.set_level(logging.WARNING, "llmgw")
        assert await replicas_answering(http, router, 2) == [first.job_id] * 2

        proxy.freeze()  # Nomad is gone for the router (the cluster itself runs on)
        assert await eventually(lambda: not watch.healthy, 10)
        # A replica started meanwhile: real, but the router cannot check it.
        second = await place(nomad, http, 1)
        cluster.add_endpoint(second.endpoint)
        async with http.get(router.url + "/metrics") as response:
            text = await response.text()
        assert metric_value(text, "llmgw_router_nomad_up") == 0
        assert (metric_value(text, "llmgw_router_nomad_age_seconds") or 0) > 0
        assert metric_value(text, "llmgw_router_endpoints", model=MODEL, state="unverified") == 1
        assert metric_value(text, "llmgw_router_endpoints_ignored_total") == 0  # waiting is not forged
        assert any("cannot follow Nomad" in r.getMessage() for r in caplog.records)
        async with http.get(router.url + "/health") as response:
            health = await response.json()
        assert health["nomad"]["healthy"] is False and health["nomad"]["last_error"]
        assert set(await replicas_answering(http, router, 6)) == {first.job_id}

        proxy.thaw()  # Nomad answers again: the new replica is vouched for
        assert await eventually(lambda: watch.healthy, 10)
        assert await eventually(lambda: router.app[CONTEXT].book.usable_count(MODEL) == 2, 5)
        assert set(await replicas_answering(http, router, PROBES)) == {first.job_id, second.job_id}
    finally:
        await proxy.stop()


async def refused_with(http: aiohttp.ClientSession, router: RouterServer) -> str:
    async with http.post(router.url + "/v1/chat/completions", json=BODY) as response:
        assert response.status == 503, await response.text()
        code: str = (await response.json())["error"]["code"]
        return code


async def listed_state(http: aiohttp.ClientSession, router: RouterServer) -> str:
    async with http.get(router.url + "/v1/models") as response:
        listed = (await response.json())["data"]
    state: str = next(m for m in listed if m["id"] == MODEL)["llmgw"]["state"]
    return state


async def listed_as(http: aiohttp.ClientSession, router: RouterServer, state: str, within: float = 5) -> None:
    """Returns once the router lists the model in ``state`` (it follows Nomad's events)."""

    async def probe() -> bool:
        return await listed_state(http, router) == state

    assert await eventually(probe, within, f"{MODEL} listed {state}")


async def test_a_replica_starting_counts_only_while_nomad_shows_its_allocation_running(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
) -> None:
    router, watch = await start_router(cluster, routers, standin.address)
    book = router.app[CONTEXT].book
    # A registration no allocation matches, not passing, and nothing placed: no replica starting.
    forged = Endpoint(
        service_id="evil",
        node="gpu-1",
        model=MODEL,
        model_slug=slug(MODEL),
        replica=f"llmgw-{slug(MODEL)}-0",
        alloc_id="00000000-0000-4000-8000-000000000000",
        address="127.0.0.1",
        port=1,
        engine="sim",
        profile=0,
        simulated=True,
        status=HealthStatus.CRITICAL,
    )
    cluster.add_endpoint(forged)
    await cluster.seen_by(router)
    assert await refused_with(http, router) == "no_healthy_replica"
    placed = await place(nomad, http, 0)
    # The real allocation's registration, its check not passing yet: loading.
    cluster.add_endpoint(replace(placed.endpoint, status=HealthStatus.CRITICAL))
    await cluster.seen_by(router)
    assert await eventually(lambda: book.vouch_of(placed.endpoint) is Vouch.ROUTE, 5)
    assert await refused_with(http, router) == "model_loading"
    # Its allocation told to stop: no load is coming from it, only from the allocation
    # Nomad places in its stead (``nomad alloc stop`` migrates it), not registered yet.
    assert standin.standin is not None
    standin.standin.stop_alloc(placed.alloc_id)
    assert await eventually(lambda: str(book.vouch_of(placed.endpoint)) in ("stopping", "gone"), 5)

    def replacement_seen() -> bool:
        view = watch.latest
        return view is not None and any(
            f.job_id == placed.job_id and f.desired_run and f.alloc_id != placed.alloc_id
            for f in view.allocations.values()
        )

    assert await eventually(replacement_seen, 10)
    await cluster.seen_by(router)
    assert await refused_with(http, router) == "model_loading"
    # The replica stopped whole: nothing is coming.
    await nomad.deregister(placed.job_id)
    await listed_as(http, router, "no-capacity")
    assert await refused_with(http, router) == "no_healthy_replica"


async def test_an_allocation_running_before_its_registration_is_answered_as_loading_then_serves(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
) -> None:
    router, _ = await start_router(
        cluster,
        routers,
        standin.address,
        load_wait=0.3,
        load_wait_streaming=10.0,
        loading_comment_interval=0.05,
    )
    assert await refused_with(http, router) == "no_healthy_replica"  # no replica planned
    # Nomad runs the replica's allocation and its engine answers; Consul lists nothing for
    # it yet (Nomad's registration is on its way: llmgw/core/routing.py, placed_replicas).
    placed = await place(nomad, http, 0)
    await listed_as(http, router, "loading")
    assert router.app[CONTEXT].book.endpoints() == ()

    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(router.url + "/v1/chat/completions", json=BODY) as response:
        assert loop.time() - started >= 0.3  # it waited for the replica first
        assert response.status == 503
        assert response.headers["Retry-After"] == "10"
        error = (await response.json())["error"]
    assert error["code"] == "model_loading" and f"`{MODEL}` is loading" in error["message"]

    async with http.post(router.url + "/v1/chat/completions", json=BODY | {"stream": True}) as response:
        assert response.status == 200
        head = await response.content.readuntil(b"\n\n")
        assert head == b": loading model\n\n"
        # Registered, its check not passing yet: still loading, the stream still waits.
        cluster.add_endpoint(replace(placed.endpoint, status=HealthStatus.CRITICAL))
        await cluster.seen_by(router)
        assert await response.content.readuntil(b"\n\n") == b": loading model\n\n"
        assert await listed_state(http, router) == "loading"
        # It passes: served.
        cluster.set_status(cluster.engines[-1], HealthStatus.PASSING)
        raw = (head + await response.read()).decode()
    assert f": llmgw model={MODEL} replica={placed.job_id}\n\n" in raw
    assert raw.rstrip().endswith("data: [DONE]")
    assert await replicas_answering(http, router, 2) == [placed.job_id] * 2


async def test_an_allocation_whose_node_is_gone_is_no_replica_coming(
    cluster: Cluster,
    routers: Routers,
    standin: NomadServer,
    nomad: NomadClient,
    http: aiohttp.ClientSession,
) -> None:
    router, _ = await start_router(cluster, routers, standin.address)
    placed = await place(nomad, http, 0)
    await listed_as(http, router, "loading")
    assert standin.standin is not None
    await standin.standin.fail_node(placed.node_id)
    await listed_as(http, router, "no-capacity", 10)
    assert await refused_with(http, router) == "no_healthy_replica"
