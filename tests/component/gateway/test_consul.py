"""The router on the real Consul adapter and the Consul stand-in: endpoints found by a
blocking query, a failing check taking a replica out, draining marks, and an outage
during which the router keeps routing on what it last saw."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.draining import DrainingMarks
from llmgw.adapters.consul.endpoints import watch_endpoints
from llmgw.adapters.consul.settings import ClientSettings, WatchSettings
from llmgw.core import conventions as c
from llmgw.core.names import slug
from llmgw.core.records import CatalogVersion, DrainMark
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.devcluster.consul.model import OutageMode
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.ports import FixedValue, RouterDeps
from llmgw.settings import ConsulConnection
from llmgw.sim.app import create_app as create_sim_app
from tests.support.sim import fast_settings

from .conftest import (
    CATALOG,
    EngineServer,
    eventually,
    metric_value,
    replicas_answering,
    replicas_serving,
    router_settings,
)

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
WATCH = WatchSettings(wait=2.0, min_interval=0.0, backoff_initial=0.05, backoff_max=0.2)


@dataclass
class Toggle:
    """The HTTP health check Consul runs for one engine; a test flips it."""

    healthy: bool = True

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)


@dataclass
class Replica:
    engine: EngineServer
    check: EngineServer
    toggle: Toggle
    replica: str


@pytest.fixture
async def standin() -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(ConsulSettings.for_tests()) as cs:
        await cs.add_node("node-1", "127.0.0.1")
        yield cs


@pytest.fixture
async def consul(standin: ConsulStandIn) -> AsyncIterator[ConsulClient]:
    client = ConsulClient(
        ConsulConnection(host=standin.host, port=standin.port),
        ClientSettings(request_timeout=1.0, blocking_slack=1.0),
    )
    await client.start()
    yield client
    await client.close()


async def _replica(
    standin: ConsulStandIn, http: aiohttp.ClientSession, model: str, index: int, cleanup: list[EngineServer]
) -> Replica:
    engine = EngineServer(create_sim_app(fast_settings(served_model_name=model)))
    await engine.start()
    toggle = Toggle()
    check_app = web.Application()
    check_app.router.add_get("/health", toggle.handle)
    check = EngineServer(check_app)
    await check.start()
    cleanup += [engine, check]
    replica = f"{slug(model)}-r{index}"
    registration = {
        "ID": f"{replica}-rank0",
        "Name": c.ENGINE_SERVICE,
        "Address": "127.0.0.1",
        "Port": engine.port,
        "Tags": [c.SERVICE_TAG, f"{c.TAG_MODEL}={slug(model)}"],
        "Meta": {
            c.META_MODEL: model,
            c.META_MODEL_SLUG: slug(model),
            c.META_REPLICA: replica,
            c.META_JOB: replica,
            c.META_PROFILE: "0",
            c.META_ENGINE: "sim",
            c.META_RANK: "0",
            c.META_SIMULATED: "true",
        },
        "Check": {"HTTP": f"http://127.0.0.1:{check.port}/health", "Interval": "50ms", "Timeout": "1s"},
    }
    async with http.put(standin.agent_url("node-1") + "/v1/agent/service/register", json=registration) as r:
        assert r.status == 200, await r.text()
    return Replica(engine, check, toggle, replica)


@pytest.fixture
async def servers() -> AsyncIterator[list[EngineServer]]:
    started: list[EngineServer] = []
    yield started
    for server in reversed(started):
        await server.close()


@pytest.fixture
async def router(consul: ConsulClient) -> AsyncIterator[RouterServer]:
    deps = RouterDeps(
        endpoints=watch_endpoints(consul, WATCH),
        draining=DrainingMarks(consul).watch(WATCH),
        catalog=FixedValue(CatalogVersion.of(1, CATALOG, "test", 1.0), "catalog"),
    )
    server = RouterServer(router_settings(), deps)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def test_endpoints_come_from_consul_and_leave_with_a_failing_check(
    standin: ConsulStandIn,
    consul: ConsulClient,
    router: RouterServer,
    http: aiohttp.ClientSession,
    servers: list[EngineServer],
) -> None:
    a = await _replica(standin, http, "sim-chat", 0, servers)
    b = await _replica(standin, http, "sim-chat", 1, servers)
    book = router.app[CONTEXT].book
    assert await eventually(lambda: book.usable_count("sim-chat") == 2, within=5.0)
    async with AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        assert await replicas_serving(client) == {a.replica, b.replica}

        a.toggle.healthy = False  # its next check fails; the blocking query returns at once
        assert await eventually(lambda: book.usable_count("sim-chat") == 1, within=5.0)
        assert await replicas_serving(client) == {b.replica}

        await DrainingMarks(consul).set(DrainMark(b.replica, "sim-chat", 1.0, "upgrade"))
        a.toggle.healthy = True
        assert await eventually(
            lambda: (
                book.usable_count("sim-chat") == 1
                and book.is_draining(next(e for e in book.endpoints() if e.replica == b.replica))
            ),
            within=5.0,
        )
        assert await replicas_serving(client) == {a.replica}


async def test_a_consul_outage_keeps_the_last_endpoints(
    standin: ConsulStandIn, router: RouterServer, http: aiohttp.ClientSession, servers: list[EngineServer]
) -> None:
    a = await _replica(standin, http, "sim-chat", 0, servers)
    book = router.app[CONTEXT].book
    assert await eventually(lambda: book.usable_count("sim-chat") == 1, within=5.0)
    await standin.start_outage(OutageMode.REFUSE)
    try:
        context = router.app[CONTEXT]
        endpoints_watch = dict(context.watches())["endpoints"]
        assert await eventually(lambda: not endpoints_watch.healthy, within=5.0)
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
            assert await replicas_answering(client, 3) == {a.replica}
        async with http.get(router.url + "/metrics") as response:
            text = await response.text()
        assert metric_value(text, "llmgw_router_consul_watch_up", watch="endpoints") == 0
        assert metric_value(text, "llmgw_router_endpoints", model="sim-chat", state="passing") == 1
    finally:
        await standin.end_outage()
    assert await eventually(lambda: endpoints_watch.healthy, within=5.0)
