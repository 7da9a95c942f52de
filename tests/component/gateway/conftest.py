"""Fixtures for the router: real simulated engines (in-process, real loopback sockets)
behind a real router, with recorded fakes for Consul's watched values and the demand sink.

Every server started here is closed at teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import aiohttp
import pytest
import uvloop
from aiohttp import web
from openai import AsyncOpenAI

from llmgw.adapters.watched import WatchedState
from llmgw.core.names import slug
from llmgw.core.records import (
    ApiKeyRecord,
    CatalogVersion,
    DemandReport,
    DrainMark,
    Endpoint,
    EndpointSnapshot,
    HealthStatus,
    UnavailableModels,
)
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.errors import ApiError
from llmgw.gateway.keys import new_api_key
from llmgw.gateway.ports import RouterDeps
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.shared_limits import SharedLimits
from llmgw.sim.app import create_app as create_sim_app
from tests.support.conversations import PROBES, conversation
from tests.support.sim import fast_settings
from tests.support.waiting import awaited
from tests.support.waiting import eventually as eventually  # the one wait-until helper, for the tests here

T = TypeVar("T")

CATALOG = """
models:
  chat-a:
    description: the main chat model
    roles: [chat, completion]
    profiles: [{engine: vllm, source: org/chat-a, tool_call_parser: hermes}]
    scaling: {min: 1, max: 2}
  chat-b:
    roles: [chat]
    profiles: [{engine: vllm, source: org/chat-b, tool_call_parser: hermes}]
    scaling: {min: 1, max: 1}
  sim-chat:
    roles: [chat, completion]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
  sleepy:
    roles: [chat]
    profiles: [{engine: sim}]
    scaling: {min: 0, max: 1}
  sleepy-fallback:
    roles: [chat]
    profiles: [{engine: sim}]
    scaling: {min: 0, max: 1}
  switched-off:
    roles: [chat]
    profiles: [{engine: sim}]
    scaling: {min: 0, max: 0}
  no-scaling:
    roles: [chat]
    profiles: [{engine: sim}]
  embed:
    roles: [embedding]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
aliases:
  gpt-4o-mini: chat-a
  fast: sim-chat
fallbacks:
  chat-a: [chat-b, sim-chat]
  sleepy-fallback: [sim-chat]
"""


class FakeWatched(WatchedState[T]):
    """A watched value the test drives: publish values, make it fail like a Consul outage.

    The published side is the adapters' own ``WatchedState`` (what the router reads of
    a Consul watch); the test stands in for the loop, and ``start``/``stop`` only count."""

    def __init__(self, name: str, value: T | None = None) -> None:
        super().__init__(name, task_name=f"fake-watch-{name}")
        self.started = 0
        self.stopped = 0
        if value is not None:
            self.publish(value)

    def publish(self, value: T) -> None:
        """A successful read with ``value``: published even when equal to the latest."""
        self._succeeded(asyncio.get_running_loop().time())
        self._publish(value, even_if_same=True)

    def fail(self, error: str) -> None:
        self._failed(error)

    async def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1


class RecordingSink:
    """A demand sink that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[DemandReport] = []
        self.withdrawn = 0
        self.fail_with: Exception | None = None

    async def publish(self, report: DemandReport) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.reports.append(report)

    async def withdraw(self) -> None:
        self.withdrawn += 1

    def wakes(self, model: str) -> list[DemandReport]:
        return [r for r in self.reports if any(u.model == model and u.wake for u in r.models)]


class FixedClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def wall(self) -> float:
        return self.now


def endpoint_for(model: str, port: int, index: int = 0, *, simulated: bool = True) -> Endpoint:
    return Endpoint(
        service_id=f"{slug(model)}-{index}",
        node=f"node-{index}",
        model=model,
        model_slug=slug(model),
        replica=f"{model}-r{index}",
        alloc_id=f"alloc-{index}",
        address="127.0.0.1",
        port=port,
        engine="sim" if simulated else "vllm",
        profile=0,
        simulated=simulated,
        status=HealthStatus.PASSING,
    )


class EngineServer:
    """An engine app on a free loopback port, served like a real engine: handlers
    cancelled when their client leaves, and a listen backlog that does not drop the
    router's connections when a test opens a hundred and fifty at once."""

    def __init__(self, app: web.Application) -> None:
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        self.port = 0

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def close(self) -> None:
        await self.runner.cleanup()


@dataclass
class Engine:
    """One engine behind the router: its server, its endpoint record."""

    server: EngineServer | None
    endpoint: Endpoint

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def stats(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(self.url + "/sim/stats") as response:
            data: dict[str, Any] = await response.json()
            return data

    async def fault(self, http: aiohttp.ClientSession, **changes: Any) -> None:
        async with http.post(self.url + "/sim/fault", json=changes) as response:
            assert response.status == 200, await response.text()


@dataclass
class Cluster:
    """Engines and the fake Consul watches the router reads."""

    endpoints: FakeWatched[EndpointSnapshot] = field(
        default_factory=lambda: FakeWatched("endpoints", EndpointSnapshot((), 1))
    )
    draining: FakeWatched[Mapping[str, DrainMark]] = field(
        default_factory=lambda: FakeWatched("draining", {})
    )
    catalog: FakeWatched[CatalogVersion | None] = field(
        default_factory=lambda: FakeWatched("catalog", CatalogVersion.of(1, CATALOG, "test", 1.0))
    )
    keys: FakeWatched[Mapping[str, ApiKeyRecord]] = field(default_factory=lambda: FakeWatched("keys", {}))
    # llmgw/unavailable: nothing published until a test says what the control plane would.
    unavailable: FakeWatched[UnavailableModels | None] = field(
        default_factory=lambda: FakeWatched[UnavailableModels | None]("unavailable", None)
    )
    sink: RecordingSink = field(default_factory=RecordingSink)
    clock: FixedClock = field(default_factory=FixedClock)
    engines: list[Engine] = field(default_factory=list)
    _servers: list[EngineServer] = field(default_factory=list)
    _index: int = 1

    async def add_sim(self, model: str, *, publish: bool = True, **sim: Any) -> Engine:
        """A real simulated engine serving ``model`` on a free loopback port."""
        settings = fast_settings(served_model_name=model, **sim)
        server = EngineServer(create_sim_app(settings))
        await server.start()
        self._servers.append(server)
        engine = Engine(server, endpoint_for(model, server.port, len(self.engines)))
        self.engines.append(engine)
        if publish:
            self.publish()
        return engine

    async def add_app(self, model: str, app: web.Application, *, publish: bool = True) -> Engine:
        """Any aiohttp app as an engine (a recording fake, a misbehaving one)."""
        server = EngineServer(app)
        await server.start()
        self._servers.append(server)
        engine = Engine(server, endpoint_for(model, server.port, len(self.engines), simulated=False))
        self.engines.append(engine)
        if publish:
            self.publish()
        return engine

    def add_endpoint(self, endpoint: Endpoint, *, publish: bool = True) -> Engine:
        engine = Engine(None, endpoint)
        self.engines.append(engine)
        if publish:
            self.publish()
        return engine

    def set_status(self, engine: Engine, status: HealthStatus) -> None:
        engine.endpoint = replace(engine.endpoint, status=status)
        self.publish()

    def remove(self, engine: Engine) -> None:
        self.engines.remove(engine)
        self.publish()

    def publish(self) -> None:
        self._index += 1
        self.endpoints.publish(EndpointSnapshot(tuple(e.endpoint for e in self.engines), self._index))

    def drain(self, engine: Engine) -> None:
        mark = DrainMark(engine.endpoint.replica, engine.endpoint.model, 1.0, "test")
        current = dict(self.draining.latest or {})
        current[mark.job_id] = mark
        self.draining.publish(current)

    def set_catalog(self, text: str, version: int = 2) -> None:
        self.catalog.publish(CatalogVersion.of(version, text, "test", 1.0))

    async def seen_by(self, router: RouterServer) -> None:
        """Returns once ``router``'s watch loops have applied every value published so far
        (the endpoint book's ``processed`` hook): what a test waits for after changing the cluster."""
        context = router.app[CONTEXT]
        watches = [w for _, w in context.watches()]
        if context.deps.allocations is not None:
            watches.append(context.deps.allocations)
        for watched in watches:
            generation = watched.generation
            await awaited(
                context.book.wait_processed(watched, generation),
                f"the router applied {watched.name} generation {generation}",
            )

    def issue_key(self, name: str = "team", **fields: Any) -> tuple[str, ApiKeyRecord]:
        """A new API key (its secret and record) published beside the others, as the admin
        API would issue it now."""
        issued = new_api_key(name, now=self.clock.now, **fields)
        self.keys.publish({**(self.keys.latest or {}), issued.record.key_id: issued.record})
        return issued.key, issued.record

    def deps(self, *, with_keys: bool = False) -> RouterDeps:
        return RouterDeps(
            endpoints=self.endpoints,
            catalog=self.catalog,
            draining=self.draining,
            api_keys=self.keys if with_keys else None,
            unavailable=self.unavailable,
            demand=self.sink,
            clock=self.clock,
        )

    async def close(self) -> None:
        for server in reversed(self._servers):
            await server.close()


def router_settings(**changes: Any) -> RouterSettings:
    """Loopback, any port, no keys, short waits: a test's router."""
    base = RouterSettings(
        host="127.0.0.1",
        port=0,
        no_auth=True,
        load_wait=0.5,
        load_wait_streaming=1.0,
        loading_comment_interval=0.1,
        demand_interval=30.0,
        shutdown_timeout=1.0,
        keepalive_timeout=5.0,
    )
    return replace(base, **changes)


StartRouter = Callable[..., Awaitable[RouterServer]]


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """The router runs on uvloop in production (``llmgw/cli/event_loop.py``), so its
    tests do too; the rest of the suite covers asyncio's own loop."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    yield c
    await c.close()


@pytest.fixture
async def start_router(cluster: Cluster) -> AsyncIterator[StartRouter]:
    routers: list[RouterServer] = []

    async def start(*, with_keys: bool = False, **changes: Any) -> RouterServer:
        if with_keys:
            changes.setdefault("no_auth", False)
        router = RouterServer(router_settings(**changes), cluster.deps(with_keys=with_keys))
        await router.start()
        routers.append(router)
        await cluster.seen_by(router)
        return router

    yield start
    for router in reversed(routers):
        await router.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


OpenAIFor = Callable[..., AsyncOpenAI]


@pytest.fixture
async def openai_for() -> AsyncIterator[OpenAIFor]:
    """The official client pointed at a router (no retries, so every answer reaches the test)."""
    clients: list[AsyncOpenAI] = []

    def make(router: RouterServer, api_key: str = "sk-none", **options: Any) -> AsyncOpenAI:
        client = AsyncOpenAI(
            base_url=router.url + "/v1",
            api_key=api_key,
            max_retries=0,
            timeout=options.pop("timeout", 15.0),
            **options,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


async def replicas_answering(
    client: AsyncOpenAI, requests: int, model: str = "sim-chat", messages: Any = None
) -> set[str]:
    """The replicas (``x-llmgw-replica``) that answered ``requests`` chat completions of one
    conversation (``messages``, by default a greeting), one after another."""
    replicas = set()
    for _ in range(requests):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages or [{"role": "user", "content": "hello there"}], max_tokens=1
        )
        replicas.add(raw.headers["x-llmgw-replica"])
    return replicas


async def replicas_serving(client: AsyncOpenAI, model: str = "sim-chat") -> set[str]:
    """The replicas that answered ``PROBES`` distinct conversations, one after another:
    every replica the router routes to (each conversation goes to the one owning it)."""
    replicas = set()
    for index in range(PROBES):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=conversation(index), max_tokens=1
        )
        replicas.add(raw.headers["x-llmgw-replica"])
    return replicas


async def admits(limits: SharedLimits, record: ApiKeyRecord, tokens: int = 0) -> bool:
    """Whether ``limits`` admits a request of ``record`` holding ``tokens`` now (a hold it
    then keeps)."""
    try:
        await limits.admit(record, tokens)
    except ApiError:
        return False
    return True
