"""Fixtures for the simulated engine: in-process servers on loopback and real sim processes.

Every server and process started here is stopped at teardown (processes are
killed if they still run, then reaped), so no test leaves an orphan behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI

from llmgw.sim.app import SimDeps, create_app
from llmgw.sim.settings import SimSettings
from tests.support.sim import MODULE_ENTRY, SimProcess, fast_settings, start_sim_process

StartServer = Callable[..., Awaitable[TestServer]]
StartProcess = Callable[..., Awaitable[SimProcess]]
ClientFor = Callable[[TestServer | SimProcess], AsyncOpenAI]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start `create_app(settings, deps)` in the test's event loop on a free loopback port."""
    servers: list[TestServer] = []

    async def start(settings: SimSettings | None = None, deps: SimDeps | None = None) -> TestServer:
        server = TestServer(create_app(settings or fast_settings(), deps), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def client_for() -> AsyncIterator[ClientFor]:
    """The official OpenAI client pointed at a sim (no retries, so errors reach the test)."""
    clients: list[AsyncOpenAI] = []

    def make(target: TestServer | SimProcess) -> AsyncOpenAI:
        base = target.base_url if isinstance(target, SimProcess) else str(target.make_url(""))
        client = AsyncOpenAI(base_url=base.rstrip("/") + "/v1", api_key="sk-sim", max_retries=0, timeout=10.0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def start_process(tmp_path: Path) -> AsyncIterator[StartProcess]:
    """Start a real `python -m llmgw.sim` with fast flags plus `flags`; killed and reaped at teardown."""
    processes: list[SimProcess] = []

    async def start(
        *flags: str,
        env: dict[str, str] | None = None,
        name: str = "sim",
        entry: tuple[str, ...] = MODULE_ENTRY,
    ) -> SimProcess:
        sim = await start_sim_process(flags, tmp_path / f"{name}-{len(processes)}.log", env, entry)
        processes.append(sim)
        return sim

    yield start
    for sim in processes:
        await sim.stop()
