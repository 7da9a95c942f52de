"""Fixtures for the Consul adapter's tests: the Consul stand-in on loopback, clients
built the way production builds them (from CONSUL_HTTP_* variables), a health
endpoint a test flips, and a TCP proxy a test can cut or freeze to partition one
client from Consul.

Services are registered the way Nomad does it, through a node's agent HTTP API;
the stand-in's Python API is used only to shape the cluster (nodes, faults).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from llmgw.adapters.consul import ClientSettings, ConsulClient, WatchSettings
from llmgw.core import conventions as c
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.devcluster.partition import TcpProxy
from llmgw.settings import ConsulConnection
from tests.support import waiting

Eventually = Callable[..., Awaitable[object]]  # tests/support/waiting.py's eventually

# Short clocks: a watch blocks 1 s at most, retries within a tenth of a second.
FAST_WATCH = WatchSettings(wait=1.0, min_interval=0.01, burst=2, backoff_initial=0.02, backoff_max=0.1)
FAST_CLIENT = ClientSettings(connect_timeout=0.5, request_timeout=1.0, blocking_slack=0.5)


@pytest.fixture
def eventually() -> Eventually:
    return waiting.eventually


@pytest.fixture
def consul_settings() -> ConsulSettings:
    return ConsulSettings.for_tests()


@pytest.fixture
async def standin(consul_settings: ConsulSettings) -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(consul_settings) as cs:
        await cs.add_node("gpu-1", "127.0.0.1")
        yield cs


def connect(url: str, **env: str) -> ConsulClient:
    """A client configured the production way: from the consul CLI's variables."""
    return ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": url, **env}), FAST_CLIENT)


@pytest.fixture
def fast_watch() -> WatchSettings:
    return FAST_WATCH


@pytest.fixture
def connector() -> Callable[..., ConsulClient]:
    """``connector(url, CONSUL_HTTP_TOKEN=...)``: an unstarted client."""
    return connect


@pytest.fixture
async def client(standin: ConsulStandIn) -> AsyncIterator[ConsulClient]:
    async with connect(standin.url) as cl:
        yield cl


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@dataclass
class HealthEndpoint:
    """A real HTTP server whose /health answers ``status``; flip it to fail a check."""

    port: int = 0
    status: int = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    async def handle(self, _request: web.Request) -> web.Response:
        return web.Response(status=self.status, text=f"status {self.status}")


@pytest.fixture
async def health() -> AsyncIterator[HealthEndpoint]:
    endpoint = HealthEndpoint()
    app = web.Application()
    app.router.add_get("/health", endpoint.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.port = int(runner.addresses[0][1])
    yield endpoint
    await runner.cleanup()


def engine_meta(model: str = "m1", replica: str = "llmgw-m1-r1", **extra: str) -> dict[str, str]:
    return {
        c.META_MODEL: model,
        c.META_MODEL_SLUG: f"{model}-00000000",
        c.META_REPLICA: replica,
        c.META_JOB: replica,
        c.META_PROFILE: "0",
        c.META_ENGINE: "sim",
        c.META_RANK: "0",
        c.META_ALLOC: "a1b2c3d4-0000-4000-8000-000000000001",
        c.META_SIMULATED: "true",
        **extra,
    }


async def register_engine(
    http: aiohttp.ClientSession,
    agent_url: str,
    service_id: str,
    *,
    port: int,
    meta: dict[str, str],
    check_url: str | None = None,
    token: str | None = None,
) -> None:
    """Register an llmgw-engine instance through a node's agent, as Nomad does."""
    body: dict[str, object] = {
        "Name": c.ENGINE_SERVICE,
        "ID": service_id,
        "Address": "127.0.0.1",
        "Port": port,
        "Tags": [c.SERVICE_TAG, f"{c.TAG_MODEL}={meta.get(c.META_MODEL_SLUG, '')}"],
        "Meta": meta,
    }
    if check_url is not None:
        body["Check"] = {"HTTP": check_url, "Interval": "50ms", "Timeout": "1s"}
    else:
        # An engine always has a check of its own (one without counts as not yet healthy).
        body["Check"] = {"TTL": "1h", "Status": "passing"}
    headers = {"X-Consul-Token": token} if token else {}
    async with http.put(
        agent_url + "/v1/agent/service/register", data=json.dumps(body), headers=headers
    ) as resp:
        assert resp.status == 200, await resp.text()


async def deregister(http: aiohttp.ClientSession, agent_url: str, service_id: str) -> None:
    async with http.put(agent_url + f"/v1/agent/service/deregister/{service_id}") as resp:
        assert resp.status == 200, await resp.text()


@dataclass
class Engines:
    """Registers engine instances on node gpu-1's agent, as Nomad would."""

    http: aiohttp.ClientSession
    agent_url: str
    token: str | None = None

    async def register(
        self, service_id: str, *, port: int = 9000, check_url: str | None = None, **meta: str
    ) -> None:
        await register_engine(
            self.http,
            self.agent_url,
            service_id,
            port=port,
            meta=engine_meta(**meta),
            check_url=check_url,
            token=self.token,
        )

    async def register_raw_meta(self, service_id: str, meta: dict[str, str]) -> None:
        await register_engine(self.http, self.agent_url, service_id, port=9000, meta=meta, token=self.token)

    async def deregister(self, service_id: str) -> None:
        await deregister(self.http, self.agent_url, service_id)


@pytest.fixture
def engines(http: aiohttp.ClientSession, standin: ConsulStandIn) -> Engines:
    return Engines(http, standin.agent_url("gpu-1"))


@pytest.fixture
def engines_at(http: aiohttp.ClientSession) -> Callable[[str], Engines]:
    """``engines_at(agent_url)``: register on any agent (of any stand-in)."""
    return lambda agent_url: Engines(http, agent_url)


@pytest.fixture
async def proxy(standin: ConsulStandIn) -> AsyncIterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", standin.port)
    await p.start()
    yield p
    await p.stop()
