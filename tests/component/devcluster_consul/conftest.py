"""Fixtures for the Consul stand-in's tests: a running stand-in, clients, and a
real HTTP health endpoint that a test can turn healthy or unhealthy.

The stand-in is driven only the way llmgw and Nomad drive a real Consul: through
py-consul and plain HTTP. The Python API is used to shape the cluster (nodes,
faults), never to read the behaviour under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import consul
import consul.aio
import pytest
from aiohttp import web

from llmgw.apispec import check_document
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from tests.support import waiting

KeyExact = Callable[[object, str], None]
Eventually = Callable[..., Awaitable[object]]  # tests/support/waiting.py's eventually


def _key_exact(doc: object, root: str) -> None:
    """The document has only the keys, spelt as, Consul's Go API structs have."""
    problems = check_document(doc, root, api="consul")
    assert problems == [], "\n".join(str(p) for p in problems)


@pytest.fixture
def key_exact() -> KeyExact:
    return _key_exact


@pytest.fixture
def eventually() -> Eventually:
    return waiting.eventually


@dataclass
class HealthEndpoint:
    """A real HTTP server with /health answering ``status`` (and counting probes)."""

    port: int = 0
    status: int = 200
    delay: float = 0.0
    probes: int = 0
    seen_headers: list[dict[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    async def handle(self, request: web.Request) -> web.Response:
        self.probes += 1
        self.seen_headers.append(dict(request.headers))
        if self.delay:
            await asyncio.sleep(self.delay)  # a slow endpoint is what the test asks for
        return web.Response(status=self.status, text=f"status {self.status}")


@pytest.fixture
async def health_endpoint() -> AsyncIterator[HealthEndpoint]:
    endpoint = HealthEndpoint()
    app = web.Application()
    app.router.add_route("*", "/health", endpoint.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.port = int(runner.addresses[0][1])
    yield endpoint
    await runner.cleanup()


@pytest.fixture
def settings() -> ConsulSettings:
    return ConsulSettings.for_tests()


@pytest.fixture
async def standin(settings: ConsulSettings) -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(settings) as cs:
        await cs.add_node("node-1", "127.0.0.1")
        await cs.add_node("node-2", "127.0.0.2")
        yield cs


@pytest.fixture
async def server_client(standin: ConsulStandIn) -> AsyncIterator[consul.aio.Consul]:
    """py-consul's async client on the server agent (what llmgw's router uses)."""
    client = consul.aio.Consul(host=standin.host, port=standin.port)
    yield client
    await client.close()


@pytest.fixture
async def node1_client(standin: ConsulStandIn) -> AsyncIterator[consul.aio.Consul]:
    """py-consul's async client on node-1's own agent (where Nomad registers node-1's allocs)."""
    client = consul.aio.Consul(host=standin.host, port=standin.agent_port("node-1"))
    yield client
    await client.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def sync_client(standin: ConsulStandIn) -> consul.Consul:
    """py-consul's blocking client on the server agent (call it through asyncio.to_thread)."""
    return consul.Consul(host=standin.host, port=standin.port, connections_timeout=10)
