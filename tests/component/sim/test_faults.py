"""Injected faults, in process: the crash effect is recorded instead of ending the test run."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from llmgw.sim.app import SimDeps
from llmgw.sim.settings import ExitCode, FaultSettings
from tests.support.sim import TEST_MODEL, fast_settings

from .conftest import ClientFor, StartServer

CHAT = {"model": TEST_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


class RecordedExits:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, code: int, reason: str) -> None:
        self.calls.append((code, reason))


async def test_fail_rate_answers_openai_500s(start_server: StartServer, client_for: ClientFor) -> None:
    server = await start_server(fast_settings(faults=FaultSettings(fail_rate=1.0)))
    with pytest.raises(openai.InternalServerError) as caught:
        await client_for(server).chat.completions.create(
            model=TEST_MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 500
    assert caught.value.type == "server_error"


async def test_runtime_fault_switches_failures_to_503_and_back(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server()
    fault_url = server.make_url("/sim/fault")
    async with http.post(fault_url, json={"fail_rate": 1.0, "fail_status": 503}) as response:
        assert response.status == 200
        assert (await response.json())["faults"]["fail_rate"] == 1.0
    async with http.post(server.make_url("/v1/chat/completions"), json=CHAT) as response:
        assert response.status == 503
        assert (await response.json())["error"]["type"] == "server_error"
    async with http.post(fault_url, json={"fail_rate": 0.0}) as response:
        assert response.status == 200
    async with http.post(server.make_url("/v1/chat/completions"), json=CHAT) as response:
        assert response.status == 200


async def test_partial_fail_rate_is_reproducible_with_a_seed(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    async def outcomes() -> list[int]:
        server = await start_server()
        async with http.post(server.make_url("/sim/fault"), json={"fail_rate": 0.5}):
            pass
        statuses = []
        for _ in range(20):
            async with http.post(server.make_url("/v1/chat/completions"), json=CHAT) as response:
                statuses.append(response.status)
        return statuses

    first, second = await outcomes(), await outcomes()
    assert first == second
    assert set(first) == {200, 500}


async def test_hang_stops_answering_health_and_api_until_lifted(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server()
    async with http.post(server.make_url("/sim/fault"), json={"hang": True}):
        pass
    health = asyncio.create_task(http.get(server.make_url("/health")))
    chat = asyncio.create_task(http.post(server.make_url("/v1/chat/completions"), json=CHAT))
    done, _ = await asyncio.wait({health, chat}, timeout=0.3)
    assert not done  # accepted, not answered
    async with http.post(server.make_url("/sim/fault"), json={"hang": False}) as response:
        assert response.status == 200
    health_response, chat_response = await asyncio.gather(health, chat)
    assert health_response.status == 200
    assert chat_response.status == 200
    health_response.release()
    chat_response.release()


async def test_crash_after_n_requests_exits_on_the_next_one(
    start_server: StartServer, client_for: ClientFor
) -> None:
    exits = RecordedExits()
    settings = fast_settings(faults=FaultSettings(crash_after_requests=2))
    client = client_for(await start_server(settings, SimDeps(exit_process=exits)))
    for _ in range(2):
        await client.completions.create(model=TEST_MODEL, prompt="ok", max_tokens=1)
    assert exits.calls == []
    await client.completions.create(model=TEST_MODEL, prompt="boom", max_tokens=1)
    assert [code for code, _ in exits.calls] == [ExitCode.CRASH_FAULT]


async def test_runtime_crash_answers_then_exits(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    exits = RecordedExits()
    server = await start_server(deps=SimDeps(exit_process=exits))
    async with http.post(server.make_url("/sim/fault"), json={"crash": True, "exit_code": 137}) as response:
        assert response.status == 200
        assert (await response.json())["crashing"] is True
    assert [code for code, _ in exits.calls] == [137]


@pytest.mark.parametrize(
    "body",
    [{"explode": True}, {"fail_rate": 2}, {"fail_status": 404}, {"hang": "yes"}, {"exit_code": 0}],
)
async def test_bad_fault_updates_are_refused(
    start_server: StartServer, http: aiohttp.ClientSession, body: dict[str, object]
) -> None:
    server = await start_server()
    async with http.post(server.make_url("/sim/fault"), json=body) as response:
        assert response.status == 400
        assert (await response.json())["error"]["type"] == "invalid_request_error"


async def test_slow_first_token_holds_the_first_chunk(
    start_server: StartServer, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    server = await start_server()
    async with http.post(server.make_url("/sim/fault"), json={"first_token_delay": 30}):
        pass
    stream = await client_for(server).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
    )
    chunks = stream.__aiter__()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(chunks.__anext__(), 0.3)
    await stream.close()
