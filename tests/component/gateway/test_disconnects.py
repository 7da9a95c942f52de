"""A client that leaves cancels the engine's work at once; a Consul outage never empties the table."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from llmgw.gateway.context import CONTEXT

from .conftest import Cluster, OpenAIFor, StartRouter, eventually, metric_value

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def test_a_client_leaving_a_stream_cancels_the_engine(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat", token_rate=20.0)
    router = await start_router()
    body = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 200, "stream": True}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200
        await response.content.readline()  # the first event arrived: generation is running
        assert (await engine.stats(http))["running"] == 1
    # Leaving the block closed the connection mid-stream.

    async def cancelled() -> bool:
        stats = await engine.stats(http)
        return bool(stats["cancelled"] == 1 and stats["running"] == 0)

    assert await eventually(cancelled, within=3.0)
    context = router.app[CONTEXT]
    assert await eventually(lambda: not context.book.in_flight())  # the slot was released


async def test_a_client_leaving_a_non_streamed_request_cancels_the_engine(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat", token_rate=20.0)
    router = await start_router()
    body = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 200}
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.3):
            async with http.post(router.url + "/v1/chat/completions", json=body) as response:
                await response.read()

    async def cancelled() -> bool:
        stats = await engine.stats(http)
        return bool(stats["cancelled"] == 1 and stats["running"] == 0)

    assert await eventually(cancelled, within=3.0)
    assert (await engine.stats(http))["completed"] == 0


async def test_a_client_leaving_while_queued_for_a_load_stops_waiting(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(load_wait=10.0)
    context = router.app[CONTEXT]
    body = {"model": "sleepy", "messages": MESSAGES}
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.3):
            async with http.post(router.url + "/v1/chat/completions", json=body) as response:
                await response.read()
    # The router sees the client leave when it next writes to it: nobody waits for `sleepy` any more.
    await eventually(lambda: context.demand.report().models[0].queued == 0)


async def test_consul_going_away_keeps_the_last_endpoints(
    cluster: Cluster,
    start_router: StartRouter,
    openai_for: OpenAIFor,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)

    with caplog.at_level(logging.WARNING, logger="llmgw.gateway"):
        cluster.endpoints.fail("Consul unavailable: connection refused")
        cluster.catalog.fail("Consul unavailable: connection refused")
        # The monitor logs within its interval; look at what it will say, now.
        from llmgw.gateway import app as app_module

        monitor = asyncio.create_task(app_module._monitor_watches(router.app[CONTEXT]))
        try:
            await eventually(
                lambda: any("routing on the last data it had" in r.getMessage() for r in caplog.records)
            )
        finally:
            monitor.cancel()

    for _ in range(3):
        completion = await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
        assert completion.model == "sim-chat"

    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_consul_watch_up", watch="endpoints") == 0
    assert metric_value(text, "llmgw_router_consul_watch_up", watch="draining") == 1
    age = metric_value(text, "llmgw_router_consul_watch_age_seconds", watch="endpoints")
    assert age is not None and age >= 0
    async with http.get(router.url + "/health") as response:
        health = json.loads(await response.text())
    assert response.status == 200
    assert health["consul"]["endpoints"]["healthy"] is False
    assert "connection refused" in health["consul"]["endpoints"]["last_error"]
    assert health["usable_endpoints"] == 1


async def test_an_engine_failing_its_check_stops_getting_traffic_at_the_next_snapshot(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    from llmgw.core.records import HealthStatus

    a = await cluster.add_sim("sim-chat")
    b = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    cluster.set_status(a, HealthStatus.CRITICAL)
    context = router.app[CONTEXT]
    assert await eventually(lambda: context.book.usable_count("sim-chat") == 1)
    for _ in range(3):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    assert (await a.stats(http))["requests_total"] == 0
    assert (await b.stats(http))["requests_total"] == 3
